"""Shards written on one background thread from a few preallocated, reused host buffers.

The caller fills a :class:`ShardBuffer` (copies from the device, ``non_blocking`` into pinned memory on
CUDA) and submits it; the thread waits for the copies (``ready``), writes the rows straight from the buffer
(no copy), renames the file into place and hands the buffer back. Host memory is ``buffers`` shards, whatever
the dataset's size; writing overlaps the next batches' compute.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from ..errors import HookscopeError
from ._files import SHARD_TMP, ShardInfo, count_complete, shard_path, write_tensors
from ._format import code_of

__all__ = ["ArraySpec", "ShardBuffer", "StoreWriter"]

_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


@dataclass(frozen=True)
class ArraySpec:
    """One stored array (one layer): its name, the shape of one sample's row, and its dtype.

    Example:
        >>> ArraySpec("layer2", (128,), torch.float16).shape
        (128,)
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class ShardBuffer:
    """Preallocated host memory for one shard, reused (pinned when ``pin=True``).

    ``arrays[name]`` is a ``(samples_per_shard, *shape)`` tensor, ``index`` the int64 dataset index of each
    row; the caller copies rows ``i:i+b`` into both.

    Example:
        >>> b = ShardBuffer([ArraySpec("a", (2,), torch.float32)], 4)
        >>> b.arrays["a"].shape, b.index.dtype
        (torch.Size([4, 2]), torch.int64)
    """

    def __init__(self, arrays: Sequence[ArraySpec], samples_per_shard: int, *, pin: bool = False) -> None:
        self.arrays: dict[str, torch.Tensor] = {
            a.name: torch.empty((samples_per_shard, *a.shape), dtype=a.dtype, pin_memory=pin) for a in arrays}
        self.index = torch.empty(samples_per_shard, dtype=torch.int64, pin_memory=pin)


@dataclass
class _Job:
    shard: int
    buf: ShardBuffer
    count: int
    skipped: list[dict[str, Any]]
    ready: Callable[[], None] | None


class _Aborted(Exception):
    """Raised between chunks of a write when the writer was aborted."""


def _check(arrays: Sequence[ArraySpec], samples_per_shard: int, buffers: int) -> None:
    names = [a.name for a in arrays]
    bad = [n for n in names if not isinstance(n, str) or not n or n in ("__index__", "__metadata__")]
    if bad or len(set(names)) != len(names):
        what = f"the name {bad[0]!r} is reserved" if bad else "two arrays share a name"
        raise HookscopeError(f"cannot write a store: {what}; give each array its own name")
    for a in arrays:
        code_of(a.dtype, f"array {a.name!r}")
    if samples_per_shard < 1 or buffers < 1:
        raise HookscopeError(f"samples_per_shard={samples_per_shard} and buffers={buffers} must both be at least 1")


