"""--device for the commands that run a model: declared once, checked before the model loads, the model
and its inputs moved there; a device this machine lacks, meta or a misspelt one is one line naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.cli import main
from hookscope.cli._common import check_device
from hookscope.cli.inputs._inputs import ModelInput

COMMANDS = {
    "summary": ["summary", "tiny", "--json"],
    "trace": ["trace", "tiny", "--json"],
    "watch": ["watch", "tiny", "--json"],
    "diff": ["diff", "tiny", "--b-seed", "1", "--json"],
    "cam": ["cam", "tiny", "--json"],
    "features": ["features", "tiny", "--layers", "layer1", "--out", "maps.png", "--overwrite", "--json"],
    "demo": ["demo", "--batch", "2", "--no-report", "--json"],
    "layers": ["layers", "tiny", "--json"],
    "prune": ["prune", "tiny", "--amount", "0.5", "--repeats", "1", "--json"],
    "prune --channels": ["prune", "tiny", "--channels", "--amount", "0.25", "--repeats", "1", "--json"],
}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def _same(command: str, a: str, b: str) -> None:
    assert _untimed(json.loads(a)) == _untimed(json.loads(b))


def _untimed(doc: object) -> object:
    """A command's JSON without the latencies prune measures (they differ from run to run)."""
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if doc.get("unit") != "ms"}
    if isinstance(doc, list):
        return [_untimed(v) for v in doc if not (isinstance(v, dict) and v.get("unit") == "ms")]
    return doc


@pytest.mark.parametrize("command", list(COMMANDS))
def test_device_cpu_gives_what_no_device_gives(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    argv = COMMANDS[command]
    plain = _run(capsys, argv)
    on_cpu = _run(capsys, [*argv, "--device", "cpu"])
    assert plain[0] == on_cpu[0] and plain[0] in (0, 1)
    _same(command, plain[1], on_cpu[1])


def test_cam_on_image_files_on_the_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    argv = ["cam", "demo", "--image", str(tmp_path / "a.png"), "--json"]
    plain, on_cpu = _run(capsys, argv), _run(capsys, [*argv, "--device", "cpu"])
    assert plain[0] == on_cpu[0] == 0 and json.loads(plain[1]) == json.loads(on_cpu[1])


@pytest.mark.parametrize("command", [*COMMANDS, "extract"])
@pytest.mark.parametrize(("device", "said"), [
    ("meta", "--device meta holds no values, so nothing can be computed there; give cpu or cuda"),
    ("gpu0", "--device 'gpu0' is not a device; give cpu, cuda or cuda:0"),
    ("ipu", "--device ipu: hookscope's commands run on cpu, cuda or mps; give one of them"),
])
def test_a_device_that_cannot_run_is_one_line(command: str, device: str, said: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = COMMANDS.get(command) or ["extract", "tiny", "--data", str(_npy(tmp_path)), "--layers", "fc",
                                     "--out", str(tmp_path / "store")]
    code, out, err = _run(capsys, [*argv, "--device", device])
    assert code == 2 and out == "" and err == [f"hookscope {argv[0]}: error: {said}"]
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("command", [*COMMANDS, "extract"])
def test_cuda_without_cuda_names_the_fix(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, on any machine
    argv = COMMANDS.get(command) or ["extract", "tiny", "--data", str(_npy(tmp_path)), "--layers", "fc",
                                     "--out", str(tmp_path / "store")]
    for device in ("cuda", "cuda:1"):
        code, out, err = _run(capsys, [*argv, "--device", device])
        assert code == 2 and out == ""
        assert err == [f"hookscope {argv[0]}: error: --device {device}: CUDA is not available here; give --device cpu"]


def _npy(tmp_path: Path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    return path


def test_check_device_and_moving_an_input() -> None:
    assert check_device(None) is None and check_device("cpu") == torch.device("cpu")
    given = ModelInput(torch.zeros(1, 2), {"attention_mask": torch.ones(1, 2), "use_cache": False})
    moved = given.to("cpu")
    assert torch.equal(moved.x, given.x) and moved.kwargs["use_cache"] is False
    assert given.to(None) is given


def test_the_model_and_its_input_are_moved_to_the_device(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[object] = []
    real = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: object, **kwargs: object) -> torch.nn.Module:
        seen.append(args[0] if args else kwargs.get("device"))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.Module, "to", to)
    assert main(["summary", "tiny", "--device", "cpu", "--json"]) == 0
    capsys.readouterr()
    assert torch.device("cpu") in seen


def test_report_on_the_device_is_the_same_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["report", "demo", "--images", "1", "--methods", "gradcam", "--json"]
    runs = [_run(capsys, [*argv, "--out", str(tmp_path / name), *extra]) for name, extra in
            (("plain", []), ("cpu", ["--device", "cpu"]))]
    assert [r[0] for r in runs] == [0, 0]
    plain, on_cpu = (json.loads((tmp_path / n / "report.json").read_text()) for n in ("plain", "cpu"))
    assert _numbers(plain) == _numbers(on_cpu)
    code, _, err = _run(capsys, [*argv, "--out", str(tmp_path / "meta"), "--device", "meta"])
    assert code == 2 and err[-1].endswith("--device meta holds no values, so nothing can be computed there; give "
                                          "cpu or cuda") and not (tmp_path / "meta").exists()


def _numbers(doc: object) -> object:
    """The report's content without what differs from run to run (times, the folder's own paths)."""
    if isinstance(doc, dict):
        return {k: _numbers(v) for k, v in doc.items() if not any(w in k for w in ("time", "seconds", "path", "out"))}
    if isinstance(doc, list):
        return [_numbers(v) for v in doc]
    return doc


@pytest.mark.parametrize("argv", [COMMANDS["layers"], ["layers", "--ops", "tiny", "layer1.0", "--json"],
                                  COMMANDS["prune"], COMMANDS["prune --channels"]])
def test_layers_and_prune_run_the_model_on_the_device(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    moved: list[object] = []
    real = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: object, **kwargs: object) -> torch.nn.Module:
        moved.append(args[0] if args else kwargs.get("device"))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.Module, "to", to)
    assert main([*argv, "--device", "cpu"]) == 0
    capsys.readouterr()
    assert torch.device("cpu") in moved
