"""Hooks on ``torch.compile``'d models: run them eagerly, and make them take effect after compilation.

Dynamo does not guard on module hooks added after a graph was compiled
(``torch._dynamo.config.skip_nnmodule_hook_guards`` is ``True`` by default): a compiled model that
has already run keeps running its old graphs and every hook added later is silently ignored. A
compiled entry may sit anywhere in the tree (``torch.compile(model)``, ``model.compile()``,
``model[1] = torch.compile(model[1])``, ``block.forward = torch.compile(block.forward)``). While a
hookscope block is open, :class:`HookRefresh` points each compiled entry that encloses a hooked
module at a fresh entry compiled by a fresh backend object, so Dynamo traces it anew with the hooks
in place; closing the block puts the original entry back, whose graphs were compiled without hooks
and stay valid. Compiling costs time, never correctness. Functions compiled with
``torch.compile(fn)`` and called inside a forward are not module entries and are not refreshed.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import torch
from torch import nn

from ..errors import HookscopeError

__all__ = ["is_compiled", "compiled_modules", "eager", "HookRefresh"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_open: dict[int, list[Any]] = {}  # id(entry module) -> [open count, original callable, attribute]
_serial = itertools.count()
_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _wrapped(module: nn.Module) -> nn.Module | None:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) wraps; ``None`` for any other."""
    inner = module._modules.get("_orig_mod") if type(module).__name__ == "OptimizedModule" else None
    return inner if isinstance(inner, nn.Module) else None


def _entry_attr(module: nn.Module) -> str | None:
    """Which attribute holds the compiled entry of ``module``, if it is compiled at all."""
    if _wrapped(module) is not None and "forward" in module.__dict__:
        return "forward"  # torch.compile(module)
    if getattr(module, "_compiled_call_impl", None) is not None:
        return "_compiled_call_impl"  # module.compile()
    if hasattr(module.__dict__.get("forward"), "_torchdynamo_orig_callable"):
        return "forward"  # module.forward = torch.compile(module.forward)
    return None


def compiled_modules(model: nn.Module) -> list[nn.Module]:
    """``model`` and its submodules that are compiled entries (``torch.compile(m)``, ``m.compile()``,
    ``m.forward = torch.compile(m.forward)``), at any depth.

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
    traced, a statistics hook can even unroll a loop over every element. ``fn`` is bound to one
    function Dynamo is told not to trace (``torch.compiler.disable``, applied once): wrapping each
    hook on its own cost ~15 us per hook to register (4.5 ms for the ~300 hooks of a resnet50 trace).

    Example:
        >>> eager(len)([1, 2])
        2
    """
    return cast(F, functools.partial(_untraced(), fn))


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


_UNTRACED: list[Callable[..., Any]] = []


def _untraced() -> Callable[..., Any]:
    """:func:`_call` behind ``torch.compiler.disable``, made on first use (it imports Dynamo)."""
    if not _UNTRACED:
        with _lock:
            if not _UNTRACED:
                _UNTRACED.append(torch.compiler.disable(_call))
    return _UNTRACED[0]


def _inside(module: nn.Module) -> Iterator[nn.Module]:
    """The modules whose hooks the compiled code of entry ``module`` may run (or have traced)."""
    return (_wrapped(module) or module).modules()


def _hooked(module: nn.Module) -> bool:
    return any(getattr(module, k, None) for k in _HOOKS)


def _context(module: nn.Module, entry: Any) -> Any:
    """The Dynamo context (backend and options) that compiled ``entry``, an entry of ``module``."""
    if _wrapped(module) is not None and getattr(module, "dynamo_ctx", None) is not None:
        return module.dynamo_ctx
    names = getattr(getattr(entry, "__code__", None), "co_freevars", ())
    if "self" in names and entry.__closure__ is not None:
        return entry.__closure__[names.index("self")].cell_contents
    return None


