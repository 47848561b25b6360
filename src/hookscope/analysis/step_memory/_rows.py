"""The figures of one step turned into one row per module, in tree order, and the totals.

Each parameter and buffer belongs to the first module, in ``named_modules()`` order, that holds it
directly (a tied weight counts once), and so do its gradient and optimizer state. A module's
subtree holds it and every module whose name starts with its name and a dot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._saved import SavedTensors, distinct_bytes
from ._step import Step

__all__ = ["MemoryRow", "MemoryTotals", "rows_of", "totals_of"]

Named = list[tuple[str, nn.Module]]


@dataclass
class MemoryRow:
    """One module: what its calls made autograd save, and what it holds through a step, in bytes.

    ``saved``: storages first saved for backward while this module was the innermost one running,
    over all its calls (a module called 100 times saves 100 times); ``saved_total``: the same over
    its subtree. ``params_saved``: its own calls' saved tensors that are the model's parameters or
    buffers (memory the model holds anyway, not counted again). ``params`` (parameters and
    buffers), ``grads``, ``optimizer`` (the optimizer's state): its own; ``..._total``: its
    subtree's; ``total``: ``saved_total + params_total + grads_total + optimizer_total``.
    """

    name: str
    type: str
    depth: int
    calls: int
    saved: int
    saved_total: int
    params_saved: int
    params: int
    grads: int
    optimizer: int
    params_total: int
    grads_total: int
    optimizer_total: int
    total: int


@dataclass
class MemoryTotals:
    """The whole step, in bytes.

    ``saved``: every storage autograd saved for backward, once, the model's parameters and buffers
    left out (they are in ``params``); ``saved_outside``: the part saved while no module ran (the
    loss); ``params_saved``: the parameters and buffers autograd saved; ``saved_peak``: the most
    saved bytes alive at once; ``params`` (parameters and buffers), ``grads``, ``optimizer``;
    ``peak``: ``saved_peak + params + grads + optimizer``, what these parts can hold at once;
    ``measured_peak``: on CUDA, what the device held at the step's highest point above what it
    held before it began, plus the model's parameters and buffers there (``None`` elsewhere).
    """

    saved: int
    saved_outside: int
    params_saved: int
    saved_peak: int
    params: int
    grads: int
    optimizer: int
    peak: int
    measured_peak: int | None


def owners(selected: Named) -> dict[str, list[torch.Tensor]]:
    """Each module's own parameters and buffers, each tensor under its first holder only."""
    seen: set[int] = set()
    found: dict[str, list[torch.Tensor]] = {}
    for name, module in selected:
        found[name] = []
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if id(t) not in seen:
                seen.add(id(t))
                found[name].append(t)
    return found


def _own(selected: Named, saved: SavedTensors, step: Step) -> dict[str, tuple[int, int, int, int]]:
    """Per module: (params, grads, optimizer, params_saved) bytes of its own, storages once."""
    seen_params: set[int] = set()
    seen_grads: set[int] = set()
    seen_state: set[int] = set()
    figures = {}
    for name, own in owners(selected).items():
        grads = [step.grads[id(t)] for t in own if id(t) in step.grads]
        state = [s for t in own for s in step.state.get(id(t), ())]
        figures[name] = (distinct_bytes(own, seen_params), distinct_bytes(grads, seen_grads),
                         distinct_bytes(state, seen_state), saved.model_saved.get(name, 0))
    return figures


def _ancestors(name: str, names: set[str]) -> list[str]:
    parts = name.split(".") if name else []
    return [a for a in ("", *(".".join(parts[:i]) for i in range(1, len(parts) + 1))) if a in names]


def rows_of(selected: Named, saved: SavedTensors, step: Step) -> list[MemoryRow]:
    """One row per module, in ``named_modules()`` order."""
    own = _own(selected, saved, step)
    names = {n for n, _ in selected}
    subtree = {n: [0, 0, 0, 0] for n in names}  # saved, params, grads, optimizer
    for name in names:
        params, grads, state, _ = own[name]
        for a in _ancestors(name, names):
            for i, v in enumerate((saved.own.get(name, 0), params, grads, state)):
                subtree[a][i] += v
    rows = []
    for name, module in selected:
        params, grads, state, params_saved = own[name]
        s_saved, s_params, s_grads, s_state = subtree[name]
        rows.append(MemoryRow(name, type(module).__name__, name.count(".") + 1 if name else 0,
                              step.calls.get(name, 0), saved.own.get(name, 0), s_saved, params_saved,
                              params, grads, state, s_params, s_grads, s_state,
                              s_saved + s_params + s_grads + s_state))
    return rows


def totals_of(rows: list[MemoryRow], saved: SavedTensors, step: Step, extra: int) -> MemoryTotals:
    """The step's totals; ``extra``: the model's parameter and buffer bytes on the measured device."""
    params = sum(r.params for r in rows)
    grads = sum(r.grads for r in rows)
    state = sum(r.optimizer for r in rows)
    return MemoryTotals(
        saved=sum(saved.own.values()), saved_outside=saved.own.get(None, 0),
        params_saved=sum(saved.model_saved.values()), saved_peak=saved.peak, params=params, grads=grads,
        optimizer=state, peak=saved.peak + params + grads + state,
        measured_peak=None if step.measured is None else step.measured + extra)
