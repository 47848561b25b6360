"""Name the first module whose output, or gradient, holds a NaN or an Inf (``hookscope.watch``).

Built on the statistics hooks of ``stats.py``: every output in the forward pass, and every gradient
in the backward pass (arriving at an output, or sent back to an input), is reduced on its device;
the first non-finite one, in the order the calls finished and the gradients arrived, is the culprit.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from torch import nn

from ..errors import HookscopeError
from ..selection import Selector
from .stats import Pending, Recorder, RecorderSession, StatRow, gather, render, select

__all__ = ["NonFiniteError", "Watch", "watch"]

RESOLVE_EVERY = 4096
"""Without ``raise_on_nonfinite``, the statistics are read back once per this many records (one
host synchronisation each), to keep only the last few in memory during long runs."""


class NonFiniteError(HookscopeError):
    """A watched module produced (or sent back) a NaN or an Inf; ``row`` and ``before`` say more."""

    def __init__(self, row: StatRow, before: list[StatRow]) -> None:
        super().__init__(
            f"first non-finite value: {row.describe()}; the {len(before)} records before it are "
            "in err.before (watch without raise_on_nonfinite=True for a report instead)"
        )
        self.row = row
        self.before = before


class Watch(RecorderSession):
    """A context that finds the first non-finite output or gradient; build it with :func:`watch`."""

    _kind = "watch"

    def __init__(self, selected: list[tuple[str, nn.Module]], *, raise_on_nonfinite: bool, last: int,
                 inputs: bool) -> None:
        self.raise_on_nonfinite = raise_on_nonfinite
        self.checked = 0  # records examined so far
        self._pending: list[Pending] = []
        self._recent: deque[StatRow] = deque(maxlen=last)
        self._culprit: StatRow | None = None
        self._before: list[StatRow] = []
        self._lock = threading.RLock()
        self._rec = Recorder(selected, inputs=inputs, grads=True, sink=self._take)
        self._used = False

    def _take(self, event: Pending) -> None:
        with self._lock:
            self._pending.append(event)
            # raising at the culprit needs its numbers now: one synchronisation per record
            if self.raise_on_nonfinite or len(self._pending) >= RESOLVE_EVERY:
                self._resolve()

    def _resolve(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending or self._culprit is not None:
                return
            for row in gather(pending, start=self.checked):
                if not row.finite:
                    self._culprit, self._before = row, list(self._recent)
                    self._rec.enabled = False  # nothing after the culprit matters
                    self.checked = row.index + 1
                    if self.raise_on_nonfinite:
                        raise NonFiniteError(row, self._before)
                    return
                self._recent.append(row)
            self.checked += len(pending)

    @property
    def culprit(self) -> StatRow | None:
        """The first record with a NaN or an Inf, or ``None`` if everything was finite."""
        self._resolve()
        return self._culprit

    @property
    def before(self) -> list[StatRow]:
        """The (up to ``last``) records just before the culprit, oldest first."""
        self._resolve()
        return list(self._before)

    @property
    def finite(self) -> bool:
        """Every watched output and gradient was finite."""
        return self.culprit is None

    def report(self) -> str:
        """What a person reads: the culprit and the records before it, or that all was finite."""
        row = self.culprit
        if row is None:
            return f"all finite: {self.checked} outputs and gradients checked, no NaN and no Inf"
        lines = [f"first non-finite value: {row.describe()}"]
        if self._before:
            lines += ["", f"the {len(self._before)} records before it (all finite):",
                      render(self._before)]
        lines += ["", "the culprit:", render([row])]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Watch(checked={self.checked}, culprit={self._culprit!r})"


def watch(model: nn.Module, *selectors: Selector, raise_on_nonfinite: bool = False, last: int = 5,
          inputs: bool = False) -> Watch:
    """Find the first module whose forward output, or backward gradient, holds a NaN or an Inf.

    Order is execution order: forward records in the order calls finish (an inner module before
    the block that contains it), then backward records in the order gradients arrive; for a
    gradient, ``grad_input`` (what a module sent back to its input) names the module that made it
    non-finite, as ``sqrt`` at 0 does. Without ``raise_on_nonfinite`` the statistics stay on the
    device until read (``culprit``, ``report()``, or every :data:`RESOLVE_EVERY` records).

    Args:
        model: any ``nn.Module``; names are the inner model's, through wrappers.
        *selectors: as for :func:`hookscope.layers`; none watches every module but the root (a model
            without children watches itself).
        raise_on_nonfinite: raise :class:`NonFiniteError` inside the hook that sees the first
            NaN or Inf, so the traceback points there. Costs one host synchronisation per record.
        last: how many records before the culprit to keep (their statistics are in the report).
        inputs: also check each module's inputs (to tell a non-finite model input apart).

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LogSigmoid(), torch.nn.Linear(2, 1))
        >>> with hookscope.watch(net) as w:
        ...     net(torch.full((1, 2), float("inf"))).sum().backward()
        >>> w.culprit.module, w.culprit.which
        ('0', 'output')
    """
    if not isinstance(last, int) or last < 0:
        raise HookscopeError(f"last={last!r} must be a whole number of records, 0 or more")
    return Watch(select(model, selectors), raise_on_nonfinite=raise_on_nonfinite, last=last, inputs=inputs)
