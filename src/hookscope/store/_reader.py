"""A store read lazily: per-layer arrays memory-mapped from the shards, indexed like tensors, and every file
checked against the manifest (sizes, headers, shapes and dtypes when opened; crc32 on a shard's first read).

Every read returns a tensor of its own, so writing into one (``x -= x.mean(0)``, ``x.relu_()``) changes neither
the file nor any other read: small reads are copied, large reads of one shard are a private copy-on-write
mapping of the file made for that read (no copy; the pages are read from the file when first touched).
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.result import Result, missing
from ..core.text import dtype_text, num, shape_text, table
from ..errors import HookscopeError, checked
from ._files import CRC_KEY, SHARD, open_regular, read_manifest, read_shard
from ._format import CODES, Header, numpy_dtype, parse_header

__all__ = ["open_store", "Store", "LayerArray"]

_DTYPES = {dtype_text(d): d for d in CODES}
_AGAIN = "run the extract again with overwrite=True (--overwrite)"
_MAPPED = 64
_COPY_BELOW = 1 << 20  # bytes: a smaller read is copied (cheaper than a new mapping, and no mapping per tensor)
Index = int | slice | Sequence[int] | torch.Tensor | np.ndarray | tuple[Any, ...]


@dataclass
class _Shard:
    path: Path
    start: int  # the store's row of its first row
    count: int
    header: Header
    crc32: int
    size: int
    ident: tuple[int, int]  # (st_dev, st_ino) when opened: a file replaced since then is refused, not misread
    verified: bool = False


class _Shards:
    """The shards of one store, each memory-mapped read-only on first use (crc32 checked then); reads copy out
    of these maps (never hand them out) or map the file privately for one tensor (:meth:`private`).

    At most ``_MAPPED`` shards stay mapped by the store (each map holds a file descriptor).
    """

    def __init__(self, root: Path, shards: list[_Shard], verify: bool) -> None:
        self.root, self.shards, self.verify = root, shards, verify
        self.starts = np.array([s.start for s in shards], dtype=np.int64)
        self.rows = sum(s.count for s in shards)
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def array(self, k: int, name: str) -> np.ndarray:
        """Tensor ``name`` of shard ``k`` as a read-only numpy array over the store's map (bf16 as uint16)."""
        e = self.shards[k].header.tensors[name]
        dtype = numpy_dtype(e.dtype)
        if e.end == e.begin:
            return np.empty(e.shape, dtype=dtype)
        with self._lock:
            whole = self._maps.get(k)
            if whole is None:
                whole = self._maps[k] = self._map(k)
                while len(self._maps) > _MAPPED:
                    self._maps.popitem(last=False)
            self._maps.move_to_end(k)
        start = self.shards[k].header.data_start
        out: np.ndarray = whole[start + e.begin:start + e.end].view(dtype).reshape(e.shape)
        return out

    def _map(self, k: int) -> np.ndarray:
        s = self.shards[k]
        if self.verify and not s.verified:
            got = read_shard(s.path)
            if got.crc32 != s.crc32:
                raise HookscopeError(f"{s.path} is corrupted: its crc32 is {got.crc32} but "
                                     f"{self.root / 'manifest.json'} says {s.crc32}; {_AGAIN} (or "
                                     "open_store(..., verify=False) to read it anyway)")
            damage = got.damage() if CRC_KEY in got.header.metadata else None  # older shards carry none
            if damage is not None:
                raise HookscopeError(f"{s.path} is corrupted: {damage}; {_AGAIN} (or open_store(..., verify=False) "
                                     "to read it anyway)")
            s.verified = True
        with open_regular(s.path) as f:  # read-only: nothing of this map is handed out, reads copy from it
            self._same(k, os.fstat(f.fileno()))
            return np.memmap(f, dtype=np.uint8, mode="r")

    def _same(self, k: int, st: os.stat_result) -> None:
        s = self.shards[k]
        if (st.st_dev, st.st_ino) != s.ident:
            raise HookscopeError(f"{s.path} was replaced since the store was opened (another run wrote it); open "
                                 "the store again")

    def private(self, k: int, name: str) -> torch.Tensor:
        """Tensor ``name`` of shard ``k`` over a private copy-on-write map of the file, for one read alone.

        ``torch.from_file(shared=False)`` maps with ``MAP_PRIVATE`` and closes its file descriptor at once, so
        writes into the tensor stay in it and many live tensors hold no descriptors. Call :meth:`array` first
        (it checks the crc32).
        """
        s = self.shards[k]
        e = s.header.tensors[name]
        self._same(k, os.stat(s.path))
        whole = torch.from_file(str(s.path), shared=False, size=s.size, dtype=torch.uint8)
        return whole[s.header.data_start + e.begin:s.header.data_start + e.end].view(e.dtype).reshape(e.shape)

    def index(self, k: int) -> np.ndarray:
        """The dataset indices of shard ``k``, checked: strictly increasing, and above the previous shard's."""
        rows = self.array(k, "__index__")
        after = -1
        for j in range(k - 1, -1, -1):  # the last row of the nearest earlier shard that has rows
            if self.shards[j].count:
                after = int(self.array(j, "__index__")[-1])
                break
        steps = np.diff(np.concatenate([np.array([after], dtype=np.int64), rows]))
        if steps.size and steps.min() <= 0:
            at = int(np.argmax(steps <= 0))
            raise HookscopeError(f"{self.shards[k].path} holds dataset indices that are not strictly increasing "
                                 f"(row {at}: {int(rows[at])} after {after if at == 0 else int(rows[at - 1])}): "
                                 f"the file is corrupted; {_AGAIN}")
        return rows


