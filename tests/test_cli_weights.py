"""Real weights, class names and image inputs in the CLI (``--weights``, ``--classes``, ``--image``,
``--preset``), the random-weights warning, and ``hookscope cam``'s ``--json`` and multi-method ``--plot``.

No network and no downloaded weights: torchvision's weight names are tested through a file made here
from a randomly initialised model and put where torch.hub looks first (``$TORCH_HOME/hub/checkpoints``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cached_torchvision_weights, no_hooks
from PIL import Image
from torch import nn

from hookscope import HookscopeError
from hookscope.cli import main
from hookscope.cli.inputs._images import load_images, preset_for
from hookscope import load_weights
from hookscope.cli._load import class_names, load_model, model_session
from hookscope.zoo import DEMO_CLASSES, TinyResNet

TV = "squeezenet1_1"  # the smallest torchvision classifier with ImageNet weights (5 MB)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB")).copy()


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> tuple[str, list[str]]:
    captured = capsys.readouterr()
    return captured.out, captured.err.strip().splitlines()


def one_error(capsys: pytest.CaptureFixture[str], command: str = "cam") -> str:
    _, err = stderr_lines(capsys)
    assert len(err) == 1, err
    assert err[0].startswith(f"hookscope {command}: error: "), err[0]
    return err[0]


def save_png(path: Path, array: np.ndarray) -> Path:
    Image.fromarray(array.astype(np.uint8)).save(path)
    return path


# --- --weights FILE ------------------------------------------------------------------------------
def test_a_state_dict_file_gives_that_models_exact_outputs(tmp_path):
    trained = TinyResNet(seed=7).eval()  # stands for weights trained elsewhere: not what tiny builds
    path = tmp_path / "w.pt"
    torch.save(trained.state_dict(), path)
    x = torch.randn(2, 3, 32, 32)
    model = load_model("tiny", weights=str(path))
    assert torch.equal(model(x), trained(x))
    assert not torch.equal(load_model("tiny")(x), trained(x))
    # a training checkpoint, saved from DataParallel: the state_dict found and its prefix dropped
    checkpoint = {"epoch": 3, "state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}
    torch.save(checkpoint, tmp_path / "ckpt.pth")
    assert torch.equal(load_model("tiny", weights=str(tmp_path / "ckpt.pth"))(x), trained(x))


def test_weights_load_into_the_demo_model_and_a_factory(tmp_path, capsys):
    from hookscope.zoo import demo_model

    other = demo_model(pretrained=False)
    torch.save(other.state_dict(), tmp_path / "demo_w.pt")
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(load_model("demo", weights=str(tmp_path / "demo_w.pt"))(x), other(x))
    src = tmp_path / "net.py"
    src.write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 2)\n")
    lin = nn.Linear(3, 2)
    torch.save(lin.state_dict(), tmp_path / "lin.pt")
    loaded = load_model(f"{src}:build", weights=str(tmp_path / "lin.pt"))
    assert torch.equal(loaded.weight, lin.weight) and torch.equal(loaded.bias, lin.bias)


def test_the_cli_runs_the_loaded_weights(tmp_path, capsys):
    trained = TinyResNet(seed=7).eval()
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    assert main(["cam", "tiny", "--weights", str(tmp_path / "w.pt"), "--json"]) == 0
    out, err = stderr_lines(capsys)
    data = json.loads(out)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # --seed 0's input
    logits = trained(x)
    assert data["rows"][0]["target"] == int(logits.argmax())
    assert data["rows"][0]["score"] == pytest.approx(logits.max().item(), rel=1e-6)
    assert data["weights"] == str(tmp_path / "w.pt") and err == []  # trained weights: no warning


def test_mismatched_keys_and_shapes_are_named_in_one_line(tmp_path, capsys):
    state = TinyResNet(num_classes=5).state_dict()
    state["head.weight"] = torch.zeros(2)
    del state["layer2.0.bn2.running_var"]
    torch.save(state, tmp_path / "other.pt")
    assert main(["cam", "tiny", "--weights", str(tmp_path / "other.pt"), "--out", str(tmp_path / "o.png")]) == 2
    line = one_error(capsys)
    assert line == (f"hookscope cam: error: --weights {tmp_path}/other.pt does not fit tiny (TinyResNet): "
                    "1 missing key: layer2.0.bn2.running_var; 1 unexpected key: head.weight; 2 shape mismatches: "
                    "fc.weight (file 5x32, model 10x32), fc.bias (file 5, model 10); give the state_dict() of "
                    "this very architecture")
    assert not (tmp_path / "o.png").exists()


def test_many_missing_keys_are_counted_not_listed(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "w.pt")
    with pytest.raises(HookscopeError) as err:
        load_weights(TinyResNet(), str(tmp_path / "w.pt"))
    n = len(TinyResNet().state_dict())
    assert f"{n} missing keys: stem.0.weight, stem.1.weight, stem.1.bias, ... ({n - 3} more); 1 unexpected key: w" \
        in str(err.value)


class Marker:
    """Unpickling it creates a folder: proof that code from the file ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.path,))


