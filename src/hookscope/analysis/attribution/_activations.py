"""Backward rules for the activations and sums a forward pass runs, wherever they are called.

:class:`RuleMode` is a ``TorchFunctionMode`` active only while the model runs under a rule. It
catches the activation functions (``F.relu``, ``torch.relu``, ``Tensor.relu_``, ``F.gelu``, ...)
and runs each through :class:`_Swapped`: the same forward (in place kept in place), the rule's
backward. ``nn.ReLU``, ``nn.GELU`` and the other activation modules call these functions, so one
mechanism reaches modules (also one called twice), functions inside ``forward`` and in-place calls.
For LRP it also splits the relevance of a sum of two computed values (a residual ``out += x``)
in proportion to each (the norm rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dataclasses

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..._native import stats_kernel
from ...errors import HookscopeError
from ...selection import unwrap
from .._targets import pinned, scores_of
from ._engine import Job, Pass, probe

__all__ = ["ACTIVATIONS", "RELUS", "RuleMode", "rule_pass", "stabilize"]

Tensor = torch.Tensor

RELUS = frozenset({F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_})
_RELUS_IN_PLACE = frozenset({F.relu_, torch.relu_, Tensor.relu_})
_OTHERS = {  # elementwise activations besides ReLU: each passes relevance on unchanged under LRP
    F.gelu, F.silu, F.mish, F.softplus, F.leaky_relu, F.leaky_relu_, F.elu, F.elu_, F.selu, F.celu, F.relu6,
    F.hardtanh, F.hardtanh_, F.hardswish, F.hardsigmoid, F.logsigmoid, F.tanh, F.sigmoid, F.prelu, F.rrelu,
    torch.sigmoid, torch.sigmoid_, torch.tanh, torch.tanh_, torch.selu, torch.celu, torch.prelu, torch.rrelu,
    Tensor.sigmoid, Tensor.sigmoid_, Tensor.tanh, Tensor.tanh_,
}
ACTIVATIONS = RELUS | frozenset(_OTHERS)
_ADDS = frozenset({torch.add, Tensor.add, Tensor.add_, Tensor.__add__, Tensor.__radd__, Tensor.__iadd__})

Backward = Callable[[Tensor], Tensor]
MaskedBackward = Callable[[Tensor, Tensor], Tensor]


def stabilize(z: Tensor, epsilon: float) -> Tensor:
    """``z`` moved away from zero by ``epsilon`` in the direction of its sign (``+`` at zero).

    Example:
        >>> stabilize(torch.tensor([-2.0, 0.0, 3.0]), 0.5)
        tensor([-2.5000,  0.5000,  3.5000])
    """
    return torch.where(z >= 0, z + epsilon, z - epsilon)


def guided_back(grad: Tensor, out: Tensor) -> Tensor:
    """Guided backpropagation through a ReLU whose output was ``out``: ``grad`` where ``out > 0`` and
    ``grad >= 0``, else 0. One memory pass with hookscope's CPU kernel where it is built, else
    ReLU's own backward and a clamp (two passes; the same values).

    Example:
        >>> guided_back(torch.tensor([1.0, 2.0, -3.0]), torch.tensor([0.0, 5.0, 1.0]))
        tensor([0., 2., 0.])
    """
    kernel = stats_kernel() if out.device.type == "cpu" and out.numel() else None  # the kernel takes >= 1 element
    fused = kernel.guided(grad, out) if kernel is not None else None
    return fused if fused is not None else torch.ops.aten.threshold_backward(grad, out, 0).clamp_(min=0)


class _Swapped(torch.autograd.Function):
    """``run(x)`` forward (in place when ``run`` writes into ``x``); backward ``back(grad)``, or
    ``masked(grad, out)`` with the output kept (as ReLU keeps it) when ``masked`` is given."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, run: Callable[[Tensor], Tensor], back: Backward,
                masked: MaskedBackward | None) -> Tensor:
        out = run(x)
        ctx.back, ctx.masked = back, masked
        if out is x:
            ctx.mark_dirty(x)
        if masked is not None:  # ReLU's own way: its output, read in the backward pass (no mask made here)
            ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        if ctx.masked is None:
            return ctx.back(grad), None, None, None
        try:
            (out,) = ctx.saved_tensors
        except RuntimeError:  # the version check of saved tensors, as for ReLU's own backward
            raise HookscopeError("an in-place operation wrote into a ReLU's output after the ReLU, so its mask is "
                                 "lost (PyTorch's own ReLU backward refuses this too); make that operation out of "
                                 "place") from None
        return ctx.masked(grad, out), None, None, None


