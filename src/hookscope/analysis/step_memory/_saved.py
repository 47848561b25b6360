"""What autograd saves for backward, told through ``torch.autograd.graph.saved_tensors_hooks``.

:class:`SavedTensors` is the pair of hooks: ``pack`` sees every tensor autograd saves and charges
its storage, once, to the innermost module whose forward is running (the top of a per-thread
:class:`~hookscope.core.calls.CallStack` that module hooks keep); ``unpack`` hands it back in
backward. A storage is keyed by its ``StorageImpl`` and remembered through a storage weak
reference, so a storage freed mid-forward whose address is reused counts as the new storage it is.
The parameters' and buffers' storages are told apart: memory the model holds anyway.

A pack hook that returns the tensor turns off autograd's own check that a saved tensor was not
written in place before backward used it; ``unpack`` makes the same check, so a model that would
fail without hookscope fails with it, naming the module that saved the tensor.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ...core.calls import CallStack
from ...core.text import dtype_text, shape_text
from ...errors import HookscopeError

__all__ = ["Open", "SavedTensors", "storage_of", "distinct_bytes"]

# a module call that has begun: its name, the module, what it received (for a failure message)
Open = tuple[str, torch.nn.Module, tuple[Any, ...], dict[str, Any]]
OUTSIDE = None  # where a tensor saved while no module of the model runs (the loss) is charged


def storage_of(t: torch.Tensor) -> tuple[int | None, int]:
    """``(key, bytes)`` of the storage ``t`` keeps alive: the whole storage, also for a view of part
    of it. ``key`` is ``None`` for a tensor without one storage (sparse, nested, some subclasses),
    whose bytes are then its elements'.

    Example:
        >>> x = torch.zeros(4, 4)
        >>> storage_of(x[:1])[0] == storage_of(x)[0], storage_of(x[:1])[1]
        (True, 64)
    """
    try:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        if t.layout == torch.sparse_coo:
            return None, t._values().nbytes + t._indices().nbytes
        return None, t.element_size() * t.numel()


def distinct_bytes(tensors: Iterable[torch.Tensor], seen: set[int]) -> int:
    """Bytes of the storages of ``tensors`` not in ``seen`` (which is updated): each storage once.

    Example:
        >>> w = torch.zeros(2, 3)
        >>> seen: set[int] = set()
        >>> distinct_bytes([w, w.t(), torch.zeros(2)], seen), distinct_bytes([w], seen)
        (32, 0)
    """
    found = 0
    for t in tensors:
        key, size = storage_of(t)
        if key is None or key not in seen:
            found += size
            if key is not None:
                seen.add(key)
    return found


class _Held:
    """What autograd keeps for one saved tensor: the tensor (detached: no grad_fn, so no reference
    cycle through the graph), its version when saved and where it was saved."""

    __slots__ = ("tensor", "version", "where", "__weakref__")

    def __init__(self, tensor: torch.Tensor, version: int | None, where: str | None) -> None:
        self.tensor, self.version, self.where = tensor, version, where


class SavedTensors:
    """The saved-tensor hooks of one step and what they counted, per module name.

    ``own[name]``: bytes of storages first saved while ``name`` was the innermost running module
    (``None``: outside every module); ``model_saved[name]``: the same for storages of the model's
    parameters and buffers; ``alive``, ``peak``: bytes held for backward now and at most.

    Example:
        >>> net = torch.nn.Linear(3, 2)
        >>> saved = SavedTensors(lambda: {p.untyped_storage()._cdata for p in net.parameters()})
        >>> saved.calls.push(("fc", net, (), {}))
        >>> with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        ...     y = net(torch.zeros(4, 3))
        >>> saved.own, saved.model_saved, saved.peak  # the input, for the weight's gradient
        ({'fc': 48}, {}, 48)
    """

    def __init__(self, model_storages: Callable[[], set[int]], *, lazy: bool = False) -> None:
        self.calls: CallStack[Open] = CallStack()
        self.own: dict[str | None, int] = {}
        self.model_saved: dict[str | None, int] = {}
        self.alive = 0
        self.peak = 0
        self._model_storages = model_storages
        self._model = model_storages()
        self._lazy = lazy  # lazy modules make their parameters during the pass: asked again on a miss
        self._seen: dict[int, StorageWeakRef] = {}
        self._held: dict[int, list[int]] = {}  # storage -> [saved tensors alive, bytes]

    def _is_model(self, key: int) -> bool:
        if key not in self._model and self._lazy:
            self._model = self._model_storages()
        return key in self._model

    def _charge(self, key: int | None, size: int, where: str | None, storage: torch.UntypedStorage | None) -> bool:
        """Count a storage the first time it is saved; ``True`` when it is activation memory."""
        if key is not None and self._is_model(key):
            if key not in self._seen:
                self._seen[key] = StorageWeakRef(storage)
                self.model_saved[where] = self.model_saved.get(where, 0) + size
            return False
        ref = self._seen.get(key) if key is not None else None
        if ref is None or ref.expired():  # new, or a freed storage's address reused
            if key is not None:
                self._seen[key] = StorageWeakRef(storage)
            self.own[where] = self.own.get(where, 0) + size
        return True

    def pack(self, t: torch.Tensor) -> _Held:
        key, size = storage_of(t)
        top = self.calls.top()
        where = top[0] if top is not None else OUTSIDE
        storage = t.untyped_storage() if key is not None else None
        held = _Held(t.detach(), None if t.is_inference() else t._version, where)
        if self._charge(key, size, where, storage):
            self._hold(held, key, size)
        return held

    def _hold(self, held: _Held, key: int | None, size: int) -> None:
        """Bytes held for backward: a storage counts from its first saved tensor to its last freed."""
        if key is not None:
            entry = self._held.setdefault(key, [0, size])
            entry[0] += 1
            if entry[0] > 1:
                size = 0  # held already
        self.alive += size
        self.peak = max(self.peak, self.alive)
        weakref.finalize(held, self._release, key, size).atexit = False

    def _release(self, key: int | None, size: int) -> None:
        if key is not None:
            entry = self._held[key]
            entry[0] -= 1
            if entry[0]:
                return
            size = entry[1]
            del self._held[key]
        self.alive -= size

    def unpack(self, held: _Held) -> torch.Tensor:
        t = held.tensor
        if held.version is not None and t._version != held.version:
            where = ("outside the model" if held.where is None
                     else f"in {held.where!r}" if held.where else "in the model's own forward")
            raise HookscopeError(
                f"a tensor saved for backward {where} ({shape_text(tuple(t.shape))} {dtype_text(t.dtype)}) "
                f"was changed in place after it was saved (version {t._version}, saved at {held.version}): "
                "its gradient would be wrong; use the out-of-place op there (x = x * 2, not x.mul_(2))")
        return t
