"""Turn a MODEL argument and an --input shape into a model and an example input, for every command.

MODEL is one of:
  ``tiny``                      the bundled TinyResNet (3x32x32), random weights
  ``demo``                      the bundled DemoNet (3x64x64), trained on hookscope's synthetic shapes
  ``torchvision:NAME``          any torchvision model builder: random weights, or ``--weights NAME``
  ``package.module:ATTR``       an importable nn.Module class or factory (called with no arguments)
  ``path/to/file.py:ATTR``      the same, from a Python file
  ``path/to/model.pt``          a file torch.save wrote; see the security model below
  ``hf:CLASS_OR_TASK``          a transformers model (the hf extra) built from ``--config PATH``: a folder
                                ``save_pretrained`` wrote (config.json, and its weights when present) or
                                a config JSON file; CLASS_OR_TASK a class name (``GPT2LMHeadModel``,
                                ``AutoModelForCausalLM``) or a task (``causal-lm``, ``masked-lm``,
                                ``seq2seq-lm``, ``image-classification``, ``sequence-classification``...)
  ``timm:NAME``                 ``timm.create_model(NAME, pretrained=False)`` (the timm extra)

``hf:`` reads local files only, never downloads, and never runs a repository's own code
(``trust_remote_code`` stays off); a ``pytorch_model.bin`` is checked with
``torch.load(weights_only=True)`` first. A folder without weights gives random weights (said once).
Token models get token ids (``--input-ids``, ``--text`` with the folder's tokenizer, or seeded random
ids), with the keyword inputs the model takes (``attention_mask``, ``decoder_input_ids``); see
``_inputs.py``.

Security model: ``package.module:ATTR`` and ``file.py:ATTR`` import and run that Python code, as
``python file.py`` would; point them only at code you trust. Any other file is read with
``torch.load(weights_only=True)``, which rebuilds tensors and plain containers and runs no code. A
whole pickled model (``torch.save(model)``) cannot be read that way: unpickling it runs whatever
code the file names, so it is loaded (``weights_only=False``) only with ``--trust-pickle``.

``--weights FILE`` (a ``state_dict``, or a checkpoint dict holding one) is read the same way and
loaded strictly; ``--weights NAME`` names torchvision's weights (``DEFAULT``, ``IMAGENET1K_V1``),
fetched through torch.hub and checked to be plain weights before torchvision reads them. A model
left with random weights says so once on stderr, when the command succeeds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import pickle
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, cast
from urllib.parse import urlparse

import torch
from torch import nn

from ..core.text import first_line, shape_text
from ..errors import HookscopeError, did_you_mean
from ._thirdparty import HF_PREFIX, TIMM_PREFIX, hf_config, hf_model, timm_model

__all__ = ["DEMO_SPEC", "TRUST_FLAG", "add_class_arguments", "add_model_arguments", "check_class_names",
           "check_fits", "check_seed", "class_names", "example_input", "load_model", "load_weights",
           "model_session", "note", "parse_shape", "random_input", "read_class_names", "seed_arg", "torchvision_weights",
           "trusting_pickles", "usual_shape", "warn"]

DEMO_SPEC = "demo"
_DEFAULT_SHAPES = {"tiny": (1, 3, 32, 32), DEMO_SPEC: (1, 3, 64, 64)}
TRUST_FLAG = "--trust-pickle"
# Suffixes that make --weights a file even when it does not exist (then: "no such file", not "no such weights")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")
_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts
_CODE_RUNS = "file.py:ATTR and package.module:ATTR import and run that Python code"
_SAFER = ("safer: save model.state_dict() and pass a file.py:ATTR factory that builds the model and "
          f"loads it with torch.load(..., weights_only=True) ({_CODE_RUNS} too)")
_trust_pickle: ContextVar[bool] = ContextVar("hookscope_trust_pickle", default=False)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The MODEL positional and the --input / --seed / --weights / --trust-pickle options of every model command.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_model_arguments(p)
        >>> args = p.parse_args(["torchvision:resnet18", "--weights", "DEFAULT"])
        >>> args.model, args.weights, args.trust_pickle
        ('torchvision:resnet18', 'DEFAULT', False)
    """
    p.add_argument("model", metavar="MODEL",
                   help=f"tiny | demo | torchvision:NAME | hf:CLASS_OR_TASK (with --config) | timm:NAME | "
                        "package.module:ATTR | file.py:ATTR | model.pt. "
                        f"{_CODE_RUNS}: use only code you trust. A .pt or .pth file is read with "
                        "torch.load(weights_only=True), which runs no code; a whole pickled model "
                        f"(torch.save(model)) needs {TRUST_FLAG}. tiny and torchvision models without "
                        "--weights have random weights; demo is trained on hookscope's generated shapes. "
                        "hf:CLASS_OR_TASK is a transformers class (GPT2LMHeadModel, AutoModelForCausalLM) or a "
                        "task (causal-lm, masked-lm, seq2seq-lm, image-classification, sequence-classification); "
                        "timm:NAME is timm.create_model(NAME, pretrained=False)")
    p.add_argument("--input", metavar="SHAPE", default=None,
                   help="example input shape such as 1x3x224x224 (default: 1x3x32x32 for tiny, "
                        "1x3x64x64 for demo, 1x3x224x224 for torchvision models, the model's own for timm "
                        "and hf image models); for hf token models BATCHxLENGTH of random token ids "
                        "(default 1x16)")
    p.add_argument("--config", metavar="PATH", default=None,
                   help="for hf:CLASS_OR_TASK: a folder save_pretrained wrote (config.json, and weights "
                        "when present: random weights otherwise) or a config JSON file; local files only")
    p.add_argument("--input-ids", metavar="IDS", default=None,
                   help="token ids as the input, such as '15496 11 995'; several sequences of one length "
                        "separated by ';'")
    p.add_argument("--text", metavar="TEXT", default=None,
                   help="text as the input, tokenized by the tokenizer in the --config folder (hf models)")
    p.add_argument("--weights", metavar="FILE|NAME", default=None,
                   help="load these weights into MODEL: a state_dict file (.pt/.pth read with "
                        "torch.load(weights_only=True), or .safetensors), loaded strictly; or, for "
                        "torchvision:NAME, torchvision's weight name such as DEFAULT or IMAGENET1K_V1 "
                        "(downloaded once into torch.hub's cache)")
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


