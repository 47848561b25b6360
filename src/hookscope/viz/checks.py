"""Pictures of the checks of an explanation: the model-randomisation sanity check (the maps of one
sample after each randomised layer, and the similarity curves) and ROAD's two curves.

Takes results only: nothing here runs a model or registers a hook. matplotlib comes from the viz
extra and is imported when a picture is drawn. Registers these pictures with the result protocol,
so a notebook shows them under the results' tables.

Example:
    >>> import torch
    >>> from hookscope import metrics
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    >>> res = metrics.parameter_randomisation(net, torch.rand(4, 3), lambda m, x: m[0](x))
    >>> len(plot_randomisation(res).axes)
    1
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..analysis.checks import Randomisation, RoadCurves
from ..core.result import register_picture
from ..errors import HookscopeError
from ._pictures import png
from .plots import figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_PANELS", "plot_randomisation", "plot_road"]

MAX_PANELS = 8
"""At most this many maps in the row of :func:`plot_randomisation` (the original, then steps spread
evenly from the first to the last)."""


def _picture(m: torch.Tensor) -> torch.Tensor | None:
    """One sample's map as an ``H x W`` magnitude (channels summed), or ``None`` if it is not a picture."""
    m = m.detach().float().cpu()
    if m.ndim == 3:
        m = m.abs().sum(0)
    return m.abs() if m.ndim == 2 and min(m.shape) >= 2 else None


def _steps(n: int) -> list[int]:
    if n <= MAX_PANELS - 1:
        return list(range(n))
    return sorted({round(i * (n - 1) / (MAX_PANELS - 2)) for i in range(MAX_PANELS - 1)})


def plot_randomisation(result: Randomisation, *, sample: int = 0) -> Figure:
    """The randomisation check as a figure: one sample's map before and after each randomised layer
    (when the maps are pictures), and the mean similarities per layer, top first.

    Args:
        result: what :func:`hookscope.metrics.parameter_randomisation` returned.
        sample: which sample's maps to draw.
    """
    b = result.original.shape[0]
    if not 0 <= sample < b:
        raise HookscopeError(f"sample={sample} is out of range: the check has {b} samples (0 to {b - 1})")
    first = _picture(result.original[sample])
    steps = _steps(len(result.layers)) if first is not None else []
    cols = max(len(steps) + 1, 1)
    fig = figure(max(6.0, 1.6 * cols), 5.2 if steps else 3.2)
    grid = fig.add_gridspec(2 if steps else 1, cols, height_ratios=[1, 1.3] if steps else [1])
    if first is not None:
        panels = [("trained", first)] + [(f"{i + 1}: {result.layers[i]}", _picture(result.maps[i, sample]))
                                         for i in steps]
        for j, (title, m) in enumerate(panels):
            ax = fig.add_subplot(grid[0, j])
            ax.imshow(m.numpy(), cmap="inferno")  # type: ignore[union-attr]
            ax.set_title(title if len(title) < 22 else "..." + title[-19:], fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
    ax = fig.add_subplot(grid[-1, :])
    x = list(range(1, len(result.layers) + 1))
    rows = result.rows
    ax.plot(x, [r.spearman for r in rows], marker="o", label="rank correlation")
    ax.plot(x, [r.spearman_abs for r in rows], marker="s", label="rank correlation of |map|")
    if result.ssim is not None:
        ax.plot(x, [float("nan") if r.ssim is None else r.ssim for r in rows], marker="^", label="SSIM")
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xticks(x)
    ax.set_xticklabels(result.layers, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("similarity to the trained model's maps", fontsize=8)
    ax.set_title(f"{result.mode} randomisation, from the top", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def plot_road(result: RoadCurves) -> Figure:
    """ROAD's curves: the mean change of the score against the fraction of pixels removed, most
    relevant first and least relevant first.

    Example:
        >>> import torch
        >>> from hookscope import metrics
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
        >>> res = metrics.road(net, torch.rand(1, 1, 4, 4), torch.rand(1, 4, 4), target=0)
        >>> plot_road(res).axes[0].get_xlabel()
        'fraction of the pixels removed'
    """
    fig = figure(5.0, 3.4)
    ax = fig.add_subplot()
    removed = result.removed.mean(0).tolist()
    ax.plot(removed, result.most.mean(0).tolist(), marker="o", label="most relevant first (lower is better)")
    ax.plot(removed, result.least.mean(0).tolist(), marker="s",
            label="least relevant first (nearer 0 is better)")
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_xlabel("fraction of the pixels removed")
    ax.set_ylabel(f"change of the {result.score}")
    ax.set_title(f"ROAD, combined {float(result.combined.mean()):.3g}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


register_picture(Randomisation, lambda result: png(plot_randomisation(result)) if result.layers else None)
register_picture(RoadCurves, lambda result: png(plot_road(result)) if result.most.numel() else None)
