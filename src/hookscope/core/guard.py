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

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from .._tree import tensors, tree_map
from ..errors import MutationError

__all__ = ["Slot", "Guarded", "protect", "release", "plain", "origin", "guardable", "settle", "settle_inputs",
           "FAST_PATH_TYPES", "plain_output",
           "storage_key", "held_by"]

_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
               "lshift", "rshift", "matmul")
) | {"__setitem__"}
# Hand the memory to code hookscope cannot watch (numpy, DLPack, raw storage or pointer), or move
# it (share_memory_ changes the data pointer records are filed under): copied first.
_ESCAPES = frozenset(
    {"numpy", "__array__", "__dlpack__", "untyped_storage", "storage", "_typed_storage",
     "data_ptr", "share_memory_"}
)
# Trailing underscore, yet the data stays as it was.
_NOT_WRITING = frozenset(
    {"requires_grad_", "retain_grad_", "detach_", "rename_", "names_", "pin_memory_", "record_stream_"}
)
# Functions that write into arguments other than the first (by position or keyword name).
_WRITES_ARGS: dict[Any, tuple[int | str, ...]] = {
    torch.nn.functional.batch_norm: (1, 2, "running_mean", "running_var"),
    torch.nn.functional.instance_norm: (1, 2, "running_mean", "running_var"),
    torch.nn.functional.embedding: (1, "weight"),  # max_norm renormalises the weight in place
    torch.Tensor.set_: (1, "source"),  # the tensor set_ makes an alias of
}


class Slot:
    """One kept tensor and how to read it back safely.

    ``policy`` is ``"auto"`` (clone just before anything writes into it), ``"never"`` (never copy;
    a write poisons the slot so reading it raises) or ``"copied"`` (already an own copy).
    """

    __slots__ = ("value", "version", "policy", "_where", "mutated_by", "blind", "fix")

    def __init__(self, value: torch.Tensor, policy: str, where: Any, fix: str | None = None) -> None:
        self.value = value
        self.fix = fix  # how to record it so that this cannot happen, when the policy does not say it
        self.policy = policy
        self._where = where  # a str, or (field, name, call index) formatted only for an error
        self.mutated_by: str | None = None
        self.blind: str | None = None  # why a write could go unseen (then reading raises)
        # inference tensors have no version counter (reading it raises)
        self.version = None if policy == "copied" or value.is_inference() else value._version

    @property
    def where(self) -> str:
        if isinstance(self._where, tuple):
            field, name, index = self._where
            return f"{field} of {name!r} (call {index})"
        return str(self._where)

    def get(self) -> torch.Tensor:
        """The kept tensor; raises :class:`MutationError` if its values were overwritten, or could
        have been with no witness."""
        self._check_version()
        if self.mutated_by is None and self.blind is not None:
            fix = "copy='auto' (the default) or copy='always'" if self.fix is None else self.fix
            raise MutationError(f"the recorded {self.where} cannot be vouched for: {self.blind}"
                                + (f"; record it with {fix}" if fix else ""))
        if self.mutated_by is not None:
            fix = self.fix or ("copy='always'" if self.policy == "auto"
                                else "copy='auto' (the default) or copy='always'")
            raise MutationError(
                f"the recorded {self.where} was overwritten in place by {self.mutated_by} after it "
                f"was recorded, so its values are gone; record it with {fix}"
            )
        return self.value

    def _check_version(self) -> None:
        if self.mutated_by is None and self.version is not None and self.value._version != self.version:
            self.mutated_by = "an in-place operation outside hookscope's view"

    def before_write(self, op: str) -> None:
        self._check_version()  # already overwritten through a plain reference: a copy now would hide it
        if self.mutated_by is not None:
            return
        if self.policy == "auto":
            self.value = self.value.clone()
            self.policy, self.version = "copied", None
        elif self.policy == "never":
            self.mutated_by = f"'{op}'"

    def before_handover(self, where: str) -> None:
        """The memory goes on as a plain tensor (to the caller, a compiled graph, a fast path):
        under ``"auto"`` keep a copy; under ``"never"`` the version counter still tells a write."""
        if self.policy == "auto":
            self.before_write(where)

    def before_escape(self, where: str) -> None:
        """The memory is handed to code whose writes no one sees (numpy, DLPack, a compiled graph)."""
        if self.policy == "auto":
            self.before_write(where)
        elif self.policy == "never" and self.mutated_by is None:
            self.mutated_by = f"{where} (memory handed outside PyTorch's view, so a write cannot be ruled out)"


_lock = threading.Lock()
_registry: dict[int, list[Slot]] = {}  # storage data_ptr -> slots kept on that storage
_aliases: dict[int, list[weakref.ref[Guarded]]] = {}  # storage data_ptr -> Guarded aliases
_writes: dict[Any, int] = {}  # func -> what it does to its first argument (see _kind)


def _key(t: torch.Tensor) -> int:
    with DisableTorchFunctionSubclass():  # untyped_storage() of a Guarded tensor is an escape
        return t.untyped_storage().data_ptr()


