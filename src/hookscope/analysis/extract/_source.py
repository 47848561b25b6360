"""Where extract's samples come from: a map-style ``Dataset`` (or the one inside a ``DataLoader``), a
tensor or array whose rows are samples, or any iterable of batches; and how a batch becomes the model's
call. A sample that cannot be read is never raised inside a loader worker: it comes back marked, and the
engine stops or skips it as the user chose."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, default_collate

from ..._tree import tensors, tree_map
from ...core.inputs import private
from ...core.text import first_line
from ...errors import HookscopeError

__all__ = ["Batch", "Source", "batch_rows", "first_input", "model_call", "rows_of", "source_of"]


@dataclass
class Batch:
    """Rows of the data: what the model is called with, each row's dataset index, and what was skipped.

    Example:
        >>> Batch(torch.zeros(2, 3), [4, 5]).rows
        2
    """

    inputs: Any
    indices: list[int]
    failed: list[dict[str, Any]] = field(default_factory=list)
    problem: str = ""  # the readable samples could not be put in one batch (collate failed): why
    own: bool = False  # the inputs are this run's own tensors (a gather, a collate), shared with no caller

    @property
    def rows(self) -> int:
        """How many samples the batch holds."""
        return len(self.indices)


@dataclass(frozen=True)
class _Failed:
    index: int
    error: str


class _Guarded(Dataset[Any]):
    """A dataset whose unreadable samples come back as :class:`_Failed` instead of raising (a worker's
    exception would reach the caller as a multi-line traceback)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        try:
            return self.data[i]
        except Exception as e:  # whatever the user's dataset raises, reported per sample
            return _Failed(i, first_line(e) or type(e).__name__)


