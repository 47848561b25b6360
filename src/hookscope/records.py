"""What is kept of a module call, and how: the retention policy and the per-call records."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from ._tree import tree_map
from .core.result import Result, jsonable
from .core.text import dtype_text, shape_text, table
from .core.guard import Slot, guardable, protect, storage_key
from .errors import MutationError, RecordError, did_you_mean
from .selection import strip_prefix

__all__ = ["Retention", "CallRecord", "LayerRecord", "Recording", "check_device", "load"]

CopyPolicy = Literal["auto", "always", "never"]
COPY_BELOW = 1 << 20
"""Under ``copy="auto"``, tensors smaller than this many bytes are copied at once: on this machine a
copy of under 1 MiB costs less than watching the tensor for writes (~20-40 us of dispatch for each
op that reads it), and on a GPU a copy is one asynchronous kernel. Larger tensors are watched."""

NOT_KEPT: Any = object()  # the capture was not asked to keep this field
RAISED: Any = object()  # kept, but the call raised before it returned


class Hole:
    """Marks where a tensor was in an input or output whose values were not kept."""

    __slots__ = ()


HOLE = Hole()


@dataclass(frozen=True)
class Retention:
    """How a recorded tensor is kept.

    Args:
        copy: ``"auto"`` (default) keeps a reference and copies only if something is about to
            write into that memory (``ReLU(inplace=True)``, ``out += identity``); tensors under
            :data:`COPY_BELOW` bytes (1 MiB) are copied at once, which is cheaper; ``"always"``
            copies at once; ``"never"`` never copies, and reading a record whose memory was
            overwritten raises :class:`~hookscope.MutationError`.
        detach: drop the autograd graph (default). ``False`` keeps it, so the record can be
            differentiated, at the price of keeping the graph alive.
        device: move kept tensors there (``"cpu"`` frees accelerator memory). ``None`` keeps them
            where they are, with no host synchronisation.
        dtype: cast kept floating-point tensors (``torch.float16`` halves the memory).

    Example:
        >>> Retention(copy="always", device="cpu").copy
        'always'
    """

    copy: CopyPolicy = "auto"
    detach: bool = True
    device: torch.device | str | None = None
    dtype: torch.dtype | None = None

    guard: bool = True  # hand the model guarded aliases; False where they cannot go (compiled graphs)

    def __post_init__(self) -> None:
        if self.copy not in ("auto", "always", "never"):
            raise RecordError(f"copy={self.copy!r} is not a copy policy; use 'auto', 'always' or 'never'")
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise RecordError(
                f"dtype={self.dtype!r} is not a torch.dtype; pass one such as torch.float16"
            )
        if self.device is not None:
            object.__setattr__(self, "device", check_device(self.device))
        if not isinstance(self.detach, bool):
            raise RecordError(f"detach={self.detach!r} is not True or False")

    def keep(self, t: torch.Tensor, where: Any, held: Callable[[], set[int]] | None = None, *,
             inner: bool = False) -> tuple[Slot, torch.Tensor]:
        """Keep ``t``; return its slot and the tensor the model should go on with.

        ``held``: the memory (:func:`~hookscope.core.guard.storage_key`) that code outside the
        guard holds plain references to (the module's inputs, parameters and buffers); a tensor
        on it is copied at once under ``"auto"``, since a write through those references is unseen.
        Inference tensors (``torch.inference_mode()``) have no version counter, so a write through
        a reference the guard never sees (the caller's, or the module's own ``self.state``) would
        leave no trace: they are copied at once under ``"auto"`` and refused on reading under
        ``"never"``.
        ``inner``: ``t`` sits in a list, dict or object the model goes on with as it is, so no
        guarded alias can stand in for it: copied at once under ``"auto"``, watched by its version
        counter under ``"never"``; ``t`` itself is handed back.
        """
        _check_plain_tensor(t, where)
        v = t.detach() if self.detach else t
        if v.is_inference() and self.copy != "always":
            return self._unwatchable(v, t, where)
        if inner:
            slot, _ = self._inner(v, where)
            return slot, t
        if self.copy == "auto" and self.guard and self.device is None and self.dtype is None \
                and guardable(v):
            if v.numel() * v.element_size() < COPY_BELOW or (held is not None and storage_key(v) in held()):
                return Slot(v.clone(), "copied", where), t
            slot = Slot(v, "auto", where)  # no copy: a guarded alias copies it only before a write
            return slot, protect(t, slot)
        if self.device is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.device, dtype=dtype)
            if moved is not v:  # a copy was made: nothing can overwrite it
                return Slot(moved, "copied", where), t
        if self.copy == "always" or not guardable(v):
            return Slot(v.clone() if v.numel() else v, "copied", where), t
        # "never" is guarded too: writes through .data or numpy bypass the version counter
        slot = Slot(v, self.copy, where)
        return slot, (protect(t, slot) if self.guard else t)


    def _inner(self, v: torch.Tensor, where: Any) -> tuple[Slot, None]:
        """A record of a tensor no alias can stand in for (see :meth:`keep`'s ``inner``)."""
        if self.device is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.device, dtype=dtype)
            if moved is not v:
                return Slot(moved, "copied", where), None
        if self.copy == "never":
            return Slot(v, "never", where), None
        return Slot(v.clone() if v.numel() else v, "copied", where), None

    def _unwatchable(self, v: torch.Tensor, t: torch.Tensor, where: Any) -> tuple[Slot, torch.Tensor]:
        """An inference tensor the caller can write unseen: a copy under ``"auto"``, a record that
        refuses to be read under ``"never"``."""
        if self.copy == "auto":
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.device, dtype=dtype)
            return Slot(moved.clone() if moved is v else moved, "copied", where), t
        slot = Slot(v, "never", where)  # the guard still names a write made through its alias
        slot.blind = ("it is an inference tensor (torch.inference_mode()), which has no version counter, so "
                      "a write into it through a reference hookscope never handed out would leave no trace")
        return slot, (protect(t, slot) if self.guard and guardable(v) else t)

    def guards_any(self) -> bool:
        """Whether :meth:`keep` may hand the model guarded aliases at all."""
        return self.guard and self.copy != "always"

    def guards(self, t: torch.Tensor, held: Callable[[], set[int]] | None = None) -> bool:
        """Whether :meth:`keep` hands the model a guarded alias of ``t`` (rather than ``t`` itself).

        A run compared with a recorded one must see the same kind of tensors: a guarded alias (and
        every view of it) makes PyTorch skip its fast paths (native attention, nested tensors).
        """
        if t.is_inference() and self.copy == "auto":
            return False  # copied at once: no version counter to witness writes
        if self.copy == "auto" and self.guard and self.device is None and self.dtype is None \
                and guardable(t):
            return t.numel() * t.element_size() >= COPY_BELOW and (held is None or storage_key(t) not in held())
        if self.device is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and t.is_floating_point() else None
            target = torch.device(self.device) if self.device is not None else t.device
            index = target.index
            if index is None and target.type == "cuda" and t.device.type == "cuda":
                index = torch.cuda.current_device()  # where .to("cuda") goes
            if target.type != t.device.type or index not in (None, t.device.index) or (
                    dtype is not None and dtype != t.dtype):
                return False  # keep() copies it and hands on the tensor itself
        return self.guard and self.copy != "always" and guardable(t)

    def keep_grad(self, g: torch.Tensor, where: Any, adopted: bool = False) -> Slot:
        """Keep a gradient as it arrived (never aliased back into autograd; overwritten memory raises).

        ``g`` itself is kept, not a ``detach()`` alias: autograd steals a leaf's incoming gradient
        as its ``.grad`` only when nothing else holds it, and would otherwise let a second
        backward, ``clip_grad_norm_`` or ``zero_grad(set_to_none=False)`` rewrite the record.
        ``adopted``: a view of ``g`` may become a leaf's ``.grad`` (the gradient of an alias of a
        leaf), so under ``copy="auto"`` it is copied.
        """
        _check_plain_tensor(g, where)
        v = g if not g.requires_grad else g.detach()
        if self.device is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.device, dtype=dtype)
            if moved is not v:
                return Slot(moved, "copied", where)
        if self.copy == "always" or (adopted and self.copy == "auto"):
            return Slot(v.clone(), "copied", where)
        return Slot(v, "never", where, fix="copy='always'")  # "auto" keeps gradients unguarded too