@dataclass
class _Session:
    """One command's model options, and the warnings it says if it succeeds."""

    model: str | None
    weights: str | None
    command: str | None = None
    config: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_session: ContextVar[_Session | None] = ContextVar("hookscope_session", default=None)
# Commands whose output (names, shapes, parameter counts) does not depend on the weights' values
_WEIGHTLESS = ("layers", "summary")


@contextlib.contextmanager
def model_session(args: argparse.Namespace) -> Iterator[None]:
    """One command's run: ``--trust-pickle`` and ``--weights`` apply to ``load_model(args.model)``, and
    a warning (random weights) goes to stderr once, after the command succeeded.

    A failed command says only its one-line error. Inside another session (a command that opens its
    own within the CLI's) it does nothing: the outer one holds the options and speaks.

    Example:
        >>> import contextlib, io
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err), model_session(argparse.Namespace(model="tiny")):
        ...     _ = load_model("tiny"), load_model("tiny")
        >>> err.getvalue().count("warning: tiny has random weights")
        1
    """
    if _session.get() is not None:
        yield
        return
    session = _Session(getattr(args, "model", None), getattr(args, "weights", None), getattr(args, "command", None),
                       getattr(args, "config", None))
    token = _session.set(session)
    try:
        with trusting_pickles(bool(getattr(args, "trust_pickle", False))):
            yield
    finally:
        _session.reset(token)
    for line in dict.fromkeys(session.notes):  # what was done to the model, for every command
        print(f"hookscope: note: {line}", file=sys.stderr)
    if getattr(args, "command", None) in _WEIGHTLESS:
        return
    for line in dict.fromkeys(session.warnings):  # only reached when the command did not raise
        print(f"hookscope: warning: {line}", file=sys.stderr)


def warn(line: str) -> None:
    """Say ``line`` as a ``hookscope: warning:`` on stderr once the command succeeded (at once outside one)."""
    session = _session.get()
    if session is None:
        print(f"hookscope: warning: {line}", file=sys.stderr)
    else:
        session.warnings.append(line)


def note(line: str) -> None:
    """Say ``line`` as a ``hookscope: note:`` on stderr once the command succeeded, for every command
    (at once outside one): what hookscope did to the model, such as resizing it to its weights."""
    session = _session.get()
    if session is None:
        print(f"hookscope: note: {line}", file=sys.stderr)
    else:
        session.notes.append(line)


def _warn_random(spec: str) -> None:
    session = _session.get()
    if session is None:  # a library call, not a command: nobody to tell on stderr
        return
    fix = ("pass --weights DEFAULT for torchvision's trained weights, or --weights FILE"
           if spec.startswith("torchvision:") else
           "give --config a folder that save_pretrained wrote with the weights, or --weights FILE"
           if spec.startswith(HF_PREFIX) else
           "pass --weights FILE (a state_dict)" if spec.startswith(TIMM_PREFIX) else
           f"pass --weights FILE, or use MODEL {DEMO_SPEC} (trained)")
    session.warnings.append(f"{spec} has random weights (no --weights): its predictions and maps mean "
                            f"nothing; {fix}")


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
        hint = _state_dict_hint(model, spec) if isinstance(model, Mapping) else ""
        raise HookscopeError(f"{spec!r} gave a {type(model).__name__}, not an nn.Module{hint}")
    return model


