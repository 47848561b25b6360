"""hookscope's exceptions: every public one is defined in ``hookscope.errors``, a subclass of HookscopeError
(or the control-flow StopForward), so that a caller finds them all in one place and catches them as one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import hookscope
import hookscope.errors as errors


def _modules() -> list[str]:
    found = []
    for info in pkgutil.walk_packages(hookscope.__path__, "hookscope."):
        if info.name.split(".")[-1] == "__main__":  # running it runs the command line
            continue
        found.append(info.name)
    return found


def test_every_public_exception_is_defined_in_errors() -> None:
    outside = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name
                    and not attr.startswith("_") and name != "hookscope.errors"):
                outside.append(f"{name}.{attr}")
    assert outside == []


def test_the_extract_overflow_is_a_hookscope_error_in_errors() -> None:
    from hookscope.analysis.extract import _run

    assert issubclass(errors.ExtractOverflowError, errors.HookscopeError)
    assert "ExtractOverflowError" in errors.__all__
    assert _run.ExtractOverflowError is errors.ExtractOverflowError
