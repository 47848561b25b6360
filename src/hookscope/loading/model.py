"""``load_model``: the model a spec names (see :mod:`hookscope.loading.spec`), with its weights, in
eval mode.

Security: ``file.py:ATTR`` and ``package.module:ATTR`` import and run that Python code; any other file
is read with ``torch.load(weights_only=True)``, which runs no code, and a whole pickled model only
with ``trust_pickle=True`` (see :mod:`hookscope.loading.files`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import LoadError, checked, did_you_mean
from .files import read_model_file
from .hf import hf_model
from .origin import WeightsOrigin, record_origin
from .spec import DEMO_SPEC, HF_PREFIX, TIMM_PREFIX, TINY_SPEC, TORCHVISION_PREFIX, Spec, parse_spec
from .timm_models import timm_model
from .usercode import import_module, run_file, run_user_code
from .vision import torchvision_model, torchvision_weights
from .voice import tell, terms
from .weights import load_weights, mismatches, unwrapped

__all__ = ["check_seed", "load_model"]

_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts


def check_seed(seed: int, what: str = "seed") -> int:
    """``seed`` itself if PyTorch's generators accept it, else a one-line error.

    Example:
        >>> check_seed(7)
        7
        >>> check_seed(-2**64)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: seed -18446744073709551616 is out of range for PyTorch's random generator; give a whole number from 0 to 18446744073709551615
    """
    low, high = _SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise LoadError(f"{what} {seed} is out of range for PyTorch's random generator; "
                        f"give a whole number from 0 to {high}")
    return seed


def _attr(obj: Any, attr: str, where: str) -> Any:
    if not hasattr(obj, attr):
        names = [n for n in dir(obj) if not n.startswith("_")]
        raise LoadError(f"{where} has no attribute {attr!r}.{did_you_mean(attr, names)}")
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
    """The module ``factory`` is, or makes when called with no arguments (the caller's code runs)."""
    if callable(factory) and not isinstance(factory, nn.Module):
        missing = _needs_arguments(factory)
        where = spec.rsplit(":", 1)[0]
        if missing is not None:
            name = getattr(factory, "__name__", "Model")
            call = f"{name}({', '.join(f'{n}=...' for n in missing)})"
            built = "MODEL is built with none" if terms().cli else "load_model calls it with none"
            raise LoadError(
                f"{spec!r} needs arguments ({', '.join(missing)}) but {built}; "
                f"write a factory that takes none, e.g. def build(): return {call}, and pass {where}:build"
            )
        model = run_user_code(factory, f"building {spec!r}", where if where.endswith(".py") else None)
    else:
        model = factory
    if not isinstance(model, nn.Module):
        hint = _state_dict_hint(model, spec) if isinstance(model, Mapping) else ""
        raise LoadError(f"{spec!r} gave a {type(model).__name__}, not an nn.Module{hint}")
    return model


def _state_dict_hint(held: Mapping[Any, Any], spec: str) -> str:
    """For weights given as the model: name the architecture, and the file as its weights."""
    if not any(isinstance(v, torch.Tensor) for v in held.values()):
        return ""
    t = terms()
    arch = _bundled_fit(held) or "ARCH"
    forms = "" if arch != "ARCH" else f" (ARCH: tiny, {DEMO_SPEC}, torchvision:NAME or file.py:ATTR)"
    run = (f"hookscope {t.command or 'COMMAND'} {arch} --weights {spec}" if t.cli
           else f"load_model({arch!r}, weights={spec!r})")
    return (f"; it looks like a state_dict (weights without the model's code): pass the architecture as {t.model} "
            f"and this file as {t.option('weights')}: {run}{forms}; or write a file.py "
            "with def build(): m = Net(); m.load_state_dict(torch.load('weights.pt', weights_only=True)); "
            "return m, and pass file.py:build (its code runs)")


def _bundled_fit(held: Mapping[Any, Any]) -> str | None:
    """``tiny`` or ``demo`` when the weights have exactly that bundled model's names and shapes."""
    from ..zoo import TinyResNet, demo_model

    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in held.items()):
        return None
    for name, build in ((TINY_SPEC, TinyResNet), (DEMO_SPEC, lambda: demo_model(pretrained=False))):
        expected = build().state_dict()
        if not mismatches(expected, unwrapped(dict(held), expected)):
            return name
    return None


def _from_path(spec: str, trust: bool) -> nn.Module:
    model = terms().model
    if os.path.isdir(spec):
        raise LoadError(f"{model} {spec} is a folder; give a model file (model.pt) or file.py:ATTR")
    if not os.path.isfile(spec):
        raise LoadError(f"no such file: {spec}")
    if spec.endswith(".py"):
        raise LoadError(f"{model} {spec} names a Python file but not what builds the model; write "
                        f"{spec}:NAME, NAME a class or a function taking no arguments (its code runs)")
    return _build(read_model_file(spec, trust_pickle=trust), spec)


