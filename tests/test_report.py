"""The HTML report: complete or absent (also under SIGKILL), never replacing what is not a report,
opened in a real headless browser with every picture loaded and no console error."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import no_hooks

from hookscope.cli import main
from hookscope.errors import HookscopeError
from hookscope.report import build_report
from hookscope.synthetic import shapes
from hookscope.zoo import DEMO_CLASSES, DemoNet, TinyResNet


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = shapes(3, seed=5)
    out = tmp_path_factory.mktemp("rep") / "r"
    return build_report(DemoNet(seed=0).eval(), data.images, out, pictures=data.images, masks=data.masks,
                        class_names=DEMO_CLASSES, methods=["gradcam", "layercam"])


def _images(index: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', index.read_text())


def test_the_report_holds_its_page_pictures_and_numbers(demo_report: Path) -> None:
    assert sorted(p.name for p in demo_report.iterdir()) == ["img", "index.html", "report.json"]
    pictures = _images(demo_report / "index.html")
    assert len(pictures) >= 4 and all((demo_report / p).is_file() for p in pictures)
    assert sorted(pictures) == sorted(f"img/{p.name}" for p in (demo_report / "img").iterdir())
    doc = json.loads((demo_report / "report.json").read_text())
    assert doc["hookscope_report"] == 1 and doc["input_shape"] == [3, 3, 64, 64]
    assert set(doc["sections"]) == {"predictions", "summary", "features", "cam", "trace", "nonfinite", "gradflow"}
    cams = doc["sections"]["cam"]["methods"]
    assert set(cams) == {"gradcam", "layercam"}
    assert all(0.0 <= m["pointing_game"] <= 1.0 and 0.0 <= m["deletion_auc"] <= 1.0 for m in cams.values())
    html = (demo_report / "index.html").read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_the_numbers_are_the_analyses_numbers(demo_report: Path) -> None:
    import hookscope

    data = shapes(3, seed=5)
    model = DemoNet(seed=0).eval()
    doc = json.loads((demo_report / "report.json").read_text())
    logits = model(data.images)
    assert [r["class"] for r in doc["sections"]["predictions"]] == logits.argmax(1).tolist()
    assert doc["sections"]["summary"]["totals"]["params"] == sum(p.numel() for p in model.parameters())
    r = hookscope.cam(model, data.images, method="gradcam")
    point = hookscope.metrics.pointing_game(r.maps, data.masks).float().mean().item()
    assert doc["sections"]["cam"]["methods"]["gradcam"]["pointing_game"] == pytest.approx(point)


def test_the_model_comes_back_as_it_was(tmp_path: Path) -> None:
    model = TinyResNet().eval()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    build_report(model, torch.rand(2, 3, 32, 32), tmp_path / "r", methods=["gradcam"])
    assert torch.equal(model.fc.weight.grad, torch.ones_like(model.fc.weight))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "fc.weight")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not model.training and no_hooks(model)


def test_text_from_the_model_is_escaped(tmp_path: Path) -> None:
    names = ["<script>alert(1)</script>"] * 10
    path = build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "r", class_names=names, methods=[])
    html = (path / "index.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_an_existing_folder_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "r"
    build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), out, methods=[])
    with pytest.raises(HookscopeError, match="exists; give overwrite=True"):
        build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), out, methods=[])
    build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), out, methods=[], overwrite=True)
    assert (out / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the old one moved aside and removed


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(HookscopeError, match="not a hookscope report, so it is not replaced"):
        build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), out, methods=[], overwrite=True)
    assert (out / "holiday.jpg").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


def test_an_error_half_way_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hookscope.report.build as build

    def broken(*a: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(build, "debug_sections", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "r", methods=[])
    assert list(tmp_path.iterdir()) == []


_KILLED = """
import sys, time, torch
from pathlib import Path
import hookscope.report.build as build
from hookscope.zoo import TinyResNet

real = build.debug_sections
def slow(s):
    found = real(s)  # pictures already written into the hidden folder
    Path(sys.argv[2]).write_text("half way")
    time.sleep(60)
    return found
build.debug_sections = slow
build.build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), sys.argv[1], methods=[], overwrite=True)
"""


@pytest.mark.parametrize("existing", [False, True])
def test_sigkill_half_way_leaves_the_old_report_or_none(tmp_path: Path, existing: bool) -> None:
    out, flag = tmp_path / "r", tmp_path / "flag"
    if existing:
        build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), out, methods=[])
        old = (out / "report.json").read_text()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED), str(out), str(flag)])
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer ended early"
            time.sleep(0.05)
        partial = [p for p in tmp_path.iterdir() if p.name.startswith(".r.partial-")]
        assert len(partial) == 1 and (partial[0] / "img").is_dir()  # it really was half way
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if existing:
        assert (out / "report.json").read_text() == old and (out / "index.html").is_file()
    else:
        assert not out.exists()


# --- a real browser ------------------------------------------------------------------------------
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


def test_the_report_opens_in_a_real_browser(demo_report: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = _browser_or_skip()
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            page.goto((demo_report / "index.html").as_uri(), wait_until="load")
            widths = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
            shot = tmp_path / "shot.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert widths and all(done and width > 0 for done, width in widths), widths
    assert errors == []
    assert shot.stat().st_size > 10_000


# --- the commands ---------------------------------------------------------------------------------
def test_report_command_writes_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    assert main(["report", "demo", "--out", str(out), "--images", "2", "--methods", "gradcam", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["index"] == str(out / "index.html") and Path(said["index"]).is_file()
    assert main(["report", "demo", "--out", str(out), "--methods", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; give --overwrite" in err[0]
    assert main(["report", "demo", "--out", str(out), "--methods", "none", "--overwrite"]) == 0


def test_demo_builds_its_report_and_prints_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d"
    assert main(["demo", "--batch", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"Report: {out / 'index.html'}" in text and (out / "index.html").is_file()
    assert main(["demo", "--batch", "2", "--out", str(out), "--json"]) == 0  # its own report is replaced
    doc = json.loads(capsys.readouterr().out)
    assert doc["hooks_left"] == 0 and len(doc["predictions"]) == 2 and doc["report"].endswith("index.html")


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


def test_a_killed_runs_hidden_folder_is_removed_by_the_next_run(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".r.partial-{dead.stdout.strip()}-abc_1234"
    live = tmp_path / f".r.partial-{os.getpid()}-xyz_7890"  # a writer still running: left alone
    for p in (stale, live):
        (p / "img").mkdir(parents=True)
        (p / ".hookscope-partial").touch()
    build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "r", methods=[])
    assert not stale.exists() and live.exists() and (tmp_path / "r" / "index.html").is_file()


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