def _backend(ctx: Any) -> Any:
    """The backend object ``ctx`` compiles with: the one Dynamo matches cached graphs against."""
    fn = getattr(ctx, "callback", None)
    while fn is not None and hasattr(fn, "_torchdynamo_orig_backend"):
        fn = fn._torchdynamo_orig_backend
    return fn if callable(fn) else None


class _Fresh:
    """A backend object Dynamo has never seen, compiling exactly as ``backend`` does.

    Dynamo looks cached graphs up per code object and reuses one only for the backend object that
    compiled it (its BACKEND_MATCH check; pytorch/pytorch#168373). A fresh code object alone is not
    enough: the frames it calls (a compiled submodule's own ``forward``) would reuse graphs traced
    without the hooks. No ``__eq__``: equal to nothing but itself.
    """

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return self.backend(gm, example_inputs)


def _fresh_entry(module: nn.Module, attr: str, entry: Any) -> Any:
    """A new compiled entry for ``module`` (whose original compiled entry is ``entry``): same
    backend and options, a code object and a backend object Dynamo has never seen."""
    ctx = _context(module, entry)
    backend = _backend(ctx)
    if backend is None:
        raise HookscopeError(
            f"cannot make hooks take effect in the compiled {type(module).__name__}: its compile "
            "context is not reachable in this PyTorch; pass the model before torch.compile instead"
        )
    target: Any = _wrapped(module)  # torch.compile(module): call the module it wraps
    if target is None:  # module.compile() / module.forward = torch.compile(module.forward)
        target = module._call_impl if attr == "_compiled_call_impl" else entry._torchdynamo_orig_callable

    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    name = f"hookscope_entry_{next(_serial)}"
    code = call.__code__.replace(co_name=name)
    fn = types.FunctionType(code, call.__globals__, name, None, call.__closure__)
    # fullgraph stays off whatever the original asked: the eager hooks break the graph by design
    return torch.compile(fn, backend=_Fresh(backend), dynamic=getattr(ctx, "_dynamic", None))


class HookRefresh:
    """Make hooks registered inside a compiled model take effect; put its compiled code back after.

    Call :meth:`open` right after registering hooks and :meth:`close` right after removing them
    (idempotent). Only compiled entries that enclose a hooked module are refreshed, at any depth
    (the model itself or a submodule compiled in place or wrapped by ``torch.compile``). Blocks may
    nest or overlap: each open and each close of another block re-traces with the hooks present at
    that moment; the last close restores the original entry.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> with HookRefresh(net):      # not compiled: nothing to do
        ...     _ = net(torch.ones(1, 2))
    """

    def __init__(self, model: nn.Module) -> None:
        self._entries = [(m, a) for m in model.modules() if (a := _entry_attr(m)) is not None]
        self._opened: list[tuple[nn.Module, str]] | None = None  # None: not open

    def open(self) -> None:
        """Point every compiled entry enclosing a hooked module at fresh code (after this block's
        hooks were registered)."""
        if self._opened is not None or not self._entries:
            return
        with _lock:
            hooked = [(m, a) for m, a in self._entries if any(map(_hooked, _inside(m)))]
            originals = [_open[id(m)][1] if id(m) in _open else getattr(m, a) for m, a in hooked]
            # may raise: nothing changed yet
            fresh = [_fresh_entry(m, a, e) for (m, a), e in zip(hooked, originals)]
            for (module, attr), original, entry in zip(hooked, originals, fresh):
                state = _open.setdefault(id(module), [0, original, attr])
                setattr(module, attr, entry)
                state[0] += 1
            self._opened = hooked

    def close(self) -> None:
        """Undo :meth:`open` (after this block's hooks were removed). Idempotent."""
        opened, self._opened = self._opened or [], None
        with _lock:
            for module, attr in opened:
                state = _open[id(module)]
                state[0] -= 1
                if state[0] == 0:
                    setattr(module, attr, state[1])
                    del _open[id(module)]
                else:  # another block is still open: re-trace without this block's hooks
                    setattr(module, attr, _fresh_entry(module, attr, state[1]))

    def __enter__(self) -> HookRefresh:
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