def _check_plain_tensor(t: torch.Tensor, where: Any) -> None:
    """Refuse a tensor of a ``torch.func`` transform: it is a per-sample wrapper (``vmap``) or a
    level of ``grad``, whose values are not there to keep once the transform returns."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        what = "the {} of {!r}".format(*where[:2]) if isinstance(where, tuple) else str(where)
        raise RecordError(f"{what} is a tensor inside a torch.func transform (vmap, grad, jacrev, ...), which "
                          "hookscope cannot keep; run the model outside the transform while recording")


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` that exists here, or a one-line error before anything runs.

    Example:
        >>> check_device("cpu")
        device(type='cpu')
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise RecordError(
            f"device={device!r} is not a device; use 'cpu', 'cuda', 'cuda:0', 'mps' or a torch.device"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RecordError(f"device={device!r}, but CUDA is not available here; use device='cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise RecordError(f"device={device!r}, but there are only {torch.cuda.device_count()} CUDA devices")
    return dev


def _read(obj: Any) -> Any:
    return tree_map(lambda s: s.get(), obj, leaf=Slot)


@dataclass(frozen=True)
class CallRow:
    """One call of a :class:`Recording` (a row of ``rec.rows``)."""

    index: int
    name: str
    call: int
    input: str
    output: str


def tensors_of(kept: Any) -> list[Slot]:
    """The slots in a kept tree, in order."""
    found: list[Slot] = []

    def add(s: Slot) -> Slot:
        found.append(s)
        return s

    tree_map(add, kept, leaf=Slot)
    return found


class CallRecord:
    """What one call of one module produced (``rec["layer"].calls[i]``).

    Fields hold what the capture was asked to keep; asking for something else raises
    :class:`~hookscope.RecordError` naming the ``keep=`` value that records it.
    """

    __slots__ = ("name", "index", "_args", "_kwargs", "_output", "_grads_out", "_grads_in",
                 "_skel_out", "_skel_in", "_watched", "note", "_lost_out", "_failed", "dropped")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index  # position among all calls of the capture, in the order they started
        self._args: Any = NOT_KEPT
        self._kwargs: Any = NOT_KEPT
        self._output: Any = NOT_KEPT
        self._grads_out: list[Slot | None] | None = None  # one per output tensor, flattened
        self._grads_in: list[Slot | None] | None = None  # one per positional input tensor
        self._skel_out: Any = None  # output structure with Hole where tensors were
        self._skel_in: Any = None  # positional inputs likewise
        self._watched: list[tuple[torch.Tensor, int]] = []  # input aliases and their versions
        self.note = ""  # why a gradient is missing, when we know
        self._lost_out = ""  # why the output gradient cannot be the true one, when we know
        self._failed: dict[str, tuple[str, str]] | None = None  # field ("*": all) -> (error class, message)
        self.dropped = False  # dropped (capture(last=N), on_call=): every field is gone

    # what a capture writes into the record ------------------------------------------------
    def mark_running(self) -> None:
        """The call has begun; until :meth:`set_output`, asking for its output says it raised."""
        self._output = RAISED

    def set_inputs(self, args: Any, kwargs: Any) -> None:
        """The kept positional and keyword inputs (trees of :class:`~hookscope.core.Slot`)."""
        if not self.dropped:
            self._args, self._kwargs = args, kwargs

    def set_output(self, output: Any) -> None:
        """The kept output (a tree of :class:`~hookscope.core.Slot`)."""
        if not self.dropped:
            self._output = output

    def expect_grad_output(self, skeleton: Any, n: int) -> list[Slot | None]:
        """Room for ``n`` output gradients; ``skeleton`` is the output with :data:`HOLE` for tensors."""
        self._grads_out, self._skel_out = [None] * n, skeleton
        return self._grads_out

    def expect_grad_input(self, skeleton: Any, n: int) -> list[Slot | None]:
        """Room for ``n`` positional-input gradients, as :meth:`expect_grad_output`."""
        self._grads_in, self._skel_in = [None] * n, skeleton
        return self._grads_in

    def watch_input(self, alias: torch.Tensor) -> None:
        """Remember an input alias, to tell later whether the module wrote into it."""
        self._watched.append((alias, alias._version))

    def lose_grad_output(self, why: str) -> None:
        """The output gradient's hooks were orphaned: reading ``grad_output`` raises, saying ``why``."""
        self._lost_out = why

    def unwatchable_input(self) -> None:
        """An input tensor inside a list, dict or object needs its gradient: no per-call alias can
        stand in for it there, so this call's input gradient cannot be told apart."""
        self.note = ("its input holds tensors inside a list, dict or object, where no per-call alias can "
                     "stand in for them; read grad_output of the layer before it")

    def check_inputs(self) -> None:
        """After the call: note why no input gradient will arrive if the module wrote its input."""
        watched, self._watched = self._watched, []
        if any(a._version != v for a, v in watched):
            self.note = (
                "the module modifies its input in place (inplace=True, x += ...), which detaches "
                "all or part of the input gradient from it (pytorch/pytorch#61519); read grad_output "
                "of the layer before it"
            )

    def fail(self, field: str, why: str, error: str = "RecordError") -> None:
        """Reading ``field`` (``"*"``: every field) raises ``error`` (``RecordError`` or
        ``MutationError``) with the message ``why`` (a record dropped, or loaded from a file)."""
        self._failed = {**(self._failed or {}), field: (error, why)}

    def drop(self, why: str) -> None:
        """Forget what this record kept: from now on reading any field raises ``why``."""
        self.fail("*", why)
        self.dropped = True
        self._args = self._kwargs = self._output = NOT_KEPT
        self._grads_out = self._grads_in = self._skel_out = self._skel_in = None
        self._watched = []

    # what a reader asks of it --------------------------------------------------------------
    def _check(self, field: str) -> None:
        if self._failed is None:
            return
        failed = self._failed.get("*") or self._failed.get(field)
        if failed is not None:
            raise (MutationError if failed[0] == "MutationError" else RecordError)(failed[1])

    def _need(self, value: Any, keep: str) -> Any:
        self._check(keep)
        if value is NOT_KEPT:
            raise RecordError(f"the {keep} of {self.name!r} was not recorded; capture with keep=({keep!r}, ...)")
        if value is RAISED:
            raise RecordError(f"call {self.index} of {self.name!r} raised before returning, so it has no {keep}")
        return value

    @property
    def args(self) -> tuple[Any, ...]:
        """The positional inputs, as the module received them."""
        return tuple(_read(self._need(self._args, "input")))

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword inputs."""
        return dict(_read(self._need(self._kwargs, "input")))

    @property
    def input(self) -> Any:
        """The first positional input (``args[0]``)."""
        args = self.args
        if not args:
            raise RecordError(f"{self.name!r} was called with keyword arguments only; read .kwargs")
        return args[0]

    @property
    def returned(self) -> bool:
        """Whether the call returned (``False`` while it runs, or if it raised)."""
        return self._output is not RAISED

    @property
    def output(self) -> Any:
        """The output, with its structure (tensor, tuple, dict, dataclass, ModelOutput...)."""
        return _read(self._need(self._output, "output"))

    def _fill(self, grads: list[Slot | None] | None, skel: Any, keep: str) -> Any:
        self._check(keep)
        if grads is None:
            raise RecordError(f"gradients of {self.name!r} were not recorded; capture with keep=({keep!r}, ...)")
        it = iter(grads)  # a module that returned None has the skeleton None, and grad_output None

        def take(_: Any) -> Any:
            g = next(it)
            return None if g is None else g.get()

        return tree_map(take, skel, leaf=Hole)

    @property
    def grad_output(self) -> Any:
        """Gradient w.r.t. the output, in the output's structure.

        ``None`` where no gradient arrived (no backward yet, or that output does not reach the loss).
        Raises :class:`~hookscope.RecordError` when the gradient could not be seen (an output that
        is a view of another tensor, rewritten in place after the module returned).
        """
        self._check("grad_output")
        if self._lost_out:
            raise RecordError(f"no true grad_output for {self.name!r} (call {self.index}): {self._lost_out}")
        return self._fill(self._grads_out, self._skel_out, "grad_output")

    @property
    def grad_args(self) -> tuple[Any, ...]:
        """Gradient w.r.t. each positional input (``None`` where there is none)."""
        self._check("grad_input")
        if self.note:  # what arrived, if anything, is only part of the gradient
            raise RecordError(f"no true input gradient for {self.name!r}: {self.note}")
        return tuple(self._fill(self._grads_in, self._skel_in, "grad_input"))

    @property
    def grad_input(self) -> Any:
        """Gradient w.r.t. the first positional input: what flowed back through this module."""
        grads = self.grad_args
        if not grads:
            raise RecordError(f"{self.name!r} has no positional input; read .grad_args")
        return grads[0]

    def summary(self) -> tuple[str, str]:
        """(input, output) described for a table: shapes and dtypes, or what stands in their place."""
        return self._describe(self._args), self._describe(self._output)

    @staticmethod
    def _describe(kept: Any) -> str:
        if kept is NOT_KEPT:
            return "-"
        if kept is RAISED:
            return "(raised)"
        slots = [s for s in tensors_of(kept)]
        if not slots:
            return "no tensor"
        shown = [f"{shape_text(tuple(s.value.shape))} {dtype_text(s.value.dtype)}" for s in slots[:3]]
        return ", ".join(shown) + (f", ... ({len(slots)} tensors)" if len(slots) > 3 else "")

    def __repr__(self) -> str:
        return f"CallRecord({self.name!r}, index={self.index})"


def _only(name: str, calls: list[CallRecord], what: str) -> CallRecord:
    if len(calls) == 1:
        return calls[0]
    if not calls:
        raise RecordError(f"{name!r} was selected but never called; check that the forward pass reaches it")
    raise RecordError(
        f"{name!r} was called {len(calls)} times, so .{what} is ambiguous; "
        f"read rec[{name!r}].calls[i].{what} or rec[{name!r}].{what}s"
    )


class LayerRecord:
    """Every call of one module, in order. Shortcuts read the only call; several calls must be indexed.

    Example:
        >>> import torch, hookscope
        >>> shared = torch.nn.Linear(2, 2)
        >>> net = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)  # one module used twice
        >>> with hookscope.capture(net, "0", "1") as rec:
        ...     _ = net(torch.ones(1, 2))
        >>> rec["1"].output.shape, len(rec["0"]), rec["0"].calls[1].output.shape
        (torch.Size([1, 2]), 2, torch.Size([1, 2]))
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[CallRecord] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[CallRecord]:
        return iter(self.calls)

    def __getitem__(self, i: int) -> CallRecord:
        return self.calls[i]

    output = property(lambda self: _only(self.name, self.calls, "output").output)
    input = property(lambda self: _only(self.name, self.calls, "input").input)
    args = property(lambda self: _only(self.name, self.calls, "args").args)
    kwargs = property(lambda self: _only(self.name, self.calls, "kwargs").kwargs)
    grad_output = property(lambda self: _only(self.name, self.calls, "grad_output").grad_output)
    grad_input = property(lambda self: _only(self.name, self.calls, "grad_input").grad_input)
    outputs = property(lambda self: [c.output for c in self.calls])
    inputs = property(lambda self: [c.input for c in self.calls])
    grad_outputs = property(lambda self: [c.grad_output for c in self.calls])
    grad_inputs = property(lambda self: [c.grad_input for c in self.calls])

    def __repr__(self) -> str:
        return f"LayerRecord({self.name!r}, calls={len(self.calls)})"


