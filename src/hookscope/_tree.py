"""Walk nested module inputs and outputs, keeping the container types.

Handles tensors inside tuples, lists, dicts (and OrderedDict subclasses such as Hugging Face's
``ModelOutput``), named tuples, ``torch.return_types`` struct sequences and dataclasses. ``None`` and
every other object pass through untouched.
"""

from __future__ import annotations

import collections
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


_OBJECT_DEPTH = 4  # plain objects inside plain objects looked into, at most (a cycle ends there)


def _fields(obj: Any, depth: int) -> dict[str, Any] | None:
    """The attributes of a plain object (``SimpleNamespace``, a simple class) that may hold
    tensors, or ``None`` for anything else: classes, functions, modules, tensors' own types."""
    if depth >= _OBJECT_DEPTH or isinstance(obj, (type, torch.nn.Module, torch.Tensor)) or callable(obj):
        return None
    attrs = dict(getattr(obj, "__dict__", None) or {})
    for k in type(obj).__mro__:  # attributes held in __slots__ too
        slots = getattr(k, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                attrs[name] = getattr(obj, name)
    return attrs or None


def tree_map(fn: Callable[[Any], Any], obj: Any, leaf: type | tuple[type, ...] = torch.Tensor,
             _depth: int = 0) -> Any:
    """Apply ``fn`` to every ``leaf`` (tensors by default) in ``obj``; keep the structure.

    Containers: lists, tuples (named tuples, ``torch.return_types``), dicts (``ModelOutput``),
    dataclasses, and plain objects' attributes (a shallow copy with the new values). Returns
    ``obj`` itself where nothing changed, so a hook can tell whether to replace an output.

    Example:
        >>> from types import SimpleNamespace
        >>> out = tree_map(lambda t: t * 2, SimpleNamespace(h=torch.ones(1), n=3))
        >>> out.h, out.n
        (tensor([2.]), 3)
    """
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, collections.deque):
        new_items = [tree_map(fn, v, leaf, _depth) for v in obj]
        return obj if all(a is b for a, b in zip(new_items, obj)) else collections.deque(new_items, obj.maxlen)
    if isinstance(obj, (list, tuple)):
        items = [tree_map(fn, v, leaf, _depth) for v in obj]
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
        changed = {k: tree_map(fn, v, leaf, _depth) for k, v in obj.items()}
        if all(changed[k] is v for k, v in obj.items()):
            return obj
        # a copy keeps the mapping's type (and ModelOutput's attribute/key sync through __setitem__)
        new = copy.copy(obj)
        for k, v in changed.items():
            new[k] = v
        return new
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        changed = {k: tree_map(fn, v, leaf, _depth) for k, v in values.items()}
        if all(changed[k] is v for k, v in values.items()):
            return obj
        replaced: Any = copy.copy(obj)
        for k, v in changed.items():
            object.__setattr__(replaced, k, v)  # frozen dataclasses too
        return replaced
    attrs = _fields(obj, _depth)
    if attrs is not None:
        new_attrs = {k: tree_map(fn, v, leaf, _depth + 1) for k, v in attrs.items()}
        if all(new_attrs[k] is v for k, v in attrs.items()):
            return obj
        other: Any = copy.copy(obj)
        if other is obj or getattr(other, "__dict__", None) is getattr(obj, "__dict__", other):
            return obj  # a __copy__ that shares its state: never write into the original
        for k, v in new_attrs.items():
            object.__setattr__(other, k, v)  # past any __setattr__ of the class; slots too
        return other
    return obj


def attributes(obj: Any, depth: int = 0) -> dict[str, Any] | None:
    """The attributes through which :func:`tree_map` looks into a plain object (``None`` for
    anything it does not look into); ``depth`` counts the plain objects already gone through.

    Example:
        >>> from types import SimpleNamespace
        >>> attributes(SimpleNamespace(h=1)), attributes(3)
        ({'h': 1}, None)
    """
    return _fields(obj, depth)


def map_exposed(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to the tensors of ``obj`` reached through tuples only (named tuples too),
    keeping the structure: the tensors a new container can stand in for. Lists, dicts,
    dataclasses and objects are returned as they are, contents untouched: the model may hold them
    and change them, so it must get those very containers back.

    Example:
        >>> a, b = torch.ones(1), torch.ones(1)
        >>> lst = [b]
        >>> new = map_exposed(lambda t: t * 2, (a, lst))
        >>> new[0], new[1] is lst, lst[0]
        (tensor([2.]), True, tensor([1.]))
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_exposed(fn, v) for v in obj]
        if all(x is y for x, y in zip(items, obj)):
            return obj
        if _is_namedtuple(obj):
            return type(obj)(*items)
        return tuple(items) if type(obj) is tuple else type(obj)(items)
    return obj


def tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in container order (the containers of :func:`tree_map`)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple, collections.deque)):
        for v in obj:
            yield from tensors(v, _depth)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v, _depth)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors(getattr(obj, f.name), _depth)
    elif (attrs := _fields(obj, _depth)) is not None:
        for v in list(attrs.values()):
            yield from tensors(v, _depth + 1)


def paths(obj: Any, prefix: str = "", _depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` with its path (``[0]``, ``.logits``, ``['key']``), as :func:`tensors`.

    Example:
        >>> [p for p, _ in paths({"a": (torch.ones(1), None, torch.ones(1))}, "output")]
        ['output.a[0]', 'output.a[2]']
    """
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        for field, v in zip(getattr(type(obj), "_fields"), obj):
            yield from paths(v, f"{prefix}.{field}", _depth)
    elif isinstance(obj, (list, tuple, collections.deque)):
        for i, v in enumerate(obj):
            yield from paths(v, f"{prefix}[{i}]", _depth)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier() else f"{prefix}[{k!r}]",
                            _depth)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from paths(getattr(obj, f.name), f"{prefix}.{f.name}", _depth)
    elif (attrs := _fields(obj, _depth)) is not None:
        for k, v in list(attrs.items()):
            yield from paths(v, f"{prefix}.{k}", _depth + 1)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in ``obj`` (depth first, in container order, as :func:`tensors`) or ``None``.

    Example:
        >>> first_tensor({"loss": None, "logits": (torch.ones(2), torch.zeros(1))})
        tensor([1., 1.])
    """
    return next(tensors(obj), None)
