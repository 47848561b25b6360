"""What :func:`~hookscope.step_memory` returns: :class:`StepMemory`, one row per module, and its text.

It speaks the protocol of every result (:class:`~hookscope.core.result.Result`): ``rows``,
``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)``, ``to_pandas()``;
``m[name]`` raises :class:`~hookscope.RecordError` (a ``KeyError``) naming the closest modules,
and ``name in m`` agrees. Nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from ...core.result import Result, missing
from ...core.text import table
from ._rows import MemoryRow, MemoryTotals

__all__ = ["StepMemory", "size"]


def size(n: int | None) -> str:
    """Bytes as people read them, in powers of 1024: ``40 B``, ``44.6 MiB``; ``None`` as ``-``.

    Example:
        >>> size(40), size(46_758_048), size(2048), size(None)
        ('40 B', '44.6 MiB', '2 KiB', '-')
    """
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"


class StepMemory(Result):
    """The result of :func:`~hookscope.step_memory`: per module, in bytes, what a training step holds.

    ``rows`` (:class:`MemoryRow`, in ``named_modules()`` order, down to ``depth``), ``totals``
    (:class:`MemoryTotals`), ``m[name]`` one module's row, ``model``, ``device``, ``optimizer``
    (its type's name, or ``None``) and ``training`` (whether the model was in training mode).

    Example:
        >>> import torch
        >>> from hookscope import step_memory
        >>> m = step_memory(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh()), torch.zeros(3, 4))
        >>> m["0"].saved, m["1"].saved, m[""].saved_total, m.totals.params  # input 3x4, tanh's output 3x8
        (48, 96, 144, 160)
    """

    _html_columns = ("name", "type", "calls", "saved", "saved_total", "params", "grads", "optimizer", "total")

    def __init__(self, model: str, rows: list[MemoryRow], totals: MemoryTotals, *, device: str,
                 optimizer: str | None, training: bool, depth: int | None) -> None:
        self.model = model
        self.totals = totals
        self.device = device
        self.optimizer = optimizer
        self.training = training
        self.depth = depth
        self._by_name = {r.name: r for r in rows}
        self.rows = rows if depth is None else [r for r in rows if r.depth <= depth]

    def __getitem__(self, name: str) -> MemoryRow:
        """The row of module ``name`` (``""``: the model), at any depth.

        Example:
            >>> import torch
            >>> from hookscope import step_memory
            >>> step_memory(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.zeros(1, 2))["O"]
            Traceback (most recent call last):
            ...
            hookscope.errors.RecordError: no module 'O' in this result. It has: '', '0'.
        """
        found = self._by_name.get(name) if isinstance(name, str) else None
        if found is None:
            raise missing(name, "module", self._by_name)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[MemoryRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def table(self) -> str:
        """The module tree with each module's bytes, then the totals and the peak.

        Example:
            >>> import torch
            >>> from hookscope import step_memory
            >>> print(step_memory(torch.nn.Linear(4, 2), torch.zeros(3, 4)).table())
            Linear: one training step on cpu, training mode, no optimizer
            Layer (type)  Calls  Saved  Saved (subtree)  Params  Grads  Optimizer  Total (subtree)
            --------------------------------------------------------------------------------------
            Linear            1   48 B             48 B    40 B   40 B        0 B            128 B
            --------------------------------------------------------------------------------------
            Saved for backward: 48 B (outside the model: 0 B; parameters and buffers saved, not counted again: 0 B)
            Parameters and buffers: 40 B; gradients: 40 B; optimizer state: 0 B
            Peak: 128 B (saved at most 48 B at once + parameters + gradients + optimizer state)
            <BLANKLINE>
        """
        head = ["Layer (type)", "Calls", "Saved", "Saved (subtree)", "Params", "Grads", "Optimizer",
                "Total (subtree)"]
        body = [["  " * r.depth + (f"{r.name.rsplit('.', 1)[-1]} ({r.type})" if r.name else r.type), str(r.calls),
                 size(r.saved), size(r.saved_total), size(r.params), size(r.grads), size(r.optimizer), size(r.total)]
                for r in self.rows]
        lines = table(head, body, left={0})
        t = self.totals
        lines += [lines[1],
                  f"Saved for backward: {size(t.saved)} (outside the model: {size(t.saved_outside)}; parameters "
                  f"and buffers saved, not counted again: {size(t.params_saved)})",
                  f"Parameters and buffers: {size(t.params)}; gradients: {size(t.grads)}; "
                  f"optimizer state: {size(t.optimizer)}",
                  f"Peak: {size(t.peak)} (saved at most {size(t.saved_peak)} at once + parameters + gradients "
                  "+ optimizer state)"]
        if t.measured_peak is not None:
            lines.append(f"Measured peak ({self.device}, the model's parameters and buffers included): "
                         f"{size(t.measured_peak)}")
        mode = "training mode" if self.training else "eval mode"
        title = f"{self.model}: one training step on {self.device}, {mode}, {self.optimizer or 'no'} optimizer"
        return "\n".join([title, *lines]) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ready for ``json.dumps``.

        Example:
            >>> import torch
            >>> from hookscope import step_memory
            >>> step_memory(torch.nn.Linear(4, 2), torch.zeros(3, 4)).to_dict()["totals"]["saved"]
            48
        """
        return {"model": self.model, "device": self.device, "optimizer": self.optimizer,
                "training": self.training, "depth": self.depth,
                "rows": [dataclasses.asdict(r) for r in self.rows], "totals": dataclasses.asdict(self.totals)}

    def __repr__(self) -> str:
        return f"StepMemory({self.model}, {len(self.rows)} rows, peak {size(self.totals.peak)})"