def _state_dict_hint(held: Mapping[Any, Any], spec: str) -> str:
    """For weights given as MODEL: pass the architecture as MODEL and the file as ``--weights``."""
    if not any(isinstance(v, torch.Tensor) for v in held.values()):
        return ""
    session = _session.get()
    command = session.command if session is not None and session.command else "COMMAND"
    arch = _bundled_fit(held) or "ARCH"
    forms = "" if arch != "ARCH" else f" (ARCH: tiny, {DEMO_SPEC}, torchvision:NAME or file.py:ATTR)"
    return (f"; it looks like a state_dict (weights without the model's code): pass the architecture as MODEL "
            f"and this file as --weights: hookscope {command} {arch} --weights {spec}{forms}; or write a file.py "
            "with def build(): m = Net(); m.load_state_dict(torch.load('weights.pt', weights_only=True)); "
            "return m, and pass file.py:build (its code runs)")


def _bundled_fit(held: Mapping[Any, Any]) -> str | None:
    """``tiny`` or ``demo`` when the weights have exactly that bundled model's names and shapes."""
    from ..zoo import TinyResNet, demo_model

    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in held.items()):
        return None
    for name, build in (("tiny", TinyResNet), (DEMO_SPEC, lambda: demo_model(pretrained=False))):
        expected = build().state_dict()
        if not _mismatches(expected, _unwrapped(dict(held), expected)):
            return name
    return None


# --- running the user's code: its mistakes become one line naming where they were raised ---------
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
            f"{doing} raised {type(e).__name__}: {first_line(e)}{_raised_at(e.__traceback__, path)}; "
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


_Refusal = Callable[[str, Exception], HookscopeError]


def _load_checked(path: str, label: str, *, trust: bool, pickled: _Refusal, foreign: _Refusal,
                  retry_foreign: bool, failed: _Refusal) -> Any:
    """``torch.load(weights_only=True)``, and the full unpickler only when the user vouched (``trust``);
    each failure one line: an empty or unreadable file, ``pickled`` objects refused, a ``foreign`` file
    (corrupt, text: it fails in many ways) refused unless ``retry_foreign``, the full unpickler ``failed``."""
    if os.path.getsize(path) == 0:
        raise HookscopeError(f"cannot load {label}: the file is empty")
    try:
        return _read(path, weights_only=True)
    except OSError as e:
        raise HookscopeError(f"cannot read {label}: {e.strerror or e}") from e
    except pickle.UnpicklingError as e:
        if not trust:
            raise pickled(path, e) from None
    except Exception as e:  # a corrupt or foreign file fails in many ways (zip, EOF, KeyError on text...)
        if not retry_foreign:
            raise foreign(path, e) from e
    try:
        return _read(path, weights_only=False)
    except Exception as e:
        raise failed(path, e) from e


def _load_file(path: str, trust: bool) -> Any:
    """Weights and tensors through ``weights_only=True``; a whole pickled model only if ``trust``."""
    return _load_checked(path, path, trust=trust, pickled=_pickled, foreign=_unreadable, retry_foreign=trust,
                         failed=_unreadable)


