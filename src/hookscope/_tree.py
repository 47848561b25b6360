"""Walk nested module inputs and outputs, keeping the container types.

Handles tensors inside tuples, lists, dicts (and OrderedDict subclasses such as Hugging Face's
``ModelOutput``), named tuples, ``torch.return_types`` struct sequences and dataclasses. ``None`` and
every other object pass through untouched.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["tree_map", "tensors", "paths", "first_tensor"]


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _is_structseq(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "n_fields")


def tree_map(fn: Callable[[Any], Any], obj: Any, leaf: type | tuple[type, ...] = torch.Tensor) -> Any:
    """Apply ``fn`` to every ``leaf`` (tensors by default) in ``obj``; keep the structure.

    Returns ``obj`` itself where nothing changed, so a hook can tell whether to replace an output.
    """
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        items = [tree_map(fn, v, leaf) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        if isinstance(obj, list):
            return type(obj)(items) if type(obj) is not list else items
        if _is_namedtuple(obj):
            return type(obj)(*items)
        if _is_structseq(obj):
            return type(obj)(items)
        return tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, dict):
        changed = {k: tree_map(fn, v, leaf) for k, v in obj.items()}
        if all(changed[k] is v for k, v in obj.items()):
            return obj
        # a copy keeps the mapping's type (and ModelOutput's attribute/key sync through __setitem__)
        new = copy.copy(obj)
        for k, v in changed.items():
            new[k] = v
        return new
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        changed = {k: tree_map(fn, v, leaf) for k, v in values.items()}
        if all(changed[k] is v for k, v in values.items()):
            return obj
        replaced: Any = copy.copy(obj)
        for k, v in changed.items():
            object.__setattr__(replaced, k, v)  # frozen dataclasses too
        return replaced
    return obj


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in container order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors(getattr(obj, f.name))


def paths(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` with its path (``[0]``, ``.logits``, ``['key']``), as :func:`tensors`.

    Example:
        >>> [p for p, _ in paths({"a": (torch.ones(1), None, torch.ones(1))}, "output")]
        ['output.a[0]', 'output.a[2]']
    """
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        for field, v in zip(getattr(type(obj), "_fields"), obj):
            yield from paths(v, f"{prefix}.{field}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from paths(v, f"{prefix}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier() else f"{prefix}[{k!r}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from paths(getattr(obj, f.name), f"{prefix}.{f.name}")


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in ``obj`` or ``None``."""
    return next(tensors(obj), None)