class _Collate:
    """Collate the readable samples of one index batch; note the others."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate
        self.own = collate is default_collate  # it stacks the samples into new tensors; another may return views

    def __call__(self, items: list[tuple[int, Any]]) -> Batch:
        good = [(i, s) for i, s in items if not isinstance(s, _Failed)]
        failed = [{"index": i, "error": s.error} for i, s in items if isinstance(s, _Failed)]
        try:  # raised in a loader worker, an error would reach the caller as a multi-line traceback
            inputs = first_input(self.collate([s for _, s in good])) if good else None
        except Exception as e:
            return Batch(None, [i for i, _ in good], failed, first_line(e) or type(e).__name__)
        return Batch(inputs, [i for i, _ in good], failed, own=self.own)


class _Indexed(Dataset[Any]):
    def __init__(self, data: Dataset[Any]) -> None:
        self.data = data

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i, self.data[i]


class Source:
    """Samples by dataset index (``length`` known), or a stream of batches (``length`` None).

    Example:
        >>> s = source_of(torch.arange(10.).reshape(5, 2))
        >>> [b.indices for b in s.batches([[0, 1, 2], [3, 4]])]
        [[0, 1, 2], [3, 4]]
    """

    def __init__(self, length: int | None, ids: list[str] | None, info: dict[str, Any],
                 batch_size: int | None) -> None:
        self.length = length
        self.ids = ids
        self.info = info
        self.batch_size = batch_size

    def batches(self, groups: Sequence[Sequence[int]], *, workers: int = 0, pin: bool = False) -> Iterator[Batch]:
        """One :class:`Batch` per group of dataset indices, in order."""
        raise NotImplementedError

    def stream(self) -> Iterator[Batch]:
        """Every batch of an iterable, rows numbered from 0."""
        raise HookscopeError("this data is indexed by sample; iterate it with batches()")

    def fingerprint(self, seen: Sequence[Batch]) -> dict[str, Any]:
        """What a resumed run must find unchanged: kind, length, sample ids and the bytes of the ``seen`` samples."""
        ids = hashlib.sha256("\n".join(self.ids).encode()).hexdigest() if self.ids is not None else None
        h = hashlib.sha256()
        for b in seen:
            h.update(repr((b.indices, b.failed)).encode())
            for t in tensors(b.inputs):
                h.update(str((t.dtype, tuple(t.shape))).encode())
                h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return {"kind": self.info.get("kind"), "length": self.length, "ids_sha256": ids,
                "samples_checked": [b.indices[0] if b.indices else b.failed[0]["index"] for b in seen],
                "samples_sha256": h.hexdigest()}


class _Rows(Source):
    """A tensor or numpy array whose rows are samples: batches are slices, no loader."""

    def __init__(self, data: torch.Tensor | np.ndarray, ids: list[str] | None) -> None:
        kind = "tensor" if isinstance(data, torch.Tensor) else "ndarray"
        super().__init__(len(data), ids, {"kind": kind, "shape": list(data.shape), "dtype": str(data.dtype)}, None)
        self.data = data

    def batches(self, groups: Sequence[Sequence[int]], *, workers: int = 0, pin: bool = False) -> Iterator[Batch]:
        for group in groups:
            lo, hi = group[0], group[-1] + 1
            sliced = hi - lo == len(group)
            rows = self.data[lo:hi] if sliced else self.data[list(group)]  # a slice is a view, a gather a copy
            if isinstance(rows, torch.Tensor):
                yield Batch(rows, list(group), own=not sliced)
            else:
                array = np.ascontiguousarray(rows)
                yield Batch(torch.from_numpy(array), list(group), own=not np.may_share_memory(array, self.data))


class _Mapped(Source):
    """A map-style dataset read through a DataLoader whose batches are the groups given."""

    def __init__(self, data: Any, ids: list[str] | None, collate: Callable[[list[Any]], Any] | None,
                 batch_size: int | None) -> None:
        super().__init__(len(data), ids, {"kind": "dataset", "class": type(data).__name__, "length": len(data)},
                         batch_size)
        self.data = data
        self.collate = collate or default_collate

    def batches(self, groups: Sequence[Sequence[int]], *, workers: int = 0, pin: bool = False) -> Iterator[Batch]:
        if not groups:
            return iter(())
        loader = DataLoader(_Indexed(_Guarded(self.data)), batch_sampler=[list(g) for g in groups],
                            collate_fn=_Collate(self.collate), num_workers=workers, pin_memory=pin)
        return iter(loader)


class _Stream(Source):
    """Any iterable of batches: read once, in order; rows numbered as they come."""

    def __init__(self, data: Iterable[Any], batch_size: int | None) -> None:
        super().__init__(None, None, {"kind": "iterable", "class": type(data).__name__}, batch_size)
        self.data = data

    def stream(self) -> Iterator[Batch]:
        start = 0
        for raw in self.data:
            inputs = first_input(raw)
            n = batch_rows(inputs)
            yield Batch(inputs, list(range(start, start + n)))
            start += n


def _ids_of(data: Any, n: int | None, given: Sequence[str] | None) -> list[str] | None:
    ids = [str(i) for i in given] if given is not None else None
    if ids is None:
        found = getattr(data, "ids", None)
        samples = getattr(data, "samples", None)  # torchvision's ImageFolder: (path, class) pairs
        if isinstance(found, (list, tuple)):
            ids = [str(i) for i in found]
        elif isinstance(samples, (list, tuple)) and samples and isinstance(samples[0], (list, tuple)) \
                and all(isinstance(s[0], (str, os.PathLike)) for s in samples):
            ids = [os.fspath(s[0]) for s in samples]
    if ids is not None and n is not None and len(ids) != n:
        raise HookscopeError(f"ids= has {len(ids)} entries for {n} samples; give one id per sample")
    return ids


def _from_loader(loader: DataLoader[Any], ids: Sequence[str] | None) -> Source:
    if isinstance(loader.dataset, IterableDataset):
        return _Stream(loader, loader.batch_size)
    plain = isinstance(loader.sampler, SequentialSampler) and type(loader.batch_sampler) is BatchSampler \
        and loader.batch_sampler.sampler is loader.sampler and not loader.drop_last
    if not plain:
        raise HookscopeError("the DataLoader shuffles, samples, drops or batches its own way (sampler=, shuffle=True, "
                             "batch_sampler=, drop_last=True), which extract cannot follow shard by shard; pass "
                             "DataLoader(dataset, batch_size=...) or the dataset itself (a Subset for some samples)")
    data = loader.dataset
    return _Mapped(data, _ids_of(data, len(data), ids), loader.collate_fn, loader.batch_size)  # type: ignore[arg-type]


def source_of(data: Any, ids: Sequence[str] | None = None) -> Source:
    """The :class:`Source` for ``data``, or a one-line error saying what data extract takes.

    Example:
        >>> source_of(iter([torch.zeros(2, 3)])).length is None   # an iterable of batches
        True
        >>> source_of([torch.zeros(3), torch.ones(3)]).length   # a list is a dataset of samples, as for DataLoader
        2
    """
    if isinstance(data, np.ndarray) and data.dtype.kind not in "biuf":
        raise HookscopeError(f"data is a numpy array of dtype {data.dtype}; give numbers (bool, int or float)")
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim == 0:
            raise HookscopeError("data is a single number; give a tensor whose rows are samples")
        return _Rows(data, _ids_of(data, len(data), ids))
    if isinstance(data, DataLoader):
        return _from_loader(data, ids)
    if isinstance(data, (str, bytes)) or isinstance(data, dict):
        raise HookscopeError(f"data={type(data).__name__} is not a dataset; give a torch Dataset, a DataLoader, "
                             "a tensor whose rows are samples, or an iterable of batches (files: hookscope extract)")
    if not isinstance(data, IterableDataset) and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _Mapped(data, _ids_of(data, len(data), ids), None, None)
    if hasattr(data, "__iter__"):
        if ids is not None:
            raise HookscopeError("ids= needs data with a length (a Dataset or a tensor), not an iterable of batches")
        return _Stream(data, None)
    raise HookscopeError(f"data of type {type(data).__name__} is not something extract reads; give a torch "
                         "Dataset, a DataLoader, a tensor whose rows are samples, or an iterable of batches")


def first_input(batch: Any) -> Any:
    """What the model is called with: the batch, its first item ``(input, label)``, or a dict of keywords.

    Example:
        >>> first_input((torch.ones(2, 3), torch.tensor([0, 1]))).shape
        torch.Size([2, 3])
    """
    if isinstance(batch, (tuple, list)) and batch:
        return batch[0]
    return batch


def batch_rows(inputs: Any) -> int:
    """How many samples a batch holds (the first dimension of its first tensor).

    Example:
        >>> batch_rows({"input_ids": torch.zeros(4, 7, dtype=torch.long)})
        4
    """
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t), inputs)
    if not found or found[0].dim() == 0:
        raise HookscopeError(f"a batch of type {type(inputs).__name__} holds no batch-first tensor; give batches "
                             "of tensors (N x ...), (input, label) pairs or dicts of model keyword arguments")
    return int(found[0].shape[0])


def model_call(model: Callable[..., Any], inputs: Any, device: torch.device, *, own: bool = False) -> Any:
    """Call ``model`` on a batch's inputs (:func:`first_input`) on ``device``, a dict as keywords: a private
    copy of the caller's tensors (made on ``device``: one copy), or, when the batch is ``own`` (a gather, a
    collate), its tensors themselves, moved.

    Example:
        >>> x = torch.ones(1, 2)
        >>> model_call(lambda t: t.div_(2), x, torch.device("cpu")).tolist(), x.tolist()
        ([[0.5, 0.5]], [[1.0, 1.0]])
    """
    moved = tree_map(lambda t: t.to(device, non_blocking=True), inputs) if own else private(inputs, device)
    if isinstance(moved, dict):
        return model(**moved)
    return model(moved)


def rows_of(inputs: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of every tensor of a batch's inputs.

    Example:
        >>> rows_of({"ids": torch.arange(6).reshape(3, 2)}, 1, 2)
        {'ids': tensor([[2, 3]])}
    """
    return tree_map(lambda t: t[lo:hi], inputs)