def _unreadable(path: str, e: BaseException) -> HookscopeError:
    why = "it holds text" if _is_text(path) else f"{type(e).__name__}: {first_line(e)}"
    return HookscopeError(
        f"cannot load {path} with torch.load ({why}); MODEL.pt must be "
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


def _tvm() -> Any:
    try:
        import torchvision.models as tvm
    except ImportError:
        raise HookscopeError(
            "torchvision models need the vision extra: pip install 'hookscope[vision]'"
        ) from None
    return tvm


def _torchvision_name(spec: str) -> tuple[Any, str]:
    """(torchvision.models, NAME) for ``torchvision:NAME``, NAME checked against torchvision's list."""
    tvm = _tvm()
    name = spec.split(":", 1)[1]
    available = tvm.list_models()
    if name not in available:
        raise HookscopeError(f"torchvision has no model {name!r}.{did_you_mean(name, available)}")
    return tvm, name


def _torchvision(spec: str, weights: Any = None) -> nn.Module:
    tvm, name = _torchvision_name(spec)
    if weights is None:
        return cast(nn.Module, tvm.get_model(name, weights=None))
    path = _fetch(weights)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cast(nn.Module, tvm.get_model(name, weights=weights))
    except (RuntimeError, ValueError, KeyError) as e:  # a cached file of another model, or cut short
        problems = _cached_mismatches(tvm, name, path)
        if problems:
            raise HookscopeError(f"{path}, the cached file of {weights}, does not fit {name}: {'; '.join(problems)}; "
                                 "delete that file to download it again") from e
        raise HookscopeError(f"torchvision cannot load {weights} into {name} from {path} ({type(e).__name__}: "
                             f"{first_line(e)}); delete that file to download it again") from e


def _cached_mismatches(tvm: Any, name: str, path: str) -> list[str]:
    """What does not fit between a cached file and the bare architecture, as ``--weights FILE`` says it."""
    try:
        expected = tvm.get_model(name, weights=None).state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an unreadable file: the caller's message says what torchvision said
        return []
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return []
    return _mismatches(expected, state)


def _is_weights_file(text: str) -> bool:
    """Whether --weights names a file (existing or not) rather than torchvision weights."""
    seps = [s for s in (os.sep, os.altsep) if s]
    return os.path.lexists(text) or any(s in text for s in seps) or text.lower().endswith(_WEIGHT_SUFFIXES)


def torchvision_weights(spec: str, weights: str) -> Any | None:
    """The torchvision weights (a ``WeightsEnum`` member) ``--weights`` names for ``torchvision:NAME``.

    ``weights`` is ``DEFAULT``, a member name such as ``IMAGENET1K_V1``, or the full
    ``ResNet18_Weights.IMAGENET1K_V1``. None when ``weights`` is a file or MODEL is not torchvision's.

    Example:
        >>> torchvision_weights("torchvision:resnet18", "DEFAULT")
        ResNet18_Weights.IMAGENET1K_V1
        >>> torchvision_weights("tiny", "weights.pt") is None
        True
    """
    if not spec.startswith("torchvision:") or _is_weights_file(weights):
        return None
    tvm, name = _torchvision_name(spec)
    enum = tvm.get_model_weights(name)
    names = list(enum.__members__)
    owner, _, member = weights.rpartition(".")
    if owner and owner != enum.__name__:
        raise HookscopeError(f"--weights {weights} are not weights of {name}; its weights are {enum.__name__}.NAME, "
                             f"NAME one of {', '.join(names)}")
    if member not in enum.__members__:
        raise HookscopeError(f"{spec} has no weights {member!r}; give one of {', '.join(names)}, or a weights "
                             f"file.{did_you_mean(member, names)}")
    return enum[member]


def _fetch(weights: Any) -> str:
    """The cached file of torchvision weights, downloaded (hash-checked) when missing.

    torchvision reads that file with ``weights_only=False``; reading it first with ``weights_only=True``
    makes sure it holds nothing but tensors, whoever put it in the cache.
    """
    url = weights.url
    path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))
    if not os.path.exists(path):
        _download(url, path, weights)
    try:
        _check_plain(path)
    except Exception as e:
        raise HookscopeError(f"{path}, the cached file of {weights}, is not plain weights ({type(e).__name__}: "
                             f"{first_line(e)}); delete it to download it again") from e
    return path


def _check_plain(path: str) -> None:
    """Raises unless ``torch.load(weights_only=True)`` reads the file; mapped, so the tensors stay on disk."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):  # a file from before torch 1.6 cannot be mapped: read it whole
            raise
        _read(path, weights_only=True)


def _offline_hint(url: str, path: str) -> str:
    """What to do when torchvision's weights cannot be downloaded; ``layers`` and ``summary`` need no values."""
    fix = f"where the network allows, download {url} to {path}, or pass --weights FILE (a state_dict)"
    session = _session.get()
    command = session.command if session is not None else None
    if command not in _WEIGHTLESS:
        return fix
    # torchvision builds some models differently with weights (frozen batch norms, no aux heads, a larger
    # input size), so the architecture is only certain with the file: say so rather than guess
    return (f"`hookscope {command}` does not use the weights' values: drop --weights to see the architecture "
            f"without them (the same for most models), or {fix}")


def _download(url: str, path: str, weights: Any) -> None:
    if sys.stderr.isatty():  # a person watching; tqdm's bar follows. Scripts get their one line only
        print(f"hookscope: downloading {weights} to {path}", file=sys.stderr)
    hashed = re.search(r"-([a-f0-9]+)\.", os.path.basename(path))  # what torchvision's check_hash checks
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.hub.download_url_to_file(url, path, hashed.group(1) if hashed else None, progress=sys.stderr.isatty())
    except (OSError, RuntimeError, ValueError) as e:
        raise HookscopeError(
            f"cannot download {weights} ({type(e).__name__}: {first_line(e)}); {_offline_hint(url, path)}"
        ) from e


# --- --weights FILE: a state_dict, read with weights_only=True unless the user vouches for it -----
def _weights_file(path: str, trust: bool) -> Any:
    if os.path.isdir(path):
        raise HookscopeError(f"--weights {path} is a folder; give a weights file (torch.save(model.state_dict()))")
    if not os.path.isfile(path):
        hint = "" if _is_weights_file(path) else " (weight names such as DEFAULT are for torchvision:NAME models)"
        raise HookscopeError(f"no such weights file: {path}{hint}")
    if os.path.getsize(path) > 0 and path.lower().endswith(".safetensors"):
        return _safetensors(path)
    return _load_checked(path, f"--weights {path}", trust=trust, pickled=_pickled_weights, foreign=_not_weights,
                         retry_foreign=False, failed=_failed_weights)


