"""Any named tensors as a complete one-shard store (``Recording.save`` uses it), read back whole; and the
hash of a model's weights that a manifest records."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import HookscopeError
from ._files import (SCHEMA_VERSION, SHARD, ShardInfo, clear_store, is_store, open_regular, read_manifest,
                     shard_path, write_json, write_tensors)
from ._format import CODES, code_of, parse_header, raw_bytes
from ._lock import LOCK_NAME

__all__ = ["save_tensors", "load_tensors", "weights_hash", "versions"]

_RESERVED = ("schema_version", "complete", "versions", "tensors", "shards")


def versions() -> dict[str, str]:
    """The versions a manifest records: hookscope, torch and python.

    Example:
        >>> sorted(versions())
        ['hookscope', 'python', 'torch']
    """
    try:
        mine = importlib.metadata.version("hookscope")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
        mine = "unknown"
    return {"hookscope": mine, "torch": torch.__version__, "python": platform.python_version()}


def weights_hash(model: nn.Module) -> str:
    """sha256 (hex) over the model's state_dict: every name, dtype, shape and the bytes of every value.

    Example:
        >>> a = nn.Linear(2, 2); b = nn.Linear(2, 2); b.load_state_dict(a.state_dict())
        <All keys matched successfully>
        >>> weights_hash(a) == weights_hash(b), len(weights_hash(a))
        (True, 64)
    """
    h = hashlib.sha256()
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            h.update(f"{name}|{value!r}\n".encode())
            continue
        h.update(f"{name}|{value.dtype}|{list(value.shape)}\n".encode())
        if value.device.type != "meta":
            t = value.detach().cpu().contiguous()
            h.update(raw_bytes(t.view(torch.uint8) if t.dtype == torch.bool else t))
    return h.hexdigest()


def _prepare(path: Path, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise HookscopeError(f"{path} is a file; give a folder to save into")
    if path.is_dir() and any(p.name != LOCK_NAME for p in path.iterdir()):
        if not overwrite:
            raise HookscopeError(f"{path} is not empty; give a new folder or pass overwrite=True to replace the "
                                 "store in it")
        if not is_store(path):
            raise HookscopeError(f"{path} is not empty and holds no hookscope store, so overwrite=True does not "
                                 "replace it; give a new or empty folder")
        clear_store(path)
    (path / "shards").mkdir(parents=True, exist_ok=True)


def save_tensors(root: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], info: Mapping[str, Any], *,
                 overwrite: bool = False) -> Path:
    """Save named tensors as a complete store of kind ``info["kind"]`` in one shard; returns the folder.

    The manifest is ``{"schema_version", "kind", "complete", "versions", **info, "tensors", "shards"}``;
    the shard is a safetensors file any safetensors reader opens.

    Example:
        >>> import tempfile
        >>> out = save_tensors(tempfile.mkdtemp(), {"a": torch.arange(3)}, {"kind": "demo"}, overwrite=True)
        >>> load_tensors(out)[0]["a"].tolist(), load_tensors(out)[1]["kind"]
        ([0, 1, 2], 'demo')
    """
    if not isinstance(info.get("kind"), str):
        raise HookscopeError("save_tensors needs info['kind'] (a str naming what the store holds)")
    clash = [k for k in info if k in _RESERVED]
    if clash:
        raise HookscopeError(f"info[{clash[0]!r}] is written by save_tensors itself; use another key")
    plain: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise HookscopeError(f"tensor name {name!r} cannot be stored; give non-empty strings other than "
                                 "'__metadata__'")
        if not isinstance(t, torch.Tensor):
            raise HookscopeError(f"{name!r} is a {type(t).__name__}, not a tensor; give tensors")
        code_of(t.dtype, repr(name))
        plain[name] = t.detach().cpu().contiguous()
    path = Path(root)
    _prepare(path, overwrite)
    size, crc = write_tensors(shard_path(path, 0), plain, {"hookscope_kind": str(info["kind"])})
    shard = ShardInfo(0, "shards/000000.safetensors", 1, size, crc)
    write_json(path / "manifest.json", {
        "schema_version": SCHEMA_VERSION, "kind": info["kind"], "complete": True, "versions": versions(), **info,
        "tensors": [{"name": n, "dtype": CODES[t.dtype], "shape": list(t.shape)} for n, t in plain.items()],
        "shards": [shard.to_dict()]})
    return path


def _checked(root: Path, manifest: dict[str, Any]) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """The shard file, its manifest entry and the manifest's tensor list, after the layout checks."""
    where = root / "manifest.json"
    shards, listed = manifest.get("shards"), manifest.get("tensors")
    if manifest.get("complete") is not True or not isinstance(shards, list) or len(shards) != 1 \
            or not isinstance(shards[0], dict) or not isinstance(listed, list):
        raise HookscopeError(f"{where} does not describe a store saved by save_tensors (one shard, a tensor list); "
                             "open it with hookscope.open_store")
    entry = shards[0]
    extra = sorted(p.name for p in (root / "shards").iterdir() if SHARD.match(p.name)
                   and p.name != Path(str(entry.get("file"))).name) if (root / "shards").is_dir() else []
    if extra:
        raise HookscopeError(f"{root / 'shards' / extra[0]} is not listed in {where}; remove it or save again")
    return root / str(entry.get("file")), entry, listed


def load_tensors(root: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and the manifest :func:`save_tensors` wrote (crc32 and manifest checked).

    Example:
        >>> import tempfile
        >>> out = save_tensors(tempfile.mkdtemp(), {"b": torch.ones(2, 0)}, {"kind": "demo"})
        >>> load_tensors(out)[0]["b"].shape
        torch.Size([2, 0])
    """
    path = Path(root)
    manifest = read_manifest(path)
    file, entry, listed = _checked(path, manifest)
    try:
        with open_regular(file) as f:
            size = os.fstat(f.fileno()).st_size
            header = parse_header(f, size, file)
            f.seek(0)
            data = bytearray(size)
            got = f.readinto(data)
    except OSError as e:
        raise HookscopeError(f"{file} cannot be read ({e.strerror or e}); it is listed in {path / 'manifest.json'}, "
                             "save the store again") from None
    if size != entry.get("bytes") or got != size or zlib.crc32(data) != entry.get("crc32"):
        what = "size" if size != entry.get("bytes") else "crc32"
        raise HookscopeError(f"{file}: its {what} differs from {path / 'manifest.json'}: the file is truncated or "
                             "corrupted; save the store again")
    want = [(d.get("name"), d.get("dtype"), d.get("shape")) for d in listed]
    have = [(n, CODES[e.dtype], list(e.shape)) for n, e in header.tensors.items()]
    if sorted(want, key=str) != sorted(have, key=str):
        raise HookscopeError(f"{file} holds other tensors than {path / 'manifest.json'} lists; save the store again")
    out: dict[str, torch.Tensor] = {}
    for name, _, _ in want:
        t = header.tensors[str(name)]
        n = (t.end - t.begin) // t.dtype.itemsize
        out[str(name)] = (torch.frombuffer(data, dtype=t.dtype, count=n, offset=header.data_start + t.begin)
                          if n else torch.empty(0, dtype=t.dtype)).reshape(t.shape)
    return out, manifest