class _SwappedRelu(_Swapped):
    """:class:`_Swapped` for a ReLU: its output is >= 0, so a ReLU on it changes nothing."""


class _NormSum(torch.autograd.Function):
    """``a + b`` forward (``a`` written in place for ``+=``); backward: the relevance ``R`` arriving
    at the sum split as ``a * R / s`` and ``b * R / s``, ``s`` the stabilised sum (LRP's norm rule)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, inplace: bool, epsilon: float) -> Tensor:
        ctx.parts = (a.detach().clone() if inplace else a.detach(), b.detach())
        ctx.epsilon = epsilon
        if inplace:
            ctx.mark_dirty(a)
            return a.add_(b)
        return a + b

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        a, b = ctx.parts
        share = grad / stabilize(a + b, ctx.epsilon)
        return (a * share).sum_to_size(a.shape), (b * share).sum_to_size(b.shape), None, None


def _computed(t: Any) -> bool:
    """A tensor computed from the inputs (not a parameter or a constant)."""
    return isinstance(t, Tensor) and t.requires_grad and t.grad_fn is not None and t.is_floating_point()


class RuleMode(TorchFunctionMode):
    """While active, every ReLU passes gradients back as ``relu(grad)`` (``"deconvnet"``) or as
    ``relu(grad) * (x > 0)`` (``"guided"``), or every activation passes them on unchanged and sums of
    two computed values split them in proportion (``"lrp"``, with ``epsilon`` the sum's stabiliser).

    Example:
        >>> x = torch.tensor([-1.0, 2.0], requires_grad=True)
        >>> with RuleMode("deconvnet"):
        ...     y = torch.relu(x * 1.0)
        >>> torch.autograd.grad(y, x, torch.tensor([3.0, -3.0]))[0]
        tensor([3., 0.])
    """

    def __init__(self, rule: str, epsilon: float = 1e-6) -> None:
        super().__init__()
        self.rule, self.epsilon = rule, epsilon
        self.caught = ACTIVATIONS if rule == "lrp" else RELUS
        self.relus = 0  # the ReLU calls the rule reached

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self.caught and args and _grad(args[0]):
            if func in RELUS and _in_place(func, args, kwargs) and _relu_made(args[0]):
                return args[0]  # an in-place ReLU on a ReLU's output: the same values, the same rule
            rest = args[1:]
            self.relus += func in RELUS
            back: Backward = (lambda g: g) if self.rule == "lrp" else (lambda g: g.clamp(min=0))
            kind = _SwappedRelu if func in RELUS else _Swapped
            return kind.apply(args[0], lambda t: func(t, *rest, **kwargs), back,
                              guided_back if self.rule == "guided" else None)
        if (self.rule == "lrp" and func in _ADDS and len(args) == 2 and not kwargs
                and _computed(args[0]) and _computed(args[1])):
            a, b = (args[1], args[0]) if func is Tensor.__radd__ else args
            return _NormSum.apply(a, b, func in (Tensor.__iadd__, Tensor.add_), self.epsilon)
        return func(*args, **kwargs)


def _in_place(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return func in _RELUS_IN_PLACE or (func is F.relu and bool(kwargs.get("inplace", args[1] if len(args) > 1 else False)))


def _relu_made(t: Tensor) -> bool:
    return type(t.grad_fn).__name__ == "_SwappedReluBackward"


def _grad(t: Any) -> bool:
    return isinstance(t, Tensor) and t.requires_grad and t.is_floating_point()


def rule_pass(job: Job, mode: RuleMode, p: Pass) -> tuple[Tensor, Tensor]:
    """The target's scores and the inputs' leaf of the one pass of the model (inside its wrappers) under
    ``mode``, its values the model's own: ``job.target`` is pinned on its output and ``p.scores`` set.
    The scores are read after the mode ends, so the target's own functions keep their gradient."""
    eager = dataclasses.replace(job, model=unwrap(job.model)[0], target=None)
    with mode:
        again = probe(eager, None, count=False)
    assert again.leaf is not None
    if mode.rule != "lrp" and not mode.relus:
        method = "guided_backprop" if mode.rule == "guided" else mode.rule
        raise HookscopeError(f"no ReLU ran on the way from the inputs to the output, so method={method!r} would be the "
                             "plain gradient (ReLU6, LeakyReLU, Hardtanh, GELU and clamp are not ReLUs to its rule); "
                             "use method='gradient', or a model with nn.ReLU / F.relu")
    job.target = pinned(job.target, again.output, job.batch)
    p.output = again.output
    p.scores = scores_of(job.target, again.output, torch.arange(job.batch, device=job.x.device))
    return p.scores, again.leaf
