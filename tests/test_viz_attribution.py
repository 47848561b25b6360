"""Pictures of attributions (``hookscope.viz.attribution``): the PNGs written, read back, and the colour of
pixels at known places: red for a positive score, blue for a negative one, white for 0 on signed maps;
dark for 0 and bright for the largest magnitude on the others."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hookscope
from hookscope.analysis.attribution import TokenAttributions, TokenRow
from hookscope.viz import save_figure
from hookscope.viz.attribution import is_signed, plot_image_attribution, plot_token_attribution

pytest.importorskip("matplotlib")


def _png(fig, path: Path) -> np.ndarray:
    save_figure(fig, path)
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def _at(fig, ax, pixels: np.ndarray, x: float, y: float) -> np.ndarray:
    """The colour of the PNG pixel where the data point ``(x, y)`` of ``ax`` was drawn."""
    dx, dy = ax.transData.transform((x, y))
    assert pixels.shape[0] == round(fig.get_figheight() * fig.dpi)
    return pixels[int(pixels.shape[0] - dy), int(dx)]


def _red(c: np.ndarray) -> bool:
    return c[0] > 200 and c[1] < 60 and c[2] < 60


def _blue(c: np.ndarray) -> bool:
    return c[2] > 200 and c[0] < 60 and c[1] < 60


def _white(c: np.ndarray) -> bool:
    return bool((c > 235).all())


def _halves() -> torch.Tensor:
    """One 3 x 8 x 8 map: columns 0-2 +1 (over channels: +3), 3-4 zero, 5-7 -1 (-3)."""
    m = torch.zeros(1, 3, 8, 8)
    m[..., :3], m[..., 5:] = 1.0, -1.0
    return m


@pytest.mark.parametrize("method", ["gradient", "input_x_gradient", "integrated_gradients", "smoothgrad"])
def test_a_signed_map_is_red_where_positive_blue_where_negative_white_at_zero(tmp_path, method):
    fig = plot_image_attribution(_halves(), method=method)
    pixels = _png(fig, tmp_path / "map.png")
    ax = fig.axes[0]
    assert _red(_at(fig, ax, pixels, 1, 4)) and _blue(_at(fig, ax, pixels, 6, 4))
    assert _white(_at(fig, ax, pixels, 3.5, 4)) and ax.get_title() == method


@pytest.mark.parametrize("method", ["saliency", "smoothgrad_sq", "vargrad", "guided_backprop"])
def test_a_magnitude_map_is_dark_at_zero_and_bright_at_the_top_whatever_the_sign(tmp_path, method):
    fig = plot_image_attribution(_halves(), method=method)
    pixels = _png(fig, tmp_path / "map.png")
    ax = fig.axes[0]
    positive, negative, zero = (_at(fig, ax, pixels, x, 4) for x in (1, 6, 3.5))
    assert positive.sum() > 500 and (positive == negative).all()  # inferno's top: pale yellow, for |+1| and |-1|
    assert zero.sum() < 40  # inferno's bottom: near black


def test_the_result_of_attribute_with_its_pictures(tmp_path):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 1, 1, bias=False), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    with torch.no_grad():
        net[0].weight.fill_(1.0)
        net[2].weight.zero_()
        net[2].weight[1, :8] = 1.0   # class 1 reads the top two rows of pixels, upwards
        net[2].weight[1, 8:] = -1.0  # and the bottom two, downwards
    x = torch.full((1, 3, 4, 4), 0.5)
    x[0, 1:] = 0.0  # a red picture
    res = hookscope.attribute(net, x, method="input_x_gradient", target=1)
    fig = plot_image_attribution(res, x, titles=["class 1"])
    pixels = _png(fig, tmp_path / "res.png")
    picture, heat = fig.axes[0], fig.axes[1]
    assert _at(fig, picture, pixels, 1.5, 1.5)[0] > 100 and _at(fig, picture, pixels, 1.5, 1.5)[1] < 20
    assert _red(_at(fig, heat, pixels, 1, 0)) and _blue(_at(fig, heat, pixels, 1, 3))
    assert heat.get_title() == "class 1" and picture.get_title() == "input"


def _tokens(method: str) -> TokenAttributions:
    rows = [TokenRow(0, 0, 2, 4, "d", 1.0, None, torch.tensor([1.0, -1.0, 0.0])),
            TokenRow(0, 1, 3, 5, "e", 1.0, None, torch.tensor([-0.5, 1.0, 0.25, 0.5]))]
    return TokenAttributions(rows, [[1, 2, 3, 4, 5]], [["a", "b", "c", "d", "e"]], 3, method, "embed")


def test_a_token_strip_colours_each_token_by_its_score_for_each_row(tmp_path):
    fig = plot_token_attribution(_tokens("integrated_gradients"))
    pixels = _png(fig, tmp_path / "strip.png")
    ax = fig.axes[0]
    corner = (-0.4, -0.4)  # off the cell's centre, where its text is

    def cell(row: int, col: int) -> np.ndarray:
        return _at(fig, ax, pixels, col + corner[0], row + corner[1])

    assert _red(cell(0, 0)) and _blue(cell(0, 1)) and _white(cell(0, 2))
    assert (np.abs(cell(0, 3) - 217) <= 2).all()  # after the token explained: grey
    light_blue = cell(1, 0)  # -0.5 of the row's largest 1: halfway to blue
    assert abs(light_blue[0] - 128) <= 3 and abs(light_blue[1] - 128) <= 3 and light_blue[2] > 250
    assert _red(cell(1, 1))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["-> 'd'", "-> 'e'"]
    assert [t.get_text() for t in ax.texts][:3] == ["a", "b", "c"]


def test_a_saliency_strip_is_drawn_as_magnitudes(tmp_path):
    fig = plot_token_attribution(_tokens("saliency"))
    pixels = _png(fig, tmp_path / "strip.png")
    ax = fig.axes[0]
    top, zero = _at(fig, ax, pixels, -0.4, -0.4), _at(fig, ax, pixels, 1.6, -0.4)
    assert top.sum() > 500 and zero.sum() < 40


def test_a_strip_of_a_real_continuation(tmp_path):
    lm = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
    res = hookscope.attribute_tokens(lm, torch.tensor([[1, 2, 3], [0, 1, 2]]), generate=2, steps=4,
                                     tokenizer=list("vwxyz"))
    fig = plot_token_attribution(res, sample=1)
    assert fig.axes[0].get_images()[0].get_array().shape == (2, 4, 4)
    assert _png(fig, tmp_path / "s.png").shape[1] == round(fig.get_figwidth() * fig.dpi)
    # a continuation given, explained by each token's log-probability: the same strip, row by token written
    given = hookscope.attribute_tokens(lm, torch.tensor([[1, 2, 3]]), continuation=torch.tensor([[1, 2, 3, 4, 0]]),
                                       method="input_x_gradient", tokenizer=list("vwxyz"))
    fig = plot_token_attribution(given)
    assert fig.axes[0].get_images()[0].get_array().shape == (2, 4, 4)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["-> 'z'", "-> 'v'"]


@pytest.mark.parametrize(("draw", "said"), [
    (lambda: plot_image_attribution(torch.zeros(1, 1, 1, 2, 2)), "maps of 1x1x1x2x2 are not images"),
    (lambda: plot_image_attribution(torch.zeros(2, 4, 4), torch.zeros(3, 3, 4, 4)), "2 maps but pictures of shape"),
    (lambda: plot_image_attribution(torch.zeros(2, 4, 4), titles=["a"]), "1 titles for 2 maps"),
    (lambda: plot_token_attribution(_tokens("gradient"), sample=3), "sample=3 is not a sequence of the result"),
])
def test_bad_requests_are_refused_in_one_line(draw, said):
    with pytest.raises(hookscope.HookscopeError) as e:
        draw()
    assert said in str(e.value) and "\n" not in str(e.value)


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(hookscope.HookscopeError, match=r"needs matplotlib, from the viz extra"):
        plot_image_attribution(torch.zeros(2, 2))


def test_which_methods_are_signed():
    assert [is_signed(m) for m in ("integrated-gradients", "smoothgrad", "vargrad", None)] == [True, True, False, True]
