"""Turn a MODEL argument and an --input shape into a model and an example input, for every command.

MODEL is one of:
  ``tiny``                      the bundled TinyResNet (3x32x32)
  ``torchvision:resnet18``      any torchvision model builder, built with weights=None
  ``package.module:attr``       an importable nn.Module class or factory (called with no arguments)
  ``path/to/file.py:attr``      the same, from a Python file
  ``path/to/model.pt``          a whole model saved with torch.save(model) (trusted files only)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..errors import HookscopeError, did_you_mean

__all__ = ["add_model_arguments", "load_model", "example_input", "parse_shape"]

_DEFAULT_SHAPES = {"tiny": (1, 3, 32, 32)}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The MODEL positional and the --input / --seed options every model command shares."""
    p.add_argument("model", metavar="MODEL",
                   help="tiny | torchvision:NAME | package.module:ATTR | file.py:ATTR | model.pt")
    p.add_argument("--input", metavar="SHAPE", default=None,
                   help="example input shape such as 1x3x224x224 (default: 1x3x32x32 for tiny, "
                        "1x3x224x224 for torchvision models)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and input (default 0)")


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
        model = factory()
    else:
        model = factory
    if not isinstance(model, nn.Module):
        hint = ""
        if isinstance(model, Mapping) and any(isinstance(v, torch.Tensor) for v in model.values()):
            hint = ("; it looks like a state_dict: save the whole model with torch.save(model), or "
                    "build it in a file.py:factory that calls load_state_dict")
        raise HookscopeError(f"{spec!r} gave a {type(model).__name__}, not an nn.Module{hint}")
    return model


def _load_file(path: str) -> Any:
    """A whole model saved with torch.save (trusted files only: unpickling runs code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a corrupt or foreign file fails in many ways (pickle, zip, EOF...)
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise HookscopeError(
            f"cannot load {path} with torch.load ({type(e).__name__}: {detail}); MODEL.pt must be a "
            "whole model saved with torch.save(model), with its class importable here"
        ) from e


def _exec_file(path: str) -> ModuleType:
    mod_spec = importlib.util.spec_from_file_location("_hookscope_user_model", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise HookscopeError(f"{e.filename or path}, line {e.lineno}: {type(e).__name__}: {e.msg}") from None
    except ImportError as e:
        raise HookscopeError(f"{path} cannot be run: {e}") from None
    return module


def load_model(spec: str, seed: int = 0) -> nn.Module:
    """Build or load the model a MODEL argument names, in eval mode."""
    torch.manual_seed(seed)
    if spec == "tiny":
        from ..zoo import TinyResNet

        return TinyResNet(seed=seed).eval()
    if spec.startswith("torchvision:"):
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
        return tvm.get_model(name, weights=None).eval()
    if spec.endswith((".pt", ".pth")):
        if not os.path.isfile(spec):
            raise HookscopeError(f"no such file: {spec}")
        return _build(_load_file(spec), spec).eval()
    if ":" in spec:
        where, attr = spec.rsplit(":", 1)
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise HookscopeError(f"no such file: {where}")
            module = _exec_file(where)
        else:
            try:
                module = importlib.import_module(where)
            except ImportError as e:
                raise HookscopeError(f"cannot import {where!r}: {e}") from None
            except SyntaxError as e:
                raise HookscopeError(f"cannot import {where!r}: {e.filename}, line {e.lineno}: "
                                     f"{type(e).__name__}: {e.msg}") from None
        return _build(_attr(module, attr, where), spec).eval()
    raise HookscopeError(
        f"MODEL {spec!r} is not understood; use tiny, torchvision:NAME, package.module:ATTR, "
        "file.py:ATTR or a saved model.pt"
    )


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
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*dims, generator=gen)