def storage_key(t: torch.Tensor) -> int:
    """What records are filed under: the address of ``t``'s memory (its storage's data pointer)."""
    return _key(t)


def held_by(module: torch.nn.Module, args: tuple[Any, ...]) -> Callable[[], set[int]]:
    """The memory a module's caller and the module itself hold plain references to (its inputs,
    parameters and buffers), as a function computed once, only when asked: a record on that memory
    cannot be guarded, since writes through those references never reach an alias."""
    found: list[set[int]] = []

    def held() -> set[int]:
        if not found:
            own = itertools.chain(tensors(args), module.parameters(), module.buffers())
            found.append({_key(t) for t in own if guardable(t)})
        return found[0]

    return held


def guardable(t: torch.Tensor) -> bool:
    """Whether ``t`` can be watched for writes (a strided tensor with real, non-empty memory)."""
    return t.layout is torch.strided and not t.is_meta and t.numel() > 0


def protect(original: torch.Tensor, slot: Slot) -> torch.Tensor:
    """Register ``slot`` as kept on ``original``'s memory; return the alias the model should use."""
    key = _key(original)
    with _lock:
        _registry.setdefault(key, []).append(slot)
    return guarded(original, key)


def guarded(original: torch.Tensor, key: int | None = None) -> torch.Tensor:
    """A :class:`Guarded` alias of ``original``; by itself it keeps nothing and copies nothing."""
    if type(original) is Guarded:
        return original
    with DisableTorchFunctionSubclass():
        alias = original.as_subclass(Guarded)
    vars(alias)["_origin"] = original  # a gradient hook on the alias dies with an in-place op on it; on this one it fires
    ref = weakref.ref(alias)
    with _lock:
        refs = _aliases.setdefault(_key(original) if key is None else key, [])
        n = len(refs)
        if n >= 64 and n & (n - 1) == 0:  # views made over a long block: forget the ones already gone, at
            refs[:] = [r for r in refs if r() is not None]  # doubling lengths only (a split into 10k pieces stays linear)
        refs.append(ref)
    return alias


def _drop(key: int) -> None:
    """Nothing is kept on ``key`` any more: its aliases become ordinary tensors again (call locked).

    A model may store an alias on itself (``self.saved = out``); after the block it must hold a
    plain ``torch.Tensor``, indistinguishable from what it would hold without hookscope.
    """
    for ref in _aliases.pop(key, ()):
        alias = ref()
        if alias is not None and type(alias) is Guarded:
            alias.__class__ = torch.Tensor  # type: ignore[assignment]
            vars(alias).pop("_origin", None)


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
                _drop(key)


