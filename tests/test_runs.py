"""A monitored run read back (``hookscope.read_run``), drawn (``hookscope.viz.plot_run``) and shown by
``hookscope runs DIR``: the numbers are those the monitor logged and the dashboards show, computed
again here by hand from the parameters' gradients and weights."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.monitor import scalars
from hookscope.viz import plot_run

pytest.importorskip("matplotlib")


class Spiky(nn.Module):
    """Multiplies by NaN at one step: the step a run must mark."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float("nan") if self.calls == self.at + 1 else x


def _net(at: int = -1) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), Spiky(at), nn.Linear(12, 3))


def _train(folder, *, steps: int = 12, every: int = 3, at: int = -1, hand: dict | None = None) -> nn.Module:
    """A seeded run; ``hand`` gets, per sampled step, the gradient norm and update ratio of each layer
    worked out here from the parameters themselves."""
    net = _net(at)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    with hookscope.monitor(net, every=every, log=folder, optimizer=opt, nonfinite="log") as mon:
        for step in range(steps):
            x, y = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)
            opt.zero_grad()
            loss = (net(x) - y).pow(2).mean()
            loss.backward()
            mon.note(loss=loss)
            before = {n: p.detach().clone() for n, p in net.named_parameters()}
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
            opt.step()
            if hand is not None and step % every == 0:
                hand[step] = {"loss": loss.item()}
                for layer in ("0", "3"):
                    names = [n for n in before if n.startswith(layer + ".")]
                    g = math.sqrt(sum(grads[n].double().pow(2).sum().item() for n in names))
                    w = math.sqrt(sum(before[n].double().pow(2).sum().item() for n in names))
                    d = math.sqrt(sum((dict(net.named_parameters())[n].detach() - before[n]).double().pow(2).sum().item()
                                      for n in names))
                    hand[step][layer] = (g, d / w)
    return net


def test_the_matrices_are_the_gradient_norms_and_update_ratios_worked_out_by_hand(tmp_path):
    hand: dict = {}
    _train(tmp_path, hand=hand)
    run = hookscope.read_run(tmp_path)
    assert run.steps == [0, 3, 6, 9] == sorted(hand)
    assert run.layers == ["0", "1", "2", "3"]
    grad, ratio = run.matrix("grad_norm"), run.matrix("update_ratio")
    for j, step in enumerate(run.steps):
        for layer in ("0", "3"):
            i = run.layers.index(layer)
            assert grad[i, j].item() == pytest.approx(hand[step][layer][0], rel=1e-5)
            assert ratio[i, j].item() == pytest.approx(hand[step][layer][1], rel=1e-4)
    assert not run.present("grad_norm")[1].any()  # the ReLU has no parameters: no value, not a zero
    assert run.series("loss") == (run.steps, pytest.approx([hand[s]["loss"] for s in run.steps]))


def test_each_logged_step_reads_back_as_the_monitor_saw_it(tmp_path):
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    seen = {}
    with hookscope.monitor(net, every=2, log=tmp_path, optimizer=opt, histograms=8) as mon:
        for step in range(5):
            opt.zero_grad()
            net(torch.randn(8, 6)).sum().backward()
            opt.step()
            if mon.last is not None:
                seen[mon.last.step] = mon.last
    run = hookscope.read_run(tmp_path / "monitor.jsonl")
    assert sorted(seen) == run.steps == [0, 2, 4]
    for step, telemetry in seen.items():
        back = run[step]
        assert [r.what for r in back.rows] == [r.what for r in telemetry.rows]
        for a, b in zip(back.rows, telemetry.rows):
            for field in ("mean", "std", "min", "max", "norm", "grad_norm", "update_ratio", "dead"):
                x, y = getattr(a, field), getattr(b, field)
                assert (x is None and y is None) or x == pytest.approx(y, nan_ok=True)
        assert scalars(back) == pytest.approx(scalars(telemetry), nan_ok=True)
        assert [h.counts for h in back.histograms] == [h.counts for h in telemetry.histograms]
    assert 2 in run and 1 not in run and 7 not in run  # a step not sampled has no rows
    with pytest.raises(hookscope.RecordError, match="no logged step 1"):
        run[1]