def test_a_pickled_object_in_the_weights_runs_no_code_without_trust_pickle(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    torch.save({"state_dict": TinyResNet(seed=7).state_dict(), "extra": Marker(str(marker))}, tmp_path / "w.pt")
    argv = ["cam", "tiny", "--weights", str(tmp_path / "w.pt"), "--out", str(tmp_path / "o.png")]
    assert main(argv) == 2
    line = one_error(capsys)
    assert f"--weights {tmp_path}/w.pt holds pickled objects (it names " in line
    assert "mkdir), not only tensors; unpickling runs whatever code the file holds" in line
    assert "only with --trust-pickle, for a file you trust" in line
    assert not marker.exists()
    assert main([*argv, "--trust-pickle"]) == 0  # vouched for: unpickled, and the state_dict inside used
    assert marker.is_dir()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b""), "cannot load --weights {p}: the file is empty"),
        (lambda p: p.write_bytes(b"garbage"), "--weights {p} is not a weights file of a known format (it holds "
                                              "text); hookscope reads files torch.save wrote"),
        (lambda p: torch.save([torch.zeros(1)], p), "--weights {p} holds a list, not a state_dict"),
        (lambda p: torch.save({"epoch": 1, "lr": 0.1}, p), "holds a dict of 2 keys: epoch, lr, not a state_dict"),
        (lambda p: p.mkdir(), "--weights {p} is a folder"),
        (lambda p: None, "no such weights file: {p}"),
    ],
    ids=["empty", "corrupt", "list", "no-state-dict", "folder", "missing"],
)
def test_a_weights_file_that_is_not_weights_is_one_line(tmp_path, capsys, make, message):
    path = tmp_path / "w.pt"
    make(path)
    assert main(["cam", "tiny", "--weights", str(path), "--json"]) == 2
    assert message.format(p=path) in one_error(capsys)


def test_a_weight_name_for_a_model_that_is_not_torchvisions(capsys):
    assert main(["cam", "tiny", "--weights", "DEFAULT", "--json"]) == 2
    assert one_error(capsys).endswith(
        "no such weights file: DEFAULT (weight names such as DEFAULT are for torchvision:NAME models)")


def test_safetensors_weights_need_the_dump_extra(tmp_path, monkeypatch, capsys):
    trained = TinyResNet(seed=7).eval()
    path = tmp_path / "w.safetensors"
    try:
        from safetensors.torch import save_file
    except ImportError:
        path.write_bytes(b"{}")
    else:
        save_file(trained.state_dict(), str(path))
        x = torch.randn(1, 3, 32, 32)
        assert torch.equal(load_model("tiny", weights=str(path))(x), trained(x))
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(HookscopeError, match=r"needs safetensors, from the dump extra: pip install 'hookscope\[dump\]'"):
        load_model("tiny", weights=str(path))


# --- torchvision weight names, offline: a file in torch.hub's cache ---------------------------------
@pytest.fixture
def hub(tmp_path, monkeypatch):
    """TORCH_HOME with squeezenet1_1's ImageNet weights cached: random ones, made here (seed 3)."""
    return cached_torchvision_weights(tmp_path, monkeypatch, TV)


