"""How loading speaks: the words its messages use for what the caller gave, and where what it has
to say besides errors goes (a model left with random weights, a model resized to its weights).

A Python caller reads Python's words (``weights``, ``trust_pickle=True``, ``spec``) and gets
:class:`UserWarning` warnings; a command of the CLI speaks its options (``--weights``,
``--trust-pickle``, ``MODEL``) and collects what is said, through :func:`speaking`.
Must not import: anything of hookscope but ``errors``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["Listener", "Terms", "speaking", "tell", "terms"]

Listener = Callable[[str, str], None]
"""Receives ``(kind, text)``: kind ``"warning"`` or ``"note"`` (text a line to show), or ``"random"``
(text the spec of a model left with random weights)."""


@dataclass(frozen=True)
class Terms:
    """The words of loading's messages: Python's (the default) or the command line's (``cli=True``).

    Attributes:
        cli: speak the command line's options (``--weights FILE``) rather than keywords (``weights=FILE``).
        command: the command running (``cam``), for messages that show a whole command line.
        weightless: what the command shows does not depend on the weights' values (names, shapes).

    Example:
        >>> Terms().given("weights", "FILE"), Terms(cli=True).given("weights", "FILE")
        ('weights=FILE', '--weights FILE')
        >>> Terms().trust, Terms(cli=True).trust
        ('trust_pickle=True', '--trust-pickle')
    """

    cli: bool = False
    command: str | None = None
    weightless: bool = False

    @property
    def model(self) -> str:
        """What names the model: ``MODEL`` on the command line, ``spec`` in Python."""
        return "MODEL" if self.cli else "spec"

    @property
    def trust(self) -> str:
        """How the caller vouches for a pickle: ``--trust-pickle`` or ``trust_pickle=True``."""
        return "--trust-pickle" if self.cli else "trust_pickle=True"

    def option(self, name: str) -> str:
        """An option by name: ``--weights`` on the command line, ``weights`` in Python.

        Example:
            >>> Terms(cli=True).option("config"), Terms().option("config")
            ('--config', 'config')
        """
        return f"--{name}" if self.cli else name.replace("-", "_")

    def given(self, name: str, value: str) -> str:
        """An option with its value: ``--weights FILE`` or ``weights=FILE``.

        Example:
            >>> Terms(cli=True).given("trust-pickle", "x"), Terms().given("trust-pickle", "x")
            ('--trust-pickle x', 'trust_pickle=x')
        """
        return f"--{name} {value}" if self.cli else f"{name.replace('-', '_')}={value}"


_terms: ContextVar[Terms] = ContextVar("hookscope_loading_terms", default=Terms())
_listener: ContextVar[Listener | None] = ContextVar("hookscope_loading_listener", default=None)


def terms() -> Terms:
    """The words in use here: Python's, unless inside :func:`speaking`.

    Example:
        >>> terms().model
        'spec'
    """
    return _terms.get()


@contextlib.contextmanager
def speaking(words: Terms, listener: Listener | None = None) -> Iterator[None]:
    """Inside, loading's messages use ``words`` and what it says goes to ``listener``.

    Example:
        >>> said = []
        >>> with speaking(Terms(cli=True), lambda kind, text: said.append((kind, text))):
        ...     tell("note", terms().given("weights", "w.pt") + " was resized")
        >>> said
        [('note', '--weights w.pt was resized')]
    """
    token, heard = _terms.set(words), _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(heard)
        _terms.reset(token)


def tell(kind: str, text: str) -> None:
    """Say ``text`` (see :data:`Listener`) to the listener, or without one: a warning or a note as a
    :class:`UserWarning`, nothing for ``"random"`` (a Python caller knows what it built).

    Example:
        >>> tell("random", "tiny")  # a Python caller is not told: it asked for random weights
    """
    listener = _listener.get()
    if listener is not None:
        listener(kind, text)
    elif kind in ("warning", "note"):
        warnings.warn(text, UserWarning, stacklevel=3)
