"""Pictures of the analyses: CAM methods side by side, gradient flow, trace and diff along execution order.

Each ``plot_*`` function returns a :class:`matplotlib.figure.Figure` built without pyplot, on its
own Agg canvas: no global state, so figures can be drawn from threads and servers and are freed
with their last reference. :func:`save_figure` writes one as a PNG atomically. Takes results and
tensors only: nothing here registers a hook. matplotlib (and Pillow, for overlays) come from the
viz extra and are imported when a picture is drawn.

Lines are drawn on log axes, which have no place for 0, Inf or NaN; so that no value goes unseen,
a 0 is drawn on the bottom edge (with a hollow circle, labelled "0 (on the bottom edge)"), +Inf on
the top edge, and a layer whose values hold NaN or Inf gets a red cross near the top (labelled
"NaN/Inf (count)"). A layer with no value at all (no parameters, no gradient) is a gap.

One file past 500 lines: the figures share the conventions above (log axes, edges for 0 and Inf, crosses
for NaN) and the Agg canvas they are drawn on.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch

from ..errors import HookscopeError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..analysis._rows import StatRow
    from ..analysis.cam import CamMaps
    from ..analysis.diff import Diff, DiffRow
    from ..analysis.gradflow import FlowRow, GradientFlow

__all__ = ["figure", "plot_cams", "plot_diff", "plot_gradient_flow", "plot_trace", "save_figure"]

_MAX_TICKS = 40  # more labels than this along an axis overlap, whatever the figure's width
_LABEL_CHARS = 36  # longer qualified names keep their tail, the part that tells layers apart
_RED = "tab:red"


class _HasRows(Protocol):
    """A trace (or a watch): statistics rows in execution order."""

    @property
    def rows(self) -> Sequence[StatRow]: ...


# --- figures and axes shared by every plot ------------------------------------------------------------
def figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches at 100 dpi, on its own Agg canvas (no pyplot,
    no global state), the canvas every picture of hookscope is drawn on.

    Example:
        >>> [round(v) for v in figure(3, 2).get_size_inches()]
        [3, 2]
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HookscopeError(
            "drawing plots needs matplotlib, from the viz extra: pip install 'hookscope[viz]'"
        ) from None
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _short(label: str) -> str:
    return label if len(label) <= _LABEL_CHARS else "..." + label[-(_LABEL_CHARS - 3):]


def _width(n: int) -> float:
    """Wide enough for ``n`` points, within what a screen or a report shows."""
    return min(20.0, max(8.0, 4.0 + 0.05 * n))


def _label_axis(ax: Axes, labels: Sequence[str], *, keep: int | None = None) -> int:
    """Layer names under the x axis, thinned to at most ``_MAX_TICKS`` (``keep`` always shown);
    returns the length of the longest label shown."""
    n = len(labels)
    step = max(1, math.ceil(n / _MAX_TICKS))
    shown = set(range(0, n, step))
    if keep is not None:  # the marked layer's own name, clear of its thinned neighbours
        shown = {i for i in shown if abs(i - keep) * 2 >= step} | {keep}
    ticks = sorted(shown)
    names = [_short(labels[i]) for i in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=7)
    ax.set_xlim(-0.5, n - 0.5)
    return max((len(s) for s in names), default=0)


def _leave_room(fig: Figure, chars: int, *, title_lines: int = 1) -> None:
    """Grow the figure (made as tall as its panels) by room for the names below and the title above.

    Margins are worked out by hand: a layout engine costs more than drawing the lines themselves.
    """
    width, panels = fig.get_size_inches()
    bottom, top = 0.3 + 0.05 * chars, 0.25 + 0.2 * title_lines
    height = panels + bottom + top
    fig.set_size_inches(width, height)
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.25 / width, bottom=bottom / height, top=1 - top / height,
                        hspace=0.08)


Values: TypeAlias = Sequence[float | None]  # one per layer; None: the layer has no such number (a gap, unmarked)


def _finite_positive(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _log_axis(ax: Axes, values: Iterable[float | None], *, floor: float = 1e-8) -> tuple[float, float]:
    """A log y axis spanning the positive finite values; its limits (zeros and Inf go on the edges)."""
    shown = _finite_positive(values)
    lo, hi = (min(shown) / 3, max(shown) * 3) if shown else (floor, 1.0)
    if hi <= lo:
        hi = lo * 10
    ax.set_ylim(lo, hi)  # first: with limits set, the scale does not autoscale over all-zero data
    ax.set_yscale("log", nonpositive="clip")
    return lo, hi


def _on_axis(ys: Values, lo: float, hi: float) -> list[float]:
    """The y a line draws for each value on a log axis from ``lo`` to ``hi``.

    A log scale has no place for 0 or Inf, and would leave an empty panel for an all-zero
    gradient: 0 is drawn on the bottom edge and +Inf on the top edge; no value and NaN are gaps
    (a NaN is marked by :func:`_mark_edges`).

    Example:
        >>> _on_axis([0.0, 5.0, math.inf, None, math.nan], 1.0, 10.0)
        [1.0, 5.0, 10.0, nan, nan]
    """
    return [math.nan if v is None or math.isnan(v) else lo if v <= 0 else hi if math.isinf(v) else v for v in ys]


def _zeros(series: Iterable[Values], skip: Iterable[int] = ()) -> list[int]:
    """The layers (but those in ``skip``) where some line's value is exactly 0."""
    left_out = set(skip)
    return [i for i, vs in enumerate(zip(*series)) if i not in left_out and any(v == 0 for v in vs if v is not None)]


