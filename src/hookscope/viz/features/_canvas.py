"""What every feature-map figure shares: a figure on its own Agg canvas, axes placed by hand in inches,
grids labelled by channel, the input picture beside them and a colour bar."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...errors import HookscopeError
from ._arrays import origins
from ._tiles import need, to_uint8

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["DPI", "Panel", "by_row", "colour_bar", "figure_layout", "label_font", "pictures_for", "show_panel",
           "show_picture"]

DPI = 100


# --- figures ------------------------------------------------------------------------------------------
def _figure(width: float, height: float) -> Figure:
    """An empty figure on its own Agg canvas (no pyplot state)."""
    need("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def pictures_for(picture: torch.Tensor | None, shown: list[int], batch: int) -> list[torch.Tensor] | None:
    """One ``3 x H x W`` picture in [0, 1] per image shown (a single picture serves every row)."""
    if picture is None:
        return None
    if not isinstance(picture, torch.Tensor) or picture.ndim not in (3, 4):
        raise HookscopeError("picture= must be a 3 x H x W image in [0, 1], or B x 3 x H x W for a batch")
    p = picture.detach().to("cpu", torch.float32)
    if p.ndim == 4 and p.shape[0] != batch:
        raise HookscopeError(f"picture= holds {p.shape[0]} images but the maps {batch}; pass one per image")
    if p.shape[-3] not in (1, 3):
        raise HookscopeError(f"picture= of shape {tuple(p.shape)} is not 3 x H x W (or 1 x H x W)")
    if p.numel() and (p.min() < 0 or p.max() > 1):
        raise HookscopeError(f"picture= values span [{float(p.min()):.3g}, {float(p.max()):.3g}], not [0, 1]; "
                             "undo the input normalisation first (x * std + mean)")
    return [(p[i] if p.ndim == 4 else p).expand(3, -1, -1) for i in shown]


@dataclass


class Panel:
    """One grid drawn in one axes: the array, where its tiles are, which channels they show."""

    grid: np.ndarray
    channels: list[int]  # empty: one reduced tile, described by the title
    columns: int
    tile: tuple[int, int]  # tile height and width in the grid's pixels
    pad: int
    title: str = ""


_TEXT_LABELS = 64  # above this, a run of channels in order is labelled by row and column (text is slow)


def by_row(channels: list[int]) -> bool:
    """Label by row and column: a long run of channels in order."""
    return len(channels) > _TEXT_LABELS and channels == list(range(channels[0], channels[0] + len(channels)))


def _label_tiles(ax: Axes, panel: Panel, size: float, colors: Sequence[str] | None = None) -> None:
    """Each tile's channel index in its top-left corner, or, for a long run of channels in order,
    the first channel of each row and the offset of each column (one text per tile costs ~0.6 ms to
    draw: 0.3 s for 512 tiles)."""
    chans, (h, w), pad, cols = panel.channels, panel.tile, panel.pad, panel.columns
    if not chans:
        return
    ys, xs = origins(len(chans), cols, h, w, pad)
    if by_row(chans):
        ax.set_axis_on()
        ax.set_frame_on(False)
        ax.tick_params(length=0, labelsize=size, pad=1)
        ax.xaxis.tick_top()
        ax.set_xticks((xs[:cols] + (w - 1) / 2).tolist(), [f"+{c}" for c in range(cols)])
        ax.set_yticks((ys[::cols] + (h - 1) / 2).tolist(), [str(c) for c in chans[::cols]])
        ax.set_ylabel("channel = row + column", fontsize=size)
        return
    for j, (y, x, c) in enumerate(zip(ys.tolist(), xs.tolist(), chans)):
        back = colors[j] if colors else "black"
        ax.text(x - 0.5, y - 0.5, str(c), fontsize=size, color="white", va="top", ha="left",
                bbox={"boxstyle": "square,pad=0.05", "facecolor": back, "alpha": 0.5 if back == "black" else 0.85,
                      "linewidth": 0})


def show_panel(ax: Axes, panel: Panel, size: float, colors: Sequence[str] | None = None) -> None:
    ax.imshow(panel.grid, interpolation="nearest")
    ax.set_axis_off()
    if panel.title:
        ax.set_title(panel.title, fontsize=9)
    _label_tiles(ax, panel, size, colors)


_TITLE_PT = 10  # the figure title's font size
_CHAR_EM = 0.6  # a title character's width in ems, on the wide side (DejaVu Sans averages ~0.55)


def _wrapped(title: str, width_in: float) -> list[str]:
    """The title's lines, each short enough to fit ``width_in`` inches (a narrow figure clips one long line)."""
    import textwrap

    chars = max(20, int((width_in - 0.2) * 72 / (_TITLE_PT * _CHAR_EM)))
    return [part for line in title.splitlines() or [""] for part in textwrap.wrap(line, chars) or [""]]


