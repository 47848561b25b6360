"""Which steps a monitor samples: every N-th, chosen ones (a list, ``range(K)`` for the first K), or a
function of the step number."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Union

from ...errors import HookscopeError

__all__ = ["Schedule", "Steps"]

Steps = Union[Iterable[int], Callable[[int], bool], None]
"""What ``steps=`` takes: step numbers (a list, a set, ``range(10)`` for the first ten), a function
``step -> bool``, or ``None``."""


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Schedule:
    """``every`` and ``steps`` checked once, then asked per step (:meth:`sampled`), in O(1).

    Example:
        >>> s = Schedule(every=100, steps=range(3))
        >>> [n for n in range(250) if s.sampled(n)]
        [0, 1, 2, 100, 200]
        >>> Schedule(every=None, steps=lambda n: n % 7 == 3).sampled(10)
        True
    """

    def __init__(self, every: int | None, steps: Steps) -> None:
        if every is not None and (not _whole(every) or every < 1):
            raise HookscopeError(f"every={every!r} must be a whole number of steps, 1 or more "
                                 "(every=None samples only the steps= you choose)")
        self.every = every
        self._fn: Callable[[int], bool] | None = None
        self._set: range | frozenset[int] = frozenset()
        if callable(steps):
            self._fn = steps
        elif isinstance(steps, range):
            self._set = steps
        elif steps is not None:
            if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
                raise HookscopeError(f"steps={steps!r} must be step numbers (a list, range(K) for the first K) "
                                     "or a function of the step number")
            chosen = list(steps)
            bad = [s for s in chosen if not _whole(s) or s < 0]
            if bad:
                raise HookscopeError(f"steps= holds {bad[0]!r}, not a step number: steps are counted 0, 1, 2, ...")
            self._set = frozenset(chosen)
        if every is None and steps is None:
            raise HookscopeError("every=None and steps=None sample no step: give every=N, steps=[...] or both")

    def sampled(self, step: int) -> bool:
        """Whether step ``step`` (counted from 0) is sampled."""
        if self.every is not None and step % self.every == 0:
            return True
        if self._fn is not None:
            return bool(self._fn(step))
        return step in self._set

    def __repr__(self) -> str:
        chosen = self._fn if self._fn is not None else self._set
        return f"Schedule(every={self.every!r}, steps={chosen!r})"
