"""The parameter side of a step: the sentinel's one check over every gradient, and on sampled steps
the norms, the gradients' statistics and the update ratio of the selected layers' parameters."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..._native import Kernel, stats_kernel
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
    """Whether every gradient and the loss are finite: on the CPU one sum per gradient (a sum is
    finite exactly when every value is, unless it overflows; half the cost of a norm there), on an
    accelerator one fused norm (``torch.nn.utils.get_total_norm``, ``foreach`` kernels), then one
    ``isfinite`` and one host synchronisation. FSDP2's sharded gradients take that norm, gathered
    once. A total that overflows although every value is finite is told apart by an exact check,
    taken only then.

    Example:
        >>> all_finite([torch.ones(3), torch.zeros(2)], torch.tensor(1.0)), all_finite([torch.ones(1)], torch.tensor(float("nan")))
        (True, False)
    """
    grads = [stored(g) for g in grads]
    parts = _sums(grads)
    if loss is not None:
        parts.append(loss.detach().float().sum().to(parts[0].device if parts else loss.device))
    if not parts:
        return True
    if bool(torch.isfinite(torch.stack([p.to(parts[0].device) for p in parts]).sum())):
        return True
    exact = [whole(g) for g in grads] + ([loss.detach()] if loss is not None else [])
    return all(bool(torch.isfinite(t).all()) for t in exact)


def _sums(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """One number per device whose gradients it sums: finite when all of them are (or overflowed)."""
    if any(isinstance(g, DTensor) for g in grads):
        return [whole(torch.nn.utils.get_total_norm(grads)).float()] if grads else []
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    return [_cpu_sum(on) if device.type == "cpu" else torch.nn.utils.get_total_norm(on).float()
            for device, on in by_device.items()]


def _cpu_sum(grads: list[torch.Tensor]) -> torch.Tensor:
    """On the CPU a sum per gradient (half a norm's cost there); an accelerator's fused norm reads
    every gradient in a few kernels where one sum each would launch one kernel per gradient."""
    sums = []
    for g in grads:
        g = torch.view_as_real(g) if g.is_complex() else g  # a NaN in the imaginary part counts too
        sums.append(g.sum(dtype=torch.float32) if g.dtype in (torch.float16, torch.bfloat16) else g.sum())
    return (torch.stack(sums).sum() if len(sums) > 1 else sums[0]).float()


class ParamSide:
    """The parameters of the selected layers on one sampled step: :meth:`snapshot` copies them
    before the update, :meth:`before` reads them and their gradients just before it, :meth:`rows`
    after it.

    Plain tensors (not FSDP2's ``DTensor``) are copied into buffers that are reused from step to
    step (:meth:`spare`: a fresh allocation of every parameter's size page-faults each time). Dense
    float32/float64 CPU parameters take the C kernel: one pass copies a parameter and sums its
    squares (its norm), one pass over the parameter and its copy sums the squared differences (the
    update's norm): three reads and one write of the parameters' memory in all. Other
    plain tensors take ``foreach`` kernels: one ``_foreach_copy_``, one ``_foreach_norm``, and for
    the update one ``_foreach_sub_`` in the buffers (``w_before - w_after``) and one
    ``_foreach_norm``. No tensor of a parameter's size is allocated either way.
    """

    def __init__(self, owned: list[Owned], *, update: bool, bins: int | torch.Tensor | None = None,
                 buffers: Sequence[torch.Tensor] = ()) -> None:
        self._owned = owned
        self._update = update
        self._bins = bins
        self._counted: list[Histogram] = []
        self._norms: list[float] = []
        self._grads: list[list[float] | None] = []
        self._counts: list[int] = []
        self._saved: dict[int, torch.Tensor] = {}
        self._unique = list({id(p): p for _, _, p in owned}.values())  # a shared parameter once
        self._plain = all(not isinstance(p, DTensor) and p.layout == torch.strided for p in self._unique)
        self._buffers = list(buffers)
        self._kernel: Kernel | None = stats_kernel() if self._plain else None
        self._squares: dict[int, float] = {}  # the kernel's sum of squares of each copy, as it copied it

    def spare(self) -> list[torch.Tensor]:
        """The copies' buffers, for the next sampled step's :class:`ParamSide` to reuse."""
        return list(self._saved.values()) if self._plain else []

    def snapshot(self) -> None:
        """Keep a copy of each parameter as it is now: the update is measured from it."""
        if not self._update:
            return
        with torch.no_grad():
            if not self._plain:
                self._saved = {id(p): p.detach().clone() for p in self._unique}
                return
            params = [p.detach() for p in self._unique]
            bufs = self._buffers if _fits(self._buffers, params) else [torch.empty_like(p) for p in params]
            self._buffers = []
            self._squares = {}
            rest = []
            for param, p, b in zip(self._unique, params, bufs):
                squares = self._kernel.squares(p, into=b) if self._kernel is not None else None
                if squares is None:
                    rest.append((b, p))
                else:
                    self._squares[id(param)] = squares
            if rest:
                torch._foreach_copy_([b for b, _ in rest], [p for _, p in rest])
            self._saved = {id(p): b for p, b in zip(self._unique, bufs)}

    def before(self) -> None:
        """Norms of the parameters (of their copies, where :meth:`snapshot` took them) and statistics
        of their gradients, just before the update."""
        with torch.no_grad():
            # without an optimizer the update already happened: the norm is the copy's, from the step's start
            params = [whole(self._saved.get(id(p), p).detach()) for _, _, p in self._owned]
            values = [stored(whole(p.grad)) if p.grad is not None else None for _, _, p in self._owned]
            self._counts = [p.numel() if v is None else v.numel() for (_, _, p), v in zip(self._owned, values)]
            stats = [tensor_stats(v) if v is not None else None for v in values]
            self._norms = self._norms_of(params)
            found = [s for s in stats if s is not None]
            host = iter(torch.stack([s.to(torch.float64).cpu() for s in found]).tolist() if found else [])
            self._grads = [next(host) if s is not None else None for s in stats]
            if self._bins is not None:
                self._counted = [Histogram(-1, layer, of, name, *histogram(t, self._bins))
                                 for layer, name, p in self._owned
                                 for of, t in (("param", whole(self._saved.get(id(p), p))),
                                               ("grad_param", None if p.grad is None else stored(whole(p.grad))))
                                 if t is not None]

    def _norms_of(self, params: list[torch.Tensor]) -> list[float]:
        """Each owned parameter's norm (its copy's, where one was taken): from the squares the
        kernel summed as it copied, the rest read now."""
        known = [self._squares.get(id(p)) for _, _, p in self._owned] if self._squares else [None] * len(params)
        missing = [t for t, k in zip(params, known) if k is None]
        found = iter(_norms(missing, fused=self._plain))
        return [math.sqrt(k) if k is not None else next(found) for k in known]

    def covers(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether every one of ``params`` is among this side's (then :meth:`grads_finite` answers
        the sentinel without another pass over the gradients)."""
        mine = {id(p) for p in self._unique}
        return all(id(p) in mine for p in params)

    def grads_finite(self) -> bool:
        """Whether the gradients :meth:`before` read hold no NaN and no Inf (their counts)."""
        return all(g[6] == 0 and g[7] == 0 for g in self._grads if g is not None)

    def histograms(self, step: int) -> list[Histogram]:
        """Each parameter's histogram and its gradient's, as :meth:`before` found them."""
        return [dataclasses.replace(h, step=step) for h in self._counted]

    def _moved(self) -> list[float | None]:
        """``||w_after - w_before||`` of each owned parameter (``None`` without a copy)."""
        if not (self._update and self._saved):
            return [None] * len(self._owned)
        with torch.no_grad():
            if self._plain and self._kernel is not None:
                squares = [self._kernel.squares(p.detach(), minus=self._saved[id(p)]) for p in self._unique]
                if all(q is not None for q in squares):
                    found = {id(p): math.sqrt(q) for p, q in zip(self._unique, squares) if q is not None}
                    return [found[id(p)] for _, _, p in self._owned]
            if self._plain:
                bufs = [self._saved[id(p)] for p in self._unique]
                torch._foreach_sub_(bufs, [p.detach() for p in self._unique])  # the copies now hold -update
                found = dict(zip((id(p) for p in self._unique), _norms(bufs, fused=True)))
                return [found[id(p)] for _, _, p in self._owned]
            moved = [torch.linalg.vector_norm(whole(p.detach()) - whole(self._saved[id(p)])).double()
                     for _, _, p in self._owned]
            return [float(v) for v in torch.stack(moved).cpu().tolist()]

    def rows(self, step: int, *, updated: bool = True) -> list[TelemetryRow]:
        """One ``param`` row per parameter (see :class:`TelemetryRow`); without ``updated`` (the
        update did not run) no update is measured: ``update_norm`` and ``update_ratio`` are ``None``."""
        deltas = self._moved() if updated else [None] * len(self._owned)
        out = []
        for (layer, name, p), norm, grad, n, delta in zip(self._owned, self._norms, self._grads, self._counts, deltas):
            row = TelemetryRow(step, layer, "param", name, numel=p.numel(), norm=norm, update_norm=delta,
                               update_ratio=None if delta is None else ratio(delta, norm))
            out.append(dataclasses.replace(row, **_grad_fields(n, grad)))  # a sparse gradient: its stored values
        return out


def _fits(buffers: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> bool:
    return len(buffers) == len(params) and all(
        b.shape == p.shape and b.dtype == p.dtype and b.device == p.device and b.stride() == p.stride()
        for b, p in zip(buffers, params))


def _norms(tensors: Sequence[torch.Tensor], *, fused: bool) -> list[float]:
    """The L2 norm of each tensor, read back at once: one ``_foreach_norm`` where ``fused``."""
    if not tensors:
        return []
    norms = torch._foreach_norm(list(tensors)) if fused else [torch.linalg.vector_norm(t) for t in tensors]
    return [float(v) for v in torch.stack(list(norms)).double().cpu().tolist()]


def _grad_fields(n: int, grad: list[float] | None) -> dict[str, Any]:
    if grad is None:
        return {}
    values = dict(zip(STATS, grad))
    mean, std = values["mean"], values["std"]
    rms = math.sqrt(mean * mean + std * std)
    return {"mean": mean, "std": std, "min": values["min"], "max": values["max"], "rms": rms,
            "zeros": values["zeros"] / n if n else math.nan, "nan": int(values["nan"]), "inf": int(values["inf"]),
            "grad_norm": rms * math.sqrt(n)}
