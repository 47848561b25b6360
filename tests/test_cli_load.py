import pytest
import torch
from torch import nn

from hookscope import HookscopeError
from hookscope.cli._load import example_input, load_model, parse_shape
from hookscope.zoo import TinyResNet


def test_model_specs(tmp_path):
    assert isinstance(load_model("tiny"), TinyResNet)
    m = load_model("torchvision:resnet18")
    assert type(m).__name__ == "ResNet" and not m.training
    assert isinstance(load_model("hookscope.zoo:TinyResNet"), TinyResNet)
    src = tmp_path / "mine.py"
    src.write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 2)\n")
    assert isinstance(load_model(f"{src}:build"), nn.Linear)
    saved = tmp_path / "m.pt"
    torch.save(nn.Sequential(nn.Linear(2, 2)), saved)
    assert isinstance(load_model(str(saved)), nn.Sequential)


def test_inputs_are_seeded_and_shaped():
    assert example_input("tiny", None).shape == (1, 3, 32, 32)
    assert example_input("torchvision:resnet18", "2x3x64x64").shape == (2, 3, 64, 64)
    assert torch.equal(example_input("tiny", None, seed=1), example_input("tiny", None, seed=1))
    assert parse_shape("1, 3, 8") == (1, 3, 8)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("torchvision:resnet19", "Did you mean 'resnet18'"),
        ("hookscope.zoo:TinyResnet", "Did you mean 'TinyResNet'"),
        ("nosuchpkg.mod:X", "cannot import 'nosuchpkg.mod'"),
        ("missing.pt", "no such file"),
        ("resnet18", "is not understood"),
        ("hookscope.zoo:__doc__", "not an nn.Module"),
    ],
)
def test_bad_model_specs_say_what_to_do(spec, message):
    with pytest.raises(HookscopeError, match=message):
        load_model(spec)


def test_bad_shapes_and_missing_shapes():
    with pytest.raises(HookscopeError, match="write it like 1x3x224x224"):
        parse_shape("1x3xa")
    with pytest.raises(HookscopeError, match="--input"):
        example_input("hookscope.zoo:TinyResNet", None)
