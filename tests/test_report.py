"""The HTML report: complete or absent (also under SIGKILL), never replacing what is not a report; opened
in a real headless browser: tabs and the layer picker change what is shown, every picture loads, no
console error, and without JavaScript every picture is on the page and nothing is interactive.

Reports are built once per module where several tests read them: the demo's (trained weights on the
generated shapes it was trained for: no banner) and a command-line report of ``tiny`` against other
weights (random weights, generated input: both banners, and the comparison section)."""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import shutil
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from forked import Forks
from helpers import exited_pid, no_hooks
from torch import nn

from hookscope.cli import main
from hookscope.errors import HookscopeError
from hookscope.report import build_report
from hookscope.report.summary import count, summary_facts
from hookscope.synthetic import shapes
from hookscope.zoo import DEMO_CLASSES, TinyResNet, demo_model

DEMO_TITLE = "hookscope demo: DemoNet on generated shapes"


def _small() -> nn.Module:
    """A model whose report is quick to build: for the tests of the folder, not of the sections."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 3)).eval()


def _quiet_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``hookscope demo --batch 2``: the trained demo model on two generated shapes, with its report, written
    over an earlier report of the demo's own (which it replaces)."""
    out = tmp_path_factory.mktemp("demo") / "d"
    (out / "img").mkdir(parents=True)
    (out / "index.html").write_text("an earlier report")
    (out / "report.json").write_text(json.dumps({"hookscope_report": 1, "title": DEMO_TITLE}))
    code, said, err = _quiet_main(["demo", "--batch", "2", "--out", str(out)])
    assert code == 0, err
    return {"out": out, "said": said, "err": err}