_FIELDS = ("output", "input", "grad_output", "grad_input")


def _value(call: CallRecord, field: str) -> Any:
    """One field of one call, ``None`` for the output of a call that raised before returning."""
    return None if field == "output" and not call.returned else getattr(call, field)


class Recording(Result, Mapping[str, LayerRecord]):
    """Records of a capture, keyed by qualified name (wrapper prefixes such as ``module.`` accepted).

    ``rec.calls`` lists every call of every selected module in the order the calls started.
    """

    def __init__(self, selected: list[str], aliases: Mapping[str, str] | None = None,
                 keep: Iterable[str] = ("output",)) -> None:
        self.keep: frozenset[str] = frozenset(keep)
        self.selected = tuple(selected)
        self._layers = {n: LayerRecord(n) for n in selected}
        self._aliases = dict(aliases or {})  # another name of a shared module -> the selected one
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()  # DataParallel's replicas add calls from several threads
        self._count = 0  # calls begun so far: the index of the next one

    def _key(self, name: str) -> str:
        key = strip_prefix(name, self._layers.keys() | self._aliases.keys())
        return self._aliases.get(key, key)

    def _add(self, name: str, file: bool = True) -> CallRecord:
        """A record of a call of ``name`` that begins now; ``file=False``: numbered, not kept."""
        with self._lock:  # DataParallel's threads: one index each, listed in the order of the indices
            call = CallRecord(name, self._count)
            self._count += 1
            if file:
                self.calls.append(call)
                self._layers[name].calls.append(call)
        return call

    def _adopt(self, call: CallRecord) -> None:
        self.calls.append(call)
        self._layers[call.name].calls.append(call)

    def __getitem__(self, name: str) -> LayerRecord:
        if not isinstance(name, str):
            raise RecordError(f"records are keyed by layer name (str), not {type(name).__name__}")
        key = self._key(name)
        if key not in self._layers:
            raise RecordError(
                f"{name!r} was not selected in this capture.{did_you_mean(key, self.selected)}"
                f" Selected: {', '.join(repr(s) for s in self.selected[:6])}{', ...' if len(self.selected) > 6 else ''}"
            )
        layer = self._layers[key]
        if not layer.calls:
            raise RecordError(f"{key!r} was selected but never called; check that the forward pass reaches it")
        return layer

    def __iter__(self) -> Iterator[str]:
        """Names of the modules that were called, in the order of their first call."""
        return iter(dict.fromkeys(c.name for c in self.calls))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self._layers.get(self._key(name), LayerRecord("")).calls)

    def to_dict(self, field: str | None = None, *, all_calls: bool = False) -> dict[str, Any]:
        """A plain ``{name: value}`` dict of one field (``output``, ``input``, ``grad_output``...).

        ``field=None``: the first of output, input, grad_output, grad_input that the capture kept.
        A module called several times gives the list of its calls' values (``all_calls=True``:
        lists for every module); the output of a call that raised is ``None``.

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
            >>> with hookscope.capture(net, keep="input") as rec:
            ...     _ = net(torch.ones(1, 2)); _ = net(torch.ones(1, 2))
            >>> {name: len(values) for name, values in rec.to_dict().items()}
            {'0': 2, '1': 2}
        """
        field = field or next((f for f in _FIELDS if f in self.keep), "output")
        layers = {n: self._layers[n].calls for n in self}
        if all_calls:
            return {n: [_value(c, field) for c in calls] for n, calls in layers.items()}
        return {n: _value(calls[0], field) if len(calls) == 1 else [_value(c, field) for c in calls]
                for n, calls in layers.items()}

    @property
    def rows(self) -> list[CallRow]:
        """One row per call, in the order calls started: name, call number, what was kept."""
        seen: dict[str, int] = {}
        out = []
        for c in list(self.calls):
            seen[c.name] = seen.get(c.name, -1) + 1
            out.append(CallRow(c.index, c.name, seen[c.name], *c.summary()))
        return out

    def table(self) -> str:
        """The calls as a text table (also ``str(rec)``).

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3))
            >>> with hookscope.capture(net, "0", keep="io") as rec:
            ...     _ = net(torch.ones(4, 2))
            >>> print(rec)
            #  module  call  input        output
            ------------------------------------
            0  0          0  4x2 float32  4x3 float32
        """
        body = [[str(r.index), r.name or "(root)", str(r.call), r.input, r.output] for r in self.rows]
        return "\n".join(table(["#", "module", "call", "input", "output"], body, left={1, 3}, pad_last=False))

    def to_json(self, indent: int | None = None, field: str | None = None) -> str:
        """:meth:`to_dict` (of ``field``) as JSON, tensors as nested lists."""
        return json.dumps(jsonable(self.to_dict(field)), indent=indent, allow_nan=False)

    def clear(self) -> None:
        """Forget every record (to reuse one capture over many batches without growing)."""
        with self._lock:
            self.calls.clear()
            self._count = 0
            for layer in self._layers.values():
                layer.calls.clear()

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write every kept call to the folder ``path``; read it back with :func:`hookscope.load`.

        The folder is a store of one safetensors shard and a JSON manifest (no pickle): every call
        of every module in order, with its name, index and the fields kept (input, output,
        gradients), their nesting of tuples, lists, dicts and ``None``, their dtypes, shapes and
        values. Named tuples come back as named tuples of the same name and fields; dataclasses,
        ``ModelOutput`` and other objects come back as dicts of their fields; tensors come back on
        the CPU, detached. A field that cannot be read (a call that raised, a record overwritten
        in place) raises the same error after loading.

        Args:
            path: a folder that does not exist yet or is empty.
            overwrite: replace a store already there (only a store: other folders are refused).

        Returns:
            The folder written.

        Example:
            >>> import tempfile, torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
            >>> with hookscope.capture(net) as rec:
            ...     _ = net(torch.ones(1, 2))
            >>> folder = rec.save(tempfile.mkdtemp() + "/rec")
            >>> again = load(folder)
            >>> torch.equal(again["0"].output, rec["0"].output), list(again)
            (True, ['0', '1'])
        """
        from ._saved import save_recording

        return save_recording(self.selected, self._aliases, self.keep, self.calls, path, overwrite=overwrite)

    def __repr__(self) -> str:
        return f"Recording({len(self.selected)} selected, {len(self.calls)} calls)"


def load(path: str | os.PathLike[str]) -> Recording:
    """Read back a :class:`Recording` written by :meth:`Recording.save`.

    The result speaks the same protocol as the recording saved (``rec[name].output``,
    ``rec.calls``, ``table()``, ``rows``, ``to_dict()``); tensors are on the CPU. A store written by
    :func:`hookscope.extract` is refused: open it with :func:`hookscope.open_store`.

    Example:
        >>> import tempfile, torch, hookscope
        >>> net = torch.nn.Linear(2, 2)
        >>> with hookscope.capture(net, "", keep="io") as rec:
        ...     _ = net(torch.ones(1, 2)); _ = net(torch.zeros(1, 2))
        >>> again = load(rec.save(tempfile.mkdtemp() + "/rec"))
        >>> [c.index for c in again.calls], again[""].calls[1].input.sum().item()
        ([0, 1], 0.0)
    """
    from ._saved import read_recording

    selected, aliases, keep, saved, decoder = read_recording(path)
    try:
        if not set(keep) <= set(_FIELDS):
            raise ValueError(f"keep holds {sorted(set(keep) - set(_FIELDS))}")
        calls = [_saved_call(c, decoder) for c in saved]
        indices = [c.index for c in calls]
        if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
            raise ValueError("call indices are negative or repeated")
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise RecordError(f"{os.fspath(path)}/manifest.json does not describe a saved recording ({type(e).__name__}: "
                          f"{e}); save the recording again") from None
    rec = Recording(selected, aliases, keep)
    for call in calls:
        if call.name not in rec.selected:
            raise RecordError(f"{path}: call {call.index} is of {call.name!r}, which the recording does not select; "
                              "save the recording again")
        rec._adopt(call)
    rec._count = max((c.index + 1 for c in calls), default=0)
    return rec


def _fill(call: CallRecord, field: str, saved: Mapping[str, Any], decoder: Any) -> None:
    """Put one saved field back into ``call``, as the capture would have."""
    if "error" in saved:
        cls, message = saved["error"]
        call.fail(field, str(message), "MutationError" if cls == "MutationError" else "RecordError")
        return
    if saved.get("raised"):
        call.mark_running()
        return
    value = saved["value"]
    if field == "input":
        call.set_inputs(decoder.node(value["args"]), decoder.node(value["kwargs"]))
    elif field == "output":
        call.set_output(decoder.node(value))
    else:
        tree = decoder.node(value)
        skeleton = tree_map(lambda _: HOLE, tree, leaf=Slot)  # None stays None: no gradient arrived there
        expect = call.expect_grad_output if field == "grad_output" else call.expect_grad_input
        slots = tensors_of(tree)
        expect(skeleton, len(slots))[:] = slots


def _saved_call(saved: Mapping[str, Any], decoder: Any) -> CallRecord:
    """A :class:`CallRecord` rebuilt from its saved form (``decoder``: :class:`hookscope._saved.Decoder`)."""
    call = CallRecord(str(saved["name"]), int(saved["index"]))
    for field, value in saved["fields"].items():
        if field not in _FIELDS:
            raise ValueError(f"unknown field {field!r}")
        decoder.where = (field, call.name, call.index)
        _fill(call, field, value, decoder)
    return call