def test_a_nan_at_step_7_is_the_step_the_run_and_its_picture_mark(tmp_path):
    _train(tmp_path, steps=12, every=3, at=7)
    run = hookscope.read_run(tmp_path)
    assert run.nonfinite_steps()[0] == 7
    assert "NaN or Inf at steps 7" in run.table()
    fig = plot_run(run)
    first = [ln for ax in fig.axes for ln in ax.get_lines() if list(ln.get_xdata()) == [7, 7]]
    assert len(first) == 4  # the loss and each of the three heatmaps
    assert "first at step 7" in fig.axes[0].get_title(loc="left")
    red = [p for ax in fig.axes for p in ax.patches if p.get_label() == "NaN/Inf"]
    assert red  # the NaN weights after the flagged step are drawn, in red, not left blank


def test_a_run_killed_while_writing_reads_up_to_its_last_whole_line(tmp_path):
    _train(tmp_path, steps=7, every=3)
    log = tmp_path / "monitor.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"step": 9, "layer": "0", "what": "outp')
    run = hookscope.read_run(tmp_path)
    assert run.steps == [0, 3, 6] and "incomplete" in run.notes[0]
    lines = whole.splitlines()
    log.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(hookscope.HookscopeError, match="line 2 is not JSON"):
        hookscope.read_run(tmp_path)


def test_a_killed_process_leaves_a_run_that_reads_and_draws(tmp_path):
    code = f"""
import os, signal, torch, hookscope
net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
opt = torch.optim.SGD(net.parameters(), lr=0.1)
with hookscope.monitor(net, every=2, log={str(tmp_path)!r}, optimizer=opt):
    for step in range(9):
        opt.zero_grad(); net(torch.randn(8, 4)).sum().backward(); opt.step()
        if step == 6:
            os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -9
    run = hookscope.read_run(tmp_path)
    assert run.steps == [0, 2, 4, 6]
    assert len(plot_run(run).axes) >= 3


def test_bad_sources_and_statistics_are_one_line(tmp_path):
    with pytest.raises(hookscope.HookscopeError, match="holds no monitor.jsonl"):
        hookscope.read_run(tmp_path)
    with pytest.raises(hookscope.HookscopeError, match="no such run log"):
        hookscope.read_run(tmp_path / "nope")
    (tmp_path / "monitor.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(hookscope.HookscopeError, match="not a row of a monitor's log"):
        hookscope.read_run(tmp_path)
    _train(tmp_path / "r", steps=4)
    run = hookscope.read_run(tmp_path / "r")
    with pytest.raises(hookscope.RecordError, match="Did you mean 'grad_norm'"):
        run.matrix("grad_nrom")
    with pytest.raises(hookscope.HookscopeError, match="Did you mean 'update_ratio'"):
        plot_run(run, ["update_ration"])
    with pytest.raises(hookscope.HookscopeError, match="takes a Run"):
        plot_run(str(tmp_path))  # type: ignore[arg-type]


def test_a_run_speaks_the_result_protocol_with_its_picture(tmp_path):
    pytest.importorskip("pandas")
    _train(tmp_path, steps=4, every=2)
    run = hookscope.read_run(tmp_path)
    frame = run.to_pandas()
    assert len(frame) == len(run.rows) and set(frame["step"]) == {0, 2}
    assert json.loads(run.to_json())["steps"] == [0, 2]
    page = run._repr_html_()
    assert "<table" in page and "data:image/png;base64," in page


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hookscope", "runs", *args], capture_output=True, text=True,
                          timeout=180)


def test_the_command_prints_draws_and_exits_1_on_a_nan(tmp_path):
    _train(tmp_path / "ok", steps=7)
    _train(tmp_path / "bad", steps=12, at=7)
    ok = _cli(str(tmp_path / "ok"), "--plot", str(tmp_path / "ok.png"))
    assert ok.returncode == 0, ok.stderr
    assert "3 sampled steps (0..6)" in ok.stdout and (tmp_path / "ok.png").read_bytes()[:4] == b"\x89PNG"
    bad = _cli(str(tmp_path / "bad"), "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["nonfinite_steps"][0] == 7
    wrong = _cli(str(tmp_path / "ok"), "--stats", "grad_nrom")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "Did you mean 'grad_norm'" in wrong.stderr
    missing = _cli(str(tmp_path / "none"))
    assert missing.returncode == 2 and "no such run log" in missing.stderr and "Traceback" not in missing.stderr