@pytest.fixture(scope="module")
def demo_report(demo_run: dict[str, Any]) -> Path:
    return Path(demo_run["out"])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``hookscope report tiny --against W``: random weights, a generated input of two images, against the
    same model with one weight of ``down`` changed (so the first divergence is ``down``)."""
    root = tmp_path_factory.mktemp("tiny")
    state = TinyResNet(seed=0).state_dict()
    state["down.weight"] = state["down.weight"] + 0.25
    torch.save(state, root / "other.pt")
    code, said, err = _quiet_main(["report", "tiny", "--input", "2x3x32x32", "--methods", "gradcam",
                                   "--against", str(root / "other.pt"), "--out", str(root / "r"), "--json"])
    assert code == 0, err
    return {"out": root / "r", "said": json.loads(said), "err": err, "weights": root / "other.pt"}


def _images(index: Path) -> list[str]:
    return re.findall(r'<img [^>]*src="([^"]+)"', index.read_text())


def _doc(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


# --- what the folder holds ----------------------------------------------------------------------------------
def test_the_report_holds_its_page_pictures_and_numbers(demo_report: Path) -> None:
    assert sorted(p.name for p in demo_report.iterdir()) == ["img", "index.html", "report.json"]
    pictures = _images(demo_report / "index.html")
    assert sorted(set(pictures)) == sorted(f"img/{p.name}" for p in (demo_report / "img").iterdir())
    doc = _doc(demo_report)
    assert doc["hookscope_report"] == 1 and doc["input_shape"] == [2, 3, 64, 64]
    assert doc["origin"] == {"random_weights": False, "weights": "the demo model's bundled weights",
                             "generated_inputs": False}
    assert set(doc["sections"]) == {"predictions", "summary", "structure", "features", "cam", "attribution", "trace",
                                    "nonfinite", "gradflow"}
    cams = doc["sections"]["cam"]["methods"]
    assert set(cams) == {"gradcam", "gradcam++", "layercam"}
    assert all(0.0 <= m["pointing_game"] <= 1.0 and 0.0 <= m["deletion_auc"] <= 1.0 for m in cams.values())
    # every input drawn: a CAM picture and, per layer, a grid per image
    layers = doc["sections"]["features"]["layers"]
    assert sorted(layers) == ["layer1", "layer2", "layer3", "stem"]
    assert {f"img/cam_{i}.png" for i in range(2)} <= set(pictures)
    assert {f"img/attribution_{i}.png" for i in range(2)} <= set(pictures)
    assert {f"img/features_{k}_{i}.png" for k in range(4) for i in range(2)} <= set(pictures)
    html = (demo_report / "index.html").read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html and " src=\"http" not in html


def test_the_numbers_are_the_analyses_numbers(demo_report: Path) -> None:
    import hookscope

    data = shapes(2, seed=0)
    model = demo_model()
    doc = _doc(demo_report)
    logits = model(data.images)
    assert [r["class"] for r in doc["sections"]["predictions"]] == logits.argmax(1).tolist()
    assert [r["name"] for r in doc["sections"]["predictions"]] == [DEMO_CLASSES[k] for k in logits.argmax(1)]
    assert doc["sections"]["summary"]["totals"]["params"] == sum(p.numel() for p in model.parameters())
    r = hookscope.cam(model, data.images, method="gradcam")
    point = hookscope.metrics.pointing_game(r.maps, data.masks).float().mean().item()
    assert doc["sections"]["cam"]["methods"]["gradcam"]["pointing_game"] == pytest.approx(point)
    fm = hookscope.feature_maps(model, data.images, layers="layer2")
    assert doc["sections"]["features"]["layers"]["layer2"]["channels"] == fm.top(16)
    shown = fm.maps[:, fm.top(16)]
    assert doc["sections"]["features"]["layers"]["layer2"]["range"] == pytest.approx(
        [float(shown.min()), float(shown.max())])


def test_the_summary_reads_as_words_and_units() -> None:
    import hookscope

    facts = dict(summary_facts(hookscope.summary(demo_model(), torch.zeros(1, 3, 64, 64))))
    params = sum(p.numel() for p in demo_model().parameters())
    assert facts["Parameters"] == f"{count(params)} (trainable {count(params)}, frozen 0)"
    assert facts["Masked layers"] == "none" and facts["Zero parameters"] == "none"
    assert facts["Input"] == "1 × 3 × 64 × 64 float32"
    import torch.nn.utils.prune as prune

    pruned = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    prune.l1_unstructured(pruned[0], "weight", amount=0.5)
    facts = dict(summary_facts(hookscope.summary(pruned, torch.zeros(1, 4))))
    assert facts["Masked layers"] == "0.weight" and facts["Zero parameters"] == "40.0% (8 of 20)"


def test_the_demo_replaces_its_own_report_and_prints_the_path(demo_run: dict[str, Any]) -> None:
    said = demo_run["said"]
    assert f"Report: {demo_run['out'] / 'index.html'}" in said and "Hooks left on the model: 0." in said
    assert (demo_run["out"] / "index.html").read_text() != "an earlier report"
    assert _doc(demo_run["out"])["title"] == DEMO_TITLE
    assert "report [" not in demo_run["err"]  # no progress bar where stderr is not a terminal


# --- the banner: random weights, generated input ----------------------------------------------------------
def test_real_weights_on_real_images_have_no_banner(demo_report: Path) -> None:
    html = (demo_report / "index.html").read_text()
    assert 'class="banner"' not in html and "Random weights" not in html


def test_random_weights_and_a_generated_input_are_said_at_the_top(tiny_run: dict[str, Any]) -> None:
    html = (tiny_run["out"] / "index.html").read_text()
    heads = re.findall(r'<div class="banner" role="note"><strong>([^<]+)</strong>', html)
    assert heads == ["Random weights:", "Generated input:"]
    assert html.index('class="banner"') < html.index("<h1>")
    assert _doc(tiny_run["out"])["origin"] == {"random_weights": True, "weights": "random (seed 0)",
                                               "generated_inputs": True}
    err = tiny_run["err"].strip().splitlines()  # and on stderr, once each
    assert sum("tiny has random weights" in line for line in err) == 1
    assert sum("the input is generated" in line for line in err) == 1 and not any("\r" in line for line in err)


# --- against another model ----------------------------------------------------------------------------------
def test_against_adds_the_first_divergence(tiny_run: dict[str, Any]) -> None:
    doc = _doc(tiny_run["out"])
    rows = doc["sections"]["diff"]["rows"]
    first = next(r for r in rows if r["status"] != "ok")
    assert first["name"] == "down" and doc["sections"]["diff"]["first"]["name"] == "down"
    assert all(r["status"] == "ok" for r in rows[:rows.index(first)])  # stem and layer1 agree
    html = (tiny_run["out"] / "index.html").read_text()
    assert f"<h2>Against tiny with the weights {tiny_run['weights']}</h2>" in html
    assert '<p class="warn">First divergence: down: ' in html
    assert html.count('<tr class="bad">') == sum(r["status"] != "ok" for r in rows)


def test_against_from_python_leaves_both_models_as_they_were(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, other = _small(), _small()
    with torch.no_grad():
        other[4].bias += 1  # the head alone differs
    model[4].weight.grad = torch.ones_like(model[4].weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = ["<script>alert(1)</script>"] * 3
    path = build_report(model, torch.rand(2, 3, 8, 8), tmp_path / "r", methods=[], against=other,
                        against_name="a new head", class_names=names, progress=True)
    assert torch.equal(model[4].weight.grad, torch.ones_like(model[4].weight))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "4.weight")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not model.training and not other.training and no_hooks(model) and no_hooks(other)
    html = (path / "index.html").read_text()
    diff = _doc(path)["sections"]["diff"]
    assert "<h2>Against a new head</h2>" in html and diff["first"]["name"] == "4"
    assert [r["status"] for r in diff["rows"]][:4] == ["ok"] * 4  # the layers before the head agree
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # escaped
    bar = capsys.readouterr().err.split("\r")  # progress=True: a bar, ended by its full line
    assert bar[-1].startswith("report [########################] ") and bar[-1].rstrip().endswith("done")
    assert any("comparison with a new head" in b for b in bar) and any("feature maps of 0" in b for b in bar)


@pytest.mark.parametrize("against, message", [
    ("nosuch.pt", "--against nosuch.pt: no such file: nosuch.pt"),
    ("BAD", "--against BAD does not fit tiny (TinyResNet)"),
    ("bogus", "--against bogus: MODEL 'bogus' is not understood"),
])
def test_against_refuses_bad_input_in_one_line(tmp_path: Path, against: str, message: str) -> None:
    bad = tmp_path / "bad.pt"
    torch.save({"a": torch.zeros(2)}, bad)
    against = str(bad) if against == "BAD" else against
    code, _, err = _quiet_main(["report", "tiny", "--against", against, "--out", str(tmp_path / "r")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message.replace("BAD", str(bad)) in lines[0], lines
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt"]


# --- the folder -------------------------------------------------------------------------------------------------
def test_an_existing_folder_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "r"
    build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[])
    with pytest.raises(HookscopeError, match="exists; give overwrite=True"):
        build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[])
    build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[], overwrite=True)
    assert (out / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the old one moved aside and removed


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(HookscopeError, match="not a hookscope report, so it is not replaced"):
        build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[], overwrite=True)
    assert (out / "holiday.jpg").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


def test_an_error_half_way_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import hookscope.report.build as build

    def broken(*a: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(build, "debug_sections", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=[], progress=True)
    assert list(tmp_path.iterdir()) == []
    bar = capsys.readouterr().err  # the bar's line is ended, so that the error starts a line of its own
    assert bar.endswith("\n") and "stopped: trace" in bar.split("\r")[-1]


_KILLED = """
import sys, time, torch
from pathlib import Path
import hookscope.report.build as build

