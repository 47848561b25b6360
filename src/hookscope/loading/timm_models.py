"""``timm:NAME`` models: ``timm.create_model(NAME, pretrained=False)``, NAME checked against timm's list
first; nothing is downloaded.

Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading``'s ``voice``,
``spec`` and ``extras``.
"""

from __future__ import annotations

import warnings
from typing import cast

from torch import nn

from ..core.text import first_line
from ..errors import LoadError, did_you_mean
from .extras import import_timm
from .spec import TIMM_PREFIX
from .voice import terms

__all__ = ["timm_model"]


def timm_model(spec: str) -> nn.Module:
    """``timm:NAME``: ``timm.create_model(NAME, pretrained=False)``, NAME checked against timm's list.

    Example:
        >>> timm_model("timm:resnet19")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: timm has no model 'resnet19'. Did you mean 'resnet18', ...?
    """
    timm = import_timm()
    name = spec[len(TIMM_PREFIX):]
    if not name.strip():
        raise LoadError(f"{terms().model} timm: names no model; write timm:NAME with one of timm.list_models(), "
                        "such as timm:resnet18")
    known = timm.list_models()
    arch = name.split(".", 1)[0]
    if arch not in known:
        same = [k for k in known if k.lower() == arch.lower()]  # timm's names are lower case
        hint = f" Did you mean {same[0]!r} (timm's names are lower case)?" if same else did_you_mean(name, known)
        raise LoadError(f"timm has no model {name!r}.{hint}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cast(nn.Module, timm.create_model(name, pretrained=False))
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise LoadError(f"timm cannot build {name!r} ({type(e).__name__}: {first_line(e)})") from e