@pytest.mark.parametrize("name", ["DEFAULT", "IMAGENET1K_V1", "SqueezeNet1_1_Weights.IMAGENET1K_V1"])
def test_a_torchvision_weight_name_loads_the_cached_file(hub, name):
    fake, _, _ = hub
    model = load_model(f"torchvision:{TV}", weights=name)
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(model(x), fake(x)) and not model.training


def test_a_cached_file_in_the_old_format_loads_too(hub):
    fake, _, cached = hub
    torch.save(fake.state_dict(), cached, _use_new_zipfile_serialization=False)  # cannot be memory-mapped
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(load_model(f"torchvision:{TV}", weights="DEFAULT")(x), fake(x))


def test_torchvision_weights_give_class_names_and_their_preset(hub, tmp_path, capsys):
    fake, weights, _ = hub
    rng = np.random.default_rng(0)
    image = save_png(tmp_path / "photo.png", rng.integers(0, 256, size=(300, 400, 3)))
    assert main(["cam", f"torchvision:{TV}", "--weights", "DEFAULT", "--image", str(image), "--json"]) == 0
    out, err = stderr_lines(capsys)
    data = json.loads(out)
    row = data["rows"][0]
    categories = weights.meta["categories"]
    assert data["class_names"] == categories and row["class_name"] == categories[row["target"]]
    assert row["file"] == str(image) and err == []  # trained weights: no warning
    # the input is the weights' own preset: torchvision's transforms() of the same picture
    picture = torch.from_numpy(read_png(image)).permute(2, 0, 1).float() / 255
    x = weights.transforms()(picture)[None]
    assert data["input"] == [1, 3, 224, 224]
    with torch.no_grad():
        logits = fake(x)
    assert row["target"] == int(logits.argmax()) and row["score"] == pytest.approx(logits.max().item(), rel=1e-4)


def test_a_bad_torchvision_weight_name_lists_the_valid_ones(hub, capsys):
    assert main(["cam", f"torchvision:{TV}", "--weights", "IMAGENET1K_V2", "--json"]) == 2
    assert one_error(capsys).endswith(f"torchvision:{TV} has no weights 'IMAGENET1K_V2'; give one of IMAGENET1K_V1, "
                                      "DEFAULT, or a weights file. Did you mean 'IMAGENET1K_V1'?")
    assert main(["cam", f"torchvision:{TV}", "--weights", "ResNet18_Weights.DEFAULT", "--json"]) == 2
    assert "ResNet18_Weights.DEFAULT are not weights of squeezenet1_1; its weights are SqueezeNet1_1_Weights" \
        in one_error(capsys)


def test_no_network_is_one_line_saying_where_to_put_the_file(hub, monkeypatch, capsys):
    _, _, cached = hub
    cached.unlink()

    def offline(url, dst, hash_prefix=None, progress=True):  # type: ignore[no-untyped-def]
        assert hash_prefix == "b8a52dc0"  # the file name's hash, as torchvision's check_hash uses
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    assert main(["cam", f"torchvision:{TV}", "--weights", "DEFAULT", "--json"]) == 2
    assert one_error(capsys) == (
        "hookscope cam: error: cannot download SqueezeNet1_1_Weights.IMAGENET1K_V1 (URLError: <urlopen error "
        "[Errno -2] Name or service not known>); where the network allows, download "
        f"https://download.pytorch.org/models/{cached.name} to {cached}, or pass --weights FILE (a state_dict)")


def test_a_cached_file_holding_code_is_never_unpickled(hub, capsys):
    _, _, cached = hub
    marker = cached.parent / "code_ran"
    torch.save({"x": Marker(str(marker))}, cached)
    assert main(["cam", f"torchvision:{TV}", "--weights", "DEFAULT", "--json"]) == 2
    line = one_error(capsys)
    assert f"{cached}, the cached file of SqueezeNet1_1_Weights.IMAGENET1K_V1, is not plain weights" in line
    assert "delete it to download it again" in line and not marker.exists()


# --- class names ---------------------------------------------------------------------------------
NAMES = [f"thing{i}" for i in range(10)]


