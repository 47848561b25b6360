"""The hooks of one sampled step: registered when the step before it ends, removed when it ends.

The statistics of inputs, outputs and output gradients come from the shared statistics engine
(``_recorder``: reduced on the tensor's device inside the hook, so no later in-place op rewrites
them); the dead units and the histograms of outputs are read in that engine's own forward hook
(``on_output``), from the statistics it just took where they tell enough: a layer holds no hook of
the monitor's besides, so ``ReLU(inplace=True)`` keeps the engine's shortcut (its output told from
the pass over its input), and a module's input, the output of the one before, is reduced once.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Callable

import torch
from torch import nn

from ..._tree import first_tensor
from ...core.compiled import eager
from ...core.hooks import HookGroup
from .._recorder import Recorder, refresh_for
from .._reduce import on_host
from .._rows import Pending, StatRow, gather
from ._histogram import Counted, histogram
from ._telemetry import Histogram, TelemetryRow, merged

__all__ = ["Probe", "alive_units"]


def alive_units(t: torch.Tensor, stats: torch.Tensor | None = None) -> torch.Tensor:
    """Which units of ``t`` hold a value other than 0 in some sample: channels (dimension 1) of a
    4-D or 5-D tensor, else the last dimension; every element of a 1-D one.

    A unit is alive when its largest value or its smallest is not 0 (a NaN is not 0): one ``amax``
    and one ``amin`` over the other dimensions, which read the memory where it lies (a mask of
    ``t != 0`` would be one more tensor of ``t``'s size, and the ``any`` over it several times
    slower). ``stats``, the :data:`~hookscope.analysis._reduce.STATS` of ``t`` on the host where
    they were taken anyway, spare the passes they make needless: a tensor without zeros has every
    unit alive (no pass), one without negative values (a ReLU's output) needs only the ``amax``.

    Example:
        >>> alive_units(torch.tensor([[0.0, 1.0], [0.0, 0.0]])).tolist()
        [False, True]
        >>> alive_units(torch.zeros(0, 3)).tolist()  # an empty batch: no unit seen alive
        [False, False, False]
        >>> alive_units(torch.tensor([[0.0, -2.0, float("nan")]])).tolist()
        [False, True, True]
    """
    x = t.detach()
    axis = 1 if x.dim() in (4, 5) else x.dim() - 1
    units = x.shape[axis]
    if x.numel() == 0:
        return torch.zeros(units, dtype=torch.bool, device=x.device)
    lo, hi = -math.inf, math.inf  # unknown: both ends are read
    if stats is not None and on_host(stats):
        _, _, lo, hi, _, zeros, _, _ = stats.tolist()
        if zeros == 0:
            return torch.ones(units, dtype=torch.bool, device=x.device)
        if lo >= 0 and hi <= 0:  # every value is 0
            return torch.zeros(units, dtype=torch.bool, device=x.device)
    if x.is_complex() or x.dim() == 1:
        return x.ne(0) if x.dim() == 1 else x.movedim(axis, 0).reshape(units, -1).ne(0).any(dim=1)
    ends = [f(x, axis) for f, wanted in ((_amax, not hi <= 0), (_amin, not lo >= 0)) if wanted]  # NaN: both
    alive = ends[0].ne(0)
    return alive | ends[1].ne(0) if len(ends) > 1 else alive


def _amax(x: torch.Tensor, axis: int) -> torch.Tensor:
    return _over_all_but(x, axis, torch.amax)


def _amin(x: torch.Tensor, axis: int) -> torch.Tensor:
    return _over_all_but(x, axis, torch.amin)


def _over_all_but(x: torch.Tensor, axis: int, reduce: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``reduce`` over every dimension of ``x`` but ``axis``; a contiguous N x C x ... tensor as
    N*C rows, reduced along each row first (its memory order: as fast as a ``sum``)."""
    if axis == 1 and x.is_contiguous():
        rows = reduce(x.view(x.shape[0] * x.shape[1], -1), dim=1)
        return reduce(rows.view(x.shape[0], x.shape[1]), dim=0)
    return reduce(x, dim=tuple(d for d in range(x.dim()) if d != axis))


class Probe:
    """Hooks on the selected layers for one step; :meth:`rows` and :meth:`histograms` read them."""

    def __init__(self, model: nn.Module, root: nn.Module, selected: list[tuple[str, nn.Module]], *,
                 keep: frozenset[str], dead: bool, bins: int | torch.Tensor | None) -> None:
        self._events: list[Pending] = []
        self._dead, self._bins, self._grads = dead, bins, "grad_output" in keep
        own = dead or bins is not None
        # the dead units and histograms read each output in the recorder's own hook (on_output)
        self._rec = Recorder(selected, keep=keep, sink=self._events.append, root=root,
                             on_output=self._output if own else None) if keep or own else None
        self._refresh = refresh_for(model, root, selected)
        self._selected = selected
        self._group = HookGroup()
        self._alive: dict[str, torch.Tensor] = {}
        self._counted: dict[tuple[str, str], Counted] = {}
        self._off = False

    def pause(self, off: bool) -> None:
        """Let the model's passes go unrecorded (``True``) or recorded again."""
        self._off = off
        if self._rec is not None:
            self._rec.enabled = not off

    def attach(self) -> None:
        """Register every hook (all or none)."""
        try:
            if self._rec is not None:
                self._rec.attach()
            self._refresh.open()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Remove every hook. Idempotent."""
        if self._rec is not None:
            self._rec.close()
        self._group.remove()
        self._refresh.close()

    def _output(self, name: str, output: Any) -> None:
        """A selected layer's call finished (called from the recorder's forward hook)."""
        if self._group.closed or self._off:
            return
        t = first_tensor(output)
        if t is None or not (t.is_floating_point() or t.is_complex()) or t.dim() == 0:
            return
        if self._dead and t.numel():  # an empty batch shows no unit, dead or alive
            assert self._rec is not None
            alive = alive_units(t, self._rec.stats_of(t))
            old = self._alive.get(name)
            self._alive[name] = alive if old is None or old.shape != alive.shape else old | alive
        if self._bins is not None and (name, "output") not in self._counted:
            self._counted[(name, "output")] = histogram(t, self._bins)
            if self._grads and t.requires_grad and torch.is_grad_enabled():
                # own hook: the histogram of the gradient arriving at this output
                self._group.add(t.register_hook(eager(self._grad(name))))

    def _grad(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if not self._group.closed and not self._off and self._bins is not None:
                self._counted.setdefault((name, "grad_output"), histogram(grad, self._bins))
        return hook

    def rows(self, step: int) -> list[TelemetryRow]:
        """One row per layer and tensor, calls merged, in the order the layers were selected."""
        grouped: dict[tuple[str, str, str], list[StatRow]] = {}
        for row in gather(self._events):
            grouped.setdefault((row.module, row.which, row.path), []).append(row)
        order = {name: i for i, (name, _) in enumerate(self._selected)}
        rank = {"input": 0, "output": 1, "grad_output": 2}
        keys = sorted(grouped, key=lambda k: (order.get(k[0], len(order)), rank.get(k[1], 3)))
        out = []
        for key in keys:
            dead = self._dead_fraction(key[0]) if key[1] == "output" and key[2] == _first_path(grouped, key) else None
            out.append(merged(step, grouped[key], dead=dead))
        return out

    def _dead_fraction(self, name: str) -> float | None:
        alive = self._alive.get(name)
        return None if alive is None or alive.numel() == 0 else 1.0 - float(alive.float().mean())

    def first_nonfinite(self) -> StatRow | None:
        """The first non-finite output or output gradient seen so far, in the order they came (a
        non-finite input is no layer's doing: the first layer that outputs it is named)."""
        return next((r for r in gather(self._events) if not r.finite and r.which != "input"), None)

    def histograms(self, step: int) -> list[Histogram]:
        """The histograms of outputs and output gradients taken in this step."""
        return [Histogram(step, name, of, of, *counted) for (name, of), counted in self._counted.items()]


def _first_path(grouped: dict[tuple[str, str, str], list[StatRow]], key: tuple[str, str, str]) -> str:
    """The path of a layer's first output (``output`` or ``output[0]``...): the one dead units are of."""
    return next(k[2] for k in grouped if k[0] == key[0] and k[1] == "output")