class StoreWriter:
    """Writes shards of ``root/shards`` on one background thread; host memory is ``buffers`` ShardBuffers.

    Example:
        >>> import tempfile
        >>> with StoreWriter(tempfile.mkdtemp(), [ArraySpec("a", (2,), torch.float32)], 4) as wr:
        ...     buf = wr.buffer(); buf.arrays["a"][:3] = 1.0; buf.index[:3] = torch.arange(3)
        ...     wr.submit(0, buf, 3)
        ...     infos = wr.close()
        >>> infos[0].file, infos[0].count
        ('shards/000000.safetensors', 3)
    """

    def __init__(self, root: str | os.PathLike[str], arrays: Sequence[ArraySpec], samples_per_shard: int,
                 *, buffers: int = 2, pin: bool = False) -> None:
        _check(arrays, samples_per_shard, buffers)
        self.root = Path(root)
        self.samples_per_shard = samples_per_shard
        try:
            (self.root / "shards").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HookscopeError(f"cannot create {self.root / 'shards'} ({e.strerror or e}); give a folder you "
                                 "can write") from None
        pin = pin and torch.cuda.is_available()
        self._all = [ShardBuffer(arrays, samples_per_shard, pin=pin) for _ in range(buffers)]
        self._free: queue.Queue[ShardBuffer] = queue.Queue()
        for b in self._all:
            self._free.put(b)
        self._work: queue.Queue[_Job | None] = queue.Queue(maxsize=buffers)
        self._infos: list[ShardInfo] = []
        self._error: HookscopeError | None = None
        self._aborted = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hookscope-store-writer", daemon=True)
        self._thread.start()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise HookscopeError("this StoreWriter is closed; open a new one to write more shards")

    def buffer(self) -> ShardBuffer:
        """A free buffer (waits while every buffer is queued for writing); raises the writer's error."""
        while True:
            self._raise()
            try:
                return self._free.get(timeout=0.05)
            except queue.Empty:
                continue

    def submit(self, shard: int, buf: ShardBuffer, count: int, skipped: Sequence[Mapping[str, Any]] = (),
               ready: Callable[[], None] | None = None) -> None:
        """Hand a filled buffer: rows ``[:count]`` become shard ``shard``; raises at once if the writer failed.

        ``ready`` runs on the thread before the buffer is read (pass a CUDA event's ``synchronize``).
        """
        self._raise()
        if not any(buf is b for b in self._all):
            raise HookscopeError("submit() got a buffer this writer did not give; fill one from writer.buffer()")
        if not 0 <= count <= self.samples_per_shard or shard < 0:
            raise HookscopeError(f"submit(shard={shard}, count={count}): count must lie in 0..{self.samples_per_shard}"
                                 " and shard be >= 0")
        self._work.put(_Job(shard, buf, count, [dict(s) for s in skipped], ready))

    def _loop(self) -> None:
        while (job := self._work.get()) is not None:
            try:
                if self._error is None and not self._aborted.is_set():
                    self._infos.append(self._write(job))
            except _Aborted:
                pass
            except OSError as e:
                self._error = self._failure(job.shard, e)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, which raises it
                err = HookscopeError(f"writing {shard_path(self.root, job.shard)} failed ({type(e).__name__}: {e}); "
                                     "the earlier shards are complete: fix the cause and run again with --resume")
                err.__cause__ = e
                self._error = err
            finally:
                self._free.put(job.buf)

    def _write(self, job: _Job) -> ShardInfo:
        if job.ready is not None:
            job.ready()
        tensors = {"__index__": job.buf.index[:job.count], **{n: t[:job.count] for n, t in job.buf.arrays.items()}}
        meta = {"hookscope_shard": str(job.shard), "skipped": json.dumps(job.skipped)}
        path = shard_path(self.root, job.shard)
        size, crc = write_tensors(path, tensors, meta, self._stop_if_aborted)
        return ShardInfo(job.shard, f"shards/{path.name}", job.count, size, crc, tuple(job.skipped))

    def _stop_if_aborted(self) -> None:
        if self._aborted.is_set():
            raise _Aborted

    def _failure(self, shard: int, e: OSError) -> HookscopeError:
        path, done = shard_path(self.root, shard), count_complete(self.root)
        why = e.strerror or str(e)
        if e.errno in _FULL:
            msg = (f"disk full while writing {path} ({why}): the store keeps its {done} complete shards; free space "
                   "and run again with --resume")
        else:
            msg = (f"cannot write {path} ({why}): the store keeps its {done} complete shards; fix the cause and "
                   "run again with --resume")
        err = HookscopeError(msg)
        err.__cause__ = e
        return err

    def close(self) -> list[ShardInfo]:
        """Wait for every queued shard, stop the thread; the shards written, by number. Raises the first error."""
        if not self._closed:
            self._closed = True
            self._work.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error
        return sorted(self._infos, key=lambda i: i.shard)

    def abort(self) -> None:
        """Stop at once: drop queued work, remove tmp files (idempotent)."""
        self._aborted.set()
        if not self._closed:
            self._closed = True
            self._work.put(None)
        self._thread.join()
        suffix = f".tmp-{os.getpid()}"
        folder = self.root / "shards"
        for p in folder.iterdir() if folder.is_dir() else []:
            if SHARD_TMP.match(p.name) and p.name.endswith(suffix):
                p.unlink(missing_ok=True)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
