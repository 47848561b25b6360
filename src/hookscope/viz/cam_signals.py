"""Class activation maps of signals and volumes: curves with the map under them, and rows of slices.

A signal's map (``B x L``) is drawn as a heat strip under the signal's curves, sharing its axis; a volume's
map (``B x D x H x W``) as a row of slices along depth, each blended over the volume's slice (jet, as
:func:`hookscope.viz.plot_cams` draws images). Takes tensors and results only: nothing here registers a hook
or runs a model; matplotlib comes from the viz extra.

Example:
    >>> import torch, hookscope
    >>> net = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 3, padding=1), torch.nn.ReLU(),
    ...                           torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    >>> x = torch.randn(1, 1, 32)
    >>> fig = plot_cam_curves(x[0], [hookscope.cam(net, x, target=1)])
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['signal', 'gradcam']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HookscopeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_cam_curves", "plot_cam_slices"]


def _figure(width: float, height: float) -> Figure:
    """:func:`hookscope.viz.plots.figure`'s canvas, made here: plots hands 1-D and 3-D results to this module,
    which therefore must not import plots back."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HookscopeError("drawing plots needs matplotlib, from the viz extra: pip install 'hookscope[viz]'") from None
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _checked(results: Sequence[Any], index: int, ndim: int, what: str) -> list[Any]:
    results = list(results)
    if not results:
        raise HookscopeError(f"drawing {what} needs at least one CamMaps; pass [hookscope.cam(model, x, method=m) "
                             "for m in methods]")
    for r in results:
        if r.maps.ndim != ndim:
            raise HookscopeError(f"the {r.method} result holds maps of {r.maps.ndim - 1} dimensions, not the "
                                 f"{ndim - 1} of {what}; draw images with hookscope.viz.plot_cams")
        if not -r.maps.shape[0] <= index < r.maps.shape[0]:
            raise HookscopeError(f"index={index} is out of range: the {r.method} result holds "
                                 f"{r.maps.shape[0]} map(s); pass 0 to {r.maps.shape[0] - 1}")
    return results


def _label(r: Any, index: int) -> str:
    return r.method if r.targets is None else f"{r.method}, class {int(r.targets[index])}"


def plot_cam_curves(signal: torch.Tensor | None, results: Sequence[Any], *, index: int = 0) -> Figure:
    """A signal's curves (one per channel), then each CAM result's map as a heat strip under them.

    Args:
        signal: the input signal, ``C x L`` or ``L``; ``None``: the maps alone.
        results: :class:`~hookscope.analysis.cam.CamMaps` of the same batch of signals (maps ``B x L``).
        index: which signal of the batch to draw.
    """

    results = _checked(results, index, 2, "signals")
    L = results[0].maps.shape[1]
    rows = len(results) + (signal is not None)
    fig = _figure(7.0, 1.1 + 0.9 * rows)
    axes = fig.subplots(rows, 1, squeeze=False, sharex=True)[:, 0]
    if signal is not None:
        s = signal.detach().float().cpu().reshape(-1, signal.shape[-1])
        for c, line in enumerate(s):
            axes[0].plot(range(s.shape[1]), line.numpy(), linewidth=0.9, label=f"channel {c}" if len(s) > 1 else None)
        axes[0].set_ylabel("signal", fontsize=8)
        if len(s) > 1:
            axes[0].legend(fontsize=7, loc="upper right")
    for ax, r in zip(axes[rows - len(results):], results):
        m = r.maps[index].detach().float().cpu()
        ax.imshow(m.view(1, -1).numpy(), aspect="auto", cmap="jet", vmin=0, vmax=1,
                  extent=(-0.5, L - 0.5, 0.0, 1.0), interpolation="nearest")
        ax.plot(range(L), m.numpy(), color="white", linewidth=1.0)
        ax.set_ylabel(r.method, fontsize=8)
        ax.set_yticks([])
        ax.set_title(_label(r, index), fontsize=8, loc="left")
    axes[-1].set_xlabel("position", fontsize=8)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.92, bottom=0.12, hspace=0.45)
    return fig


def plot_cam_slices(volume: torch.Tensor | None, results: Sequence[Any], *, index: int = 0,
                    slices: Sequence[int] | None = None) -> Figure:
    """A row of depth slices per CAM result, each map slice blended over the volume's slice.

    Args:
        volume: the input volume, ``C x D x H x W`` or ``D x H x W`` (the channels are averaged and min-max
            scaled for the grey picture under the map); ``None``: the maps alone.
        results: :class:`~hookscope.analysis.cam.CamMaps` of the same batch of volumes (maps ``B x D x H x W``).
        index: which volume of the batch to draw.
        slices: the depths drawn; ``None``: up to six, evenly spaced.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.ReLU(),
        ...                           torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
        >>> x = torch.randn(1, 1, 8, 8, 8)
        >>> fig = plot_cam_slices(x[0], [hookscope.cam(net, x, target=1)], slices=[0, 4])
        >>> [ax.get_title() for ax in fig.axes]
        ['gradcam, class 1\\nd=0', 'd=4']
    """
    from .overlay import overlay

    results = _checked(results, index, 4, "volumes")
    D = results[0].maps.shape[1]
    depths = list(slices) if slices is not None else sorted({round(i * (D - 1) / 5) for i in range(min(D, 6))})
    bad = [d for d in depths if not 0 <= d < D]
    if bad or not depths:
        raise HookscopeError(f"slices={list(depths)} must be depths from 0 to {D - 1}")
    grey = None
    if volume is not None:
        v = volume.detach().float().cpu()
        v = v.mean(0) if v.ndim == 4 else v
        grey = (v - v.min()) / (v.max() - v.min()).clamp(min=1e-12)
    fig = _figure(1.6 * len(depths) + 0.2, 1.8 * len(results) + 0.2)
    axes = fig.subplots(len(results), len(depths), squeeze=False)
    for row, r in zip(axes, results):
        for j, (ax, d) in enumerate(zip(row, depths)):
            m = r.maps[index, d].detach().float().cpu()
            under = grey[d] if grey is not None else torch.zeros_like(m)
            ax.imshow(overlay(under.expand(3, *under.shape), m).permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_title(f"{_label(r, index)}\nd={d}" if j == 0 else f"d={d}", fontsize=8)
            ax.set_axis_off()
    fig.subplots_adjust(left=0.02, right=0.98, top=0.85, bottom=0.02, wspace=0.05, hspace=0.3)
    return fig
