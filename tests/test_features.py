"""Feature maps (hookscope.analysis.features) and their pictures (hookscope.viz.features).

Pictures are checked by content: a grid is saved as a PNG, read back with Pillow, and each tile is
compared with the grey levels worked out by hand from what ``hookscope.capture`` recorded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import hookscope
from hookscope import HookscopeError
from hookscope.analysis.features import FeatureMaps, compare_references, feature_maps
from hookscope.viz.features import (comparison_grid, feature_grid, plot_feature_maps, plot_reference_comparison,
                                    save_feature_maps)

from helpers import no_hooks


def read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im).copy()


def origin(j: int, columns: int, h: int, w: int, pad: int) -> tuple[int, int]:
    """Tile j's top-left pixel, as the module docstring of hookscope.viz.features states it."""
    r, c = divmod(j, columns)
    return pad + r * (h + pad), pad + c * (w + pad)


def grey(t: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The documented normalisation, by hand: round(255 * (v - lo) / (hi - lo))."""
    return np.clip(np.rint(255 * (t - lo) / (hi - lo)), 0, 255)


class ConvThenPartialReLU(nn.Module):
    """A conv whose first ``k`` output channels an in-place ReLU rewrites after the conv returned."""

    def __init__(self, k: int = 3, channels: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        out[:, : self.k].relu_()
        return out.mean((2, 3))


class Tokens(nn.Module):
    """A ViT-like body: a class token and a 4 x 3 grid of 5-dim tokens, then a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 5)
        self.block = nn.Identity()
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x.flatten(2).transpose(1, 2))  # B x (h*w) x 5
        t = torch.cat([t.mean(1, keepdim=True), t], 1)
        return self.head(self.block(t)[:, 0])


class ChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(3)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(x.permute(0, 2, 3, 1)))


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, 7, 9, generator=torch.Generator().manual_seed(3))


# --- collecting -------------------------------------------------------------------------------------------
def test_maps_are_the_true_conv_output_despite_the_in_place_relu(x):
    net = ConvThenPartialReLU().train()
    res = feature_maps(net, x, layers="conv")
    expected = nn.functional.conv2d(x, net.conv.weight, net.conv.bias, padding=1)
    assert res.maps.dtype == torch.float32 and res.maps.device.type == "cpu" and not res.maps.requires_grad
    assert torch.allclose(res.maps, expected, atol=1e-6)
    assert bool((res.maps[:, :3] < 0).any())  # what the ReLU rewrote afterwards is still negative here
    assert res.layer == "conv" and res.layout == "BCHW" and res.output_shape == (2, 6, 7, 9)
    assert net.training and all(m.training for m in net.modules())  # run in eval, flags put back
    assert no_hooks(net)