def _non_finite(series: Iterable[Values]) -> list[int]:
    """The layers where some line's value is NaN or Inf."""
    return [i for i, vs in enumerate(zip(*series)) if any(v is not None and not math.isfinite(v) for v in vs)]


def _mark_edges(ax: Axes, zeros: Sequence[int], bad: Sequence[int], lo: float) -> None:
    """Hollow circles on the bottom edge at the ``zeros``, so an exact 0 reads as one and not as a
    tiny value; red crosses near the top at the ``bad`` layers, whose NaN or Inf no line can show."""
    if zeros:
        ax.plot(zeros, [lo] * len(zeros), linestyle="none", marker="o", markersize=5, markerfacecolor="none",
                color="0.3", clip_on=False, zorder=3, label="0 (on the bottom edge)")
    if bad:  # in axes fraction: a NaN has no height, and the top edge is where Inf values go
        ax.plot(bad, [0.95] * len(bad), linestyle="none", marker="X", markersize=6, color=_RED,
                transform=ax.get_xaxis_transform(), zorder=3, label=f"NaN/Inf ({len(bad)})")


def _draw(ax: Axes, x: Sequence[int], series: dict[str, Values], lo: float, hi: float, *,
          bad: Sequence[int] | None = None, **style: Any) -> None:
    """Each series as a line (see :func:`_on_axis`), then its zeros and NaN/Inf marked on the edges;
    ``bad`` (the layers holding NaN or Inf) is found from the values when not given."""
    for label, ys in series.items():
        ax.plot(x, _on_axis(ys, lo, hi), label=label, **style)
    bad = _non_finite(series.values()) if bad is None else bad
    _mark_edges(ax, _zeros(series.values(), bad), bad, lo)


def _mark(axes: Sequence[Axes], x: float, label: str, text: str) -> None:
    """A red vertical line at ``x`` on every panel, and ``text`` beside it on the first."""
    for ax in axes:
        ax.axvline(x, color=_RED, linestyle="--", linewidth=1.2, label=label)
    axes[0].text(x, 1.0, f" {text}", transform=axes[0].get_xaxis_transform(), color=_RED,
                 fontsize=8, ha="left", va="bottom", clip_on=False)


# --- CAM methods side by side ---------------------------------------------------------------------------
def _cam_title(result: CamMaps, index: int, class_names: Sequence[str] | None) -> str:
    """The method, the class explained (with its name) and its score: the class's logit (the model's output
    for it, before any softmax), or what a target function returned."""
    target = None if result.targets is None else int(result.targets[index])
    if target is None:
        said = "no class"
    elif class_names is None:
        said = f"class {target}"
    elif not 0 <= target < len(class_names):
        raise HookscopeError(f"class_names holds {len(class_names)} names but {result.method} explains class "
                             f"{target}; pass one name per output of the model")
    else:
        said = f"class {target} ({class_names[target]})"
    what = "score" if target is None else "logit"
    score = "" if result.scores is None else f"\n{what} {float(result.scores[index]):.4g}"
    return f"{result.method}\n{said}{score}"


