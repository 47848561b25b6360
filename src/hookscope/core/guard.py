"""Copy-on-write protection for recorded tensors.

A recorded tensor is kept by reference (no copy) and the tensor the model goes on with is replaced
by an alias of a tensor subclass, :class:`Guarded`. Its ``__torch_function__`` runs only for the ops
that receive a recorded tensor (or a view of one), so the model pays nothing elsewhere. When such
an op is about to write into the recorded memory (``relu_``, ``+=``, ``inplace=True``, ``out=``,
``__setitem__``, ...), the record is cloned first. Writes that bypass Python (C++ extensions) are
caught afterwards by the version counter: reading such a record raises :class:`MutationError`.

Measured alternative: a global ``TorchFunctionMode`` sees every op of the model and cost ~5% on
resnet18, batch 1, on the CPU before copying anything; this subclass costs only where records are.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from ..errors import MutationError

__all__ = ["Slot", "Guarded", "protect", "release", "plain"]

_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
               "lshift", "rshift", "matmul")
) | {"__setitem__"}
# Trailing underscore, yet the data stays as it was.
_NOT_WRITING = frozenset(
    {"requires_grad_", "retain_grad_", "share_memory_", "detach_", "rename_", "names_",
     "pin_memory_", "record_stream_"}
)


class Slot:
    """One kept tensor and how to read it back safely.

    ``policy`` is ``"auto"`` (clone just before anything writes into it), ``"never"`` (never copy;
    a write poisons the slot so reading it raises) or ``"copied"`` (already an own copy).
    """

    __slots__ = ("value", "version", "policy", "_where", "mutated_by")

    def __init__(self, value: torch.Tensor, policy: str, where: Any) -> None:
        self.value = value
        self.policy = policy
        self._where = where  # a str, or (field, name, call index) formatted only for an error
        self.mutated_by: str | None = None
        # inference tensors have no version counter (reading it raises)
        self.version = None if policy == "copied" or value.is_inference() else value._version

    @property
    def where(self) -> str:
        if isinstance(self._where, tuple):
            field, name, index = self._where
            return f"{field} of {name!r} (call {index})"
        return str(self._where)

    def get(self) -> torch.Tensor:
        """The kept tensor; raises :class:`MutationError` if its values were overwritten."""
        if self.mutated_by is None and self.version is not None and self.value._version != self.version:
            self.mutated_by = "an in-place operation outside hookscope's view"
        if self.mutated_by is not None:
            fix = "copy='always'" if self.policy == "auto" else "copy='auto' (the default) or copy='always'"
            raise MutationError(
                f"the recorded {self.where} was overwritten in place by {self.mutated_by} after it "
                f"was recorded, so its values are gone; record it with {fix}"
            )
        return self.value

    def before_write(self, op: str) -> None:
        if self.policy == "auto":
            self.value = self.value.clone()
            self.policy, self.version = "copied", None
        elif self.policy == "never":
            self.mutated_by = f"'{op}'"


_lock = threading.Lock()
_registry: dict[int, list[Slot]] = {}  # storage data_ptr -> slots kept on that storage
_writes: dict[Any, bool] = {}  # func -> writes into its first argument?


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _guardable(t: torch.Tensor) -> bool:
    return t.layout is torch.strided and not t.is_meta and t.numel() > 0


def protect(original: torch.Tensor, slot: Slot) -> torch.Tensor:
    """Register ``slot`` as kept on ``original``'s memory; return the alias the model should use."""
    with _lock:
        _registry.setdefault(_key(original), []).append(slot)
    return guarded(original)


def guarded(original: torch.Tensor) -> torch.Tensor:
    """A :class:`Guarded` alias of ``original``; by itself it keeps nothing and copies nothing."""
    if type(original) is Guarded:
        return original
    with DisableTorchFunctionSubclass():
        return original.as_subclass(Guarded)


def release(slots: list[Slot]) -> None:
    """Stop watching ``slots`` (the capture that kept them has ended)."""
    if not slots:
        return
    ids = {id(s) for s in slots}
    with _lock:
        for key in list(_registry):
            kept = [s for s in _registry[key] if id(s) not in ids]
            if kept:
                _registry[key] = kept
            else:
                del _registry[key]


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as an ordinary ``torch.Tensor`` (an alias if it was :class:`Guarded`)."""
    if type(t) is Guarded:
        with DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def _op_writes(func: Any, kwargs: dict[str, Any]) -> bool:
    writes = _writes.get(func)
    if writes is None:
        schema = getattr(func, "_schema", None)  # torch.ops.aten.relu_.default and friends
        if schema is not None:
            writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        else:
            name = getattr(func, "__name__", "")
            writes = name in _INPLACE_DUNDERS or (
                name.endswith("_") and not name.endswith("__") and name not in _NOT_WRITING
            )
        _writes[func] = writes
    return writes or bool(kwargs.get("inplace")) or kwargs.get("out") is not None


def _written(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    targets: list[Any] = []
    if args:
        targets.append(args[0])
    for k in ("out", "input", "self"):
        if kwargs.get(k) is not None:
            targets.append(kwargs[k])
    flat: list[torch.Tensor] = []
    for t in targets:
        if isinstance(t, torch.Tensor):
            flat.append(t)
        elif isinstance(t, (list, tuple)):
            flat.extend(x for x in t if isinstance(x, torch.Tensor))
    return flat


def _copy_before_write(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not _registry:
        return
    op = getattr(func, "__name__", repr(func))
    for t in _written(args, kwargs):
        if not _guardable(t):
            continue
        with _lock:
            slots = _registry.pop(_key(t), None)
        for s in slots or ():
            s.before_write(op)


class Guarded(torch.Tensor):
    """A tensor whose memory holds a hookscope record; writes into it copy the record first.

    Model code never needs to know: it behaves as a ``torch.Tensor`` in every op, and hookscope
    hands an ordinary tensor back at the model's output.
    """

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if _op_writes(func, kwargs):
            _copy_before_write(func, args, kwargs)
        with DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        # a view of recorded memory (x.view, x[:, :3], x.T) must stay guarded too
        if type(ret) is torch.Tensor and ret._base is not None and _registry and _guardable(ret) \
                and _key(ret) in _registry:
            with DisableTorchFunctionSubclass():
                ret = ret.as_subclass(Guarded)
        return ret

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return repr(plain(self))
