"""Turn a MODEL argument and an --input shape into a model and an example input, for every command.

MODEL is one of:
  ``tiny``                      the bundled TinyResNet (3x32x32)
  ``torchvision:NAME``          any torchvision model builder, built with weights=None
  ``package.module:ATTR``       an importable nn.Module class or factory (called with no arguments)
  ``path/to/file.py:ATTR``      the same, from a Python file
  ``path/to/model.pt``          a file torch.save wrote; see the security model below

Security model: ``package.module:ATTR`` and ``file.py:ATTR`` import and run that Python code, as
``python file.py`` would; point them only at code you trust. Any other file is read with
``torch.load(weights_only=True)``, which rebuilds tensors and plain containers and runs no code. A
whole pickled model (``torch.save(model)``) cannot be read that way: unpickling it runs whatever
code the file names, so it is loaded (``weights_only=False``) only with ``--trust-pickle``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import math
import os
import pickle
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import ModuleType, TracebackType
from typing import Any, cast

import torch
from torch import nn

from ..core.text import shape_text
from ..errors import HookscopeError, did_you_mean

__all__ = ["TRUST_FLAG", "add_model_arguments", "check_seed", "example_input", "load_model", "parse_shape",
           "random_input", "seed_arg", "trusting_pickles"]

_DEFAULT_SHAPES = {"tiny": (1, 3, 32, 32)}
TRUST_FLAG = "--trust-pickle"
_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts
_CODE_RUNS = "file.py:ATTR and package.module:ATTR import and run that Python code"
_SAFER = ("safer: save model.state_dict() and pass a file.py:ATTR factory that builds the model and "
          f"loads it with torch.load(..., weights_only=True) ({_CODE_RUNS} too)")
_trust_pickle: ContextVar[bool] = ContextVar("hookscope_trust_pickle", default=False)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The MODEL positional and the --input / --seed / --trust-pickle options every model command shares."""
    p.add_argument("model", metavar="MODEL",
                   help=f"tiny | torchvision:NAME | package.module:ATTR | file.py:ATTR | model.pt. {_CODE_RUNS}: "
                        "use only code you trust. A .pt or .pth file is read with "
                        "torch.load(weights_only=True), which runs no code; a whole pickled model "
                        f"(torch.save(model)) needs {TRUST_FLAG}")
    p.add_argument("--input", metavar="SHAPE", default=None,
                   help="example input shape such as 1x3x224x224 (default: 1x3x32x32 for tiny, "
                        "1x3x224x224 for torchvision models)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed for weights and input (default 0)")
    p.epilog = f"Security: {_CODE_RUNS}; a whole pickled model is loaded only with {TRUST_FLAG}."
    p.add_argument(TRUST_FLAG, action="store_true",
                   help="MODEL.pt is a whole model pickled with torch.save(model) by someone you trust: "
                        "load it with torch.load(weights_only=False), which runs any code the file "
                        "holds. Never use it on a file from an untrusted source; " + _SAFER)


def seed_arg(text: str) -> int:
    """An argparse ``type`` for seeds: a whole number torch.manual_seed accepts."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    try:
        return check_seed(seed)
    except HookscopeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_seed(seed: int, what: str = "seed") -> int:
    """``seed`` itself if PyTorch's generators accept it, else a one-line error."""
    low, high = _SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise HookscopeError(f"{what} {seed} is out of range for PyTorch's random generator; "
                             f"give a whole number from 0 to {high}")
    return seed


