"""The safetensors format, written and read by our own code: the dtype table, a shard's header encoded
and parsed (every field checked), and the raw bytes of a tensor without a copy.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (padded with spaces to a
multiple of 8), then the tensors' raw little-endian bytes back to back, in the order of their offsets.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from ..errors import HookscopeError

__all__ = ["CODES", "DTYPES", "Entry", "Header", "code_of", "storable", "encode_header", "raw_bytes",
           "parse_header", "numpy_dtype"]

CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
"""torch dtype -> safetensors dtype code, for every dtype a store holds."""

DTYPES: dict[str, torch.dtype] = {v: k for k, v in CODES.items()}

_NUMPY: dict[torch.dtype, Any] = {
    torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
    torch.bfloat16: np.uint16,  # numpy has no bfloat16: read the bits, view them in torch
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}
_MAX_HEADER = 100_000_000  # the reference reader's own limit
if sys.byteorder != "little":  # pragma: no cover - the format is little-endian and we write raw memory
    raise ImportError("hookscope.store writes raw little-endian bytes; this machine is big-endian")


def storable(dtype: torch.dtype) -> bool:
    """Whether a store can hold values of ``dtype`` (complex, float8 and unsigned ints wider than 8 bits: no).

    Example:
        >>> storable(torch.bfloat16), storable(torch.complex64), storable(torch.uint16)
        (True, False, False)
    """
    return dtype in CODES


def code_of(dtype: torch.dtype, what: str) -> str:
    """The safetensors code of ``dtype``, or a one-line refusal naming ``what`` holds it.

    Example:
        >>> code_of(torch.bfloat16, "x")
        'BF16'
    """
    if dtype not in CODES:
        known = ", ".join(str(d).removeprefix("torch.") for d in CODES)
        raise HookscopeError(f"{what} has dtype {str(dtype).removeprefix('torch.')}, which a store cannot hold; "
                             f"cast it to one of {known}")
    return CODES[dtype]


def numpy_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype the bytes of ``dtype`` are read as (``uint16`` for bfloat16).

    Example:
        >>> numpy_dtype(torch.bfloat16)
        <class 'numpy.uint16'>
    """
    return _NUMPY[dtype]


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: dtype, shape, and byte range inside the data section."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A parsed header: where the data starts, each tensor, and the metadata."""

    data_start: int
    tensors: dict[str, Entry]
    metadata: dict[str, str]


def encode_header(entries: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                  metadata: Mapping[str, str]) -> tuple[bytes, list[str]]:
    """The header bytes (length prefix included) and the order the tensors' bytes must follow.

    Tensors are laid out by decreasing item size (as the reference writer does), so that each one starts at
    a multiple of its item size and can be memory-mapped aligned.

    Example:
        >>> head, order = encode_header([("a", torch.int8, [3]), ("b", torch.float32, [2])], {"k": "v"})
        >>> order, len(head) % 8, json.loads(head[8:])["a"]
        (['b', 'a'], 0, {'dtype': 'I8', 'shape': [3], 'data_offsets': [8, 11]})
    """
    order = sorted(range(len(entries)), key=lambda i: -entries[i][1].itemsize)
    doc: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for i in order:
        name, dtype, shape = entries[i]
        size = math.prod(shape) * dtype.itemsize
        doc[name] = {"dtype": code_of(dtype, repr(name)), "shape": [int(s) for s in shape],
                     "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, [entries[i][0] for i in order]


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (also for 0-d, empty and bfloat16 tensors).

    Example:
        >>> bytes(raw_bytes(torch.tensor(1, dtype=torch.int16)))
        b'\\x01\\x00'
    """
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data.cast("B")


def _entry(path: Path, name: str, spec: Any) -> Entry:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"tensor {name!r} is not described by dtype, shape and data_offsets")
    shape, offsets = spec["shape"], spec["data_offsets"]
    if spec["dtype"] not in DTYPES:
        raise ValueError(f"tensor {name!r} has an unknown dtype {spec['dtype']!r}")
    if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
        raise ValueError(f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise ValueError(f"tensor {name!r} has invalid data_offsets {offsets!r}")
    dtype = DTYPES[spec["dtype"]]
    if offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"tensor {name!r}: data_offsets {offsets} do not hold shape {shape} of {spec['dtype']}")
    return Entry(dtype, tuple(shape), offsets[0], offsets[1])


def _decode(raw: bytes, size: int, path: Path) -> Header:
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("the header is not a JSON object")
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ is not a map of strings")
    tensors = {name: _entry(path, name, spec) for name, spec in doc.items()}
    at = 0
    for name, e in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != at:
            raise ValueError(f"tensor {name!r} starts at byte {e.begin} of the data, expected {at}")
        at = e.end
    if 8 + len(raw) + at != size:
        raise ValueError(f"the header describes {8 + len(raw) + at} bytes but the file holds {size}")
    return Header(8 + len(raw), tensors, meta)


def parse_header(f: BinaryIO, size: int, path: Path) -> Header:
    """Read and check the header of an open safetensors file of ``size`` bytes; one-line refusals name ``path``.

    Example:
        >>> import io
        >>> head, _ = encode_header([("a", torch.int8, [3])], {})
        >>> parse_header(io.BytesIO(head + b"abc"), len(head) + 3, Path("f")).tensors["a"].shape
        (3,)
    """
    prefix = f.read(8)
    try:
        if len(prefix) < 8:
            raise ValueError(f"the file holds {size} bytes, fewer than a header")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(_MAX_HEADER, size - 8):
            raise ValueError(f"the header length {n} is larger than the file")
        raw = f.read(n)
        if not raw.startswith(b"{"):
            raise ValueError("the header is not a JSON object")
        return _decode(raw, size, path)
    except RecursionError:  # json gives up on a header nested thousands deep: corrupted, not a crash
        raise HookscopeError(f"{path} is not a valid shard (its header is nested too deeply): the file is "
                             "corrupted; delete it and write it again") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise HookscopeError(f"{path} is not a valid shard ({_first(e)}): the file is truncated or corrupted; "
                             "delete it and write it again") from None


def _first(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
