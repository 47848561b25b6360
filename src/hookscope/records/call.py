"""The record of one call of one module (:class:`CallRecord`): what a capture writes into it, and
what a reader asks of it.

Must not import: anything of hookscope but ``errors``, ``core`` and ``_tree``.
"""

from __future__ import annotations

from typing import Any

import torch

from .._tree import tree_map
from ..core.guard import Slot
from ..core.text import dtype_text, shape_text
from ..errors import FieldError, MutationError, RecordError

__all__ = ["HOLE", "CallRecord", "FieldError", "Hole", "tensors_of"]

NOT_KEPT: Any = object()  # the capture was not asked to keep this field
RAISED: Any = object()  # kept, but the call raised before it returned


class Hole:
    """Marks where a tensor was in an input or output whose values were not kept."""

    __slots__ = ()


HOLE = Hole()


def _read(obj: Any) -> Any:
    return tree_map(lambda s: s.get(), obj, leaf=Slot)


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
            raise (MutationError if failed[0] == "MutationError" else FieldError)(failed[1])

    def _need(self, value: Any, keep: str) -> Any:
        self._check(keep)
        if value is NOT_KEPT:
            raise FieldError(f"the {keep} of {self.name!r} was not recorded; capture with keep=({keep!r}, ...)")
        if value is RAISED:
            raise FieldError(f"call {self.index} of {self.name!r} raised before returning, so it has no {keep}")
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
            raise FieldError(f"{self.name!r} was called with keyword arguments only; read .kwargs")
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
            raise FieldError(f"gradients of {self.name!r} were not recorded; capture with keep=({keep!r}, ...)")
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
            raise FieldError(f"no true grad_output for {self.name!r} (call {self.index}): {self._lost_out}")
        return self._fill(self._grads_out, self._skel_out, "grad_output")

    @property
    def grad_args(self) -> tuple[Any, ...]:
        """Gradient w.r.t. each positional input (``None`` where there is none)."""
        self._check("grad_input")
        if self.note:  # what arrived, if anything, is only part of the gradient
            raise FieldError(f"no true input gradient for {self.name!r}: {self.note}")
        return tuple(self._fill(self._grads_in, self._skel_in, "grad_input"))

    @property
    def grad_input(self) -> Any:
        """Gradient w.r.t. the first positional input: what flowed back through this module."""
        grads = self.grad_args
        if not grads:
            raise FieldError(f"{self.name!r} has no positional input; read .grad_args")
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
