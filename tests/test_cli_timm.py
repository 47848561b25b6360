"""MODEL timm:NAME: timm.create_model(NAME, pretrained=False), --weights FILE through the strict loader,
the input timm's config says by default."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch

from helpers import no_hooks
from hookscope.cli import main
from hookscope.loading import model as loading_model

timm = pytest.importorskip("timm")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """Every timm model the CLI builds, to check afterwards that no hook is left on it."""
    seen: list[torch.nn.Module] = []
    real = loading_model.timm_model

    def spy(spec: str) -> torch.nn.Module:
        seen.append(real(spec))
        return seen[-1]

    monkeypatch.setattr(loading_model, "timm_model", spy)
    return seen


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_summary_counts_timms_parameters_and_weightless_commands_do_not_warn(capsys: Any,
                                                                            built: list[torch.nn.Module]) -> None:
    assert main(["summary", "timm:resnet18", "--input", "1x3x32x32", "--depth", "0"]) == 0
    out, err = capsys.readouterr()
    expected = sum(p.numel() for p in timm.create_model("resnet18", pretrained=False).parameters())
    assert f"Params: {expected:,} " in out and err == ""
    assert type(built[0]).__module__.startswith("timm.") and no_hooks(built[0])


def test_weights_file_is_loaded_strictly_and_gives_that_models_output(tmp_path: Any, capsys: Any) -> None:
    torch.manual_seed(7)
    reference = timm.create_model("resnet18", pretrained=False, num_classes=1000).eval()
    path = tmp_path / "r18.pt"
    torch.save(reference.state_dict(), path)
    assert main(["trace", "timm:resnet18", "--weights", str(path), "--input", "2x3x32x32", "--layers", "fc",
                 "--no-inputs", "--json"]) == 0
    out, err = capsys.readouterr()
    row = json.loads(out)["rows"][0]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = reference(x)
    assert row["shape"] == [2, 1000] and row["max"] == pytest.approx(logits.max().item(), rel=1e-5)
    assert "random weights" not in err
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), path)
    assert "does not fit timm:resnet18 (ResNet)" in _error(capsys, ["summary", "timm:resnet18", "--weights", str(path)])


def test_without_weights_the_model_is_random_and_says_so_once(capsys: Any) -> None:
    assert main(["watch", "timm:resnet18", "--input", "1x3x32x32"]) == 0
    err = capsys.readouterr().err
    assert err.count("timm:resnet18 has random weights") == 1 and "--weights FILE" in err


def test_the_default_input_is_the_one_timms_config_names(capsys: Any, built: list[torch.nn.Module]) -> None:
    assert main(["layers", "timm:resnet10t", "conv1.0", "--json"]) == 0
    c, h, w = built[0].pretrained_cfg["input_size"]  # (3, 176, 176) for resnet10t: not torchvision's 224
    assert json.loads(capsys.readouterr().out) == [{"name": "conv1.0", "type": "Conv2d",
                                                    "output": f"1x24x{h // 2}x{w // 2}"}]  # a stride-2 conv


@pytest.mark.slow
def test_cam_on_a_timm_vit_with_its_tokens_laid_on_the_grid(capsys: Any, built: list[torch.nn.Module]) -> None:
    assert main(["cam", "timm:vit_tiny_patch16_224", "--layer", "blocks.11.norm1", "--tokens", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = built[0](x)
    assert data["input"] == [1, 3, 224, 224] and data["rows"][0]["target"] == int(logits.argmax())
    assert data["rows"][0]["score"] == pytest.approx(logits.max().item(), rel=1e-5)
    assert no_hooks(built[0])


def test_unknown_timm_name_suggests_close_ones(capsys: Any) -> None:
    err = _error(capsys, ["summary", "timm:resnet19"])
    assert "timm has no model 'resnet19'. Did you mean" in err and "'resnet18'" in err


def test_missing_timm_names_the_extra(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)
    assert _error(capsys, ["summary", "timm:resnet18"]) == (
        'hookscope summary: error: MODEL timm:NAME needs timm, from the timm extra: pip install "hookscope[timm]"')
