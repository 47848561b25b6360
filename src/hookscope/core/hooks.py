"""A group of hook handles that is removed as one, idempotently, also after errors."""

from __future__ import annotations

import threading
from typing import Any, Protocol


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


def hook_count(module: Any) -> int:
    """How many hooks of any kind are registered on ``module`` and all its submodules.

    Example:
        >>> import torch
        >>> hook_count(torch.nn.Linear(2, 2))
        0
    """
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, k, {}) or {}) for m in module.modules() for k in kinds)