def origin(t: torch.Tensor) -> torch.Tensor:
    """The tensor a :class:`Guarded` alias was made of (``t`` itself for any other tensor).

    An in-place op on the alias, a view, drops the gradient hooks registered on the alias; hooks on
    the tensor it was made of still fire, with the gradient of the values before the op. A module
    that returns an alias it was given (Dropout in eval mode, an identity) has that gradient as its
    ``grad_output``.

    Example:
        >>> o = torch.ones(2, requires_grad=True) * 1
        >>> origin(guarded(o)) is o, origin(o) is o
        (True, True)
    """
    found = vars(t).get("_origin") if type(t) is Guarded else None
    return found if isinstance(found, torch.Tensor) else t


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as an ordinary ``torch.Tensor`` (an alias if it was :class:`Guarded`)."""
    if type(t) is Guarded:
        with DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


_READS, _WRITES, _ESCAPES_KIND = 0, 1, 2


def _kind(func: Any) -> int:
    """Whether ``func`` writes into its first argument, hands its memory outside, or only reads."""
    kind = _writes.get(func)
    if kind is None:
        schema = getattr(func, "_schema", None)  # torch.ops.aten.relu_.default and friends
        name = getattr(func, "__name__", "")
        if schema is not None:
            writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        else:
            writes = name in _INPLACE_DUNDERS or (
                name.endswith("_") and not name.endswith("__") and name not in _NOT_WRITING
            )
        kind = _WRITES if writes else _ESCAPES_KIND if name in _ESCAPES else _READS
        _writes[func] = kind
    return kind


def _op_writes(func: Any, kwargs: dict[str, Any]) -> bool:
    return _kind(func) == _WRITES or bool(kwargs.get("inplace")) or kwargs.get("out") is not None


def _written(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    targets: list[Any] = []
    if args:
        targets.append(args[0])
    for k in ("out", "input", "self", "tensor"):  # nn.init passes tensor=...
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
        if guardable(t):
            _settle_key(_key(t), op, escape=False)


def _settle_key(key: int, op: str, escape: bool) -> None:
    with _lock:
        slots = _registry.pop(key, None)
        if slots is not None:
            _drop(key)
    for s in slots or ():
        if escape:
            s.before_escape(op)
        else:
            s.before_write(op)


def _hand_over_key(key: int, where: str) -> None:
    with _lock:
        slots = _registry.get(key)
        if not slots:
            return
        kept = [s for s in slots if s.policy != "auto"]
        if kept:
            _registry[key] = kept
        else:
            del _registry[key]
            _drop(key)
    for s in slots:
        s.before_handover(where)


def settle(t: Any, where: str, *, escape: bool = False, memo: dict[int, Any] | None = None) -> Any:
    """``t`` (any nested value) made plain for code hookscope cannot watch; records on it copied first.

    For a boundary such as the model's caller, a compiled graph (which refuses tensor subclasses)
    or a module whose fast path a tensor subclass would switch off (``nn.MultiheadAttention``,
    ``nn.TransformerEncoder``): the records kept on the memory handed over are copied under
    ``copy="auto"``; under ``copy="never"`` the version counter still tells a later write, or, with
    ``escape=True`` (numpy, DLPack: writes no counter sees), the record is marked unverifiable.
    """
    memo = {} if memo is None else memo  # one tensor passed twice stays one (MHA's query is key)
    if isinstance(t, torch.Tensor):
        if id(t) not in memo:
            if _registry and guardable(t):
                key = _key(t)
                if key in _registry:
                    _settle_key(key, where, escape=True) if escape else _hand_over_key(key, where)
            memo[id(t)] = plain(t)
        return memo[id(t)]
    if isinstance(t, (tuple, list)) and not hasattr(t, "_fields"):
        new = [settle(x, where, escape=escape, memo=memo) for x in t]
        return t if all(a is b for a, b in zip(new, t)) else type(t)(new)
    if isinstance(t, dict):
        out = {k: settle(v, where, escape=escape, memo=memo) for k, v in t.items()}
        return t if all(out[k] is t[k] for k in t) else out
    return t


# Modules whose fast path a tensor subclass switches off (``has_torch_function`` checks): handed a
# guarded alias, they would compute by their slow path and differ by ~1e-7 from the model alone.
FAST_PATH_TYPES: tuple[type, ...] = (
    torch.nn.MultiheadAttention, torch.nn.TransformerEncoder, torch.nn.TransformerEncoderLayer,
)


def plain_output(module: torch.nn.Module, args: Any, output: Any) -> Any:
    """A forward hook on the root: the model's caller gets ordinary tensors, never guarded aliases.

    Records on the memory handed back are copied first under ``copy="auto"``: the caller may write
    into its output (``logits.div_(t)``), or into the inputs it passed in, where no guard sees it.
    """
    if not _registry:
        return None
    tree_map(lambda t: settle(t, "the model's input, held by the caller"), args)
    new = tree_map(lambda t: settle(t, "the model's output, handed to the caller"), output)
    return None if new is output else new


def settle_inputs(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Any:
    """A forward pre-hook (``with_kwargs=True``) handing ``module`` plain inputs: see :func:`settle`.

    ``kwargs`` may be missing: PyTorch calls a pre-hook removed mid-call without them.
    """
    if not _registry:
        return None
    kwargs = kwargs or {}
    where = f"the input of {type(module).__name__} (a compiled graph or a native fast path)"
    memo: dict[int, Any] = {}
    new_args, new_kwargs = settle(args, where, memo=memo), settle(kwargs, where, memo=memo)
    return None if new_args is args and new_kwargs is kwargs else (new_args, new_kwargs)


def _settle_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    where = f"'{getattr(func, '__name__', func)}'"
    for k in _WRITES_ARGS[func]:
        t = args[k] if isinstance(k, int) and k < len(args) else kwargs.get(k) if isinstance(k, str) else None
        if isinstance(t, torch.Tensor) and guardable(t):
            _settle_key(_key(t), where, escape=True)


def _guard_result(ret: Any) -> Any:
    """Results that share recorded memory (views, ``.data``, ``detach()``, ``chunk``...) stay guarded."""
    if type(ret) is torch.Tensor:  # plain: its storage is read without the subclass dispatch
        if guardable(ret) and ret.untyped_storage().data_ptr() in _registry:
            return guarded(ret)
        return ret
    if isinstance(ret, (tuple, list)) and ret and type(ret[0]) is torch.Tensor:
        items = [_guard_result(x) for x in ret]
        if any(a is not b for a, b in zip(items, ret)):
            return tuple(items) if isinstance(ret, tuple) else items
    return ret


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
        kind = _kind(func)
        if kind == _WRITES or kwargs.get("inplace") or kwargs.get("out") is not None:
            _copy_before_write(func, args, kwargs)
        elif kind == _ESCAPES_KIND and _registry and args:
            settle(args[0], f"'{func.__name__}'", escape=True)
        if _registry and func in _WRITES_ARGS:
            _settle_args(func, args, kwargs)
        with DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        # what shares recorded memory (x.view, x[:, :3], x.T, x.data, x.chunk(2)) stays guarded too
        return _guard_result(ret) if _registry else ret

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return repr(plain(self))
