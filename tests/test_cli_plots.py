"""``--plot`` and ``--json`` of trace, diff, watch, summary and layers, and the examples in their --help.

Each command's picture is compared pixel for pixel with the one the library draws from the same run
(same seeded model and input), and each ``--json`` with the result's ``to_dict()``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.analysis.diff import ATOL, RTOL, diff, settings
from hookscope.analysis.gradflow import gradient_flow
from hookscope.analysis.summary import summary
from hookscope.analysis.trace import trace
from hookscope.analysis.watch import watch
from hookscope.cli import main
from hookscope.cli._load import load_model
from hookscope.cli.inputs._shapes import example_input
from hookscope.cli._common import keep_for, run_model
from hookscope.core.result import jsonable
from hookscope.viz.plots import plot_diff, plot_gradient_flow, plot_trace, save_figure

LOG_MODEL = """
import torch
class Log(torch.nn.Module):
    def forward(self, x):
        return x.log()
def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), Log(), torch.nn.Linear(4, 2))
"""


def pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB")).copy()


def tiny() -> tuple[torch.nn.Module, torch.Tensor]:
    """What the commands build for ``tiny`` with the default seed."""
    return load_model("tiny", seed=0), example_input("tiny", None, seed=0)


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if "warning:" not in line]  # a random-weights warning may come too
    assert len(err) == 1 and err[0].startswith(f"hookscope {command}: error: "), err
    return err[0]


# --- trace ---------------------------------------------------------------------------------------
def test_trace_plot_is_the_library_picture_of_the_same_run(tmp_path, capsys):
    out = tmp_path / "trace.png"
    assert main(["trace", "tiny", "--backward", "--plot", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote plot to {out}"
    model, x = tiny()
    t = trace(model, keep=keep_for(inputs=True, backward=True))
    run_model(t, model, x, backward=True)
    expected = pixels(save_figure(plot_trace(t), tmp_path / "expected.png"))
    assert np.array_equal(pixels(out), expected)


def test_grad_flow_plot_is_the_gradient_flow_picture(tmp_path, capsys):
    out = tmp_path / "flow.png"
    assert main(["trace", "tiny", "--grad-flow", "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vanishing (< 1e-07)" in printed and printed.splitlines()[-1] == f"wrote plot to {out}"
    model, x = tiny()
    t = trace(model, keep=keep_for(inputs=True, backward=True), param_grads=True)
    run_model(t, model, x, backward=True)
    figure = plot_gradient_flow(gradient_flow(model, trace=t), trace=t)
    assert np.array_equal(pixels(out), pixels(save_figure(figure, tmp_path / "expected.png")))


def test_trace_json_is_format_json_and_the_rows_and_stdout_holds_nothing_else(tmp_path, capsys):
    out = tmp_path / "trace.png"
    assert main(["trace", "tiny", "--layers", "layer1.*", "--json", "--plot", str(out)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert f"wrote plot to {out}" in captured.err and out.stat().st_size > 0
    assert main(["trace", "tiny", "--layers", "layer1.*", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == data
    model, x = tiny()
    t = trace(model, "layer1.*", keep=keep_for(inputs=True, backward=False))
    run_model(t, model, x, backward=False)
    assert data == jsonable(t.to_dict())


def test_grad_flow_json_is_the_flow(capsys):
    assert main(["trace", "tiny", "--grad-flow", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    model, x = tiny()
    t = trace(model, keep=keep_for(inputs=True, backward=True))
    run_model(t, model, x, backward=True)
    assert data == jsonable(gradient_flow(model, trace=t).to_dict())


def test_plot_mistakes_are_one_line_before_the_model_runs(tmp_path, capsys):
    built = tmp_path / "built"
    (tmp_path / "m.py").write_text(f"import torch\ndef build():\n    open({str(built)!r}, 'w').close()\n"
                                   "    return torch.nn.Sequential(torch.nn.Linear(2, 2))\n")
    model = f"{tmp_path / 'm.py'}:build"
    assert main(["trace", model, "--input", "1x2", "--plot", str(tmp_path / "no" / "t.png")]) == 2
    line = one_line(capsys, "trace")
    assert "cannot write --plot" in line and line.endswith("create it first")
    assert main(["diff", model, "--input", "1x2", "--plot", str(tmp_path)]) == 2
    assert f"cannot write --plot {tmp_path}: it is a folder" in one_line(capsys, "diff")
    assert not built.exists()
    assert main(["trace", model, "--input", "1x2", "--json", "--format", "csv"]) == 2
    assert "give --json or --format csv, not both" in one_line(capsys, "trace")
    assert main(["trace", model, "--input", "1x2", "--grad-flow", "--format", "csv"]) == 2
    assert "--grad-flow prints a table or JSON" in one_line(capsys, "trace")


# --- diff ----------------------------------------------------------------------------------------
def test_diff_plot_and_json_are_those_of_the_same_comparison(tmp_path, capsys):
    out = tmp_path / "diff.png"
    assert main(["diff", "tiny", "--b-autocast", "bfloat16", "--rtol", str(RTOL), "--atol", str(ATOL), "--json", "--plot",
                 str(out)]) == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert f"wrote plot to {out}" in captured.err
    model, x = tiny()
    d = diff(model, model, x, a=settings(), b=settings(autocast=torch.bfloat16), rtol=RTOL, atol=ATOL, seed=0)
    assert data == jsonable(d.to_dict()) and data["first"]["name"] == "stem.0"
    assert np.array_equal(pixels(out), pixels(save_figure(plot_diff(d), tmp_path / "expected.png")))


def test_diff_table_then_where_the_plot_went(tmp_path, capsys):
    out = tmp_path / "same.png"
    assert main(["diff", "tiny", "--plot", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "no divergence: every compared output is within tolerance"
    assert lines[-1] == f"wrote plot to {out}" and pixels(out).shape[1] == 800  # 8 inches at 100 dpi


# --- watch, summary ------------------------------------------------------------------------------
def test_watch_json_is_the_watch_result(tmp_path, capsys):
    assert main(["watch", "tiny", "--backward", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    model, x = tiny()
    w = watch(model, keep=keep_for(inputs=False, backward=True))
    run_model(w, model, x, backward=True)
    assert data == jsonable(w.to_dict()) and data["finite"] is True and data["culprit"] is None


def test_watch_json_names_the_culprit_and_exits_1(tmp_path, capsys):
    (tmp_path / "logm.py").write_text(LOG_MODEL)
    assert main(["watch", f"{tmp_path / 'logm.py'}:build", "--input", "3x4", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["finite"] is False and data["culprit"]["module"] == "1" and data["culprit"]["nan"] > 0
    assert [r["module"] for r in data["rows"]] == ["0", "1"]


def test_summary_json_is_the_summary(capsys):
    assert main(["summary", "tiny", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    model, x = tiny()
    assert data == jsonable(summary(model, x).to_dict())


# --- help ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["trace", "diff", "watch", "summary", "layers"])
def test_help_ends_with_examples_one_per_line_after_the_security_note(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    security, examples = text.split("\nExamples:\n")
    assert "Security: file.py:ATTR and package.module:ATTR import and run that Python code" in " ".join(security.split())
    commands = [line.strip() for line in examples.splitlines() if line.startswith("  hookscope ")]
    assert len(commands) >= 3 and all(c.startswith(f"hookscope {command} ") for c in commands)
    assert ("--json" in text) and (("--plot PNG" in text) == (command in ("trace", "diff")))
