"""The parameter side of a step: the sentinel's one check over every gradient, and on sampled steps
the norms, the gradients' statistics and the update ratio of the selected layers' parameters."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._reduce import STATS, tensor_stats
from ._distributed import whole
from ._histogram import histogram
from ._telemetry import Histogram, TelemetryRow, ratio

__all__ = ["Owned", "ParamSide", "all_finite", "stored"]

Owned = tuple[str, str, nn.Parameter]  # (layer, parameter name in it, parameter)


def stored(g: torch.Tensor) -> torch.Tensor:
    """The values a gradient holds: a sparse one's stored values (``nn.Embedding(sparse=True)``),
    a dense one as it is.

    Example:
        >>> stored(torch.zeros(3, 2).to_sparse()).numel(), stored(torch.ones(2)).numel()
        (0, 2)
    """
    if g.layout == torch.sparse_coo:
        return g.coalesce().values()
    return g.to_dense() if g.layout != torch.strided else g


def all_finite(grads: Sequence[torch.Tensor], loss: torch.Tensor | None) -> bool:
    """Whether every gradient and the loss are finite: one fused norm over the gradients
    (``torch.nn.utils.get_total_norm``, ``foreach`` kernels), one ``isfinite``, one host
    synchronisation. A norm that overflows although every value is finite (float16 gradients
    past 65504) is told apart by an exact check, taken only then.

    Example:
        >>> all_finite([torch.ones(3), torch.zeros(2)], torch.tensor(1.0)), all_finite([torch.ones(1)], torch.tensor(float("nan")))
        (True, False)
    """
    grads = [stored(g) for g in grads]
    parts = [whole(torch.nn.utils.get_total_norm(grads)).float()] if grads else []
    if loss is not None:
        parts.append(loss.detach().float().sum().to(parts[0].device if parts else loss.device))
    if not parts:
        return True
    if bool(torch.isfinite(torch.stack(parts).sum())):
        return True
    exact = [whole(g) for g in grads] + ([loss.detach()] if loss is not None else [])
    return all(bool(torch.isfinite(t).all()) for t in exact)


class ParamSide:
    """The parameters of the selected layers on one sampled step: :meth:`before` reads them and
    their gradients just before the update, :meth:`rows` after it."""

    def __init__(self, owned: list[Owned], *, update: bool, bins: int | torch.Tensor | None = None) -> None:
        self._owned = owned
        self._update = update
        self._bins = bins
        self._counted: list[Histogram] = []
        self._norms: list[float] = []
        self._grads: list[list[float] | None] = []
        self._counts: list[int] = []
        self._saved: dict[int, torch.Tensor] = {}

    def snapshot(self) -> None:
        """Keep a copy of each parameter as it is now: the update is measured from it."""
        if self._update:
            with torch.no_grad():
                self._saved = {id(p): p.detach().clone() for _, _, p in self._owned}  # a shared parameter once

    def before(self) -> None:
        """Norms of the parameters (of their copies, where :meth:`snapshot` took them) and statistics
        of their gradients, just before the update."""
        with torch.no_grad():
            # without an optimizer the update already happened: the norm is the copy's, from the step's start
            params = [whole(self._saved.get(id(p), p).detach()) for _, _, p in self._owned]
            norms = [torch.linalg.vector_norm(p).double() for p in params]
            values = [stored(whole(p.grad)) if p.grad is not None else None for _, _, p in self._owned]
            self._counts = [p.numel() if v is None else v.numel() for (_, _, p), v in zip(self._owned, values)]
            stats = [tensor_stats(v) if v is not None else None for v in values]
            self._norms = [float(v) for v in torch.stack(norms).cpu().tolist()] if norms else []
            found = [s for s in stats if s is not None]
            host = iter(torch.stack([s.to(torch.float64).cpu() for s in found]).tolist() if found else [])
            self._grads = [next(host) if s is not None else None for s in stats]
            if self._bins is not None:
                self._counted = [Histogram(-1, layer, of, name, *histogram(t, self._bins))
                                 for layer, name, p in self._owned
                                 for of, t in (("param", whole(self._saved.get(id(p), p))),
                                               ("grad_param", None if p.grad is None else stored(whole(p.grad))))
                                 if t is not None]

    def histograms(self, step: int) -> list[Histogram]:
        """Each parameter's histogram and its gradient's, as :meth:`before` found them."""
        return [dataclasses.replace(h, step=step) for h in self._counted]

    def rows(self, step: int) -> list[TelemetryRow]:
        """One ``param`` row per parameter (see :class:`TelemetryRow`)."""
        deltas: list[float | None] = [None] * len(self._owned)
        if self._update and self._saved:
            with torch.no_grad():
                moved = [torch.linalg.vector_norm(whole(p.detach()) - whole(self._saved[id(p)])).double()
                         for _, _, p in self._owned]
                deltas = [float(v) for v in torch.stack(moved).cpu().tolist()]
        out = []
        for (layer, name, p), norm, grad, n, delta in zip(self._owned, self._norms, self._grads, self._counts, deltas):
            row = TelemetryRow(step, layer, "param", name, numel=p.numel(), norm=norm, update_norm=delta,
                               update_ratio=None if delta is None else ratio(delta, norm))
            out.append(dataclasses.replace(row, **_grad_fields(n, grad)))  # a sparse gradient: its stored values
        self._saved = {}
        return out


def _grad_fields(n: int, grad: list[float] | None) -> dict[str, Any]:
    if grad is None:
        return {}
    values = dict(zip(STATS, grad))
    mean, std = values["mean"], values["std"]
    rms = math.sqrt(mean * mean + std * std)
    return {"mean": mean, "std": std, "min": values["min"], "max": values["max"], "rms": rms,
            "zeros": values["zeros"] / n if n else math.nan, "nan": int(values["nan"]), "inf": int(values["inf"]),
            "grad_norm": rms * math.sqrt(n)}
