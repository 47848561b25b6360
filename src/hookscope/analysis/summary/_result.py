"""What :func:`~hookscope.summary` returns: :class:`Summary`, its rows found by name, as text or JSON.

It speaks the protocol of every result (:class:`~hookscope.core.result.Result`): ``rows``,
``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)``; ``s[name]``
raises :class:`~hookscope.RecordError` (a ``KeyError``) naming the closest
modules, and ``name in s`` agrees. Nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from ...core.result import Result, missing
from ._render import render
from ._rows import Row, Shape
from ._totals import Totals

__all__ = ["Summary"]


class Summary(Result):
    """The result of :func:`~hookscope.summary`: ``rows`` in execution order, ``totals``, text and JSON.

    ``parameters`` and ``buffers`` map every qualified name to its shape, each tensor once, as
    ``model.named_parameters()`` / ``named_buffers()`` name them; ``modules`` maps every module name
    to its type. ``rows`` holds the rows down to ``depth`` (what :meth:`table` shows); ``s[name]`` finds any
    module's rows, one per call (``s[name][1]``: its second call), ``name in s`` says whether the
    model has that module.

    Example:
        >>> import json, torch
        >>> from hookscope import summary
        >>> s = summary(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), torch.zeros(3, 4))
        >>> s.totals.params, s["0"][0].output_shapes, s.modules
        (40, [(3, 8)], {'': 'Sequential', '0': 'Linear', '1': 'ReLU'})
        >>> "1" in s, json.loads(s.to_json())["rows"][1]["output_shapes"]
        (True, [[3, 8]])
    """

    _html_columns = ("name", "type", "output_shapes", "output_dtypes", "params", "params_total", "macs", "zeros",
                     "training", "calls")

    def __init__(self, model: str, inputs: list[tuple[Shape, str]], rows: list[Row], totals: Totals,
                 modules: dict[str, str], parameters: dict[str, Shape], buffers: dict[str, Shape],
                 depth: int | None) -> None:
        self.model = model
        self.inputs = inputs
        self.totals = totals
        self.modules = modules
        self.parameters = parameters
        self.buffers = buffers
        self.depth = depth
        self.rows = rows if depth is None else [r for r in rows if r.depth <= depth]
        self._by_name: dict[str, list[Row]] = {}
        for r in rows:
            self._by_name.setdefault(r.name, []).append(r)

    def __getitem__(self, name: str) -> list[Row]:
        """Every row of module ``name`` (``""`` is the model): one per call, or its one row if never called.

        Example:
            >>> import torch
            >>> from hookscope import summary
            >>> relu = torch.nn.ReLU()  # one module called twice: a row per call
            >>> s = summary(torch.nn.Sequential(relu, relu), torch.zeros(2))
            >>> [r.call for r in s["0"]]
            [0, 1]
            >>> s["O"]
            Traceback (most recent call last):
            ...
            hookscope.errors.RecordError: no module 'O' in this result. It has: '', '0'.
        """
        found = self._by_name.get(name) if isinstance(name, str) else None
        if not found:
            raise missing(name, "module", self.modules)  # in tree order
        return list(found)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def table(self) -> str:
        """The table for people: the module tree with shapes, counts, mult-adds and modes, then totals.

        Example:
            >>> import torch
            >>> from hookscope import summary
            >>> print(summary(torch.nn.Linear(4, 2).eval(), torch.zeros(3, 4)).table())
            Linear: input 3x4 float32
            =====================================================================================
            Layer (type)  Output shape  Params  Total  Trainable  Buffers  Mult-adds  Mode  Notes
            =====================================================================================
            Linear        3x2               10     10        yes        0         24  eval
            =====================================================================================
            Params: 10; trainable 10, frozen 0 (shared tensors counted once)
            Param bytes: 40 B
            Buffers: 0 tensors, 0 elements, 0 B
            Mult-adds: 24
            Input bytes: 48 B
            Activation bytes (new outputs of innermost calls): 24 B
            Module calls: 1; modules: 1, never called: 0
            =====================================================================================
            <BLANKLINE>
        """
        return render(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, tuples, dicts, numbers, strings), ready for ``json.dumps``.

        Example:
            >>> import torch
            >>> from hookscope import summary
            >>> summary(torch.nn.Linear(4, 2), torch.zeros(3, 4)).to_dict()["totals"]["macs"]
            24
        """
        return {
            "model": self.model,
            "inputs": [{"shape": list(s), "dtype": d} for s, d in self.inputs],
            "depth": self.depth,
            "rows": [r.to_dict() for r in self.rows],
            "totals": {**dataclasses.asdict(self.totals), "sparsity": self.totals.sparsity},
        }

    def __repr__(self) -> str:
        return f"Summary({self.model}, {len(self.rows)} rows, {self.totals.params:,} params)"
