"""hookscope's exceptions: one base class, a few precise subclasses.

Every message is one line that names the culprit and the fix. Nothing here imports from hookscope.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "HookscopeError",
    "SelectionError",
    "RecordError",
    "MutationError",
    "closest",
]


class HookscopeError(Exception):
    """Base class of every error hookscope raises for a user mistake."""


class SelectionError(HookscopeError, KeyError):
    """A selector matched nothing, or is not a selector at all."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RecordError(HookscopeError, KeyError):
    """A record was asked for something it does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MutationError(HookscopeError):
    """A recorded tensor was changed in place after it was recorded, so its values are gone."""


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The real names nearest to ``word``, best first (for "did you mean" hints)."""
    pool = list(dict.fromkeys(c for c in candidates if c))
    hits = difflib.get_close_matches(word, pool, n=n, cutoff=0.5)
    if len(hits) < n:  # a leaf name typed alone ("conv1") should still find "layer1.0.conv1"
        tail = word.rsplit(".", 1)[-1]
        hits += [c for c in pool if c.rsplit(".", 1)[-1] == tail and c not in hits][: n - len(hits)]
    return hits


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` Did you mean 'a', 'b'?`` or an empty string."""
    hits = closest(word, candidates)
    return f" Did you mean {', '.join(repr(h) for h in hits)}?" if hits else ""
