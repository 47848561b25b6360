"""The files of a store folder: atomic writes (tmp, fsync, rename, fsync of the folder), the shard scan,
leftovers of killed runs, and clearing a folder that holds nothing but a store.

Layout: ``DIR/manifest.json`` and ``DIR/shards/000000.safetensors``...; a file under a final name is
complete, because it was renamed there only after its last byte reached the disk.

One file past 500 lines: every operation on a store's files (write, scan, clear, leftovers of a killed
run) follows the same atomicity rules, which are easiest to check in one place.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.result import jsonable
from ..errors import HookscopeError
from ._format import Header, encode_header, parse_header, raw_bytes
from ._lock import LOCK_NAME, check_lock

__all__ = ["SCHEMA_VERSION", "KINDS", "CRC_KEY", "ShardInfo", "ShardRead", "shard_path", "open_regular", "write_file",
           "write_json", "read_manifest", "read_shard", "complete_shards", "remove_damaged", "remove_partial",
           "is_store", "clear_store", "count_complete", "shard_numbers", "shard_entries", "write_tensors", "crc32_combine", "SHARD",
           "SHARD_TMP", "MANIFEST_TMP"]

SCHEMA_VERSION: int = 1
"""The version of the store layout and manifest this hookscope writes and reads."""

KINDS = ("samples", "recording", "tuned_lens")
"""The kinds of store hookscope writes (open_store reads "samples", hookscope.load reads "recording",
hookscope.load_lens reads "tuned_lens")."""

SHARD = re.compile(r"^(\d{6,})\.safetensors$")
SHARD_TMP = re.compile(r"^\.\d{6,}\.safetensors\.tmp-\d+$")  # write_file's tmp name of a shard
MANIFEST_TMP = re.compile(r"^\.manifest\.json\.tmp-\d+$")  # write_file's tmp name of the manifest
_CHUNK = 1 << 22
CRC_KEY = "hookscope_crc32"
"""The header metadata key of a shard's own checksum: the crc32 of its data section (every byte after the header),
in decimal, computed by the writer before the header is written."""
_DEPTH = 64  # a manifest nests a few levels; anything deeper is corrupted (and would blow the stack later)


@dataclass(frozen=True)
class ShardInfo:
    """One complete shard: its number, file (relative to the store), rows, size, crc32 and skipped samples.

    Example:
        >>> ShardInfo(3, "shards/000003.safetensors", 10, 1234, 99).file
        'shards/000003.safetensors'
    """

    shard: int
    file: str
    count: int
    bytes: int
    crc32: int
    skipped: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The manifest's entry for this shard (without ``skipped``, which the manifest lists once)."""
        return {"shard": self.shard, "file": self.file, "count": self.count, "bytes": self.bytes,
                "crc32": self.crc32}


def shard_path(root: str | os.PathLike[str], shard: int) -> Path:
    """Where shard ``shard`` of the store in ``root`` lives.

    Example:
        >>> shard_path("out", 7).as_posix()
        'out/shards/000007.safetensors'
    """
    return Path(root) / "shards" / f"{shard:06d}.safetensors"


