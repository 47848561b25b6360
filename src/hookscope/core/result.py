"""The protocol every result object speaks, and the JSON form of what results hold.

``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)``, ``to_pandas()``, an HTML
form for notebooks (``_repr_html_``: the rows as a table, and the result's picture where the viz
layer registered one with :func:`register_picture`), and ``rows`` where the result is tabular;
lookups by name raise :class:`~hookscope.RecordError` (a ``KeyError``) with the closest names, and
``in`` agrees with ``[]``.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import html
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HookscopeError, RecordError, did_you_mean
from .text import cell_text, dtype_text, html_table

if TYPE_CHECKING:
    import pandas

__all__ = ["HTML_ROWS", "Result", "as_record", "jsonable", "missing", "picture_of", "register_picture"]

HTML_ROWS = 40
"""A notebook shows at most this many rows of a result: the first half and the last half
(``to_pandas()`` and ``rows`` have them all)."""

Drawer = Callable[[Any], "bytes | None"]
_DRAWERS: dict[type, Drawer] = {}


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


def register_picture(kind: type, draw: Drawer) -> None:
    """Show ``draw(result)`` (PNG bytes, or ``None`` for no picture) under the table of every result
    of type ``kind``, or of a subclass, in a notebook.

    The viz layer registers its pictures when it is imported (``import hookscope`` imports it): this
    layer cannot import the one above it, so it is told.

    Example:
        >>> class Dot(Result):
        ...     def table(self) -> str: return "dot"
        ...     def to_dict(self) -> dict: return {}
        >>> register_picture(Dot, lambda result: b"\\x89PNG")
        >>> picture_of(Dot())
        b'\\x89PNG'
    """
    _DRAWERS[kind] = draw


def picture_of(result: object) -> bytes | None:
    """The PNG registered for ``result``'s type (the nearest in its method resolution order), or
    ``None`` where there is none or it cannot be drawn here (matplotlib missing).

    Example:
        >>> picture_of(object()) is None
        True
    """
    for kind in type(result).__mro__:
        draw = _DRAWERS.get(kind)
        if draw is not None:
            try:
                return draw(result)
            except (ImportError, HookscopeError):  # the viz extra missing: the table still shows
                return None
    return None


def as_record(row: Any) -> dict[str, Any]:
    """One row as a dict: a dataclass's fields (values as they are, not copied), a mapping's items,
    a named tuple's fields, anything else as ``{"value": row}``.

    Example:
        >>> @dataclasses.dataclass
        ... class Row:
        ...     name: str
        ...     shape: tuple
        >>> as_record(Row("fc", (2, 3))), as_record({"a": 1}), as_record(7)
        ({'name': 'fc', 'shape': (2, 3)}, {'a': 1}, {'value': 7})
    """
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    if isinstance(row, Mapping):
        return {str(k): v for k, v in row.items()}
    if isinstance(row, tuple) and hasattr(row, "_asdict"):
        return dict(row._asdict())
    return {"value": row}


def _tensor_record(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {"name": name, "shape": tuple(value.shape), "dtype": dtype_text(value.dtype)}
    return {"name": name, "value": value}


def _columns(records: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in records for k in r))


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

    # the columns of a result with no rows yet (a trace before its first pass): its rows' fields
    _result_fields: tuple[str, ...] = ()
    # the columns a notebook shows, where a row holds more than a reader scans (None: every field)
    _html_columns: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return self.table()

    def _result_records(self) -> list[dict[str, Any]]:
        """The rows as dicts, what :meth:`to_pandas` and the notebook table hold: ``rows``, else
        ``to_dict()["rows"]``, else one row per name for a result that maps names to values. A
        result of another form gives its own."""
        rows = getattr(self, "rows", None)
        if rows is None and isinstance(self, Mapping):
            return [_tensor_record(str(k), v) for k, v in self.items()]
        if rows is None:
            rows = self.to_dict().get("rows")
        if rows is None:
            raise HookscopeError(f"{type(self).__name__} has no rows to make a table of; use to_dict()")
        return [as_record(r) for r in rows]

    def to_pandas(self) -> pandas.DataFrame:
        """The rows as a :class:`pandas.DataFrame`, one column per field of a row, values as the rows
        hold them (pandas is the ``pandas`` extra: ``pip install 'hookscope[pandas]'``).

        Example:
            >>> class Two(Result):
            ...     rows = [{"layer": "fc", "zeros": 0.5}, {"layer": "conv", "zeros": 0.25}]
            ...     def table(self) -> str: return ""
            ...     def to_dict(self) -> dict: return {"rows": self.rows}
            >>> Two().to_pandas()
              layer  zeros
            0    fc   0.50
            1  conv   0.25
        """
        try:
            import pandas
        except ImportError:
            raise HookscopeError("to_pandas() needs pandas, from the pandas extra: "
                                 "pip install 'hookscope[pandas]'") from None
        records = self._result_records()
        return pandas.DataFrame.from_records(records, columns=_columns(records) or list(self._result_fields))

    def _repr_html_(self) -> str:
        """What a notebook shows: the rows as an HTML table (at most :data:`HTML_ROWS`), then the
        result's picture where one is registered; a result without rows shows its text table."""
        name = type(self).__name__
        try:
            records = self._result_records()
        except HookscopeError:
            return f'<pre class="hookscope">{html.escape(self.table())}</pre>'
        shown: list[dict[str, Any] | None] = list(records)
        caption = f"{name}: {len(records)} row{'s' if len(records) != 1 else ''}"
        if len(records) > HTML_ROWS:
            half = HTML_ROWS // 2
            shown = [*records[:half], None, *records[-half:]]
            caption += f", the first {half} and the last {half} shown"
        columns = _columns(records) or list(self._result_fields)
        columns = [c for c in self._html_columns or () if c in columns] or columns
        body = [["..."] * len(columns) if r is None else [cell_text(r.get(c)) for c in columns] for r in shown]
        text_columns = {i for i, c in enumerate(columns) if any(isinstance(r.get(c), str) for r in records)}
        parts = [html_table(columns, body, caption=caption, left=text_columns)]
        png = picture_of(self)
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(name)}">')
        return '<div class="hookscope">\n' + "\n".join(parts) + "\n</div>"