def _image_array(t: torch.Tensor) -> Any:
    """A 3 x H x W tensor in [0, 1] as the H x W x 3 array imshow takes."""
    return t.detach().clamp(0, 1).permute(1, 2, 0).contiguous().numpy()


def plot_cams(picture: torch.Tensor, results: Sequence[CamMaps], *, index: int = 0,
              class_names: Sequence[str] | None = None, alpha: float = 0.5) -> Figure:
    """The input image, then each CAM result's map blended over it, side by side.

    Every result is one method (or layer) run on the same input; panel ``i + 1`` shows
    ``results[i].maps[index]`` through :func:`hookscope.viz.overlay` (jet colormap, weight
    ``alpha``), titled with the method, the class it explains (and its name from ``class_names``)
    and that class's logit (the model's output for it, before softmax; ``score`` for a target function).

    Signals' results (maps ``B x L``) go to :func:`hookscope.viz.plot_cam_curves`, volumes' (``B x D x H x W``) to
    :func:`hookscope.viz.plot_cam_slices`, with ``picture`` the signal or the volume.

    Args:
        picture: the input image, 3 x H x W in [0, 1] (undo any normalisation first).
        results: :class:`~hookscope.analysis.cam.CamMaps` objects of the same input batch.
        index: which image of the batch to show.
        class_names: the model's class names, indexed by class.
        alpha: weight of the map in each overlay, from 0 (image only) to 1 (map only).

    Example:
        >>> import hookscope, hookscope.zoo
        >>> net, x = hookscope.zoo.TinyResNet().eval(), torch.rand(1, 3, 32, 32)
        >>> res = [hookscope.cam(net, x, layers="layer2", method=m, target=3) for m in ("gradcam", "cam")]
        >>> fig = plot_cams(x[0], res)
        >>> [ax.get_title().splitlines()[:2] for ax in fig.axes]
        [['input'], ['gradcam', 'class 3'], ['cam', 'class 3']]
    """
    from .overlay import as_image, overlay

    results = list(results)
    if not results:
        raise HookscopeError("plot_cams needs at least one CamMaps; pass [hookscope.cam(model, x, method=m) "
                             "for m in methods]")
    ndim = results[0].maps.ndim
    if ndim in (2, 4):  # signals (B x L) and volumes (B x D x H x W) have pictures of their own
        from .cam_signals import plot_cam_curves, plot_cam_slices

        return (plot_cam_curves if ndim == 2 else plot_cam_slices)(picture, results, index=index)
    image = as_image(picture)
    for r in results:
        if r.maps.ndim != 3:
            raise HookscopeError(f"the {r.method} result holds maps of {r.maps.ndim - 1} dimensions, not the 2 of "
                                 "images; draw each kind of input in its own plot_cams call")
        if not -r.maps.shape[0] <= index < r.maps.shape[0]:
            raise HookscopeError(f"index={index} is out of range: the {r.method} result holds "
                                 f"{r.maps.shape[0]} map(s); pass 0 to {r.maps.shape[0] - 1}")
    titles = [_cam_title(r, index, class_names) for r in results]
    fig = figure(2.4 * (len(results) + 1), 3.2)
    axes = fig.subplots(1, len(results) + 1, squeeze=False)[0]
    axes[0].imshow(_image_array(image), interpolation="nearest")
    axes[0].set_title("input", fontsize=9)
    for ax, r, title in zip(axes[1:], results, titles):
        ax.imshow(_image_array(overlay(image, r.maps[index], alpha=alpha)), interpolation="nearest")
        ax.set_title(title, fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    names = dict.fromkeys(", ".join(r.layers) for r in results)
    fig.suptitle(f"layer{'s' if len(names) > 1 else ''}: {'; '.join(names)}", fontsize=9, y=0.04, va="bottom")
    fig.subplots_adjust(left=0.01, right=0.99, top=0.78, bottom=0.1, wspace=0.05)
    return fig


# --- gradient flow --------------------------------------------------------------------------------------
def _in_execution_order(rows: Sequence[FlowRow], trace: _HasRows | None) -> list[FlowRow]:
    """The flow's rows in the order their modules' forward calls finished (as the trace saw them);
    without a trace, as the flow holds them (``named_modules()`` order)."""
    if trace is None:
        return list(rows)
    seen = dict.fromkeys(r.module for r in trace.rows if r.phase == "forward")
    order = {name: i for i, name in enumerate(seen)}
    return [r for _, r in sorted(enumerate(rows), key=lambda p: (order.get(p[1].module, len(order)), p[0]))]


def _max_grads(trace: _HasRows, names: Sequence[str]) -> dict[str, Values]:
    """Per layer, the largest |grad| of its own parameters and of the gradients reaching its outputs."""
    found: dict[str, dict[str, float]] = {"grad_param": {}, "grad_output": {}}
    for r in trace.rows:
        if r.which in found:
            kept = found[r.which]
            old = kept.get(r.module, r.absmax)
            kept[r.module] = math.nan if math.isnan(old) or math.isnan(r.absmax) else max(old, r.absmax)
    words = {"grad_param": "max |grad| of parameters", "grad_output": "max |grad| at outputs"}
    return {words[w]: [by.get(n) for n in names] for w, by in found.items() if by}


def _shade_bands(ax: Axes, flow: GradientFlow, lo: float, hi: float) -> None:
    if 0 < flow.vanish and lo < flow.vanish:
        ax.axhspan(lo, flow.vanish, color="tab:blue", alpha=0.12, label=f"vanishing (< {flow.vanish:g})")
    if math.isfinite(flow.explode) and flow.explode < hi:
        ax.axhspan(flow.explode, hi, color=_RED, alpha=0.12, label=f"exploding (> {flow.explode:g})")


def _mark_flagged(ax: Axes, rows: Sequence[FlowRow]) -> None:
    """One vertical stripe per flagged layer: blue vanishing, red exploding or non-finite."""
    for flags, colour in ((("vanishing",), "tab:blue"), (("exploding", "non-finite"), _RED)):
        xs = [i for i, r in enumerate(rows) if r.flag in flags]
        if xs:
            ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors=colour, alpha=0.45, linewidth=2,
                      label=f"{' or '.join(flags)} ({len(xs)})")


