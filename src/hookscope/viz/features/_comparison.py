"""The in-place trap's pictures: what a hook keeping references read, next to what the layer produced
(:func:`comparison_grid` as an array, :func:`plot_reference_comparison` as a figure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...analysis.features import BY, FeatureMaps, ReferenceComparison
from ...errors import HookscopeError
from ._arrays import WHITE, assemble, check_pad, columns_for, frame_tiles, origins
from ._canvas import DPI, Panel, by_row, colour_bar, figure_layout, label_font, pictures_for, show_panel, show_picture
from ._tiles import (SCALES, check_choice, check_spatial, colormap_table, coloured, finite_range, image_index, need,
                     non_finite_note, pick_channels, plural)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["comparison_grid", "plot_reference_comparison"]


# --- the in-place trap: what a hook keeping references read, next to what the layer produced -------------------------
@dataclass


class _Comparison:
    image: int
    stored: np.ndarray
    true: np.ndarray
    chosen: list[int]
    marked: np.ndarray
    columns: int
    tile: tuple[int, int]
    pad: int
    bar: tuple[float, float] | None


def _check_comparison(comparison: ReferenceComparison, scale: str, by: str, pad: int, zoom: int) -> None:
    if not isinstance(comparison, ReferenceComparison):
        raise HookscopeError(f"comparison is a {type(comparison).__name__}, not what "
                             "hookscope.analysis.features.compare_references returns")
    check_choice(scale, "scale", SCALES)
    check_choice(by, "by", BY)
    check_pad(pad, 2)
    if isinstance(zoom, bool) or not isinstance(zoom, int) or zoom < 1:
        raise HookscopeError(f"zoom={zoom!r} must be a whole factor, at least 1")
    check_spatial(comparison.layer, comparison.true.shape[2], comparison.true.shape[3])


def _compared(comparison: ReferenceComparison, image: int, channels: Sequence[int] | None, top_k: int | None,
              by: str, scale: str, columns: int | None, colormap: str, pad: int, zoom: int) -> _Comparison:
    _check_comparison(comparison, scale, by, pad, zoom)
    i = image_index(comparison.true.shape[0], image)
    chosen = pick_channels(FeatureMaps(comparison.true, comparison.layer), channels, top_k, by, i)
    stored, true = comparison.stored[i, chosen], comparison.true[i, chosen]
    both = torch.stack([stored, true], 1)  # K x 2 x h x w: a channel gets one range on both sides
    lo, hi = finite_range(both, (1, 2, 3) if scale == "channel" else None)
    lo, hi = (lo[:, 0], hi[:, 0]) if scale == "channel" else (lo, hi)
    lut = colormap_table(colormap)
    cols = columns_for(len(chosen), columns)
    marked = comparison.differs_by_image[i, chosen].numpy()  # this image's: another's would mislead
    h, w = stored.shape[1] * zoom, stored.shape[2] * zoom
    grids = []
    for side in (stored, true):
        tiles = coloured(side, lo, hi, lut).repeat(zoom, axis=1).repeat(zoom, axis=2)
        grid = assemble(tiles, cols, pad)
        frame_tiles(grid, marked, cols, h, w, pad)
        grids.append(grid)
    bar = (float(lo), float(hi)) if scale == "shared" and bool(torch.isfinite(lo)) else None
    return _Comparison(i, grids[0], grids[1], chosen, marked, cols, (h, w), pad, bar)


def _zoom(h: int, w: int) -> int:
    """The whole factor that enlarges an ``h x w`` tile to at least 32 pixels a side (thin frames)."""
    return max(1, math.ceil(32 / max(1, min(h, w))))


def comparison_grid(comparison: ReferenceComparison, *, image: int = 0, channels: Sequence[int] | None = None,
                    top_k: int | None = None, by: str = "mean", scale: str = "shared", columns: int | None = None,
                    colormap: str = "viridis", pad: int = 2, gap: int = 8, zoom: int = 1) -> np.ndarray:
    """The in-place trap as one RGB array: what a hook keeping references read (left) and what the layer
    produced (right) for one image, the channels that differ in that image framed in red on both sides.

    Both sides are grids with the module's tile geometry, colored through ``colormap`` after the
    normalisation of :func:`feature_grid` (non-finite values in its fixed colours), on one range
    for both sides: with ``scale="shared"`` the finite min and max over every tile shown on either
    side, with ``scale="channel"`` each channel's over its two tiles. A channel is framed when it
    differs in image ``image`` (``comparison.differs_by_image[image]``; a channel rewritten only in
    another image is not): the 1-pixel ring just outside its tile, pure red ``(255, 0, 0)``, on both
    sides. The right side starts ``gap`` white columns after the left one ends.

    Args:
        comparison: what :func:`~hookscope.analysis.features.compare_references` returns (maps of
            one pixel, ``1 x 1``, are refused).
        image, channels, top_k, by, scale, columns: as in :func:`feature_grid` (``top_k`` ranks the
            true maps).
        colormap: a matplotlib colormap name (one without pure red keeps the frames apart).
        pad: pixels between tiles, at least 2 (frames live in the gaps).
        gap: white columns between the two sides.
        zoom: enlarge each tile this many times (nearest neighbour) before framing, so that the
            frame is thin next to a small tile: tiles are then ``zoom * h x zoom * w`` in the geometry.

    Returns:
        An ``H x W x 3`` uint8 array.

    Example:
        >>> import torch
        >>> from hookscope.analysis.features import compare_references
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True))
        >>> g = comparison_grid(compare_references(net, torch.randn(1, 3, 6, 6), layers="0"), gap=8)
        >>> g.shape, g[1, 1].tolist()   # 2 x 2 tiles of 4 x 4, pad 2; a red frame's corner
        ((14, 36, 3), [255, 0, 0])
    """
    c = _compared(comparison, image, channels, top_k, by, scale, columns, colormap, pad, zoom)
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise HookscopeError(f"gap={gap!r} must be a whole number of pixels, 0 or more")
    white = np.full((c.stored.shape[0], gap, 3), WHITE, dtype=np.uint8)
    return np.concatenate([c.stored, white, c.true], axis=1)


def _frame_patches(ax: Axes, c: _Comparison, fig: Figure) -> None:
    """The red frames again, as one path drawn at the figure's resolution: where ``imshow`` shrinks a
    large grid (2048 tiles), its 1-pixel rings fall between the screen's pixels and vanish."""
    if not c.marked.any():
        return
    mpath = need("matplotlib.path")
    patches = need("matplotlib.patches")
    h, w = c.tile
    ys, xs = origins(len(c.marked), c.columns, h, w, c.pad)
    y0, x0 = ys[c.marked] - 1.0, xs[c.marked] - 1.0  # through the centres of the ring's pixels
    corners = np.stack([np.stack([x0, y0], 1), np.stack([x0 + w + 1, y0], 1), np.stack([x0 + w + 1, y0 + h + 1], 1),
                        np.stack([x0, y0 + h + 1], 1), np.stack([x0, y0], 1)], 1)  # K x 5 x (x, y)
    codes = np.tile([mpath.Path.MOVETO, *[mpath.Path.LINETO] * 3, mpath.Path.CLOSEPOLY], len(x0))
    screen = ax.get_position().width * fig.get_figwidth() * DPI / c.stored.shape[1]  # figure pixels per pixel
    # one path, added as an artist: add_patch would walk it for the data limits (0.2 s for 2048 frames),
    # and the frames lie inside the image. Never thinner than 1.5
    # figure pixels nor than the ring itself; no antialiasing: pure red, as in the array
    ax.add_artist(patches.PathPatch(mpath.Path(corners.reshape(-1, 2), codes), facecolor="none",
                                   edgecolor=(1.0, 0.0, 0.0), linewidth=max(1.5, screen) * 72 / DPI,
                                   antialiased=False))


