"""Running the caller's own code (``file.py:ATTR``, ``package.module:ATTR``): its mistakes become one
line naming where they were raised.

Security: the code runs as ``python file.py`` would run it; point a spec only at code you trust.
Must not import: anything of hookscope but ``errors`` and ``core.text``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import TypeVar

from ..core.text import first_line
from ..errors import HookscopeError, LoadError

__all__ = ["import_module", "run_file", "run_user_code", "same_file"]

_T = TypeVar("_T")


def _raised_at(tb: TracebackType | None, path: str | None) -> str:
    """`` (file, line N, in f)``: the innermost frame in ``path`` if given, else the innermost one."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if path is not None:
        mine = [f for f in frames if same_file(f.tb_frame.f_code.co_filename, path)]
        frames = mine or frames
    frames = [f for f in frames if not f.tb_frame.f_code.co_filename.startswith("<frozen")] or frames
    if not frames:
        return ""
    last = frames[-1]
    code = last.tb_frame.f_code
    return f" ({code.co_filename}, line {last.tb_lineno}, in {code.co_name})"


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one existing file.

    Example:
        >>> same_file(__file__, __file__), same_file(__file__, "/no/such/file")
        (True, False)
    """
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def run_user_code(fn: Callable[[], _T], doing: str, path: str | None) -> _T:
    """``fn()``; an exception it raises (a bug in the caller's code) becomes one line saying where,
    the innermost frame in the file ``path`` if given.

    Example:
        >>> run_user_code(lambda: 1 / 0, "building 'net.py:build'", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: building 'net.py:build' raised ZeroDivisionError: division by zero (...); fix that code (hookscope only called it)
    """
    try:
        return fn()
    except HookscopeError:
        raise
    except SyntaxError as e:  # a syntax error in a module the caller's code imports
        raise LoadError(f"{doing} failed: {e.filename}, line {e.lineno}: SyntaxError: {e.msg}") from e
    except SystemExit as e:
        raise LoadError(
            f"{doing} called sys.exit({e.code!r}); code that parses arguments or runs a script "
            "belongs under if __name__ == '__main__':"
        ) from None
    except Exception as e:
        raise LoadError(
            f"{doing} raised {type(e).__name__}: {first_line(e)}{_raised_at(e.__traceback__, path)}; "
            "fix that code (hookscope only called it)"
        ) from e


def run_file(path: str) -> ModuleType:
    """The module a Python file makes when it runs (its code runs now).

    Example:
        >>> run_file("/no/such/net.py")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: no such file: /no/such/net.py
    """
    if os.path.isdir(path):
        raise LoadError(f"{path} is a folder, not a Python file; give file.py:ATTR")
    if not os.path.isfile(path):
        raise LoadError(f"no such file: {path}")
    mod_spec = importlib.util.spec_from_file_location("_hookscope_user_model", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    loader = mod_spec.loader
    try:
        run_user_code(lambda: loader.exec_module(module), f"importing {path}", path)
    except HookscopeError as e:
        cause = e.__cause__
        if isinstance(cause, SyntaxError) and same_file(cause.filename or "", path):
            raise LoadError(f"{path}, line {cause.lineno}: SyntaxError: {cause.msg}") from None
        if isinstance(cause, OSError) and same_file(getattr(cause, "filename", "") or "", path):
            raise LoadError(f"cannot read {path}: {cause.strerror or cause}") from None
        if isinstance(cause, ImportError):
            raise LoadError(f"{path} cannot be run: {cause}") from None
        raise
    return module


def import_module(where: str) -> ModuleType:
    """``importlib.import_module(where)``; a failure is one line.

    Example:
        >>> import_module("hookscope.zoo").__name__
        'hookscope.zoo'
    """
    try:
        return run_user_code(lambda: importlib.import_module(where), f"importing {where!r}", None)
    except HookscopeError as e:
        cause = e.__cause__
        if isinstance(cause, ImportError):
            raise LoadError(f"cannot import {where!r}: {cause}") from None
        if isinstance(cause, SyntaxError):
            raise LoadError(f"cannot import {where!r}: {cause.filename}, line {cause.lineno}: "
                            f"SyntaxError: {cause.msg}") from None
        raise