def test_rows_are_each_channels_statistics_by_hand():
    maps = torch.tensor([[[[0.0, 2.0], [4.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]],
                         [[[6.0, 0.0], [0.0, 0.0]], [[-1.0, 3.0], [1.0, 1.0]]]])
    res = FeatureMaps(maps, "x")
    first = res.rows[0]
    assert (first.channel, first.mean, first.min, first.max, first.zeros, first.image) == (0, 1.5, 0.0, 6.0, 0.625, None)
    assert first.std == pytest.approx(np.std([0, 2, 4, 0, 6, 0, 0, 0]))
    one = res.image_rows(1)[1]
    assert (one.mean, one.min, one.max, one.zeros, one.image) == (1.0, -1.0, 3.0, 0.0, 1)
    assert one.std == pytest.approx(np.std([-1, 3, 1, 1]))
    data = json.loads(res.to_json())
    assert data["maps"] == {"shape": [2, 2, 2, 2], "dtype": "float32"} and len(data["per_image"]) == 2
    assert json.loads(res.to_json(maps=True))["maps"] == maps.tolist()
    assert str(res).splitlines()[0] == "x: 2 images, 2 channels of 2x2 (B x C x h x w as it came)"


def test_top_k_picks_the_channels_by_mean_max_or_sum():
    # channel: 0 has the largest max, 2 the largest mean, 1 and 3 tie on mean (lower index first)
    maps = torch.zeros(1, 5, 2, 2)
    maps[0, 0, 0, 0] = 10.0
    maps[0, 1] = 1.0
    maps[0, 2] = 3.0
    maps[0, 3] = torch.tensor([[4.0, 0.0], [0.0, 0.0]])
    maps[0, 4] = float("nan")
    res = FeatureMaps(maps, "x")
    assert res.top(3) == [2, 0, 1]  # means 3, 2.5, 1 (and 3's mean 1 ties with 1: 1 first)
    assert res.top(4) == [2, 0, 1, 3]
    assert res.top(2, by="max") == [0, 3]
    assert res.top(2, by="sum") == res.top(2, by="mean")
    assert res.top(99) == [2, 0, 1, 3, 4]  # all of them, NaN last
    two = FeatureMaps(torch.cat([maps, maps.flip(1)]), "x")
    assert two.top(1, image=1) == [2] and two.top(1, image=0) == [2]
    with pytest.raises(HookscopeError, match="at least 1"):
        res.top(0)
    with pytest.raises(HookscopeError, match="by='median'"):
        res.top(1, by="median")


def test_tokens_and_channels_last_equal_hand_reshapes(x):
    net = Tokens()
    x = torch.randn(2, 3, 4, 3)
    with hookscope.capture(net, "block") as rec:
        net(x)
    t = rec["block"].output  # 2 x 13 x 5
    res = feature_maps(net, x, layers="block", reshape=hookscope.tokens_to_grid(1, grid=(4, 3)))
    assert res.layout == "reshape=" and res.output_shape == (2, 13, 5)
    assert torch.equal(res.maps, t[:, 1:].transpose(1, 2).reshape(2, 5, 4, 3))
    last = ChannelsLast()
    with hookscope.capture(last, "act") as rec:
        last(x)
    res = feature_maps(last, x, layers="act", reshape=hookscope.channels_last)
    assert torch.equal(res.maps, rec["act"].output.permute(0, 3, 1, 2))
    assert no_hooks(net) and no_hooks(last)


@pytest.mark.parametrize("layer, reshape, says", [
    ("block", None, "tokens_to_grid(1)"),  # B x tokens x C
    ("head", None, "no spatial layout"),  # B x C
    ("embed", hookscope.channels_last, "reshape= failed on layer 'embed'"),
    ("block", lambda t: t[:, 1:], "not B x C x h x w"),
])
def test_a_layer_without_spatial_layout_says_which_reshape_helps(layer, reshape, says):
    net = Tokens()
    with pytest.raises(HookscopeError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        feature_maps(net, torch.randn(1, 3, 4, 3), layers=layer, reshape=reshape)
    assert "\n" not in str(e.value)
    assert no_hooks(net)


def test_a_4d_output_of_a_last_dimension_module_is_read_as_channels_last():
    net, x = ChannelsLast(), torch.randn(1, 3, 4, 4)
    res = feature_maps(net, x, layers="norm")  # a LayerNorm over the last dim makes B x h x w x C
    assert res.layout == "BHWC" and torch.equal(res.maps, net.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
    assert feature_maps(net, x, layers="norm", reshape=hookscope.channels_first).maps.shape[1] == 4  # the user decides


def test_layer_errors_are_one_line_and_leave_no_hook(x):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    with pytest.raises(HookscopeError, match="matches 2 layers"):
        feature_maps(net, x, layers=nn.Conv2d)
    shared = nn.ReLU()
    twice = nn.Sequential(nn.Conv2d(3, 4, 3), shared, nn.Conv2d(4, 4, 3), shared)
    with pytest.raises(HookscopeError, match="ran 2 times"):
        feature_maps(twice, x, layers="1")
    with pytest.raises(HookscopeError, match="matches no module"):
        feature_maps(net, x, layers="conv9")
    with pytest.raises(HookscopeError, match="are not a batch"):
        feature_maps(net, [1, 2], layers="0")  # type: ignore[arg-type]
    assert no_hooks(net) and no_hooks(twice)


# --- story 6: the comparison ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_comparison_marks_exactly_the_channels_the_in_place_op_rewrote(x, k):
    net = ConvThenPartialReLU(k=k)
    res = compare_references(net, x, layers="conv")
    assert res.differs.tolist() == [c < k for c in range(6)]  # the conv's output has negatives everywhere
    assert res.changed == list(range(k))
    assert torch.equal(res.stored[:, :k], res.true[:, :k].relu()) and torch.equal(res.stored[:, k:], res.true[:, k:])
    assert [r.differs for r in res.rows] == res.differs.tolist()
    assert no_hooks(net)


@pytest.mark.slow
def test_alexnet_first_conv_in_place_against_out_of_place():
    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.alexnet(weights=None).eval()
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    res = compare_references(net, image, layers="features.0")
    true = nn.functional.conv2d(image, net.features[0].weight, net.features[0].bias, stride=4, padding=2)
    assert torch.allclose(res.true, true, atol=1e-5)
    assert torch.equal(res.stored, res.true.relu())  # what the inplace ReLU left behind
    assert res.differs.tolist() == (true < 0).flatten(2).any(2).any(0).tolist()
    net.features[1].inplace = False
    assert compare_references(net, image, layers="features.0").changed == []
    assert no_hooks(net)


def test_comparison_grid_frames_exactly_the_differing_tiles_in_red(tmp_path, x):
    net = ConvThenPartialReLU(k=2, channels=5)
    res = compare_references(net, x, layers="conv")
    grid = comparison_grid(res, image=1, columns=3, pad=2, gap=8)
    png = read_png(save_feature_maps(grid, tmp_path / "cmp.png"))
    h, w = 7, 9
    half = 2 + 3 * (w + 2)
    assert png.shape == (2 + 2 * (h + 2), 2 * half + 8, 3)
    red = np.all(png == [255, 0, 0], axis=-1)
    lo = float(torch.cat([res.stored[1], res.true[1]]).min())
    hi = float(torch.cat([res.stored[1], res.true[1]]).max())
    lut = (__import__("matplotlib").colormaps["viridis"](np.arange(256))[:, :3] * 255).round()
    for side, maps in ((0, res.stored), (half + 8, res.true)):
        for c in range(5):
            y, x0 = origin(c, 3, h, w, 2)
            x0 += side
            ring = np.concatenate([red[y - 1, x0 - 1:x0 + w + 1], red[y + h, x0 - 1:x0 + w + 1],
                                   red[y - 1:y + h + 1, x0 - 1], red[y - 1:y + h + 1, x0 + w]])
            assert ring.all() == (c < 2) and ring.any() == (c < 2), (side, c)
            tile = png[y:y + h, x0:x0 + w].astype(float)
            want = lut[grey(maps[1, c].double().numpy(), lo, hi).astype(int)]
            assert np.abs(tile - want).max() <= 1
    assert red.sum() == 2 * 2 * (2 * (w + 2) + 2 * h)  # nothing else is red
    zoomed = comparison_grid(res, image=1, columns=3, zoom=3)
    assert zoomed.shape == (2 + 2 * (3 * h + 2), 2 * (2 + 3 * (3 * w + 2)) + 8, 3)
    assert np.array_equal(zoomed[2:2 + 3 * h:3, 2:2 + 3 * w:3], png[2:2 + h, 2:2 + w])  # tile 0, every 3rd pixel


def test_comparison_figure_shows_both_sides_with_the_differing_labels_in_red(tmp_path, x):
    net = ConvThenPartialReLU(k=2, channels=4)
    res = compare_references(net, x, layers="conv")
    fig = plot_reference_comparison(res, picture=torch.rand(3, 7, 9))
    grids = [ax for ax in fig.axes if ax.get_title().startswith(("a hook", "the layer"))]
    assert len(grids) == 2 and all(len(ax.get_images()) == 1 for ax in grids)
    arrays = [np.asarray(ax.get_images()[0].get_array()) for ax in grids]
    assert np.array_equal(np.concatenate([arrays[0], np.full((arrays[0].shape[0], 8, 3), 255), arrays[1]], 1),
                          comparison_grid(res, zoom=5))  # 7 x 9 tiles enlarged to 35 x 45: thin frames
    backs = [t.get_bbox_patch().get_facecolor()[:3] for t in grids[1].texts]
    assert [t.get_text() for t in grids[1].texts] == ["0", "1", "2", "3"]
    assert [b == (1.0, 0.0, 0.0) for b in backs] == [True, True, False, False]
    assert "2 of 4 channels rewritten" in fig.get_suptitle()
    png = read_png(save_feature_maps(fig, tmp_path / "fig.png"))
    assert (np.all(png[..., :3] == [255, 0, 0], axis=-1)).sum() > 50


# --- grids, read back from PNG --------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["shared", "channel"])
@pytest.mark.parametrize("pad", [0, 1, 3])
def test_grid_tiles_are_the_captured_channels_after_the_documented_normalisation(tmp_path, x, scale, pad):
    net = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(inplace=True))
    with hookscope.capture(net, "0") as rec:
        net(x)
    true = rec["0"].output[1].double().numpy()  # image 1: 5 x 7 x 9
    grid = feature_grid(feature_maps(net, x, layers="0"), image=1, scale=scale, pad=pad, columns=2)
    png = read_png(save_feature_maps(grid, tmp_path / "g.png"))
    h, w = 7, 9
    assert png.dtype == np.uint8 and png.shape == (pad + 3 * (h + pad), pad + 2 * (w + pad))
    for c in range(5):
        lo, hi = (true.min(), true.max()) if scale == "shared" else (true[c].min(), true[c].max())
        y, x0 = origin(c, 2, h, w, pad)
        assert np.abs(png[y:y + h, x0:x0 + w].astype(int) - grey(true[c], lo, hi)).max() <= 1, c
    if pad:
        gaps = np.ones(png.shape, bool)
        for c in range(5):
            y, x0 = origin(c, 2, h, w, pad)
            gaps[y:y + h, x0:x0 + w] = False
        assert (png[gaps] == 255).all()
    assert no_hooks(net)


def test_top_k_grid_shows_the_k_channels_largest_first(x):
    maps = torch.zeros(1, 6, 3, 3)
    for c, v in enumerate([1.0, 5.0, 2.0, 6.0, 0.0, 3.0]):
        maps[0, c] = v
        maps[0, c, 0, 0] = -1.0  # each tile spans [-1, v]: its own min and max
    grid = feature_grid(maps, top_k=3, scale="channel", pad=1, columns=3)
    assert grid.shape == (5, 13)
    for j in range(3):
        y, x0 = origin(j, 3, 3, 3, 1)
        assert grid[y, x0] == 0 and grid[y + 1, x0 + 1] == 255
    shared = feature_grid(maps, top_k=3, pad=1, columns=3)  # one range [-1, 6]: 6, 5, 3 in that order
    assert [shared[1 + 1, origin(j, 3, 3, 3, 1)[1] + 1] for j in range(3)] == [255, round(255 * 6 / 7),
                                                                              round(255 * 4 / 7)]
    by_channels = feature_grid(maps, channels=[3, 1, 5], pad=1, columns=3)
    assert np.array_equal(by_channels, shared)


def test_mean_max_and_vrange_reductions_by_hand():
    maps = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2)
    mean = feature_grid(maps, image=1, reduce="mean", pad=0)
    hand = maps[1].mean(0).numpy()
    assert np.array_equal(mean, grey(hand, hand.min(), hand.max()))
    chosen_max = feature_grid(maps, channels=[0, 1], reduce="max", pad=0)
    hand = maps[0, :2].amax(0).numpy()
    assert np.array_equal(chosen_max, grey(hand, hand.min(), hand.max()))
    fixed = feature_grid(maps, channels=[0], vrange=(0.0, 6.0), pad=0)
    assert fixed.tolist() == [[0, 42], [85, 128]]
    constant = feature_grid(torch.ones(1, 2, 2, 2), scale="channel", pad=0, columns=2)
    assert (constant == 0).all()


def test_pca_gives_three_channels_the_principal_components_by_hand():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 6, 5, generator=g)
    maps = (torch.randn(8, 3, generator=g) @ base.flatten(1)).view(1, 8, 6, 5) + 0.01 * torch.randn(1, 8, 6, 5, generator=g)
    rgb = feature_grid(maps, reduce="pca", pad=0)
    assert rgb.shape == (6, 5, 3) and rgb.dtype == np.uint8
    x = maps[0].double().flatten(1).T.numpy()
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = [x @ vt[i] * (1 if vt[i].sum() >= 0 else -1) for i in range(3)]
    lo, hi = comps[0].min(), comps[0].max()  # one range for all three: the first component's
    for i in range(3):
        assert np.abs(rgb[..., i].astype(int) - grey(comps[i], lo, hi).reshape(6, 5)).max() <= 1
    two = feature_grid(torch.randn(1, 2, 4, 4), reduce="pca", pad=0)
    assert (two[..., 2] == 0).all()  # two channels have two components: blue stays 0