@pytest.mark.parametrize("text", ["\n".join(NAMES) + "\n\n", json.dumps(NAMES)], ids=["lines", "json"])
def test_class_names_from_a_file_are_shown_next_to_each_prediction(tmp_path, capsys, text):
    (tmp_path / "names.txt").write_text(text)
    out_png = tmp_path / "o.png"
    assert main(["cam", "tiny", "--input", "2x3x32x32", "--target", "3", "--classes", str(tmp_path / "names.txt"),
                 "--out", str(out_png)]) == 0
    out, _ = stderr_lines(capsys)
    lines = out.splitlines()
    assert lines[1] == "layer chosen automatically: layer2.0.conv2 (the last Conv2d with a spatial output)"
    assert lines[2].startswith("image 0: class 3 (thing3), logit ") and lines[2].endswith(f"-> {tmp_path}/o_0.png")
    assert lines[3].startswith("image 1: class 3 (thing3), logit ")


def test_the_demo_model_names_its_classes(capsys):
    args = argparse.Namespace(model="demo", weights=None, classes=None)
    assert class_names(args) == list(DEMO_CLASSES)
    assert class_names(argparse.Namespace(model="tiny", weights=None, classes=None)) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\nc\n", "--classes {p} gives 3 class names but the model has 10 outputs; give one name per output, "
                      "in class order"),
        ("", "--classes {p} holds no class names; write one name per line, or a JSON list of strings"),
        ('["a", ', "--classes {p} is not valid JSON (Expecting value, line 1)"),
        ("[1, 2]", "--classes {p} is a JSON list of other things than strings"),
        (None, "cannot read --classes {p}: no such file"),
    ],
    ids=["count", "empty", "bad-json", "not-strings", "missing"],
)
def test_bad_class_names_are_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "names.txt"
    if text is not None:
        path.write_text(text)
    assert main(["cam", "tiny", "--classes", str(path), "--out", str(tmp_path / "o.png")]) == 2
    assert message.format(p=path) in one_error(capsys)
    assert not (tmp_path / "o.png").exists()


# --- the random-weights warning ------------------------------------------------------------------
WARNING = ("hookscope: warning: tiny has random weights (no --weights): its predictions and maps mean nothing; "
           "pass --weights FILE, or use MODEL demo (trained)")


def test_random_weights_are_said_once_on_stderr(tmp_path, capsys):
    assert main(["cam", "tiny", "--method", "gradcam,layercam", "--input", "2x3x32x32", "--json"]) == 0
    out, err = stderr_lines(capsys)
    assert err == [WARNING]
    json.loads(out)  # stdout is the JSON alone
    assert main(["cam", f"torchvision:{TV}", "--input", "1x3x64x64", "--json"]) == 0
    assert stderr_lines(capsys)[1] == [
        f"hookscope: warning: torchvision:{TV} has random weights (no --weights): its predictions and maps mean "
        "nothing; pass --weights DEFAULT for torchvision's trained weights, or --weights FILE"]


def test_no_warning_for_the_demo_model_for_weights_or_for_a_failed_command(tmp_path, capsys):
    assert main(["cam", "demo", "--json"]) == 0
    assert stderr_lines(capsys)[1] == []
    assert main(["cam", "tiny", "--layer", "layer9", "--json"]) == 2  # an error is the one line, alone
    assert "matches no module of TinyResNet" in one_error(capsys)


def test_a_session_says_each_warning_once_and_only_after_success(capsys):
    with model_session(argparse.Namespace(model="tiny", weights=None)):
        load_model("tiny")
        load_model("tiny", seed=1)
        load_model("torchvision:squeezenet1_1")
        assert stderr_lines(capsys)[1] == []  # not yet: the command may still fail
    err = stderr_lines(capsys)[1]
    assert err[0] == WARNING and len(err) == 2 and "torchvision:squeezenet1_1 has random weights" in err[1]
    with pytest.raises(RuntimeError), model_session(argparse.Namespace(model="tiny", weights=None)):
        load_model("tiny")
        raise RuntimeError("the command failed")
    assert stderr_lines(capsys)[1] == []
    load_model("tiny")  # a library call, outside any command: nothing said
    assert stderr_lines(capsys)[1] == []
    with model_session(argparse.Namespace(model="tiny", weights=None, command="summary")):
        load_model("tiny")  # names, shapes and counts do not depend on the weights: nothing to warn of
    assert stderr_lines(capsys)[1] == []


