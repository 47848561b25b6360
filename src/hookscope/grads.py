"""Read, and optionally change, the gradient flowing through any tensor: no ``retain_grad()`` plumbing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .core.guard import Slot
from .core.hooks import HookGroup
from .core.result import Result, missing
from .core.text import num, shape_text, table
from .errors import ArgumentError, HookscopeError, RecordError, checked, did_you_mean

__all__ = ["grads", "TensorGrads", "GradRecord", "GradRow"]

GradFn = Callable[[torch.Tensor], "torch.Tensor | None"]


class GradRecord:
    """The gradient(s) that reached one watched tensor.

    Attributes:
        grads: every gradient that arrived, in order (one per backward pass), after ``fn``.
        originals: the gradients as they arrived, before ``fn`` (only when an ``fn`` was given).
        changes: for each arrival, whether ``fn`` changed the gradient (in place or by returning a
            different value), or only looked at it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._grads: list[Slot] = []
        self._originals: list[Slot] = []
        self.changes: list[bool] = []

    @property
    def grads(self) -> list[torch.Tensor]:
        """Every gradient that arrived, in order; :class:`~hookscope.MutationError` if one was
        rewritten in place after it arrived (``grads(..., copy="always")`` keeps copies)."""
        return [s.get() for s in self._grads]

    @property
    def originals(self) -> list[torch.Tensor]:
        """The gradients as they arrived, before ``fn`` (only when an ``fn`` was given)."""
        return [s.get() for s in self._originals]

    def arrived(self, final: torch.Tensor, original: torch.Tensor | None, *, copy: bool) -> None:
        """Keep one arrival: the gradient after ``fn`` (and before it, when there is an ``fn``)."""
        where = f"gradient {len(self._grads)} of {self.name!r}"
        self._grads.append(_kept(final, where, copy))
        if original is not None:
            self._originals.append(Slot(original, "copied", where))

    @property
    def grad(self) -> torch.Tensor:
        """The latest gradient (after ``fn``)."""
        if not self.grads:
            raise RecordError(
                f"no gradient reached {self.name!r}; run backward inside the block, from a loss "
                "that depends on it"
            )
        return self.grads[-1]

    @property
    def original(self) -> torch.Tensor:
        """The latest gradient as it arrived, before ``fn``."""
        self.grad  # noqa: B018 - same error when nothing arrived
        if not self.originals:
            raise RecordError(f"{self.name!r} was watched without fn=, so grad is the original")
        return self.originals[-1]

    @property
    def changed(self) -> bool:
        """Whether ``fn`` changed the latest gradient."""
        self.grad  # noqa: B018
        return self.changes[-1] if self.changes else False

    def __repr__(self) -> str:
        return f"GradRecord({self.name!r}, arrivals={len(self.grads)})"


def _kept(g: torch.Tensor, where: str, copy: bool) -> Slot:
    """A gradient as it arrived: the object itself, not a ``detach()`` alias (while something else
    holds it, autograd copies it into a leaf's ``.grad`` instead of adopting its memory, so later
    accumulation, ``clip_grad_norm_`` or ``zero_grad(set_to_none=False)`` cannot rewrite it), or a
    copy. Reading it raises if it was rewritten in place all the same (a later hook's ``mul_``)."""
    v = g.detach() if g.requires_grad else g
    if copy:
        return Slot(v.clone(), "copied", where)
    return Slot(v, "never", where, fix="grads(..., copy='always'), which keeps a copy of each arrival")


@dataclass(frozen=True)
class GradRow:
    """The latest gradient of one watched tensor (a row of ``g.rows``)."""

    name: str
    arrivals: int
    shape: tuple[int, ...] | None
    norm: float | None
    changed: bool


