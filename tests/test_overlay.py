"""The overlay PNG helper (hookscope.viz.overlay) and the ``hookscope cam`` command that uses it.

matplotlib and pillow come with the viz extra, which the dev extra includes: these tests import them
directly, so a missing extra fails loudly instead of skipping.
"""

import sys

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope import HookscopeError
from hookscope.viz import as_image, overlay, save_overlay

JET_LOW, JET_HIGH = (0.0, 0.0, 0.5), (0.5, 0.0, 0.0)  # matplotlib's jet at 0 and at 1


def read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.mode == "RGB" and im.format == "PNG"
        return np.asarray(im).copy()


# --- blending, by hand -------------------------------------------------------------------------
def test_alpha_zero_is_the_image_and_alpha_one_the_colormap(tmp_path):
    torch.manual_seed(0)
    image = torch.rand(3, 5, 7)
    cam_map = torch.zeros(5, 7)
    cam_map[:, 4:] = 1.0
    png = read_png(save_overlay(image, cam_map, tmp_path / "a0.png", alpha=0.0))
    assert png.shape == (5, 7, 3)
    assert np.array_equal(png, (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())
    only_map = overlay(image, cam_map, alpha=1.0)
    assert only_map[:, 0, 0].tolist() == pytest.approx(JET_LOW)
    assert only_map[:, 0, 6].tolist() == pytest.approx(JET_HIGH)
    png = read_png(save_overlay(image, cam_map, tmp_path / "a1.png", alpha=1.0))
    assert png[0, 0].tolist() == [0, 0, 128] and png[0, 6].tolist() == [128, 0, 0]


def test_half_blend_of_a_grey_image():
    image = torch.full((3, 2, 2), 0.4)
    out = overlay(image, torch.ones(2, 2), alpha=0.5)
    # 0.5 * 0.4 + 0.5 * (0.5, 0, 0)
    assert out[:, 1, 1].tolist() == pytest.approx([0.45, 0.2, 0.2])


def test_small_map_is_upsampled_bilinearly_and_raw_maps_are_normalised():
    image = torch.zeros(3, 4, 4)
    # [[0, 1]] as 1 x 2 upsampled to 4 columns: 0, 0.25, 0.75, 1 (align_corners=False)
    out = overlay(image, torch.tensor([[0.0, 1.0]]), alpha=1.0)
    assert out[:, 2, 0].tolist() == pytest.approx(JET_LOW)
    assert out[:, 2, 3].tolist() == pytest.approx(JET_HIGH)
    raw = overlay(image, torch.tensor([[2.0, 6.0]]), alpha=1.0)  # outside [0, 1]: min-max first
    assert torch.allclose(raw, out)
    batch_of_one = overlay(image, torch.tensor([[[0.0, 1.0]]]), alpha=1.0)
    assert torch.allclose(batch_of_one, out)


def test_pil_image_path_and_uint8_tensor_give_the_same_picture(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(6, 9, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "in.png")
    expected = torch.from_numpy(pixels).permute(2, 0, 1).float() / 255
    for source in (tmp_path / "in.png", str(tmp_path / "in.png"), Image.fromarray(pixels),
                   torch.from_numpy(pixels).permute(2, 0, 1)):
        assert torch.allclose(as_image(source), expected)
    png = read_png(save_overlay(tmp_path / "in.png", torch.zeros(6, 9), tmp_path / "out.png", alpha=0.0))
    assert np.array_equal(png, pixels)


def test_grey_tensor_is_repeated_over_three_channels():
    img = as_image(torch.tensor([[0.25, 1.0]]))
    assert img.shape == (3, 1, 2) and img[:, 0, 0].tolist() == [0.25] * 3


# --- mistakes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "image, cam_map, kwargs, match",
    [
        (torch.zeros(3, 2, 2), torch.zeros(2, 2), {"colormap": "jte"}, r"Did you mean 'jet'"),
        (torch.zeros(3, 2, 2), torch.zeros(2, 2), {"alpha": 1.5}, r"alpha=1.5 must be between 0"),
        (torch.full((3, 2, 2), -1.8), torch.zeros(2, 2), {}, r"not \[0, 1\]; undo the input normalisation"),
        (torch.zeros(2, 3, 2, 2), torch.zeros(2, 2), {}, r"not 3 x H x W"),
        (torch.zeros(3, 2, 2), torch.zeros(2, 2, 2), {}, r"not one H x W map; pass result.maps\[i\]"),
        ("/nonexistent/cat.jpg", torch.zeros(2, 2), {}, r"no such image file: /nonexistent/cat.jpg"),
        ([[0.0]], torch.zeros(2, 2), {}, r"a PIL image or a file path, not list"),
    ],
)
def test_bad_arguments_are_one_line_errors(image, cam_map, kwargs, match):
    with pytest.raises(HookscopeError, match=match) as e:
        overlay(image, cam_map, **kwargs)
    assert "\n" not in str(e.value)


def test_missing_extra_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an absent package looks like
    with pytest.raises(HookscopeError, match=r"needs matplotlib, from the viz extra: pip install 'hookscope\[viz\]'"):
        save_overlay(torch.zeros(3, 2, 2), torch.zeros(2, 2), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_viz_runs_no_analysis_and_registers_no_hook():
    """viz sits above the analyses: it may name their result types, never call what runs a model."""
    import ast
    import importlib
    import pathlib

    import hookscope.viz

    for path in pathlib.Path(hookscope.viz.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and "analysis" in (node.module or ""):
                module = importlib.import_module("hookscope." + node.module.lstrip("."))
                for alias in node.names:
                    found = getattr(module, alias.name)
                    assert isinstance(found, type) or not callable(found), (path, alias.name)
            if isinstance(node, ast.Import):
                assert not any("analysis" in a.name for a in node.names), path
            if isinstance(node, ast.Attribute):
                assert not node.attr.startswith("register_"), path


# --- hookscope cam: the command that draws these overlays ----------------------------------------
def _cli(*argv):
    from hookscope.cli import main

    return main(["cam", *argv])


def test_cli_prints_predicted_class_score_and_layer_and_saves_the_input_under_the_map(tmp_path, capsys):
    from hookscope.cli.inputs._shapes import example_input
    from hookscope.zoo import TinyResNet

    out = tmp_path / "o.png"
    assert _cli("tiny", "--alpha", "0", "--out", str(out)) == 0
    x = example_input("tiny", None, seed=0)
    logits = TinyResNet(seed=0).eval()(x)
    k = int(logits.argmax())
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "TinyResNet, input 1x3x32x32, method gradcam, layer layer2.0.conv2"
    assert printed[1] == "layer chosen automatically: layer2.0.conv2 (the last Conv2d with a spatial output)"
    assert printed[2] == f"image 0: class {k}, logit {logits[0, k].item():.4f} -> {out}"
    picture = (x[0] - x.min()) / (x.max() - x.min())  # alpha 0: the input itself, min-max scaled
    expected = (picture * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    assert np.array_equal(read_png(out), expected)


def test_cli_batch_saves_one_png_per_image_and_fuses_layers(tmp_path, capsys):
    out = tmp_path / "cam.png"
    assert _cli("tiny", "--input", "2x3x32x32", "--method", "layercam", "--layer", "layer1",
                "--layer", "layer2", "--target", "3", "--out", str(out)) == 0
    text = capsys.readouterr().out
    assert "method layercam, layers layer1, layer2" in text
    assert "image 0: class 3" in text and "image 1: class 3" in text
    for i in range(2):
        assert read_png(tmp_path / f"cam_{i}.png").shape == (32, 32, 3)
    assert not out.exists()


def test_cli_image_is_resized_to_the_model_input(tmp_path, capsys):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)).save(tmp_path / "in.png")
    assert _cli("tiny", "--image", str(tmp_path / "in.png"), "--out", str(tmp_path / "o.png")) == 0
    assert "input 1x3x32x32" in capsys.readouterr().out
    assert read_png(tmp_path / "o.png").shape == (32, 32, 3)
    assert _cli("tiny", "--image", str(tmp_path / "in.png"), "--size", "24x20", "--out", str(tmp_path / "s.png")) == 0
    assert "input 1x3x24x20" in capsys.readouterr().out
    assert read_png(tmp_path / "s.png").shape == (24, 20, 3)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--target", "99"], "target class 99 (sample 0) is out of range"),
        (["--input", "1x3x32x32", "--image", "x.png"], "either --image PATH or --input SHAPE, not both"),
        (["--image", "/nonexistent.png"], "no such image file: /nonexistent.png"),
        (["--method", "gradcamm"], "Did you mean 'gradcam'"),
        (["--layer", "layer9"], "matches no module of TinyResNet"),
        (["--image", "x.png", "--size", "1x2x3"], "--size '1x2x3' is not HxW"),
        (["--alpha", "2"], "--alpha 2 is not a weight; give a number from 0 to 1"),
        (["--input", "1x1x32x32"], "the forward pass failed in 'stem.0' (Conv2d), which received input[0] 1x1x32x32"),
        (["--tokens", "1"], "expected B x tokens x C, got 4 dimensions"),
    ],
)
def test_cli_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, match):
    assert _cli("tiny", *argv, "--out", str(tmp_path / "o.png")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hookscope cam: error:") and match in err[0]
    assert not (tmp_path / "o.png").exists()


def test_cli_out_folder_must_exist_before_any_work(tmp_path, capsys):
    assert _cli("tiny", "--out", str(tmp_path / "missing" / "o.png")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such folder" in err[0]