def test_a_session_gives_the_commands_weights_to_its_model_only(tmp_path):
    trained = TinyResNet(seed=7).eval()
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    x = torch.randn(1, 3, 32, 32)
    with model_session(argparse.Namespace(model="tiny", weights=str(tmp_path / "w.pt"))):
        assert torch.equal(load_model("tiny")(x), trained(x))  # what every command's load_model(args.model) gets
        assert isinstance(load_model("hookscope.zoo:TinyResNet"), TinyResNet)  # another MODEL: not those weights
        assert not torch.equal(load_model("hookscope.zoo:TinyResNet")(x), trained(x))


def test_every_model_command_honours_weights_and_warns(tmp_path, capsys):
    torch.save(TinyResNet(num_classes=5).state_dict(), tmp_path / "five.pt")
    for command in ("summary", "trace", "watch", "diff", "layers"):
        assert main([command, "tiny", "--weights", str(tmp_path / "five.pt")]) == 2
        assert "2 shape mismatches: fc.weight (file 5x32, model 10x32)" in one_error(capsys, command)
    assert main(["diff", "tiny", "--b-seed", "1"]) == 1
    assert stderr_lines(capsys)[1] == [WARNING]  # two random models of one MODEL: said once
    assert main(["summary", "tiny"]) == 0
    assert stderr_lines(capsys)[1] == []