def _comparison_title(comparison: ReferenceComparison, c: _Comparison) -> str:
    total, batch = comparison.differs.numel(), comparison.true.shape[0]
    head = (f"{comparison.layer}: {int(comparison.differs.sum())} of {plural(total, 'channel')} rewritten in "
            "place after the layer ran")
    if batch > 1:
        head += f" (in any of {batch} images); in image {c.image}: {int(comparison.differs_by_image[c.image].sum())}"
    n = int(c.marked.sum())
    framed = "none framed" if not n else "those framed in red" if len(c.chosen) == total else \
        f"{n} of the {len(c.chosen)} shown framed in red"
    seen = torch.cat([comparison.stored[c.image, c.chosen], comparison.true[c.image, c.chosen]])
    return f"{head} ({framed}){non_finite_note(seen)}"


def plot_reference_comparison(comparison: ReferenceComparison, *, image: int = 0,
                              channels: Sequence[int] | None = None, top_k: int | None = None, by: str = "mean",
                              scale: str = "shared", columns: int | None = None, colormap: str = "viridis",
                              picture: torch.Tensor | None = None, title: str | None = None) -> Figure:
    """The in-place trap's picture: the maps a hook that keeps references read, beside what the layer produced.

    The two grids of :func:`comparison_grid` for one image side by side, tiles labelled by channel
    (on red, and framed in red, where the two differ in that image), one colour bar for both with
    ``scale="shared"``, and the input image on the left when given. Tiles under 32 pixels a side are
    enlarged by the smallest whole ``zoom`` that makes them 32 or more, so that the 1-pixel frames
    stay thin; the frames are also drawn as red rectangles at the figure's resolution (at least 1.5
    pixels wide), so that they survive when a large grid is shrunk to the figure. Non-finite values
    are in the fixed colours of :func:`feature_grid` (NaN magenta, +Inf cyan, -Inf blue).

    Args:
        comparison: what :func:`~hookscope.analysis.features.compare_references` returns.
        image, channels, top_k, by, scale, columns, colormap: as in :func:`comparison_grid`.
        picture: the input image, ``3 x H x W`` in [0, 1] (or the batch of them).
        title: the figure's title (default: how many channels differ, in the batch and in this
            image, and the number of NaN/Inf values if any).

    Returns:
        A ``matplotlib.figure.Figure`` on its own Agg canvas.

    Example:
        >>> import torch
        >>> from hookscope.analysis.features import compare_references
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True))
        >>> fig = plot_reference_comparison(compare_references(net, torch.randn(1, 3, 6, 6), layers="0"))
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['a hook keeping output.detach() read', 'the layer produced (hookscope.capture)']
    """
    zoom = _zoom(*comparison.true.shape[2:]) if isinstance(comparison, ReferenceComparison) else 1
    c = _compared(comparison, image, channels, top_k, by, scale, columns, colormap, 2, zoom)
    pictures = pictures_for(picture, [c.image], comparison.true.shape[0])
    heading = title if title is not None else _comparison_title(comparison, c)
    fig, grids, pics, cax = figure_layout(1, 2, c.stored.shape[:2], c.columns, pictures is not None, c.bar is not None,
                                    heading, by_row(c.chosen))
    size = label_font(grids[0][0].get_position().width * fig.get_figwidth() * DPI / c.columns)
    colors = ["red" if m else "black" for m in c.marked.tolist()]
    for ax, grid, what in zip(grids[0], (c.stored, c.true),
                              ("a hook keeping output.detach() read", "the layer produced (hookscope.capture)")):
        show_panel(ax, Panel(grid, c.chosen, c.columns, c.tile, c.pad, what), size, colors)
        _frame_patches(ax, c, fig)
    if pictures is not None:
        show_picture(pics[0], pictures[0], f"image {c.image}")
    if c.bar is not None and cax is not None:
        colour_bar(fig, cax, c.bar[0], c.bar[1], colormap)
    return fig

