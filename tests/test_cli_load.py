import os

import pytest
import torch
from torch import nn

from hookscope import HookscopeError
from hookscope.cli._load import load_model, trusting_pickles
from hookscope.cli.inputs._shapes import example_input, parse_shape
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
    assert isinstance(load_model(str(saved), trust_pickle=True), nn.Sequential)
    with trusting_pickles(True):  # what --trust-pickle sets for every command
        assert isinstance(load_model(str(saved)), nn.Sequential)
    with pytest.raises(HookscopeError, match="is a pickled model .*--trust-pickle"):
        load_model(str(saved))


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


def test_a_class_that_needs_arguments_says_how_to_write_a_factory(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\n"
        "class NeedsArg(torch.nn.Module):\n"
        "    def __init__(self, hidden, depth=2, *layers, **options):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(5, hidden)\n"
    )
    with pytest.raises(HookscopeError) as err:
        load_model(f"{src}:NeedsArg")
    assert str(err.value) == (
        f"'{src}:NeedsArg' needs arguments (hidden) but MODEL is built with none; write a factory that "
        f"takes none, e.g. def build(): return NeedsArg(hidden=...), and pass {src}:build")


def test_an_error_inside_a_constructor_is_one_line_naming_where_it_was_raised(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import torch\nclass Broken(torch.nn.Module):\n    def __init__(self):\n"
                   "        raise TypeError('a bug in the model')\n")
    with pytest.raises(HookscopeError) as err:
        load_model(f"{src}:Broken")
    assert str(err.value) == (f"building '{src}:Broken' raised TypeError: a bug in the model ({src}, line 4, "
                              "in __init__); fix that code (hookscope only called it)")
    assert isinstance(err.value.__cause__, TypeError)  # the original stays reachable from the API


def test_a_file_with_a_syntax_error_is_one_line_with_its_place(tmp_path):
    src = tmp_path / "bad.py"
    src.write_text("import torch\ndef build(:\n    pass\n")
    with pytest.raises(HookscopeError, match=r"bad.py, line 2: SyntaxError: "):
        load_model(f"{src}:build")
    missing = tmp_path / "needs.py"
    missing.write_text("import nosuchpackage_hookscope\n")
    with pytest.raises(HookscopeError, match="needs.py cannot be run: No module named 'nosuchpackage_hookscope'"):
        load_model(f"{missing}:build")


def test_corrupt_and_state_dict_files_say_what_a_model_file_must_be(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(HookscopeError, match=r"bad.pt is not a model file of a known format \(it holds text\); "
                                             r"MODEL.pt must be a whole model saved with torch.save\(model\)") as err:
        load_model(str(bad))
    assert "\n" not in str(err.value) and "it is corrupt" not in str(err.value)
    with pytest.raises(HookscopeError, match=r"bad.pt .*; MODEL.pt must be "
                                             r"a whole model saved with torch.save\(model\)") as err:
        load_model(str(bad), trust_pickle=True)
    assert "\n" not in str(err.value)
    weights = tmp_path / "weights.pt"
    torch.save(nn.Linear(2, 2).state_dict(), weights)
    with pytest.raises(HookscopeError, match="gave a OrderedDict, not an nn.Module; it looks like a state_dict"):
        load_model(str(weights))


def test_the_demo_spec_is_the_trained_demo_model_with_its_input():
    from hookscope.synthetic import shapes
    from hookscope.zoo import DemoNet, demo_model

    model = load_model("demo")
    assert isinstance(model, DemoNet) and not model.training
    data = shapes(4, seed=99)
    assert torch.equal(model(data.images), demo_model()(data.images))  # the shipped weights, not seed-0 ones
    assert example_input("demo", None).shape == (1, 3, 64, 64)
    with pytest.raises(HookscopeError, match="Did you mean .demo.. Use tiny, demo, torchvision:NAME"):
        load_model("dmeo")


def test_a_whole_pickled_model_with_weights_gets_those_weights(tmp_path):
    saved = tmp_path / "m.pt"
    torch.save(nn.Sequential(nn.Linear(2, 2)), saved)
    other = nn.Sequential(nn.Linear(2, 2))
    torch.save(other.state_dict(), tmp_path / "w.pt")
    model = load_model(str(saved), trust_pickle=True, weights=str(tmp_path / "w.pt"))
    assert torch.equal(model[0].weight, other[0].weight)


def test_a_config_folder_with_its_own_code_is_refused_without_a_prompt_and_runs_nothing(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("transformers")
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "configuration_evil.py").write_text("import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n")
    (folder / "config.json").write_text('{"model_type": "hookscope-evil", "auto_map": {"AutoConfig": '
                                        '"configuration_evil.EvilConfig"}}')
    (folder / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["tokenization_evil.T", null]}}')
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for argv in (["summary", "hf:causal-lm", "--config", str(folder)],
                 ["trace", "hf:causal-lm", "--config", str(folder / "config.json")]):
        done = subprocess.run([sys.executable, "-m", "hookscope", *argv], input="y\ny\ny\n", capture_output=True,
                              text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        err = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(err) == 1, done.stderr
        assert "auto_map" in err[0] and "never runs a model folder's code" in err[0]
        assert done.stdout == ""  # no question asked
    assert not (folder / "ran").exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