def plot_gradient_flow(flow: GradientFlow, *, trace: _HasRows | None = None) -> Figure:
    """Per-layer gradient magnitudes on log scales, with the vanishing and exploding bands.

    Top panel: the L2 norms :func:`hookscope.gradient_flow` flags (of each layer's own parameter
    gradients, and with a trace of the gradients reaching its outputs), over the bands below
    ``flow.vanish`` and above ``flow.explode``; every flagged layer is marked by a vertical stripe.
    Bottom panel, per element: the root mean square ``|grad params| / sqrt(params)`` and, from a
    trace, the largest |grad| (of the parameters with ``param_grads=True``, and at the outputs).
    A zero gradient is drawn on the bottom edge (hollow circle), an infinite one on the top edge,
    and a layer whose gradients are NaN or Inf gets a red cross near the top of the panel.

    Args:
        flow: what :func:`hookscope.gradient_flow` returned.
        trace: the ``hookscope.trace(..., keep="all")`` of the same backward pass (optional): puts
            the layers in execution order (the order their forward calls finished) and adds the
            largest gradients. Without it, layers come in ``named_modules()`` order.

    Example:
        >>> import hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> net(torch.ones(1, 2)).sum().backward()
        >>> fig = plot_gradient_flow(hookscope.gradient_flow(net))
        >>> [line.get_label() for line in fig.axes[0].lines]
        ['|grad params| (L2 norm)']
    """
    rows = _in_execution_order(flow.rows, trace)
    if not rows:
        raise HookscopeError("the gradient flow holds no layer, so there is nothing to plot")
    x = list(range(len(rows)))
    norms: dict[str, Values] = {"|grad params| (L2 norm)": [r.param_norm for r in rows]}
    if any(r.act_norm is not None for r in rows):
        norms["|grad output| (L2 norm)"] = [r.act_norm for r in rows]
    each: dict[str, Values] = {"rms |grad| of parameters": [
        None if r.param_norm is None or not r.params else r.param_norm / math.sqrt(r.params) for r in rows]}
    if trace is not None:
        each.update(_max_grads(trace, [r.module for r in rows]))
    fig = figure(_width(len(rows)), 4.8)
    top, bottom = fig.subplots(2, 1, sharex=True)
    lo, hi = _log_axis(top, [v for ys in norms.values() for v in ys] + [flow.vanish, flow.explode])
    _shade_bands(top, flow, lo, hi)
    _mark_flagged(top, rows)
    low = _log_axis(bottom, [v for ys in each.values() for v in ys])
    for ax, lines, limits in ((top, norms, (lo, hi)), (bottom, each, low)):
        # dots: a layer between two without parameters stays visible
        _draw(ax, x, lines, *limits, marker=".", markersize=4, linewidth=1.2)
    top.set_ylabel("norm")
    bottom.set_ylabel("per element")
    for ax in (top, bottom):
        ax.legend(fontsize=7, loc="best")
        ax.grid(True, which="major", alpha=0.3)
    chars = _label_axis(bottom, [r.module or "(root)" for r in rows])
    flagged = sum(r.flag in ("vanishing", "exploding", "non-finite") for r in rows)
    top.set_title(f"gradient flow: {len(rows)} layers, {flagged} flagged", fontsize=10)
    _leave_room(fig, chars)
    return fig


