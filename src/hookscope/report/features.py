"""The feature-map section: for each chosen layer and each input drawn, the most active channels as a
grid of labelled tiles beside the input, one colour scale per layer, and a viewer of one channel.

The grids are arrays (:func:`hookscope.viz.features.feature_grid`) written as PNGs, not matplotlib
figures: a few milliseconds each, and their tile geometry is known, so the page labels each tile and
the channel viewer shows one tile of the same picture enlarged.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Sequence

import numpy as np
import torch

from ..analysis.features import FeatureMaps, feature_maps
from ..analysis.summary import Summary
from ..core.text import num
from .html import Section
from .subject import Subject
from .widgets import Axis, Sheet, View, colour_legend, labelled_grid, tile_viewer, view_set

__all__ = ["MAX_IMAGES", "as_pictures", "drawn", "feature_section", "spatial_layers"]

MAX_IMAGES = 8  # images drawn one by one (tabs); the scores cover them all
_TOP = 16  # channels drawn per layer, by mean activation over the images drawn
_PAD = 2
_TILE = 48  # tiles smaller than this many pixels a side are enlarged (nearest) by a whole factor


def spatial_layers(result: Summary, most: int = 4) -> list[str]:
    """Up to ``most`` top-level children with a B x C x h x w output (h, w > 1), spread over the model.

    Example:
        >>> from hookscope import summary
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
        >>> spatial_layers(summary(net, torch.zeros(1, 3, 8, 8)))
        ['0', '1']
    """
    rows = [r for r in result.rows if r.depth == 1 and r.output_shapes]
    names = [r.name for r in rows if len(r.output_shapes[0]) == 4 and min(r.output_shapes[0][-2:]) > 1]
    names = list(dict.fromkeys(names))
    if len(names) <= most:
        return names
    step = (len(names) - 1) / (most - 1)
    return [names[round(i * step)] for i in range(most)]


def drawn(s: Subject) -> int:
    """How many of the inputs are drawn one by one."""
    return min(MAX_IMAGES, int(s.x.shape[0]))


def as_pictures(x: torch.Tensor) -> torch.Tensor:
    """Inputs with no picture given, shown min-max scaled per image (grey when not 3 channels)."""
    img = x if x.shape[1] == 3 else x.mean(dim=1, keepdim=True).expand(-1, 3, -1, -1)
    flat = img.flatten(1)
    lo, hi = flat.min(1).values.view(-1, 1, 1, 1), flat.max(1).values.view(-1, 1, 1, 1)
    return ((img - lo) / (hi - lo).clamp_min(1e-12)).clamp(0, 1)


@functools.lru_cache(maxsize=1)
def _viridis(stops: int = 9) -> tuple[str, ...]:
    """The grids' colormap as CSS colours, for the legend's ramp."""
    import matplotlib

    table = matplotlib.colormaps["viridis"](np.linspace(0, 1, stops))[:, :3]
    return tuple("#" + "".join(f"{round(255 * c):02x}" for c in rgb) for rgb in table)


def _inputs(s: Subject, n: int) -> list[str]:
    """Each drawn input as a PNG (the picture given, else the input scaled): the page's paths."""
    from ..viz.features import save_feature_maps

    pictures = s.pictures if s.pictures is not None else as_pictures(s.x)
    paths = []
    for i in range(n):
        rgb = (pictures[i].detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
        paths.append(s.relative(save_feature_maps(rgb.numpy(), s.image(f"input_{i}"))))
    return paths


def _range(maps: torch.Tensor) -> tuple[float, float] | None:
    """The finite (min, max) of ``maps``: one colour scale for a layer's tiles of every image drawn."""
    finite = maps[torch.isfinite(maps)]
    if not finite.numel():
        return None
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi) if lo < hi else None


