"""A recording on disk and back: its calls as JSON trees naming tensors, the tensors in one safetensors shard.

Written and read through :func:`hookscope.store.save_tensors` / :func:`~hookscope.store.load_tensors`
(kind ``"recording"``); nothing is pickled. Each kept field of each call is a tree of nodes:
``null``, ``{"tensor": name}``, ``{"tuple": [...]}``, ``{"list": [...]}``, ``{"dict": [[key, value], ...]}``,
``{"namedtuple": type name, "fields": [...], "items": [...]}``, or a plain value (``{"int": 3}``,
``{"float": hex}``, ``{"str": ...}``, ``{"bool": ...}``, ``{"size": [...]}``, ``{"dtype": "float32"}``).
Dataclasses, ``ModelOutput`` and other objects become dicts of their fields (``"was"`` names the type).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ._tree import attributes
from .core.guard import Slot
from .errors import HookscopeError, MutationError, RecordError

__all__ = ["FIELDS", "KIND", "Decoder", "save_recording", "read_recording"]

KIND = "recording"
_SCALARS = {"bool": bool, "int": int, "str": str}
FIELDS = ("input", "output", "grad_output", "grad_input")
_STORABLE = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                       torch.int16, torch.int8, torch.uint8, torch.bool})  # the store's dtypes (safetensors codes)


class _Writer:
    """Names each tensor of the trees it encodes (one name per tensor object) and collects them."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}
        self._alive: list[torch.Tensor] = []  # the tensors named: no id() reused while saving

    def tensor(self, t: torch.Tensor, where: str) -> dict[str, Any]:
        name = self._names.get(id(t))
        if name is None:
            if t.dtype not in _STORABLE or t.layout is not torch.strided or t.is_meta:
                what = f"dtype {str(t.dtype).removeprefix('torch.')}" if t.dtype not in _STORABLE else (
                    "no data (meta)" if t.is_meta else f"layout {t.layout}")
                raise RecordError(f"cannot save {where}: a tensor with {what} has no file form; a store holds "
                                  "dense tensors of float64/32/16, bfloat16, int64/32/16/8, uint8 and bool")
            name = self._names[id(t)] = f"t{len(self._names)}"
            self.tensors[name] = t.detach()
            self._alive.append(t)
        return {"tensor": name}

    def node(self, obj: Any, where: str, depth: int = 0) -> Any:
        """``obj`` as a JSON tree node; a value with no file form is refused naming ``where``."""
        if obj is None:
            return None
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, where)
        if isinstance(obj, (bool, int, str)):  # an enum or flag is saved as its plain value
            kind = _base(obj)
            return {kind: _SCALARS[kind](obj)}
        if isinstance(obj, float):
            return {"float": float(obj).hex()}
        if isinstance(obj, torch.Size):
            return {"size": list(obj)}
        if isinstance(obj, torch.dtype):
            return {"dtype": str(obj).removeprefix("torch.")}
        fields = _tuple_fields(obj)
        if fields is not None:
            return {"namedtuple": type(obj).__name__, "fields": list(fields),
                    "items": [self.node(v, f"{where}.{f}", depth) for f, v in zip(fields, obj)]}
        if isinstance(obj, (tuple, list, collections.deque)):
            kind = "tuple" if isinstance(obj, tuple) else "list"
            return {kind: [self.node(v, f"{where}[{i}]", depth) for i, v in enumerate(obj)]}
        return self._mapping(obj, where, depth)

    def _mapping(self, obj: Any, where: str, depth: int) -> Any:
        if isinstance(obj, dict):
            items, was = dict(obj), None if type(obj) is dict else type(obj).__name__
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            items, was = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, type(obj).__name__
        elif (attrs := attributes(obj, depth)) is not None:
            items, was, depth = attrs, type(obj).__name__, depth + 1
        else:
            raise RecordError(f"cannot save {where}: it holds a {type(obj).__name__}, which has no file form "
                              "(tensors, numbers, strings, None, tuples, lists, dicts and objects of those do); "
                              "capture modules whose records hold those, or save the tensors yourself")
        pairs = [[self._key(k, where), self.node(v, f"{where}[{k!r}]", depth)] for k, v in items.items()]
        return {"dict": pairs, **({"was": was} if was else {})}

    def _key(self, key: Any, where: str) -> Any:
        if key is None or isinstance(key, (bool, int, float, str)):
            return self.node(key, where)
        raise RecordError(f"cannot save {where}: it has a dict key of type {type(key).__name__}; keys must be "
                          "str, int, float, bool or None")


def _base(obj: Any) -> str:
    """The plain type an ``int`` / ``str`` subclass (an enum, a flag) is saved as."""
    return "bool" if isinstance(obj, bool) else "int" if isinstance(obj, int) else "str"


def _tuple_fields(obj: Any) -> Sequence[str] | None:
    """Field names of a named tuple or a ``torch.return_types`` struct sequence, else ``None``."""
    if not isinstance(obj, tuple):
        return None
    fields = getattr(type(obj), "_fields", None)
    if fields is None and hasattr(type(obj), "n_fields"):
        fields = getattr(type(obj), "__match_args__", None)
    return tuple(fields) if fields is not None and len(fields) == len(obj) else None


