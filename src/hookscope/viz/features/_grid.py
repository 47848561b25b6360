"""One image's channels as one array (:func:`feature_grid`): no figure, pixel for pixel."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ...analysis.features import BY, FeatureMaps
from ...errors import HookscopeError
from ._arrays import assemble, check_pad, columns_for
from ._tiles import (REDUCTIONS, SCALES, as_result, check_choice, colormap_table, coloured, image_index, normalised,
                     paint, pick_channels, pixel_kinds, reduce_tiles, tile_limits, to_uint8)

__all__ = ["feature_grid"]


def _check_vrange(vrange: tuple[float, float] | None, scale: str, reduce: str | None) -> None:
    if vrange is None:
        return
    if not (isinstance(vrange, (tuple, list)) and len(vrange) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vrange)):
        raise HookscopeError(f"vrange={vrange!r} is not (low, high): give two finite numbers")
    if not vrange[0] < vrange[1]:
        raise HookscopeError(f"vrange={tuple(vrange)!r} is empty or reversed: low must be below high, "
                             f"e.g. vrange=({min(vrange)!r}, {max(vrange)!r})")
    if scale != "shared":
        raise HookscopeError(f"vrange= sets the one range of scale='shared', but scale={scale!r} scales each "
                             "tile to its own; drop vrange= or pass scale='shared'")
    if reduce == "pca":
        raise HookscopeError("vrange= does not apply to reduce='pca' (its colours are principal components, "
                             "on the first one's range); drop vrange=")


def feature_grid(maps: FeatureMaps | torch.Tensor, *, image: int = 0, channels: Sequence[int] | None = None,
                 top_k: int | None = None, by: str = "mean", scale: str = "shared", reduce: str | None = None,
                 columns: int | None = None, pad: int = 1, vrange: tuple[float, float] | None = None,
                 colormap: str | None = None) -> np.ndarray:
    """One image's channels as one picture: a grid of tiles, as a numpy ``uint8`` array.

    Normalisation, exactly: each tile's value ``v`` becomes the grey level
    ``round(255 * (v - lo) / (hi - lo))`` (computed in float64), clamped to 0..255. With
    ``scale="shared"``, ``lo`` and ``hi`` are the smallest and largest finite values over every tile
    shown (``vrange=(lo, hi)`` sets them instead); with ``scale="channel"``, each tile's own. A tile
    with ``hi == lo`` (constant) is 0. The gaps between tiles are 255 (white).

    Non-finite values never count in ``lo`` and ``hi``. In the grey array, +Inf is 255 (above every
    finite value), -Inf and NaN are 0; with a ``colormap`` (and for ``reduce="pca"``) they get fixed
    colours instead: NaN magenta ``(255, 0, 255)``, +Inf cyan ``(0, 255, 255)``, -Inf blue
    ``(0, 0, 255)`` (a PCA pixel: NaN if any channel is NaN, else +Inf, else -Inf).

    Args:
        maps: a :class:`~hookscope.analysis.features.FeatureMaps`, or a ``B x C x h x w`` (or
            ``C x h x w``) tensor; maps of one pixel (``1 x 1``, a pooled layer) are refused.
        image: which image of the batch.
        channels: the channels to show, in this order (default: all, in order).
        top_k: instead, the ``k`` channels with the largest ``by`` in this image, largest first.
        by: ``"mean"``, ``"max"`` or ``"sum"``: what ``top_k`` ranks by.
        scale: ``"shared"`` or ``"channel"``, as above.
        reduce: ``None`` (a tile per channel), ``"mean"`` or ``"max"`` over the channels shown (one
            tile), or ``"pca"``: the first 3 principal components of the channels shown (pixels with
            a non-finite value left out), as one RGB tile (R = the first), all three scaled by the
            first component's min and max (clamped), so that a weak component looks weak; a
            component that does not exist (fewer than 3 channels) is 0.
        columns: tiles per row (default ``ceil(sqrt(K))``).
        pad: pixels between tiles and around the grid (tile geometry: see the module's docstring).
        vrange: ``(lo, hi)`` with ``lo < hi``, for ``scale="shared"`` only: compare pictures on one scale.
        colormap: a matplotlib colormap name: colour the grey levels (an ``H x W x 3`` array).

    Returns:
        ``H x W`` grey levels; ``H x W x 3`` for ``reduce="pca"`` or with a ``colormap``.

    Example:
        >>> g = feature_grid(torch.arange(8.).view(1, 2, 2, 2), scale="channel")
        >>> g.shape, g[1:3, 1:3].tolist(), g[1:3, 4:6].tolist()
        ((4, 7), [[0, 85], [170, 255]], [[0, 85], [170, 255]])
        >>> feature_grid(torch.tensor([[[[0., 1.], [float("nan"), float("inf")]]]]), pad=0).tolist()
        [[0, 255], [0, 255]]
        >>> feature_grid(torch.rand(1, 5, 4, 4), reduce="pca", pad=0).shape
        (4, 4, 3)
    """
    res = as_result(maps)
    check_choice(scale, "scale", SCALES)
    check_choice(reduce, "reduce", REDUCTIONS, none_ok=True)
    check_choice(by, "by", BY)
    check_pad(pad)
    _check_vrange(vrange, scale, reduce)
    i = image_index(res.maps.shape[0], image)
    raw = res.maps[i, pick_channels(res, channels, top_k, by, i)]
    tiles, _ = reduce_tiles(raw, reduce)
    if reduce == "pca":
        return assemble(paint(to_uint8(tiles), pixel_kinds(raw)), 1, pad)
    (lo, hi), = tile_limits([tiles], scale, vrange)
    if colormap is not None:
        return assemble(coloured(tiles, lo, hi, colormap_table(colormap)), columns_for(len(tiles), columns), pad)
    grey = to_uint8(normalised(tiles, lo, hi))
    return assemble(grey[..., None], columns_for(len(tiles), columns), pad)[..., 0]

