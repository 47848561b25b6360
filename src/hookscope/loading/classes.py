"""A model's class names: from a file, torchvision's named weights, the demo model, or an ``hf:``
model's config (``id2label``).

Must not import: anything of hookscope but ``errors``, ``core.text``, ``zoo`` and ``loading``'s
``voice``, ``spec``, ``vision`` and ``hf``.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

from ..core.text import first_line
from ..errors import LoadError, checked
from .hf import hf_config
from .spec import DEMO_SPEC, HF_PREFIX
from .vision import torchvision_weights
from .voice import terms

__all__ = ["class_names", "read_class_names"]


def read_class_names(path: str | os.PathLike[str]) -> list[str]:
    """The class names in a file: one per line (blank lines skipped), or a JSON list of strings.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "names.json")
        >>> _ = open(path, "w").write('["cat", "dog"]')
        >>> read_class_names(path)
        ['cat', 'dog']
    """
    path = os.fspath(path)
    flag = terms().option("classes")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        said = "no such file" if isinstance(e, FileNotFoundError) else (
            getattr(e, "strerror", None) or f"{type(e).__name__}: {first_line(e)}")
        raise LoadError(f"cannot read {flag} {path}: {said}; give a text file, one class name per line") from e
    how = "write one name per line, or a JSON list of strings"
    if text.lstrip().startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError as e:
            raise LoadError(f"{flag} {path} is not valid JSON ({e.msg}, line {e.lineno}); {how}") from None
        if not all(isinstance(n, str) for n in names):
            raise LoadError(f"{flag} {path} is a JSON list of other things than strings; {how}")
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise LoadError(f"{flag} {path} holds no class names; {how}")
    return cast(list[str], names)


@checked
def class_names(spec: str, *, weights: str | None = None, config: str | os.PathLike[str] | None = None,
                classes: str | os.PathLike[str] | None = None) -> list[str] | None:
    """The class names of the model :func:`~hookscope.load_model` builds from the same arguments, in
    class order; None when nothing says.

    In order: the file ``classes`` (see :func:`read_class_names`), the categories of torchvision's named
    ``weights`` (``DEFAULT``...), the demo model's classes, an ``hf:`` model's ``id2label`` from its
    ``config`` (unless it holds transformers' placeholders ``LABEL_0``...).

    Example:
        >>> class_names("demo")[:3]
        ['circle', 'square', 'triangle']
        >>> class_names("torchvision:resnet18", weights="DEFAULT")[:2]
        ['tench', 'goldfish']
        >>> class_names("torchvision:resnet18") is None
        True
    """
    if classes is not None:
        return read_class_names(classes)
    if weights is not None:
        named = torchvision_weights(spec, os.fspath(weights))
        if named is not None:
            categories = named.meta.get("categories")
            return [str(c) for c in categories] if categories else None
    if spec == DEMO_SPEC:
        from ..zoo import DEMO_CLASSES

        return list(DEMO_CLASSES)
    if spec.startswith(HF_PREFIX) and config is not None:
        return _config_labels(hf_config(os.fspath(config)))
    return None


def _config_labels(config: Any) -> list[str] | None:
    """A transformers config's ``id2label`` names in class order; None for its placeholders (LABEL_0...)."""
    labels = getattr(config, "id2label", None) or {}
    try:
        names = [str(labels[i]) for i in range(len(labels))]
    except (KeyError, TypeError):  # not numbered 0 .. n-1: say nothing rather than mislabel
        return None
    return None if not names or names == [f"LABEL_{i}" for i in range(len(names))] else names