def _check_folder_bin(path: str) -> None:
    """A ``pytorch_model.bin`` in an ``hf:`` model's ``--config`` folder, read with ``weights_only=True``
    only: pickled objects in it are refused (nothing is unpickled), in words about the folder."""
    folder = os.path.dirname(path) or "."

    def pickled(path: str, e: Exception) -> HookscopeError:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"it names {found.group(1)}" if found else "or it is corrupt"
        return HookscopeError(f"--config {folder}: {os.path.basename(path)} holds pickled objects ({what}), not "
                              "only tensors; unpickling runs whatever code the file holds, so hookscope reads it "
                              f"only with {TRUST_FLAG}, for a folder you trust; safer: model.save_pretrained(folder) "
                              "writes model.safetensors")

    def foreign(path: str, e: Exception) -> HookscopeError:
        why = "it holds text" if _is_text(path) else f"{type(e).__name__}: {first_line(e)}"
        return HookscopeError(f"--config {folder}: {os.path.basename(path)} is not a weights file torch can read "
                              f"({why}); write it again with model.save_pretrained(folder), or remove it for "
                              "random weights")

    if not os.path.isfile(path):
        raise HookscopeError(f"--config {folder}: its weights index names {os.path.basename(path)}, which is not "
                             "there; write the model again with model.save_pretrained(folder)")
    _load_checked(path, f"--config {folder}: {os.path.basename(path)}", trust=False, pickled=pickled,
                  foreign=foreign, retry_foreign=False, failed=foreign)


def _not_weights(path: str, e: Exception) -> HookscopeError:
    why = "it holds text" if _is_text(path) else f"{type(e).__name__}: {first_line(e)}"
    return HookscopeError(f"--weights {path} is not a weights file torch can read ({why}); give a file "
                          "torch.save(model.state_dict(), path) or safetensors wrote")


def _failed_weights(path: str, e: Exception) -> HookscopeError:
    return HookscopeError(f"cannot load --weights {path} ({type(e).__name__}: {first_line(e)})")


def _is_text(path: str) -> bool:
    """Whether the file starts as text (a note, JSON, a wrong path's content): printable UTF-8."""
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8")
    except (OSError, UnicodeDecodeError):  # a multi-byte character cut at 512 bytes is rare enough
        return False
    return all(c.isprintable() or c in "\t\n\r\f" for c in head)


def _pickled_weights(path: str, e: Exception) -> HookscopeError:
    """The one line for a weights file that ``weights_only=True`` refuses."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    if found:
        what = f"--weights {path} holds pickled objects (it names {found.group(1)}), not only tensors"
    else:
        op = re.search(r"Unsupported operand \d+", str(e))
        what = (f"cannot load --weights {path} with torch.load(weights_only=True) "
                f"({op.group(0) if op else type(e).__name__}): it is corrupt, or holds pickled objects")
    return HookscopeError(f"{what}; unpickling runs whatever code the file holds, so hookscope reads it only "
                          f"with {TRUST_FLAG}, for a file you trust; safer: torch.save(model.state_dict(), path)")


def _safetensors(path: str) -> Any:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise HookscopeError(f"reading {path} needs safetensors, from the dump extra: "
                             "pip install 'hookscope[dump]'") from None
    try:
        return load_file(path, device="cpu")
    except Exception as e:
        raise HookscopeError(f"cannot load --weights {path} with safetensors ({type(e).__name__}: "
                             f"{first_line(e)})") from e


def _state_dict(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """The state_dict in what the file held: itself, or a training checkpoint's "state_dict" / "model"."""
    if isinstance(obj, Mapping) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = [obj[k] for k in ("state_dict", "model") if isinstance(obj.get(k), (Mapping, nn.Module))]
        obj = inner[0] if inner else obj
    if isinstance(obj, nn.Module):  # a whole model, unpickled with --trust-pickle
        obj = obj.state_dict()
    if isinstance(obj, Mapping) and obj and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in obj.items()):
        return dict(obj)
    held = (f"a dict of {_few([str(k) for k in obj], 'key', 'keys')}" if isinstance(obj, Mapping) and obj
            else f"an empty {type(obj).__name__}" if isinstance(obj, Mapping) else f"a {type(obj).__name__}")
    raise HookscopeError(f"--weights {path} holds {held}, not a state_dict: give tensors by parameter name "
                         "(torch.save(model.state_dict(), path)), or a checkpoint holding them under "
                         "'state_dict' or 'model'")


def _few(items: Sequence[str], one: str, many: str) -> str:
    """``2 missing keys: a, b`` / ``5 missing keys: a, b, c, ... (2 more)``."""
    shown = ", ".join(items[:3]) + (f", ... ({len(items) - 3} more)" if len(items) > 3 else "")
    return f"{len(items)} {one if len(items) == 1 else many}: {shown}"


