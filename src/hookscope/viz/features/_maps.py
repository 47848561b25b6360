"""The feature-map figure (:func:`plot_feature_maps`): a row per image, each a grid of tiles labelled by channel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...analysis.features import BY, FeatureMaps
from ...errors import HookscopeError
from ._arrays import assemble, columns_for, overlaid, pca_rgb
from ._canvas import DPI, Panel, by_row, colour_bar, figure_layout, label_font, pictures_for, show_panel, show_picture
from ._tiles import (REDUCTIONS, SCALES, as_result, check_choice, colormap_table, coloured, image_index,
                     non_finite_note, pick_channels, pixel_kinds, plural, reduce_tiles, tile_limits)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_feature_maps"]

_MAX_ROWS = 16  # images in one figure


def _values(tiles: list[torch.Tensor], scale: str
            ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[float, float] | None]:
    """Each panel's (lo, hi) as :func:`feature_grid` documents, and the shared (lo, hi) if shared."""
    limits = tile_limits(tiles, scale, None)
    lo, hi = limits[0]
    return limits, (float(lo), float(hi)) if scale == "shared" and bool(torch.isfinite(lo)) else None


def _check_alpha(alpha: float | None, pictures: list[torch.Tensor] | None) -> None:
    if alpha is None:
        return
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise HookscopeError(f"overlay_alpha={alpha!r} must be between 0 (picture only) and 1 (maps only)")
    if pictures is None:
        raise HookscopeError("overlay_alpha= blends the maps over the input image: pass picture= too")


def _feature_panels(res: FeatureMaps, shown: list[int], chosen: list[int], reduce: str | None, scale: str,
                    colormap: str, pictures: list[torch.Tensor] | None, alpha: float | None,
                    columns: int | None) -> tuple[list[Panel], tuple[float, float] | None, str]:
    """One panel per image shown, the colour bar's range when one scale holds for every tile, and
    what a reduction shows."""
    reduced = [reduce_tiles(res.maps[i, chosen], reduce) for i in shown]
    what = reduced[0][1]
    under: list[torch.Tensor | None] = list(pictures) if pictures is not None and alpha is not None else [None] * len(shown)
    if reduce == "pca":
        arrays = [pca_rgb(t, pixel_kinds(res.maps[i, chosen]), p, alpha) for i, (t, _), p in zip(shown, reduced, under)]
        bar = None
    else:
        lut = colormap_table(colormap)
        limits, bar = _values([t for t, _ in reduced], "shared" if reduce else scale)
        arrays = [overlaid(t, lo, hi, lut, p, alpha if alpha is not None else 0.0) if p is not None
                  else coloured(t, lo, hi, lut) for (t, _), (lo, hi), p in zip(reduced, limits, under)]
    cols = columns_for(arrays[0].shape[0], columns)
    pad = 1 if arrays[0].shape[1] < 64 else 2
    several = len(shown) > 1 and pictures is None
    panels = [Panel(assemble(a, cols, pad), [] if reduce else chosen, cols, (a.shape[1], a.shape[2]), pad,
                     f"image {i}" if several else "") for i, a in zip(shown, arrays)]
    return panels, bar, what


def _headline(res: FeatureMaps, shown: list[int], chosen: list[int], top_k: int | None, by: str, scale: str,
              reduced: str, alpha: float | None) -> str:
    count, (h, w) = res.maps.shape[1], res.maps.shape[2:]
    which = f"top {len(chosen)} of {plural(count, 'channel')} by {by}" if top_k is not None else \
        f"{len(chosen)} of {plural(count, 'channel')}" if len(chosen) != count else plural(count, "channel")
    how = f"; {reduced}" if reduced else "; one colour scale" if scale == "shared" else \
        "; each tile scaled to its own min-max"
    over = f"; over the image (alpha {alpha:g})" if alpha is not None else ""
    return f"{res.layer}: {which}, {h}x{w}{how}{over}{non_finite_note(res.maps[shown][:, chosen])}"