def _rows(index: Any, n: int) -> np.ndarray:
    """A list/tensor/array index as row numbers in ``[0, n)`` (negatives counted from the end)."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    rows = np.asarray(index)
    if rows.dtype == np.bool_:
        if rows.shape != (n,):
            raise IndexError(f"a boolean index must have shape ({n},), got {rows.shape}")
        return np.nonzero(rows)[0].astype(np.int64)
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise IndexError(f"index rows with an int, a slice, or a 1-D sequence of ints; got {rows.dtype} {rows.shape}")
    rows = rows.astype(np.int64)
    bad = rows[(rows < -n) | (rows >= n)]
    if bad.size:
        raise IndexError(f"row {int(bad[0])} is out of range for {n} rows")
    return np.where(rows < 0, rows + n, rows)


class LayerArray:
    """One stored array across every shard: ``shape`` is ``(rows, *per_sample)``; indexing returns tensors.

    Every read returns the stored values in a tensor of its own, which may be written into freely: rows of one
    shard under 1 MiB are copied, larger ones are a private copy-on-write mapping of the file (no copy); an
    index that spans shards, or a list of rows, gathers them into a new tensor.

    Example:
        >>> import tempfile
        >>> from ._writer import ArraySpec, StoreWriter
        >>> from ._files import write_json
        >>> d = tempfile.mkdtemp()
        >>> with StoreWriter(d, [ArraySpec("a", (2,), torch.float32)], 4) as wr:
        ...     for k in range(2):
        ...         b = wr.buffer(); b.arrays["a"][:] = torch.arange(8.).view(4, 2) + 8 * k
        ...         b.index[:] = torch.arange(4) + 4 * k; wr.submit(k, b, 4)
        ...     infos = wr.close()
        >>> write_json(f"{d}/manifest.json", {"schema_version": 1, "kind": "samples", "complete": True,
        ...     "arrays": [{"name": "a", "shape": [2], "dtype": "float32"}], "samples": {"count": 8},
        ...     "shards": [i.to_dict() for i in infos]})
        >>> arr = open_store(d)["a"]
        >>> arr.shape, arr[-1].tolist(), arr[3:5].tolist(), arr[[6, 0]][:, 0].tolist()
        ((8, 2), [14.0, 15.0], [[6.0, 7.0], [8.0, 9.0]], [12.0, 0.0])
    """

    def __init__(self, name: str, per: tuple[int, ...], dtype: torch.dtype, shards: _Shards,
                 info: Mapping[str, Any]) -> None:
        self.name, self.dtype, self._shards, self.info = name, dtype, shards, dict(info)
        self.shape: tuple[int, ...] = (shards.rows, *per)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"LayerArray({self.name!r}, shape={self.shape}, dtype={dtype_text(self.dtype)})"

    def _torch(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if self.dtype == torch.bfloat16 else t

    def _own(self, k: int, start: int, stop: int, step: int = 1) -> torch.Tensor:
        """Rows ``start:stop:step`` (of shard ``k``) in a tensor of their own: a copy when small, else a view of
        a private map of the file made for this read."""
        part = self._shards.array(k, self.name)[start:stop:step]
        if part.nbytes < _COPY_BELOW:
            return self._torch(np.array(part))
        return self._shards.private(k, self.name)[start:stop:step]

    def _shard_of(self, row: int) -> int:
        return int(np.searchsorted(self._shards.starts, row, side="right")) - 1

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self.shape[1:]), dtype=numpy_dtype(self.dtype))
        if not len(rows):
            return out
        owner = np.searchsorted(self._shards.starts, rows, side="right") - 1
        for k in np.unique(owner):
            at = np.flatnonzero(owner == k)
            local = rows[at] - self._shards.starts[k]
            data = self._shards.array(int(k), self.name)
            run = len(local) > 1 and bool(np.all(np.diff(local) == 1))
            src = data[local[0]:local[-1] + 1] if run else data[local]  # a run of rows: one read, no index array
            if at[-1] - at[0] + 1 == len(at):
                out[at[0]:at[-1] + 1] = src
            else:
                out[at] = src
        return out

    def __getitem__(self, index: Index) -> torch.Tensor:
        """Rows of the array: an int (one sample), a slice, a list/array/tensor of ints, or a boolean mask;
        a tuple indexes rows with its first item and what they give with the rest (``arr[:, 0]``)."""
        n = len(self)
        if isinstance(index, (torch.Tensor, np.ndarray)) and index.ndim == 0 and index.dtype not in (torch.bool, np.bool_):
            index = int(index.item())
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"row {i} is out of range for {n} rows of {self.name!r}")
            i %= n
            k = self._shard_of(i)
            local = i - int(self._shards.starts[k])
            return self._own(k, local, local + 1).reshape(self.shape[1:])
        if isinstance(index, slice):
            rows = range(*index.indices(n))
            if len(rows) and rows.step > 0 and self._shard_of(rows[0]) == self._shard_of(rows[-1]):
                k = self._shard_of(rows[0])
                start = int(self._shards.starts[k])
                return self._own(k, rows.start - start, rows[-1] - start + 1, rows.step)
            return self._torch(self._gather(np.arange(rows.start, rows.stop, rows.step, dtype=np.int64)))
        if isinstance(index, tuple):  # rows first, then the rest on what they give (arr[:, 0])
            if not index or index[0] is Ellipsis:
                return self[:][index]
            got, rest = self[index[0]], index[1:]
            one = isinstance(index[0], (int, np.integer)) and not isinstance(index[0], bool)
            return got[rest] if one else got[(slice(None), *rest)]
        return self._torch(self._gather(_rows(index, n)))

    def numpy(self, index: Index = slice(None), dtype: Any = None) -> np.ndarray:
        """Rows as a numpy array (``dtype`` converts; bfloat16 arrays need it, numpy has no bfloat16)."""
        t = self[index]
        if self.dtype == torch.bfloat16:
            if dtype is None:
                raise HookscopeError(f"{self.name!r} is bfloat16, which numpy has no dtype for: use "
                                     f"store[{self.name!r}][...] for a torch tensor, or .numpy(..., dtype=np.float32)")
            return t.float().numpy().astype(dtype, copy=False)
        a = t.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def tensor(self) -> torch.Tensor:
        """Every row, as one tensor of its own (a private map of the file when the store has one shard)."""
        return self[:]


def _bad(where: Path, what: str) -> HookscopeError:
    return HookscopeError(f"{where} {what}; {_AGAIN}")


def _arrays(root: Path, m: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...], torch.dtype, dict[str, Any]]]:
    where = root / "manifest.json"
    listed = m.get("arrays")
    if not isinstance(listed, list) or not listed:
        raise _bad(where, "lists no arrays")
    out = []
    for a in listed:
        ok = isinstance(a, dict) and isinstance(a.get("name"), str) and a.get("dtype") in _DTYPES \
            and isinstance(a.get("shape"), list) and all(type(s) is int and s >= 0 for s in a["shape"])
        if not ok:
            raise _bad(where, f"has an invalid array entry {str(a)[:80]}")
        out.append((a["name"], tuple(a["shape"]), _DTYPES[a["dtype"]], a))
    if len({a[0] for a in out}) != len(out) or "__index__" in {a[0] for a in out}:
        raise _bad(where, "lists two arrays of one name (or one named __index__)")
    return out


def _entries(root: Path, m: Mapping[str, Any]) -> list[tuple[Path, int, int, int]]:
    """(path, count, bytes, crc32) of each listed shard, in row order; refuses unlisted shard files."""
    where = root / "manifest.json"
    listed = m.get("shards")
    keys = ("shard", "count", "bytes", "crc32")
    if not isinstance(listed, list) or not all(
            isinstance(e, dict) and all(type(e.get(k)) is int and e[k] >= 0 for k in keys)
            and isinstance(e.get("file"), str) and SHARD.match(Path(e["file"]).name)
            and Path(e["file"]).parent == Path("shards") for e in listed):
        raise _bad(where, "has an invalid 'shards' list")
    for i, e in enumerate(listed):
        if e["shard"] != i or e["file"] != f"shards/{i:06d}.safetensors":
            raise _bad(where, f"lists shard {e['shard']} ({e['file']}) as entry {i}; entry {i} must be shard {i} "
                              f"in shards/{i:06d}.safetensors")
    files = [Path(e["file"]).name for e in listed]
    folder = root / "shards"
    present = sorted(p.name for p in folder.iterdir() if SHARD.match(p.name)) if folder.is_dir() else []
    extra = [f for f in present if f not in set(files)]
    if extra:
        raise HookscopeError(f"{folder / extra[0]} is not listed in {where}: the manifest does not match the shards; "
                             f"{_AGAIN}")
    return [(root / e["file"], e["count"], e["bytes"], e["crc32"]) for e in listed]


def _open_shard(root: Path, path: Path, count: int, size: int) -> tuple[Header, tuple[int, int]]:
    where = root / "manifest.json"
    try:
        with open_regular(path) as f:
            st = os.fstat(f.fileno())
            if st.st_size != size:
                raise HookscopeError(f"{path} holds {st.st_size} bytes but {where} says {size}: the file is truncated "
                                     f"or corrupted; {_AGAIN}")
            return parse_header(f, size, path), (st.st_dev, st.st_ino)
    except FileNotFoundError:
        raise HookscopeError(f"{path} is missing (listed in {where}); {_AGAIN}") from None
    except OSError as e:
        raise HookscopeError(f"cannot read {path} ({e.strerror or e}); check that it is readable") from None


def _match(path: Path, header: Header, count: int, arrays: Sequence[tuple[str, tuple[int, ...], torch.dtype, Any]],
           where: Path) -> None:
    want = {"__index__": (torch.int64, (count,)), **{n: (d, (count, *s)) for n, s, d, _ in arrays}}
    have = {n: (e.dtype, e.shape) for n, e in header.tensors.items()}
    for name in list(want) + [n for n in have if n not in want]:
        if want.get(name) != have.get(name):
            def said(x: tuple[torch.dtype, tuple[int, ...]] | None) -> str:
                return "nothing" if x is None else f"{dtype_text(x[0])} {shape_text(x[1])}"
            raise HookscopeError(f"{path} holds {said(have.get(name))} as {name!r} but {where} says "
                                 f"{said(want.get(name))}: the manifest does not match the shards; {_AGAIN}")


@checked
def open_store(root: str | os.PathLike[str], *, verify: bool = True) -> Store:
    """Open the store in ``root`` for reading, lazily (memory-mapped); every file is checked against the manifest.

    Args:
        root: the store's folder (``out`` of :func:`hookscope.extract`).
        verify: check each shard's crc32 the first time it is read (reads it once in full); ``False`` skips it.

    Example:
        >>> import tempfile
        >>> open_store(tempfile.mkdtemp())
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: .../manifest.json is missing: ...
    """
    path = Path(root)
    m = read_manifest(path)
    where = path / "manifest.json"
    if m["kind"] == "recording":
        raise HookscopeError(f"{path} was written by Recording.save; read it with hookscope.load")
    if m["kind"] != "samples":
        raise HookscopeError(f"{where} holds a store of kind {m['kind']!r}; open_store reads stores of samples "
                             "(hookscope.extract); read this one with hookscope.store.load_tensors")
    if m.get("complete") is not True:
        raise HookscopeError(f"{path} is an unfinished store: run the same extract again with resume=True / --resume")
    arrays = _arrays(path, m)
    shards, start = [], 0
    for file, count, size, crc in _entries(path, m):
        header, ident = _open_shard(path, file, count, size)
        _match(file, header, count, arrays, where)
        shards.append(_Shard(file, start, count, header, crc, size, ident))
        start += count
    samples = m.get("samples")
    if not isinstance(samples, dict) or samples.get("count") != start:
        said = samples.get("count") if isinstance(samples, dict) else None
        raise _bad(where, f"says {said} samples but its shards hold {start}")
    _samples(where, samples, start)
    return Store(path, m, arrays, _Shards(path, shards, verify))


def _samples(where: Path, samples: Mapping[str, Any], rows: int) -> None:
    """Refuse sample ids that are not one string per row, or skipped samples that are not a list of objects."""
    ids, skipped = samples.get("ids"), samples.get("skipped")
    if ids is not None and (not isinstance(ids, list) or len(ids) != rows):
        raise _bad(where, f"lists {len(ids) if isinstance(ids, list) else 'no'} sample ids for {rows} samples")
    if ids is not None and not all(isinstance(i, str) for i in ids):
        bad = next(i for i in ids if not isinstance(i, str))
        raise _bad(where, f"lists a sample id that is not a string ({type(bad).__name__} {str(bad)[:40]})")
    if skipped is not None and (not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped)):
        raise _bad(where, "has a 'samples.skipped' that is not a list of objects")


class Store(Result, Mapping[str, LayerArray]):
    """A store opened by :func:`open_store`: a mapping of layer name -> :class:`LayerArray`, plus the samples.

    ``layers`` (manifest order), ``samples`` (how many), ``indices`` (the dataset index of each row), ``ids``, ``skipped``,
    ``manifest``; ``str(store)`` is a table of the arrays.

    Example:
        >>> Store.__mro__[1].__name__
        'Result'
    """

    def __init__(self, root: Path, manifest: dict[str, Any],
                 arrays: Sequence[tuple[str, tuple[int, ...], torch.dtype, dict[str, Any]]], shards: _Shards) -> None:
        self.root, self.manifest, self._shards = root, manifest, shards
        self._arrays = {n: LayerArray(n, s, d, shards, info) for n, s, d, info in arrays}
        self.layers: tuple[str, ...] = tuple(self._arrays)
        self.skipped: list[dict[str, Any]] = list(manifest["samples"].get("skipped") or [])
        self._indices: torch.Tensor | None = None

    @property
    def samples(self) -> int:
        """The number of samples (rows of every array)."""
        return self._shards.rows

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per array, as in :meth:`table`: name, shape, dtype, reduction, field, MB."""
        return self._summary()

    @property
    def indices(self) -> torch.Tensor:
        """The int64 dataset index of each row (read from the shards on first use), in a tensor of its own."""
        if self._indices is None:
            parts = [self._shards.index(k) for k in range(len(self._shards.shards))]
            self._indices = torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
        return self._indices.clone()

    @property
    def ids(self) -> list[str]:
        """The id of each row: the manifest's sample ids, else the dataset index as text."""
        listed = self.manifest["samples"].get("ids")
        return [str(i) for i in listed] if listed is not None else [str(i) for i in self.indices.tolist()]

    def __getitem__(self, name: str) -> LayerArray:
        if not isinstance(name, str) or name not in self._arrays:
            raise missing(name, "layer", self.layers)
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._arrays

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r}, {self.samples} samples, layers={list(self.layers)})"

    def _summary(self) -> list[dict[str, Any]]:
        return [{"name": a.name, "shape": list(a.shape), "dtype": dtype_text(a.dtype),
                 "reduction": a.info.get("reduction"), "field": a.info.get("field"),
                 "mb": math.prod(a.shape) * a.dtype.itemsize / 1e6} for a in self._arrays.values()]

    def table(self) -> str:
        """One line per array: name, rows x shape, dtype, reduction, MB."""
        body = [[r["name"], shape_text(r["shape"]), r["dtype"], str(r["reduction"] or "-"), num(r["mb"])]
                for r in self._summary()]
        head = f"store {self.root}: {self.samples} samples in {len(self._shards.shards)} shards"
        tail = f"{len(self.skipped)} samples skipped as unreadable" if self.skipped else None
        return "\n".join([head, *table(["array", "rows x shape", "dtype", "reduction", "MB"], body, left={0, 2, 3}),
                          *([tail] if tail else [])])

    def to_dict(self) -> dict[str, Any]:
        """The store's folder, sample count, arrays, shards and skipped samples as plain data."""
        return {"root": str(self.root), "samples": self.samples, "arrays": self._summary(),
                "shards": len(self._shards.shards), "skipped": self.skipped}