class TensorGrads(Result, Mapping[str, GradRecord]):
    """Context that records (and with ``fn`` rewrites) the gradient of chosen tensors.

    Build it with :func:`grads`.
    """

    def __init__(self, named: dict[str, torch.Tensor], fn: GradFn | Mapping[str, GradFn] | None,
                 copy: str = "auto") -> None:
        self._tensors: dict[str, torch.Tensor] | None = named
        self._fns = fn if isinstance(fn, Mapping) else {k: fn for k in named}
        unknown = [k for k in self._fns if k not in named]
        if unknown:
            raise HookscopeError(
                f"fn names {unknown[0]!r}, which is not watched.{did_you_mean(unknown[0], named)}"
            )
        bad = next((k for k, f in self._fns.items() if f is not None and not callable(f)), None)
        if bad is not None:
            raise HookscopeError(f"fn={self._fns[bad]!r} for {bad!r} is not a function; pass "
                                 "fn=lambda g: g * 2 (or a dict of them by name)")
        # a view's gradient goes on to its base as a view of the same memory, which a leaf may
        # adopt as its .grad and accumulate into: under "auto", copy those as they arrive
        self._copy = {k: copy == "always" or (copy == "auto" and t._is_view()) for k, t in named.items()}
        self._records = {k: GradRecord(k) for k in named}
        self._group = HookGroup()

    def __enter__(self) -> TensorGrads:
        if self._tensors is None:
            raise HookscopeError("this grads() block has already run; call hookscope.grads(...) again")
        for name, t in self._tensors.items():
            self._group.add(t.register_hook(self._hook(name, self._fns.get(name))))
        self._tensors = None  # hold no graph after the block
        return self

    def __exit__(self, *exc: Any) -> None:
        self._group.remove()

    def remove(self) -> None:
        """Remove the hooks now (the context does it by itself). Idempotent."""
        self._group.remove()

    def _hook(self, name: str, fn: GradFn | None) -> Callable[[torch.Tensor], Any]:
        rec, copy = self._records[name], self._copy[name]
        if fn is None:
            def observe(g: torch.Tensor) -> None:
                rec.arrived(g, None, copy=copy)
            return observe

        def apply(g: torch.Tensor) -> torch.Tensor | None:
            original = g.detach().clone()
            out = fn(g)
            final = g if out is None else out
            rec.arrived(final, original, copy=copy)
            rec.changes.append(
                final.shape != original.shape or not torch.equal(final.detach(), original)
            )
            return out

        return apply

    def __getitem__(self, name: str) -> GradRecord:
        if not isinstance(name, str) or name not in self._records:
            raise missing(name, "watched tensor", self._records)
        return self._records[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._records

    @property
    def rows(self) -> list[GradRow]:
        """One row per watched tensor: arrivals, and the latest gradient's shape, norm and change."""
        out = []
        for name, r in self._records.items():
            last = r.grads[-1] if r.grads else None
            norm = None if last is None else float(last.detach().double().norm())
            out.append(GradRow(name, len(r.grads), None if last is None else tuple(last.shape), norm,
                               bool(r.changes and r.changes[-1])))
        return out

    def table(self) -> str:
        """The watched tensors as a text table (also ``str(g)``).

        Example:
            >>> w = torch.tensor([3.0, 4.0], requires_grad=True)
            >>> with grads(w=w) as g:
            ...     (w * w).sum().backward()
            >>> print(g)
            tensor  arrivals  shape  |grad|  changed
            ----------------------------------------
            w              1      2      10  no
        """
        body = [[r.name, str(r.arrivals), shape_text(r.shape), num(r.norm), "yes" if r.changed else "no"]
                for r in self.rows]
        return "\n".join(table(["tensor", "arrivals", "shape", "|grad|", "changed"], body, left={0, 4}))

    def to_dict(self) -> dict[str, Any]:
        """``{name: latest gradient}`` (``None`` where none arrived)."""
        return {n: (r.grads[-1] if r.grads else None) for n, r in self._records.items()}

    def __iter__(self) -> Any:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


@checked
def grads(
    *tensors: torch.Tensor,
    fn: GradFn | Mapping[str, GradFn] | None = None,
    copy: str = "auto",
    **named: torch.Tensor,
) -> TensorGrads:
    """Watch the gradient of intermediate (or leaf) tensors during the backward passes in the block.

    Args:
        *tensors: tensors to watch, keyed ``"0"``, ``"1"``, ... in order.
        fn: optional ``grad -> new grad | None`` run on each arriving gradient, like a PyTorch tensor
            hook: return a tensor to replace the gradient, or change it in place, or just look.
            A mapping gives one function per name. Whether it changed the gradient is recorded.
        copy: as in :func:`hookscope.capture`: ``"auto"`` (the default) keeps each gradient as it
            arrived, without a copy, except a view's gradient (a leaf may adopt it as ``.grad`` and
            accumulate into it), and reading one that was later rewritten in place (by another
            hook's ``mul_``, say) raises :class:`~hookscope.MutationError`; ``"always"`` keeps a
            copy of every arrival; ``"never"`` copies none, a view's gradient included.
        **named: tensors to watch under a name.

    Example:
        >>> import torch, hookscope
        >>> w = torch.tensor([1.], requires_grad=True); x = torch.tensor([2.], requires_grad=True)
        >>> a = w + x; b = w + 1; y = a * b
        >>> with hookscope.grads(a=a) as g:
        ...     y.backward()
        >>> g["a"].grad
        tensor([2.])
    """
    watched = {str(i): t for i, t in enumerate(tensors)}
    watched.update(named)
    if not watched:
        raise HookscopeError("grads() needs at least one tensor to watch")
    for name, t in watched.items():
        if not isinstance(t, torch.Tensor):
            hint = did_you_mean(name, ["fn", "copy"]) if name in named else ""
            if hint:  # **named takes any name: a misspelt keyword of grads' own lands there
                raise ArgumentError(f"grads() got an unexpected keyword argument {name!r}.{hint}")
            raise HookscopeError(f"{name!r} is a {type(t).__name__}, not a tensor; pass the tensor itself")
        if not t.requires_grad:
            raise HookscopeError(
                f"tensor {name!r} does not require grad, so no gradient will reach it; compute it "
                "from inputs or parameters with requires_grad=True, outside torch.no_grad()"
            )
    if copy not in ("auto", "always", "never"):
        hint = " (copy='always' keeps copies)" if isinstance(copy, bool) else ""
        raise HookscopeError(f"copy={copy!r} is not a copy policy of grads(){hint}; use 'auto' (the default: kept as it "
                             "arrived, an error if rewritten later), 'always' or 'never'")
    return TensorGrads(watched, fn, copy)