def _sheet(s: Subject, fm: FeatureMaps, top: list[int], image: int, name: str,
           vrange: tuple[float, float] | None) -> Sheet:
    """One image's grid of the ``top`` channels, tiles enlarged to at least ``_TILE`` pixels, as a PNG."""
    from ..viz.features import feature_grid, save_feature_maps

    h, w = fm.maps.shape[2:]
    z = max(1, math.ceil(_TILE / max(1, min(h, w))))
    big = fm.maps[image:image + 1, top].repeat_interleave(z, 2).repeat_interleave(z, 3)
    columns = max(1, math.ceil(math.sqrt(len(top))))
    grid = feature_grid(FeatureMaps(big, fm.layer), columns=columns, pad=_PAD, vrange=vrange, colormap="viridis")
    path = s.relative(save_feature_maps(grid, s.image(name)))
    return Sheet(path, grid.shape[0], grid.shape[1], h * z, w * z, _PAD, columns)


def _view(s: Subject, fm: FeatureMaps, top: list[int], index: int, image: int, picture: str,
          vrange: tuple[float, float] | None) -> View:
    """One layer on one image: the input, the labelled grid, its colour scale, the channel viewer."""
    sheet = _sheet(s, fm, top, image, f"features_{index}_{image}", vrange)
    rows = fm.image_rows(image)
    alt = f"{fm.layer}, image {image}: channels {', '.join(map(str, top))}"
    grid = labelled_grid(sheet, [str(c) for c in top], alt)
    options = [f"channel {c}: mean {num(rows[c].mean, 3)}, max {num(rows[c].max, 3)}, zeros {rows[c].zeros:.0%}"
               for c in top]
    low, high = (num(vrange[0], 3), num(vrange[1], 3)) if vrange else ("every value alike", "")
    body = (f'<p class="meta">{html.escape(_caption(fm, top))}</p>'
            f'<div class="panel"><img class="input" src="{html.escape(picture)}" alt="image {image}">{grid}</div>'
            + colour_legend(_viridis(), low, high, "colour scale of this layer") + tile_viewer(sheet, options))
    return View({"layer": str(index), "image": str(image)}, f"{fm.layer}, image {image}", body)


def _caption(fm: FeatureMaps, top: list[int]) -> str:
    c, h, w = fm.maps.shape[1:]
    layout = "" if fm.layout == "BCHW" else f" (read as {fm.layout})"
    return f"{fm.layer}: output {c} × {h} × {w}{layout}; channels shown, largest first: {', '.join(map(str, top))}"


def feature_section(s: Subject, layers: Sequence[str] | None) -> Section:
    """The most active channels of each chosen layer, for every input drawn, beside the input."""
    chosen = list(layers) if layers is not None else spatial_layers(s.summary())
    n = drawn(s)
    sec = Section("features", "Feature maps", data={"layers": {}})
    if not chosen:
        sec.paragraphs.append("No layer with a spatial (B x C x h x w) output was found.")
        return sec
    sec.paragraphs.append(f"For each layer, the {_TOP} channels with the largest mean activation over the images "
                          "drawn, largest first, each tile labelled with its channel; one colour scale per layer, "
                          "so images compare.")
    if n < s.x.shape[0]:
        sec.paragraphs.append(f"The first {n} of {s.x.shape[0]} images are drawn.")
    pictures = _inputs(s, n)
    views, choices = [], []
    for index, name in enumerate(chosen):
        s.progress.start(f"feature maps of {name}")
        fm = feature_maps(s.model, s.inputs(n), layers=name)
        top = fm.top(min(_TOP, fm.maps.shape[1]))
        vrange = _range(fm.maps[:, top])
        views += [_view(s, fm, top, index, i, pictures[i], vrange) for i in range(n)]
        c, h, w = fm.maps.shape[1:]
        choices.append((str(index), f"{name} ({c} × {h} × {w})"))
        sec.data["layers"][name] = {"shape": list(fm.maps.shape), "channels": top, "layout": fm.layout,
                                    "range": list(vrange) if vrange else None}
    images = [(str(i), f"image {i}") for i in range(n)]
    axes = [Axis("layer", "Layer", choices, "select"), Axis("image", "Image", images)]
    sec.blocks.append(view_set("feature-views", axes, views))
    return sec
