"""Dense memory helpers for the reductions: a 1-D view of a tensor, reusable scratch buffers, and a
memo keyed by the elements a tensor shows (storage, offset, layout, version)."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Generic, TypeVar

import torch

__all__ = ["Scratch", "TensorMemo", "dense_view", "flat"]


class Scratch:
    """Reusable CPU buffers, one per dtype: a fresh large allocation page-faults on every call."""

    def __init__(self) -> None:
        self._buf: dict[torch.dtype, torch.Tensor] = {}

    def get(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buf.get(dtype)
        if buf is None or buf.numel() < n:
            buf = self._buf[dtype] = torch.empty(n, dtype=dtype)
        return buf[:n]


def flat(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 1-D tensor, a view whenever its memory is dense (contiguous or channels-last)."""
    if x.is_contiguous():
        return x.view(-1)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(-1)  # for reductions, which ignore the order
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return x.permute(0, 2, 3, 4, 1).reshape(-1)
    return x.reshape(-1)


def dense_view(x: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of the memory ``x`` covers if its elements fill one dense block (contiguous, or
    any permutation of a contiguous layout: a transpose, channels-last), else ``None``.

    Its statistics are those of ``x``: the same elements, in memory order.

    Example:
        >>> a = torch.arange(6.0).view(2, 3)
        >>> dense_view(a.t()).tolist(), dense_view(a[:, :2])
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], None)
    """
    if x.layout != torch.strided:
        return None
    if x.is_contiguous():
        return x.view(-1)
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return None
        expected *= size
    return x.as_strided((x.numel(),), (1,), x.storage_offset())


_Key = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype, bool, bool]
_V = TypeVar("_V")


class TensorMemo(Generic[_V]):
    """Values computed from a tensor's elements, found again for any tensor that shows the same
    elements at the same version: the same tensor, a ``view``/``flatten``/``reshape`` of it, or a
    transpose of a dense block.

    The key is the identity of the storage (held weakly: a freed storage takes its entries with it,
    so a new tensor at the old address is never mistaken for the old one), the storage offset, the
    layout (the number of elements for a dense block, else shape and strides), dtype, neg and conj
    bits, and the version counter (an in-place write makes a new version). Inference tensors have no
    version counter and are never remembered.

    Example:
        >>> memo: TensorMemo[str] = TensorMemo()
        >>> a = torch.ones(2, 3)
        >>> memo.put(a, "seen")
        >>> memo.get(a.flatten()), memo.get(a.t()), memo.get(a[0])
        ('seen', 'seen', None)
        >>> _ = a.add_(1)
        >>> memo.get(a) is None
        True
    """

    def __init__(self) -> None:
        self._seen: dict[_Key, tuple[weakref.ref[torch.UntypedStorage], int, _V]] = {}
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}  # storage id -> its weak reference
        self._keys: dict[int, set[_Key]] = {}  # storage id -> its keys, dropped with the storage

    def get(self, t: torch.Tensor) -> _V | None:
        """The value put for these elements at this version, or ``None``."""
        found = self._identify(t)
        if found is None:
            return None
        storage, key, version = found
        hit = self._seen.get(key)
        if hit is None or hit[0]() is not storage or hit[1] != version:
            return None
        return hit[2]

    def put(self, t: torch.Tensor, value: _V) -> None:
        """Remember ``value`` for ``t``'s elements at their current version (nothing if ``t`` cannot
        be identified: an inference tensor, a sparse or storage-less one)."""
        found = self._identify(t)
        if found is None:
            return
        storage, key, version = found
        sid = key[0]
        ref = self._refs.get(sid)
        if ref is None or ref() is not storage:
            self._drop(sid)
            ref = self._refs[sid] = weakref.ref(storage, partial(self._dead, sid))
            self._keys[sid] = set()
        self._keys[sid].add(key)
        self._seen[key] = (ref, version, value)

    def _dead(self, sid: int, ref: weakref.ref[torch.UntypedStorage]) -> None:
        if self._refs.get(sid) is ref:
            self._drop(sid)

    def _drop(self, sid: int) -> None:
        self._refs.pop(sid, None)
        for key in self._keys.pop(sid, ()):
            self._seen.pop(key, None)

    @staticmethod
    def _identify(t: torch.Tensor) -> tuple[torch.UntypedStorage, _Key, int] | None:
        if t.layout != torch.strided or t.is_inference():
            return None
        try:
            storage = t.untyped_storage()
            version = t._version
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        dense = dense_view(t) is not None
        shape = (t.numel(),) if dense else tuple(t.shape)
        strides = () if dense else tuple(t.stride())
        key = (id(storage), int(t.storage_offset()), shape, strides, t.dtype, t.is_neg(), t.is_conj())
        return storage, key, version
