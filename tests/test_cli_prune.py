"""``hookscope prune MODEL``: weight masks and channel pruning from the command line, the weights it
writes (loadable into the original architecture, or through ``fit_to`` when compacted), ``--data``
read without unpickling, and every bad input as one line with exit status 2 and no file written."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.nn.utils import prune as torch_prune

import hookscope
from hookscope import HookscopeError
from hookscope.analysis.prune import fit_to, marked_compacted
from hookscope.cli import main
from hookscope.cli.inputs._images import load_images
from hookscope.cli._load import load_model
from hookscope.cli.inputs._shapes import example_input
from hookscope.zoo import DEMO_CLASSES, TinyResNet, demo_model

FAST = ["--repeats", "1"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(["prune", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, _ = run(capsys, *argv, *FAST, "--json")
    assert code == 0
    return json.loads(out)


def row(doc: dict, name: str) -> dict:
    return next(r for r in doc["comparison"]["rows"] if r["name"] == name)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def masked_tiny_by_torch(amount: float) -> TinyResNet:
    """The reference: torch.nn.utils.prune's L1 masks on every conv and linear, made permanent."""
    ref = TinyResNet(seed=0).eval()
    for m in ref.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            torch_prune.l1_unstructured(m, "weight", amount=amount)
            torch_prune.remove(m, "weight")
    return ref


