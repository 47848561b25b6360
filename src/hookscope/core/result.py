"""The protocol every result object speaks, and the JSON form of what results hold.

``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)``, and ``rows`` where the result
is tabular; lookups by name raise :class:`~hookscope.RecordError` (a ``KeyError``) with the
closest names, and ``in`` agrees with ``[]``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import RecordError, did_you_mean
from .text import dtype_text

__all__ = ["Result", "jsonable", "missing"]


def jsonable(obj: Any) -> Any:
    """``obj`` made of JSON types: dataclasses and mappings as dicts, tuples as lists, NaN and
    infinities as ``"nan"``/``"inf"``/``"-inf"``, tensors as nested lists, dtypes and devices as text.

    Example:
        >>> jsonable({"x": float("inf"), "shape": (1, 2), "dtype": torch.float32, "t": torch.ones(2)})
        {'x': 'inf', 'shape': [1, 2], 'dtype': 'float32', 't': [1.0, 1.0]}
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        return jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, torch.dtype):
        return dtype_text(obj)
    if isinstance(obj, (torch.device, torch.Size)):
        return str(obj) if isinstance(obj, torch.device) else list(obj)
    if isinstance(obj, enum.Enum):
        return jsonable(obj.value)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Iterable):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return jsonable(obj.item())
    return str(obj)


def missing(name: object, what: str, known: Iterable[str]) -> RecordError:
    """The error for a lookup that found nothing: names the closest known names.

    Example:
        >>> str(missing("layer1.0.conv3", "layer", ["layer1.0.conv1", "layer1.0.conv2"]))
        "no layer 'layer1.0.conv3' in this result. Did you mean 'layer1.0.conv2', 'layer1.0.conv1'?"
    """
    names = list(known)
    hint = did_you_mean(str(name), names) if isinstance(name, str) else ""
    if not hint:
        shown = ", ".join(repr(n) for n in names[:5]) or "none"
        hint = f" It has: {shown}{', ...' if len(names) > 5 else ''}."
    return RecordError(f"no {what} {name!r} in this result.{hint}")


class Result:
    """Base of every result: subclasses give :meth:`table` and :meth:`to_dict`; the rest follows.

    Example:
        >>> class Two(Result):
        ...     def table(self) -> str: return "a  1"
        ...     def to_dict(self) -> dict: return {"a": 1.0, "b": float("nan")}
        >>> str(Two()), Two().to_json()
        ('a  1', '{"a": 1.0, "b": "nan"}')
    """

    def table(self) -> str:
        """The result as a text table (also ``str(result)``)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The result as plain Python data (JSON-safe after :func:`jsonable`)."""
        raise NotImplementedError

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON text (NaN and infinities written as strings)."""
        return json.dumps(jsonable(self.to_dict()), indent=indent, allow_nan=False)

    def __str__(self) -> str:
        return self.table()
