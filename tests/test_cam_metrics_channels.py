"""The faithfulness metrics on attribution maps with channels (``B x C x H x W``): each reduction over the
channels (``reduce=``) ranks the pixels as worked out by hand, for the curves and both pointing games."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookscope
from hookscope.metrics import REDUCTIONS, deletion, energy_pointing_game, insertion, pointing_game

from helpers import no_hooks


class PixelSum(nn.Module):
    """Logit 0 is the sum of every value of the image; logit 1 is 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.flatten(1).sum(1)
        return torch.stack([s, torch.zeros_like(s)], 1)


# one image of 2 x 2 pixels and 3 channels; per pixel (row-major) the three channels' attributions
MAP = torch.tensor([[1.0, 1.0, 1.0],     # pixel 0: abs_sum 3, sum 3, abs_max 1, l2 1.73
                    [-4.0, 0.0, 0.0],    # pixel 1: abs_sum 4, sum -4, abs_max 4, l2 4
                    [2.0, 2.0, -1.0],    # pixel 2: abs_sum 5, sum 3 (tie with 0: row-major), abs_max 2, l2 3
                    [0.5, 0.5, 0.5]]).t().reshape(1, 3, 2, 2)  # pixel 3: 1.5, 1.5, 0.5, 0.87
ORDER = {"abs_sum": [2, 1, 0, 3], "sum": [0, 2, 3, 1], "abs_max": [1, 2, 0, 3], "l2": [1, 2, 0, 3]}
VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0])  # each pixel's value, the same in every channel: 3x to the sum


def _deleted(order: list[int]) -> list[float]:
    left, out = float(VALUES.sum() * 3), []
    out.append(left)
    for p in order:
        left -= float(VALUES[p] * 3)
        out.append(left)
    return out


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_the_deletion_curve_removes_pixels_in_the_order_of_the_reduction(reduce):
    x = VALUES.view(1, 1, 2, 2).expand(1, 3, 2, 2).clone()
    net = PixelSum()
    curve = deletion(net, x, MAP, target=0, steps=4, score="logit", reduce=reduce)
    assert curve.scores[0].tolist() == _deleted(ORDER[reduce])
    grown = insertion(net, x, MAP, target=0, steps=4, score="logit", baseline="zeros", reduce=reduce)
    assert grown.scores[0].tolist() == [30.0 - v for v in _deleted(ORDER[reduce])] and no_hooks(net)


def test_abs_sum_is_the_default_and_a_map_without_channels_is_taken_as_it_is():
    x, net = VALUES.view(1, 1, 2, 2).expand(1, 3, 2, 2).clone(), PixelSum()
    default = deletion(net, x, MAP, target=0, steps=4, score="logit")
    assert default.scores[0].tolist() == _deleted(ORDER["abs_sum"])
    signed = MAP.sum(1)  # B x H x W: no reduction, whatever reduce= says
    for reduce in REDUCTIONS:
        flat = deletion(net, x, signed, target=0, steps=4, score="logit", reduce=reduce)
        assert flat.scores[0].tolist() == _deleted(ORDER["sum"])


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_the_pointing_game_reads_the_peak_of_the_reduction(reduce):
    for pixel in range(4):
        mask = torch.zeros(1, 4, dtype=torch.bool)
        mask[0, pixel] = True
        hit = pointing_game(MAP, mask.view(1, 2, 2), tolerance=0, reduce=reduce)
        assert hit.tolist() == [pixel == ORDER[reduce][0]]


def test_the_energy_inside_the_mask_is_a_share_of_the_reduced_map():
    top = torch.tensor([[[True, True], [False, False]]])  # pixels 0 and 1
    assert energy_pointing_game(MAP, top).tolist() == pytest.approx([(3 + 4) / (3 + 4 + 5 + 1.5)])
    assert energy_pointing_game(MAP, top, reduce="abs_max").tolist() == pytest.approx([(1 + 4) / (1 + 4 + 2 + 0.5)])
    with pytest.raises(hookscope.HookscopeError, match="non-negative"):
        energy_pointing_game(MAP, top, reduce="sum")  # pixel 1 sums to -4


def test_an_attribution_result_is_scored_as_it_comes():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(4, 3)).eval()
    x = torch.rand(2, 3, 8, 8)
    res = hookscope.attribute(net, x, method="integrated_gradients", steps=4)
    curve = deletion(net, x, res.maps, steps=4)
    assert torch.equal(curve.scores, deletion(net, x, res.maps.abs().sum(1), steps=4).scores) and no_hooks(net)


@pytest.mark.parametrize("call", [
    lambda: deletion(PixelSum(), torch.ones(1, 3, 2, 2), MAP, reduce="abssum"),
    lambda: pointing_game(MAP, torch.ones(1, 2, 2), reduce="mean"),
    lambda: energy_pointing_game(MAP, torch.ones(1, 2, 2), reduce=None),  # type: ignore[arg-type]
])
def test_an_unknown_reduction_is_one_line_naming_the_choices(call):
    with pytest.raises(hookscope.HookscopeError, match="is not a reduction over channels.*abs_sum, sum, abs_max, l2") as e:
        call()
    assert "\n" not in str(e.value)


def test_a_map_with_nan_is_refused_before_it_is_reduced():
    bad = MAP.clone()
    bad[0, 2, 1, 1] = float("nan")
    with pytest.raises(hookscope.HookscopeError, match="NaN"):
        pointing_game(bad, torch.ones(1, 2, 2))