def _unwrapped(state: dict[str, torch.Tensor], expected: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    for prefix in ("module.", "_orig_mod."):  # saved from (Distributed)DataParallel, or a torch.compile'd model
        if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def _mismatches(expected: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> list[str]:
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} (file {shape_text(tuple(state[k].shape))}, model {shape_text(tuple(expected[k].shape))})"
              for k in expected if k in state and isinstance(expected[k], torch.Tensor)
              and tuple(state[k].shape) != tuple(expected[k].shape)]
    parts = [(missing, "missing key", "missing keys"), (unexpected, "unexpected key", "unexpected keys"),
             (shapes, "shape mismatch", "shape mismatches")]
    return [_few(items, one, many) for items, one, many in parts if items]


def load_weights(model: nn.Module, path: str, *, trust_pickle: bool = False, spec: str | None = None) -> nn.Module:
    """Load a weights file into ``model``, strictly; what does not fit is named in one line.

    The file is a ``state_dict`` (or a checkpoint holding one under ``"state_dict"`` / ``"model"``,
    keys saved from a ``DataParallel`` or compiled model unwrapped), read with
    ``torch.load(weights_only=True)``, or a ``.safetensors`` file (the ``dump`` extra). Pickled
    objects in it are refused unless ``trust_pickle``.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save(nn.Linear(2, 3).state_dict(), path)
        >>> load_weights(nn.Linear(2, 2), path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --weights .../w.pt does not fit Linear: 2 shape mismatches: weight (file 3x2, model 2x2), bias (file 3, model 2); ...
    """
    expected = model.state_dict()
    held = _weights_file(path, trust_pickle)
    state = _with_tied(model, _unwrapped(_state_dict(held, path), expected))
    what = f"{spec} ({type(model).__name__})" if spec else type(model).__name__
    problems = _mismatches(expected, state)
    if problems and not _fit_compacted(model, expected, state, path, what, held):
        raise HookscopeError(f"--weights {path} does not fit {what}: {'; '.join(problems)}; give the "
                             "state_dict() of this very architecture")
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as e:
        raise HookscopeError(f"cannot load --weights {path} into {what}: {first_line(e)}") from e
    return model


def _fit_compacted(model: nn.Module, expected: Mapping[str, Any], state: Mapping[str, torch.Tensor], path: str,
                   what: str, held: Any) -> bool:
    """A compacted model's file (``hookscope prune --compact --out`` marks it) with the model's keys, whose
    tensors only shrink: resize the model's layers to it (said once on stderr) and return True; False for
    any other misfit (a file of another model with fewer classes is not resized behind the user's back)."""
    from ..analysis.prune._resize import fit_to, is_compacted, shrinks

    if not is_compacted(held) or set(expected) != set(state):
        return False
    changed = [k for k, v in expected.items() if isinstance(v, torch.Tensor) and tuple(v.shape) != tuple(state[k].shape)]
    if not all(shrinks(tuple(expected[k].shape), tuple(state[k].shape)) for k in changed):
        return False
    try:
        resized = fit_to(model, state)
    except HookscopeError as e:
        raise HookscopeError(f"--weights {path} holds smaller tensors than {what} (a compacted model?), but {e}") from e
    shown = ", ".join(resized[:3]) + (f", ... ({len(resized) - 3} more)" if len(resized) > 3 else "")
    note(f"--weights {path} is a compacted {what}: resized {len(resized)} layer{'s' * (len(resized) != 1)} to its "
         f"shapes ({shown})")
    return True


def _with_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each tied parameter's missing names filled from a name it holds: save_pretrained
    writes a tied weight once (``lm_head.weight`` is ``transformer.wte.weight``)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    filled = dict(state)
    for group in names.values():
        held = next((n for n in group if n in state), None)
        if held is None:
            continue
        for name in group:
            filled.setdefault(name, state[held])
    return filled


def _architecture(spec: str, seed: int, trust: bool, *, trained: bool, named: Any) -> nn.Module:
    """The model ``spec`` names: the demo model ``trained`` or not, torchvision's with ``named`` weights."""
    if spec == "tiny":
        from ..zoo import TinyResNet

        return TinyResNet(seed=seed)
    if spec == DEMO_SPEC:
        from ..zoo import demo_model

        return demo_model(pretrained=trained)
    if spec.startswith("torchvision:"):
        return _torchvision(spec, named)
    if spec.startswith(TIMM_PREFIX):
        return timm_model(spec)
    if ":" in spec:
        where, attr = spec.rsplit(":", 1)
        if where.endswith(".py"):
            return _build(_attr(_exec_file(where), attr, where), spec)
        if _is_module_name(where):
            return _build(_attr(_import(where), attr, where), spec)
    if spec.endswith((".pt", ".pth", ".py")) or os.path.lexists(spec) or os.sep in spec:
        return _from_path(spec, trust)
    raise HookscopeError(
        f"MODEL {spec!r} is not understood; use tiny, {DEMO_SPEC}, torchvision:NAME, hf:CLASS_OR_TASK, timm:NAME, "
        "package.module:ATTR, file.py:ATTR or a saved model.pt"
    )