def test_colormap_grid_is_the_grey_grid_through_the_colormap():
    maps = torch.randn(1, 4, 3, 3)
    grey_grid = feature_grid(maps)
    lut = (__import__("matplotlib").colormaps["magma"](np.arange(256))[:, :3] * 255).round().astype(np.uint8)
    coloured = feature_grid(maps, colormap="magma")
    tiles = grey_grid != 255
    tiles[0, :] = tiles[:, 0] = False  # the gaps are white in both: compare tile pixels
    assert np.array_equal(coloured[tiles], lut[grey_grid[tiles]])


# --- figures -------------------------------------------------------------------------------------------
def test_figure_draws_each_image_as_one_array_equal_to_the_grid(tmp_path, x):
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(inplace=True))
    res = feature_maps(net, x, layers="0")
    fig = plot_feature_maps(res, picture=x.sigmoid(), top_k=4)
    grids = [ax for ax in fig.axes if ax.texts]
    assert len(grids) == 2  # a row per image
    assert all(len(ax.get_images()) == 1 for ax in grids)
    chosen = res.top(4)
    shown = res.maps[:, chosen]
    shared = (float(shown.min()), float(shown.max()))  # one range over every tile shown, in every row
    for i, ax in enumerate(grids):
        want = feature_grid(res, image=i, channels=chosen, vrange=shared, colormap="viridis")
        assert np.array_equal(np.asarray(ax.get_images()[0].get_array()), want)
        assert [t.get_text() for t in ax.texts] == [str(c) for c in chosen]
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    png = read_png(save_feature_maps(fig, tmp_path / "f.png"))
    assert png.shape[0] > 100 and png[..., :3].std() > 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]  # no temporary file left


