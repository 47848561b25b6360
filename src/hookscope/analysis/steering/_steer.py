"""Steering: a direction added, scaled, ablated or clamped in chosen layers' outputs, at chosen
positions, for one pass or every step of ``generate()``; a context manager over :func:`~hookscope.edit`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...core.text import dtype_text
from ...edit import Edit, edit
from ...errors import HookscopeError, checked, checked_init, did_you_mean
from ...selection import At, Selector, as_at
from ._direction import Direction
from ._layers import resolve

__all__ = ["OPS", "Steering", "steer", "change_of"]

OPS = ("add", "scale", "ablate", "clamp")
"""What a steering edit does to each selected position's vector ``x``, with ``u`` the unit direction:
``add``: ``x + scale * vector``; ``scale``: ``x + (scale - 1) (x . u) u`` (its component times
``scale``); ``ablate``: ``x - (x . u) u`` (projected out); ``clamp``: the component ``x . u`` held
inside ``bounds`` (nonlinear)."""


def _check(v: torch.Tensor, x: torch.Tensor, name: str) -> None:
    if x.shape[-1] != v.shape[0]:
        raise HookscopeError(f"the direction has width {v.shape[0]} but {name!r} gives vectors of width "
                             f"{x.shape[-1]}; compute the direction at this layer, or steer the layer it was read at")
    if x.dtype != v.dtype:
        raise HookscopeError(f"the direction is {dtype_text(v.dtype)} but {name!r} computes in {dtype_text(x.dtype)}; "
                             f"pass direction.to({str(x.dtype)}) so nothing is cast silently")


def change_of(d: Direction, op: str, scale: float, bounds: tuple[float | None, float | None] | None,
              name: str) -> Callable[[Any], Any]:
    """The edit's change for one layer: ``[..., width] -> [..., width]``."""
    vector, unit = d.vector, d.unit

    def change(x: Any) -> Any:
        if isinstance(x, tuple):  # a (hidden, ...) output: the hidden states are steered
            return (change(x[0]), *x[1:])
        if not isinstance(x, torch.Tensor):
            raise HookscopeError(f"{name!r} returns {type(x).__name__}, not a tensor of vectors; steer a module "
                                 "whose output is its hidden states")
        _check(vector, x, name)
        v, u = vector.to(x.device), unit.to(x.device)
        if op == "add":
            return x + scale * v
        along = x @ u
        if op == "scale":
            return x + ((scale - 1) * along)[..., None] * u
        if op == "ablate":
            return x - along[..., None] * u
        lo, hi = bounds or (None, None)
        return x + (along.clamp(lo, hi) - along)[..., None] * u

    return change


@checked_init
class Steering:
    """A steering edit, made by :func:`steer`: a context manager (the edit is on inside the block),
    and what :func:`bake` writes into the weights. ``counts`` says how many calls of each module it
    changed once it has run.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> s = hookscope.steer(net, "0", direction=hookscope.Direction(torch.tensor([1.0, 0.0])), scale=2.0)
        >>> with s:
        ...     y = net(torch.zeros(1, 2))
        >>> torch.allclose(y, net(torch.zeros(1, 2)) + torch.tensor([2.0, 0.0]))
        True
    """

    def __init__(self, model: nn.Module, selected: list[tuple[str, nn.Module]], direction: Direction, op: str,
                 scale: float, at: At | None, bounds: tuple[float | None, float | None] | None) -> None:
        self.model, self.selected, self.direction, self.op = model, selected, direction, op
        self.scale, self.at, self.bounds = scale, at, bounds
        self.counts: dict[str, int] = {}
        self._edits: list[Edit] = []

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.selected]

    def __repr__(self) -> str:
        where = f", at={self.at!r}" if self.at is not None else ""
        return f"steer({', '.join(map(repr, self.names))}, op={self.op!r}, scale={self.scale}{where})"

    def __enter__(self) -> Steering:
        if self._edits:
            raise HookscopeError("this steering is already on; leave its block before entering it again")
        try:
            for name, _ in self.selected:
                ed = edit(self.model, name, output=change_of(self.direction, self.op, self.scale, self.bounds, name),
                          at=self.at)
                ed.__enter__()
                self._edits.append(ed)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        edits, self._edits = self._edits, []
        error: BaseException | None = None
        for ed in reversed(edits):
            try:
                ed.__exit__(exc_type, exc, tb)
            except HookscopeError as e:  # every edit leaves, then the first refusal is raised
                error = error or e
            self.counts.update(ed.counts)
        if error is not None:
            raise error

    def remove(self) -> None:
        """Remove the steering's hooks now (the block does it by itself). Idempotent."""
        edits, self._edits = self._edits, []
        for ed in edits:
            ed.remove()


@checked
def steer(model: nn.Module, *selectors: Selector, direction: Direction | torch.Tensor, op: str = "add",
          scale: float = 1.0, at: At | Any = None,
          bounds: tuple[float | None, float | None] | None = None) -> Steering:
    """Steer the selected layers' outputs along ``direction`` while the block runs.

    ``op`` (:data:`OPS`): ``"add"`` adds ``scale * direction.vector``; ``"scale"`` multiplies the
    component along the direction by ``scale``; ``"ablate"`` projects it out; ``"clamp"`` holds it
    inside ``bounds=(low, high)`` (either may be ``None``). Selectors are module names (or any
    selector) or component names that are a module's output (``"blocks.3.resid_post"``); none: the
    layer the direction was read at.

    ``at`` limits the edit to positions: ``None`` every position of every forward;
    ``hookscope.tokens.generated`` the positions that write the continuation during ``generate()``:
    the prompt's last token (whose output gives the first generated token) and every generated
    token fed back, so that every generated token, the first one included, is steered, with the KV
    cache or without; ``tokens.prompt``, ``tokens.step(k)``, ``tokens.position(p)``, or
    ``hookscope.at[...]`` for one pass.

    A direction of another width or dtype than the layer's output is refused in one line when the
    layer first runs (the block's hooks are removed).

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> d = hookscope.Direction(torch.tensor([0.0, 1.0]))
        >>> with hookscope.steer(net, "0", direction=d, op="ablate"):
        ...     y = net(torch.randn(3, 2))
        >>> bool((y[:, 1] == 0).all())
        True
    """
    if op not in OPS:
        raise HookscopeError(f"steer(op={op!r}) is not an operation.{did_you_mean(str(op), OPS)} "
                             f"Use one of {', '.join(OPS)}")
    if isinstance(direction, torch.Tensor):
        direction = Direction(direction)
    if not isinstance(direction, Direction):
        raise HookscopeError(f"direction= takes a hookscope.Direction or a 1-D tensor, not {type(direction).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise HookscopeError(f"steer(scale={scale!r}): the scale is a number")
    if op == "clamp" and (bounds is None or len(bounds) != 2 or bounds == (None, None)):
        raise HookscopeError("steer(op='clamp') needs bounds=(low, high), either of them None for no limit")
    if op != "clamp" and bounds is not None:
        raise HookscopeError(f"bounds= goes with op='clamp' only, not op={op!r}")
    chosen = selectors or ((direction.layer,) if direction.layer else ())
    if not chosen:
        raise HookscopeError("steer() needs the layers to steer: name them, or pass a direction read at one")
    return Steering(model, resolve(model, tuple(chosen)), direction, op, float(scale), as_at(at), bounds)