def open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading, refused in one line unless it is a regular file (a symlink to one is
    followed): a FIFO or a device would hang or never end, a folder is no file.

    Example:
        >>> import tempfile
        >>> open_regular(Path(tempfile.mkdtemp()))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: ... is not a regular file; ...
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO opens without waiting
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HookscopeError(f"{path} is not a regular file; a store holds only files there: remove it, or "
                                 "give the folder of a store")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _depth(doc: Any) -> int:
    """How deeply ``doc`` nests, counted without recursion (stops counting past ``_DEPTH``)."""
    deepest, todo = 0, [(doc, 1)]
    while todo and deepest <= _DEPTH:
        item, level = todo.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        todo.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some network and FUSE file systems cannot fsync a folder; the rename stands
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_file(path: Path, chunks: Iterable[bytes | memoryview], check: Callable[[], None] | None = None, *,
               crc: int | None = None) -> tuple[int, int]:
    """Write ``chunks`` to ``path`` atomically: a tmp file, fsync, rename, fsync of the folder. Returns
    (bytes, crc32). On any error the tmp file is removed and the error raised; ``check`` runs between chunks
    (it raises to stop). ``crc``: the crc32 of all the chunks when the caller knows it (then none is computed).

    Example:
        >>> import tempfile
        >>> write_file(Path(tempfile.mkdtemp()) / "a.bin", [b"ab", b"c"]) == (3, zlib.crc32(b"abc"))
        True
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    size, running = 0, 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                if check is not None:
                    check()
                f.write(chunk)
                if crc is None:
                    running = zlib.crc32(chunk, running)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return size, running if crc is None else crc


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The crc32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)``, without reading either (zlib's
    ``crc32_combine``, which Python's zlib does not expose): a shard's file checksum from its header's and its
    data's, so writing and checking a shard read its data once.

    Example:
        >>> crc32_combine(zlib.crc32(b"head"), zlib.crc32(b"data!"), 5) == zlib.crc32(b"headdata!")
        True
    """
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator that appends one zero bit
    even = [_gf2_times(odd, odd[n]) for n in range(32)]  # two zero bits
    odd = [_gf2_times(even, even[n]) for n in range(32)]  # four
    while True:  # append len2 zero bytes to crc1, squaring the operator for each bit of len2
        even = [_gf2_times(odd, odd[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = [_gf2_times(even, even[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader sees the old file or the new one, never a part);
    tuples, tensors and dtypes are written as :func:`~hookscope.core.result.jsonable` writes them, NaN as "nan".

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "m.json"; write_json(p, {"a": [1, 2]}); json.loads(p.read_text())
        {'a': [1, 2]}
    """
    text = json.dumps(jsonable(obj), indent=1, allow_nan=False).encode() + b"\n"
    write_file(Path(path), [text])


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the store in ``root``, parsed and checked (a JSON object of a known schema_version and
    a kind); a missing, truncated or invalid one is refused naming the file.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); write_json(d / "manifest.json", {"schema_version": 1, "kind": "x"})
        >>> read_manifest(d)["kind"]
        'x'
    """
    path = Path(root) / "manifest.json"
    try:
        with open_regular(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise HookscopeError(f"{path} is missing: {root} is not a hookscope store (or its run was killed before "
                             "it started); give a store's folder or run the extract again") from None
    except OSError as e:
        raise HookscopeError(f"cannot read {path} ({e.strerror or e}); check its permissions") from None
    doc = _parse(text, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise HookscopeError(f"{path} is not a hookscope manifest (no 'kind'); give a store's folder")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise HookscopeError(f"{path} has schema_version {doc.get('schema_version')!r} and this hookscope reads "
                             f"{SCHEMA_VERSION}; open it with the hookscope version that wrote it")
    return doc


def _parse(text: bytes, path: Path) -> Any:
    again = "it is truncated or corrupted; run the extract again with overwrite=True (--overwrite)"
    doc, deep = None, False
    try:
        doc = json.loads(text.decode("utf-8"))
    except RecursionError:  # json's own limit, thousands deep: corrupted, not a crash
        deep = True
    except (ValueError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise HookscopeError(f"{path} is not valid JSON{where}: {again}") from None
    if deep or _depth(doc) > _DEPTH:
        raise HookscopeError(f"{path} is nested more than {_DEPTH} levels deep: {again}")
    return doc


@dataclass(frozen=True)
class ShardRead:
    """A shard file read in full: its checked header, size, the crc32 of all its bytes and of its data section."""

    header: Header
    size: int
    crc32: int
    data_crc32: int

    def damage(self) -> str | None:
        """Why the data does not match the checksum the header carries (``CRC_KEY``), or None when it does."""
        said = self.header.metadata.get(CRC_KEY)
        if said is None:
            return "it carries no checksum of its data (an older hookscope wrote it)"
        if said != str(self.data_crc32):
            return f"its data's crc32 is {self.data_crc32} but its header says {said}"
        return None


def read_shard(path: Path) -> ShardRead:
    """The checked header of a shard file, its size and crc32s (reads the whole file once).

    Example:
        >>> import tempfile
        >>> from ._format import encode_header
        >>> p = Path(tempfile.mkdtemp()) / "s.safetensors"
        >>> _ = write_file(p, [encode_header([("a", torch.int8, [2])], {})[0], b"xy"])
        >>> got = read_shard(p); got.header.tensors["a"].shape, got.data_crc32 == zlib.crc32(b"xy")
        ((2,), True)
    """
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            header = parse_header(f, size, path)
            f.seek(0)
            head = f.read(header.data_start)
            crc = 0
            view = memoryview(bytearray(_CHUNK))  # one reused buffer: no 4 MB allocation per chunk
            while n := f.readinto(view):
                crc = zlib.crc32(view[:n], crc)
    except OSError as e:
        raise HookscopeError(f"cannot read {path} ({e.strerror or e}); check that it exists and is readable") from None
    whole = crc32_combine(zlib.crc32(head), crc, size - header.data_start)
    return ShardRead(header, size, whole, crc)


def _inspect(root: Path, k: int) -> ShardInfo | str:
    """Shard ``k`` checked: its ShardInfo, or why it is not a sound shard of this store (a file that cannot be
    read, or whose header is invalid, raises)."""
    path = shard_path(root, k)
    got = read_shard(path)
    header = got.header
    damage = got.damage()
    if damage is not None:
        return f"is damaged: {damage}"
    index = header.tensors.get("__index__")
    bad = ""
    if index is None or index.dtype != torch.int64 or len(index.shape) != 1:
        bad = "it has no int64 __index__ tensor"
    elif header.metadata.get("hookscope_shard") != str(k):
        bad = f"its metadata names shard {header.metadata.get('hookscope_shard')!r}"
    elif any(not e.shape or e.shape[0] != index.shape[0] for e in header.tensors.values()):
        bad = "its tensors hold different numbers of rows"
    try:
        skipped = json.loads(header.metadata.get("skipped", "[]"))
    except (ValueError, RecursionError):
        skipped, bad = [], bad or "its 'skipped' metadata is not JSON"
    if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
        skipped, bad = [], bad or "its 'skipped' metadata is not a list of objects"
    if bad:
        return f"is not a hookscope shard ({bad})"
    assert index is not None
    return ShardInfo(k, f"shards/{path.name}", index.shape[0], got.size, got.crc32, tuple(skipped))


def _shards_in(root: Path) -> list[int]:
    folder = root / "shards"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := SHARD.match(p.name)))


def _unsound(root: Path, k: int) -> str | None:
    """Why shard ``k`` is not sound (None when it is)."""
    path = shard_path(root, k)
    try:
        got = _inspect(root, k)
    except HookscopeError as e:  # an invalid header, or an unreadable file: the reason, without the advice
        text = str(e).replace(f"cannot read {path} ", "cannot be read ", 1).removeprefix(f"{path} ")
        return text.split("; ")[0]
    return got if isinstance(got, str) else None


def complete_shards(root: str | os.PathLike[str]) -> dict[int, ShardInfo]:
    """Every complete shard in ``root/shards``, checked (header, rows, and its data against the checksum its
    header carries); tmp leftovers of killed runs are ignored. A damaged shard is refused naming the file.

    Example:
        >>> import tempfile
        >>> complete_shards(tempfile.mkdtemp())
        {}
    """
    found = {}
    for k in _shards_in(Path(root)):
        info = _inspect(Path(root), k)
        if isinstance(info, str):
            raise HookscopeError(f"{shard_path(root, k)} {info}; delete it and write it again (an extract with "
                                 "resume=True / --resume does both)")
        found[k] = info
    return found


def remove_damaged(root: str | os.PathLike[str]) -> list[str]:
    """Delete every shard of ``root/shards`` that is not sound (a header, rows or data that do not hold up, or
    no checksum of its data), so that a resumed run writes it again; one line per shard removed, saying why.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "shards").mkdir(); _ = shard_path(d, 0).write_bytes(b"junk")
        >>> remove_damaged(d)[0].split(": it ")[1]
        'is not a valid shard (the file holds 4 bytes, fewer than a header): the file is truncated or corrupted'

        >>> list((d / "shards").iterdir())
        []
    """
    path = Path(root)
    _links(path)
    bad = [(k, why) for k in _shards_in(path) if (why := _unsound(path, k))]
    if not bad:
        return []
    removed = []
    folder = _open_dir(path / "shards")
    try:  # only regular files: anything else in shards/ is refused where the store is read
        for k, why in bad:
            if _kind(folder, shard_path(path, k).name) == stat.S_IFREG:
                os.unlink(shard_path(path, k).name, dir_fd=folder)
                removed.append(f"{shard_path(path, k)} was removed and is written again: it {why}")
    finally:
        os.close(folder)
    _fsync_dir(path / "shards")
    return removed


def shard_numbers(root: str | os.PathLike[str]) -> set[int]:
    """The numbers of the shard files under a final name in ``root/shards`` (no file is read: a file is
    renamed there only when complete; :func:`complete_shards` checks what they hold).

    Example:
        >>> shard_numbers(Path("/nonexistent"))
        set()
    """
    try:
        return {int(m.group(1)) for name in os.listdir(Path(root) / "shards") if (m := SHARD.match(name))}
    except OSError:
        return set()


def count_complete(root: Path) -> int:
    """How many shard files are under a final name in ``root/shards`` (no file is read).

    Example:
        >>> count_complete(Path("/nonexistent"))
        0
    """
    return len(shard_numbers(root))


def _links(root: Path) -> None:
    """Refuse a store whose shards/ or manifest.json is a symlink: clearing or writing through it could reach
    another folder (another store's shards)."""
    for name in ("shards", "manifest.json", LOCK_NAME):
        if (root / name).is_symlink():
            raise HookscopeError(f"{root / name} is a symbolic link; hookscope never writes or clears a store "
                                 "through a link (it could reach another folder): give a folder whose shards/ and "
                                 "manifest.json are its own")


def _kind(folder: int, name: str) -> int:
    """The file type of ``name`` inside the open folder ``folder``, without following a symlink."""
    return stat.S_IFMT(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)


def _open_dir(name: str | Path, at: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)


def remove_partial(root: str | os.PathLike[str]) -> None:
    """Delete the tmp files killed runs left in ``root`` and ``root/shards`` (only names our writers use:
    ``.manifest.json.tmp-<pid>`` and ``shards/.000007.safetensors.tmp-<pid>``); never through a symlink.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / ".manifest.json.tmp-12").write_text("{")
        1
        >>> (d / ".config.tmp-7").write_text("a user's file")
        13
        >>> remove_partial(d); [p.name for p in d.iterdir()]
        ['.config.tmp-7']
    """
    path = Path(root)
    if not path.is_dir():
        return
    _links(path)
    check_lock(path, remove=False)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _unlink_ours(top, MANIFEST_TMP)
        if "shards" in os.listdir(top) and _kind(top, "shards") == stat.S_IFDIR:
            shards = _open_dir("shards", top)
            try:
                _unlink_ours(shards, SHARD_TMP)
            finally:
                os.close(shards)
    finally:
        os.close(top)


def _unlink_ours(folder: int, pattern: re.Pattern[str]) -> None:
    for name in os.listdir(folder):
        if pattern.match(name) and _kind(folder, name) == stat.S_IFREG:
            os.unlink(name, dir_fd=folder)


def _our_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest hookscope wrote: a JSON object with a schema_version and our kind."""
    try:
        with open_regular(path) as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (HookscopeError, OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and "schema_version" in doc and doc.get("kind") in KINDS


def _foreign(root: Path) -> list[Path]:
    """What ``root`` holds that a store does not (symlinks, folders or files of other names, a manifest.json
    hookscope did not write)."""
    bad = []
    for p in sorted(root.iterdir()):
        kind = stat.S_IFMT(p.lstat().st_mode)
        ours = (p.name == "shards" and kind == stat.S_IFDIR) or (kind == stat.S_IFREG and (
            MANIFEST_TMP.match(p.name) or p.name == LOCK_NAME or (p.name == "manifest.json" and _our_manifest(p))))
        if not ours:
            bad.append(p)
    shards = root / "shards"
    if shards.is_dir() and not shards.is_symlink():
        bad += [p for p in sorted(shards.iterdir()) if not (SHARD.match(p.name) or SHARD_TMP.match(p.name))
                or not stat.S_ISREG(p.lstat().st_mode)]
    return bad


def is_store(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds a hookscope store: a manifest.json hookscope wrote, or a shards/ folder holding
    shards (or their tmp files) and nothing else. An empty shards/ counts only when ``root`` holds nothing
    else of a user's (a run killed before its first shard). A symlinked shards/ or manifest.json is refused.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "shards").mkdir(); is_store(d)
        True
        >>> (d / "notes.txt").write_text("mine"); is_store(d)
        4
        False
    """
    path = Path(root)
    if not path.is_dir():
        return False
    _links(path)
    if _our_manifest(path / "manifest.json"):
        return True
    shards = path / "shards"
    if not shards.is_dir():
        return False
    inside = list(shards.iterdir())
    if any(not (SHARD.match(p.name) or SHARD_TMP.match(p.name)) or not stat.S_ISREG(p.lstat().st_mode)
           for p in inside):
        return False
    return bool(inside) or not _foreign(path)


def clear_store(root: str | os.PathLike[str]) -> None:
    """Remove the store in ``root`` (manifest.json, shards/, tmp leftovers and a stale lock file); refused,
    with nothing removed, when ``root`` holds anything else, a symlink, or is being written by another run.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); write_json(d / "manifest.json", {"schema_version": 1, "kind": "samples"})
        >>> clear_store(d); list(d.iterdir())
        []
    """
    path = Path(root)
    if not path.is_dir():
        return
    _links(path)
    bad = _foreign(path)
    if bad:
        raise HookscopeError(f"{path} holds {bad[0]}, which is not part of a hookscope store, so it is not "
                             "cleared; give a folder that holds only a store, or remove that file")
    check_lock(path, remove=True)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # through folder descriptors, never a path: a shards/ swapped for a link now is not followed
        if "shards" in os.listdir(top):
            shards = _open_dir("shards", top)
            try:
                _unlink_ours(shards, SHARD_TMP)
                _unlink_ours(shards, SHARD)
            finally:
                os.close(shards)
            os.rmdir("shards", dir_fd=top)
        _unlink_ours(top, MANIFEST_TMP)
        _unlink_ours(top, re.compile(r"^manifest\.json$"))
    except OSError as e:  # something appeared or changed since the check: stop, the rest stays
        raise HookscopeError(f"cannot clear {path} ({e.strerror or e}); is another program writing there? "
                             "Remove the store by hand or give a new folder") from None
    finally:
        os.close(top)
    _fsync_dir(path)


def shard_entries(arrays: Mapping[str, torch.Tensor], count: int) -> tuple[list[tuple[str, torch.dtype, Sequence[int]]], list[torch.Tensor]]:
    """Header entries and tensors of the first ``count`` rows of each array (views, no copy).

    Example:
        >>> shard_entries({"a": torch.zeros(4, 2)}, 3)[0]
        [('a', torch.float32, (3, 2))]
    """
    views = [t[:count].contiguous() for t in arrays.values()]
    return [(n, v.dtype, tuple(v.shape)) for n, v in zip(arrays, views)], views


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str],
                  check: Callable[[], None] | None = None) -> tuple[int, int]:
    """Write contiguous CPU ``tensors`` as one safetensors file, atomically, the crc32 of its data in its header
    (``CRC_KEY``, computed before the header is written); (bytes, crc32 of the whole file).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "t.safetensors"
        >>> write_tensors(p, {"a": torch.zeros(2)}, {}) == (p.stat().st_size, zlib.crc32(p.read_bytes()))
        True
        >>> read_shard(p).damage() is None
        True
    """
    entries = [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    data = [raw_bytes(tensors[n]) for n in encode_header(entries, {})[1]]
    crc = 0
    for chunk in data:  # the only pass over the data besides writing it: the file's crc32 is combined below
        crc = zlib.crc32(chunk, crc)
    head, _ = encode_header(entries, {**metadata, CRC_KEY: str(crc)})
    whole = crc32_combine(zlib.crc32(head), crc, sum(len(c) for c in data))
    return write_file(path, [head, *data], check, crc=whole)
