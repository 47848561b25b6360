"""Dense memory helpers for the reductions: a 1-D view of a tensor, reusable scratch buffers, and a
memo keyed by the elements a tensor shows (storage, offset, layout, version)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

import torch

__all__ = ["Scratch", "TensorMemo", "dense_view", "flat", "is_dense"]


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
    return x.as_strided((x.numel(),), (1,), x.storage_offset()) if is_dense(x) else None


def is_dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill one dense block of memory, in some order (see :func:`dense_view`).

    Example:
        >>> a = torch.zeros(2, 3)
        >>> is_dense(a.t()), is_dense(a[:, 1:]), is_dense(a.expand(2, 2, 3))
        (True, False, False)
    """
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


_Key = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype, bool, bool]
_V = TypeVar("_V")


class TensorMemo(Generic[_V]):
    """Values computed from a tensor's elements, found again for any tensor that shows the same
    elements at the same version: the same tensor, a ``view``/``flatten``/``reshape`` of it, or a
    transpose of a dense block.

    The key is the identity of the tensor's base (the tensor every view of it points to and shares
    its version counter with; held weakly, so a freed tensor takes its entries with it and a new
    tensor at the old address is never mistaken for it), the storage offset, the layout (the number
    of elements for a dense block, else shape and strides), dtype, neg and conj bits, and the version
    counter (an in-place write makes a new version). A tensor over the same memory with a version
    counter of its own (``t.data``, ``t.detach()``) is another base: its writes are not seen in
    ``t``'s counter, so nothing is shared with it. Inference tensors have no version counter and are
    never remembered.

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
        self._seen: dict[_Key, tuple[weakref.ref[torch.Tensor], int, int, _V]] = {}
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}  # base id -> its weak reference
        self._keys: dict[int, set[_Key]] = {}  # base id -> its keys, dropped with the base

    def get(self, t: torch.Tensor) -> _V | None:
        """The value put for these elements at this version, or ``None``."""
        found = self._identify(t)
        if found is None:
            return None
        base, key, version, address = found
        hit = self._seen.get(key)
        if hit is None or hit[0]() is not base or hit[1] != version or hit[2] != address:
            return None
        return hit[3]

    def setdefault(self, t: torch.Tensor, make: Callable[[], _V]) -> _V:
        """The value remembered for ``t``'s elements at this version, else ``make()``, remembered.

        Example:
            >>> memo: TensorMemo[int] = TensorMemo()
            >>> a = torch.ones(3)
            >>> memo.setdefault(a, lambda: 1), memo.setdefault(a[:], lambda: 2)
            (1, 1)
        """
        found = self._identify(t)
        if found is None:
            return make()
        base, key, version, address = found
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is base and hit[1] == version and hit[2] == address:
            return hit[3]
        value = make()
        self._store(found, value)
        return value

    def put(self, t: torch.Tensor, value: _V) -> None:
        """Remember ``value`` for ``t``'s elements at their current version (nothing if ``t`` cannot
        be identified: an inference tensor, a sparse or storage-less one)."""
        found = self._identify(t)
        if found is not None:
            self._store(found, value)

    def _store(self, found: tuple[torch.Tensor, _Key, int, int], value: _V) -> None:
        base, key, version, address = found
        bid = key[0]
        ref = self._refs.get(bid)
        if ref is None or ref() is not base:
            self._drop(bid)
            ref = self._refs[bid] = weakref.ref(base, partial(self._dead, bid))
            self._keys[bid] = set()
        self._keys[bid].add(key)
        self._seen[key] = (ref, version, address, value)

    def _dead(self, bid: int, ref: weakref.ref[torch.Tensor]) -> None:
        if self._refs.get(bid) is ref:
            self._drop(bid)

    def _drop(self, bid: int) -> None:
        self._refs.pop(bid, None)
        for key in self._keys.pop(bid, ()):
            self._seen.pop(key, None)

    @staticmethod
    def _identify(t: torch.Tensor) -> tuple[torch.Tensor, _Key, int, int] | None:
        """(base, key, version, storage address): the address catches a base whose storage was
        swapped (``base.data = other``) without a new version."""
        if t.layout != torch.strided or t.is_inference():
            return None
        try:
            version, address = t._version, t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        base = t._base if t._base is not None else t
        dense = is_dense(t)
        shape = (t.numel(),) if dense else tuple(t.shape)
        strides = () if dense else tuple(t.stride())
        key = (id(base), int(t.storage_offset()), shape, strides, t.dtype, t.is_neg(), t.is_conj())
        return base, key, version, address