# --- weight masks -------------------------------------------------------------------------------
def test_weight_masks_write_a_plain_state_dict_equal_to_torchs_pruning(tmp_path, capsys):
    out = tmp_path / "masked.pt"
    doc = run_json(capsys, "tiny", "--amount", "0.3", "--out", str(out))
    ref = masked_tiny_by_torch(0.3)
    loaded = TinyResNet(seed=0).eval()
    loaded.load_state_dict(torch.load(out, weights_only=True), strict=True)  # the original architecture
    got = loaded.state_dict()
    for name, a in ref.state_dict().items():
        assert torch.equal(a, got[name]), name
    x = example_input("tiny", None)
    assert torch.equal(loaded(x), ref(x))
    zeros = sum(int((m.weight == 0).sum()) for m in ref.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert doc["pruned"]["zeros"] == zeros and doc["mode"] == "weights" and doc["out"] == str(out)
    total = n_params(TinyResNet())
    assert row(doc, "parameters")["before"] == row(doc, "parameters")["after"] == total
    assert row(doc, "nonzero parameters")["after"] == total - zeros
    assert set(doc) == {"model", "mode", "compact", "pruned", "comparison", "out"}


def test_the_table_shows_what_was_pruned_then_before_and_after(capsys):
    code, out, _ = run(capsys, "tiny", "--layers", "fc", "--count", "40", *FAST)
    assert code == 0
    lines = out.splitlines()
    assert lines[2].split() == ["fc", "Linear", "weight", "320", "40", "12.5%", "yes"]
    params = next(line for line in lines if line.startswith("parameters"))
    assert params.split()[1:3] == [f"{n_params(TinyResNet()):,}"] * 2
    assert any(line.startswith("file size") for line in lines) and any("CPU latency" in line for line in lines)


def test_random_masks_follow_the_seed_and_structured_masks_whole_rows(capsys):
    a = run_json(capsys, "tiny", "--method", "random_unstructured", "--amount", "0.5", "--seed", "3")
    b = run_json(capsys, "tiny", "--method", "random_unstructured", "--amount", "0.5", "--seed", "3")
    assert a["pruned"] == b["pruned"] and a["pruned"]["sparsity"] == pytest.approx(0.5, abs=1e-3)
    doc = run_json(capsys, "tiny", "--layers", "stem.0", "--method", "ln_structured", "--norm", "2",
                   "--amount", "0.25")
    assert doc["pruned"]["layers"][0]["zeros"] == 4 * 27  # 4 of 16 output channels of 3x3x3


# --- channels, compacted ------------------------------------------------------------------------
def reference_channels(model: nn.Module, x: torch.Tensor, **kw: object) -> tuple[nn.Module, nn.Module]:
    """(masked model, compacted model) by the Python API, independently of the CLI."""
    res = hookscope.prune_channels(model, x, **kw)
    assert res.removed > 0
    return model, hookscope.compact(model, x)


def test_compacted_weights_load_through_fit_to_and_give_the_masked_outputs(tmp_path, capsys):
    out = tmp_path / "small.pt"
    doc = run_json(capsys, "tiny", "--channels", "--amount", "0.5", "--compact", "--out", str(out))
    state = torch.load(out, weights_only=True)
    model = TinyResNet(seed=0).eval()
    with pytest.raises(RuntimeError):  # the compacted file does NOT fit the original architecture as built
        model.load_state_dict(state)
    resized = fit_to(model, state)
    model.load_state_dict(state, strict=True)
    x = example_input("tiny", None)
    masked, small = reference_channels(TinyResNet(seed=0).eval(), x, amount=0.5)
    assert (model(x) - masked(x)).abs().max() < 1e-5 and torch.equal(model(x), small(x))
    assert "stem.0" in resized and model.stem[0].out_channels == 8 and model.fc.in_features == 16
    assert row(doc, "parameters")["after"] == n_params(model) == n_params(small)
    assert row(doc, "parameters")["before"] == n_params(TinyResNet())
    assert doc["pruned"]["removed"] == 56 and doc["compact"] is True


def test_every_command_loads_a_compacted_file_and_says_so_once(tmp_path, capsys):
    out = tmp_path / "small.pt"
    assert run(capsys, "tiny", "--channels", "--amount", "0.5", "--compact", "--out", str(out), *FAST)[0] == 0
    small_params = n_params(fit_and_load(TinyResNet(), out))
    assert main(["summary", "tiny", "--weights", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["totals"]["params"] == small_params
    notes = captured.err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith(f"hookscope: note: --weights {out} is a compacted tiny")
    assert "resized 16 layers" in notes[0]
    model = load_model("tiny", weights=str(out))
    assert n_params(model) == small_params


def fit_and_load(model: nn.Module, path: Path) -> nn.Module:
    state = torch.load(path, weights_only=True)
    fit_to(model, state)
    model.load_state_dict(state, strict=True)
    return model


def test_masked_channels_without_compact_keep_the_architecture(tmp_path, capsys):
    out = tmp_path / "masked.pt"
    doc = run_json(capsys, "tiny", "--channels", "--amount", "0.5", "--out", str(out))
    model = TinyResNet(seed=0).eval()
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)
    x = example_input("tiny", None)
    masked, _ = reference_channels(TinyResNet(seed=0).eval(), x, amount=0.5)
    assert torch.equal(model(x), masked(x))
    assert row(doc, "parameters")["after"] == n_params(TinyResNet())
    assert int((model.stem[0].weight.flatten(1).abs().sum(1) == 0).sum()) == 8  # 8 of 16 stem channels zero


@pytest.mark.slow
def test_resnet18_compacts_and_loads_back(tmp_path, capsys):
    torchvision = pytest.importorskip("torchvision")
    out = tmp_path / "r18.pt"
    doc = run_json(capsys, "torchvision:resnet18", "--input", "1x3x64x64", "--channels", "--amount", "0.5",
                   "--compact", "--out", str(out))
    model = fit_and_load(torchvision.models.resnet18(weights=None).eval(), out)
    x = example_input("torchvision:resnet18", "1x3x64x64")
    torch.manual_seed(0)
    masked, _ = reference_channels(torchvision.models.resnet18(weights=None).eval(), x, amount=0.5)
    assert (model(x) - masked(x)).abs().max() < 1e-4
    assert row(doc, "parameters")["after"] == n_params(model) < row(doc, "parameters")["before"] / 3
    assert model.layer1[0].conv1.out_channels == 32 and model.fc.in_features == 256


# --- calibration data ---------------------------------------------------------------------------
def test_activation_importance_on_an_npy_file_matches_the_api(tmp_path, capsys):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(6, 3, 32, 32, generator=gen)
    np.save(tmp_path / "calib.npy", x.double().numpy())  # float64 on disk: read as the model's float32
    doc = run_json(capsys, "tiny", "--channels", "--importance", "activation", "--data",
                   str(tmp_path / "calib.npy"), "--batch", "4", "--amount", "0.5")
    ref = hookscope.prune_channels(TinyResNet(seed=0).eval(), x[:1], amount=0.5, importance="activation",
                                   data=[x[:4], x[4:]])
    assert doc["pruned"]["drop"] == {str(k): v for k, v in ref.drop.items()} and doc["pruned"]["kind"] == "activation"


def test_taylor_on_class_folders_uses_the_models_class_names(tmp_path, capsys):
    colours = {"circle": (255, 0, 0), "square": (0, 255, 0)}
    for cls, rgb in colours.items():
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (64, 64), tuple(c // (i + 1) for c in rgb)).save(tmp_path / cls / f"{i}.png")
    doc = run_json(capsys, "demo", "--channels", "--importance", "taylor", "--data", str(tmp_path),
                   "--amount", "0.3")
    files = [str(tmp_path / c / f"{i}.png") for c in colours for i in range(2)]
    images = load_images(__import__("argparse").Namespace(image=files, size=None, preset="auto", model="demo",
                                                          weights=None))
    labels = torch.tensor([DEMO_CLASSES.index(c) for c in colours for _ in range(2)])
    ref = hookscope.prune_channels(demo_model().eval(), images.x[:1], amount=0.3, importance="taylor",
                                   data=[(images.x, labels)])
    assert doc["pruned"]["drop"] == {str(k): v for k, v in ref.drop.items()}


def test_a_pt_dict_with_labels_feeds_taylor(tmp_path, capsys):
    gen = torch.Generator().manual_seed(2)
    torch.save({"inputs": torch.rand(4, 3, 32, 32, generator=gen), "labels": torch.tensor([0, 3, 9, 1])},
               tmp_path / "calib.pt")
    doc = run_json(capsys, "tiny", "--channels", "--importance", "taylor", "--data", str(tmp_path / "calib.pt"),
                   "--amount", "0.25")
    assert doc["pruned"]["removed"] == sum(len(v) for v in doc["pruned"]["drop"].values()) > 0


# --- bad input: one line, exit status 2, no file left behind ----------------------------------------
SOFT = """import torch
from torch.nn.utils import prune
def build():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    prune.custom_from_mask(net[0], "weight", torch.full((4, 4), 0.5))
    return net
"""
HARD = """import torch
from torch import nn
class Hard(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.act, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)
    def forward(self, x):
        y = self.act(self.conv(x))  # reads the layer's size back: compaction cannot follow that
        return self.head(y * torch.arange(self.conv.out_channels, dtype=y.dtype).view(1, -1, 1, 1))
"""


def _files(tmp: Path) -> dict[str, str]:
    (tmp / "soft.py").write_text(SOFT)
    (tmp / "hard.py").write_text(HARD)
    torch.save(torch.rand(2, 5, 7), tmp / "wrong.pt")
    np.save(tmp / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    torch.save(torch.rand(2, 3, 32, 32), tmp / "nolabels.pt")
    return {"soft": f"{tmp / 'soft.py'}:build", "hard": f"{tmp / 'hard.py'}:Hard", "wrong": str(tmp / "wrong.pt"),
            "objects": str(tmp / "objects.npy"), "nolabels": str(tmp / "nolabels.pt")}


BAD = [
    (["tiny", "--amount", "1.5"], "--amount 1.5 is outside [0, 1]"),
    (["tiny", "--amount", "-0.1"], "--amount -0.1 is outside [0, 1]"),
    (["tiny", "--layers", "fc", "--count", "100000"], "fc.weight: --count 100000 is more than the 320 units"),
    (["tiny", "--channels", "--amount", "1"], "would remove every channel"),
    (["tiny", "--layers", "fc", "--param", "scale", "--amount", "0.5"], "has no parameter 'scale'"),
    (["{soft}", "--input", "1x4", "--amount", "0.5"], "holds values other than 0 and 1"),
    (["tiny", "--scope", "global", "--method", "ln_structured", "--amount", "0.5"], "ranks channels"),
    (["{hard}", "--input", "1x3x8x8", "--channels", "--amount", "0.5", "--compact"],
     "compaction refused: the compacted model's output 0 differs"),
    (["tiny", "--channels", "--importance", "activation", "--data", "{wrong}", "--amount", "0.5"],
     "--data {wrong} does not fit TinyResNet"),
    (["tiny", "--channels", "--importance", "apoz", "--amount", "0.5"], "--importance apoz is measured on data"),
    (["tiny", "--channels", "--importance", "taylor", "--data", "{nolabels}", "--amount", "0.5"],
     "--importance taylor needs labels"),
    (["tiny", "--channels", "--data", "{nolabels}", "--amount", "0.5"], "--data is read only by"),
    (["tiny", "--importance", "l1", "--amount", "0.5"], "--importance ranks channels; add --channels"),
    (["tiny", "--compact", "--amount", "0.5"], "--compact is for removing whole channels"),
    (["tiny", "--channels", "--importance", "taylr", "--amount", "0.5"], "Did you mean 'taylor'?"),
    (["tiny", "--method", "l1", "--amount", "0.5"], "--method 'l1' is not known"),
    (["tiny", "--channels", "--importance", "activation", "--data", "{objects}", "--amount", "0.5"],
     "holds Python objects (a pickle)"),
    (["tiny", "--amount", "0.5", "--count", "3"], "one of them"),
    (["tiny", "--channels", "--scope", "layer", "--amount", "0.5"], "--scope layer is for weight masks"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a[1:4]) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, capsys, argv, message):
    files = _files(tmp_path)
    out = tmp_path / "out.pt"
    code, stdout, err = run(capsys, *[a.format(**files) for a in argv], "--out", str(out), *FAST)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hookscope prune: error: ") and message.format(**files) in err[0], err[0]
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".out.pt")]
    assert stdout == ""


def test_out_is_checked_before_the_model_runs(tmp_path, capsys):
    there = tmp_path / "there.pt"
    there.write_bytes(b"keep")
    code, _, err = run(capsys, "tiny", "--amount", "0.5", "--out", str(there), *FAST)
    assert code == 2 and len(err) == 1 and "exists; pass --overwrite" in err[0] and there.read_bytes() == b"keep"
    assert run(capsys, "tiny", "--amount", "0.5", "--out", str(there), "--overwrite", *FAST)[0] == 0
    assert torch.load(there, weights_only=True).keys() == TinyResNet().state_dict().keys()
    code, _, err = run(capsys, "tiny", "--amount", "0.5", "--out", str(tmp_path / "no" / "x.pt"), *FAST)
    assert code == 2 and "no folder" in err[0]
    code, _, err = run(capsys, str(there), "--amount", "0.5", "--out", str(there), "--overwrite", *FAST)
    assert code == 2 and "is the file of MODEL; give another path, an input is never overwritten" in err[0]


# --- fit_to --------------------------------------------------------------------------------------
def test_fit_to_resizes_depthwise_linear_layernorm_and_embedding():
    big = nn.ModuleDict({"dw": nn.Conv2d(8, 8, 3, groups=8), "fc": nn.Linear(8, 6), "ln": nn.LayerNorm(6),
                         "emb": nn.Embedding(10, 6)})
    small = nn.ModuleDict({"dw": nn.Conv2d(5, 5, 3, groups=5), "fc": nn.Linear(5, 4), "ln": nn.LayerNorm(4),
                           "emb": nn.Embedding(10, 4)})
    assert fit_to(big, small.state_dict()) == ["dw", "fc", "ln", "emb"]
    big.load_state_dict(small.state_dict())
    dw = big["dw"]
    assert (dw.in_channels, dw.out_channels, dw.groups) == (5, 5, 5)
    assert (big["fc"].in_features, big["fc"].out_features) == (5, 4)
    assert big["ln"].normalized_shape == (4,) and big["emb"].embedding_dim == 4
    x = torch.randn(1, 5, 6, 6)
    assert torch.equal(dw(x), small["dw"](x))


@pytest.mark.parametrize("small, message", [
    (nn.Sequential(nn.Linear(4, 9)), "is not a smaller copy"),
    (nn.Sequential(nn.GRU(4, 2)), "whose sizes hookscope cannot fix"),
])
def test_fit_to_refuses_growth_and_unknown_layers_leaving_the_model_untouched(small, message):
    big = nn.Sequential(nn.Linear(4, 8)) if isinstance(small[0], nn.Linear) else nn.Sequential(nn.GRU(4, 3))
    before = {k: v.clone() for k, v in big.state_dict().items()}
    with pytest.raises(HookscopeError, match=message):
        fit_to(big, small.state_dict())
    assert all(torch.equal(before[k], v) for k, v in big.state_dict().items())


def test_only_a_file_marked_compacted_is_resized(tmp_path, capsys):
    torch.save(TinyResNet(num_classes=5).state_dict(), tmp_path / "five.pt")  # another model, fewer classes
    torch.save(marked_compacted(TinyResNet(num_classes=5).state_dict()), tmp_path / "marked.pt")
    assert main(["summary", "tiny", "--weights", str(tmp_path / "five.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fc.weight (file 5x32, model 10x32)" in err[0]
    assert main(["summary", "tiny", "--weights", str(tmp_path / "marked.pt"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["totals"]["params"] == n_params(TinyResNet(num_classes=5))
    assert captured.err.strip().splitlines() == [
        f"hookscope: note: --weights {tmp_path / 'marked.pt'} is a compacted tiny (TinyResNet): resized 1 layer "
        "to its shapes (fc)"]


def test_weights_that_grow_keep_the_does_not_fit_error(tmp_path, capsys):
    torch.save(nn.Linear(4, 3).state_dict(), tmp_path / "w.pt")
    (tmp_path / "m.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    assert main(["summary", f"{tmp_path / 'm.py'}:build", "--input", "1x4", "--weights", str(tmp_path / "w.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit" in err[0] and "(Linear): 2 shape mismatches" in err[0]


# --- a remedy an error names exists on the command line -------------------------------------------------
AUX = ("import torch\n"
       "class Net(torch.nn.Module):\n"
       "    def __init__(self):\n"
       "        super().__init__()\n"
       "        self.a = torch.nn.Conv2d(3, 8, 3); self.b = torch.nn.Conv2d(8, 4, 3)\n"
       "        self.aux = torch.nn.Conv2d(8, 2, 1); self.probe = False  # runs only when a user asks for it\n"
       "    def forward(self, x):\n"
       "        h = torch.relu(self.a(x)); y = self.b(h).mean((2, 3))\n"
       "        return (y, self.aux(h).mean((2, 3))) if self.probe else y\n")


def test_allow_unseen_named_by_the_compaction_error_exists_on_the_command_line(tmp_path, capsys):
    (tmp_path / "aux.py").write_text(AUX)
    spec = f"{tmp_path}/aux.py:Net"
    argv = (spec, "--input", "1x3x12x12", "--channels", "--amount", "0.5", "--compact", *FAST)
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err) == 1 and "'aux' did not run on the example input" in err[0]
    flags = re.findall(r"--[a-z][a-z-]+", err[0])
    assert flags, err[0]  # the remedy is named as the command line spells it ...
    help_text = subprocess_free_help("prune")
    assert all(f in help_text for f in flags), flags  # ... and every flag it names exists
    out = tmp_path / "small.pt"
    code, _, _ = run(capsys, *argv, "--allow-unseen", "--out", str(out))
    assert code == 0
    state = torch.load(out, weights_only=True)
    assert state["a.weight"].shape == (4, 3, 3, 3) and state["b.weight"].shape == (4, 4, 3, 3)
    assert state["aux.weight"].shape == (2, 8, 1, 1)  # left as it is, as the flag says


def test_allow_unseen_without_compact_or_channels_is_refused(capsys):
    code, _, err = run(capsys, "tiny", "--channels", "--amount", "0.5", "--allow-unseen", *FAST)
    assert code == 2 and err == ["hookscope prune: error: --allow-unseen is for --compact; add --compact or drop "
                                 "--allow-unseen"]
    code, _, err = run(capsys, "tiny", "--amount", "0.5", "--allow-unseen", *FAST)
    assert code == 2 and err == ["hookscope prune: error: --allow-unseen is for removing whole channels, which "
                                 "weight masks leave in place; add --channels"]


def subprocess_free_help(command: str) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main([command, "--help"])
    return buf.getvalue()