real = build.feature_section
def slow(*args):
    found = real(*args)  # pictures already written into the hidden folder
    Path(sys.argv[2]).write_text("half way")
    time.sleep(60)
    return found
build.feature_section = slow
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
build.build_report(model, torch.rand(1, 3, 8, 8), sys.argv[1], methods=[], overwrite=True)
"""


@pytest.mark.parametrize("existing", [False, True])
def test_sigkill_half_way_leaves_the_old_report_or_none(tmp_path: Path, existing: bool, forks: Forks) -> None:
    out, flag = tmp_path / "r", tmp_path / "flag"
    if existing:
        build_report(_small(), torch.rand(1, 3, 8, 8), out, methods=[])
        old = (out / "report.json").read_text()
    pid = forks.start(["-c", str(out), str(flag)], code=textwrap.dedent(_KILLED))  # a process of its own
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert forks.poll(pid) is None and time.monotonic() < deadline, "the writer ended early"
            time.sleep(0.05)
        partial = [p for p in tmp_path.iterdir() if p.name.startswith(".r.partial-")]
        assert len(partial) == 1 and (partial[0] / "img").is_dir()  # it really was half way
    finally:
        if forks.poll(pid) is None:
            os.kill(pid, signal.SIGKILL)
        forks.wait(pid)
    if existing:
        assert (out / "report.json").read_text() == old and (out / "index.html").is_file()
    else:
        assert not out.exists()


def test_a_killed_runs_hidden_folder_is_removed_by_the_next_run(tmp_path: Path) -> None:
    stale = tmp_path / f".r.partial-{exited_pid()}-abc_1234"
    live = tmp_path / f".r.partial-{os.getpid()}-xyz_7890"  # a writer still running: left alone
    for p in (stale, live):
        (p / "img").mkdir(parents=True)
        (p / ".hookscope-partial").touch()
    build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=[])
    assert not stale.exists() and live.exists() and (tmp_path / "r" / "index.html").is_file()


# --- a real browser ------------------------------------------------------------------------------------------
def test_the_attribution_scores_are_the_metrics_of_the_attributions(demo_report: Path) -> None:
    """Each method's deletion / insertion AUC and pointing game, worked out again from hookscope.attribute's
    maps by hookscope.metrics (the maps' channels summed as absolute values, the demo's backgrounds)."""
    import hookscope

    data, model = shapes(2, seed=0), demo_model()
    section = _doc(demo_report)["sections"]["attribution"]
    assert list(section["methods"]) == ["saliency", "integrated_gradients", "guided_gradcam"] and section["skipped"] == {}
    settings = {"integrated_gradients": {"steps": 16, "rule": "gausslegendre"}}
    for method, said in section["methods"].items():
        r = hookscope.attribute(model, data.images, method=method, **settings.get(method, {}))
        curve = {"target": r.target, "steps": 25, "baseline": data.backgrounds}
        assert said["deletion_auc"] == pytest.approx(hookscope.metrics.deletion(model, data.images, r.maps.abs().sum(1),
                                                                               **curve).auc.mean().item())
        assert said["insertion_auc"] == pytest.approx(hookscope.metrics.insertion(model, data.images, r.maps,
                                                                                 **curve).auc.mean().item())
        hits = hookscope.metrics.pointing_game(r.maps.abs().sum(1), data.masks).float().mean().item()
        assert said["pointing_game"] == pytest.approx(hits) and 0 <= hits <= 1
    assert section["methods"]["integrated_gradients"]["settings"] == {"steps": 16, "rule": "gausslegendre"}
    assert no_hooks(model)


def _chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _browser_or_skip() -> str:
    path = _chromium()
    try:
        import playwright  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs chromium and playwright: .ci/run installs them")
        pytest.skip("no chromium or playwright here (.ci/run installs them)")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@contextlib.contextmanager
def _opened(browser: Any, index: Path, *, script: bool = True) -> Iterator[tuple[Any, list[str]]]:
    """The page, loaded, and every console error, page error and failed request it had."""
    context = browser.new_context(java_script_enabled=script, viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
    page.goto(index.as_uri(), wait_until="load")
    try:
        yield page, errors
    finally:
        context.close()


def _shown(page: Any, view_set: str) -> str:
    """The picture of the one view of ``view_set`` that shows."""
    shown = page.locator(f"#{view_set} > .view:visible")
    assert shown.count() == 1
    return str(shown.locator("img").last.get_attribute("src"))


def test_tabs_the_layer_picker_and_the_channel_viewer_change_what_shows(browser: Any, demo_report: Path) -> None:
    top = _doc(demo_report)["sections"]["features"]["layers"]["layer1"]["channels"]
    with _opened(browser, demo_report / "index.html") as (page, errors):
        assert _shown(page, "cam-views") == "img/cam_0.png"
        page.locator("#cam-views button", has_text="image 1").click()
        assert _shown(page, "cam-views") == "img/cam_1.png"
        assert page.locator("#cam-views button", has_text="image 1").get_attribute("aria-selected") == "true"
        assert _shown(page, "feature-views") == "img/features_0_0.png"
        page.locator("#feature-views select[data-axis=layer]").select_option("2")
        assert _shown(page, "feature-views") == "img/features_2_0.png"
        page.locator("#feature-views button", has_text="image 1").click()
        assert _shown(page, "feature-views") == "img/features_2_1.png"
        page.locator("#feature-views select[data-axis=layer]").select_option("1")  # layer1: 32 x 32 maps
        zoom = page.locator("#feature-views > .view:visible .zoom")
        zoom.locator("select").select_option("5")
        g = {k: int(str(zoom.get_attribute(f"data-{k}"))) for k in ("th", "tw", "pad", "cols")}
        style = zoom.locator(".tile").evaluate("t => [t.style.backgroundPosition, t.style.width, t.dataset.channel]")
        note = zoom.locator(".tile-note").inner_text()
        widths = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
    assert widths and all(done and width > 0 for done, width in widths), widths
    assert g["th"] == g["tw"] == 64 and g["cols"] == 4  # 32 x 32 maps enlarged twice; 16 tiles, 4 a row
    k = 224 // 64
    x, y = g["pad"] + (5 % 4) * (64 + g["pad"]), g["pad"] + (5 // 4) * (64 + g["pad"])
    assert style == [f"{-x * k}px {-y * k}px", f"{64 * k}px", "5"]  # tile 5 of the sheet, enlarged
    assert note.startswith(f"channel {top[5]}: mean ")
    assert errors == []


def test_the_attribution_tabs_change_the_image_shown(browser: Any, demo_report: Path) -> None:
    with _opened(browser, demo_report / "index.html") as (page, errors):
        assert _shown(page, "attribution-views") == "img/attribution_0.png"
        page.locator("#attribution-views button", has_text="image 1").click()
        assert _shown(page, "attribution-views") == "img/attribution_1.png"
        assert _shown(page, "cam-views") == "img/cam_0.png"  # the CAM tabs are their own
        heading = page.locator("#attribution h2").inner_text()
    assert heading == "Input attribution" and errors == []


def test_without_javascript_every_picture_shows_and_nothing_is_interactive(browser: Any, demo_report: Path) -> None:
    with _opened(browser, demo_report / "index.html", script=False) as (page, errors):
        images = page.locator("img")
        shown = images.count()
        visible = [images.nth(i).is_visible() for i in range(shown)]
        boxes = page.eval_on_selector_all("img", "els => els.map(e => e.getBoundingClientRect().height)")
        controls = page.locator("select:visible, button:visible, .zoom:visible").count()
        titles = page.locator("#feature-views h3.view-title:visible").all_inner_texts()
        svg = page.locator("svg.structure").bounding_box()
        text = page.inner_text("body")
    # input and grid per layer and image, CAMs and attributions per image, trace, flow
    assert shown == len(_images(demo_report / "index.html")) == 4 * 2 * 2 + 2 + 2 + 2
    assert all(visible) and min(boxes) > 0
    assert controls == 0 and svg is not None and svg["height"] > 300
    assert titles == [f"{layer}, image {i}" for layer in ("stem", "layer1", "layer2", "layer3") for i in range(2)]
    assert not re.search(r"\b(True|False|None)\b|\(\)|\[\]|\{'", text), "a Python value on the page"
    assert errors == []


def test_the_structure_picture_names_the_modules_in_call_order(demo_report: Path) -> None:
    html = (demo_report / "index.html").read_text()
    svg = re.search(r'<svg class="structure".*?</svg>', html, flags=re.S)
    assert svg is not None
    names = re.findall(r'<text [^>]*class="name"[^>]*>([^<]+)</text>', svg.group(0))
    shapes_ = re.findall(r'<text [^>]*class="shape"[^>]*>([^<]+)</text>', svg.group(0))
    assert names == ["stem  Sequential", "layer1  Sequential", "layer2  Sequential", "layer3  Sequential",
                     "pool  AdaptiveAvgPool2d", "fc  Linear"]
    assert shapes_[0] == "→ 16 × 64 × 64 · 464 params" and shapes_[4] == "→ 64 × 1 × 1"
    chips = re.findall(r'<g class="chip"><title>([^<]+)</title>', svg.group(0))
    assert chips[:3] == ["stem.0: Conv2d, output 16 × 64 × 64", "stem.1: BatchNorm2d, output 16 × 64 × 64",
                         "stem.2: ReLU, output 16 × 64 × 64"]


def test_the_comparison_and_banners_open_without_errors(browser: Any, tiny_run: dict[str, Any]) -> None:
    with _opened(browser, tiny_run["out"] / "index.html") as (page, errors):
        banners = page.locator(".banner:visible").all_inner_texts()
        rows = page.locator("#diff table.rows tr.bad:visible").count()
        assert _shown(page, "cam-views") == "img/cam_0.png"
    assert [b.split(":")[0] for b in banners] == ["Random weights", "Generated input"]
    assert rows > 0 and errors == []


# --- the commands ---------------------------------------------------------------------------------------------
def test_report_command_writes_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    assert main(["report", "demo", "--out", str(out), "--input", "1x3x64x64", "--methods", "none", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["index"] == str(out / "index.html") and Path(said["index"]).is_file()
    # trained weights on a random input: the page says only that the input is generated
    assert re.findall(r"<strong>([^<]+)</strong>", (out / "index.html").read_text()) == ["Generated input:"]
    assert main(["report", "demo", "--out", str(out), "--methods", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; give --overwrite" in err[0]


@pytest.mark.parametrize("planted", [{"name": "report.json", "text": "{}"},
                                     {"name": "report.json", "text": '{"hookscope_report": 1}', "extra": True}])
def test_a_folder_is_a_report_only_if_it_holds_nothing_else(tmp_path: Path, planted: dict,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "proj"
    out.mkdir()
    (out / planted["name"]).write_text(planted["text"])
    if planted.get("extra"):
        (out / "index.html").write_text("mine")
        (out / "notes").mkdir()
    (out / "thesis.tex").write_text("precious")
    assert main(["demo", "--batch", "1", "--out", str(out)]) == 2
    assert "not a hookscope report, so it is not replaced" in capsys.readouterr().err
    assert main(["report", "demo", "--images", "1", "--methods", "none", "--out", str(out), "--overwrite"]) == 2
    assert (out / "thesis.tex").read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_the_current_folder_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.csv").write_text("data")
    monkeypatch.chdir(tmp_path)
    assert main(["report", "demo", "--images", "1", "--methods", "none", "--out", ".", "--overwrite"]) == 2
    assert main(["demo", "--batch", "1", "--out", str(tmp_path.parent)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("is the current folder or holds it" in line for line in err)
    assert (tmp_path / "results.csv").read_text() == "data"


@pytest.mark.parametrize("argv, message", [
    (["--methods", "bogus"], "--methods: unknown method 'bogus'; choose from"),
    (["--methods", ","], "--methods ',' names no method"),
    (["--images", "100000"], "--images 100000 must be from 1 to 512"),
    (["--layers", "layer9"], "selector 'layer9' matches no module of DemoNet"),
    (["--classes", "CLASSES"], "gives 8 class names but the model has 6 outputs"),
])
def test_report_mistakes_are_one_line_before_any_work(tmp_path: Path, argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"c{i}" for i in range(8)))
    argv = [str(names) if a == "CLASSES" else a for a in argv]
    assert main(["report", "demo", "--out", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["names.txt"]


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layers", "tiny", "nosuch", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith("hookscope layers: error:")


# --- what the report is about: the caller's inputs, where the weights came from ------------------------
class Scaling(nn.Module):
    """Writes into its input (``x.mul_``), as a careless model may: every pass after the first would see
    another input if the report fed it the same tensor."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.25)
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


