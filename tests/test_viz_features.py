"""The feature-map pictures (hookscope.viz.features), each case pinned by the values it must draw.

Pictures are read back (arrays, or PNGs through Pillow) and compared pixel by pixel with what the
docstrings of hookscope.viz.features state.
"""

from __future__ import annotations

import math
import stat
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from hookscope import HookscopeError
from hookscope.analysis.features import FeatureMaps, ReferenceComparison, compare_references
from hookscope.cli import main
from hookscope.viz.features import (comparison_grid, feature_grid, plot_feature_maps, plot_reference_comparison,
                                    save_feature_maps)

from helpers import no_hooks

NAN, INF = float("nan"), float("inf")
MAGENTA, CYAN, BLUE, RED = [255, 0, 255], [0, 255, 255], [0, 0, 255], [255, 0, 0]


def read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def origin(j: int, columns: int, h: int, w: int, pad: int) -> tuple[int, int]:
    r, c = divmod(j, columns)
    return pad + r * (h + pad), pad + c * (w + pad)


def ring(mask: np.ndarray, y: int, x: int, h: int, w: int) -> np.ndarray:
    """The 1-pixel ring just outside the h x w tile at (y, x)."""
    return np.concatenate([mask[y - 1, x - 1:x + w + 1], mask[y + h, x - 1:x + w + 1],
                           mask[y - 1:y + h + 1, x - 1], mask[y - 1:y + h + 1, x + w]])


def is_red(a: np.ndarray) -> np.ndarray:
    return np.all(a[..., :3] == RED, axis=-1)


