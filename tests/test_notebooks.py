"""The notebooks under docs/notebooks run as written, offline, and show their results as HTML."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

if os.environ.get("CI"):  # CI installs the dev extra: a missing package fails there instead of skipping
    import nbclient
    import nbformat
else:
    nbformat = pytest.importorskip("nbformat")  # the dev extra: nbformat, nbclient and ipykernel
    nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "docs" / "notebooks"


def _run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def _html(cell: nbformat.NotebookNode) -> str:
    return "".join(o["data"].get("text/html", "") for o in cell.get("outputs", []) if "data" in o)


def test_the_notebooks_hold_no_outputs():
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        assert not [c for c in nb.cells if c.cell_type == "code" and (c.outputs or c.execution_count)], path.name


def test_the_in_place_trap_notebook_shows_a_summary_a_trace_and_cam_maps(tmp_path, monkeypatch):
    nb = _run("in-place-trap.ipynb", tmp_path, monkeypatch)
    code = [c for c in nb.cells if c.cell_type == "code"]
    printed = "".join(o.get("text", "") for o in code[0].outputs)
    assert re.search(r"a plain hook's smallest value: 0\.0\n", printed)
    assert re.search(r"hookscope's smallest value: +-\d", printed)
    summary, trace, cams = (_html(c) for c in code[1:4])
    assert re.search(r"<caption>Summary: \d+ rows</caption>", summary) and ">layer1.0<" in summary
    assert re.search(r"<caption>Trace: \d+ rows", trace) and ">fc<" in trace and "data:image/png;base64," in trace
    assert "<caption>CamMaps: 2 rows</caption>" in cams and cams.count("data:image/png;base64,") == 1
    assert "<table" in _html(code[4]) and ">zero_frac<" in _html(code[4])  # pandas' own table


def test_the_explaining_notebook_shows_predictions_cam_and_attribution(tmp_path, monkeypatch):
    nb = _run("explaining-a-prediction.ipynb", tmp_path, monkeypatch)
    code = [c for c in nb.cells if c.cell_type == "code"]
    printed = "".join(o.get("text", "") for o in code[0].outputs)
    assert re.findall(r"picture \d: a (\w+); the model says (\w+)", printed) == [
        ("ring", "ring"), ("square", "square"), ("circle", "circle"), ("circle", "circle")]
    cams, figure, ig = _html(code[1]), code[2].outputs, _html(code[3])
    assert "<caption>CamMaps: 4 rows</caption>" in cams and cams.count("data:image/png;base64,") == 1
    assert [o["data"].keys() >= {"image/png"} for o in figure if "data" in o] == [True]  # the side-by-side figure
    assert "<caption>Attributions: 4 rows</caption>" in ig and ig.count("data:image/png;base64,") == 1
    assert "4 of 4 maps peak on the shape" in "".join(o.get("text", "") for o in code[4].outputs)
    assert "<table" in _html(code[4]) and ">peak<" in _html(code[4])  # pandas' own table


def test_the_pruning_notebook_shows_masks_sparsity_and_the_model_before_and_after(tmp_path, monkeypatch):
    nb = _run("pruning-a-model.ipynb", tmp_path, monkeypatch)
    before, sparsity, removed, channels, after, comparison, trained = (c for c in nb.cells if c.cell_type == "code")
    cell = re.compile(r"<td[^>]*>([^<]*)</td>")
    assert "Params: 144,342 (144.34 K)" in before.outputs[0]["text"]
    assert "<caption>Sparsity: 23 rows</caption>" in _html(sparsity)
    assert cell.findall(_html(sparsity))[:6] == ["stem.0", "weight", "Conv2d", "432", "130", "True"]  # 30% masked
    assert "['stem.0.weight', 'layer1.0.weight', 'layer1.3.weight'] ..." in removed.outputs[0]["text"]
    assert "<caption>ChannelPruning: 7 rows</caption>" in _html(channels)
    assert cell.findall(_html(channels))[:6] == ["0", "stem.0", "16", "4", "weights of stem.0", "0"]
    assert "Params: 81,474 (81.47 K)" in after.outputs[0]["text"] and "stem (Sequential)         1x12x64x64" in after.outputs[0]["text"]
    table = _html(comparison)
    assert "<caption>ModelComparison: 8 rows</caption>" in table
    assert cell.findall(table)[:3] == ["parameters", "144,342", "81,474"] and ">accuracy<" in table
    assert re.search(r"trained 40 steps: (9\d|100)% of the 64 new shapes right", trained.outputs[0]["text"])
