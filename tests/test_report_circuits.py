"""The report's circuits section: patching sweeps, a logit lens and a direct logit attribution computed
beforehand, each drawn with its picture, a table of its largest cells (checked against the sweep's own
effects, ranked here by hand) and its full table; ``report.json`` keeps each result's numbers; anything
that is not such a result is refused before any work; opened in a headless browser, every picture loads."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.errors import HookscopeError
from hookscope.report import build_report

transformers = pytest.importorskip("transformers")


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 3)).eval()


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, initializer_range=0.2)
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(config).eval()
    clean, corrupted = torch.tensor([1, 7, 3, 9, 4, 2]), torch.tensor([1, 7, 8, 9, 4, 2])
    return {"sweep": hookscope.activation_patching(lm, clean, corrupted, answer=4, wrong=5),
            "heads": hookscope.attribution_patching(lm, clean, corrupted, answer=4, wrong=5, component="attn.z"),
            "lens": hookscope.logit_lens(lm, clean, token=4),
            "dla": hookscope.logit_attribution(lm, clean, answer=4, wrong=5)}


@pytest.fixture(scope="module")
def report(results: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("circuits") / "r"
    given = [results[k] for k in ("sweep", "heads", "lens", "dla")]
    return build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[], attributions=[], circuits=given,
                        random_weights=True, generated_inputs=True, progress=False)


def _cells(page: str, i: int) -> list[list[str]]:
    """The rows of result ``i``'s table of largest cells, as the page shows them."""
    block = page.split(f'<div class="circuit" id="circuit-{i}">')[1].split("</table>")[0]
    rows = block.split('<table class="rows">')[1].split("<tr>")[2:]
    return [[html.unescape(c.split("</td>")[0]) for c in r.split("<td>")[1:]] for r in rows]


def test_each_result_has_its_picture_and_tables_in_one_section(report: Path, results: dict[str, Any]) -> None:
    page = (report / "index.html").read_text()
    assert '<section id="circuits"><h2>Circuits</h2>' in page and 'href="#circuits"' in page
    for i in range(4):
        assert f'src="img/circuit_{i}.png"' in page
        assert (report / "img" / f"circuit_{i}.png").read_bytes()[:4] == b"\x89PNG"
    assert page.index("Activation patching: resid_pre per position") < page.index("Attribution patching: attn.z")
    assert page.index("Attribution patching: attn.z") < page.index("Logit lens") < page.index("Direct logit attribution")
    for r in results.values():  # the full tables, escaped
        assert html.escape(r.table()) in page


def test_the_table_lists_the_cells_that_move_the_metric_most(report: Path, results: dict[str, Any]) -> None:
    sweep = results["sweep"]
    effects = sweep.values - sweep.corrupted  # denoising: the change from the corrupted run, by hand
    ranked = sorted(((abs(float(effects[i, j])), i, j) for i in range(len(sweep.layers))
                     for j in range(len(sweep.columns))), reverse=True)[:5]
    gap = sweep.clean - sweep.corrupted
    want = [[sweep.layers[i], sweep.columns[j], f"{float(effects[i, j]):+.4f}", f"{float(effects[i, j]) / gap:.3f}"]
            for _, i, j in ranked]
    page = (report / "index.html").read_text()
    shown = _cells(page, 0)
    assert shown == want
    assert ["blocks.0", "2", f"{sweep.clean - sweep.corrupted:+.4f}", "1.000"] in shown  # the position that differs
    dla = results["dla"]
    terms = sorted(dla.rows, key=lambda r: -abs(r.value))[:5]
    assert _cells(page, 3) == [[r.name, f"{r.value:+.4f}"] for r in terms]
    lens = results["lens"]
    assert [row[0] for row in _cells(page, 2)] == lens.streams  # every stream, at the last position
    assert _cells(page, 2)[-1][4] == f"{float(lens.probs[-1, -1]):.3f}"


def test_report_json_keeps_each_results_numbers(report: Path, results: dict[str, Any]) -> None:
    data = json.loads((report / "report.json").read_text())["sections"]["circuits"]
    assert [d["type"] for d in data] == ["Patching", "Patching", "LogitLens", "LogitAttribution"]
    assert data[0]["values"] == results["sweep"].values.tolist() and data[0]["clean"] == results["sweep"].clean
    assert data[1]["method"] == "attribution" and data[1]["kind"] == "attn.z"
    assert data[2]["streams"] == results["lens"].streams and data[3]["total"] == pytest.approx(results["dla"].logit)
    assert [d["picture"] for d in data] == [f"img/circuit_{i}.png" for i in range(4)]


def test_one_result_alone_is_taken_and_no_circuits_leaves_the_section_out(tmp_path: Path,
                                                                          results: dict[str, Any]) -> None:
    one = build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "one", methods=[], attributions=[],
                       circuits=results["lens"], progress=False)
    assert json.loads((one / "report.json").read_text())["sections"]["circuits"][0]["type"] == "LogitLens"
    none = build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "none", methods=[], attributions=[],
                        progress=False)
    assert 'id="circuits"' not in (none / "index.html").read_text()


def test_what_is_not_a_circuit_result_is_refused_before_any_work(tmp_path: Path, results: dict[str, Any]) -> None:
    with pytest.raises(HookscopeError, match=r"circuits= item 1 is a Tensor, not a Patching"):
        build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=[], attributions=[],
                     circuits=[results["dla"], torch.zeros(2)])
    assert not (tmp_path / "r").exists()


def test_the_section_opens_in_a_browser_with_every_picture_loaded(report: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs chromium and playwright: .ci/run installs them")
        pytest.skip("no chromium or playwright here (.ci/run installs them)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            page.goto((report / "index.html").as_uri(), wait_until="load")
            shown = page.eval_on_selector_all("#circuits img", "els => els.map(e => [e.complete, e.naturalWidth])")
            visible = page.locator("#circuits table.rows").count()
        finally:
            browser.close()
    assert len(shown) == 4 and all(done and width > 0 for done, width in shown), shown
    assert visible == 4 and not errors, errors
