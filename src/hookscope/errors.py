"""hookscope's exceptions: one base class, a few precise subclasses.

Every message is one line that names the culprit and the fix. Nothing here imports from hookscope.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = [
    "HookscopeError",
    "SelectionError",
    "RecordError",
    "FieldError",
    "MutationError",
    "ForwardError",
    "NonFiniteError",
    "NonFiniteStepError",
    "LoadError",
    "UntrustedPickleError",
    "ExtractOverflowError",
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


class FieldError(RecordError, AttributeError):
    """A field a record does not hold: a :class:`~hookscope.RecordError` that is also an
    ``AttributeError``, so ``hasattr(record, "input")`` and ``getattr(record, "input", None)`` answer."""


class MutationError(HookscopeError):
    """A recorded tensor was changed in place after it was recorded, so its values are gone."""


class ForwardError(HookscopeError, RuntimeError):
    """The model's own forward pass failed while hookscope ran it (wrong input shape or dtype...).

    The message names the module where it failed, what that module received and what ran before;
    the model's exception is chained as ``__cause__``.
    """


class LoadError(HookscopeError):
    """A model, its weights or its class names could not be loaded (:func:`hookscope.load_model`)."""


class UntrustedPickleError(LoadError):
    """A file holds pickled objects, which are unpickled (running whatever code they name) only when
    the caller vouches for the file: ``trust_pickle=True``, or ``--trust-pickle`` on the command line."""


class ExtractOverflowError(HookscopeError):
    """A layer's values lie beyond the range of the dtype an extract stores them in (they would become
    inf): the store is not resumable with that dtype; the message names the layer and a wider dtype."""


class StopForward(BaseException):
    """Raised by a capture's forward hook to end the forward pass early (``capture(stop=True)``);
    only the capture that raised it swallows it. Not part of the public API.

    A BaseException, so that ``except Exception`` inside a model's forward does not swallow it.
    """

    def __init__(self, owner: object = None) -> None:
        super().__init__("hookscope stopped the forward pass after the last selected layer")
        self.owner = owner


class NonFiniteError(HookscopeError):
    """A watched module produced (or sent back) a NaN or an Inf; ``row`` and ``before`` say more."""

    def __init__(self, row: Any, before: list[Any]) -> None:
        super().__init__(
            f"first non-finite value: {row.describe()}; the {len(before)} records before it are "
            "in err.before (watch without raise_on_nonfinite=True for a report instead)"
        )
        self.row = row
        self.before = before


class NonFiniteStepError(NonFiniteError):
    """A training step's loss or gradients held a NaN or an Inf (``hookscope.monitor``): ``step`` is
    its number, ``row`` the first non-finite record found (``None`` where no module was named)."""

    def __init__(self, message: str, row: Any, before: list[Any], *, step: int) -> None:
        HookscopeError.__init__(self, message)  # not NonFiniteError's message, which is watch's
        self.row = row
        self.before = before
        self.step = step


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