def test_channel_scale_has_no_colour_bar_and_many_channels_are_labelled_by_row():
    fig = plot_feature_maps(torch.randn(1, 100, 4, 4), scale="channel")
    assert not any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in range(0, 100, 10)]
    assert "each tile scaled to its own min-max" in fig.get_suptitle()


def test_overlay_blends_the_upsampled_tile_over_the_picture():
    maps = torch.zeros(1, 1, 2, 2)
    maps[0, 0, :, 1] = 1.0
    picture = torch.full((3, 4, 4), 0.5)
    fig = plot_feature_maps(maps, picture=picture, overlay_alpha=1.0, colormap="gray", scale="channel")
    tile = np.asarray(fig.axes[0].get_images()[0].get_array())[1:5, 1:5, 0]  # pad 1
    # [0, 1] upsampled bilinearly to 4 columns: 0, 0.25, 0.75, 1
    assert tile[0].tolist() == [0, 64, 191, 255]
    half = plot_feature_maps(maps, picture=picture, overlay_alpha=0.0)
    assert (np.asarray(half.axes[0].get_images()[0].get_array())[1:5, 1:5] == 128).all()
    pca = plot_feature_maps(torch.randn(1, 5, 3, 3), picture=picture, reduce="pca", overlay_alpha=0.5)
    assert "PCA of 5 channels" in pca.get_suptitle()


