"""``hookscope.extract``: the activations of chosen layers for a whole dataset, streamed to a store on disk.

Shard ``k`` always holds the samples ``[k*S, (k+1)*S)`` (``S`` from the shard size and the per-sample
bytes a one-sample probe measures), read in batches that never cross a shard's end. So the shards do not
depend on how many ranks wrote them or on where a killed run stopped: a resumed or distributed run writes
the same bytes as one uninterrupted process at the same torch thread count (torchrun gives each rank one
thread; other counts may differ in the last bits), and a shard file, renamed into place only when complete,
is either all there or not there.
"""

from __future__ import annotations

import importlib.metadata
import contextlib
import itertools
import math
import os
import platform
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...core.state import restored
from ...errors import ExtractOverflowError, HookscopeError, checked
from ...selection import Layers, Selector
from ...store import (SCHEMA_VERSION, ArraySpec, Store, StoreWriter, clear_store, complete_shards, count_complete,
                      locked, open_store, shard_numbers, storable, weights_hash, write_json)
from ._dist import Ranks, ranks
from ._folder import foreign, prepare, same_run
from ._hash import model_digest
from ._plan import Plan, array_specs, plan, range_limits, samples_per_shard, stored_dtype
from ._reduce import Reduction
from ._source import Batch
from ._taps import Taps
from ._write import Progress, probe_batch, write_indexed, write_stream

__all__ = ["extract"]

_KEPT = " (the complete shards are kept: fix this, then run again with resume=True / --resume)"


def _prepared(p: Plan, r: Ranks, resume: bool, overwrite: bool, hold: contextlib.ExitStack) -> dict[str, Any] | None:
    """Rank 0 locks and readies the folder (the lock held in ``hold`` till the run ends); every rank gets the
    manifest to resume (or None) or the same error."""
    found: tuple[str | None, dict[str, Any] | None] = (None, None)
    if r.lead:
        try:
            foreign(p.out)  # nothing is created in a folder that is not ours
            hold.enter_context(locked(p.out))
            found = (None, prepare(p.out, resume=resume, overwrite=overwrite))
        except HookscopeError as e:
            found = (str(e), None)
    error, old = r.share(found)
    if error:
        raise HookscopeError(error)
    return old if isinstance(old, dict) else None


def _first_batch(p: Plan) -> tuple[Batch, Iterator[Batch] | None]:
    """A batch to probe (the first readable sample), and for a stream the batches, the first put back."""
    if p.source.length is None:
        stream = p.source.stream()
        first = next(stream, None)
        if first is None:
            raise HookscopeError("the data yielded no batch; give data with at least one sample")
        return first, itertools.chain([first], stream)
    if p.source.length == 0:
        raise HookscopeError("the data holds no sample; give data with at least one sample")
    if p.source.length >= 2:  # two samples, so that a reduction that loses the samples' axis shows at once
        pair = next(iter(p.source.batches([[0, 1]])))
        if pair.rows == 2 and not pair.problem:
            return pair, None
    for i in range(p.source.length):
        for batch in p.source.batches([[i]]):
            if batch.rows:
                return batch, None
            if p.on_error == "stop":
                raise HookscopeError(f"sample {i} cannot be read ({batch.failed[0]['error']}); pass on_error='skip' "
                                     "(--skip-unreadable) to skip unreadable samples and list them")
    raise HookscopeError("no sample of the data can be read; check the data")


def _checked_samples(p: Plan, per_shard: int, probe: Batch) -> list[Batch]:
    """The samples whose bytes a resume compares: the first of up to 64 shards spread over the data."""
    if p.source.length is None:
        return [probe]
    shards = math.ceil(p.source.length / per_shard)
    m = min(64, shards)
    picks = sorted({round(i * (shards - 1) / max(m - 1, 1)) * per_shard for i in range(m)})
    return [next(iter(p.source.batches([[i]]))) for i in picks]