# --- image inputs --------------------------------------------------------------------------------
def ns(*images: Path | str, model: str = "tiny", preset: str = "auto", size: str | None = None,
       weights: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(image=[str(i) for i in images], model=model, preset=preset, size=size, weights=weights)


def test_a_folder_is_its_image_files_in_name_order(tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    for name, value in (("b.png", 20), ("a.jpg", 10), ("c.bmp", 30)):
        Image.new("RGB", (40, 30), (value, value, value)).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    (folder / "sub.png").mkdir()  # a folder named like an image is not read
    extra = save_png(tmp_path / "z.png", np.full((8, 8, 3), 40))
    batch = load_images(ns(folder, extra, preset="none", size="16x16"))
    assert batch.names == ["a.jpg", "b.png", "c.bmp", "z.png"]
    assert batch.paths == [str(folder / "a.jpg"), str(folder / "b.png"), str(folder / "c.bmp"), str(extra)]
    assert batch.x.shape == (4, 3, 16, 16)
    assert [round(v * 255) for v in batch.pictures[:, 0, 0, 0].tolist()] == [10, 20, 30, 40]
    assert torch.equal(batch.x, batch.pictures)  # preset none: the pictures themselves


def test_imagenet_preset_normalises_a_known_pixel(tmp_path):
    image = save_png(tmp_path / "orange.png", np.broadcast_to(np.array([255, 128, 0]), (300, 260, 3)))
    batch = load_images(ns(image, preset="imagenet"))
    assert batch.x.shape == (1, 3, 224, 224)  # resize 256, crop 224
    expected = [(v - m) / s for v, m, s in zip((1.0, 128 / 255, 0.0), IMAGENET_MEAN, IMAGENET_STD)]
    assert batch.x[0, :, 100, 100].tolist() == pytest.approx(expected, abs=1e-5)
    assert batch.pictures[0, :, 100, 100].tolist() == pytest.approx([1.0, 128 / 255, 0.0], abs=1e-6)


def test_the_demo_preset_is_64x64_in_0_1_and_auto_picks_it_for_demo(tmp_path):
    image = save_png(tmp_path / "grey.png", np.full((100, 90, 3), 51))
    for preset in ("demo", "auto"):
        batch = load_images(ns(image, model="demo", preset=preset))
        assert batch.x.shape == (1, 3, 64, 64) and batch.transform.name == "demo"
        assert batch.x.flatten().tolist() == pytest.approx([0.2] * 3 * 64 * 64, abs=1e-6)
    assert preset_for("torchvision:resnet18").name == "imagenet"
    assert preset_for("tiny").size == (32, 32) and preset_for("tiny").mean is None


@pytest.mark.parametrize(("model", "weights", "name"), [
    ("resnet18", "DEFAULT", "ResNet18_Weights.IMAGENET1K_V1"),  # resize 256, crop 224, bilinear
    ("efficientnet_b0", "IMAGENET1K_V1", "EfficientNet_B0_Weights.IMAGENET1K_V1"),  # bicubic
    ("inception_v3", "DEFAULT", "Inception_V3_Weights.IMAGENET1K_V1"),  # resize 342, crop 299
])
def test_auto_uses_the_torchvision_weights_own_transforms(tmp_path, model, weights, name):
    import torchvision

    rng = np.random.default_rng(1)
    image = save_png(tmp_path / "wide.png", rng.integers(0, 256, size=(120, 200, 3)))
    batch = load_images(ns(image, model=f"torchvision:{model}", weights=weights))
    picture = torch.from_numpy(read_png(image)).permute(2, 0, 1).float() / 255
    expected = torchvision.models.get_weight(name).transforms()(picture)
    assert batch.transform.name == name
    assert torch.allclose(batch.x[0], expected, atol=1e-6, rtol=0)
    assert 0 <= batch.pictures.min() and batch.pictures.max() <= 1  # bicubic's overshoot: not in the picture


def test_image_errors_are_one_line_naming_the_file(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("no images here")
    assert main(["cam", "tiny", "--image", str(empty), "--json"]) == 2
    assert one_error(capsys).endswith(f"--image {empty} holds no image file (.png, .jpg, .jpeg, ...); give a "
                                      "folder of images or an image file")
    good = save_png(tmp_path / "good.png", np.random.default_rng(0).integers(0, 256, (64, 64, 3)))
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(good.read_bytes()[:2000])
    assert main(["cam", "tiny", "--image", str(good), "--image", str(truncated), "--json"]) == 2
    line = one_error(capsys)
    assert line.startswith(f"hookscope cam: error: cannot read image {truncated}: ")
    assert line.endswith("; give a PNG, JPEG or another image format Pillow reads")
    (tmp_path / "text.png").write_text("not an image")
    assert main(["cam", "tiny", "--image", str(tmp_path / "text.png"), "--json"]) == 2
    assert f"cannot identify image file '{tmp_path}/text.png'" in one_error(capsys)


def test_images_of_different_sizes_need_a_size_for_an_unknown_model(tmp_path, capsys):
    src = tmp_path / "net.py"
    src.write_text("import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), "
                   "torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())\n")
    a = save_png(tmp_path / "a.png", np.zeros((10, 12, 3)))
    b = save_png(tmp_path / "b.png", np.zeros((14, 12, 3)))
    argv = ["cam", f"{src}:build", "--image", str(a), "--image", str(b), "--json"]
    assert main(argv) == 2
    assert one_error(capsys).endswith(f"the images differ in size ({a} is 10x12, {b} is 14x12) and the model's "
                                      "input size is unknown; give --size HxW")
    assert main([*argv, "--size", "12x12"]) == 0
    assert json.loads(capsys.readouterr().out)["input"] == [2, 3, 12, 12]


def test_normalize_is_still_an_alias_of_preset(tmp_path, capsys):
    image = save_png(tmp_path / "in.png", np.full((32, 32, 3), 255))
    assert main(["cam", "tiny", "--image", str(image), "--normalize", "imagenet", "--size", "32x32",
                 "--alpha", "0", "--out", str(tmp_path / "o.png")]) == 0
    assert "input 1x3x32x32" in capsys.readouterr().out
    assert (read_png(tmp_path / "o.png") == 255).all()  # the picture drawn is the image, not the normalised input


# --- cam: --json and several methods side by side -----------------------------------------------
def test_several_methods_save_an_overlay_each_and_a_side_by_side_plot(tmp_path, capsys):
    from hookscope.analysis.cam import cam
    from hookscope.synthetic import shapes
    from hookscope.viz.overlay import save_overlay
    from hookscope.viz.plots import plot_cams, save_figure
    from hookscope.zoo import demo_model

    data = shapes(2, seed=11)
    for i in range(2):
        save_png(tmp_path / f"s{i}.png", (data.images[i].permute(1, 2, 0) * 255).round().numpy())
    argv = ["cam", "demo", "--image", str(tmp_path / "s0.png"), "--image", str(tmp_path / "s1.png"),
            "--method", "gradcam,layercam", "--out", str(tmp_path / "o.png"), "--plot", str(tmp_path / "p.png")]
    assert main(argv) == 0
    out, err = stderr_lines(capsys)
    lines = out.splitlines()
    assert lines[0] == "DemoNet, input 2x3x64x64, methods gradcam, layercam, layer layer3.3" and err == []
    assert lines.pop(1) == "layer chosen automatically: layer3.3 (the last Conv2d with a spatial output)"
    # the same pictures made by hand from the public API
    model = demo_model()
    pictures = torch.from_numpy(np.stack([read_png(tmp_path / f"s{i}.png") for i in range(2)])).permute(0, 3, 1, 2) / 255
    results = [cam(model, pictures, method=m) for m in ("gradcam", "layercam")]
    assert no_hooks(model)
    for i in range(2):
        k = int(results[0].targets[i])
        assert lines[1 + i].startswith(f"image {i} (s{i}.png): class {k} ({DEMO_CLASSES[k]}), logit ")
        assert lines[1 + i].endswith(f"-> {tmp_path}/o_{i}_gradcam.png, {tmp_path}/o_{i}_layercam.png, "
                                     f"{tmp_path}/p_{i}.png")
        for r in results:
            mine = read_png(save_overlay(pictures[i], r.maps[i], tmp_path / f"mine_{i}_{r.method}.png"))
            assert np.array_equal(read_png(tmp_path / f"o_{i}_{r.method}.png"), mine)
        fig = plot_cams(pictures[i], results, index=i, class_names=DEMO_CLASSES)
        mine = read_png(save_figure(fig, tmp_path / f"mine_plot_{i}.png"))
        assert np.array_equal(read_png(tmp_path / f"p_{i}.png"), mine)


def test_json_is_the_results_own_json_plus_names_and_paths(tmp_path, capsys):
    assert main(["cam", "demo", "--method", "gradcam,eigencam", "--plot", str(tmp_path / "p.png"), "--json"]) == 0
    out, _ = stderr_lines(capsys)
    data = json.loads(out)
    assert [d["method"] for d in data] == ["gradcam", "eigencam"]
    from hookscope.analysis.cam import cam
    from hookscope.synthetic import shapes

    generated = shapes(1, seed=0)  # MODEL demo without --image: a generated shape, not noise
    own = json.loads(cam(load_model("demo"), generated.images, method="gradcam").to_json())
    extra = {"model", "weights", "input", "class_names"}
    assert set(data[0]) == set(own) | extra
    assert {k: v for k, v in data[0].items() if k not in extra and k != "rows"} == \
           {k: v for k, v in own.items() if k != "rows"}
    row = data[0]["rows"][0]
    assert row["class_name"] == DEMO_CLASSES[row["target"]]
    assert row["plot"] == str(tmp_path / "p.png") and row["out"] is None and row["file"] is None
    assert row["generated"] == generated.classes[int(generated.labels[0])]
    assert data[0]["class_names"] == list(DEMO_CLASSES) and data[0]["model"] == "demo"
    assert read_png(tmp_path / "p.png").shape[1] > 3 * read_png(tmp_path / "p.png").shape[0] / 2  # 3 panels wide


def test_cam_needs_something_to_make_and_checks_methods_first(tmp_path, capsys):
    assert main(["cam", "tiny"]) == 2
    assert "say what to make: --out PNG" in one_error(capsys)
    assert main(["cam", "tiny", "--method", "gradcam,layercamm", "--json"]) == 2
    assert "is not a CAM method; give one or more of cam, gradcam," in one_error(capsys)
    assert main(["cam", "tiny", "--plot", str(tmp_path / "missing" / "p.png")]) == 2
    assert "--plot" in one_error(capsys)


def test_help_shows_an_example_and_the_security_note(capsys):
    with pytest.raises(SystemExit):
        main(["cam", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Examples: python -c" in text and "hookscope cam demo --image shape.png --method gradcam,gradcam++,layercam" in text
    assert "hookscope cam torchvision:resnet18 --image shape.png" in text and "--weights DEFAULT" in text
    assert "Security: file.py:ATTR and package.module:ATTR import and run that Python code" in text
    assert "--weights FILE|NAME" in text and "--classes FILE" in text and "--preset {auto,imagenet,demo,none}" in text
