"""What a monitor keeps of one sampled step: :class:`TelemetryRow` (one per layer and tensor, one
per parameter, one for the step), :class:`Histogram`, and the :class:`Telemetry` result."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from ...core.result import Result, missing
from ...core.text import num, table
from .._rows import StatRow

__all__ = ["FIELDS", "Histogram", "Telemetry", "TelemetryRow", "merged", "ratio", "scalars"]


@dataclasses.dataclass(frozen=True)
class TelemetryRow:
    """One row of a sampled step (and one line of the JSON lines and CSV logs).

    ``what`` says what the row describes:

    - ``"input"``, ``"output"``, ``"grad_output"``: a tensor a selected ``layer`` received, returned,
      or the gradient that arrived at its output; ``path`` places it (``input[0]``, ``output``,
      ``output[1]``). ``mean`` ... ``inf`` are over every call of the layer in the step, as if the
      calls' tensors were one (``calls`` says how many); ``zeros`` is a fraction, ``nan`` and ``inf``
      are counts; ``rms`` is ``sqrt(mean(x**2))``. On ``output`` rows ``dead`` is the fraction of
      units (channels of a 4-D or 5-D output, else the last dimension) that were exactly 0 for every
      sample of every call.
    - ``"param"``: one parameter of ``layer`` (``path`` its name, such as ``weight``): ``norm`` is
      ``||w||`` before the update, ``grad_norm`` ``||w.grad||``, ``update_ratio``
      ``||w_after - w_before|| / ||w_before||``; ``mean`` ... ``inf`` describe its ``.grad``.
    - ``"step"``: the step itself (``layer`` is ``""``): ``loss`` and ``lr`` where known;
      ``skipped`` is ``True`` on a step whose update did not run (``torch.amp.GradScaler`` found
      Inf or NaN gradients and did not call ``optimizer.step()``; the sentinel raised, or cleared
      the gradients under ``nonfinite="skip"``), ``note`` then says why, and its ``param`` rows
      have no ``update_norm`` or ``update_ratio`` (``None``: no update was measured, not a zero one).
    - ``"nonfinite"``: the step's sentinel found a NaN or an Inf; ``layer`` names the module where
      it appeared (``""`` if unknown) and ``note`` says it in words.

    Fields that do not apply to a row are ``None``.
    """

    step: int
    layer: str
    what: str
    path: str
    numel: int | None = None
    calls: int | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    rms: float | None = None
    zeros: float | None = None
    nan: int | None = None
    inf: int | None = None
    dead: float | None = None
    norm: float | None = None
    grad_norm: float | None = None
    update_norm: float | None = None
    update_ratio: float | None = None
    loss: float | None = None
    lr: float | None = None
    skipped: bool | None = None
    note: str = ""


FIELDS = tuple(f.name for f in dataclasses.fields(TelemetryRow))
"""The columns of the CSV log, in order."""


@dataclasses.dataclass(frozen=True)
class Histogram:
    """A histogram of one tensor of a sampled step: ``counts[i]`` values in
    ``[edges[i], edges[i + 1])`` (the last bin closed); every value is counted somewhere:
    ``nan``, ``posinf``, ``neginf``, and ``below`` / ``above`` the edges (fixed edges only).

    ``of`` is ``"output"``, ``"grad_output"`` (the layer's first call in the step), ``"param"`` (the
    parameter just before the update) or ``"grad_param"`` (its ``.grad``); ``path`` is the
    parameter's name, else the same as ``of``.
    """

    step: int
    layer: str
    of: str
    path: str
    edges: list[float]
    counts: list[int]
    nan: int
    posinf: int
    neginf: int
    below: int
    above: int

    @property
    def total(self) -> int:
        """Every value counted: the bins, the non-finite ones and those beyond the edges."""
        return sum(self.counts) + self.nan + self.posinf + self.neginf + self.below + self.above


def merged(step: int, rows: list[StatRow], *, dead: float | None = None) -> TelemetryRow:
    """One row from the statistics of every call of one layer's tensor in the step.

    Example:
        >>> import torch
        >>> from .._rows import event, gather
        >>> parts = gather([event("fc", torch.tensor([1.0, 3.0])), event("fc", torch.tensor([5.0, 7.0]), call=1)])
        >>> row = merged(4, parts)
        >>> row.mean, round(row.std, 6), row.min, row.max, row.calls
        (4.0, 2.236068, 1.0, 7.0, 2)
    """
    first = rows[0]
    n = sum(r.numel for r in rows)
    if len(rows) == 1:
        mean, std = first.mean, first.std
    else:
        mean = sum(r.mean * r.numel for r in rows) / n if n else math.nan
        square = sum((r.std ** 2 + r.mean ** 2) * r.numel for r in rows) / n if n else math.nan
        std = math.sqrt(max(square - mean * mean, 0.0)) if math.isfinite(square - mean * mean) else math.nan
    rms = math.sqrt(std * std + mean * mean) if n else math.nan
    zeros = sum(r.zero_frac * r.numel for r in rows) / n if n else math.nan
    return TelemetryRow(step, first.module, first.which, first.path, numel=n, calls=len(rows), mean=mean, std=std,
                        min=min((r.min for r in rows), key=_nan_first), max=max((r.max for r in rows), key=_nan_last),
                        rms=rms, zeros=zeros, nan=sum(r.nan for r in rows), inf=sum(r.inf for r in rows), dead=dead)


def _nan_first(v: float) -> float:
    return -math.inf if math.isnan(v) else v  # a NaN minimum stays NaN, as torch gives it


def _nan_last(v: float) -> float:
    return math.inf if math.isnan(v) else v


_SHOWN = ("mean", "std", "min", "max", "rms", "zeros", "nan", "inf", "dead", "norm", "grad_norm", "update_ratio")


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else num(v)
    return str(v)


class Telemetry(Result):
    """What a monitor saw on one sampled step: :attr:`rows` (see :class:`TelemetryRow`) and
    :attr:`histograms`; ``t["layer1.0.conv1"]`` gives one layer's rows, ``in`` agrees.

    Example:
        >>> t = Telemetry(3, [TelemetryRow(3, "fc", "output", "output", mean=0.5)], [])
        >>> t["fc"][0].mean, "fc" in t, "conv" in t
        (0.5, True, False)
    """

    _result_fields = FIELDS

    def __init__(self, step: int, rows: list[TelemetryRow], histograms: list[Histogram]) -> None:
        self.step = step
        self.rows = rows
        self.histograms = histograms

    def layers(self) -> list[str]:
        """The layers that have rows, in order (``""`` for the step's own row not included)."""
        return list(dict.fromkeys(r.layer for r in self.rows if r.layer))

    def __getitem__(self, layer: str) -> list[TelemetryRow]:
        found = [r for r in self.rows if r.layer == layer] if isinstance(layer, str) and layer else []
        if not found:
            raise missing(layer, "layer", self.layers())
        return found

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, str) and bool(layer) and any(r.layer == layer for r in self.rows)

    def scalar(self, name: str) -> float:
        """One scalar as the writers name it (``"grad_norm/fc"``, ``"loss"``); see :func:`scalars`."""
        found = scalars(self)
        if name not in found:
            raise missing(name, "scalar", found)
        return found[name]

    def table(self) -> str:
        """The rows as text, one line per row (also ``str(t)``)."""
        head = ["layer", "what", "path", *_SHOWN]
        body = [[r.layer or "(step)", r.what, r.path, *(_cell(getattr(r, k)) for k in _SHOWN)]
                for r in self.rows if r.what != "step"]
        step = [r for r in self.rows if r.what == "step"]
        top = f"step {self.step}" + "".join(f", {k} {_cell(getattr(step[0], k))}" for k in ("loss", "lr")
                                            if step and getattr(step[0], k) is not None)
        return "\n".join([top, *table(head, body, left={0, 1, 2})]) if body else top

    def to_dict(self) -> dict[str, Any]:
        """``step``, ``rows`` and ``histograms`` as plain data."""
        return {"step": self.step, "rows": [dataclasses.asdict(r) for r in self.rows],
                "histograms": [dataclasses.asdict(h) for h in self.histograms]}

    def __repr__(self) -> str:
        return f"Telemetry(step={self.step}, rows={len(self.rows)}, histograms={len(self.histograms)})"