def _settings(p: Plan, taps: Taps, per_shard: int, seen: list[Batch], model: dict[str, str]) -> dict[str, Any]:
    described = p.describe
    return {
        "schema_version": SCHEMA_VERSION, "kind": "samples", "complete": False,
        "arrays": array_specs(taps.found, p.dtype, p.reducers, p.keep),
        "samples_per_shard": per_shard, "batch_size": p.batch_size,
        "model": {"class": type(p.model).__name__, "weights_sha256": weights_hash(p.model),
                  **model, **dict(described.get("model", {}))},
        "data": {**p.source.info, **dict(described.get("data", {}))},
        "data_check": p.source.fingerprint(seen),
        "preprocessing": described.get("preprocessing"),
        "versions": {"hookscope": _version(), "torch": torch.__version__, "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _version() -> str:
    try:
        return importlib.metadata.version("hookscope")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


def _after_failure(p: Plan, r: Ranks, old: dict[str, Any] | None, resumable: bool) -> str:
    """What a failed run leaves: its complete shards to resume, or (none written yet, or values its dtype
    cannot hold, which no resume can store) a free folder."""
    if resumable and (count_complete(p.out) or old is not None):
        return _KEPT
    if old is not None:  # the store was begun in this dtype: only a new one can take another
        return " (the store was begun in this dtype: start it again with overwrite=True / --overwrite)"
    r.barrier()
    if r.lead:  # nothing to resume: the manifest goes, so the next run needs no --overwrite
        clear_store(p.out)
    return ""


def _check_storable(p: Plan, taps: Taps) -> None:
    """Refuse, before anything is written, a layer whose values the store's format cannot hold."""
    for name, (_, found) in taps.found.items():
        kept = stored_dtype(found, p.dtype)
        if not storable(kept):
            raise HookscopeError(f"{name!r} would be stored as {kept}, which safetensors cannot hold; store another "
                                 "dtype (dtype=torch.float16) or reduce it to one (reduce=lambda t: t.abs())")


def _specs(p: Plan, taps: Taps) -> list[ArraySpec]:
    return [ArraySpec(n, s, stored_dtype(d, p.dtype)) for n, (s, d) in taps.found.items()]


def _work(p: Plan, r: Ranks, taps: Taps, per_shard: int, done: set[int], stream: Iterator[Batch] | None,
          progress: bool | None) -> int:
    """This rank's shards written; returns how many samples the data holds."""
    pin = p.device.type == "cuda" and torch.cuda.is_available()
    with StoreWriter(p.out, _specs(p, taps), per_shard, pin=pin) as writer:
        if stream is not None:
            start = next(k for k in itertools.count() if k not in done) * per_shard
            bar = Progress(None, enabled=progress if r.lead else False)
            rows = write_stream(p, taps, writer, start, per_shard, stream, bar)
        else:
            assert p.source.length is not None
            rows = p.source.length
            shards = math.ceil(rows / per_shard)
            mine = [k for k in r.mine(shards) if k not in done]
            total = sum(min(p.source.length, (k + 1) * per_shard) - k * per_shard for k in mine)
            bar = Progress(total, enabled=progress if r.lead else False)
            write_indexed(p, taps, writer, mine, per_shard, bar)
        writer.close()
    bar.close()
    return rows


def _finish(p: Plan, settings: dict[str, Any], rows: int) -> None:
    """Rank 0: check that every shard is there and write the complete manifest."""
    per_shard = int(settings["samples_per_shard"])
    shards = max(1, math.ceil(rows / per_shard))
    infos = complete_shards(p.out)
    missing = [k for k in range(shards) if k not in infos]
    extra = [k for k in infos if k >= shards]
    if missing or extra:
        what = f"shard {missing[0]} is missing" if missing else f"shard {extra[0]} lies beyond the data's end"
        raise HookscopeError(f"{p.out}: {what}; run again with overwrite=True (--overwrite)")
    ordered = [infos[k] for k in range(shards)]
    for info in ordered:
        want = min(per_shard, rows - info.shard * per_shard)
        if info.count + len(info.skipped) != want:
            raise HookscopeError(f"{p.out}: shard {info.shard} holds {info.count + len(info.skipped)} samples where the "
                                 f"data gives {want} (the data changed since the run began); run again with "
                                 "overwrite=True (--overwrite)")
    skipped = [dict(s) for info in ordered for s in info.skipped]
    gone = {s["index"] for s in skipped}
    count = sum(info.count for info in ordered)
    ids = p.source.ids
    manifest = {**settings, "complete": True,
                "samples": {"count": count, "ids": None if ids is None else
                            [i for k, i in enumerate(ids) if k not in gone], "skipped": skipped},
                "shards": [{"shard": i.shard, "file": i.file, "count": i.count, "bytes": i.bytes, "crc32": i.crc32}
                           for i in ordered]}
    write_json(p.out / "manifest.json", manifest)


def _run(p: Plan, r: Ranks, resume: bool, overwrite: bool, progress: bool | None) -> None:
    with contextlib.ExitStack() as hold:
        _locked_run(p, r, _prepared(p, r, resume, overwrite, hold), progress)


def _unchecked(p: Plan, opaque: list[str]) -> tuple[str, str, str] | None:
    """What no hash sees, so that a resume cannot compare it with the run that began the store (the model's
    part or a reduction's): what it is, the detail and the fix; None when everything can be compared."""
    if opaque:
        return "the model", opaque[0], "hold plain values, functions or modules there"
    name, r = next(((n, r) for n, r in p.reducers.items() if r.unchecked), ("", None))
    if r is not None:
        return (f"the reduction {r.text} of {name!r}", r.unchecked,
                "give a def or lambda, a functools.partial of one, or a torch function")
    return None


def _check_resume(p: Plan, opaque: list[str], old: dict[str, Any] | None) -> None:
    """Refuse a resume that cannot be checked; warn a new run that it could not be resumed."""
    found = _unchecked(p, opaque)
    if found is None:
        return
    what, detail, fix = found
    if old is not None:
        raise HookscopeError(f"cannot resume {p.out}: {what} cannot be compared with the run that began the store "
                             f"({detail}); {fix}, or start again with overwrite=True (--overwrite)")
    warnings.warn(f"this run could not be resumed if it stopped: {what} cannot be compared between runs ({detail}); "
                  f"{fix}", stacklevel=6)


def _probe(p: Plan, taps: Taps, probe: Batch) -> int:
    """Learn each layer's shape and dtype from the probe, refuse what cannot be stored; samples per shard."""
    taps.run(p.model, probe.inputs, p.device, probe.rows, [], probe=True, own=probe.own)
    _check_storable(p, taps)
    taps.watch(range_limits(taps.found, p.dtype))
    return samples_per_shard(taps.found, p.dtype, p.shard_bytes)


def _locked_run(p: Plan, r: Ranks, old: dict[str, Any] | None, progress: bool | None) -> None:
    model, opaque = model_digest(p.model)  # before any hook of ours is on the model
    _check_resume(p, opaque, old)
    with Taps(p.selected, p.reducers, p.keep) as taps, torch.no_grad(), restored(p.model):
        first, stream = _first_batch(p)
        if stream is not None and r.world > 1:
            raise HookscopeError("an iterable of batches cannot be split between ranks; give a Dataset or a tensor")
        probe = probe_batch(first)
        per_shard = _probe(p, taps, probe)
        settings = _settings(p, taps, per_shard, _checked_samples(p, per_shard, probe), model)
        if old is not None:
            same_run(old, settings, p.out)
            if old.get("complete"):  # finished already, with these settings: nothing to write
                return
        elif r.lead:
            write_json(p.out / "manifest.json", settings)
        r.barrier()
        done = shard_numbers(p.out) if old is not None else set()  # checked (damaged ones removed) by prepare
        error, rows, resumable = None, 0, True
        try:
            rows = _work(p, r, taps, per_shard, done, stream, progress)
        except HookscopeError as e:
            error, resumable = (f"{e}" if r.world == 1 else f"rank {r.rank}: {e}"), not isinstance(e, ExtractOverflowError)
        except Exception as e:  # another rank must not wait forever for this one's outcome
            if r.world == 1:
                raise
            error = f"rank {r.rank}: {type(e).__name__}: {e}"
        outcomes = r.gather((error, rows, resumable))
    failed = [e for e, _, _ in outcomes if e]
    if failed:
        raise HookscopeError(failed[0] + _after_failure(p, r, old, all(ok for _, _, ok in outcomes)))
    if r.lead:
        _finish(p, settings, max(n for _, n, _ in outcomes))
    r.barrier()


@checked
def extract(model: nn.Module, data: Any, *,
            layers: Layers | Mapping[str, Reduction] | Sequence[Selector | Mapping[str, Reduction]] | None = None,
            out: str | os.PathLike[str], keep: str = "output", reduce: Reduction = None,
            dtype: torch.dtype | None = None, batch_size: int | None = None, shard_size: int | str = "256MB",
            device: torch.device | str | None = None, workers: int = 0, resume: bool = False,
            overwrite: bool = False, on_error: str = "stop", progress: bool | None = None,
            ids: Sequence[str] | None = None, describe: Mapping[str, Any] | None = None) -> Store:
    """Run ``model`` over ``data`` and store the chosen layers' outputs (or inputs), one row per sample.

    Args:
        model: any ``nn.Module`` (DDP / DataParallel / compiled wrappers are seen through and the model
            inside runs as it is, with no collective per batch), in eval mode for reproducible values.
        data: a map-style ``Dataset``, a ``DataLoader`` (its dataset, batch size and collate function;
            not shuffled), a tensor or array whose rows are samples, or any iterable of batches (one
            process only). A sample may be a tensor, an ``(input, label)`` pair or a dict of keyword
            arguments (transformers models).
        layers: a layer name, glob or type (as :func:`hookscope.layers`), a dict ``{name: reduction}``,
            or a list of them.
        out: the store's folder (new or empty; an existing store needs ``resume`` or ``overwrite``).
        keep: ``"output"`` (default) or ``"input"`` of each layer (its first tensor).
        reduce: the reduction of layers without their own: ``None`` (all values), ``"mean"``/``"max"`` over
            every dimension after the channels (N x C x H x W -> N x C), ``"mean:1"`` (over the tokens of
            N x T x D), ``hookscope.at[:, -1]`` (positions), or a function of the batch tensor. Computed on
            the model's device before anything reaches the host.
        dtype: store floating-point values as this dtype (``torch.float16``, ``torch.bfloat16``).
        batch_size: samples per forward (default 32, or the DataLoader's).
        shard_size: bytes per shard file (``"256MB"``); host memory holds two shards' buffers at most.
        device: where the inputs go (default: the model's device).
        workers: DataLoader worker processes reading samples (0: this process).
        resume: continue a store a killed or failed run left (the same settings; refused otherwise).
        overwrite: replace a store already in ``out``.
        on_error: ``"stop"`` at the first sample that cannot be read, or ``"skip"`` it (listed in the manifest).
        progress: a progress line with samples/s on stderr (default: when stderr is a terminal).
        ids: an id per sample for the manifest (default: the dataset's ``ids`` or ImageFolder paths).
        describe: what the manifest says of the model, data and preprocessing (the CLI fills it).

    Returns:
        The :class:`~hookscope.store.Store` written, opened.

    Under ``torchrun`` (or inside your own initialised ``torch.distributed`` program) each rank writes
    every ``world``-th shard; the store is the same, byte for byte, as one process writes at the same torch
    thread count (torchrun gives each rank one thread; other counts may differ in the last bits).

    Example:
        >>> import tempfile, torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
        >>> folder = tempfile.mkdtemp()
        >>> store = hookscope.extract(net, torch.randn(10, 3, 8, 8), layers={"0": "mean"}, out=folder, batch_size=4)
        >>> store["0"].shape
        (10, 4)
    """
    chosen = [] if layers is None else list(layers) if isinstance(layers, (list, tuple)) else [layers]
    p = plan(model, data, chosen, out=out, keep=keep, reduce=reduce, dtype=dtype, batch_size=batch_size,
             shard_size=shard_size, device=device, workers=workers,
             on_error=on_error, ids=ids, describe=describe)
    r = ranks(p.device)
    try:
        _run(p, r, resume, overwrite, progress)
        return open_store(p.out)
    finally:
        r.close()
