"""``torchvision:NAME`` models: random weights, or torchvision's named weights (``DEFAULT``,
``IMAGENET1K_V1``) fetched through torch.hub and checked to be plain weights before torchvision reads them.

Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading``'s ``voice``,
``spec``, ``extras``, ``files`` and ``weights``.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import urlparse

import torch
from torch import nn

from ..core.text import first_line
from ..errors import LoadError, did_you_mean
from .extras import import_torchvision_models
from .files import is_weights_file, read_torch_file
from .spec import TORCHVISION_PREFIX
from .voice import terms
from .weights import mismatches

__all__ = ["torchvision_model", "torchvision_weights"]


def _named(spec: str) -> tuple[Any, str]:
    """(torchvision.models, NAME) for ``torchvision:NAME``, NAME checked against torchvision's list."""
    tvm = import_torchvision_models()
    name = spec.split(":", 1)[1]
    available = tvm.list_models()
    if name not in available:
        raise LoadError(f"torchvision has no model {name!r}.{did_you_mean(name, available)}")
    return tvm, name


def torchvision_model(spec: str, weights: Any = None) -> nn.Module:
    """``torchvision:NAME`` built with ``weights`` (a member of its ``WeightsEnum``, see
    :func:`torchvision_weights`), or random weights.

    Example:
        >>> type(torchvision_model("torchvision:resnet18")).__name__
        'ResNet'
        >>> torchvision_model("torchvision:resnet19")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: torchvision has no model 'resnet19'. Did you mean 'resnet18', ...?
    """
    tvm, name = _named(spec)
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
            raise LoadError(f"{path}, the cached file of {weights}, does not fit {name}: {'; '.join(problems)}; "
                            "delete that file to download it again") from e
        raise LoadError(f"torchvision cannot load {weights} into {name} from {path} ({type(e).__name__}: "
                        f"{first_line(e)}); delete that file to download it again") from e


def _cached_mismatches(tvm: Any, name: str, path: str) -> list[str]:
    """What does not fit between a cached file and the bare architecture, as a weights file says it."""
    try:
        expected = tvm.get_model(name, weights=None).state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an unreadable file: the caller's message says what torchvision said
        return []
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return []
    return mismatches(expected, state)


def torchvision_weights(spec: str, weights: str) -> Any | None:
    """The torchvision weights (a ``WeightsEnum`` member) ``weights`` names for ``torchvision:NAME``.

    ``weights`` is ``DEFAULT``, a member name such as ``IMAGENET1K_V1``, or the full
    ``ResNet18_Weights.IMAGENET1K_V1``. None when ``weights`` is a file or the spec is not torchvision's.

    Example:
        >>> torchvision_weights("torchvision:resnet18", "DEFAULT")
        ResNet18_Weights.IMAGENET1K_V1
        >>> torchvision_weights("tiny", "weights.pt") is None
        True
    """
    if not spec.startswith(TORCHVISION_PREFIX) or is_weights_file(weights):
        return None
    tvm, name = _named(spec)
    enum = tvm.get_model_weights(name)
    names = list(enum.__members__)
    owner, _, member = weights.rpartition(".")
    if owner and owner != enum.__name__:
        raise LoadError(f"{terms().option('weights')} {weights} are not weights of {name}; its weights are "
                        f"{enum.__name__}.NAME, NAME one of {', '.join(names)}")
    if member not in enum.__members__:
        raise LoadError(f"{spec} has no weights {member!r}; give one of {', '.join(names)}, or a weights "
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
        raise LoadError(f"{path}, the cached file of {weights}, is not plain weights ({type(e).__name__}: "
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
        read_torch_file(path, weights_only=True)


def _offline_hint(url: str, path: str) -> str:
    """What to do when torchvision's weights cannot be downloaded; a command that shows no values
    (names, shapes) needs none."""
    t = terms()
    fix = f"where the network allows, download {url} to {path}, or pass {t.given('weights', 'FILE')} (a state_dict)"
    if not t.weightless:
        return fix
    # torchvision builds some models differently with weights (frozen batch norms, no aux heads, a larger
    # input size), so the architecture is only certain with the file: say so rather than guess
    return (f"`hookscope {t.command}` does not use the weights' values: drop {t.option('weights')} to see the "
            f"architecture without them (the same for most models), or {fix}")


def _download(url: str, path: str, weights: Any) -> None:
    if sys.stderr.isatty():  # a person watching; tqdm's bar follows. Scripts get their one line only
        print(f"hookscope: downloading {weights} to {path}", file=sys.stderr)
    hashed = re.search(r"-([a-f0-9]+)\.", os.path.basename(path))  # what torchvision's check_hash checks
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.hub.download_url_to_file(url, path, hashed.group(1) if hashed else None, progress=sys.stderr.isatty())
    except (OSError, RuntimeError, ValueError) as e:
        raise LoadError(
            f"cannot download {weights} ({type(e).__name__}: {first_line(e)}); {_offline_hint(url, path)}"
        ) from e
