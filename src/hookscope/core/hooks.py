"""A group of hook handles that is removed as one, idempotently, also after errors."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch


class _Handle(Protocol):
    def remove(self) -> None: ...


class HookGroup:
    """Owns every handle one hookscope context registers (module hooks and tensor hooks).

    ``remove()`` may be called any number of times; handles added after removal are removed at
    once, so a gradient hook registered late (for example by a forward hook running in another
    thread) cannot outlive its context.

    Example:
        >>> import torch
        >>> group = HookGroup()
        >>> layer = torch.nn.Linear(2, 2)
        >>> group.add(layer.register_forward_hook(lambda m, i, o: None))
        >>> group.remove(); group.remove()
        >>> len(layer._forward_hooks)
        0
    """

    def __init__(self) -> None:
        self._handles: list[_Handle] = []
        self._lock = threading.Lock()
        self.closed = False

    def add(self, handle: _Handle) -> None:
        with self._lock:
            if not self.closed:
                self._handles.append(handle)
                return
        handle.remove()

    def remove(self) -> None:
        with self._lock:
            self.closed = True
            handles, self._handles = self._handles, []
        for h in reversed(handles):
            h.remove()

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> HookGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


_blocks_open: dict[threading.Thread, int] = {}  # thread -> hookscope blocks it has open
_blocks_lock = threading.Lock()


class ThreadScope:
    """Which threads' calls one hookscope block acts on.

    Its own thread's, and those of threads started while it is open that have opened no block of
    their own (DataParallel's replica threads, a pool started inside the block). Threads that
    already existed when it opened (another block's thread, a server's pool) are left alone.

    Example:
        >>> scope = ThreadScope(); scope.open()
        >>> scope.sees()
        True
        >>> scope.close(); scope.close()
    """

    def __init__(self) -> None:
        self._owner: threading.Thread | None = None
        self._foreign: frozenset[threading.Thread] = frozenset()

    def open(self) -> None:
        if self._owner is not None:
            return
        me = threading.current_thread()
        self._owner, self._foreign = me, frozenset(threading.enumerate()) - {me}
        with _blocks_lock:
            _blocks_open[me] = _blocks_open.get(me, 0) + 1

    def close(self) -> None:
        """Idempotent."""
        me, self._owner = self._owner, None
        if me is None:
            return
        with _blocks_lock:
            left = _blocks_open.get(me, 1) - 1
            if left:
                _blocks_open[me] = left
            else:
                _blocks_open.pop(me, None)

    def sees(self) -> bool:
        """Whether the calling thread's module calls belong to this block."""
        t = threading.current_thread()
        return t is self._owner or (t not in self._foreign and t not in _blocks_open)


class Orphans:
    """Tensor hooks on views, and whether a later in-place op orphaned them.

    An in-place op on a view (a ``Flatten`` output, a slice, a per-call alias), on another view of
    it or on its base rebases autograd history: the hooks registered on the view before it stop
    seeing (all of) the gradient, and a hook-based record or edit would be silently missing or
    partial. The witness is the view's version counter, read through a ``detach()`` alias kept
    until the block ends. A gradient that arrives while the version is unchanged is whole (a write
    after the backward pass does not matter); one that arrives after a write, or a write with no
    arrival by :meth:`settle`, calls ``on_lost``. A write into another, non-overlapping view of the
    same memory counts too: the witness cannot tell it apart, so it errs on the side of an error.

    Example:
        >>> lost = []
        >>> orphans = Orphans()
        >>> x = torch.ones(2, 2, requires_grad=True)
        >>> v = (x * 2).view(4)
        >>> key = orphans.watch(v, lambda: lost.append("v"))
        >>> _ = v.register_hook(lambda g: orphans.arrived(key))
        >>> v = v.relu_()  # rebases v's history: the hook above never fires
        >>> v.sum().backward()
        >>> orphans.settle(); lost
        ['v']
    """

    def __init__(self) -> None:
        self._live: dict[int, tuple[torch.Tensor, int, Callable[[], None]]] = {}
        self._refs: dict[int, Any] = {}  # key -> weak reference to the hook
        self._lock = threading.Lock()
        self._next = 0

    def watch(self, t: torch.Tensor, on_lost: Callable[[], None]) -> int | None:
        """Watch the hooks about to be registered on ``t``; the key for :meth:`arrived`, or
        ``None`` when there is nothing to watch (``t`` is no view)."""
        if not t._is_view() or t.is_inference():
            return None
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._live[key] = (t.detach(), t._version, on_lost)
        return key

    def bind(self, key: int | None, hook: Callable[..., Any]) -> None:
        """Judge ``key`` as soon as ``hook`` is gone (its autograd graph freed, or the hook removed):
        no gradient can arrive after that, and the witness need not hold the memory any longer."""
        if key is None:
            return

        def gone(_: Any) -> None:
            with self._lock:
                entry = self._live.pop(key, None)
                self._refs.pop(key, None)
            if entry is not None and entry[0]._version != entry[1]:
                entry[2]()

        with self._lock:
            if key in self._live:
                self._refs[key] = weakref.ref(hook, gone)

    def arrived(self, key: int | None) -> None:
        """A gradient reached the hooks of ``key``: whole if nothing wrote the view before."""
        if key is None:
            return
        with self._lock:
            entry = self._live.pop(key, None)
            self._refs.pop(key, None)
        if entry is not None and entry[0]._version != entry[1]:
            entry[2]()

    def settle(self) -> None:
        """The block ends: a view written with no gradient arrived lost its hooks; forget all."""
        with self._lock:
            live, self._live, self._refs = self._live, {}, {}
        for witness, version, on_lost in live.values():
            if witness._version != version:
                on_lost()


def hook_count(module: Any) -> int:
    """How many hooks of any kind are registered on ``module`` and all its submodules.

    Example:
        >>> import torch
        >>> hook_count(torch.nn.Linear(2, 2))
        0
    """
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, k, {}) or {}) for m in module.modules() for k in kinds)
