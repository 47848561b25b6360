"""The records of a capture (:class:`Recording`), keyed by qualified name, one record per call.

Must not import: anything of hookscope but ``errors``, ``core``, ``selection`` and ``records``' own
modules (``_saved`` when saving).
"""

from __future__ import annotations

import fnmatch
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.result import Result, jsonable
from ..core.text import table
from ..core.ops import SEP
from ..errors import RecordError, did_you_mean
from ..selection import strip_prefix
from .call import CallRecord
from .layer import LayerRecord

__all__ = ["FIELDS", "CallRow", "Recording"]


@dataclass(frozen=True)
class CallRow:
    """One call of a :class:`Recording` (a row of ``rec.rows``)."""

    index: int
    name: str
    call: int
    input: str
    output: str


FIELDS = ("output", "input", "grad_output", "grad_input")


def _value(call: CallRecord, field: str) -> Any:
    """One field of one call, ``None`` for the output of a call that raised before returning."""
    return None if field == "output" and not call.returned else getattr(call, field)


class Recording(Result, Mapping[str, LayerRecord]):
    """Records of a capture, keyed by qualified name (wrapper prefixes such as ``module.`` accepted).

    ``rec.calls`` lists every call of every selected module in the order the calls started.
    """

    def __init__(self, selected: list[str], aliases: Mapping[str, str] | None = None,
                 keep: Iterable[str] = ("output",)) -> None:
        self.keep: frozenset[str] = frozenset(keep)
        self.selected = tuple(selected)
        self._layers = {n: LayerRecord(n) for n in selected}
        self._aliases = dict(aliases or {})  # another name of a shared module -> the selected one
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()  # DataParallel's replicas add calls from several threads
        self._count = 0  # calls begun so far: the index of the next one
        self.ops_seen: dict[str, list[str]] = {}  # module -> the operations it ran while selected (for hints)

    def _key(self, name: str) -> str:
        key = strip_prefix(name, self._layers.keys() | self._aliases.keys())
        return self._aliases.get(key, key)

    def _add(self, name: str, file: bool = True) -> CallRecord:
        """A record of a call of ``name`` that begins now; ``file=False``: numbered, not kept."""
        with self._lock:  # DataParallel's threads: one index each, listed in the order of the indices
            call = CallRecord(name, self._count)
            self._count += 1
            if file:
                self.calls.append(call)
                if name not in self._layers:  # an operation selected by a glob (h.0::soft*), named as it runs
                    self._layers[name] = LayerRecord(name)
                self._layers[name].calls.append(call)
        return call

    def _adopt(self, call: CallRecord) -> None:
        """File a call rebuilt elsewhere (a saved one); later calls are numbered after it."""
        self.calls.append(call)
        self._layers[call.name].calls.append(call)
        self._count = max(self._count, call.index + 1)

    def __getitem__(self, name: str) -> LayerRecord:
        if not isinstance(name, str):
            raise RecordError(f"records are keyed by layer name (str), not {type(name).__name__}")
        key = self._key(name)
        if key not in self._layers and SEP in key and any(fnmatch.fnmatchcase(key, s) for s in self.selected):
            raise RecordError(f"{key!r} never ran.{self._ops_hint(key)}")
        if key not in self._layers:
            raise RecordError(
                f"{name!r} was not selected in this capture.{did_you_mean(key, self.selected)}"
                f" Selected: {', '.join(repr(s) for s in self.selected[:6])}{', ...' if len(self.selected) > 6 else ''}"
            )
        layer = self._layers[key]
        if not layer.calls:
            if SEP in key:
                raise RecordError(f"{key!r} was selected but never ran.{self._ops_hint(key)}")
            raise RecordError(f"{key!r} was selected but never called; check that the forward pass reaches it")
        return layer

    def _ops_hint(self, key: str) -> str:
        """The closest operations the module of ``key`` ran, or how to list them."""
        module = key.split(SEP)[0]
        ran = [f"{module}{SEP}{label}" for label in self.ops_seen.get(module, ())]
        if not ran:
            return (f" {module or 'The model'!r} ran no operation of its own while selected; list the operations of "
                    "one forward pass with hookscope.ops(model, inputs) or `hookscope layers --ops MODEL`")
        return did_you_mean(key, ran) or f" It ran: {', '.join(ran[:8])}{', ...' if len(ran) > 8 else ''}."

    def __iter__(self) -> Iterator[str]:
        """Names of the modules that were called, in the order of their first call."""
        return iter(dict.fromkeys(c.name for c in self.calls))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self._layers.get(self._key(name), LayerRecord("")).calls)

    def to_dict(self, field: str | None = None, *, all_calls: bool = False) -> dict[str, Any]:
        """A plain ``{name: value}`` dict of one field (``output``, ``input``, ``grad_output``...).

        ``field=None``: the first of output, input, grad_output, grad_input that the capture kept.
        A module called several times gives the list of its calls' values (``all_calls=True``:
        lists for every module); the output of a call that raised is ``None``.

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
            >>> with hookscope.capture(net, keep="input") as rec:
            ...     _ = net(torch.ones(1, 2)); _ = net(torch.ones(1, 2))
            >>> {name: len(values) for name, values in rec.to_dict().items()}
            {'0': 2, '1': 2}
        """
        field = field or next((f for f in FIELDS if f in self.keep), "output")
        layers = {n: self._layers[n].calls for n in self}
        if all_calls:
            return {n: [_value(c, field) for c in calls] for n, calls in layers.items()}
        return {n: _value(calls[0], field) if len(calls) == 1 else [_value(c, field) for c in calls]
                for n, calls in layers.items()}

    @property
    def rows(self) -> list[CallRow]:
        """One row per call, in the order calls started: name, call number, what was kept."""
        seen: dict[str, int] = {}
        out = []
        for c in list(self.calls):
            seen[c.name] = seen.get(c.name, -1) + 1
            out.append(CallRow(c.index, c.name, seen[c.name], *c.summary()))
        return out

    def table(self) -> str:
        """The calls as a text table (also ``str(rec)``).

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3))
            >>> with hookscope.capture(net, "0", keep="io") as rec:
            ...     _ = net(torch.ones(4, 2))
            >>> print(rec)
            #  module  call  input        output
            ------------------------------------
            0  0          0  4x2 float32  4x3 float32
        """
        body = [[str(r.index), r.name or "(root)", str(r.call), r.input, r.output] for r in self.rows]
        return "\n".join(table(["#", "module", "call", "input", "output"], body, left={1, 3}, pad_last=False))

    def to_json(self, indent: int | None = None, field: str | None = None) -> str:
        """:meth:`to_dict` (of ``field``) as JSON, tensors as nested lists."""
        return json.dumps(jsonable(self.to_dict(field)), indent=indent, allow_nan=False)

    def clear(self) -> None:
        """Forget every record (to reuse one capture over many batches without growing)."""
        with self._lock:
            self.calls.clear()
            self._count = 0
            for layer in self._layers.values():
                layer.calls.clear()

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write every kept call to the folder ``path``; read it back with :func:`hookscope.load`.

        The folder is a store of one safetensors shard and a JSON manifest (no pickle): every call
        of every module in order, with its name, index and the fields kept (input, output,
        gradients), their nesting of tuples, lists, dicts and ``None``, their dtypes, shapes and
        values. Named tuples come back as named tuples of the same name and fields; dataclasses,
        ``ModelOutput`` and other objects come back as dicts of their fields; tensors come back on
        the CPU, detached. A field that cannot be read (a call that raised, a record overwritten
        in place) raises the same error after loading.

        Args:
            path: a folder that does not exist yet or is empty.
            overwrite: replace a store already there (only a store: other folders are refused).

        Returns:
            The folder written.

        Example:
            >>> import tempfile, torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
            >>> with hookscope.capture(net) as rec:
            ...     _ = net(torch.ones(1, 2))
            >>> folder = rec.save(tempfile.mkdtemp() + "/rec")
            >>> again = hookscope.load(folder)
            >>> torch.equal(again["0"].output, rec["0"].output), list(again)
            (True, ['0', '1'])
        """
        from .._saved import save_recording

        return save_recording(self.selected, self._aliases, self.keep, self.calls, path, overwrite=overwrite)

    def __repr__(self) -> str:
        return f"Recording({len(self.selected)} selected, {len(self.calls)} calls)"
