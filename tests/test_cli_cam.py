"""The CLI's images, ``hookscope cam`` and weights loading, each case pinned by a test that failed before
its fix: outputs that would overwrite inputs, 16-bit and float pictures, a huge
``--size``, generated shapes for the demo model, ``--grid``, hidden files in folders, offline weight names
for ``layers`` / ``summary`` and the one-line errors about weights files.

No network: torchvision's weights are a file made here and put where torch.hub looks first.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from hookscope import HookscopeError
from hookscope.cli import main
from hookscope.cli.inputs._images import image_files, read_image
from helpers import cached_torchvision_weights

from hookscope.core.text import first_line
from hookscope.viz import as_image

TV = "squeezenet1_1"  # the smallest torchvision classifier with ImageNet weights


def one_error(capsys: pytest.CaptureFixture[str], command: str = "cam") -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and captured.out == "", (captured.out, err)
    prefix = f"hookscope {command}: error: "
    assert err[0].startswith(prefix), err[0]
    return err[0][len(prefix):]


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).copy()


def shape_png(path: Path, seed: int = 1) -> Path:
    from hookscope.synthetic import shapes

    picture = shapes(1, seed=seed).images[0]
    Image.fromarray((picture.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()).save(path)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --- 3. what cam writes: never an input, never twice, never over a file without --overwrite -------------
def test_an_out_that_is_the_input_image_is_refused_before_the_model_runs(tmp_path, capsys):
    image = shape_png(tmp_path / "in.png")
    marker = tmp_path / "forward_ran"
    (tmp_path / "net.py").write_text(
        "import torch, pathlib\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.c = torch.nn.Conv2d(3, 2, 3); self.f = torch.nn.Linear(2, 3)\n"
        "    def forward(self, x):\n"
        f"        pathlib.Path({str(marker)!r}).touch()\n"
        "        return self.f(self.c(x).mean((2, 3)))\n")
    before = snapshot(tmp_path)
    for argv, said in [
        (["--out", str(image)], f"--out {image} is one of the --image files; give another path, an input is never "
                                "overwritten"),
        (["--plot", str(image)], f"--plot {image} is one of the --image files; give another path, an input is "
                                 "never overwritten"),
        (["--out", str(image), "--overwrite"], f"--out {image} is one of the --image files; give another path, an "
                                               "input is never overwritten"),
    ]:
        assert main(["cam", f"{tmp_path}/net.py:Net", "--image", str(image), "--size", "8x8", *argv]) == 2
        assert one_error(capsys) == said
    assert snapshot(tmp_path) == before and not marker.exists()  # the model never ran, nothing was written


def test_out_and_plot_naming_the_same_file_are_refused(tmp_path, capsys):
    image = shape_png(tmp_path / "in.png")
    out = tmp_path / "o.png"
    assert main(["cam", "demo", "--image", str(image), "--out", str(out), "--plot", str(out)]) == 2
    assert one_error(capsys) == f"--out {out} and --plot {out} both write {out}; give them different names"
    # a derived name colliding: two methods write o_gradcam.png, which --plot names too
    plot = tmp_path / "o_gradcam.png"
    assert main(["cam", "demo", "--image", str(image), "--method", "gradcam,layercam", "--out", str(out),
                 "--plot", str(plot)]) == 2
    assert one_error(capsys) == f"--out {out} and --plot {plot} both write {plot}; give them different names"
    assert snapshot(tmp_path) == {"in.png": image.read_bytes()}


def test_outputs_in_a_folder_of_inputs_are_refused_as_the_next_run_would_read_them(tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    shape_png(photos / "a.png", seed=1), shape_png(photos / "b.png", seed=2)
    before = snapshot(photos)
    assert main(["cam", "demo", "--image", str(photos), "--out", str(photos / "cam.png")]) == 2
    assert one_error(capsys) == (
        f"--out {photos}/cam.png writes {photos}/cam_0.png, which is in the --image folder {photos}, whose images "
        "are all read (the next run would read it back as an input); write it outside that folder")
    assert snapshot(photos) == before
    # an input named through a derived name: --out a.png over two images writes a_0.png, a_1.png
    assert main(["cam", "demo", "--image", str(photos / "b.png"), "--image", str(photos / "b.png"),
                 "--out", str(photos / "b.png")]) == 0  # one file, twice: writes b_0.png and b_1.png, not b.png
    capsys.readouterr()
    assert snapshot(photos)["b.png"] == before["b.png"]
    assert main(["cam", "demo", "--image", str(photos / "b_0.png"), "--image", str(photos / "a.png"),
                 "--out", str(photos / "b.png"), "--overwrite"]) == 2
    assert one_error(capsys) == (f"--out {photos}/b.png writes {photos}/b_0.png, which is one of the --image "
                                 "files; give another path, an input is never overwritten")


def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path, capsys):
    image = shape_png(tmp_path / "in.png")
    out = tmp_path / "o.png"
    out.write_bytes(b"mine")
    assert main(["cam", "demo", "--image", str(image), "--out", str(out)]) == 2
    assert one_error(capsys) == f"--out {out} exists; pass --overwrite to replace it, or give another path"
    assert out.read_bytes() == b"mine"
    (tmp_path / "p_gradcam.png").write_bytes(b"mine")
    (tmp_path / "p_layercam.png").write_bytes(b"mine")
    assert main(["cam", "demo", "--image", str(image), "--method", "gradcam,layercam", "--out",
                 str(tmp_path / "p.png"), "--plot", str(tmp_path / "q.png")]) == 2
    assert one_error(capsys) == (f"--out {tmp_path}/p.png writes {tmp_path}/p_gradcam.png, which exists (and 1 more "
                                 "of the 3 files to write); pass --overwrite to replace it, or give another path")
    assert not (tmp_path / "q.png").exists()
    assert main(["cam", "demo", "--image", str(image), "--out", str(out), "--overwrite", "--alpha", "0"]) == 0
    capsys.readouterr()
    assert np.array_equal(read_png(out), read_png(image))  # alpha 0: the overlay is the picture itself


# --- 4. 16-bit and float pictures ------------------------------------------------------------------------
def test_sixteen_bit_pictures_are_scaled_by_65535(tmp_path):
    values = np.array([[0, 1, 257, 32768, 65534, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "grey16.png")
    Image.fromarray(values.astype(np.int32)).save(tmp_path / "grey32.tif")
    expected = torch.from_numpy((values / 65535.0).astype(np.float32))
    for name, mode in (("grey16.png", "I;16"), ("grey32.tif", "I")):
        with Image.open(tmp_path / name) as im:
            assert im.mode == mode
        got = read_image(str(tmp_path / name))
        assert got.shape == (3, 1, 6) and got.dtype == torch.float32
        assert all(torch.equal(got[c], expected) for c in range(3))
    assert torch.equal(as_image(Image.fromarray(values)), expected.expand(3, -1, -1))  # a PIL image too
    Image.fromarray(np.array([[0, 70000]], dtype=np.int32)).save(tmp_path / "wide.tif")
    with pytest.raises(HookscopeError) as err:
        read_image(str(tmp_path / "wide.tif"))
    assert str(err.value) == (f"image {tmp_path}/wide.tif holds integer values in [0, 70000], beyond 16 bits "
                              "(0 to 65535); save it as an 8- or 16-bit image")


def test_float_pictures_are_read_as_they_are_and_out_of_range_ones_refused(tmp_path, capsys):
    values = np.array([[0.0, 0.125, 0.3, 1.0]], dtype=np.float32)
    Image.fromarray(values, "F").save(tmp_path / "f.tif")
    got = read_image(str(tmp_path / "f.tif"))
    assert got.shape == (3, 1, 4) and torch.equal(got[1], torch.from_numpy(values))
    Image.fromarray(np.array([[-0.5, 2.0]], dtype=np.float32), "F").save(tmp_path / "wide.tif")
    Image.fromarray(np.array([[0.5, np.nan]], dtype=np.float32), "F").save(tmp_path / "nan.tif")
    assert main(["cam", "demo", "--image", str(tmp_path / "wide.tif"), "--json"]) == 2
    assert one_error(capsys) == (f"image {tmp_path}/wide.tif holds float values in [-0.5, 2], not [0, 1]; save it "
                                 "scaled to [0, 1], or as an 8- or 16-bit image")
    assert main(["cam", "demo", "--image", str(tmp_path / "nan.tif"), "--json"]) == 2
    assert one_error(capsys) == (f"image {tmp_path}/nan.tif holds NaN or infinite values; save it with finite "
                                 "values in [0, 1]")


def test_eight_bit_pictures_read_as_before(tmp_path):
    pixels = np.array([[[0, 128, 255], [1, 2, 3]]], dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    assert torch.equal(read_image(str(tmp_path / "rgb.png")), torch.from_numpy(pixels).permute(2, 0, 1) / 255.0)


# --- 6. a huge --size ---------------------------------------------------------------------------------
def test_a_huge_size_is_one_line_before_any_allocation(tmp_path, capsys):
    image = shape_png(tmp_path / "in.png")
    assert main(["cam", "demo", "--image", str(image), "--size", "100000x100000", "--json"]) == 2
    line = one_error(capsys)
    assert re.fullmatch(r"1 image at 100000x100000 is 30,000,000,000 values \(120 GB of float32\), more than this "
                        r"machine's [\d.]+ [GT]B of memory; give a smaller --size", line), line


def test_a_failed_allocation_while_resizing_is_one_line(tmp_path, monkeypatch, capsys):
    from hookscope.loading import ImageTransform

    def fail(self, picture):  # type: ignore[no-untyped-def]
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(ImageTransform, "resized", fail)
    assert main(["cam", "demo", "--image", str(shape_png(tmp_path / "in.png")), "--json"]) == 2
    assert one_error(capsys) == ("1 image at 64x64 cannot be held in memory ([enforce fail at alloc_cpu.cpp:127] "
                                 "DefaultCPUAllocator: can't allocate memory); give a smaller --size")


# --- 10. the demo model without an image draws a generated shape ---------------------------------------
def test_cam_on_the_demo_model_without_an_image_uses_a_generated_shape(tmp_path, capsys):
    from hookscope.analysis.cam import cam
    from hookscope.synthetic import shapes
    from hookscope.viz import save_overlay
    from hookscope.zoo import DEMO_CLASSES, demo_model

    out = tmp_path / "o.png"
    assert main(["cam", "demo", "--seed", "3", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    data = shapes(1, seed=3)
    res = cam(demo_model(), data.images)
    k, drawn = int(res.targets[0]), data.classes[int(data.labels[0])]
    assert lines[1] == "layer chosen automatically: layer3.3 (the last Conv2d with a spatial output)"
    assert lines[2] == (f"image 0 (generated {drawn}): class {k} ({DEMO_CLASSES[k]}), logit "
                        f"{float(res.scores[0]):.4f} -> {out}")
    mine = save_overlay(data.images[0], res.maps[0], tmp_path / "mine.png")
    assert np.array_equal(read_png(out), read_png(mine))


# --- 11. --grid for a non-square number of tokens -------------------------------------------------------
TOKENS = """\
import torch
class Tok(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = torch.nn.Linear(3, 8), torch.nn.Linear(8, 3)
    def forward(self, x):
        t = x.flatten(2).transpose(1, 2)
        t = self.emb(torch.cat([torch.zeros_like(t[:, :1]), t], 1))  # a class token first
        return self.head(t[:, 1:].relu().mean(1))
"""


def test_tokens_on_a_non_square_grid_need_grid_and_the_error_says_the_cli_option(tmp_path, capsys):
    from hookscope.analysis.cam import cam, tokens_to_grid

    (tmp_path / "tok.py").write_text(TOKENS)
    argv = ["cam", f"{tmp_path}/tok.py:Tok", "--input", "1x3x4x5", "--layer", "emb", "--tokens", "1", "--json"]
    assert main(argv) == 2
    assert one_error(capsys) == ("--tokens 1: layer 'emb' leaves 20 tokens, which do not fill a 4x4 grid; pass --grid "
                                 "HxW with H x W = 20 (such as 4x5), or another --tokens SKIP")
    assert main([*argv, "--grid", "4x5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["raw"]["emb"]["shape"] == [1, 4, 5]
    from hookscope.cli._load import load_model
    from hookscope.cli.inputs._shapes import example_input

    own = cam(load_model(f"{tmp_path}/tok.py:Tok"), example_input("x", "1x3x4x5"), layers="emb",
              reshape=tokens_to_grid(1, grid=(4, 5)))
    assert data["rows"][0]["peak"] == json.loads(own.to_json())["rows"][0]["peak"]
    assert data["scores"] == pytest.approx(own.scores.tolist())
    assert main([*argv[:-3], "--grid", "4x5", "--json"]) == 2
    assert one_error(capsys) == "--grid 4x5 lays out a layer of tokens; give --tokens SKIP too (a class token: 1)"
    assert main([*argv, "--grid", "4y5"]) == 2
    assert one_error(capsys) == "--grid '4y5' is not HxW; write it like 14x14"


# --- 14. hidden files in a folder ----------------------------------------------------------------------
def test_hidden_files_in_a_folder_are_skipped(tmp_path, capsys):
    shape_png(tmp_path / "a.png")
    (tmp_path / "._a.png").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")
    shape_png(tmp_path / ".thumb.png")
    assert image_files([str(tmp_path)]) == [str(tmp_path / "a.png")]
    assert main(["cam", "demo", "--image", str(tmp_path), "--json"]) == 0
    assert [row["file"] for row in json.loads(capsys.readouterr().out)["rows"]] == [str(tmp_path / "a.png")]
    assert image_files([str(tmp_path / "._a.png")]) == [str(tmp_path / "._a.png")]  # named outright: read


# --- 12. layers and summary with a weight name, offline -------------------------------------------------
@pytest.fixture
def hub(tmp_path, monkeypatch):
    """TORCH_HOME with squeezenet1_1's weights cached: a randomly initialised model's, made here."""
    return cached_torchvision_weights(tmp_path, monkeypatch, TV)


@pytest.mark.parametrize("command", ["layers", "summary"])
def test_offline_layers_and_summary_say_they_do_not_need_the_weights_values(hub, monkeypatch, capsys, command):
    _, weights, cached = hub
    cached.unlink()

    def offline(url, dst, hash_prefix=None, progress=True):  # type: ignore[no-untyped-def]
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    assert main([command, f"torchvision:{TV}", "--weights", "DEFAULT"]) == 2
    assert one_error(capsys, command) == (
        "cannot download SqueezeNet1_1_Weights.IMAGENET1K_V1 (URLError: <urlopen error [Errno -2] Name or service not "
        f"known>); `hookscope {command}` does not use the weights' values: drop --weights to see the architecture "
        f"without them (the same for most models), or where the network allows, download {weights.url} to {cached}, "
        "or pass --weights FILE (a state_dict)")


# --- 16. errors about weights files --------------------------------------------------------------------
def test_long_messages_end_at_a_word():
    assert first_line(ValueError("short")) == "short"
    assert first_line(ValueError("alpha beta gamma delta"), limit=13) == "alpha beta..."
    assert first_line(ValueError("alpha beta, gamma"), limit=12) == "alpha beta..."
    assert first_line(ValueError("x" * 30), limit=10) == "x" * 10 + "..."
    assert first_line(ValueError("first line\nsecond")) == "first line"


def test_a_corrupt_weights_file_is_cut_at_a_word(tmp_path, capsys):
    path = tmp_path / "w.pt"
    path.write_bytes(b"PK\x03\x04garbage" * 10)  # a zip header, then nothing a zip holds
    assert main(["cam", "tiny", "--weights", str(path), "--json"]) == 2
    line = one_error(capsys)
    found = re.fullmatch(rf"--weights {path} is not a weights file torch can read \(RuntimeError: (.*)\); give a "
                         r"file torch.save\(model.state_dict\(\), path\) or safetensors wrote", line)
    assert found is not None, line
    said = found.group(1)
    assert said.startswith("PytorchStreamReader failed reading zip archive")
    assert len(said) <= 203 and said.endswith("...") and said[-4].isalpha()  # a whole word, then "..."


def test_a_text_file_as_weights_says_so(tmp_path, capsys):
    path = tmp_path / "w.pt"
    path.write_text("hello\n")
    assert main(["cam", "tiny", "--weights", str(path), "--json"]) == 2
    assert one_error(capsys) == (f"--weights {path} is not a weights file of a known format (it holds text); "
                                 "hookscope reads files torch.save wrote (a zip, or the older pickle format) and "
                                 "safetensors files: give a file torch.save(model.state_dict(), path) or "
                                 "safetensors wrote")
    assert main(["layers", str(path)]) == 2
    assert one_error(capsys, "layers").startswith(f"{path} is not a model file of a known format (it holds text); "
                                                  "MODEL.pt ")


def test_a_cached_torchvision_file_that_does_not_fit_names_the_keys(hub, capsys):
    fake, _, cached = hub
    state = fake.state_dict()
    state.pop("features.0.weight")
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, cached)
    assert main(["cam", f"torchvision:{TV}", "--weights", "DEFAULT", "--json"]) == 2
    assert one_error(capsys) == (
        f"{cached}, the cached file of SqueezeNet1_1_Weights.IMAGENET1K_V1, does not fit {TV}: 1 missing key: "
        "features.0.weight; 1 unexpected key: extra.weight; delete that file to download it again")


def test_a_state_dict_as_model_suggests_the_architecture_with_weights(tmp_path, capsys):
    from hookscope.zoo import demo_model

    demo = tmp_path / "demo_sd.pt"
    torch.save(demo_model(pretrained=False).state_dict(), demo)
    assert main(["cam", str(demo), "--json"]) == 2
    factory = ("; or write a file.py with def build(): m = Net(); m.load_state_dict(torch.load('weights.pt', "
               "weights_only=True)); return m, and pass file.py:build (its code runs)")
    assert one_error(capsys) == (
        f"'{demo}' gave a OrderedDict, not an nn.Module; it looks like a state_dict (weights without the model's "
        f"code): pass the architecture as MODEL and this file as --weights: hookscope cam demo --weights {demo}"
        + factory)
    assert main(["cam", "demo", "--weights", str(demo), "--json"]) == 0  # the suggestion works
    capsys.readouterr()
    other = tmp_path / "linear.pt"
    torch.save(nn.Linear(2, 3).state_dict(), other)
    assert main(["layers", str(other)]) == 2
    assert one_error(capsys, "layers") == (
        f"'{other}' gave a OrderedDict, not an nn.Module; it looks like a state_dict (weights without the model's "
        f"code): pass the architecture as MODEL and this file as --weights: hookscope layers ARCH --weights {other} "
        "(ARCH: tiny, demo, torchvision:NAME or file.py:ATTR)" + factory)