def _field(call: Any, field: str, w: _Writer) -> dict[str, Any]:
    """One kept field of a call: ``{"value": node}``, ``{"raised": true}`` or ``{"error": [class, message]}``."""
    where = f"the {field} of {call.name!r} (call {call.index})"
    try:
        if field == "output" and not call.returned:
            return {"raised": True}
        if field == "input":
            return {"value": {"args": w.node(call.args, where), "kwargs": w.node(call.kwargs, where)}}
        value = call.output if field == "output" else call.grad_output if field == "grad_output" else call.grad_args
        return {"value": w.node(value, where)}
    except MutationError as e:
        return {"error": ["MutationError", str(e)]}
    except RecordError as e:
        if str(e).startswith(f"cannot save {where}"):
            raise
        return {"error": ["RecordError", str(e)]}


def save_recording(selected: Sequence[str], aliases: Mapping[str, str], keep: frozenset[str],
                   calls: Sequence[Any], path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write a recording's calls (:class:`~hookscope.CallRecord` objects) to the folder ``path`` (see
    :meth:`hookscope.Recording.save`).

    Example:
        >>> import tempfile
        >>> from hookscope.records import CallRecord
        >>> call = CallRecord("lin", 0); call.set_output((torch.ones(2), None))
        >>> out = save_recording(["lin"], {}, frozenset({"output"}), [call], tempfile.mkdtemp() + "/r")
        >>> rows, decoder = read_recording(out)[3:]
        >>> rows[0]["name"], decoder.node(rows[0]["fields"]["output"]["value"])[0].get()
        ('lin', tensor([1., 1.]))
    """
    from .store import save_tensors

    w = _Writer()
    wanted = [f for f in FIELDS if f in keep]
    try:
        rows = [{"name": c.name, "index": c.index, "fields": {f: _field(c, f, w) for f in wanted}} for c in list(calls)]
    except RecursionError:
        raise RecordError("cannot save this recording: a kept value is nested too deeply to write; keep a "
                          "flatter output (at= or a layer inside)") from None
    info = {"kind": KIND, "recording": {"selected": list(selected), "aliases": dict(aliases),
                                        "keep": sorted(keep), "calls": rows}}
    return save_tensors(path, w.tensors, info, overwrite=overwrite)


def _typed(value: Any, kind: type, node: str) -> Any:
    """``value`` if it has the JSON type a ``node`` holds (a bool is no int), else a ValueError for the loader."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"a {node!r} node holds {type(value).__name__}")
    return value


class Decoder:
    """Rebuilds trees of :class:`~hookscope.core.guard.Slot` from the nodes a saved recording holds.

    Example:
        >>> Decoder({"t0": torch.ones(1)}).node({"tuple": [{"tensor": "t0"}, None]})[0].get()
        tensor([1.])
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.where: Any = ""  # (field, name, call index) of the slots made, for their messages

    def node(self, n: Any) -> Any:
        """The value (slots for tensors) a node stands for."""
        if n is None:
            return None
        (kind, value), *rest = n.items()
        if kind == "tensor":
            return Slot(self.tensors[value], "copied", self.where)
        if kind in _SCALARS:
            return _SCALARS[kind](_typed(value, _SCALARS[kind], kind))
        if kind == "float":
            return float.fromhex(_typed(value, str, kind))
        if kind == "size":
            return torch.Size([_typed(v, int, kind) for v in _typed(value, list, kind)])
        if kind == "dtype":
            dtype = getattr(torch, _typed(value, str, kind), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{value!r} is not a torch dtype")
            return dtype
        if kind == "namedtuple":
            cls = collections.namedtuple(value, n["fields"])  # type: ignore[misc]  # a stand-in of the type
            return cls(*[self.node(v) for v in n["items"]])
        if kind in ("tuple", "list"):
            items = [self.node(v) for v in _typed(value, list, kind)]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {self.node(k): self.node(v) for k, v in _typed(value, list, kind)}
        raise ValueError(kind)


def read_recording(path: str | os.PathLike[str]) -> tuple[list[str], dict[str, str], list[str],
                                                          list[dict[str, Any]], Decoder]:
    """(selected, aliases, keep, the saved calls, their decoder) of a recording :func:`save_recording` wrote.

    Example:
        >>> import tempfile
        >>> out = save_recording(["a"], {}, frozenset({"output"}), [], tempfile.mkdtemp() + "/r")
        >>> read_recording(out)[:4]
        (['a'], {}, ['output'], [])
    """
    from .store import load_tensors, read_manifest

    manifest = read_manifest(path)
    where = Path(path) / "manifest.json"
    if manifest.get("kind") != KIND:
        what = "an extract store" if manifest.get("kind") == "samples" else f"a store of kind {manifest.get('kind')!r}"
        raise HookscopeError(f"{path} is {what}; open it with hookscope.open_store")
    tensors, manifest = load_tensors(path)
    try:
        doc = manifest["recording"]
        calls = [dict(c) for c in doc["calls"]]
        return [str(s) for s in doc["selected"]], dict(doc["aliases"]), list(doc["keep"]), calls, Decoder(tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HookscopeError(f"{where} does not describe a saved recording ({type(e).__name__}: {e}); "
                             "save the recording again") from None