class FirstImageOnly(nn.Module):
    """An in-place clamp after the conv that rewrites channels 0 and 1 of image 0 only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y[0, :2].clamp_(min=0)
        return y.sum()


# --- 2: a batch's picture of image i frames only what differs in image i -------------------------------------
def test_the_comparison_of_image_i_frames_only_the_channels_rewritten_in_image_i():
    net = FirstImageOnly().eval()
    c = compare_references(net, torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)), layers="conv")
    assert c.changed == [0, 1] and c.differs_by_image.tolist() == [[True, True, False, False], [False] * 4]
    h = w = 6
    for image, framed in ((0, [0, 1]), (1, [])):
        grid = comparison_grid(c, image=image, columns=2, pad=2, gap=0)
        red = is_red(grid)
        for ch in range(4):
            y, x = origin(ch, 2, h, w, 2)
            for side in (0, 2 + 2 * (w + 2)):
                assert ring(red, y, x + side, h, w).all() == (ch in framed), (image, ch)
        assert red.sum() == len(framed) * 2 * (2 * (w + 2) + 2 * h)  # nothing else is red
    fig = plot_reference_comparison(c, image=1)
    backs = [t.get_bbox_patch().get_facecolor()[:3] for ax in fig.axes[:2] for t in ax.texts]
    assert len(backs) == 8 and all(b == (0.0, 0.0, 0.0) for b in backs)
    assert "in image 1: 0 (none framed)" in " ".join(fig.get_suptitle().split())
    assert not fig.axes[0].collections  # no frame drawn over the picture either
    assert no_hooks(net)


MODELS = textwrap.dedent("""
    import pathlib
    import torch
    from torch import nn


    class FirstImageOnly(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = self.conv(x)
            y[0, :2].clamp_(min=0)
            return y.sum()


    def marked():  # builds the model and leaves a mark: the model was loaded
        pathlib.Path(__file__).with_name("built").write_text("yes")
        return FirstImageOnly()
""")


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return str(path)


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hookscope features: error: "), err
    return err[0]


def test_the_cli_writes_one_comparison_per_image_each_framing_its_own_channels(tmp_path, capsys, models):
    out = tmp_path / "cmp.png"
    assert main(["features", f"{models}:FirstImageOnly", "--input", "2x3x8x8", "--layer", "conv",
                 "--compare-references", "--out", str(out)]) == 0
    first, second = read_png(tmp_path / "cmp_0.png"), read_png(tmp_path / "cmp_1.png")
    assert is_red(first).sum() > 50 and is_red(second).sum() == 0


# --- 3: frames that survive when a large grid is shrunk to the figure -------------------------------------------
@pytest.mark.parametrize("colormap", ["gray", "viridis"])
def test_every_framed_channel_of_2048_shows_red_in_the_saved_figure(tmp_path, colormap):
    count, h = 2048, 7
    t = torch.rand(1, count, h, h, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.25
    marked = torch.randperm(count, generator=torch.Generator().manual_seed(1))[:60]
    s = t.clone()
    s[0, marked] += 0.01
    differs = torch.zeros(count, dtype=torch.bool)
    differs[marked] = True
    fig = plot_reference_comparison(ReferenceComparison(s, t, differs, "x"), colormap=colormap)
    png = read_png(save_feature_maps(fig, tmp_path / "big.png"))
    red = (png[..., 0] > 180) & (png[..., 1] < 90) & (png[..., 2] < 90)
    tile, pad, cols = 5 * h, 2, math.ceil(math.sqrt(count))  # 7 x 7 tiles enlarged 5 times
    near = np.zeros_like(red)
    for ax in fig.axes[:2]:
        box = ax.get_window_extent()  # figure pixels, origin at the bottom left
        gh, gw = ax.get_images()[0].get_array().shape[:2]
        assert box.width < gw / 2  # the grid is shrunk more than twice: a 1-pixel ring would vanish

        def to_png(y: float, x: float) -> tuple[int, int]:
            return round(png.shape[0] - (box.y1 - y / gh * box.height)), round(box.x0 + x / gw * box.width)

        for ch in marked.tolist():
            y, x = origin(ch, cols, tile, tile, pad)
            (r0, c0), (r1, c1) = to_png(y - 1.5, x - 1.5), to_png(y + tile + 0.5, x + tile + 0.5)
            assert red[r0 - 1:r1 + 2, c0 - 1:c1 + 2].any(), (ax.get_title(), ch)
            near[r0 - 2:r1 + 3, c0 - 2:c1 + 3] = True
    assert not (red & ~near).any()  # red only around the marked tiles


# --- 4: NaN and Inf in colours of their own ------------------------------------------------------------------
def test_grey_grid_rule_for_non_finite_values_and_ranges_that_ignore_them():
    maps = torch.tensor([[[[0.0, 1.0], [NAN, INF]], [[2.0, -INF], [3.0, 4.0]]]])
    g = feature_grid(maps, pad=0, columns=2)  # shared range: the finite 0 to 4
    assert g.tolist() == [[0, 64, 128, 0], [0, 255, 191, 255]]
    per = feature_grid(maps, scale="channel", pad=0, columns=2)
    assert per.tolist() == [[0, 255, 0, 0], [0, 255, 128, 255]]


def test_non_finite_values_get_fixed_colours_in_coloured_grids_and_figures(tmp_path):
    maps = torch.linspace(0, 1, 64).view(1, 4, 4, 4).clone()
    maps[0, 0, :2], maps[0, 1, :2], maps[0, 2, :2] = NAN, INF, -INF
    coloured = feature_grid(maps, colormap="viridis", pad=1, columns=2)
    fig = plot_feature_maps(maps)
    drawn = np.asarray(fig.axes[0].get_images()[0].get_array())
    assert np.array_equal(drawn, coloured)
    for ch, colour in enumerate([MAGENTA, CYAN, BLUE]):
        y, x = origin(ch, 2, 4, 4, 1)
        assert (coloured[y:y + 2, x:x + 4] == colour).all(), ch
        assert not (np.all(coloured[y + 2:y + 4, x:x + 4] == colour, axis=-1)).any()
    lut = (__import__("matplotlib").colormaps["viridis"](np.arange(256))[:, :3] * 255).round()
    y, x = origin(3, 2, 4, 4, 1)
    finite = maps[0, :, 2:][torch.isfinite(maps[0, :, 2:])]
    lo, hi = float(finite.min()), float(maps.nan_to_num(posinf=0).max())
    want = lut[np.rint(255 * (maps[0, 3].numpy() - lo) / (hi - lo)).astype(int)]
    assert np.abs(coloured[y:y + 4, x:x + 4] - want).max() <= 1  # the ranges ignore NaN and Inf
    title = " ".join(fig.get_suptitle().split())
    assert "24 NaN/Inf values (NaN magenta, +Inf cyan, -Inf blue)" in title
    png = read_png(save_feature_maps(fig, tmp_path / "nan.png"))
    assert all(np.all(png == colour, axis=-1).sum() > 100 for colour in (MAGENTA, CYAN, BLUE))
    assert "NaN" not in plot_feature_maps(maps[:, 3:]).get_suptitle()


def test_non_finite_values_in_overlays_pca_and_comparisons():
    maps = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    maps[0, 1, 0, 0] = NAN
    maps[0, 2, 3, 3] = INF
    over = plot_feature_maps(maps, picture=torch.full((3, 4, 4), 0.5), overlay_alpha=1.0, channels=[1])
    tile = np.asarray(over.axes[0].get_images()[0].get_array())[1:5, 1:5]
    assert tile[0, 0].tolist() == MAGENTA and not np.all(tile[1:] == MAGENTA, axis=-1).any()
    pca = feature_grid(maps, reduce="pca", pad=0)
    assert pca[0, 0].tolist() == MAGENTA and pca[3, 3].tolist() == CYAN
    good = torch.isfinite(maps[0]).all(0).flatten()
    hand = feature_grid(maps[0].flatten(1)[:, good].view(1, 3, 2, 7), reduce="pca", pad=0)  # the fit: 14 pixels
    assert np.array_equal(pca.reshape(16, 3)[good.numpy()], hand.reshape(14, 3))
    true = torch.zeros(1, 2, 3, 3)
    stored = true.clone()
    stored[0, 0, 1, 1] = NAN
    c = ReferenceComparison(stored, true, torch.tensor([True, False]), "x")
    grid = comparison_grid(c, pad=2, gap=0, columns=2)
    assert grid[2 + 1, 2 + 1].tolist() == MAGENTA and grid[2 + 1, 2 + 2 * (3 + 2) + 1].tolist() != MAGENTA
    assert "1 NaN/Inf value (NaN magenta" in " ".join(plot_reference_comparison(c).get_suptitle().split())


# --- 6: PCA on one range, its title in full --------------------------------------------------------------------
def test_pca_components_share_the_first_ones_range_so_a_weak_one_looks_flat():
    a = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0)) * 1000
    noise = 1e-3 * torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    rgb = feature_grid(torch.cat([a, 2 * a, 3 * a + noise], 1), reduce="pca", pad=0).astype(int)
    assert (rgb[..., 0].min(), rgb[..., 0].max()) == (0, 255)
    assert np.ptp(rgb[..., 1]) <= 1 and np.ptp(rgb[..., 2]) <= 1  # ~0% of the variance: flat, not stretched
    # component 1 is centred, so where it is 0 is R's mean: the level a flat component sits at
    assert abs(np.median(rgb[..., 1]) - rgb[..., 0].mean()) <= 1.5


@pytest.mark.parametrize("channels, says", [
    (1, "PCA of 1 channel: R = component 1 (100% of the variance)"),
    (2, "PCA of 2 channels: R, G = components 1-2 ("),
    (3, "PCA of 3 channels: R, G, B = components 1-3 ("),
])
def test_pca_title_names_the_components_there_are_and_fits_the_figure(channels, says):
    fig = plot_feature_maps(torch.randn(1, channels, 5, 5, generator=torch.Generator().manual_seed(0)),
                            reduce="pca")
    title = " ".join(fig.get_suptitle().split())
    assert says in title and "of the variance" in title
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()  # type: ignore[union-attr]
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    under = min(ax.get_window_extent().y1 for ax in fig.axes)  # the title stays above the grid
    assert box.y0 >= under
    assert "1 channels" not in title


def test_flat_pca_says_it_has_no_variance():
    assert "no variance" in plot_feature_maps(torch.ones(1, 3, 4, 4), reduce="pca").get_suptitle().replace("\n", " ")


# --- 8 and 9: vrange checked; a shared scale over values near the float32 limit -----------------------------
@pytest.mark.parametrize("kw, says", [
    ({"vrange": (20000.0, 0.0)}, r"vrange=\(20000.0, 0.0\) is empty or reversed: low must be below high"),
    ({"vrange": (1.0, 1.0)}, "is empty or reversed"),
    ({"vrange": (0.0, 1.0), "scale": "channel"}, "vrange= sets the one range of scale='shared'"),
    ({"vrange": (0.0, 1.0), "reduce": "pca"}, "does not apply to reduce='pca'"),
    ({"vrange": (0.0, NAN)}, "give two finite numbers"),
])
def test_vrange_mistakes_are_one_line_errors(kw, says):
    with pytest.raises(HookscopeError, match=says) as e:
        feature_grid(torch.rand(1, 2, 3, 3), **kw)
    assert "\n" not in str(e.value)


def test_a_shared_scale_over_values_near_the_float32_limit():
    maps = torch.tensor([[[[-3e38, 0.0], [1.5e38, 3e38]]]])
    assert feature_grid(maps, pad=0).tolist() == [[0, 128], [191, 255]]
    assert feature_grid(maps, pad=0, vrange=(-3e38, 3e38)).tolist() == [[0, 128], [191, 255]]
    fig = plot_feature_maps(torch.cat([maps, -maps], 1))
    drawn = np.asarray(fig.axes[0].get_images()[0].get_array())
    assert len({tuple(p) for p in drawn[1:3, 1:3].reshape(4, 3).tolist()}) == 4  # four levels, not one


# --- 12: maps of one pixel ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("draw", [feature_grid, plot_feature_maps, comparison_grid, plot_reference_comparison])
def test_one_pixel_maps_are_refused_in_one_line(draw):
    maps = torch.randn(2, 8, 1, 1)
    given = FeatureMaps(maps, "pool") if draw in (feature_grid, plot_feature_maps) else \
        ReferenceComparison(maps.relu(), maps, torch.ones(8, dtype=torch.bool), "pool")
    with pytest.raises(HookscopeError, match="'pool' gives 1x1 maps: no spatial extent to draw.*pick an earlier") as e:
        draw(given)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("extra", [[], ["--compare-references"]])
def test_the_cli_refuses_a_pooled_layer_and_writes_nothing(tmp_path, capsys, extra):
    out = tmp_path / "p.png"
    assert main(["features", "demo", "--layer", "pool", "--out", str(out), *extra]) == 2
    line = one_error(capsys)
    assert "layer 'pool' gives 64 channels of 1x1: no spatial extent to draw" in line
    assert "pick an earlier layer" in line and not out.exists()


def test_the_cli_says_what_it_can_do_for_a_b_x_c_layer(tmp_path, capsys):
    assert main(["features", "tiny", "--layer", "fc", "--out", str(tmp_path / "f.png")]) == 2
    line = one_error(capsys)
    assert "layer 'fc' gives 1x10: no spatial layout" in line and "no h x w to draw" in line
    assert "pick an earlier layer" in line and "hookscope layers MODEL" in line and "lambda" not in line


# --- 7: --out never replaces a file silently -----------------------------------------------------------------------
def test_an_existing_out_file_is_refused_before_the_model_is_loaded(tmp_path, capsys, models):
    out = tmp_path / "g.png"
    out.write_bytes(b"mine")
    args = ["features", f"{models}:marked", "--input", "1x3x8x8", "--layer", "conv", "--out", str(out)]
    assert main(args) == 2
    assert f"--out {out} exists; pass --overwrite to replace it" in one_error(capsys)
    assert out.read_bytes() == b"mine" and not (tmp_path / "built").exists()
    assert main([*args, "--overwrite"]) == 0
    assert read_png(out).shape[0] > 50 and (tmp_path / "built").exists()


def test_a_batch_comparison_refuses_if_any_of_its_files_exists(tmp_path, capsys, models):
    (tmp_path / "c_1.png").write_bytes(b"mine")
    args = ["features", f"{models}:marked", "--input", "2x3x8x8", "--layer", "conv", "--compare-references",
            "--out", str(tmp_path / "c.png")]
    assert main(args) == 2
    assert f"writes {tmp_path / 'c_1.png'}, which exists" in one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c_1.png", "models.py"]  # nothing written, not built
    assert main([*args, "--overwrite"]) == 0
    assert read_png(tmp_path / "c_0.png").shape[0] > 50 and read_png(tmp_path / "c_1.png").shape[0] > 50


# --- polish ---------------------------------------------------------------------------------------------------
def test_saved_pictures_are_readable_by_all(tmp_path):
    for picture in (feature_grid(torch.rand(1, 2, 3, 3)), plot_feature_maps(torch.rand(1, 2, 3, 3))):
        path = save_feature_maps(picture, tmp_path / "p.png")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_one_channel_headlines_say_channel():
    fig = plot_feature_maps(torch.rand(1, 1, 3, 3))
    assert fig.get_suptitle().startswith("maps: 1 channel, 3x3;")
    assert "mean of 1 channel" in plot_feature_maps(torch.rand(1, 1, 3, 3), reduce="mean").get_suptitle()
