"""The writing loop of one rank: batches in, rows copied into shard buffers by the taps, full shards
handed to the store's background writer."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from ...errors import HookscopeError
from ...store import ShardBuffer, StoreWriter
from ._plan import Plan
from ..._tree import tree_map
from ._source import Batch, rows_of
from ._taps import Segment, Taps

__all__ = ["Progress", "groups_for", "probe_batch", "write_indexed", "write_stream"]


class Progress:
    """A one-line progress report on stderr (samples done, samples/s), redrawn at most 4 times a second.

    Example:
        >>> import io
        >>> p = Progress(10, io.StringIO(), enabled=True); p.add(10); p.close()
        >>> "10/10 samples" in p.out.getvalue()
        True
    """

    def __init__(self, total: int | None, out: TextIO | None = None, *, enabled: bool | None = None,
                 label: str = "extract") -> None:
        self.out = out or sys.stderr
        self.enabled = self.out.isatty() if enabled is None else enabled
        self.total, self.done, self.label = total, 0, label
        self.start = self._last = time.perf_counter()

    def add(self, n: int) -> None:
        """Count ``n`` more samples."""
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.25 or self.done == self.total):
            self._last = now
            self._draw(now)

    def rate(self) -> float:
        """Samples per second so far."""
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def _draw(self, now: float) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        left = ""
        if self.total and self.done:
            eta = (self.total - self.done) / max(self.rate(), 1e-9)
            left = f", {int(eta) // 60}:{int(eta) % 60:02d} left"
        self.out.write(f"\r{self.label}: {self.done}{of} samples, {self.rate():.1f} samples/s{left}   ")
        self.out.flush()

    def close(self) -> None:
        """End the line."""
        if self.enabled:
            self._draw(time.perf_counter())
            self.out.write("\n")
            self.out.flush()


@dataclass
class _Open:
    """A shard being filled."""

    shard: int
    buf: ShardBuffer
    filled: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)


def _ready(device: torch.device) -> Any:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()  # the copies into pinned memory were queued on this stream
    return event.synchronize


def _failures(plan: Plan, batch: Batch) -> list[dict[str, Any]]:
    if batch.problem:
        first = (batch.indices or [f["index"] for f in batch.failed])[0]
        raise HookscopeError(f"the samples from {first} on cannot be put in one batch ({batch.problem}); give samples "
                             "of one size, batch_size=1 with a reduction such as 'mean', or a DataLoader with a "
                             "collate_fn")
    ids = plan.source.ids
    out = [{"index": f["index"], "id": ids[f["index"]] if ids else str(f["index"]), "error": f["error"]}
           for f in batch.failed]
    if out and plan.on_error == "stop":
        f = out[0]
        raise HookscopeError(f"sample {f['id']} cannot be read ({f['error']}); pass on_error='skip' "
                             "(--skip-unreadable) to skip unreadable samples and list them")
    return out


def groups_for(shards: list[int], per_shard: int, length: int, batch_size: int) -> tuple[list[list[int]], list[int]]:
    """Index batches of these shards, never across a shard's end, and the shard of each batch.

    Example:
        >>> groups_for([1], 5, 12, 2)
        ([[5, 6], [7, 8], [9]], [1, 1, 1])
    """
    groups: list[list[int]] = []
    owner: list[int] = []
    for k in shards:
        end = min(length, (k + 1) * per_shard)
        for lo in range(k * per_shard, end, batch_size):
            groups.append(list(range(lo, min(lo + batch_size, end))))
            owner.append(k)
    return groups, owner


def _fill(plan: Plan, taps: Taps, batch: Batch, segments: list[tuple[_Open, int, int]]) -> None:
    """Run one batch; rows ``lo:hi`` of it go to each open shard given (at its ``filled`` row)."""
    taps.run(plan.model, batch.inputs, plan.device, batch.rows,
             [Segment(o.buf.arrays, o.filled, lo, hi) for o, lo, hi in segments], own=batch.own)
    for o, lo, hi in segments:
        o.buf.index[o.filled:o.filled + hi - lo] = torch.tensor(batch.indices[lo:hi], dtype=torch.int64)
        o.filled += hi - lo


def _submit(taps: Taps, writer: StoreWriter, o: _Open, device: torch.device) -> None:
    taps.check_range()  # once a shard: a value beyond the stored dtype's range never reaches a file
    writer.submit(o.shard, o.buf, o.filled, o.skipped, ready=_ready(device))


def write_indexed(plan: Plan, taps: Taps, writer: StoreWriter, shards: list[int], per_shard: int,
                  progress: Progress) -> None:
    """Write the given shards of an indexed source (batches inside one shard each)."""
    assert plan.source.length is not None
    groups, owner = groups_for(shards, per_shard, plan.source.length, plan.batch_size)
    pin = plan.device.type == "cuda"
    now: _Open | None = None
    for k, batch in zip(owner, plan.source.batches(groups, workers=plan.workers, pin=pin)):
        if now is not None and now.shard != k:
            _submit(taps, writer, now, plan.device)
            now = None
        if now is None:
            now = _Open(k, writer.buffer())
        now.skipped += _failures(plan, batch)
        if batch.rows:
            _fill(plan, taps, batch, [(now, 0, batch.rows)])
        progress.add(batch.rows + len(batch.failed))
    if now is not None:
        _submit(taps, writer, now, plan.device)


def _spans(start: int, end: int, per_shard: int, first: int) -> Iterator[tuple[int, int, int]]:
    """(shard, lo, hi) pieces of rows ``start:end`` of the data, as offsets from ``first`` (the batch's first row)."""
    row = start
    while row < end:
        k = row // per_shard
        stop = min(end, (k + 1) * per_shard)
        yield k, row - first, stop - first
        row = stop


def write_stream(plan: Plan, taps: Taps, writer: StoreWriter, start: int, per_shard: int, batches: Iterator[Batch],
                 progress: Progress) -> int:
    """Write an iterable's rows from row ``start`` on (rows before it are in complete shards); the row count."""
    open_: dict[int, _Open] = {}
    total = 0
    for batch in batches:
        first, total = batch.indices[0], batch.indices[0] + batch.rows
        if total <= start:
            continue
        if batch.rows > per_shard:
            raise HookscopeError(f"a batch of {batch.rows} samples is larger than a shard ({per_shard} samples); "
                                 "raise shard_size or give smaller batches")
        segments = []
        for k, lo, hi in _spans(max(first, start), total, per_shard, first):
            if k not in open_:
                open_[k] = _Open(k, writer.buffer())
            segments.append((open_[k], lo, hi))
        _fill(plan, taps, batch, segments)
        progress.add(sum(hi - lo for _, lo, hi in segments))
        for k in [k for k in open_ if (k + 1) * per_shard <= total]:
            _submit(taps, writer, open_.pop(k), plan.device)
    for k in sorted(open_):
        _submit(taps, writer, open_.pop(k), plan.device)
    return total


def probe_batch(batch: Batch) -> Batch:
    """The first two rows of a batch (or its one), to learn each layer's shapes with one small forward.

    Example:
        >>> probe_batch(Batch(torch.zeros(4, 2), [0, 1, 2, 3])).inputs.shape
        torch.Size([2, 2])
    """
    n = min(2, batch.rows)
    # a copy: a model that writes into its input must not change the data's rows before they are run
    return Batch(tree_map(lambda t: t.clone(), rows_of(batch.inputs, 0, n)), batch.indices[:n], own=True)
