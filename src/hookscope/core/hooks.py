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


def hook_count(module: Any) -> int:
    """How many hooks of any kind are registered on ``module`` and all its submodules.

    Example:
        >>> import torch
        >>> hook_count(torch.nn.Linear(2, 2))
        0
    """
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, k, {}) or {}) for m in module.modules() for k in kinds)
