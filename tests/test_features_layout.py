"""Feature maps read a 4-D layer's layout as CAM does: told by the modules that make and read it, never guessed."""

from __future__ import annotations

import pytest
import torch
import torchvision
from helpers import no_hooks
from torch import nn

import hookscope
from hookscope.errors import HookscopeError


@pytest.mark.parametrize("layer", ["features.0", "features.1", "features.3"])
def test_swin_stages_are_channels_last_and_permuted(layer: str) -> None:
    model = torchvision.models.swin_t().eval()  # weights=None: random, built from code
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    res = hookscope.feature_maps(model, x, layers=layer)
    with hookscope.capture(model, layer) as rec:
        model(x)
    assert res.layout == "BHWC"
    assert torch.equal(res.maps, rec[layer].output.permute(0, 3, 1, 2).float())
    assert no_hooks(model)


def test_the_comparison_reads_the_same_layout() -> None:
    model = torchvision.models.swin_t().eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    cmp = hookscope.compare_references(model, x, layers="features.1")
    assert cmp.layout == "BHWC" and cmp.true.shape == (1, 96, 16, 16) and cmp.changed == []


class Blocks(nn.Module):
    """A block whose own type says nothing: a Linear inside makes B x h x w x C, a Linear reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 5), nn.GELU())
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x.permute(0, 2, 3, 1))).mean((1, 2))


def test_a_block_ending_in_a_linear_is_channels_last() -> None:
    net, x = Blocks(), torch.randn(2, 3, 6, 4)
    res = hookscope.feature_maps(net, x, layers="block")
    assert res.layout == "BHWC" and torch.equal(res.maps, net.block(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


class Undecided(nn.Module):
    """Nothing around the layer tells its layout, and both readings fit the square input."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x * 2).sum()


def test_a_layout_nothing_decides_is_refused_with_the_fix() -> None:
    net = Undecided()
    with pytest.raises(HookscopeError, match=r"B x C x h x w or B x h x w x C.*channels_last.*--layout") as e:
        hookscope.feature_maps(net, torch.randn(1, 8, 8, 8), layers="act")
    assert "\n" not in str(e.value) and no_hooks(net)
    res = hookscope.feature_maps(net, torch.randn(1, 8, 8, 8), layers="act", reshape=hookscope.channels_first)
    assert res.maps.shape == (1, 8, 8, 8)


def test_a_conv_net_is_channels_first_as_before() -> None:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3))
    x = torch.randn(1, 3, 10, 10)
    res = hookscope.feature_maps(net, x, layers="1")
    assert res.layout == "BCHW" and torch.equal(res.maps, net[1](net[0](x)))