def load_model(spec: str, seed: int = 0, *, trust_pickle: bool | None = None, weights: str | None = None,
               config: str | None = None) -> nn.Module:
    """Build or load the model a MODEL argument names, with ``weights`` if given, in eval mode.

    ``trust_pickle`` (default: what the enclosing :func:`trusting_pickles` says, else False) allows
    a whole pickled model, loaded with ``torch.load(weights_only=False)``; without it a model file is
    read with ``weights_only=True`` only, which runs no code from the file.

    ``weights`` (default: inside :func:`model_session`, the command's ``--weights`` when ``spec`` is
    its MODEL) is a file for :func:`load_weights`, or torchvision's weight name for
    ``torchvision:NAME`` (see :func:`torchvision_weights`). ``config`` (default: the session's
    ``--config`` for its MODEL) is the folder or JSON an ``hf:`` model is built from. ``tiny``,
    torchvision, timm and hf models left with random weights add a warning to the session.

    Example:
        >>> model = load_model("tiny")
        >>> type(model).__name__, model.training
        ('TinyResNet', False)
    """
    torch.manual_seed(check_seed(seed))
    trust = _trust_pickle.get() if trust_pickle is None else trust_pickle
    session = _session.get()
    if session is not None and spec == session.model:
        weights = session.weights if weights is None else weights
        config = session.config if config is None else config
    if config is not None and not spec.startswith(HF_PREFIX):
        raise HookscopeError(f"--config is for hf:CLASS_OR_TASK models, not {spec}; drop it, or write MODEL as "
                             "hf:CLASS_OR_TASK (hf:causal-lm, hf:GPT2LMHeadModel...)")
    named = torchvision_weights(spec, weights) if weights is not None else None
    random = weights is None and (spec == "tiny" or spec.startswith(("torchvision:", TIMM_PREFIX)))
    if spec.startswith(HF_PREFIX):
        built = hf_model(spec, config, check_pickle=_check_folder_bin, trust_pickle=trust)
        model, random = built.model, weights is None and not built.trained
        for note in built.notes if weights is None else ():
            warn(note)
    else:
        model = _architecture(spec, seed, trust, trained=weights is None, named=named)
    if weights is not None and named is None:
        load_weights(model, weights, trust_pickle=trust, spec=spec)
    elif random:
        _warn_random(spec)
    return model.eval()


# --- class names: --classes FILE, torchvision's weights, or the demo model's ------------------------
def add_class_arguments(p: argparse.ArgumentParser) -> None:
    """``--classes FILE``: the model's class names, for commands that show predictions.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_class_arguments(p)
        >>> p.parse_args(["--classes", "names.txt"]).classes
        'names.txt'
    """
    p.add_argument("--classes", metavar="FILE", default=None,
                   help="the model's class names, one per line or a JSON list, in class order (default: "
                        "the categories of torchvision's --weights NAME, or the demo model's classes)")