def test_every_pass_sees_the_callers_inputs_and_leaves_them_as_they_were(tmp_path: Path) -> None:
    model = Scaling().eval()
    x = torch.rand(2, 3, 8, 8)
    given = x.clone()
    path = build_report(model, x, tmp_path / "r", methods=[], attributions=[], progress=False)
    assert torch.equal(x, given)  # the caller's tensor, untouched
    doc = json.loads((path / "report.json").read_text())
    with torch.no_grad():
        expected = model(given.clone()).softmax(-1).max(-1)
    assert [r["class"] for r in doc["sections"]["predictions"]] == expected.indices.tolist()
    assert [r["prob"] for r in doc["sections"]["predictions"]] == pytest.approx(expected.values.tolist())
    first = doc["sections"]["trace"]["rows"][0]  # the conv's output, traced on the given inputs
    with torch.no_grad():
        conv = model.conv(given * 0.25)
    assert first["std"] == pytest.approx(float(conv.float().std(unbiased=False)), rel=1e-5)
    assert no_hooks(model)


def test_an_hf_model_built_from_a_config_has_the_random_weights_banner(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=16, num_labels=3)
    config.save_pretrained(tmp_path / "vit")
    code, _, err = _quiet_main(["report", "hf:image-classification", "--config", str(tmp_path / "vit"),
                                "--input", "1x3x16x16", "--methods", "none", "--out", str(tmp_path / "r")])
    assert code == 0, err
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["origin"]["random_weights"] is True
    assert "random" in doc["origin"]["weights"]
    assert "Random weights:" in (tmp_path / "r" / "index.html").read_text()


