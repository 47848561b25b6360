"""``hookscope.monitor``: per-layer telemetry of sampled training steps, and a non-finite sentinel on
every step, around any training loop.

A step is one optimizer step, seen through the optimizer's own step hooks
(``register_step_pre_hook`` / ``register_step_post_hook``), or one call of :meth:`Monitor.step`
where no optimizer is given. The hooks of a sampled step are registered when the step before it
ends (or the block begins) and removed when it ends: between sampled steps the model holds no hook
of the monitor's.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ...errors import HookscopeError, NonFiniteStepError, checked, did_you_mean
from ...selection import Selector, unwrap
from .._recorder import select
from ._distributed import writes_here
from ._histogram import Bins, check_bins
from ._params import Owned, ParamSide, all_finite, stored
from ._probe import Probe
from ._scaler import ScalerHook, scaler_skipped, unscaled
from ._schedule import Schedule, Steps
from ._sentinel import NonFinite, RandomState, culprit_of, replay_step
from ._telemetry import Telemetry, TelemetryRow
from ._writers import Log, Writer, writers_of

__all__ = ["NONFINITE", "STATS", "Monitor", "monitor"]

STATS = ("input", "output", "grad_output", "params", "update", "dead")
"""What ``stats=`` may choose (``"all"``: every one): the selected layers' inputs, outputs and the
gradients at their outputs; their parameters (norms and the gradients' statistics); the update
ratio (a copy of the parameters on sampled steps; implies ``params``); the dead units of outputs."""
NONFINITE = ("raise", "skip", "log", "off")

_ACTIVE: weakref.WeakKeyDictionary[nn.Module, Monitor] = weakref.WeakKeyDictionary()


def _stats(stats: str | Iterable[str]) -> frozenset[str]:
    chosen = [stats] if isinstance(stats, str) else list(stats)
    if chosen == ["all"]:
        return frozenset(STATS)
    for s in chosen:
        if s not in STATS:
            raise HookscopeError(f"stats= has {s!r}, which the monitor does not take: choose from "
                                 f"{', '.join(STATS)} or 'all'.{did_you_mean(str(s), STATS)}")
    return frozenset(chosen) | ({"params"} if "update" in chosen else frozenset())


def _leaves(model: nn.Module, selectors: tuple[Selector, ...]) -> list[tuple[str, nn.Module]]:
    if selectors:
        return select(model, selectors)
    inner, _ = unwrap(model)
    if next(inner.children(), None) is None:
        return select(model, ())
    return select(model, (lambda name, m: next(m.children(), None) is None,))


def _owned(selected: list[tuple[str, nn.Module]]) -> list[Owned]:
    return [(name, pname, p) for name, m in selected if "::" not in name
            for pname, p in m.named_parameters() if p.requires_grad]


class Monitor:
    """A training run watched: build it with :func:`monitor` and use it as a context manager.

    ``step_number`` is the number of the step under way (from 0), ``last`` the :class:`~hookscope.Telemetry`
    of the last sampled step (``None`` before the first ends), ``nonfinite`` the first step the
    sentinel flagged (a :class:`~hookscope.analysis.monitor.NonFinite`, or ``None``),
    ``last_nonfinite`` the latest and ``flagged`` how many it flagged. ``replay`` (the step's loss, recomputed) may be set at any
    time, for the step under way: integrations set it per batch.
    """

    def __init__(self, model: nn.Module, selected: list[tuple[str, nn.Module]], *, schedule: Schedule,
                 log: list[Callable[[], Writer]], optimizer: Any, stats: frozenset[str],
                 bins: int | torch.Tensor | None, nonfinite: str, replay: Callable[[], Any] | None,
                 scaler: Any = None) -> None:
        self.model, self.root = model, unwrap(model)[0]
        self.selected, self.schedule, self.optimizer = selected, schedule, optimizer
        self.stats, self.bins, self.on_nonfinite, self.replay = stats, bins, nonfinite, replay
        self.step_number = 0
        self.last: Telemetry | None = None
        self.nonfinite: NonFinite | None = None
        self.last_nonfinite: NonFinite | None = None
        self.flagged = 0
        self.writers: list[Writer] = []
        self._make_writers = log
        self._owned = _owned(selected) if "params" in stats else []
        self._names = {id(p): n for n, p in self.root.named_parameters()}
        self._probe: Probe | None = None
        self._side: ParamSide | None = None
        self._spare: list[torch.Tensor] = []  # the update's copies, kept while the next step is sampled too
        self._loss: torch.Tensor | float | None = None
        self._lr: float | torch.Tensor | None = None
        self._rng: RandomState | None = None
        self._flag: NonFinite | None = None
        self._skip: str = ""  # why the update of the step under way does not run ("": it runs)
        self._checked_now = False  # whether the sentinel has checked the step under way
        self.scaler = scaler
        self._stepped = False  # whether the optimizer stepped since the scaler's last update()
        self._handles: list[Any] = []
        self._paused = 0
        self._state = "new"

    # --- the block ---------------------------------------------------------------------------
    def __enter__(self) -> Monitor:
        if self._state != "new":
            raise HookscopeError("this monitor has already run; call hookscope.monitor(...) again")
        other = _ACTIVE.get(self.root)
        if other is not None:
            raise HookscopeError(f"{type(self.root).__name__} already has a monitor running; end that block first, "
                                 "or watch every layer you want with one monitor(model, *selectors)")
        self._state = "open"
        _ACTIVE[self.root] = self
        try:
            for make in self._make_writers if writes_here() else []:
                self.writers.append(make())  # one by one: a failing second writer closes the first
            if self.optimizer is not None:
                # own hook: the optimizer's step hooks are what a step is (no module hook stays between steps)
                self._handles = [self.optimizer.register_step_pre_hook(self._pre_hook),
                                 self.optimizer.register_step_post_hook(self._post_hook)]
            if self.scaler is not None:
                self._handles.append(ScalerHook(self.scaler, self._scaler_update))
            self._begin()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Remove every hook and close the writers (the block does this on exit). Idempotent."""
        self._end_probe()
        self._spare = []
        for handle in self._handles:
            handle.remove()
        self._handles = []
        writers, self.writers = self.writers, []
        for w in writers:
            w.close()
        if _ACTIVE.get(self.root) is self:
            del _ACTIVE[self.root]
        self._state = "closed"

    # --- what the loop tells -----------------------------------------------------------------
    def note(self, loss: torch.Tensor | float | None = None, lr: float | None = None) -> None:
        """The loss (and learning rate, where no optimizer says it) of the step under way; with an
        optimizer, call it before ``optimizer.step()`` so that the sentinel checks the loss too."""
        if isinstance(loss, torch.Tensor) and loss.numel() != 1:
            raise HookscopeError(f"mon.note(loss=) takes the step's loss as one number; got a tensor of shape "
                                 f"{tuple(loss.shape)}: pass loss.mean() (or the sum your loop minimises)")
        if loss is not None:
            self._loss = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
        if lr is not None:
            self._lr = float(lr)

    def step(self, loss: torch.Tensor | float | None = None, lr: float | None = None) -> None:
        """End the step under way, where no optimizer was given: call it after the backward pass and
        the update, before the gradients are cleared. With an optimizer its steps are counted."""
        self._own_steps("step()")
        self.note(loss, lr)
        self._check()
        self._finish()

    def before_update(self) -> None:
        """The sentinel and the parameters' side of the step under way, for a loop (or a trainer)
        whose optimizer the monitor does not hook: call it once the gradients are complete, just
        before the weights change; ``nonfinite="raise"`` raises here, before any change."""
        self._own_steps("before_update()")
        self._check(snapshot=True)

    def after_update(self) -> None:
        """End the step under way (after :meth:`before_update` and the update): the sampled step's
        rows are written and its hooks removed, and the next step begins."""
        self._own_steps("after_update()")
        self._finish()

    def _own_steps(self, call: str) -> None:
        if self._state != "open":
            raise HookscopeError(f"mon.{call} outside the monitor's block; call it inside `with hookscope.monitor(...) as mon:`")
        if self.optimizer is not None:
            raise HookscopeError(f"this monitor counts the optimizer's steps; drop mon.{call} "
                                 "(mon.note(loss=...) before optimizer.step() gives it the loss)")

    def skip(self, reason: str) -> None:
        """Mark the step under way as one whose update does not run (its ``step`` row says
        ``skipped`` with ``reason``, its parameters' rows measure no update); if the sentinel has not
        checked the step yet, it does now, naming a non-finite step without raising (no update is
        left to keep from happening). End the step as usual after (``after_update()``, ``step()``).
        With ``scaler=`` the monitor does this itself for the steps the scaler skips."""
        if self._state != "open":
            raise HookscopeError("mon.skip() outside the monitor's block; call it inside `with hookscope.monitor(...) as mon:`")
        self._skip = reason or "the update did not run"
        if not self._checked_now:
            self._check(act=False)

    def _scaler_update(self) -> None:
        """Just before ``scaler.update()``: a step whose ``optimizer.step()`` the scaler did not call."""
        stepped, self._stepped = self._stepped, False
        if self._state == "open" and not stepped and scaler_skipped(self.scaler, self.optimizer):
            self.skip("GradScaler found Inf or NaN gradients and did not run optimizer.step()")
            self._finish()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside, the model's passes are not the step's: a validation pass run between two steps
        leaves no rows in the next sampled step (the sentinel, which reads gradients, is not paused)."""
        self._paused += 1
        if self._probe is not None:
            self._probe.pause(True)
        try:
            yield
        finally:
            self._paused -= 1
            if self._probe is not None and not self._paused:
                self._probe.pause(False)

    # --- the step's life ---------------------------------------------------------------------
    def sampled(self, step: int | None = None) -> bool:
        """Whether step ``step`` (the step under way by default) is sampled."""
        return self.schedule.sampled(self.step_number if step is None else step)

    def _begin(self) -> None:
        self._rng = RandomState() if self.replay is not None else None
        if not self.sampled():
            return
        keep = frozenset(self.stats & {"input", "output", "grad_output"})
        self._probe = Probe(self.model, self.root, self.selected, keep=keep, dead="dead" in self.stats,
                            bins=self.bins)
        self._probe.attach()
        self._probe.pause(self._paused > 0)
        self._side = ParamSide(self._owned, update="update" in self.stats, bins=self.bins,
                               buffers=self._spare) if self._owned else None
        self._spare = []
        if self._side is not None and self.optimizer is None:
            self._side.snapshot()  # no optimizer: the update happens somewhere in the step

    def _pre_hook(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._state != "open":
            return None
        closure = kwargs.get("closure") if kwargs.get("closure") is not None else (
            args[1] if len(args) > 1 and callable(args[1]) else None)
        if closure is None:
            self._check()
            return None
        # the closure computes the gradients inside step(): the check runs once it has, before the update
        wrapped = self._after_closure(closure)
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _after_closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        calls = [0]

        def run() -> Any:
            loss = closure()
            calls[0] += 1
            if calls[0] == 1 and self._state == "open":  # LBFGS calls it again: the step's first evaluation is checked
                if isinstance(loss, torch.Tensor) and loss.numel() == 1 and self._loss is None:
                    self.note(loss=loss)
                self._check()
            return loss

        return run

    def _post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True
        if self._state == "open":
            self._finish()

    def _checked(self) -> list[torch.Tensor]:
        if self.optimizer is not None:
            return [p for group in self.optimizer.param_groups for p in group["params"]]
        return [p for p in self.root.parameters() if p.requires_grad]

    def _check(self, snapshot: bool = False, act: bool = True) -> None:
        """Just before the update: the sentinel, and the parameters' side of a sampled step; without
        ``act`` (the update does not run) a non-finite step is named, not raised or skipped."""
        self._checked_now = True
        if self.optimizer is not None:
            lr = self.optimizer.param_groups[0].get("lr")
            self._lr = lr if lr is not None else self._lr  # read as a number only on the steps written
        params = self._checked()
        grads = [p.grad for p in params if p.grad is not None]
        loss = self._loss if isinstance(self._loss, torch.Tensor) else (
            torch.tensor(self._loss) if self._loss is not None else None)
        if self._side is not None:
            if (self.optimizer is not None or snapshot) and act:  # the weights as the update finds them
                self._side.snapshot()
            self._side.before()
        if self.on_nonfinite == "off":
            return  # no sentinel: the sampled steps' rows still count NaN and Inf
        if self._side is not None and self._side.covers(params):
            # a sampled step has just counted every gradient's NaN and Inf: no second pass over them
            finite = self._side.grads_finite() and all_finite([], loss)
        else:
            finite = all_finite(grads, loss)
        if not finite:
            self._flagged(params, loss, act)

    def _flagged(self, params: list[torch.Tensor], loss: torch.Tensor | None, act: bool = True) -> None:
        event = self._name(params, loss)
        self._flag, self.last_nonfinite, self.flagged = event, event, self.flagged + 1
        self.nonfinite = self.nonfinite or event
        if not act:
            return
        if self.on_nonfinite == "raise":
            self._skip = "the sentinel raised before the update"
            self._finish()  # the update never runs; a loop that catches the error goes on with the next step
            raise NonFiniteStepError(event.describe() + "; nonfinite='skip' skips such steps, 'log' goes on",
                                     event.row, [], step=event.step)
        if self.on_nonfinite == "skip":
            self._skip = "nonfinite='skip' cleared the gradients: the update left the weights as they were"
            for p in params:
                p.grad = None  # the optimizer leaves a parameter without a gradient as it is, state too

    def _name(self, params: list[torch.Tensor], loss: torch.Tensor | None) -> NonFinite:
        bad = tuple(self._names.get(id(p), "?") for p in params
                    if p.grad is not None and not bool(torch.isfinite(stored(p.grad)).all()))
        found = tuple(w for w, no in (("loss", loss is not None and not bool(torch.isfinite(loss).all())),
                                      ("gradients", bool(bad))) if no)
        row, replayed, error = None, False, ""
        if self.replay is not None:
            replayed = True
            try:
                row = culprit_of(*replay_step(self.model, self.root, self.replay, self._rng))
            except Exception as e:  # the replay is the user's code: a failing one names no module; the step is still flagged
                error = f"{type(e).__name__}: {e}".splitlines()[0]
        if row is None and self._probe is not None:
            row = self._probe.first_nonfinite()
        if row is None:
            return NonFinite(self.step_number, "", "", "", found, bad, None, replayed, error)
        return NonFinite(self.step_number, row.module, row.phase, row.which, found, bad, row, replayed, error)

    def _finish(self) -> None:
        """Just after the update: the sampled step's rows written, its hooks removed, the next begun."""
        rows: list[TelemetryRow] = []
        histograms = []
        sampled = self._probe is not None
        if self._probe is not None:
            rows += self._probe.rows(self.step_number)
            histograms += self._probe.histograms(self.step_number)
        if self._probe is not None and self.scaler is not None:
            rows = unscaled(rows, self.scaler)
        if self._side is not None:
            rows += self._side.rows(self.step_number, updated=not self._skip)
            histograms += self._side.histograms(self.step_number)
            self._spare = self._side.spare() if self.sampled(self.step_number + 1) else []
        self._end_probe()
        if sampled or self._flag is not None:
            loss = self._loss
            lr = None if self._lr is None else float(self._lr)
            rows.insert(0, TelemetryRow(self.step_number, "", "step", "", loss=None if loss is None else float(loss), lr=lr,
                                        skipped=bool(self._skip), note=self._skip))
            if self._flag is not None:
                rows.append(_flag_row(self._flag))
            telemetry = Telemetry(self.step_number, rows, histograms)
            if sampled:
                self.last = telemetry
            for w in self.writers:
                w.write(telemetry)
        self._loss, self._flag, self._skip, self._checked_now = None, None, "", False
        self.step_number += 1
        self._begin()

    def _end_probe(self) -> None:
        if self._probe is not None:
            self._probe.close()
        self._probe, self._side = None, None

    def __repr__(self) -> str:
        return (f"Monitor(step_number={self.step_number}, layers={len(self.selected)}, every={self.schedule.every}, "
                f"flagged={self.flagged})")


def _flag_row(event: NonFinite) -> TelemetryRow:
    r = event.row
    return TelemetryRow(event.step, event.module, "nonfinite", "" if r is None else f"{r.phase} {r.which} {r.path}",
                        numel=None if r is None else r.numel, nan=None if r is None else r.nan,
                        inf=None if r is None else r.inf, note=event.describe())


def _check_optimizer(optimizer: Any, root: nn.Module) -> None:
    if optimizer is None:
        return
    if not (callable(getattr(optimizer, "register_step_pre_hook", None))
            and callable(getattr(optimizer, "register_step_post_hook", None)) and hasattr(optimizer, "param_groups")):
        raise HookscopeError(f"optimizer={type(optimizer).__name__} cannot be hooked (not a torch.optim.Optimizer: "
                             "no register_step_pre_hook); pass optimizer=None and call mon.step() after each update")
    mine = {id(p) for p in root.parameters()}
    if not any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
        raise HookscopeError(f"optimizer={type(optimizer).__name__} holds none of {type(root).__name__}'s "
                             "parameters; pass the optimizer that trains this model")


@checked
def monitor(model: nn.Module, *selectors: Selector, every: int | None = 100, steps: Steps = None, log: Log = None,
            optimizer: Any = None, stats: str | Iterable[str] = "all", histograms: Bins | None = None,
            nonfinite: str = "raise", replay: Callable[[], Any] | None = None, scaler: Any = None) -> Monitor:
    """Watch a training run: per-layer telemetry on sampled steps, a NaN/Inf sentinel on every step.

    A step is one ``optimizer.step()`` (through its step hooks), or one :meth:`Monitor.step` call
    where no optimizer is given. On each sampled step, for each selected layer: statistics of its
    inputs, outputs and the gradients at its outputs (mean, std, min, max, rms, zeros, NaN and Inf
    counts), the fraction of dead units, and per parameter its norm, its gradient's statistics and
    norm, and the update ratio ``||w_after - w_before|| / ||w_before||``; the loss and learning
    rate; histograms if asked. The hooks of a sampled step are registered as the step before it ends
    and removed as it ends: between sampled steps the model holds no hook
    (``hookscope.core.hook_count(model) == 0``).

    On every step the sentinel checks the gradients (and the loss given to :meth:`Monitor.note`)
    with one sum per gradient and one host synchronisation; on a non-finite step it names the step and,
    with ``replay``, the first module where the NaN or Inf appeared (forward or backward), from a
    replay of that step before any weight changes.

    Args:
        model: the model trained; names are the inner model's, through wrappers.
        *selectors: the layers to describe (as for :func:`hookscope.layers`); none: every leaf module.
        every: sample every N-th step (steps 0, N, 2N, ...); ``None``: only ``steps``.
        steps: more sampled steps: numbers (``[1, 5]``, ``range(10)`` for the first ten) or a
            function ``step -> bool``.
        log: a folder (JSON lines and CSV there: ``monitor.jsonl``, ``monitor.csv``), a writer
            (:class:`~hookscope.TensorBoardWriter`, :class:`~hookscope.WandbWriter`, ...) or a list
            of them; ``None`` keeps only :attr:`Monitor.last`.
        optimizer: the ``torch.optim.Optimizer`` whose steps are the steps; ``None``: call
            :meth:`Monitor.step`.
        stats: what to take on sampled steps: ``"all"`` or some of :data:`STATS`.
        histograms: ``None``, a number of bins spanning each tensor's finite values, or fixed edges;
            NaN, +Inf, -Inf (and values beyond fixed edges) are counted apart, never dropped.
        nonfinite: on a non-finite step, ``"raise"`` a :class:`~hookscope.NonFiniteError` naming the
            step and module, ``"skip"`` the update (gradients cleared before the optimizer runs:
            weights and optimizer state untouched; needs ``optimizer``), ``"log"`` and go on, or
            ``"off"``: no sentinel (no per-step read of the gradients; sampled steps' rows still
            count NaN and Inf, but nothing is flagged).
        replay: a function that recomputes the step under way's loss from its batch (a lambda over
            the loop's variables, ``lambda: loss_fn(model(x), y)``), called only on a non-finite
            step, to name the module; ``Monitor.replay`` may also be set per step.
        scaler: the ``torch.amp.GradScaler`` of the loop (needs ``optimizer``): a step it skips
            (Inf or NaN gradients: ``optimizer.step()`` not called) is still a step, ended at
            ``scaler.update()``, marked ``skipped`` and named by the sentinel without raising (the
            scaler's own handling of an overflow); the output gradients' statistics are divided by
            the scale, as the scaler unscales the parameters' gradients.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> x, y = torch.randn(16, 4), torch.randn(16, 1)
        >>> with hookscope.monitor(net, every=10, optimizer=opt) as mon:
        ...     for _ in range(25):
        ...         opt.zero_grad()
        ...         loss = torch.nn.functional.mse_loss(net(x), y)
        ...         loss.backward()
        ...         mon.note(loss=loss)
        ...         opt.step()
        ...         assert hookscope.core.hook_count(net) == 0 or mon.sampled()
        >>> mon.last.step, [r.path for r in mon.last["0"] if r.what == "param"]
        (20, ['weight', 'bias'])
    """
    schedule = Schedule(every, steps)
    if nonfinite not in NONFINITE:
        raise HookscopeError(f"nonfinite={nonfinite!r}: choose 'raise', 'skip', 'log' or 'off'.{did_you_mean(str(nonfinite), NONFINITE)}")
    root = unwrap(model)[0]
    _check_optimizer(optimizer, root)
    if nonfinite == "skip" and optimizer is None:
        raise HookscopeError("nonfinite='skip' needs optimizer=: without one the monitor cannot keep an update from happening")
    if replay is not None and not callable(replay):
        raise HookscopeError(f"replay= must be a function of no arguments that returns the step's loss; got {type(replay).__name__}")
    if scaler is not None and (optimizer is None or not all(callable(getattr(scaler, n, None))
                                                            for n in ("update", "get_scale", "is_enabled"))):
        raise HookscopeError("scaler= takes the loop's torch.amp.GradScaler, with optimizer= (the scaler steps it)"
                             if optimizer is None else f"scaler={type(scaler).__name__} is not a torch.amp.GradScaler")
    chosen = _stats(stats)
    bins = check_bins(histograms)
    selected = _leaves(model, selectors)
    return Monitor(model, selected, schedule=schedule, log=writers_of(log), optimizer=optimizer, stats=chosen,
                   bins=bins, nonfinite=nonfinite, replay=replay, scaler=scaler)
