"""hookscope's exceptions: one base class, a few precise subclasses.

Every message is one line that names the culprit and the fix. Nothing here imports from hookscope.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "HookscopeError",
    "SelectionError",
    "RecordError",
    "FieldError",
    "SettingError",
    "MutationError",
    "ForwardError",
    "NonFiniteError",
    "NonFiniteStepError",
    "LoadError",
    "UntrustedPickleError",
    "ExtractOverflowError",
    "ArgumentError",
    "checked",
    "checked_as",
    "checked_init",
    "closest",
    "did_you_mean",
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


class ArgumentError(HookscopeError, TypeError):
    """A call that does not fit a public function's signature: a misspelt keyword (the message names
    the closest real one), several inputs where the function takes one tuple, a missing argument.
    Also a ``TypeError``, what Python itself raises for such a call."""


class SettingError(ArgumentError):
    """A setting the chosen method does not read, a setting given twice with two values, or a keyword the
    function does not take (a ``TypeError`` too, as Python's own for an unexpected keyword)."""


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


P = ParamSpec("P")
R = TypeVar("R")


def checked(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn Python's ``TypeError`` for a call that does not fit ``fn``'s signature into a one-line
    :class:`ArgumentError` that names the keyword, the closest real one and the function.

    The call itself is untouched: the signature is looked at only once Python has refused the
    call, so the normal path costs one extra frame.

    Example:
        >>> @checked
        ... def run(model: object, *, depth: int = 1) -> int:
        ...     return depth
        >>> run(None, dpeth=2)
        Traceback (most recent call last):
        ...
        hookscope.errors.ArgumentError: run() got an unexpected keyword argument 'dpeth'. Did you mean 'depth'?
    """
    return checked_as(_label(fn))(fn)


def checked_as(label: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """:func:`checked`, for a function exported under another name (``label``)."""
    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        return _checked(fn, label)
    return wrap


def _checked(fn: Callable[P, R], label: str) -> Callable[P, R]:
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if isinstance(e, HookscopeError):
                raise
            problem = _misfit(fn, label, args, kwargs)
            if problem is None:  # the call fitted: the TypeError came from inside
                raise
            raise ArgumentError(problem) from None

    return call


C = TypeVar("C", bound=type)


def checked_init(cls: C) -> C:
    """:func:`checked` for a public class: a call of ``cls(...)`` that does not fit its ``__init__``."""
    setattr(cls, "__init__", _checked(cls.__init__, cls.__name__))  # type: ignore[misc]
    return cls


def _label(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "function"))
    return name.removesuffix(".__init__")


def _misfit(fn: Callable[..., Any], label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What does not fit in calling ``fn(*args, **kwargs)``, in one line; None if the call fits."""
    try:
        sig = inspect.signature(fn)
        sig.bind(*args, **kwargs)
    except TypeError as e:
        reason = str(e)
    except ValueError:
        return None
    else:
        return None
    params = sig.parameters
    named = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [k for k in kwargs if k not in params or params[k].kind is inspect.Parameter.POSITIONAL_ONLY]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        word = unknown[0]
        hint = did_you_mean(word, [n for n in named if n not in ("self", "cls")])
        if not hint and "kwargs" in params:
            hint = f" If {word!r} is a keyword input of the model, pass kwargs={{{word!r}: ...}}."
        elif not hint:
            hint = f" It takes {', '.join(n + '=' for n in named if n not in ('self', 'cls'))}."
        return f"{label}() got an unexpected keyword argument {word!r}.{hint}"
    if "positional argument" in reason and "inputs" in params \
            and params["inputs"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        before = ", ".join(n for n in named[: named.index("inputs")])
        return (f"{label}() takes the model's positional inputs as one argument, inputs: pass several as a "
                f"tuple, {label}({before}, (x, y), ...)")
    if "too many positional" in reason:
        reason += f" ({', '.join(n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY)}); pass the rest by keyword"
    return f"{label}(): {reason}"
