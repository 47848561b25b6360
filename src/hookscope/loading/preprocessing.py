"""What a model's own files say about its input: the size, mean and std of a timm model's
``pretrained_cfg``, a transformers folder's ``preprocessor_config.json``; read, never applied here.

Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading``'s ``spec`` and
``extras``.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

from torch import nn

from ..core.text import first_line
from ..errors import LoadError
from .extras import import_timm
from .spec import TIMM_PREFIX

__all__ = ["hf_preprocessing", "timm_input_size", "timm_pretrained_cfg"]


def timm_input_size(model: nn.Module) -> tuple[int, ...] | None:
    """``C x H x W`` a timm model was made for (its ``pretrained_cfg``), or None when it does not say.

    Example:
        >>> timm_input_size(nn.Linear(2, 2)) is None
        True
    """
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    return tuple(int(d) for d in size) if isinstance(size, (tuple, list)) and len(size) == 3 else None


def timm_pretrained_cfg(spec: str) -> dict[str, Any] | None:
    """The ``pretrained_cfg`` timm builds ``timm:NAME`` with (input size, mean, std, crop), without
    building the model; None when timm has none for it.

    Example:
        >>> timm_pretrained_cfg("timm:resnet18")["input_size"]
        (3, 224, 224)
    """
    timm = import_timm()
    try:
        cfg = timm.get_pretrained_cfg(spec[len(TIMM_PREFIX):])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    to_dict = getattr(cfg, "to_dict", None)
    return cast(dict[str, Any], to_dict()) if callable(to_dict) else None


def hf_preprocessing(path: str | None) -> dict[str, Any] | None:
    """What ``preprocessor_config.json`` in an ``hf:`` model's folder says (image size, mean, std), or
    None when the folder has none (or ``path`` is a config JSON file).

    Example:
        >>> hf_preprocessing(None) is None
        True
    """
    file = os.path.join(path, "preprocessor_config.json") if path is not None and os.path.isdir(path) else None
    if file is None or not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LoadError(f"cannot read {file} ({type(e).__name__}: {first_line(e)}); write it again with "
                        "image_processor.save_pretrained(folder), or remove it") from None
    if not isinstance(data, dict):
        raise LoadError(f"{file} is not a JSON object; write it again with image_processor.save_pretrained(folder)")
    return data
