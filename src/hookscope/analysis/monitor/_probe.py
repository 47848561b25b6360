"""The hooks of one sampled step: registered when the step before it ends, removed when it ends.

The statistics of inputs, outputs and output gradients come from the shared statistics engine
(``_recorder``: reduced on the tensor's device inside the hook, so no later in-place op rewrites
them); the dead units and the histograms from hooks of the monitor's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..._tree import first_tensor
from ...core.compiled import eager
from ...core.hooks import HookGroup
from .._recorder import Recorder, refresh_for
from .._rows import Pending, StatRow, gather
from ._histogram import Counted, histogram
from ._telemetry import Histogram, TelemetryRow, merged

__all__ = ["Probe", "alive_units"]


def alive_units(t: torch.Tensor) -> torch.Tensor:
    """Which units of ``t`` hold a value other than 0 in some sample: channels (dimension 1) of a
    4-D or 5-D tensor, else the last dimension; every element of a 1-D one.

    Example:
        >>> alive_units(torch.tensor([[0.0, 1.0], [0.0, 0.0]])).tolist()
        [False, True]
        >>> alive_units(torch.zeros(0, 3)).tolist()  # an empty batch: no unit seen alive
        [False, False, False]
    """
    x = t.detach()
    axis = 1 if x.dim() in (4, 5) else x.dim() - 1
    units = x.shape[axis]
    if x.numel() == 0:
        return torch.zeros(units, dtype=torch.bool, device=x.device)
    return x.movedim(axis, 0).reshape(units, -1).ne(0).any(dim=1)


class Probe:
    """Hooks on the selected layers for one step; :meth:`rows` and :meth:`histograms` read them."""

    def __init__(self, model: nn.Module, root: nn.Module, selected: list[tuple[str, nn.Module]], *,
                 keep: frozenset[str], dead: bool, bins: int | torch.Tensor | None) -> None:
        self._events: list[Pending] = []
        self._rec = Recorder(selected, keep=keep, sink=self._events.append, root=root) if keep else None
        self._refresh = refresh_for(model, root, selected)
        self._selected = selected
        self._dead, self._bins, self._grads = dead, bins, "grad_output" in keep
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
            if self._dead or self._bins is not None:
                for name, module in self._selected:
                    # eager: traced by Dynamo, each layer's hook would be compiled anew up to its recompile limit
                    # own hook: dead units and histograms, which the statistics engine does not take
                    self._group.add(module.register_forward_hook(eager(self._forward(name)), always_call=False))
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

    def _forward(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self._group.closed or self._off:
                return
            t = first_tensor(output)
            if t is None or not (t.is_floating_point() or t.is_complex()) or t.dim() == 0:
                return
            if self._dead and t.numel():  # an empty batch shows no unit, dead or alive
                alive = alive_units(t)
                old = self._alive.get(name)
                self._alive[name] = alive if old is None or old.shape != alive.shape else old | alive
            if self._bins is not None and (name, "output") not in self._counted:
                self._counted[(name, "output")] = histogram(t, self._bins)
                if self._grads and t.requires_grad and torch.is_grad_enabled():
                    # own hook: the histogram of the gradient arriving at this output
                    self._group.add(t.register_hook(eager(self._grad(name))))
        return hook

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