@pytest.mark.parametrize("kw, says", [
    ({"channels": [6]}, "channel 6 is out of range: layer 'maps' has 6 channels, 0 to 5"),
    ({"channels": [-1]}, "channel -1 is out of range"),
    ({"channels": []}, "channels= is empty"),
    ({"channels": [1], "top_k": 2}, "either channels= or top_k="),
    ({"top_k": 0}, "at least 1"),
    ({"scale": "shard"}, "scale='shard' is not one of shared, channel.*Did you mean 'shared'"),
    ({"reduce": "sum"}, "reduce='sum' is not one of mean, max, pca"),
    ({"image": 2}, "image=2 is out of range"),
    ({"columns": 0}, "columns=0"),
    ({"colormap": "viridiss"}, "not a matplotlib colormap.*viridis"),
])
def test_grid_errors_are_one_line(kw, says):
    with pytest.raises(HookscopeError, match=says) as e:
        feature_grid(torch.randn(2, 6, 3, 3), **kw)
    assert "\n" not in str(e.value)


def test_figure_and_saving_errors(tmp_path):
    maps = torch.rand(1, 2, 3, 3)
    with pytest.raises(HookscopeError, match="pass picture= too"):
        plot_feature_maps(maps, overlay_alpha=0.5)
    with pytest.raises(HookscopeError, match=r"not \[0, 1\]"):
        plot_feature_maps(maps, picture=torch.full((3, 4, 4), 2.0))
    with pytest.raises(HookscopeError, match="between 0"):
        plot_feature_maps(maps, picture=torch.rand(3, 4, 4), overlay_alpha=1.5)
    with pytest.raises(HookscopeError, match="are not feature maps"):
        feature_grid(torch.rand(3, 3))
    with pytest.raises(HookscopeError, match="does not exist"):
        save_feature_maps(feature_grid(maps), tmp_path / "missing" / "g.png")
    with pytest.raises(HookscopeError, match="it is a folder"):
        save_feature_maps(feature_grid(maps), tmp_path)
    with pytest.raises(HookscopeError, match="at least 2"):
        comparison_grid(compare_references(nn.Conv2d(3, 2, 1), torch.randn(1, 3, 2, 2), layers=""), pad=1)


