"""The monitor a framework drives: the settings a callback is built with, the monitor made from them
when training begins, and the two moments of a step, just before and just after the update, told by
the framework's callbacks rather than by the optimizer's own step hooks."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from ..analysis.monitor import NONFINITE, Monitor, monitor
from ..errors import HookscopeError, did_you_mean
from ..selection import Selector

__all__ = ["Driven", "framework"]


def framework(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or a one-line error naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise HookscopeError(f"{what} needs the {module.split('.')[0]} package, from the {extra} extra: "
                             f"pip install 'hookscope[{extra}]'") from e


class Driven:
    """A monitor's settings, and the monitor itself while training runs (``None`` before and after)."""

    def __init__(self, selectors: tuple[Selector, ...], *, every: int | None, steps: Any, log: Any,
                 stats: str | Iterable[str], histograms: Any, nonfinite: str) -> None:
        if nonfinite not in NONFINITE:
            raise HookscopeError(f"nonfinite={nonfinite!r}: choose 'raise', 'skip', 'log' or 'off'."
                                 f"{did_you_mean(str(nonfinite), NONFINITE)}")
        self.selectors, self.on_nonfinite = selectors, nonfinite
        # the monitor's own settings, checked now (a bad every= or log= fails before training starts)
        self.settings: dict[str, Any] = {"every": every, "steps": steps, "log": log, "stats": stats,
                                         "histograms": histograms}
        monitor(nn.Linear(1, 1), **self.settings)
        self.monitor: Monitor | None = None
        self.last: Any = None

    def open(self, model: nn.Module, step: int) -> Monitor:
        """The monitor of this run, begun at the framework's step ``step`` (a resumed run's)."""
        self.close()
        # the framework runs the optimizer: the steps are told, and a skipped step's gradients cleared here
        mon = monitor(model, *self.selectors, **self.settings, optimizer=None,
                      nonfinite="log" if self.on_nonfinite == "skip" else self.on_nonfinite)
        mon.step_number = step
        self.monitor = mon.__enter__()
        return mon

    def before(self, loss: torch.Tensor | float | None, lr: float | None, params: Callable[[], Iterable[torch.Tensor]]) -> None:
        """Just before the update: the loss and learning rate noted, the sentinel run; a flagged step's
        gradients cleared under ``nonfinite='skip'`` (the optimizer then leaves weights and state as they are)."""
        mon = self.monitor
        if mon is None:
            return
        mon.note(loss=loss, lr=lr)
        flagged = mon.flagged
        try:
            mon.before_update()
        except BaseException:
            self.close()
            raise
        if self.on_nonfinite == "skip" and mon.flagged > flagged:
            mon.skip("nonfinite='skip' cleared the gradients: the update left the weights as they were")
            for p in params():
                p.grad = None

    def skipped(self, loss: torch.Tensor | float | None, reason: str) -> None:
        """A step whose update did not run, told after the fact (the optimizer was never stepped):
        checked by the sentinel without raising, marked ``skipped``, and ended."""
        mon = self.monitor
        if mon is None:
            return
        mon.skip(reason)
        self.after(loss)

    def after(self, loss: torch.Tensor | float | None = None) -> None:
        """Just after the update: the step's rows written, the next step begun."""
        mon = self.monitor
        if mon is None:
            return
        if loss is not None:
            mon.note(loss=loss)
        mon.after_update()
        self.last = mon.last

    def close(self) -> None:
        """End the monitor (idempotent); its last telemetry stays in ``last``."""
        mon, self.monitor = self.monitor, None
        if mon is not None:
            self.last = mon.last
            mon.close()