def read_class_names(path: str) -> list[str]:
    """The class names in a file: one per line (blank lines skipped), or a JSON list of strings.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "names.json")
        >>> _ = open(path, "w").write('["cat", "dog"]')
        >>> read_class_names(path)
        ['cat', 'dog']
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        said = "no such file" if isinstance(e, FileNotFoundError) else (
            getattr(e, "strerror", None) or f"{type(e).__name__}: {first_line(e)}")
        raise HookscopeError(f"cannot read --classes {path}: {said}; give a text file, one class name per line") from e
    how = "write one name per line, or a JSON list of strings"
    if text.lstrip().startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError as e:
            raise HookscopeError(f"--classes {path} is not valid JSON ({e.msg}, line {e.lineno}); {how}") from None
        if not all(isinstance(n, str) for n in names):
            raise HookscopeError(f"--classes {path} is a JSON list of other things than strings; {how}")
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise HookscopeError(f"--classes {path} holds no class names; {how}")
    return cast(list[str], names)


def class_names(args: argparse.Namespace) -> list[str] | None:
    """The model's class names: ``--classes FILE``, else torchvision's ``--weights NAME`` categories,
    else the demo model's classes for MODEL ``demo``, else an ``hf:`` model's ``id2label`` (unless it
    holds transformers' placeholders ``LABEL_0``...); None when nothing says.

    Example:
        >>> class_names(argparse.Namespace(model="demo", weights=None, classes=None))[:3]
        ['circle', 'square', 'triangle']
        >>> class_names(argparse.Namespace(model="torchvision:resnet18", weights="DEFAULT"))[:2]
        ['tench', 'goldfish']
    """
    path = getattr(args, "classes", None)
    if path is not None:
        return read_class_names(path)
    weights = getattr(args, "weights", None)
    named = torchvision_weights(args.model, weights) if weights is not None else None
    if named is not None:
        categories = named.meta.get("categories")
        return [str(c) for c in categories] if categories else None
    if args.model == DEMO_SPEC:
        from ..zoo import DEMO_CLASSES

        return list(DEMO_CLASSES)
    if args.model.startswith(HF_PREFIX) and getattr(args, "config", None) is not None:
        return _config_labels(hf_config(args.config))
    return None


def _config_labels(config: Any) -> list[str] | None:
    """A transformers config's ``id2label`` names in class order; None for its placeholders (LABEL_0...)."""
    labels = getattr(config, "id2label", None) or {}
    try:
        names = [str(labels[i]) for i in range(len(labels))]
    except (KeyError, TypeError):  # not numbered 0 .. n-1: say nothing rather than mislabel
        return None
    return None if not names or names == [f"LABEL_{i}" for i in range(len(names))] else names


def check_class_names(names: Sequence[str], outputs: int, args: argparse.Namespace) -> None:
    """One line when the class names are not one per model output.

    Example:
        >>> check_class_names(["a", "b"], 3, argparse.Namespace(model="m.py:Net", classes="names.txt"))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --classes names.txt gives 2 class names but the model has 3 outputs; give one name per output, in class order
    """
    if len(names) == outputs:
        return
    source = (f"--classes {args.classes}" if getattr(args, "classes", None) is not None
              else f"--weights {args.weights}" if getattr(args, "weights", None) is not None else f"MODEL {args.model}")
    raise HookscopeError(f"{source} gives {len(names)} class names but the model has {outputs} outputs; "
                         "give one name per output, in class order")


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


def check_fits(dims: Sequence[int], what: str, *, fix: str = "give a smaller shape",
               dtype: torch.dtype = torch.float32) -> None:
    """Refuse, in one line, a tensor of shape ``dims`` and ``dtype`` (float32 unless said) that cannot fit
    in this machine's memory.

    Example:
        >>> check_fits((1, 3, 64, 64), "--input 1x3x64x64")
        >>> check_fits((2**40, 2**40), "--size 2**40 squared", fix="give a smaller --size")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --size 2**40 squared is 1,208,925,819,614,629,174,706,176 values (...)...; give a smaller --size
        >>> check_fits((2**20, 2**20), "--input 1048576x1048576", dtype=torch.long)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --input 1048576x1048576 is 1,099,511,627,776 values (8.8 TB of int64), ...
    """
    numel = math.prod(dims)
    nbytes = dtype.itemsize * numel
    memory = _memory_bytes()
    if numel >= 2**63 or (memory is not None and nbytes > memory):
        room = f"more than this machine's {_size(memory)} of memory" if memory else "too large"
        kind = str(dtype).removeprefix("torch.")
        raise HookscopeError(f"{what} is {numel:,} values ({_size(nbytes)} of {kind}), {room}; {fix}")


def random_input(dims: Sequence[int], what: str, generator: torch.Generator | None = None, *,
                 fix: str = "give a smaller shape") -> torch.Tensor:
    """``torch.randn(*dims)``, refused in one line if it cannot fit in this machine's memory."""
    check_fits(dims, what, fix=fix)
    try:
        return torch.randn(*dims, generator=generator)
    except (RuntimeError, MemoryError) as e:
        numel = math.prod(dims)
        raise HookscopeError(f"{what} ({numel:,} values, {_size(4 * numel)} of float32) cannot be "
                             f"created: {first_line(e) or type(e).__name__}; {fix}") from e


def usual_shape(spec: str) -> tuple[int, ...] | None:
    """The shape of MODEL ``spec``'s usual input, or None when hookscope does not know it.

    Example:
        >>> usual_shape("demo"), usual_shape("torchvision:resnet18"), usual_shape("net.py:build")
        ((1, 3, 64, 64), (1, 3, 224, 224), None)
    """
    if spec in _DEFAULT_SHAPES:
        return _DEFAULT_SHAPES[spec]
    return (1, 3, 224, 224) if spec.startswith("torchvision:") else None


def example_input(spec: str, shape: str | None, seed: int = 0) -> torch.Tensor:
    """A seeded random input of ``shape`` (or the model's usual one)."""
    dims = parse_shape(shape) if shape is not None else usual_shape(spec)
    if dims is None:
        raise HookscopeError(f"give the example input's shape for {spec!r}, e.g. --input 1x3x224x224")
    gen = torch.Generator().manual_seed(check_seed(seed))
    return random_input(dims, f"--input {shape_text(dims)}", gen)
