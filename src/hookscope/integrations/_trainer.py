"""``TrainerMonitor``: the training monitor as a transformers ``TrainerCallback``.

The Trainer calls ``optimizer.step()`` plainly, after every micro-batch of a gradient-accumulation
step has run its backward pass and after clipping: its ``on_pre_optimizer_step`` callback is the
moment just before the update. The step ends at ``on_step_end``, or, on a step the Trainer logs, at
its ``on_log``, which brings the loss (the mean since the Trainer's last log) before any evaluation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..selection import Selector
from ..errors import checked_as
from ._driven import Driven, framework

__all__ = ["TrainerMonitor"]

_MADE: dict[str, type] = {}


class TrainerMonitor:
    """:func:`hookscope.monitor` over a transformers ``Trainer`` run, as a callback:
    ``Trainer(..., callbacks=[hookscope.TrainerMonitor(every=100, log="runs/monitor")])``.

    Its steps are the optimizer steps, numbered as ``state.global_step``; with
    ``gradient_accumulation_steps=k`` one step holds ``k`` forward passes (their calls merged in each
    row). The gradients are read after the Trainer clips them. The loss of a step is the one the
    Trainer logs on it (``logging_steps=1`` logs every step's; on other steps it is empty), the
    learning rate the optimizer's. Callbacks see neither the Trainer nor the batch, so a non-finite
    step's module is named on sampled steps (from their hooks); on the others the step and the
    parameters with non-finite gradients are named.

    ``monitor`` is the running :class:`~hookscope.Monitor` (``None`` outside ``train()``), ``last``
    the :class:`~hookscope.Telemetry` of the last sampled step. The Trainer tells its callbacks
    nothing of an exception: after a failed ``train()``, :meth:`close` ends the monitor. The arguments are
    :func:`hookscope.monitor`'s; the model and optimizer are the Trainer's.

    Example:
        >>> import hookscope
        >>> callback = hookscope.TrainerMonitor(every=10, nonfinite="skip")
        >>> callback.monitor is None
        True
    """

    @checked_as("TrainerMonitor")
    def __new__(cls, *selectors: Selector, every: int | None = 100, steps: Any = None, log: Any = None,
                stats: str | Iterable[str] = "all", histograms: Any = None, nonfinite: str = "raise") -> TrainerMonitor:
        if cls is TrainerMonitor:
            made = _MADE.get("transformers")
            if made is None:
                base = framework("transformers", "hf", "hookscope.TrainerMonitor").TrainerCallback
                made = _MADE["transformers"] = type("TrainerMonitor", (TrainerMonitor, base),
                                                    {"__module__": "hookscope.integrations", "__doc__": cls.__doc__})
            cls = made
        return object.__new__(cls)

    def __init__(self, *selectors: Selector, every: int | None = 100, steps: Any = None, log: Any = None,
                 stats: str | Iterable[str] = "all", histograms: Any = None, nonfinite: str = "raise") -> None:
        self._driven = Driven(selectors, every=every, steps=steps, log=log, stats=stats, histograms=histograms,
                              nonfinite=nonfinite)
        self._pending = False

    def __reduce__(self) -> tuple[Any, ...]:
        # the class is made at run time: pickled by the name of the one users see, and made again
        return (_restore, (self.__dict__.copy(),))

    def close(self) -> None:
        """End the monitor now (its hooks removed, its writers closed); the callback does this as
        training ends. Idempotent."""
        self._driven.close()

    @property
    def monitor(self) -> Any:
        """The running :class:`~hookscope.Monitor`, or ``None`` outside training."""
        return self._driven.monitor

    @property
    def last(self) -> Any:
        """The :class:`~hookscope.Telemetry` of the last sampled step (``None`` before one ends)."""
        return self._driven.last

    def _flush(self, loss: Any = None) -> None:
        if self._pending:
            self._pending = False
            self._driven.after(loss)

    # --- the Trainer's callbacks -------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._pending = False
        self._driven.open(model, int(state.global_step))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()  # a step the Trainer meant to log but did not

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                              **kwargs: Any) -> None:
        groups = list(getattr(optimizer, "param_groups", None) or [])
        lr = groups[0].get("lr") if groups else None
        self._driven.before(None, None if lr is None else float(lr), lambda: [p for g in groups for p in g["params"]])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._pending = True
        if not control.should_log:
            self._flush()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        self._flush(float(loss) if isinstance(loss, (int, float)) else None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self._driven.close()


def _restore(state: dict[str, Any]) -> TrainerMonitor:
    made = TrainerMonitor.__new__(TrainerMonitor)
    made.__dict__.update(state)
    return made
