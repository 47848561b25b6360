"""hookscope.load_model from Python: every spec form, weights fitted onto a built model, the pickle
refusal (no code from the file runs), and one-line errors in Python's words naming what was tried.

No network and no downloaded weights: random weights, configs, files made here and the bundled demo model.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope
from hookscope import LoadError, UntrustedPickleError, class_names, load_model, load_weights
from hookscope.analysis.prune import marked_compacted
from hookscope.loading import parse_spec
from hookscope.zoo import DEMO_CLASSES, DemoNet, TinyResNet


class Marker:
    """Unpickling it creates a folder: proof that code from the file ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.path,))


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text and text
    return text


# --- every spec form --------------------------------------------------------------------------------
def test_the_bundled_models_and_torchvision_build_in_eval_mode():
    tiny = load_model("tiny")
    assert isinstance(tiny, TinyResNet) and not tiny.training
    demo = load_model("demo")
    assert isinstance(demo, DemoNet) and not demo.training
    a, b = load_model("torchvision:resnet18", seed=3), load_model("torchvision:resnet18", seed=3)
    assert type(a).__name__ == "ResNet" and not a.training
    assert torch.equal(a.fc.weight, b.fc.weight)  # seeded: the same random weights each time
    assert not torch.equal(a.fc.weight, load_model("torchvision:resnet18", seed=4).fc.weight)


def test_code_specs_run_the_callers_factory_or_class(tmp_path: Path):
    src = tmp_path / "mine.py"
    src.write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 2)\n")
    assert isinstance(load_model(f"{src}:build"), nn.Linear)
    assert isinstance(load_model("hookscope.zoo:TinyResNet"), TinyResNet)
    assert parse_spec(f"{src}:build").kind == "file" and parse_spec("hookscope.zoo:TinyResNet").kind == "module"


def test_a_whole_pickled_model_loads_only_when_trusted(tmp_path: Path):
    saved = tmp_path / "m.pt"
    torch.save(nn.Sequential(nn.Linear(2, 2)), saved)
    assert isinstance(load_model(saved, trust_pickle=True), nn.Sequential)  # a Path is a spec too
    with pytest.raises(UntrustedPickleError) as err:
        load_model(str(saved))
    line = one_line(err)
    assert line.startswith(f"{saved} is a pickled model (it names torch.nn.modules.container.Sequential), not "
                           "plain weights; unpickling runs whatever code the file holds, so hookscope loads a "
                           "pickled model only with trust_pickle=True, for a file you trust; safer: ")
    assert "--trust-pickle" not in line


def test_a_refused_pickle_runs_no_code(tmp_path: Path):
    marker = tmp_path / "code_ran"
    torch.save({"model": Marker(str(marker))}, tmp_path / "m.pt")
    with pytest.raises(UntrustedPickleError):
        load_model(str(tmp_path / "m.pt"))
    torch.save({"state_dict": TinyResNet(seed=7).state_dict(), "extra": Marker(str(marker))}, tmp_path / "w.pt")
    with pytest.raises(UntrustedPickleError) as err:
        load_model("tiny", weights=tmp_path / "w.pt")
    named = f"{os.mkdir.__module__}.mkdir"  # what the file's pickle would have called
    assert one_line(err).startswith(f"weights {tmp_path}/w.pt holds pickled objects (it names {named}), not only "
                                    "tensors; unpickling runs whatever code the file holds, so hookscope reads it "
                                    "only with trust_pickle=True")
    assert not marker.exists()


def test_an_hf_model_builds_from_a_config_and_reads_its_folders_weights(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=40, n_positions=16)
    config.save_pretrained(tmp_path / "config")
    random = load_model("hf:causal-lm", config=tmp_path / "config")
    assert type(random).__name__ == "GPT2LMHeadModel" and not random.training
    saved = transformers.GPT2LMHeadModel(config).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved.save_pretrained(tmp_path / "trained")
    ids = torch.tensor([[1, 5, 7]])
    loaded = load_model("hf:GPT2LMHeadModel", config=str(tmp_path / "trained"))
    assert torch.equal(loaded(ids).logits, saved(ids).logits)


