"""What a model spec names: one string for every way hookscope builds or reads a model.

``tiny``                 the bundled TinyResNet (3x32x32), random weights
``demo``                 the bundled DemoNet (3x64x64), trained on hookscope's synthetic shapes
``torchvision:NAME``     a torchvision model builder: random weights, or torchvision's named weights
``hf:CLASS_OR_TASK``     a transformers model built from a config (a folder save_pretrained wrote)
``timm:NAME``            ``timm.create_model(NAME, pretrained=False)``
``package.module:ATTR``  an importable nn.Module class or factory (called with no arguments)
``path/to/file.py:ATTR`` the same, from a Python file
``path/to/model.pt``     a file torch.save wrote (a whole pickled model only when trusted)

Parsing reads no file and imports nothing. Must not import: anything of hookscope but ``errors``
and ``loading.voice``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from ..errors import LoadError, did_you_mean
from .voice import terms

__all__ = ["DEMO_SPEC", "HF_PREFIX", "TIMM_PREFIX", "TINY_SPEC", "TORCHVISION_PREFIX", "Kind", "Spec",
           "parse_spec", "usual_shape"]

TINY_SPEC = "tiny"
DEMO_SPEC = "demo"
TORCHVISION_PREFIX = "torchvision:"
HF_PREFIX = "hf:"
TIMM_PREFIX = "timm:"
_USUAL_SHAPES = {TINY_SPEC: (1, 3, 32, 32), DEMO_SPEC: (1, 3, 64, 64)}

Kind = Literal["tiny", "demo", "torchvision", "hf", "timm", "file", "module", "path"]
_PREFIXES: tuple[tuple[str, Kind], ...] = ((HF_PREFIX, "hf"), (TORCHVISION_PREFIX, "torchvision"), (TIMM_PREFIX, "timm"))


@dataclass(frozen=True)
class Spec:
    """A parsed model spec.

    Attributes:
        text: the spec as given.
        kind: which way the model is made (see the module's table).
        where: the name after the prefix (``torchvision``, ``hf``, ``timm``), the Python file or module
            (``file``, ``module``), the model file (``path``); empty for ``tiny`` and ``demo``.
        attr: what to take from the Python file or module (``file``, ``module``), else None.

    Example:
        >>> parse_spec("net.py:build")
        Spec(text='net.py:build', kind='file', where='net.py', attr='build')
    """

    text: str
    kind: Kind
    where: str = ""
    attr: str | None = None


def _is_module_name(where: str) -> bool:
    return all(part.isidentifier() for part in where.split("."))


def parse_spec(spec: str) -> Spec:
    """What ``spec`` names; a one-line :class:`~hookscope.errors.LoadError` listing every form when it
    is none of them.

    Example:
        >>> parse_spec("torchvision:resnet18").kind, parse_spec("hookscope.zoo:TinyResNet").kind
        ('torchvision', 'module')
        >>> parse_spec("dmeo")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: spec 'dmeo' is not understood. Did you mean 'demo'? Use tiny, demo, ...
    """
    if spec in (TINY_SPEC, DEMO_SPEC):
        return Spec(spec, "tiny" if spec == TINY_SPEC else "demo")
    for prefix, kind in _PREFIXES:
        if spec.startswith(prefix):
            return Spec(spec, kind, spec[len(prefix):])
    if ":" in spec:
        where, attr = spec.rsplit(":", 1)
        if where.endswith(".py"):
            return Spec(spec, "file", where, attr)
        if _is_module_name(where):
            return Spec(spec, "module", where, attr)
    if spec.endswith((".pt", ".pth", ".py")) or os.path.lexists(spec) or os.sep in spec:
        return Spec(spec, "path", spec)
    rest = spec.split(":", 1)[1] if ":" in spec else None
    near = [TINY_SPEC, DEMO_SPEC] if rest is None else [prefix + rest for prefix, _ in _PREFIXES]
    raise LoadError(
        f"{terms().model} {spec!r} is not understood.{did_you_mean(spec, near)} Use tiny, {DEMO_SPEC}, "
        "torchvision:NAME, hf:CLASS_OR_TASK, timm:NAME, package.module:ATTR, file.py:ATTR or a saved model.pt"
    )


def usual_shape(spec: str) -> tuple[int, ...] | None:
    """The shape of ``spec``'s usual input, or None when hookscope does not know it.

    Example:
        >>> usual_shape("demo"), usual_shape("torchvision:resnet18"), usual_shape("net.py:build")
        ((1, 3, 64, 64), (1, 3, 224, 224), None)
    """
    if spec in _USUAL_SHAPES:
        return _USUAL_SHAPES[spec]
    return (1, 3, 224, 224) if spec.startswith(TORCHVISION_PREFIX) else None