@contextlib.contextmanager
def trusting_pickles(trust: bool) -> Iterator[None]:
    """Inside, :func:`load_model` loads whole pickled models (what ``--trust-pickle`` asks for)."""
    token = _trust_pickle.set(bool(trust))
    try:
        yield
    finally:
        _trust_pickle.reset(token)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` (or ``1,3,224,224``) -> ``(1, 3, 224, 224)``."""
    parts = re.split(r"[x,\s]+", text.strip().lower())
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise HookscopeError(f"--input {text!r} is not a shape; write it like 1x3x224x224")
    return tuple(int(p) for p in parts)


def _attr(obj: Any, attr: str, where: str) -> Any:
    if not hasattr(obj, attr):
        names = [n for n in dir(obj) if not n.startswith("_")]
        raise HookscopeError(f"{where} has no attribute {attr!r}.{did_you_mean(attr, names)}")
    return getattr(obj, attr)


def _needs_arguments(factory: Any) -> list[str] | None:
    """The parameters ``factory()`` would be missing, or None if it can be called with none."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: let the call say
        return None
    try:
        signature.bind()
    except TypeError:
        return [n for n, p in signature.parameters.items()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return None


def _build(factory: Any, spec: str) -> nn.Module:
    if callable(factory) and not isinstance(factory, nn.Module):
        missing = _needs_arguments(factory)
        if missing is not None:
            name = getattr(factory, "__name__", "Model")
            where = spec.rsplit(":", 1)[0]
            call = f"{name}({', '.join(f'{n}=...' for n in missing)})"
            raise HookscopeError(
                f"{spec!r} needs arguments ({', '.join(missing)}) but MODEL is built with none; "
                f"write a factory that takes none, e.g. def build(): return {call}, and pass {where}:build"
            )
        where = spec.rsplit(":", 1)[0]
        model = _run_user_code(factory, f"building {spec!r}", where if where.endswith(".py") else None)
    else:
        model = factory
    if not isinstance(model, nn.Module):
        hint = ""
        if isinstance(model, Mapping) and any(isinstance(v, torch.Tensor) for v in model.values()):
            hint = ("; it looks like a state_dict (weights without the model's code): write a file.py "
                    "with def build(): m = Net(); m.load_state_dict(torch.load('weights.pt', "
                    "weights_only=True)); return m, and pass file.py:build (its code runs)")
        raise HookscopeError(f"{spec!r} gave a {type(model).__name__}, not an nn.Module{hint}")
    return model


# --- running the user's code: its mistakes become one line naming where they were raised ---------
def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def _raised_at(tb: TracebackType | None, path: str | None) -> str:
    """`` (file, line N, in f)``: the innermost frame in ``path`` if given, else the innermost one."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if path is not None:
        mine = [f for f in frames if _same_file(f.tb_frame.f_code.co_filename, path)]
        frames = mine or frames
    frames = [f for f in frames if not f.tb_frame.f_code.co_filename.startswith("<frozen")] or frames
    if not frames:
        return ""
    last = frames[-1]
    code = last.tb_frame.f_code
    return f" ({code.co_filename}, line {last.tb_lineno}, in {code.co_name})"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _run_user_code(fn: Any, doing: str, path: str | None) -> Any:
    """``fn()``; an exception it raises (a bug in the user's code) becomes one line saying where."""
    try:
        return fn()
    except HookscopeError:
        raise
    except SyntaxError as e:  # a syntax error in a module the user's code imports
        raise HookscopeError(f"{doing} failed: {e.filename}, line {e.lineno}: SyntaxError: {e.msg}") from e
    except SystemExit as e:
        raise HookscopeError(
            f"{doing} called sys.exit({e.code!r}); code that parses arguments or runs a script "
            "belongs under if __name__ == '__main__':"
        ) from None
    except Exception as e:
        raise HookscopeError(
            f"{doing} raised {type(e).__name__}: {_first_line(e)}{_raised_at(e.__traceback__, path)}; "
            "fix that code (hookscope only called it)"
        ) from e


def _exec_file(path: str) -> ModuleType:
    if os.path.isdir(path):
        raise HookscopeError(f"{path} is a folder, not a Python file; give file.py:ATTR")
    if not os.path.isfile(path):
        raise HookscopeError(f"no such file: {path}")
    mod_spec = importlib.util.spec_from_file_location("_hookscope_user_model", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    loader = mod_spec.loader
    try:
        _run_user_code(lambda: loader.exec_module(module), f"importing {path}", path)
    except HookscopeError as e:
        cause = e.__cause__
        if isinstance(cause, SyntaxError) and _same_file(cause.filename or "", path):
            raise HookscopeError(f"{path}, line {cause.lineno}: SyntaxError: {cause.msg}") from None
        if isinstance(cause, OSError) and _same_file(getattr(cause, "filename", "") or "", path):
            raise HookscopeError(f"cannot read {path}: {cause.strerror or cause}") from None
        if isinstance(cause, ImportError):
            raise HookscopeError(f"{path} cannot be run: {cause}") from None
        raise
    return module


def _import(where: str) -> ModuleType:
    try:
        return cast(ModuleType, _run_user_code(lambda: importlib.import_module(where), f"importing {where!r}", None))
    except HookscopeError as e:
        cause = e.__cause__
        if isinstance(cause, ImportError):
            raise HookscopeError(f"cannot import {where!r}: {cause}") from None
        if isinstance(cause, SyntaxError):
            raise HookscopeError(f"cannot import {where!r}: {cause.filename}, line {cause.lineno}: "
                                 f"SyntaxError: {cause.msg}") from None
        raise


# --- model files: weights_only unless the user vouches for the pickle -----------------------------
def _read(path: str, *, weights_only: bool) -> Any:
    with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's business
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=weights_only)


def _pickled(path: str, e: Exception) -> HookscopeError:
    """The one line for a file that ``weights_only=True`` refuses: most likely a pickled model."""
    text = str(e)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        what = f"{path} is a pickled model (it names {found.group(1)}), not plain weights"
    else:
        op = re.search(r"Unsupported operand \d+", text)
        what = (f"{path} is not plain weights that torch.load(weights_only=True) can read "
                f"({op.group(0) if op else type(e).__name__}): it is corrupt, or a pickled model")
    return HookscopeError(
        f"{what}; unpickling runs whatever code the file holds, so hookscope loads a pickled model "
        f"only with {TRUST_FLAG}, for a file you trust; {_SAFER}"
    )


def _load_file(path: str, trust: bool) -> Any:
    """Weights and tensors through ``weights_only=True``; a whole pickled model only if ``trust``."""
    if os.path.getsize(path) == 0:
        raise HookscopeError(f"cannot load {path}: the file is empty")
    try:
        return _read(path, weights_only=True)
    except OSError as e:
        raise HookscopeError(f"cannot read {path}: {e.strerror or e}") from e
    except pickle.UnpicklingError as e:
        if not trust:
            raise _pickled(path, e) from None
    except Exception as e:  # a corrupt or foreign file fails in many ways (zip, EOF...)
        if not trust:
            raise _unreadable(path, e) from e
    try:
        return _read(path, weights_only=False)
    except Exception as e:
        raise _unreadable(path, e) from e


def _unreadable(path: str, e: BaseException) -> HookscopeError:
    return HookscopeError(
        f"cannot load {path} with torch.load ({type(e).__name__}: {_first_line(e)}); MODEL.pt must be "
        f"a whole model saved with torch.save(model) (loaded with {TRUST_FLAG}), with its class importable "
        "here, or weights that a file.py:ATTR factory loads"
    )


def _from_path(spec: str, trust: bool) -> nn.Module:
    if os.path.isdir(spec):
        raise HookscopeError(f"MODEL {spec} is a folder; give a model file (model.pt) or file.py:ATTR")
    if not os.path.isfile(spec):
        raise HookscopeError(f"no such file: {spec}")
    if spec.endswith(".py"):
        raise HookscopeError(f"MODEL {spec} names a Python file but not what builds the model; write "
                             f"{spec}:NAME, NAME a class or a function taking no arguments (its code runs)")
    return _build(_load_file(spec, trust), spec)


def _is_module_name(where: str) -> bool:
    return all(part.isidentifier() for part in where.split("."))


def _torchvision(spec: str) -> nn.Module:
    try:
        import torchvision.models as tvm
    except ImportError:
        raise HookscopeError(
            "torchvision models need the vision extra: pip install 'hookscope[vision]'"
        ) from None
    name = spec.split(":", 1)[1]
    available = tvm.list_models()
    if name not in available:
        raise HookscopeError(f"torchvision has no model {name!r}.{did_you_mean(name, available)}")
    model: nn.Module = tvm.get_model(name, weights=None)
    return model


def load_model(spec: str, seed: int = 0, *, trust_pickle: bool | None = None) -> nn.Module:
    """Build or load the model a MODEL argument names, in eval mode.

    ``trust_pickle`` (default: what the enclosing :func:`trusting_pickles` says, else False) allows
    a whole pickled model, loaded with ``torch.load(weights_only=False)``; without it a model file is
    read with ``weights_only=True`` only, which runs no code from the file.
    """
    torch.manual_seed(check_seed(seed))
    trust = _trust_pickle.get() if trust_pickle is None else trust_pickle
    if spec == "tiny":
        from ..zoo import TinyResNet

        return TinyResNet(seed=seed).eval()
    if spec.startswith("torchvision:"):
        return _torchvision(spec).eval()
    if ":" in spec:
        where, attr = spec.rsplit(":", 1)
        if where.endswith(".py"):
            return _build(_attr(_exec_file(where), attr, where), spec).eval()
        if _is_module_name(where):
            return _build(_attr(_import(where), attr, where), spec).eval()
    if spec.endswith((".pt", ".pth", ".py")) or os.path.lexists(spec) or os.sep in spec:
        return _from_path(spec, trust).eval()
    raise HookscopeError(
        f"MODEL {spec!r} is not understood; use tiny, torchvision:NAME, package.module:ATTR, "
        "file.py:ATTR or a saved model.pt"
    )


# --- example inputs --------------------------------------------------------------------------------
def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def random_input(dims: Sequence[int], what: str, generator: torch.Generator | None = None, *,
                 fix: str = "give a smaller shape") -> torch.Tensor:
    """``torch.randn(*dims)``, refused in one line if it cannot fit in this machine's memory."""
    numel = math.prod(dims)
    nbytes = 4 * numel
    memory = _memory_bytes()
    fix = f"; {fix}"
    if numel >= 2**63 or (memory is not None and nbytes > memory):
        room = f"more than this machine's {_size(memory)} of memory" if memory else "too large"
        raise HookscopeError(f"{what} is {numel:,} values ({_size(nbytes)} of float32), {room}{fix}")
    try:
        return torch.randn(*dims, generator=generator)
    except (RuntimeError, MemoryError) as e:
        raise HookscopeError(f"{what} ({numel:,} values, {_size(nbytes)} of float32) cannot be "
                             f"created: {_first_line(e) or type(e).__name__}{fix}") from e


def example_input(spec: str, shape: str | None, seed: int = 0) -> torch.Tensor:
    """A seeded random input of ``shape`` (or the model's usual one)."""
    if shape is not None:
        dims = parse_shape(shape)
    elif spec in _DEFAULT_SHAPES:
        dims = _DEFAULT_SHAPES[spec]
    elif spec.startswith("torchvision:"):
        dims = (1, 3, 224, 224)
    else:
        raise HookscopeError(f"give the example input's shape for {spec!r}, e.g. --input 1x3x224x224")
    gen = torch.Generator().manual_seed(check_seed(seed))
    return random_input(dims, f"--input {shape_text(dims)}", gen)
