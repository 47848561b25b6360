"""``LightningMonitor``: the training monitor as a Lightning ``Callback``.

Lightning's automatic optimization calls ``optimizer.step(closure)``, and the closure runs
``training_step`` and the backward pass inside the step: the optimizer's own step pre-hook fires
before the forward pass, on the gradients of the step before; and Lightning clips the gradients
after ``on_before_optimizer_step``, inside the closure. So ``on_before_optimizer_step`` only notes
that the step is under way, and the gradients are read by that pre-hook once the closure has
returned (after clipping, just before the update; under 16-bit AMP, where Lightning runs the closure
first and then ``scaler.step``, as the pre-hook fires); the step ends at ``on_train_batch_end`` of
the batch whose optimizer stepped. A step noted but never stepped (the scaler found Inf or NaN
gradients) is ended there as ``skipped``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import HookscopeError, checked_as
from ..selection import Selector
from ._driven import Driven, framework

__all__ = ["LightningMonitor"]

_MADE: dict[str, type] = {}


def _bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` classes, of ``lightning.pytorch`` and of ``pytorch_lightning`` where
    each is installed, so that either package's ``Trainer`` takes the callback."""
    found = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            found.append(framework(name, "lightning", "hookscope.LightningMonitor").Callback)
        except HookscopeError:
            continue
    if not found:
        framework("lightning.pytorch", "lightning", "hookscope.LightningMonitor")
    return tuple(found)


def _loss_of(output: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned: the tensor, or a mapping's ``"loss"``."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        loss = output.get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    return None


def _replay(module: Any, batch: Any, batch_idx: int) -> torch.Tensor | None:
    return _loss_of(module.training_step(batch, batch_idx))


class LightningMonitor:
    """:func:`hookscope.monitor` over a Lightning run, as a callback:
    ``Trainer(callbacks=[hookscope.LightningMonitor(every=100, log="runs/monitor")])``.

    Its steps are the optimizer steps, numbered as ``trainer.global_step`` (a resumed run goes on
    from its step); with ``accumulate_grad_batches=k`` one step holds ``k`` batches (their calls
    merged in each row) and its loss is the mean of theirs. The gradients are read as the optimizer
    uses them: after clipping (``gradient_clip_val``), just before the update, as
    :class:`~hookscope.TrainerMonitor` reads them. A non-finite
    step is named with its module by replaying the batch (``training_step(batch, batch_idx)`` of
    the step's last batch); under manual optimization, where ``training_step`` steps the optimizer
    itself, there is no replay and the module is named on sampled steps. With several optimizers
    the steps are those of the first.

    ``monitor`` is the running :class:`~hookscope.Monitor` (``None`` outside ``fit``), ``last``
    the :class:`~hookscope.Telemetry` of the last sampled step. The arguments are
    :func:`hookscope.monitor`'s; the model and optimizer are the trainer's.

    Example:
        >>> import hookscope
        >>> callback = hookscope.LightningMonitor(every=10, stats=["output", "params"])
        >>> callback.monitor is None
        True
    """

    @checked_as("LightningMonitor")
    def __new__(cls, *selectors: Selector, every: int | None = 100, steps: Any = None, log: Any = None,
                stats: str | Iterable[str] = "all", histograms: Any = None, nonfinite: str = "raise",
                replay: bool = True) -> LightningMonitor:
        if cls is LightningMonitor:
            made = _MADE.get("lightning")
            if made is None:
                made = _MADE["lightning"] = type("LightningMonitor", (LightningMonitor, *_bases()),
                                                 {"__module__": "hookscope.integrations", "__doc__": cls.__doc__})
            cls = made
        return object.__new__(cls)

    def __init__(self, *selectors: Selector, every: int | None = 100, steps: Any = None, log: Any = None,
                 stats: str | Iterable[str] = "all", histograms: Any = None, nonfinite: str = "raise",
                 replay: bool = True) -> None:
        self._driven = Driven(selectors, every=every, steps=steps, log=log, stats=stats, histograms=histograms,
                              nonfinite=nonfinite)
        self._replay, self._stepped = replay, False
        self._loss: torch.Tensor | None = None
        self._checked: torch.Tensor | None = None
        self._optimizer: Any = None
        self._pending: tuple[float | None, Any] | None = None  # the step noted, its gradients not yet read
        self._hook: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # the class is made at run time: pickled by the name of the one users see, and made again
        return (_restore, ({**self.__dict__, "_hook": None, "_pending": None},))

    def close(self) -> None:
        """End the monitor now (its hooks removed, its writers closed); the callback does this as
        training ends. Idempotent."""
        self._unhook()
        self._driven.close()

    def _unhook(self) -> None:
        hook, self._hook, self._pending = self._hook, None, None
        if hook is not None:
            hook.remove()

    def _pre_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        closure = kwargs.get("closure")
        if closure is None:  # 16-bit AMP: the closure and the clipping already ran
            self._read()
            return None

        def run() -> Any:
            result = closure()
            self._read()  # the closure ran the backward pass, on_before_optimizer_step and the clipping
            return result

        return args, {**kwargs, "closure": run}

    def _read(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            lr, groups = pending
            self._driven.before(self._checked, lr, lambda: [p for g in groups for p in g["params"]])

    @property
    def monitor(self) -> Any:
        """The running :class:`~hookscope.Monitor`, or ``None`` outside training."""
        return self._driven.monitor

    @property
    def last(self) -> Any:
        """The :class:`~hookscope.Telemetry` of the last sampled step (``None`` before one ends)."""
        return self._driven.last

    # --- Lightning's callbacks ---------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._driven.open(pl_module, int(trainer.global_step))
        self._optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._stepped, self._loss, self._checked = False, None, None
        self._unhook()
        if self._optimizer is not None:
            # own hook: the moment after Lightning's clipping and before the update (see the module's docstring)
            self._hook = self._optimizer.register_step_pre_hook(self._pre_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        mon = self._driven.monitor
        # under manual optimization training_step steps the optimizer itself: replaying it would update the weights
        if mon is not None and self._replay and getattr(pl_module, "automatic_optimization", True):
            mon.replay = functools.partial(_replay, pl_module, batch, batch_idx)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        # for the sentinel only: under 16-bit mixed precision this loss is already multiplied by the scaler's scale
        loss = loss.detach()
        self._checked = loss if self._checked is None else self._checked + loss

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._driven.monitor is None or self._stepped:
            return
        if self._optimizer is not None and len(trainer.optimizers) > 1 and optimizer is not self._optimizer:
            return
        groups = getattr(optimizer, "param_groups", None) or []
        lr = groups[0].get("lr") if groups else None
        self._stepped = True
        self._pending = (None if lr is None else float(lr), groups)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the batch's loss as Lightning gives it, divided by accumulate_grad_batches: their sum is the step's mean
        loss = _loss_of(outputs)
        if loss is not None:
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        if self._stepped:
            self._stepped = False
            if self._pending is not None:  # noted, never stepped: GradScaler found Inf or NaN gradients
                self._pending = None
                self._driven.skipped(self._loss, "the optimizer's step did not run (GradScaler found Inf or NaN "
                                                 "gradients)")
            else:
                self._driven.after(self._loss)
            self._loss = self._checked = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.close()


def _restore(state: dict[str, Any]) -> LightningMonitor:
    made = LightningMonitor.__new__(LightningMonitor)
    made.__dict__.update(state)
    return made
