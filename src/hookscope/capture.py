"""Record what selected modules receive and produce, forward and backward, one record per call."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ._tree import tensors, tree_map
from .core.guard import Slot, plain, release
from .core.hooks import HookGroup
from .errors import HookscopeError, did_you_mean
from .records import HOLE, RAISED, Recording, Retention
from .selection import Selector, layers, unwrap

__all__ = ["capture", "Capture", "FIELDS"]

FIELDS = ("input", "output", "grad_input", "grad_output")
_GROUPS = {"all": FIELDS, "grads": ("grad_input", "grad_output"), "io": ("input", "output")}


def parse_keep(keep: str | Iterable[str]) -> frozenset[str]:
    """``"output"``, ``"all"``, ``("input", "grad_output")`` ... -> the set of fields to record."""
    items = [keep] if isinstance(keep, str) else list(keep)
    out: set[str] = set()
    for k in items:
        if k in _GROUPS:
            out.update(_GROUPS[k])
        elif k in FIELDS:
            out.add(k)
        else:
            choices = list(FIELDS) + list(_GROUPS)
            raise HookscopeError(
                f"keep={k!r} is not something a capture records.{did_you_mean(str(k), choices)} "
                f"Use any of {', '.join(choices)}"
            )
    if not out:
        raise HookscopeError("keep= is empty; name at least one of " + ", ".join(FIELDS))
    return frozenset(out)


class StopForward(BaseException):
    """Raised by a forward hook to end the forward pass early; only its own capture swallows it.

    A BaseException, so that ``except Exception`` inside a model's forward does not swallow it.
    """

    def __init__(self, owner: object = None) -> None:
        super().__init__("hookscope stopped the forward pass after the last selected layer")
        self.owner = owner


class Capture(Recording):
    """A context that records selected modules; after the block it is the :class:`Recording`.

    Build it with :func:`capture`.
    """

    def __init__(
        self,
        model: nn.Module,
        selected: list[tuple[str, nn.Module]],
        keep: frozenset[str],
        retention: Retention,
        stop: bool,
    ) -> None:
        super().__init__([n for n, _ in selected])
        self._model: nn.Module | None = model
        self._targets: list[tuple[str, nn.Module]] | None = selected
        self.keep = keep
        self.retention = retention
        self.stop = stop
        self._group = HookGroup()
        self._slots: list[Slot] = []
        self._remaining: set[str] = set()
        self.stopped = False

    # lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Capture:
        if self._targets is None:
            raise HookscopeError("this capture has already run; call hookscope.capture(...) again")
        assert self._model is not None
        # Under torch.compile, hooks run eagerly between graph pieces instead of being traced:
        # they keep Python state (per-thread call stacks, records) that dynamo cannot trace.
        compiled = "_orig_mod." in unwrap(self._model)[1]
        eager = torch.compiler.disable if compiled else (lambda f: f)
        if compiled and self.retention.copy == "auto":
            # a guarded alias must not reach compiled graph pieces (their out= ops refuse subclasses)
            self.retention = dataclasses.replace(self.retention, copy="always")
        try:
            for name, module in self._targets:
                (pre, with_kwargs), post = self._hooks(name)
                pre, post = eager(pre), eager(post)
                self._group.add(module.register_forward_pre_hook(pre, with_kwargs=with_kwargs))
                self._group.add(module.register_forward_hook(post))
            if self.retention.copy != "always":
                self._group.add(self._model.register_forward_hook(_hand_back_plain))
        except BaseException:
            self._close()
            raise
        self._remaining = set(self.selected)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._close()
        if isinstance(exc, StopForward) and exc.owner is self:
            self.stopped = True
            return True
        return False

    def _close(self) -> None:
        self._group.remove()
        release(self._slots)
        self._slots = []
        self._model = None  # nothing of the model outlives the context
        self._targets = None

    def remove(self) -> None:
        """Remove every hook now (the context does this by itself on exit). Idempotent."""
        self._close()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Call the model inside this capture; with ``stop=True`` returns ``None`` once stopped.

        Example:
            >>> # with hookscope.capture(model, "layer1", stop=True) as rec:
            >>> #     rec.run(x)           # the layers after layer1 never run
        """
        if self._model is None:
            raise HookscopeError("run() needs an open capture: call it inside the with block")
        try:
            return self._model(*args, **kwargs)
        except StopForward as e:
            if e.owner is not self:
                raise
            self.stopped = True
            return None

    # hooks ----------------------------------------------------------------------------------
    def _hooks(self, name: str) -> tuple[Any, Any]:
        keep, ret, slots = self.keep, self.retention, self._slots
        want_in, want_out = "input" in keep, "output" in keep
        grad_in, grad_out = "grad_input" in keep, "grad_output" in keep
        open_calls: dict[int, list[Any]] = {}  # per thread: DataParallel runs replicas in threads
        add, group, get_ident = self._add, self._group, threading.get_ident

        def keep_tree(obj: Any, where: Any) -> tuple[Any, Any]:
            """(tree of slots, tree the model goes on with)."""
            if isinstance(obj, torch.Tensor):
                slot, alias = ret.keep(obj, where)
                slots.append(slot)
                return slot, alias
            kept: list[Slot] = []

            def one(t: torch.Tensor) -> torch.Tensor:
                slot, alias = ret.keep(t, where)
                kept.append(slot)
                return alias

            aliases = tree_map(one, obj)
            slots.extend(kept)
            it = iter(kept)
            return tree_map(lambda t: next(it), obj), aliases

        def start(module: nn.Module, args: tuple[Any, ...]) -> None:
            call = add(name)  # at the start, so records are in the order calls began
            open_calls.setdefault(get_ident(), []).append(call)
            if want_out:
                call._output = RAISED  # until the call returns

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            start(module, args)
            call = open_calls[get_ident()][-1]
            new_args, new_kwargs = args, kwargs
            if want_in:
                call._args, new_args = keep_tree(args, ("input", name, call.index))
                call._kwargs, new_kwargs = keep_tree(kwargs, ("input", name, call.index))
            if grad_in:
                new_args = self._watch_inputs(call, new_args)
            if new_args is args and new_kwargs is kwargs:
                return None
            return new_args, new_kwargs

        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            stack = open_calls.get(get_ident())
            call = stack.pop() if stack else add(name)
            if grad_in:
                self._check_inputs(call)
            new_output = output
            if want_out:
                call._output, new_output = keep_tree(output, ("output", name, call.index))
            if grad_out:
                self._watch_outputs(call, output)
            if self.stop:
                self._remaining.discard(name)
                if not self._remaining:
                    raise StopForward(self)
            return None if new_output is output else new_output

        return (pre, True) if (want_in or grad_in) else (start, False), post

    def _grad_setter(self, grads: list[Slot | None], i: int, where: Any) -> Any:
        ret = self.retention

        def hook(g: torch.Tensor) -> None:
            grads[i] = ret.keep_grad(g, where)

        return hook

    def _watch_outputs(self, call: Any, output: Any) -> None:
        # Tensor hooks on the output itself, not register_full_backward_hook: the full backward hook
        # breaks when an in-place op follows the module (pytorch/pytorch#61519), and a hook on an
        # alias is orphaned by such an op; a hook on the original fires with the true grad_output.
        outs = list(tensors(output))
        grads: list[Slot | None] = [None] * len(outs)
        call._grads_out, call._skel_out = grads, tree_map(lambda t: HOLE, output)
        where = ("grad_output", call.name, call.index)
        for i, t in enumerate(outs):
            if t.requires_grad:
                self._group.add(t.register_hook(self._grad_setter(grads, i, where)))

    def _watch_inputs(self, call: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        # A fresh alias per call, so its hook sees only the gradient that flows through this module
        # (the input itself may feed other modules too, e.g. a residual branch).
        watched: list[torch.Tensor] = []

        def alias(t: torch.Tensor) -> torch.Tensor:
            if not (t.requires_grad and torch.is_grad_enabled()):
                watched.append(t)
                return t
            a = t.view_as(t)
            watched.append(a)
            return a

        new_args = tree_map(alias, args)
        grads: list[Slot | None] = [None] * len(watched)
        call._grads_in, call._skel_in = grads, tree_map(lambda t: HOLE, args)
        where = ("grad_input", call.name, call.index)
        for i, a in enumerate(watched):
            if a.requires_grad and torch.is_grad_enabled():
                self._group.add(a.register_hook(self._grad_setter(grads, i, where)))
                call._watched.append((a, a._version))
        return new_args

    def _check_inputs(self, call: Any) -> None:
        watched, call._watched = call._watched, []
        if any(a._version != v for a, v in watched):
            call.note = (
                "the module modifies its input in place (inplace=True), which detaches the input "
                "gradient from it (pytorch/pytorch#61519); read grad_output of the layer before it"
            )


def check_hookable(selected: list[tuple[str, nn.Module]]) -> None:
    """Refuse TorchScript submodules before anything is registered: their hooks would never run."""
    for name, module in selected:
        if isinstance(module, torch.jit.ScriptModule):
            raise HookscopeError(
                f"{name!r} is a TorchScript module, where Python hooks do not run; "
                "select its eager nn.Module (before torch.jit.script) instead"
            )


def _hand_back_plain(module: nn.Module, args: Any, output: Any) -> Any:
    """The model's caller gets ordinary tensors, never hookscope's guarded aliases."""
    new = tree_map(plain, output)
    return None if new is output else new


def capture(
    model: nn.Module,
    *selectors: Selector,
    keep: str | Iterable[str] = "output",
    copy: str = "auto",
    detach: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    stop: bool = False,
) -> Capture:
    """Record what the selected modules receive and produce, one record per call.

    Args:
        model: any ``nn.Module``; DataParallel / DDP / ``torch.compile`` wrappers are seen through
            and records are keyed by the names of the model inside.
        *selectors: names, globs, ``"re:..."`` regexes, module types, modules or predicates (see
            :func:`hookscope.layers`). None selects every module.
        keep: what to record: ``"output"`` (default), ``"input"`` (positional and keyword),
            ``"grad_output"``, ``"grad_input"``, or groups ``"io"``, ``"grads"``, ``"all"``.
        copy: ``"auto"`` (default): no copy unless something writes into a recorded tensor later
            (``ReLU(inplace=True)``, ``out += identity``), then a copy of that one tensor is made
            just before; ``"always"``: copy every record; ``"never"``: no copy, and a record whose
            memory was overwritten raises :class:`~hookscope.MutationError` when read.
        detach: keep records without their autograd graph (default).
        device, dtype: move / cast records (for example ``device="cpu"``).
        stop: end the forward pass once every selected module has run once (later layers are not
            computed). Use ``rec.run(x)``, or know that the rest of the ``with`` block is skipped.

    Returns:
        A context manager; inside and after the block it maps names to :class:`LayerRecord`.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True))
        >>> with hookscope.capture(net, "0") as rec:
        ...     y = net(-torch.ones(1, 4))
        >>> bool((rec["0"].output < 0).any())   # the true pre-ReLU values, not the rewritten ones
        True
    """
    fields = parse_keep(keep)
    if stop and fields & {"grad_input", "grad_output"}:
        raise HookscopeError(
            "stop=True ends the forward pass early, so no backward pass can record gradients; "
            "drop stop=True or keep only 'input'/'output'"
        )
    retention = Retention(copy=copy, detach=detach, device=device, dtype=dtype)  # type: ignore[arg-type]
    selected = layers(model, *selectors)
    check_hookable(selected)
    return Capture(model, selected, fields, retention, stop)