def test_a_timm_model_builds_without_weights():
    pytest.importorskip("timm")
    model = load_model("timm:resnet18")
    assert type(model).__name__ == "ResNet" and not model.training


# --- weights fitted onto a built model ----------------------------------------------------------------
def test_a_state_dict_gives_that_models_exact_outputs(tmp_path: Path):
    trained = TinyResNet(seed=7).eval()
    x = torch.randn(2, 3, 32, 32)
    checkpoint = {"epoch": 3, "state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}
    torch.save(checkpoint, tmp_path / "ckpt.pth")  # a training checkpoint, saved from DataParallel
    assert torch.equal(load_model("tiny", weights=tmp_path / "ckpt.pth")(x), trained(x))
    built = load_weights(TinyResNet(seed=0).eval(), tmp_path / "ckpt.pth")
    assert torch.equal(built(x), trained(x))


def test_weights_that_do_not_fit_are_one_line_in_pythons_words(tmp_path: Path):
    torch.save(TinyResNet(num_classes=5).state_dict(), tmp_path / "five.pt")
    with pytest.raises(LoadError) as err:
        load_model("tiny", weights=str(tmp_path / "five.pt"))
    assert one_line(err) == (f"weights {tmp_path}/five.pt does not fit tiny (TinyResNet): 2 shape mismatches: "
                             "fc.weight (file 5x32, model 10x32), fc.bias (file 5, model 10); give the state_dict() "
                             "of this very architecture")
    with pytest.raises(LoadError, match=f"^weights {tmp_path} is a folder; give a weights file"):
        load_model("tiny", weights=tmp_path)


def test_a_compacted_file_resizes_the_model_and_says_so(tmp_path: Path):
    x = torch.randn(1, 3, 32, 32)
    model = TinyResNet(seed=0).eval()
    hookscope.prune_channels(model, x, amount=0.5)
    small = hookscope.compact(model, x)
    torch.save(marked_compacted(small.state_dict()), tmp_path / "small.pt")
    with pytest.warns(UserWarning, match=rf"^weights {tmp_path}/small.pt is a compacted tiny \(TinyResNet\): "
                                         "resized 16 layers"):
        loaded = load_model("tiny", weights=tmp_path / "small.pt")
    assert torch.equal(loaded(x), small(x))
    torch.save(small.state_dict(), tmp_path / "unmarked.pt")  # not marked: a misfit, never resized silently
    with pytest.raises(LoadError, match="does not fit tiny"):
        load_model("tiny", weights=tmp_path / "unmarked.pt")


# --- bad specs: one line naming what was tried ------------------------------------------------------------
@pytest.mark.parametrize(("spec", "message"), [
    ("dmeo", "spec 'dmeo' is not understood. Did you mean 'demo'? Use tiny, demo, torchvision:NAME, "
             "hf:CLASS_OR_TASK, timm:NAME, package.module:ATTR, file.py:ATTR or a saved model.pt"),
    ("xyz", "spec 'xyz' is not understood. Use tiny, demo, torchvision:NAME"),
    ("torchvision:resnet19", "torchvision has no model 'resnet19'. Did you mean 'resnet18'"),
    ("hookscope.zoo:TinyResnet", "hookscope.zoo has no attribute 'TinyResnet'. Did you mean 'TinyResNet'?"),
    ("nosuchpkg_hookscope.mod:X", "cannot import 'nosuchpkg_hookscope.mod': No module named 'nosuchpkg_hookscope'"),
    ("missing.pt", "no such file: missing.pt"),
    ("hf:causal-lm", "spec hf:... needs config=PATH: a folder save_pretrained wrote"),
])
def test_a_bad_spec_is_one_line_naming_what_was_tried(spec: str, message: str):
    with pytest.raises(LoadError) as err:
        load_model(spec)
    assert one_line(err).startswith(message)


def test_a_state_dict_given_as_the_model_says_how_to_pass_it(tmp_path: Path):
    torch.save(TinyResNet().state_dict(), tmp_path / "w.pt")
    with pytest.raises(LoadError) as err:
        load_model(tmp_path / "w.pt")
    assert (f"pass the architecture as spec and this file as weights: load_model('tiny', weights='{tmp_path}/w.pt')"
            in one_line(err))


def test_config_is_for_hf_models_and_seeds_are_checked():
    with pytest.raises(LoadError, match="^config is for hf:CLASS_OR_TASK models, not tiny; drop it, or write spec"):
        load_model("tiny", config="config.json")
    with pytest.raises(LoadError, match="^seed -1267650600228229401496703205376 is out of range"):
        load_model("tiny", seed=-(2**100))


# --- class names ---------------------------------------------------------------------------------------
def test_class_names_from_a_file_the_demo_model_and_torchvision_weights(tmp_path: Path):
    pytest.importorskip("torchvision")
    assert class_names("demo") == list(DEMO_CLASSES)
    assert class_names("tiny") is None
    (tmp_path / "names.txt").write_text("cat\n\ndog\n")
    assert class_names("tiny", classes=tmp_path / "names.txt") == ["cat", "dog"]
    assert class_names("torchvision:resnet18", weights="IMAGENET1K_V1")[:2] == ["tench", "goldfish"]
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(LoadError, match=f"^classes {tmp_path}/empty.txt holds no class names"):
        class_names("tiny", classes=tmp_path / "empty.txt")


# --- tied weights, a file that is not weights, where the weights came from, no repository code --------
class Tied(nn.Module):
    """An embedding and an output layer that are one tensor, as a language model ties them."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(6, 4)
        self.lm_head = nn.Linear(4, 6, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.wte(ids))


def test_a_file_with_different_tensors_for_tied_weights_is_refused_naming_both(tmp_path: Path):
    state = {k: v.clone() for k, v in Tied().state_dict().items()}
    state["lm_head.weight"] = torch.randn(6, 4)
    torch.save(state, tmp_path / "untied.pt")
    model = Tied()
    before = model.wte.weight.detach().clone()
    with pytest.raises(LoadError) as err:
        load_weights(model, tmp_path / "untied.pt")
    said = one_line(err)
    assert "lm_head.weight" in said and "wte.weight" in said and "tied" in said
    assert torch.equal(model.wte.weight, before) and model.lm_head.weight is model.wte.weight


def test_a_file_with_equal_tensors_for_tied_weights_loads(tmp_path: Path):
    saved = Tied()
    torch.save(saved.state_dict(), tmp_path / "tied.pt")  # both names, one tensor
    state = {k: v.clone() for k, v in saved.state_dict().items()}  # both names, equal copies
    torch.save(state, tmp_path / "copies.pt")
    for name in ("tied.pt", "copies.pt"):
        model = load_weights(Tied(), tmp_path / name)
        assert torch.equal(model.wte.weight, saved.wte.weight) and model.lm_head.weight is model.wte.weight


def test_a_gpt2_file_with_an_untied_head_is_refused(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=40, n_positions=16)
    state = {k: v.clone() for k, v in transformers.GPT2LMHeadModel(config).state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    torch.save(state, tmp_path / "w.pt")
    config.save_pretrained(tmp_path / "cfg")
    with pytest.raises(LoadError) as err:
        load_model("hf:causal-lm", config=tmp_path / "cfg", weights=tmp_path / "w.pt")
    said = one_line(err)
    assert "lm_head.weight" in said and "transformer.wte.weight" in said


def test_a_text_file_as_weights_is_said_to_be_no_weights_format(tmp_path: Path):
    (tmp_path / "notes.pt").write_text("these are my notes, not weights\n")
    (tmp_path / "junk.pt").write_bytes(bytes(range(1, 200)))
    for name in ("notes.pt", "junk.pt"):
        with pytest.raises(LoadError) as err:
            load_weights(nn.Linear(2, 2), tmp_path / name)
        said = one_line(err)
        assert not isinstance(err.value, UntrustedPickleError), said
        assert "trust_pickle" not in said and "corrupt" not in said and "pickled" not in said
        assert "not a weights file of a known format" in said and "safetensors" in said


def test_load_model_records_where_the_weights_came_from(tmp_path: Path):
    from hookscope.loading import weights_origin

    tiny = load_model("tiny")
    assert weights_origin(tiny).random and "random" in weights_origin(tiny).source
    assert not weights_origin(load_model("demo")).random
    torch.save(TinyResNet().state_dict(), tmp_path / "w.pt")
    given = load_model("tiny", weights=tmp_path / "w.pt")
    assert not weights_origin(given).random and str(tmp_path / "w.pt") in weights_origin(given).source
    assert weights_origin(nn.Linear(2, 2)) is None  # not built by load_model: nothing is claimed
    tiny.load_state_dict(TinyResNet(seed=3).state_dict())  # other weights since: nothing is claimed
    assert weights_origin(tiny) is None
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=40, n_positions=16)
    config.save_pretrained(tmp_path / "cfg")
    assert weights_origin(load_model("hf:causal-lm", config=tmp_path / "cfg")).random
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "trained")
    assert not weights_origin(load_model("hf:causal-lm", config=tmp_path / "trained")).random


REMOTE = ("import pathlib\n"
          "pathlib.Path(__file__).with_name('ran').touch()\n"
          "from transformers import PretrainedConfig\n"
          "class EvilConfig(PretrainedConfig):\n"
          "    model_type = 'hookscope-evil'\n")


def remote_code_folder(root: Path) -> Path:
    folder = root / "evil"
    folder.mkdir()
    (folder / "configuration_evil.py").write_text(REMOTE)
    (folder / "config.json").write_text(
        '{"model_type": "hookscope-evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", '
        '"AutoModelForCausalLM": "configuration_evil.EvilModel"}}')
    return folder


def test_a_folder_with_its_own_code_is_refused_and_its_code_never_runs(tmp_path: Path):
    pytest.importorskip("transformers")
    folder = remote_code_folder(tmp_path)
    for config in (folder, folder / "config.json"):
        with pytest.raises(LoadError) as err:
            load_model("hf:causal-lm", config=config)
        said = one_line(err)
        assert "auto_map" in said and "code" in said
    assert not (folder / "ran").exists()


def test_every_transformers_loading_call_keeps_remote_code_off():
    import ast

    import hookscope.cli.inputs._tokenizer
    import hookscope.loading

    files = [*Path(hookscope.loading.__file__).parent.glob("*.py"), Path(hookscope.cli.inputs._tokenizer.__file__)]
    calls = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "from_pretrained", "from_config"):
                given = {k.arg: k.value for k in node.keywords}
                off = isinstance(given.get("trust_remote_code"), ast.Constant) and \
                    given["trust_remote_code"].value is False
                calls.append((file.name, node.lineno, off))
    assert calls and all(off for _, _, off in calls), calls


def test_a_safetensors_file_as_the_model_says_to_pass_it_as_weights(tmp_path: Path):
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file(TinyResNet().state_dict(), str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError) as err:
        load_model(str(tmp_path / "model.safetensors"))
    said = one_line(err)
    assert "is a safetensors file" in said and f"weights={tmp_path / 'model.safetensors'}" in said
    safetensors.save_file(TinyResNet(seed=1).state_dict(), str(tmp_path / "w.bin"))  # found by its content
    model = load_model("tiny", weights=tmp_path / "w.bin")
    expected = TinyResNet(seed=1).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
