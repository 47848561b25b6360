"""Hooks on ``torch.compile``'d models: run them eagerly, and make them take effect after compilation.

Dynamo does not guard on module hooks added after a graph was compiled
(``torch._dynamo.config.skip_nnmodule_hook_guards`` is ``True`` by default): a compiled model that
has already run keeps running its old graph and every hook added later is silently ignored. While a
hookscope block is open, :class:`HookRefresh` points each compiled entry of the model at a fresh
code object, so Dynamo traces it anew with the hooks in place; closing the block puts the original
entry back, whose graphs were compiled without hooks and stay valid. Compiling costs time, never
correctness. Functions compiled with ``torch.compile(fn)`` and called inside a forward are not
module entries and are not refreshed.
"""

from __future__ import annotations

import itertools
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from ..errors import HookscopeError

__all__ = ["is_compiled", "compiled_modules", "eager", "HookRefresh"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_open: dict[int, list[Any]] = {}  # id(entry module) -> [open count, original callable, attribute]
_serial = itertools.count()


def _entry_attr(module: nn.Module) -> str | None:
    """Which attribute holds the compiled entry of ``module``, if it is compiled at all."""
    if type(module).__name__ == "OptimizedModule" and "forward" in module.__dict__:
        return "forward"  # torch.compile(module)
    if getattr(module, "_compiled_call_impl", None) is not None:
        return "_compiled_call_impl"  # module.compile()
    return None


def compiled_modules(model: nn.Module) -> list[nn.Module]:
    """``model`` and its submodules that are compiled entries (``torch.compile(m)`` or ``m.compile()``).

    Example:
        >>> compiled_modules(torch.nn.Linear(2, 2))
        []
    """
    return [m for m in model.modules() if _entry_attr(m) is not None]


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or any of its submodules runs through ``torch.compile``.

    Example:
        >>> is_compiled(torch.nn.Linear(2, 2))
        False
    """
    return bool(compiled_modules(model))


def eager(fn: F) -> F:
    """``fn`` made to run eagerly between graph pieces instead of being traced by Dynamo.

    hookscope's hooks keep Python state (per-thread call stacks, records) that Dynamo cannot trace;
    traced, a statistics hook can even unroll a loop over every element.

    Example:
        >>> eager(len)([1, 2])
        2
    """
    return torch.compiler.disable(fn)


def _context(module: nn.Module, attr: str) -> Any:
    """The Dynamo context (backend and options) that compiled ``module``'s entry."""
    if attr == "forward":
        return getattr(module, "dynamo_ctx", None)
    fn = getattr(module, attr)
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    if "self" in names and fn.__closure__ is not None:
        return fn.__closure__[names.index("self")].cell_contents
    return None


def _fresh_entry(module: nn.Module, attr: str) -> Any:
    """A new compiled entry for ``module``: same backend and options, a code object never seen."""
    ctx = _context(module, attr)
    if ctx is None or not callable(ctx):
        raise HookscopeError(
            f"cannot make hooks take effect in the compiled {type(module).__name__}: its compile "
            "context is not reachable in this PyTorch; pass the model before torch.compile instead"
        )
    target: Any = module._orig_mod if attr == "forward" else module._call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    name = f"hookscope_entry_{next(_serial)}"
    code = call.__code__.replace(co_name=name)
    return ctx(types.FunctionType(code, call.__globals__, name, None, call.__closure__))


class HookRefresh:
    """Make hooks registered on a compiled model take effect; put its compiled code back after.

    Call :meth:`open` right after registering hooks and :meth:`close` right after removing them
    (idempotent). Blocks may nest or overlap: each open and each close of another block re-traces
    with the hooks present at that moment; the last close restores the original entry.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> with HookRefresh(net):      # not compiled: nothing to do
        ...     _ = net(torch.ones(1, 2))
    """

    def __init__(self, model: nn.Module) -> None:
        self._entries = [(m, a) for m in model.modules() if (a := _entry_attr(m)) is not None]
        self._opened = False

    def open(self) -> None:
        """Point every compiled entry at fresh code (after this block's hooks were registered)."""
        if self._opened or not self._entries:
            return
        with _lock:
            fresh = [_fresh_entry(m, a) for m, a in self._entries]  # may raise: nothing changed yet
            for (module, attr), entry in zip(self._entries, fresh):
                state = _open.setdefault(id(module), [0, getattr(module, attr), attr])
                setattr(module, attr, entry)
                state[0] += 1
        self._opened = True

    def close(self) -> None:
        """Undo :meth:`open` (after this block's hooks were removed). Idempotent."""
        if not self._opened:
            return
        self._opened = False
        with _lock:
            for module, attr in self._entries:
                state = _open[id(module)]
                state[0] -= 1
                if state[0] == 0:
                    setattr(module, attr, state[1])
                    del _open[id(module)]
                else:  # another block is still open: re-trace without this block's hooks
                    setattr(module, attr, _fresh_entry(module, attr))

    def __enter__(self) -> HookRefresh:
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