_STATS = ("mean", "std", "min", "max", "rms", "zeros", "nan", "inf")


def _tag(stat: str, row: TelemetryRow, first: dict[tuple[str, str], str]) -> str:
    """``stat/layer``, and the path after it for any tensor but the layer's first of its kind."""
    lead = first.setdefault((row.layer, row.what), row.path)
    return f"{stat}/{row.layer}" if row.path == lead else f"{stat}/{row.layer}/{row.path}"


def scalars(t: Telemetry) -> dict[str, float]:
    """The step's numbers under the names the writers give them, grouped by statistic, then layer:
    ``output_mean/layer1.0.conv1`` (``input_``, ``output_``, ``grad_output_`` and each of
    mean, std, min, max, rms, zeros, nan, inf; a layer's tensors after its first of a kind add their
    path: ``output_mean/lstm/output[1][0]``), ``dead/<layer>``, and per layer over its parameters
    ``param_norm/<layer>``, ``grad_norm/<layer>``, ``update_ratio/<layer>`` (norms of all its
    parameters together), ``grad_nan/<layer>``, ``grad_inf/<layer>``; ``loss``, ``lr``,
    ``nonfinite`` (1 on a step where the sentinel found a NaN or an Inf) and ``skipped`` (1 on a
    step whose update did not run).

    Example:
        >>> t = Telemetry(0, [TelemetryRow(0, "fc", "param", "weight", norm=3.0, grad_norm=4.0, update_norm=0.3, update_ratio=0.1)], [])
        >>> scalars(t)["grad_norm/fc"], scalars(t)["update_ratio/fc"]
        (4.0, 0.09999999999999999)
    """
    out: dict[str, float] = {}
    params: dict[str, list[TelemetryRow]] = {}
    first: dict[tuple[str, str], str] = {}
    for r in t.rows:
        if r.what == "step":
            out.update({k: v for k in ("loss", "lr") if (v := getattr(r, k)) is not None})
            if r.skipped:
                out["skipped"] = 1.0
        elif r.what == "nonfinite":
            out["nonfinite"] = 1.0
        elif r.what == "param":
            params.setdefault(r.layer, []).append(r)
        else:
            out.update({_tag(f"{r.what}_{k}", r, first): float(v) for k in _STATS if (v := getattr(r, k)) is not None})
            if r.dead is not None:
                out[_tag("dead", r, first)] = r.dead
    for layer, rows in params.items():
        out.update(_layer_params(layer, rows))
    return out


