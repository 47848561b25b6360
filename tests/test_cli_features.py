"""``hookscope features``: the grid PNG, the rows as a table or JSON, story 6's comparison, and bad input."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.analysis.features import feature_maps
from hookscope.cli import main
from hookscope.viz.features import plot_feature_maps, save_feature_maps
from hookscope.zoo import TinyResNet

MODELS = textwrap.dedent("""
    import torch
    from torch import nn


    class PartialReLU(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 6, 3, padding=1)

        def forward(self, x):
            out = self.conv(x)
            out[:, :3].relu_()  # rewrites channels 0-2 after the conv returned
            return out.mean((2, 3))


    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Linear(3, 4)
            self.block = nn.Identity()

        def forward(self, x):
            t = self.embed(x.flatten(2).transpose(1, 2))
            return self.block(torch.cat([t.mean(1, keepdim=True), t], 1))[:, 0]
""")


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return str(path)


def read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im).copy()


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hookscope features: error: "), err
    return err[0]


def test_grid_png_is_what_the_api_draws_and_the_table_its_rows(tmp_path, capsys):
    out = tmp_path / "grid.png"
    assert main(["features", "tiny", "--layer", "layer1", "--top", "5", "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    net = TinyResNet(seed=0).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    res = feature_maps(net, x, layers="layer1")
    top = res.top(5)
    assert text[0] == "TinyResNet, input 1x3x32x32, layer layer1: 16 channels of 32x32"
    assert [int(line.split()[0]) for line in text[3:8]] == top
    assert float(text[3].split()[1]) == pytest.approx(res.rows[top[0]].mean, rel=1e-3)
    assert text[-1] == f"5 channel tiles -> {out}"
    picture = (x[0] - x[0].min()) / (x[0].max() - x[0].min())
    api = save_feature_maps(plot_feature_maps(res, picture=picture[None], top_k=5), tmp_path / "api.png")
    assert np.array_equal(read_png(out), read_png(api))


def test_json_prints_every_row_and_what_was_drawn(tmp_path, capsys):
    out = tmp_path / "g.png"
    assert main(["features", "tiny", "--layer", "layer2", "--channels", "0,5,9", "--scale", "channel",
                 "--json", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layer"] == "layer2" and data["shape"] == [1, 32, 16, 16] and data["shown"] == [0, 5, 9]
    assert len(data["rows"]) == 32 and data["out"] == str(out) and data["input"] == [1, 3, 32, 32]
    assert data["maps"] == {"shape": [1, 32, 16, 16], "dtype": "float32"}
    assert read_png(out).shape[0] > 50


@pytest.mark.parametrize("extra", [["--reduce", "pca"], ["--reduce", "max", "--overlay", "0.5"],
                                   ["--overlay", "0.3", "--columns", "2", "--colormap", "magma"]])
def test_reductions_and_overlays_write_a_picture(tmp_path, capsys, extra):
    out = tmp_path / "r.png"
    assert main(["features", "tiny", "--layer", "layer1", "--input", "2x3x32x32", "--out", str(out), *extra]) == 0
    png = read_png(out)
    assert png[..., :3].std() > 10  # not a blank picture
    assert "-> " + str(out) in capsys.readouterr().out


def test_images_from_a_folder_are_the_rows(tmp_path, capsys):
    folder = tmp_path / "pics"
    folder.mkdir()
    for name, colour in (("a.png", (255, 0, 0)), ("b.png", (0, 0, 255))):
        Image.new("RGB", (64, 64), colour).save(folder / name)
    out = tmp_path / "d.png"
    assert main(["features", "demo", "--image", str(folder), "--layer", "layer1", "--top", "4", "--json",
                 "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["files"] == ["a.png", "b.png"] and data["input"] == [2, 3, 64, 64] and len(data["per_image"]) == 2


def test_demo_without_an_image_draws_a_generated_shape(tmp_path, capsys):
    assert main(["features", "demo", "--layer", "layer2", "--top", "8", "--out", str(tmp_path / "s.png")]) == 0
    assert "image 0: a generated " in capsys.readouterr().out


def test_compare_references_marks_the_channels_the_in_place_op_rewrote(tmp_path, capsys, models):
    out = tmp_path / "trap.png"
    spec = f"{models}:PartialReLU"
    assert main(["features", spec, "--input", "1x3x8x8", "--layer", "conv", "--compare-references", "--json",
                 "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changed"] == [0, 1, 2] and [r["differs"] for r in data["rows"]] == [True] * 3 + [False] * 3
    assert data["out"] == [str(out)]
    png = read_png(out)
    assert np.all(png[..., :3] == [255, 0, 0], axis=-1).sum() > 50  # the red frames
    assert main(["features", spec, "--input", "2x3x8x8", "--layer", "conv", "--compare-references",
                 "--out", str(tmp_path / "b.png")]) == 0
    text = capsys.readouterr().out
    assert "conv: 3 of 6 channels rewritten after the layer ran" in text
    assert "channels rewritten after the layer ran: 0-2;" in text
    assert (tmp_path / "b_0.png").is_file() and (tmp_path / "b_1.png").is_file()


def test_tokens_are_laid_on_a_grid(tmp_path, capsys, models):
    assert main(["features", f"{models}:Tokens", "--input", "1x3x4x4", "--layer", "block", "--tokens", "1",
                 "--json", "--out", str(tmp_path / "t.png")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shape"] == [1, 4, 4, 4] and data["output_shape"] == [1, 17, 4] and data["layout"] == "reshape="


@pytest.mark.parametrize("argv, says", [
    (["--layer", "fc"], "layer 'fc' gives 1x10: no spatial layout"),
    (["--layer", "layer1", "--top", "0"], "--top 0 must be at least 1"),
    (["--layer", "layer1", "--channels", "3,99"], "channel 99 is out of range: layer 'layer1' has 16 channels, 0 to 15"),
    (["--layer", "layer1", "--channels", "a,b"], "--channels 'a,b' is not a list of channel indices"),
    (["--layer", "layer1", "--out", "missing/x.png"], "no such folder 'missing'"),
    (["--layer", "layer1", "--overlay", "2"], "--overlay 2 is not a weight"),
    (["--layer", "layer1", "--compare-references", "--reduce", "pca"], "drop --reduce and --overlay"),
    (["--layer", "layer1", "--image", "x.png", "--input", "1x3x32x32"], "either --image PATH or --input SHAPE"),
    (["--layer", "layer9"], "matches no module of TinyResNet"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    args = ["features", "tiny", *argv]
    if "--out" not in argv:
        args += ["--out", "g.png"]
    assert main(args) == 2
    assert says in one_error(capsys)
    assert not (tmp_path / "g.png").exists()


def test_a_token_layer_without_tokens_names_the_fix(tmp_path, capsys, models):
    assert main(["features", f"{models}:Tokens", "--input", "1x3x4x4", "--layer", "block",
                 "--out", str(tmp_path / "t.png")]) == 2
    line = one_error(capsys)
    assert "17 tokens of 4 channels" in line and "--tokens K" in line


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as e:
        main(["features", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "Examples:" in text and "hookscope features demo --layers layer1 --out layer1.png" in text and "--compare-references" in text