@pytest.mark.parametrize("size", [7, 28])
def test_a_512_channel_layer_renders_as_one_mosaic(tmp_path, size):
    """512 channels are one image artist, not 512 axes (what makes it fast: bench/bench_features.py)."""
    res = FeatureMaps(torch.randn(1, 512, size, size, generator=torch.Generator().manual_seed(0)), "layer4")
    fig = plot_feature_maps(res)
    assert sum(len(ax.get_images()) for ax in fig.axes) == 1 and len(fig.axes) <= 2
    save_feature_maps(fig, tmp_path / "l4.png")
    assert Image.open(tmp_path / "l4.png").size[0] > 0


def test_a_figure_draws_at_most_16_images():
    with pytest.raises(HookscopeError, match="images= gives 17 images; a figure draws 1 to 16"):
        plot_feature_maps(torch.rand(17, 2, 3, 3))
    fig = plot_feature_maps(torch.rand(17, 2, 3, 3), images=[0, 16])
    assert [ax.get_title() for ax in fig.axes if ax.get_images()] == ["image 0", "image 16"]


# --- the caller's tensors: the model gets its own copy -------------------------------------------------------
def test_a_model_that_writes_into_its_inputs_changes_neither_the_callers_tensors_nor_the_maps():
    from helpers import Writer

    model = Writer().eval()
    x, scale = torch.randn(2, 3, 8, 8), torch.full((1,), 3.0)
    kept_x, kept_scale = x.clone(), scale.clone()
    maps = feature_maps(model, x, layers="conv", kwargs={"scale": scale}).maps
    assert torch.equal(x, kept_x) and torch.equal(scale, kept_scale)
    expected = model.conv(kept_x / 2 * (kept_scale * 2))  # what forward computes from the inputs as given
    torch.testing.assert_close(maps, expected, rtol=0, atol=0)
    again = feature_maps(model, x, layers="conv", kwargs={"scale": scale}).maps
    assert torch.equal(again, maps) and no_hooks(model)
    ref = compare_references(model, x, layers="conv", kwargs={"scale": scale})
    assert torch.equal(ref.true, maps) and torch.equal(x, kept_x) and torch.equal(scale, kept_scale)