def test_build_report_reads_where_load_model_got_the_weights(tmp_path: Path) -> None:
    from hookscope import load_model

    path = build_report(load_model("tiny"), torch.rand(1, 3, 32, 32), tmp_path / "r", methods=[],
                        attributions=[], progress=False)
    doc = json.loads((path / "report.json").read_text())
    assert doc["origin"]["random_weights"] is True and doc["origin"]["weights"] == "random (seed 0)"
    assert "Random weights:" in (path / "index.html").read_text()
    path = build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "s", methods=[], attributions=[],
                        progress=False)
    doc = json.loads((path / "report.json").read_text())
    assert doc["origin"]["random_weights"] is False and doc["origin"]["weights"] is None


def test_the_cam_scores_are_said_to_be_logits(tmp_path: Path) -> None:
    path = build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=["gradcam"], attributions=[],
                        progress=False)
    page = (path / "index.html").read_text()
    assert "the target class's logit" in html.unescape(page)
    from hookscope import cam
    from hookscope.viz.plots import plot_cams

    model, x = _small(), torch.rand(1, 3, 8, 8)
    fig = plot_cams(x[0], [cam(model, x, method="gradcam")])
    title = fig.axes[1].get_title()
    assert "logit " in title and "score" not in title


def _logged_run(folder: Path, nan_at: int | None = None) -> Path:
    """A monitored run of a small model; a NaN in the loss at step ``nan_at``."""
    import hookscope

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=2, log=folder, optimizer=opt, nonfinite="log") as mon:
        for step in range(8):
            opt.zero_grad()
            x = torch.randn(16, 4)
            if step == nan_at:
                x[0, 0] = float("nan")
            loss = net(x).pow(2).mean()
            loss.backward()
            mon.note(loss=loss)
            opt.step()
    return folder


