"""A monitored training run as a picture: the loss, then one layer x step heatmap per statistic
(gradient norm, update ratio, dead fraction by default), the steps where a NaN or an Inf appeared
marked across every panel.

Cells are placed at the sampled steps' own numbers, so a flagged step that was not sampled is
still marked where it happened. A logged NaN or Inf is drawn in red, a layer with no such value
(no parameters, not sampled) is left blank: no value goes unseen and none is invented.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.monitor import Run
from ..errors import HookscopeError, did_you_mean
from .plots import figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

__all__ = ["RUN_STATISTICS", "plot_run"]

RUN_STATISTICS = ("grad_norm", "update_ratio", "dead")
"""What :func:`plot_run` draws unless told otherwise."""

_LINEAR = ("dead", "zeros")  # fractions: a 0..1 scale; every other statistic spans decades
_MAX_LAYER_TICKS = 40
_RED = "tab:red"


def _edges(steps: Sequence[int]) -> list[float]:
    """Cell edges halfway between sampled steps, so each cell is centred on its step."""
    if len(steps) == 1:
        return [steps[0] - 0.5, steps[0] + 0.5]
    mids = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
    return [steps[0] - (mids[0] - steps[0]), *mids, steps[-1] + (steps[-1] - mids[-1])]


def _norm(statistic: str, values: torch.Tensor) -> Normalize:
    from matplotlib.colors import LogNorm, Normalize

    finite = values[torch.isfinite(values)]
    if statistic.split("_")[-1] in _LINEAR or statistic in _LINEAR:
        return Normalize(vmin=0.0, vmax=1.0)
    positive = finite[finite > 0]
    if positive.numel() == 0:
        return Normalize(vmin=0.0, vmax=1.0)
    lo, hi = positive.min().item(), positive.max().item()
    if statistic.endswith(("mean", "min", "max")) or (finite < 0).any():  # signed: a linear scale around 0
        bound = max(abs(finite.min().item()), abs(finite.max().item())) or 1.0
        return Normalize(vmin=-bound, vmax=bound)
    return LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 10)


def _heatmap(fig: Figure, ax: Axes, run: Run, statistic: str, x: list[float]) -> None:
    import numpy as np

    values, present = run.matrix(statistic), run.present(statistic)
    shown = np.ma.masked_array(values.numpy(), mask=~(present & torch.isfinite(values)).numpy())
    signed = statistic.endswith(("mean", "min", "max"))
    cmap = "RdBu_r" if signed else ("magma" if statistic not in _LINEAR else "viridis")
    y = [i - 0.5 for i in range(len(run.layers) + 1)]
    mesh = ax.pcolormesh(x, y, shown, cmap=cmap, norm=_norm(statistic, values), shading="flat")
    bad = (present & ~torch.isfinite(values)).nonzero().tolist()
    for i, j in bad:  # a logged NaN or Inf: a red cell, never a blank one
        ax.add_patch(_cell_patch(x[j], x[j + 1], i, "NaN/Inf" if (i, j) == tuple(bad[0]) else None))
    ax.set_ylim(len(run.layers) - 0.5, -0.5)
    ax.set_ylabel(statistic, fontsize=8)
    _colorbar(fig, ax, mesh)
    _label_layers(ax, run.layers)
    if bad:
        ax.legend(loc="upper right", fontsize=7)


def _colorbar(fig: Figure, ax: Axes, mesh: Any) -> None:
    """A colour bar with a few readable ticks, also where the values span less than a decade."""
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    bar = fig.colorbar(mesh, ax=ax, pad=0.01, fraction=0.03)
    norm = bar.mappable.norm
    if isinstance(norm, LogNorm) and norm.vmin is not None and norm.vmax is not None:
        bar.set_ticks([float(t) for t in torch.logspace(math.log10(norm.vmin), math.log10(norm.vmax), 4)])
    bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    bar.ax.tick_params(labelsize=7)


def _cell_patch(x0: float, x1: float, row: int, label: str | None) -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((x0, row - 0.5), x1 - x0, 1.0, color=_RED, label=label)


def _label_layers(ax: Axes, layers: Sequence[str]) -> None:
    every = max(1, math.ceil(len(layers) / _MAX_LAYER_TICKS))
    ticks = list(range(0, len(layers), every))
    ax.set_yticks(ticks, [layers[i] if len(layers[i]) <= 30 else "..." + layers[i][-27:] for i in ticks],
                  fontsize=6 if len(ticks) > 20 else 7)


def _loss(ax: Axes, run: Run) -> None:
    steps, values = run.series("loss")
    finite = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    ax.plot([s for s, _ in finite], [v for _, v in finite], color="tab:blue", lw=1.2, marker="." if len(finite) < 60 else None)
    ax.set_ylabel("loss", fontsize=8)
    if finite and min(v for _, v in finite) > 0 and max(v for _, v in finite) > 20 * min(v for _, v in finite):
        ax.set_yscale("log")


def _spans(steps: Sequence[int]) -> list[tuple[int, int]]:
    """Runs of consecutive steps as (first, last)."""
    out: list[tuple[int, int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _mark_nonfinite(axes: Sequence[Axes], run: Run) -> None:
    """The first flagged step as a line across every panel, the later ones as a light band."""
    flagged = run.nonfinite_steps()
    for ax in axes:
        for k, (a, b) in enumerate(_spans(flagged)):
            ax.axvline(a, color=_RED, lw=1.4 if k == 0 else 0.8, ls="--")
            if b > a or k > 0:
                ax.axvspan(a, b + 0.5, color=_RED, alpha=0.08, lw=0)
    if flagged:
        first = next(r for r in run.nonfinite if r.step == flagged[0])
        where = f" in {first.layer}" if first.layer else ""
        more = f" (then {len(flagged) - 1} more step{'s' if len(flagged) > 2 else ''})" if len(flagged) > 1 else ""
        axes[0].set_title(f"NaN or Inf first at step {flagged[0]}{where}{more}", color=_RED, fontsize=9, loc="left")


def plot_run(run: Run, statistics: Sequence[str] = RUN_STATISTICS) -> Figure:
    """The run's loss over its steps, and a layer x step heatmap for each of ``statistics`` (any
    name :meth:`Run.statistics` lists: ``grad_norm``, ``update_ratio``, ``dead``, ``param_norm``,
    ``output_rms``, ...); decades on a log scale, fractions from 0 to 1, signed values around 0.

    Example:
        >>> import tempfile, torch, hookscope
        >>> from hookscope.viz import plot_run
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> folder = tempfile.mkdtemp()
        >>> with hookscope.monitor(net, every=2, log=folder, optimizer=opt) as mon:
        ...     for _ in range(6):
        ...         opt.zero_grad(); loss = net(torch.randn(8, 4)).pow(2).mean(); loss.backward()
        ...         mon.note(loss=loss); opt.step()
        >>> fig = plot_run(hookscope.read_run(folder))
        >>> len(fig.axes) >= 4  # the loss, three heatmaps (and their colour bars)
        True
    """
    if not isinstance(run, Run):
        raise HookscopeError(f"plot_run takes a Run (hookscope.read_run(FOLDER)), not {type(run).__name__}")
    if not run.steps:
        raise HookscopeError(f"{run.path} holds no sampled step yet; a monitor writes one at each sampled step")
    known = run.statistics()
    for name in statistics:
        if name not in known:
            hint = did_you_mean(name, known) or f" It logged: {', '.join(known)}."
            raise HookscopeError(f"the run logged no statistic {name!r}.{hint}")
    has_loss = bool(run.series("loss")[0])
    heights = ([1.2] if has_loss else []) + [max(1.6, 0.13 * len(run.layers))] * len(statistics)
    width = min(16.0, max(7.0, 4.0 + 0.08 * len(run.steps)))
    fig = figure(width, sum(heights) + 0.9)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    fig.subplots_adjust(left=0.16, right=0.93, top=1 - 0.45 / fig.get_size_inches()[1], hspace=0.12)
    x = _edges(run.steps)
    if has_loss:
        _loss(axes[0], run)
    for ax, name in zip(axes[1:] if has_loss else axes, statistics):
        _heatmap(fig, ax, run, name, x)
    if has_loss:  # the loss line spans the heatmaps' width, not theirs and their colour bars'
        top, under = axes[0].get_position(), axes[1].get_position()
        axes[0].set_position((under.x0, top.y0, under.width, top.height))
    axes[-1].set_xlabel("step", fontsize=8)
    axes[-1].set_xlim(x[0], x[-1] if not run.nonfinite_steps() else max(x[-1], run.nonfinite_steps()[-1] + 0.5))
    _mark_nonfinite(list(axes), run)
    return fig