def _architecture(spec: Spec, seed: int, trust: bool, *, trained: bool, named: Any) -> nn.Module:
    """The model ``spec`` names: the demo model ``trained`` or not, torchvision's with ``named`` weights."""
    if spec.kind == "tiny":
        from ..zoo import TinyResNet

        return TinyResNet(seed=seed)
    if spec.kind == "demo":
        from ..zoo import demo_model

        return demo_model(pretrained=trained)
    if spec.kind == "torchvision":
        return torchvision_model(spec.text, named)
    if spec.kind == "timm":
        return timm_model(spec.text)
    if spec.kind in ("file", "module"):
        assert spec.attr is not None
        found = run_file(spec.where) if spec.kind == "file" else import_module(spec.where)
        return _build(_attr(found, spec.attr, spec.where), spec.text)
    return _from_path(spec.text, trust)


def _origin(spec: Spec, seed: int, named: Any) -> WeightsOrigin:
    """Where the weights of a model built without a weights file come from."""
    if named is not None:
        return WeightsOrigin(False, f"torchvision's weights {named}")
    if spec.kind in ("tiny", "torchvision", "timm"):
        return WeightsOrigin(True, f"random (seed {seed})")
    if spec.kind == "demo":
        return WeightsOrigin(False, "the demo model's bundled weights")
    if spec.kind == "path":
        return WeightsOrigin(False, f"the model file {spec.text}")
    return WeightsOrigin(False, f"the code of {spec.text}")


@checked
def load_model(spec: str | os.PathLike[str], *, weights: str | os.PathLike[str] | None = None,
               config: str | os.PathLike[str] | None = None, trust_pickle: bool = False, seed: int = 0) -> nn.Module:
    """Build or read the model ``spec`` names, with ``weights`` if given, in eval mode.

    ``spec`` is ``tiny``, ``demo``, ``torchvision:NAME``, ``hf:CLASS_OR_TASK`` (with ``config``),
    ``timm:NAME``, ``package.module:ATTR``, ``path/to/file.py:ATTR`` (a class or a factory taking no
    arguments; its code runs) or a model file torch.save wrote (see :mod:`hookscope.loading.spec`).
    Nothing is downloaded, except torchvision's named weights into torch.hub's cache.

    Args:
        spec: what model to build or read.
        weights: a ``state_dict`` file fitted onto the model (see :func:`~hookscope.load_weights`), or
            for ``torchvision:NAME`` torchvision's weight name (``DEFAULT``, ``IMAGENET1K_V1``).
        config: for ``hf:``, a folder ``save_pretrained`` wrote (its weights loaded when there, random
            otherwise) or a config JSON file; local files only, no repository code runs.
        trust_pickle: read a whole pickled model (``torch.save(model)``), and pickled objects in
            ``weights``, with the full unpickler, which runs any code the file names. Without it a
            file is read with ``torch.load(weights_only=True)`` only, which runs no code.
        seed: ``torch.manual_seed(seed)`` before building, so that random weights are the same each time.

    Returns:
        The model, in eval mode. A transformers head the folder's weights lack, or a model resized
        to a compacted weights file, is said as a :class:`UserWarning`.

    Raises:
        LoadError: the spec, a file or the weights cannot be read or built, in one line naming what
            was tried and the fix.
        UntrustedPickleError: a file holds pickled objects and ``trust_pickle`` is False.

    Example:
        >>> import hookscope
        >>> model = hookscope.load_model("tiny")
        >>> type(model).__name__, model.training
        ('TinyResNet', False)
        >>> hookscope.load_model("dmeo")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: spec 'dmeo' is not understood. Did you mean 'demo'? Use tiny, demo, ...
    """
    spec, seed = os.fspath(spec), check_seed(seed)
    weights = None if weights is None else os.fspath(weights)
    config = None if config is None else os.fspath(config)
    torch.manual_seed(seed)
    if config is not None and not spec.startswith(HF_PREFIX):
        t = terms()
        raise LoadError(f"{t.option('config')} is for hf:CLASS_OR_TASK models, not {spec}; drop it, or write "
                        f"{t.model} as hf:CLASS_OR_TASK (hf:causal-lm, hf:GPT2LMHeadModel...)")
    named = torchvision_weights(spec, weights) if weights is not None else None
    if spec.startswith(HF_PREFIX):
        built = hf_model(spec, config, trust_pickle=trust_pickle)
        model = built.model
        origin = WeightsOrigin(not built.trained, f"the weights in {terms().option('config')} {config}"
                               if built.trained else f"random (seed {seed})")
        for note in built.notes if weights is None else ():
            tell("warning", note)
    else:
        parsed = parse_spec(spec)
        model = _architecture(parsed, seed, trust_pickle, trained=weights is None, named=named)
        origin = _origin(parsed, seed, named)
    if weights is not None and named is None:
        load_weights(model, weights, trust_pickle=trust_pickle, spec=spec)  # records where they came from
    else:
        record_origin(model, origin)
        if origin.random:
            tell("random", spec)
    return model.eval()