def plot_feature_maps(result: FeatureMaps | torch.Tensor, *, picture: torch.Tensor | None = None,
                      overlay_alpha: float | None = None, images: Sequence[int] | None = None,
                      channels: Sequence[int] | None = None, top_k: int | None = None, by: str = "mean",
                      scale: str = "shared", reduce: str | None = None, columns: int | None = None,
                      colormap: str = "viridis", title: str | None = None) -> Figure:
    """A figure of a layer's feature maps: a row per image, each a grid of tiles labelled by channel.

    Each row's grid is one array drawn with one ``imshow``, its tiles scaled as in
    :func:`feature_grid`; ``scale="shared"`` uses one range over every tile of every row, shown by
    a colour bar. The input image, when given, is drawn at the left of its row. Non-finite values
    are drawn in fixed colours (NaN magenta, +Inf cyan, -Inf blue, as :func:`feature_grid` with a
    colormap), and the title says how many there are and which colour is which. The title is
    wrapped to the figure's width.

    Args:
        result: a :class:`~hookscope.analysis.features.FeatureMaps` (or ``B x C x h x w`` tensor);
            maps of one pixel (``1 x 1``: a pooled layer) are refused.
        picture: the input image, ``3 x H x W`` in [0, 1] (``B x 3 x H x W``: one per image).
        overlay_alpha: blend each tile, upsampled to the picture, over it:
            ``(1 - alpha) * picture + alpha * colormap(tile)`` (needs ``picture``).
        images: which images of the batch, one row each (default: all).
        channels, top_k, by, scale, reduce, columns: as in :func:`feature_grid`; ``top_k`` ranks
            channels over every image shown together, so that each row shows the same channels.
        colormap: a matplotlib colormap name.
        title: the figure's title (default: the layer, what is shown, how it is scaled, and the
            number of NaN/Inf values if any).

    Returns:
        A ``matplotlib.figure.Figure`` on its own Agg canvas (save it with :func:`save_feature_maps`).

    Example:
        >>> fig = plot_feature_maps(torch.rand(2, 8, 5, 5), top_k=4, picture=torch.rand(2, 3, 20, 20))
        >>> len(fig.axes), fig.axes[0].get_images()[0].get_array().shape
        (5, (13, 13, 3))
    """
    res = as_result(result)
    for value, name, allowed, none_ok in ((scale, "scale", SCALES, False), (reduce, "reduce", REDUCTIONS, True),
                                           (by, "by", BY, False)):
        check_choice(value, name, allowed, none_ok)
    batch = res.maps.shape[0]
    shown = [image_index(batch, i) for i in (images if images is not None else range(batch))]
    if not shown or len(shown) > _MAX_ROWS:
        raise HookscopeError(f"images= gives {len(shown)} images; a figure draws 1 to {_MAX_ROWS} (a row each): "
                             f"pass images=[...] (CLI: fewer --image files or a smaller --input batch)")
    chosen = pick_channels(FeatureMaps(res.maps[shown], res.layer), channels, top_k, by, None)
    pictures = pictures_for(picture, shown, batch)
    _check_alpha(overlay_alpha, pictures)
    panels, bar, what = _feature_panels(res, shown, chosen, reduce, scale, colormap, pictures, overlay_alpha,
                                        columns)
    first = panels[0]
    heading = title if title is not None else _headline(res, shown, chosen, top_k, by, scale, what, overlay_alpha)
    fig, grids, pics, cax = figure_layout(len(shown), 1, first.grid.shape[:2], first.columns, pictures is not None,
                                    bar is not None, heading, not reduce and by_row(chosen))
    size = label_font(grids[0][0].get_position().width * fig.get_figwidth() * DPI / first.columns)
    for r, panel in enumerate(panels):
        show_panel(grids[r][0], panel, size)
        if pictures is not None:
            show_picture(pics[r], pictures[r], f"image {shown[r]}")
    if bar is not None and cax is not None:
        colour_bar(fig, cax, bar[0], bar[1], colormap)
    return fig

