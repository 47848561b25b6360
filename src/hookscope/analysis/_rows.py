"""Rows of the statistics engine: :class:`StatRow`, turning hook events into rows, and their text.

A hook hands over a :data:`Pending` event (names, metadata and the small statistics tensor still on
its device); :func:`gather` turns many of them into rows with one device-to-host copy per device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..core.ops import SEP
from ..core.result import missing
from ..core.text import dtype_text, num, shape_text, table
from ._reduce import tensor_stats

__all__ = ["ByModule", "Pending", "StatRow", "event", "gather", "render"]


@dataclass(frozen=True)
class StatRow:
    """Statistics of one tensor seen by one call of one module (a row of ``Trace.rows``), or of
    one operation: ``module`` is then the operation's name (``"norm::div"``).

    ``phase`` is ``"forward"`` or ``"backward"``; ``which`` is ``"input"``, ``"output"``,
    ``"grad_output"`` (gradient arriving at an output), ``"grad_input"`` (gradient the module
    sent back to an input) or ``"grad_param"`` (the ``.grad`` of one of its parameters after a
    backward pass accumulated into it); ``path`` says where the tensor sits (``input[0]``,
    ``output.logits``, or the parameter's name such as ``weight``). ``call`` counts the module's
    calls from 0; for ``grad_param`` it counts the gradients that parameter received in the block.
    ``which="own_forward"``: a :func:`~hookscope.watch` culprit made by the module's own forward
    code, between two of its children (see :class:`~hookscope.analysis.watch.OwnForward`);
    ``which="unwatched"``: one made outside the watched modules, by code no watched module can be
    named for (watch with selectors).
    """

    index: int
    module: str
    call: int
    phase: str
    which: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    mean: float
    std: float
    min: float
    max: float
    absmax: float
    zero_frac: float
    nan: int
    inf: int

    @property
    def finite(self) -> bool:
        """No NaN and no Inf in the tensor."""
        return self.nan == 0 and self.inf == 0

    @property
    def norm(self) -> float:
        """The L2 norm, from the mean and the population std: ``sqrt(numel * (std**2 + mean**2))``.

        Example:
            >>> gather([event("fc", torch.tensor([3.0, 4.0]))])[0].norm
            5.0
        """
        return math.sqrt(self.numel * (self.std**2 + self.mean**2))

    def describe(self) -> str:
        """One line: module, call, what, shape and the non-finite counts.

        Example:
            >>> gather([event("0", torch.tensor([1.0, float("inf")]))])[0].describe()
            "'0' call 0, forward output output 2: 0 NaN, 1 Inf of 2 values"
        """
        return (f"{self.module!r} call {self.call}, {self.phase} {self.which} {self.path} "
                f"{shape_text(self.shape)}: {self.nan} NaN, {self.inf} Inf of {self.numel} values")


Pending = tuple[str, int, str, str, str, torch.Size, torch.dtype, torch.device, torch.Tensor]
"""``(module, call, phase, which, path, shape, dtype, device, stats)``: what a hook hands over."""


class ByModule:
    """Lookups by module name over a result's ``rows`` of :class:`StatRow` (trace and watch):
    ``r["layer1"]`` gives that module's rows in order, ``r["layer1::add"]`` an operation's, a
    missing name raises the shared ``KeyError``-compatible error with the closest names (for an
    operation, among those that ran: :meth:`operations_ran`), and ``in`` agrees."""

    @property
    def rows(self) -> list[StatRow]:
        raise NotImplementedError

    def operations_ran(self) -> list[str]:
        """The operations (``module::op``) that ran, rows or not; none unless told.

        Example:
            >>> ByModule().operations_ran()
            []
        """
        return []

    def __getitem__(self, name: str) -> list[StatRow]:
        rows = self.rows
        found = [r for r in rows if r.module == name] if isinstance(name, str) else []
        if not found and isinstance(name, str) and SEP in name:
            ran = [r.module for r in rows if SEP in r.module] + self.operations_ran()
            raise missing(name, "operation", dict.fromkeys(ran))
        if not found:
            raise missing(name, "module", dict.fromkeys(r.module for r in rows))
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(r.module == name for r in self.rows)


def event(module: str, t: torch.Tensor, *, call: int = 0, phase: str = "forward", which: str = "output",
          path: str = "output") -> Pending:
    """The event a hook makes of tensor ``t`` (its statistics taken now, left on its device).

    Example:
        >>> event("fc", torch.ones(2))[:5]
        ('fc', 0, 'forward', 'output', 'output')
    """
    return module, call, phase, which, path, t.shape, t.dtype, t.device, tensor_stats(t)


def gather(pending: list[Pending], start: int = 0) -> list[StatRow]:
    """Turn hook events into rows, with one device-to-host copy per device.

    An event is ``(module, call, phase, which, path, shape, dtype, device, stats)``, ``stats`` the
    :func:`~hookscope.analysis._reduce.tensor_stats` of the tensor; rows are numbered from ``start``.

    Example:
        >>> row = gather([event("fc", torch.tensor([1.0, -1.0]))], start=7)[0]
        >>> row.index, row.module, row.mean, row.std, row.shape
        (7, 'fc', 0.0, 1.0, (2,))
    """
    by_device: dict[torch.device, list[int]] = {}
    for i, item in enumerate(pending):
        by_device.setdefault(item[8].device, []).append(i)
    values: list[list[float]] = [[]] * len(pending)
    for idx in by_device.values():
        host = torch.stack([pending[i][8] for i in idx]).cpu().tolist()  # the one transfer
        for i, v in zip(idx, host):
            values[i] = v
    rows = []
    text: dict[Any, str] = {}  # a few dtypes and devices among hundreds of rows: each named once
    for i, ((name, call, phase, which, path, shape, dtype, device, _), v) in enumerate(zip(pending, values)):
        n = math.prod(shape)
        mean, std, lo, hi, absmax, zeros, nan, inf = v
        if dtype not in text:
            text[dtype] = dtype_text(dtype)
        if device not in text:
            text[device] = str(device)
        rows.append(StatRow(start + i, name, call, phase, which, path, tuple(shape),
                            text[dtype], text[device], n, mean, std, lo, hi, absmax,
                            zeros / n if n else math.nan, int(nan), int(inf)))
    return rows


_HEAD = ["#", "module", "call", "what", "path", "shape", "dtype", "mean", "std", "min", "max", "|max|",
         "zeros", "nan", "inf"]


def _number(v: float) -> str:
    return "nan" if math.isnan(v) else num(v)  # a NaN statistic is the news here, not a gap ("-")


def _cells(r: StatRow) -> list[str]:
    return [str(r.index), r.module or "(root)", str(r.call), r.which, r.path, shape_text(r.shape), r.dtype,
            _number(r.mean), _number(r.std), _number(r.min), _number(r.max), _number(r.absmax),
            f"{r.zero_frac:.1%}", str(r.nan), str(r.inf)]


def render(rows: list[StatRow], *, max_rows: int | None = None) -> str:
    """Rows as a text table: one line per tensor, numbers to 4 significant digits.

    Example:
        >>> x = torch.tensor([-1.0, 2.0])
        >>> print(render(gather([event("0", x, which="input", path="input[0]"), event("0", x.relu())]),
        ...              max_rows=1))
        #  module  call  what   path      shape  dtype    mean  std  min  max  |max|  zeros  nan  inf
        ---------------------------------------------------------------------------------------------
        0  0          0  input  input[0]      2  float32   0.5  1.5   -1    2      2   0.0%    0    0
        ... 1 more rows (to_csv() or to_json() has them all)
    """
    shown = rows if max_rows is None else rows[:max_rows]
    lines = table(_HEAD, [_cells(r) for r in shown], left={1, 3, 4, 6})
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more rows (to_csv() or to_json() has them all)")
    return "\n".join(lines)