# --- trace ----------------------------------------------------------------------------------------------
def _trace_labels(outputs: Sequence[StatRow]) -> list[str]:
    """Each output's label: the module, ``#call`` if called more than once, the path if not the output."""
    calls: dict[str, set[int]] = {}
    for r in outputs:
        calls.setdefault(r.module, set()).add(r.call)
    return [(r.module or "(root)") + (f"#{r.call}" if len(calls[r.module]) > 1 else "")
            + ("" if r.path == "output" else r.path[len("output"):] if r.path.startswith("output") else f" {r.path}")
            for r in outputs]


def _position(row: StatRow, outputs: Sequence[StatRow]) -> int:
    """Where ``row`` sits along the outputs: its own output, else its call's, else the next one to finish."""
    for same in ((lambda o: (o.module, o.call, o.path) == (row.module, row.call, row.path)),
                 (lambda o: (o.module, o.call) == (row.module, row.call)),
                 (lambda o: o.module == row.module)):
        found = next((i for i, o in enumerate(outputs) if same(o)), None)
        if found is not None:
            return found
    return next((i for i, o in enumerate(outputs) if o.index > row.index), len(outputs) - 1)


def _gradients(rows: Sequence[StatRow], outputs: Sequence[StatRow]) -> list[StatRow | None] | None:
    """The row of the gradient that reached each output (None where none did), or None if none did."""
    where = {(o.module, o.call, o.path): i for i, o in enumerate(outputs)}
    found: list[StatRow | None] = [None] * len(outputs)
    for r in rows:
        i = where.get((r.module, r.call, r.path)) if r.which == "grad_output" else None
        if i is not None and found[i] is None:
            found[i] = r
    return found if any(g is not None for g in found) else None


def _trace_panel(ax: Axes, what: str, drawn: Sequence[StatRow | None], dots: str | None) -> None:
    """The std and max |x| of each row drawn (a gap for None), its NaN and Inf marked."""
    std = [None if r is None else r.std for r in drawn]
    top = [None if r is None else r.absmax for r in drawn]
    bad = [i for i, r in enumerate(drawn) if r is not None and not r.finite]
    _draw(ax, range(len(drawn)), {f"{what} std": std, f"{what} max |x|": top}, *_log_axis(ax, std + top),
          bad=bad, marker=dots, linewidth=1.2)