def test_a_training_run_is_drawn_in_its_own_section(tmp_path: Path) -> None:
    import hookscope

    log = _logged_run(tmp_path / "log", nan_at=5)
    path = build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=[], attributions=[], run=log,
                        random_weights=True)
    page = (path / "index.html").read_text()
    assert '<section id="run"><h2>Training run</h2>' in page and 'src="img/run.png"' in page
    assert "first appeared at step 5" in page and (path / "img" / "run.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((path / "report.json").read_text())["sections"]["run"]
    run = hookscope.read_run(log)
    assert data["steps"] == run.steps and data["nonfinite_steps"][0] == 5 and data["layers"] == run.layers


def test_a_run_log_that_is_not_there_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HookscopeError, match="no such run log"):
        build_report(_small(), torch.rand(1, 3, 8, 8), tmp_path / "r", methods=[], run=tmp_path / "none")
    assert not (tmp_path / "r").exists()
    out = tmp_path / "cli"
    assert main(["report", "tiny", "--images", "1", "--methods", "none", "--run", str(tmp_path / "none"),
                 "--out", str(out)]) == 2
    assert "no such run log" in capsys.readouterr().err and not out.exists()


def test_the_command_draws_a_run_with_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _logged_run(tmp_path / "log")
    assert main(["report", "tiny", "--images", "1", "--methods", "none", "--run", str(log),
                 "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert '<section id="run">' in page and 'href="#run"' in page
