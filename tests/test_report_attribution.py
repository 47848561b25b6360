"""The report's input attribution section, without the demo: signed maps on a diverging colormap centred on
zero, absolute ones on a sequential one; a method the model cannot take is left out and said; unknown
methods are refused before any work; ``attributions=()`` leaves the section out.

The section on the demo report (its numbers, its pictures, its tabs in a browser) is tested in
``test_report.py``, which builds that report once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import no_hooks
from hookscope.analysis.attribution import Attributions
from hookscope.errors import HookscopeError
from hookscope.report import build_report
from hookscope.report.attribution import _figure, attribution_section, shown
from hookscope.report.subject import Subject


def _result(method: str, maps: torch.Tensor) -> Attributions:
    return Attributions(maps=maps, method=method, target=torch.zeros(maps.shape[0], dtype=torch.long),
                        scores=torch.zeros(maps.shape[0]))


MAPS = torch.tensor([[[[1.0, -3.0], [0.5, 0.0]], [[1.0, 1.0], [0.0, 0.0]]]])  # 1 image, 2 channels, 2 x 2


def test_signed_maps_are_summed_with_their_sign_and_absolute_ones_as_sizes():
    assert shown(_result("integrated_gradients", MAPS)).tolist() == [[[2.0, -2.0], [0.5, 0.0]]]
    assert shown(_result("saliency", MAPS)).tolist() == [[[2.0, 4.0], [0.5, 0.0]]]


def test_a_signed_map_is_drawn_red_and_blue_around_zero_an_absolute_one_from_zero_up():
    fig = _figure(torch.rand(3, 2, 2), [_result("integrated_gradients", MAPS), _result("saliency", MAPS)], 0)
    signed, size = fig.axes[1].images[0], fig.axes[2].images[0]
    assert signed.get_cmap().name == "RdBu_r" and signed.get_clim() == (-2.0, 2.0)
    assert size.get_cmap().name == "inferno" and size.get_clim() == (0.0, 4.0)
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["input", "integrated_gradients", "saliency"]


def _flat() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3)).eval()


def test_a_method_the_model_cannot_take_is_left_out_and_said(tmp_path: Path):
    net = _flat()
    s = Subject(net, torch.rand(2, 3, 4, 4), tmp_path)
    sec = attribution_section(s, ["saliency", "guided_gradcam"])
    assert list(sec.data["methods"]) == ["saliency"]
    assert "no nn.Conv2d" in sec.data["skipped"]["guided_gradcam"]
    assert sec.facts[0][0] == "guided_gradcam" and sec.facts[0][1].startswith("not drawn: ")
    assert (tmp_path / "img" / "attribution_1.png").is_file() and no_hooks(net)


def test_an_unknown_method_is_refused_before_any_work(tmp_path: Path):
    with pytest.raises(HookscopeError, match="unknown attribution method 'integrated_gradient'; choose from") as e:
        build_report(_flat(), torch.rand(1, 3, 4, 4), tmp_path / "r", methods=(), attributions=["integrated_gradient"])
    assert "\n" not in str(e.value) and not (tmp_path / "r").exists()


def test_no_attributions_no_section(tmp_path: Path):
    path = build_report(_flat(), torch.rand(1, 3, 4, 4), tmp_path / "r", methods=(), attributions=())
    doc = json.loads((path / "report.json").read_text())
    assert "attribution" not in doc["sections"] and 'id="attribution"' not in (path / "index.html").read_text()