def plot_trace(t: _HasRows) -> Figure:
    """Per-layer std and max |x| of every output along execution order, and of the gradients that
    reached them (a second panel, when the trace recorded them), on log scales.

    The x axis holds the forward outputs in the order the calls finished (an inner module before
    the block holding it); a gradient is drawn at the output it reached. The first row that is not
    finite (forward or backward, in the trace's order) is marked with a red vertical line at its
    layer, labelled with its module and its NaN and Inf counts, and every output (or gradient)
    holding NaN or Inf gets a red cross near the top of its panel. A std or max of 0 is drawn on
    the bottom edge (hollow circle), an infinite max on the top edge.

    Args:
        t: a finished :func:`hookscope.trace` (a :func:`hookscope.watch` works too: its rows).

    Example:
        >>> import hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> with hookscope.trace(net, keep="all") as t:
        ...     net(torch.ones(1, 2)).sum().backward()
        >>> fig = plot_trace(t)
        >>> [line.get_label() for line in fig.axes[0].lines]
        ['output std', 'output max |x|']
        >>> [line.get_label() for line in fig.axes[1].lines]  # sum() sends back ones: std 0
        ['gradient std', 'gradient max |x|', '0 (on the bottom edge)']
    """
    rows = list(t.rows)
    outputs = [r for r in rows if r.which == "output"]
    if not outputs:
        raise HookscopeError("the trace holds no outputs to plot; trace with keep='output', 'io' or 'all'")
    grads = _gradients(rows, outputs)
    fig = figure(_width(len(outputs)), 4.8 if grads else 2.6)
    axes = list(fig.subplots(2 if grads else 1, 1, sharex=True, squeeze=False)[:, 0])
    dots = "." if len(outputs) <= 60 else None
    panels: list[tuple[str, str, Sequence[StatRow | None]]] = [("forward", "output", outputs)]
    if grads:
        panels.append(("backward", "gradient", grads))
    for ax, (phase, what, drawn) in zip(axes, panels):
        _trace_panel(ax, what, drawn, dots)
        ax.set_ylabel(phase)
        ax.grid(True, which="major", alpha=0.3)
    bad = next((r for r in rows if not r.finite), None)
    where = None if bad is None else _position(bad, outputs)
    title = f"trace: {len(outputs)} outputs in execution order"
    if bad is not None and where is not None:
        counts = f"{bad.nan} NaN, {bad.inf} Inf"
        _mark(axes, where, "first non-finite", f"first non-finite: {bad.module or '(root)'} {bad.which} ({counts})")
    else:
        title += ", all finite"
    for ax in axes:
        ax.legend(fontsize=7, loc="lower left")
    chars = _label_axis(axes[-1], _trace_labels(outputs), keep=where)
    axes[0].set_title(title, fontsize=10, pad=14 if bad is not None else 6)
    _leave_room(fig, chars, title_lines=2 if bad is not None else 1)
    return fig


# --- diff -----------------------------------------------------------------------------------------------
def _diff_labels(rows: Sequence[DiffRow]) -> list[str]:
    """As the diff's table labels its rows: the name, ``#call`` if called more than once, ``[part]``."""
    calls: dict[str, set[int]] = {}
    parts: dict[tuple[str, int], int] = {}
    for r in rows:
        calls.setdefault(r.name, set()).add(r.call)
        parts[(r.name, r.call)] = parts.get((r.name, r.call), 0) + 1
    return [(r.name or "(model)") + (f"#{r.call}" if len(calls[r.name]) > 1 else "")
            + (f"[{r.part}]" if parts[(r.name, r.call)] > 1 else "") for r in rows]


def _non_finite_why(r: DiffRow) -> str:
    """Why ``r`` diverges when NaN or Inf is the reason ("" if not): a NaN in one run only is left
    out of the errors (they may read 0), and an infinite error has no place on a log axis.

    Example:
        >>> from hookscope.analysis.diff import DiffRow
        >>> _non_finite_why(DiffRow("fc", 0, 0, "differs", max_abs=0.0, nan_b_only=3))
        'NaN in B only'
    """
    said = [f"NaN in {run} only" for n, run in ((r.nan_a_only, "A"), (r.nan_b_only, "B")) if n]
    if math.isinf(r.max_abs):
        said.append("|a - b| = Inf")
    return ", ".join(said)


