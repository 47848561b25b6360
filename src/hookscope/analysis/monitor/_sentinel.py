"""What the sentinel says on a step whose loss or gradients hold a NaN or an Inf: the step, and the
first module where the value appeared, found by replaying that step's forward and backward passes
with the statistics engine's hooks on every module (as ``hookscope.watch`` has them), the random
state of the step's start put back, before the optimizer changes any weight."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ...core.state import restored
from .._recorder import Context, RecorderSession, param_targets, select
from .._rows import Pending, StatRow, event, gather

__all__ = ["NonFinite", "RandomState", "culprit_of", "replay_step"]

Replay = Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """A step whose loss or gradients held a NaN or an Inf.

    ``module`` names where it first appeared (``""`` when it could not be told: no ``replay=``, or
    the replay came out finite); ``phase`` is ``"forward"`` or ``"backward"`` and ``which`` what was
    found there (``output``, ``grad_input``: the gradient a module sent back, ``grad_param``,
    ``own_forward``: made by the module's own code between its children; ``loss``: the loss the
    replay computed was the first non-finite value, from finite outputs); ``row`` holds its
    statistics; ``replay_error`` what a failing ``replay=`` raised. ``found`` says what the sentinel saw: ``"loss"`` and/or ``"gradients"``, and
    ``params`` the parameters whose gradients were not finite.
    """

    step: int
    module: str
    phase: str
    which: str
    found: tuple[str, ...]
    params: tuple[str, ...]
    row: StatRow | None = None
    replayed: bool = False
    replay_error: str = ""

    def describe(self) -> str:
        """One line: the step, where the value appeared, what the sentinel saw.

        Example:
            >>> NonFinite(37, "", "", "", ("loss",), ()).describe()
            'step 37: the loss is not finite; pass replay= to name the module where it appeared'
        """
        seen = " and ".join(self.found) or "values"
        lead = f"step {self.step}: the {seen} {'is' if seen == 'loss' else 'are'} not finite"
        if self.row is not None and self.which == "loss":
            return f"{lead}; first non-finite in the loss, computed from finite model outputs: {self.row.nan} NaN, {self.row.inf} Inf"
        if self.row is not None:
            where = f"{self.module!r}" if self.module else "the model's input"
            return (f"{lead}; first non-finite in {where}, {self.phase} {self.which} {self.row.path}: "
                    f"{self.row.nan} NaN, {self.row.inf} Inf of {self.row.numel} values")
        params = f" (gradients of {', '.join(self.params[:3])}{', ...' if len(self.params) > 3 else ''})" if self.params else ""
        if self.replay_error:
            return f"{lead}{params}; the replay= function raised {self.replay_error}, so no module is named"
        if self.replayed:
            return f"{lead}{params}; the replayed step came out finite (random draws differ?)"
        return f"{lead}{params}; pass replay= to name the module where it appeared"


class RandomState:
    """The random generators as a step began (CPU, and CUDA's once initialised): the replay draws
    the dropout masks the step drew, if nothing between drew random numbers first."""

    def __init__(self) -> None:
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def put_back(self) -> None:
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def replay_step(model: nn.Module, root: nn.Module, replay: Replay, rng: RandomState | None) -> tuple[list[StatRow], dict[tuple[str, int], Context]]:
    """Run ``replay`` (the step's loss, recomputed) and its backward pass with the statistics hooks
    on every module; the model's gradients, modes, buffers and random state are put back after."""
    selected = select(model, ())
    events: list[Pending] = []
    contexts: dict[tuple[str, int], Context] = {}

    def note(name: str, call: int, kind: str, context: Context) -> None:
        contexts[(name, call)] = context

    session = RecorderSession(selected, keep=frozenset({"output", "grad_output", "grad_input"}), sink=events.append,
                              root=root, params=param_targets(root, selected, every=True), model=model,
                              received=True, on_context=note)
    params = list(root.parameters())
    grads = [p.grad for p in params]
    devices = ([i for i in range(torch.cuda.device_count())], "cuda") if rng is not None and rng.cuda is not None else None
    try:
        for p in params:
            p.grad = None
        with restored(root, rng=devices):
            if rng is not None:
                rng.put_back()
            with session, torch.enable_grad():
                loss = replay()
                loss = loss if isinstance(loss, torch.Tensor) else getattr(loss, "loss", None)
                if isinstance(loss, torch.Tensor):
                    # between the forward's records and the backward's: a loss made non-finite from
                    # finite outputs is the loss computation's doing
                    events.append(event("", loss.detach(), phase="forward", which="loss", path="loss"))
                if isinstance(loss, torch.Tensor) and loss.requires_grad:
                    (loss.sum() if loss.dim() else loss).backward()
    finally:
        for p, g in zip(params, grads):
            p.grad = g
    return gather(events), contexts


def culprit_of(rows: Sequence[StatRow], contexts: dict[tuple[str, int], Context]) -> StatRow | None:
    """The first non-finite record in the order the calls finished and the gradients arrived. A
    call's input that no watched call made and that is not finite was made by the parent's own
    forward (named as ``own_forward`` of that parent); a non-finite model input is no module's
    doing: the first module that outputs it is named.

    Example:
        >>> from .._rows import event
        >>> rows = gather([event("0", torch.ones(1)), event("1", torch.tensor([float("nan")]))])
        >>> culprit_of(rows, {}).module
        '1'
    """
    from_caller: set[int] = set()  # forward passes whose model input was not finite
    for row in rows:
        if row.finite:
            continue
        if row.which != "received":
            return row
        context = contexts.get((row.module, row.call))
        if context is not None and context[0] is None:
            from_caller.add(context[4])
        if context is None or context[0] is None or context[4] in from_caller:
            continue  # the model's own input: the first module that outputs it is named
        return dataclasses.replace(row, module=context[0], call=context[1], which="own_forward",
                                   path=f"{row.module} {row.path}")
    return None