def ratio(delta: float, norm: float) -> float:
    """``delta / norm``, NaN for 0 / 0 and Inf for a move away from all zeros.

    Example:
        >>> ratio(1.0, 4.0), ratio(0.0, 0.0), ratio(1.0, 0.0)
        (0.25, nan, inf)
    """
    if norm == 0:
        return math.nan if delta == 0 else math.inf
    return delta / norm


def _layer_params(layer: str, rows: Iterable[TelemetryRow]) -> dict[str, float]:
    rows = list(rows)
    out: dict[str, float] = {}
    norms = [r.norm for r in rows if r.norm is not None]
    if norms:
        out[f"param_norm/{layer}"] = math.sqrt(sum(v * v for v in norms))
    grads = [r.grad_norm for r in rows if r.grad_norm is not None]
    if grads:
        out[f"grad_norm/{layer}"] = math.sqrt(sum(v * v for v in grads))
        out[f"grad_nan/{layer}"] = float(sum(r.nan or 0 for r in rows))
        out[f"grad_inf/{layer}"] = float(sum(r.inf or 0 for r in rows))
    moved = [r.update_norm for r in rows if r.update_norm is not None]
    if norms and moved:
        total, delta = out[f"param_norm/{layer}"], math.sqrt(sum(v * v for v in moved))
        out[f"update_ratio/{layer}"] = ratio(delta, total)
    return out