def plot_diff(d: Diff) -> Figure:
    """The error of every compared output along execution order (log scale), with the tolerance.

    Two lines: ``max |a - b|`` (against the dashed ``atol``) and ``max |a - b| / max |b|``
    (against the dotted ``rtol``); an element diverges where ``|a - b| > atol + rtol * |b|``, so
    every row beyond tolerance (or of another shape or structure) gets a light red stripe, and the
    first divergence a red dashed line labelled with its layer. Equal outputs (error 0) are drawn
    on the bottom edge, marked by hollow circles; an infinite error on the top edge. NaN in one
    run only is left out of the errors (which may then read 0): such rows, and rows with an
    infinite error, get a red cross near the top ("NaN/Inf"), and the first divergence's label
    says why (``"NaN in B only"``, ``"|a - b| = Inf"``).

    Args:
        d: what :func:`hookscope.diff` returned.

    Example:
        >>> import hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> d = hookscope.diff(net, net, torch.ones(2, 4), b=hookscope.settings(autocast=torch.bfloat16))
        >>> ax = plot_diff(d).axes[0]
        >>> [line.get_label() for line in ax.lines][:2], ax.lines[-1].get_xdata()[0]
        (['max |a - b|', 'max |a - b| / max |b|'], 0)
    """
    rows = list(d.rows)
    if not rows:
        raise HookscopeError("the diff compared nothing, so there is nothing to plot; pick modules that run")
    abs_err, rel_err = [r.max_abs for r in rows], [r.max_rel for r in rows]
    fig = figure(_width(len(rows)), 2.8)
    ax = fig.subplots()
    tols = {"atol": _row_tolerance(rows, "atol", d.atol), "rtol": _row_tolerance(rows, "rtol", d.rtol)}
    lo, hi = _log_axis(ax, abs_err + rel_err + tols["atol"] + tols["rtol"], floor=1e-12)
    bad = [i for i, r in enumerate(rows) if _non_finite_why(r)]
    _draw(ax, range(len(rows)), {"max |a - b|": abs_err, "max |a - b| / max |b|": rel_err}, lo, hi, bad=bad,
          marker="." if len(rows) <= 60 else None, linewidth=1.2)
    for (name, tol), style, line in zip(tols.items(), ("--", ":"), ax.lines[:2]):
        _tolerance_line(ax, name, tol, color=line.get_color(), linestyle=style)  # in the colour of the error it bounds
    beyond = [i for i, r in enumerate(rows) if r.diverges]
    if beyond:
        ax.vlines(beyond, 0, 1, transform=ax.get_xaxis_transform(), colors=_RED, alpha=0.2, linewidth=2,
                  label=f"beyond tolerance ({len(beyond)})")
    labels = _diff_labels(rows)
    first = next((i for i, r in enumerate(rows) if r is d.first), None)
    said = "none" if first is None else labels[first]
    if first is not None:
        why = _non_finite_why(rows[first])
        said += f" ({why})" if why else ""
        _mark([ax], first, "first divergence", f"first divergence: {said}")
    ax.set_ylabel("error")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    chars = _label_axis(ax, labels, keep=first)
    ax.set_title(f"diff: {len(rows)} outputs, first divergence: {said}\nA: {_short(d.run_a)}   B: {_short(d.run_b)}",
                 fontsize=9, pad=14 if first is not None else 6)
    _leave_room(fig, chars, title_lines=3)
    return fig


def _row_tolerance(rows: list[Any], field: str, default: float) -> list[float]:
    """The tolerance each row was judged with (rows computed in a low precision follow its own)."""
    return [v if math.isfinite(v := float(getattr(r, field, math.nan))) else default for r in rows]


def _tolerance_line(ax: Any, name: str, tol: list[float], **style: Any) -> None:
    """One tolerance: a horizontal line where every row shares it, else a step per row, labelled
    with the values it takes (a bfloat16 row is judged at bfloat16's, not at the float32 one)."""
    if max(tol) <= 0:
        return
    values = sorted(set(tol))
    label = f"{name} {values[0]:g}" if len(values) == 1 else f"{name} per output ({values[0]:g} to {values[-1]:g})"
    if len(values) == 1:
        ax.axhline(values[0], linewidth=1, label=label, **style)
    else:
        ax.step(range(len(tol)), tol, where="mid", linewidth=1, label=label, **style)


# --- files ----------------------------------------------------------------------------------------------
def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Save ``fig`` as a PNG of ``fig.get_size_inches() * fig.dpi`` pixels; returns the path.

    Written to a temporary file in the same folder, then renamed over ``path``: a reader never
    sees half a picture, and a failed write leaves the old file as it was.

    Example:
        >>> import os, tempfile
        >>> fig = figure(2, 1)
        >>> path = save_figure(fig, os.path.join(tempfile.mkdtemp(), "plot.png"))
        >>> path.name, sorted(os.listdir(path.parent))
        ('plot.png', ['plot.png'])
    """
    if not hasattr(fig, "savefig"):
        raise HookscopeError(f"save_figure takes a matplotlib Figure (what plot_* returns), not {type(fig).__name__}")
    out = Path(path)
    if not out.parent.is_dir():
        raise HookscopeError(f"cannot write {out}: the folder {out.parent} does not exist; create it first")
    if out.is_dir():
        raise HookscopeError(f"cannot write {out}: it is a folder; give a file path such as {out / 'plot.png'}")
    # a fresh name opened with "x" keeps the umask's permissions, which mkstemp's 0600 would not
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            fig.savefig(f, format="png", dpi=fig.dpi)
        os.replace(tmp, out)
    except OSError as e:
        raise HookscopeError(f"cannot write {out}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone already after a successful rename
    return out