def figure_layout(rows: int, per_row: int, grid_hw: tuple[int, int], columns: int, picture: bool, bar: bool,
            title: str, ticks: bool = False) -> tuple[Figure, list[list[Axes]], list[Axes], Axes | None]:
    """A figure with ``rows`` rows of [picture] ``per_row`` grids, a colour bar on the right, and
    ``title`` on top, wrapped to the figure's width.

    Axes are placed by hand in inches (fast and exact: no layout engine over hundreds of labels).
    """
    gh, gw = grid_hw
    width = min(14.0 / per_row, max(4.0, columns * 1.2))  # about 1.2 inches per tile, within a page
    height = width * gh / gw
    tallest = min(10.0, 40.0 / rows)  # a row on a screen, the figure within 4000 pixels
    if height > tallest:
        width, height = width * tallest / height, tallest
    left = min(height, 4.0 if per_row == 1 else 3.0) if picture else 0.0  # the input, beside the grids
    gap = 0.5 if ticks else 0.15  # room for row labels
    fig_w = left + per_row * (width + gap) + (1.1 if bar else 0.15)
    lines = _wrapped(title, fig_w)
    top, row_h = 0.1 + 0.2 * len(lines) + 0.3, height + 0.35  # the title's lines, then the grids' own titles
    fig_h = rows * row_h + top
    fig = _figure(fig_w, fig_h)
    fig.suptitle("\n".join(lines), fontsize=_TITLE_PT, y=1 - 0.1 / fig_h, va="top")
    grids: list[list[Axes]] = []
    pics: list[Axes] = []
    for r in range(rows):
        y = (fig_h - top - (r + 1) * row_h + 0.05) / fig_h
        grids.append([fig.add_axes(((left + gap + k * (width + gap)) / fig_w, y, width / fig_w, height / fig_h))
                      for k in range(per_row)])
        if picture:
            pics.append(fig.add_axes((0.1 / fig_w, y, (left - 0.15) / fig_w, height / fig_h)))
    right = left + per_row * (width + gap) + 0.25
    cax = fig.add_axes((right / fig_w, 0.4 / fig_h, 0.2 / fig_w, max(0.1, fig_h - top - 0.8) / fig_h),
                       label="<colorbar>") if bar else None  # the label matplotlib gives its own colour bars
    return fig, grids, pics, cax


def colour_bar(fig: Figure, cax: Axes, lo: float, hi: float, colormap: str) -> None:
    colors = need("matplotlib.colors")
    cm = need("matplotlib.cm")
    mappable = cm.ScalarMappable(norm=colors.Normalize(lo, hi if hi > lo else lo + 1), cmap=colormap)
    fig.colorbar(mappable, cax=cax)
    cax.set_title("value", fontsize=8)


def label_font(width_px: float) -> float:
    """Label size in points for tiles ``width_px`` wide on the figure."""
    return float(min(10.0, max(5.0, width_px / 6)))


def show_picture(ax: Axes, picture: torch.Tensor, label: str) -> None:
    ax.imshow(to_uint8(picture.permute(1, 2, 0).clamp(0, 1)), interpolation="bilinear")
    ax.set_axis_off()
    ax.set_title(label, fontsize=9)

