"""Pictures of the circuit analyses: a patching sweep as a heatmap (layers down, positions, heads or
kinds across; the change of the metric from the run patched into, on a diverging colormap centred at
0), the logit lens as a layer x position heatmap of the chosen token's probability, and direct logit
attribution as bars, one per term.

Takes results only: nothing here registers a hook or runs a model. matplotlib comes from the viz
extra and is imported when a picture is drawn.

Example:
    >>> import torch
    >>> from hookscope.analysis.circuits import Patching
    >>> p = Patching("m", "attn.z", "head", "denoise", "activation", "logit_diff", ["blocks.0"], ["0", "1"],
    ...              torch.tensor([[1.0, 3.0]]), 3.0, 1.0)
    >>> plot_patching(p).axes[0].get_ylabel()
    'layer'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..analysis.circuits import LogitAttribution, LogitLens, Patching
from ..errors import HookscopeError
from .plots import figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_patching", "plot_logit_lens", "plot_logit_attribution"]

_CELL = 0.45  # inches per cell of a heatmap


def _labels(columns: Sequence[str], labels: Sequence[str] | None, what: str) -> list[str]:
    if labels is None:
        return list(columns)
    if len(labels) != len(columns):
        raise HookscopeError(f"{len(labels)} labels for {len(columns)} {what}; give one label per {what[:-1]}")
    return list(labels)


def plot_patching(patching: Patching, *, labels: Sequence[str] | None = None) -> Figure:
    """A sweep as a heatmap of each cell's effect (its value minus the base run's metric), red where
    patching raises the metric, blue where it lowers it; ``labels`` name the columns (the prompt's tokens,
    for a sweep per position).

    Example:
        >>> import torch
        >>> p = Patching("m", "resid_pre", "position", "noise", "activation", "prob", ["blocks.0", "blocks.1"],
        ...              ["0"], torch.tensor([[0.5], [0.2]]), 0.5, 0.1)
        >>> len(plot_patching(p, labels=["the"]).axes)
        2
    """
    cols = _labels(patching.columns, labels, "columns")
    effects = patching.effects.float().numpy()
    fig = figure(max(3.5, 1.6 + _CELL * len(cols)), max(2.0, 1.2 + _CELL * len(patching.layers)))
    ax = fig.add_subplot(1, 1, 1)
    bound = float(abs(effects).max()) or 1.0
    image = ax.imshow(effects, cmap="bwr", vmin=-bound, vmax=bound, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90 if max(map(len, cols), default=0) > 3 else 0)
    ax.set_yticks(range(len(patching.layers)), patching.layers)
    ax.set_ylabel("layer")
    ax.set_xlabel({"position": "position", "head": "head", "layer": "kind"}.get(patching.per, patching.per))
    how = {"activation": "patching", "attribution": "attribution patching", "eap-ig": "EAP-IG"}[patching.method]
    ax.set_title(f"{how}: {patching.kind}, {patching.direction}", fontsize=9)
    fig.colorbar(image, ax=ax, label=f"change of {patching.metric}")
    fig.tight_layout()
    return fig


def plot_logit_lens(lens: LogitLens, *, labels: Sequence[str] | None = None) -> Figure:
    """The chosen token's probability at each stream (down) and position (across); ``labels`` name the
    positions.

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=9))
        >>> plot_logit_lens(hookscope.logit_lens(lm, torch.tensor([1, 2]))).axes[0].get_xlabel()
        'position'
    """
    cols = _labels([str(p) for p in range(lens.probs.shape[1])], labels, "positions")
    fig = figure(max(3.5, 1.6 + _CELL * len(cols)), max(2.0, 1.2 + _CELL * len(lens.streams)))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(lens.probs.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90 if max(map(len, cols), default=0) > 3 else 0)
    ax.set_yticks(range(len(lens.streams)), lens.streams)
    ax.set_xlabel("position")
    ax.set_title(f"{lens.kind}: probability of the token followed", fontsize=9)
    fig.colorbar(image, ax=ax, label="probability")
    fig.tight_layout()
    return fig


def plot_logit_attribution(attribution: LogitAttribution) -> Figure:
    """One horizontal bar per term (red positive, blue negative).

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=9))
        >>> fig = plot_logit_attribution(hookscope.logit_attribution(lm, torch.tensor([1, 2]), answer=3))
        >>> len(fig.axes[0].patches)
        8
    """
    rows = attribution.rows
    fig = figure(5.0, max(2.0, 0.8 + 0.22 * len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    values = [r.value for r in rows]
    ax.barh(range(len(rows)), values, color=["tab:red" if v >= 0 else "tab:blue" for v in values])
    ax.set_yticks(range(len(rows)), [r.name for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.5)
    ax.set_title(f"direct logit attribution (sum {attribution.total:.3f})", fontsize=9)
    fig.tight_layout()
    return fig
