"""The monitor's writers read back with the readers of each format: JSON lines and CSV by hand, TensorBoard
by tensorboard's own EventAccumulator, W&B (offline) by wandb's own record reader; a run killed with
SIGKILL leaves its logs readable up to its last sampled step."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.monitor import FIELDS, scalars

from helpers import no_hooks


def _run(log: object, steps: int = 12, every: int = 5, **kw: object) -> hookscope.Monitor:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(5, 3), torch.randn(5, 1)
    kept: list[hookscope.Telemetry] = []

    class Keep(hookscope.Writer):
        def write(self, telemetry: hookscope.Telemetry) -> None:
            kept.append(telemetry)

    logs = log if isinstance(log, list) else [log]
    with hookscope.monitor(net, every=every, optimizer=opt, log=[*logs, Keep()], **kw) as mon:
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            mon.note(loss=loss)
            opt.step()
    assert no_hooks(net)
    mon.kept = kept  # type: ignore[attr-defined]
    return mon


def _value(text: str) -> object:
    return None if text == "" else text


def test_a_log_folder_gets_json_lines_and_csv_that_hold_every_row(tmp_path):
    mon = _run(tmp_path / "run", histograms=3)
    rows = [r for t in mon.kept for r in t.rows]
    lines = [json.loads(line) for line in (tmp_path / "run" / "monitor.jsonl").read_text().splitlines()]
    plain = [line for line in lines if line["what"] != "histogram"]
    assert [(d["step"], d["layer"], d["what"], d["path"]) for d in plain] == [(r.step, r.layer, r.what, r.path) for r in rows]
    for d, r in zip(plain, rows):
        assert list(d) == list(FIELDS)
        for k in FIELDS:
            v = getattr(r, k)
            assert d[k] == (v if not isinstance(v, float) or math.isfinite(v) else str(v)), k
    hist = [line for line in lines if line["what"] == "histogram"]
    assert len(hist) == sum(len(t.histograms) for t in mon.kept) > 0
    assert hist[0]["counts"] == mon.kept[0].histograms[0].counts and hist[0]["nan"] == 0
    with open(tmp_path / "run" / "monitor.csv", newline="") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == FIELDS and len(table) == 1 + len(rows)
    for cells, r in zip(table[1:], rows):
        for k, cell in zip(FIELDS, cells):
            v = getattr(r, k)
            if v is None or v == "":
                assert cell == ""
            elif isinstance(v, float):
                assert float(cell) == pytest.approx(v, nan_ok=True), k
            else:
                assert cell == str(v), k


def test_a_second_run_into_the_same_folder_is_refused_unless_appending(tmp_path):
    _run(tmp_path)
    with pytest.raises(hookscope.HookscopeError, match="already holds a log") as e:
        _run(tmp_path)
    assert "append=True" in str(e.value) and "\n" not in str(e.value)
    before = (tmp_path / "monitor.csv").read_text().count("\n")
    _run([hookscope.CSVWriter(tmp_path / "monitor.csv", append=True)])
    after = (tmp_path / "monitor.csv").read_text()
    assert after.count("\n") == 2 * before - 1 and after.count("step,layer") == 1


def test_tensorboard_event_files_read_back_with_tensorboards_own_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mon = _run(hookscope.TensorBoardWriter(tmp_path / "tb"), histograms=4)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    want = [scalars(t) for t in mon.kept]
    assert set(tags["scalars"]) >= set(want[0]) and "grad_norm/0" in tags["scalars"] and "update_ratio/2" in tags["scalars"]
    for tag in ("grad_norm/0", "dead/1", "loss", "output_rms/2", "update_ratio/2"):
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [0, 5, 10]
        assert [v for _, v in got] == pytest.approx([w[tag] for w in want], rel=1e-6)
    hist = events.Histograms("output/0")
    first = mon.kept[0].histograms[0]
    assert [h.step for h in hist] == [0, 5, 10] and first.layer == "0" and first.of == "output"
    assert list(hist[0].histogram_value.bucket) == first.counts
    assert [e.value for e in events.Scalars("hist_nan/output/0")] == [0.0, 0.0, 0.0]


def _wandb_records(folder: Path) -> list[dict[str, object]]:
    """The history records of the offline run, read by wandb's own reader of its .wandb log."""
    log = next(folder.glob("wandb/offline-run-*/run-*.wandb"))
    command = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(command), "leet", "inspect", "--json", str(log)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [r["history"]["item"] for r in map(json.loads, out.splitlines()) if r.get("type") == "history"]


def test_wandb_offline_run_reads_back_with_wandbs_own_reader(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    mon = _run(hookscope.WandbWriter(project="hookscope-test", dir=tmp_path), histograms=3)
    history = _wandb_records(tmp_path)
    assert [h["_step"] for h in history] == [0, 5, 10]
    for item, t in zip(history, mon.kept):
        want = scalars(t)
        assert item["grad_norm/0"] == pytest.approx(want["grad_norm/0"]) and item["loss"] == pytest.approx(want["loss"])
        assert item["output/0._type"] == "histogram" and item["output/0.values"] == t.histograms[0].counts
        assert item["hist_nan/output/0"] == 0


_KILLED = """
import sys, time, torch, hookscope
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
with hookscope.monitor(net, every=10, optimizer=opt, log=sys.argv[1]) as mon:
    for step in range(10_000):
        opt.zero_grad()
        net(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        if step == 35:
            open(sys.argv[2], "w").close()
            time.sleep(600)
"""


def test_a_run_killed_part_way_leaves_logs_readable_up_to_its_last_sampled_step(tmp_path):
    script, marker, folder = tmp_path / "train.py", tmp_path / "at-35", tmp_path / "run"
    script.write_text(textwrap.dedent(_KILLED))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(folder), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the training script did not reach step 35"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    lines = [json.loads(line) for line in (folder / "monitor.jsonl").read_text().splitlines()]
    assert sorted({d["step"] for d in lines}) == [0, 10, 20, 30]
    with open(folder / "monitor.csv", newline="") as f:
        table = list(csv.reader(f))
    assert len(table) == 1 + len(lines) and all(len(row) == len(FIELDS) for row in table)


def test_non_finite_values_are_written_as_text_in_json_lines_and_csv(tmp_path):
    from hookscope.analysis.monitor import TelemetryRow
    from hookscope.analysis.monitor._telemetry import Telemetry

    rows = [TelemetryRow(5, "fc", "param", "weight", mean=float("nan"), max=float("inf"), min=float("-inf"), std=0.25),
            TelemetryRow(5, "", "step", "", loss=1.5)]
    jl, cs = hookscope.JSONLinesWriter(tmp_path / "m.jsonl"), hookscope.CSVWriter(tmp_path / "m.csv")
    for w in (jl, cs):
        w.write(Telemetry(5, rows, []))
        w.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert (lines[0]["mean"], lines[0]["max"], lines[0]["min"], lines[0]["std"]) == ("nan", "inf", "-inf", 0.25)
    assert lines[1]["loss"] == 1.5 and lines[1]["mean"] is None
    table = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert (table[0]["mean"], table[0]["max"], table[0]["min"], table[0]["std"]) == ("nan", "inf", "-inf", "0.25")
    assert table[1]["loss"] == "1.5" and table[1]["mean"] == ""
