"""Module calls that have begun and not yet returned, one stack per thread.

DataParallel runs its replicas in threads and a module may call itself recursively, so "the call
that is running" is the top of the calling thread's own stack.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

__all__ = ["CallStack"]

T = TypeVar("T")


class CallStack(Generic[T]):
    """Open calls per thread: ``push`` in a pre-hook, ``pop`` in the matching post-hook.

    Example:
        >>> calls: CallStack[str] = CallStack()
        >>> calls.push("layer1"); calls.push("layer1.conv")
        >>> calls.top(), calls.pop(), calls.open()
        ('layer1.conv', 'layer1.conv', ['layer1'])
        >>> calls.pop(), calls.pop()
        ('layer1', None)
    """

    def __init__(self) -> None:
        self._stacks: dict[int, list[T]] = {}

    def push(self, item: T) -> None:
        self._stacks.setdefault(threading.get_ident(), []).append(item)

    def pop(self) -> T | None:
        """The calling thread's innermost open call, removed; ``None`` if it has none."""
        stack = self._stacks.get(threading.get_ident())
        return stack.pop() if stack else None

    def top(self) -> T | None:
        stack = self._stacks.get(threading.get_ident())
        return stack[-1] if stack else None

    def open(self) -> list[T]:
        """The calling thread's open calls, outermost first (a copy)."""
        return list(self._stacks.get(threading.get_ident(), ()))

    def clear(self) -> None:
        self._stacks.clear()
