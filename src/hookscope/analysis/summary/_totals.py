"""Whole-model figures: every parameter and buffer tensor counted once, the mult-adds of every call.

Nothing here runs a model: :func:`totals_of` adds up what the pass recorded (:class:`~._rows.Call`)
and what the model holds, and :func:`tensor_shapes` names every parameter and buffer once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .._sparsity import model_zeros
from ._rows import Call, Row, Shape, nbytes, numel

__all__ = ["Totals", "totals_of", "tensor_shapes"]


@dataclass(frozen=True)
class Totals:
    """Whole-model figures: each parameter and buffer tensor once, the mult-adds of every call.

    ``macs_partial``: some call computed a product that could not be counted (see ``Row.uncounted``),
    so ``macs`` is a lower bound. ``zeros``: zero elements among the ``params`` (a masked parameter
    as the weight it computes with; ``None`` when values cannot be read, on the meta device);
    ``masked``: the qualified names of masked parameters (``"fc.weight"`` for ``fc.weight_orig`` with
    its ``fc.weight_mask`` buffer, counted once as a parameter; the mask is a buffer); ``sparse``:
    a mask or a zero in a weight of 2 or more dimensions, so the table shows sparsity.
    """

    params: int
    trainable: int
    frozen: int
    param_bytes: int
    buffers: int
    buffer_numel: int
    buffer_bytes: int
    activation_bytes: int
    input_bytes: int
    macs: int
    calls: int
    modules: int
    not_called: int
    macs_partial: bool = False
    zeros: int | None = 0
    masked: tuple[str, ...] = ()
    sparse: bool = False

    @property
    def sparsity(self) -> float | None:
        """Fraction of the parameter elements that are zero (0.0 without parameters; ``None`` unknown)."""
        if self.zeros is None:
            return None
        return self.zeros / self.params if self.params else 0.0


def totals_of(model: nn.Module, calls: list[Call], rows: list[Row], inputs: list[torch.Tensor]) -> Totals:
    """The totals of one pass of the (unwrapped) ``model`` over ``inputs``.

    Parameters and buffers are counted as ``model.parameters()`` / ``buffers()`` list them (each
    tensor once, however many modules share it); mult-adds as each call's own, so a nested call is
    not counted twice.

    Example:
        >>> t = totals_of(nn.Linear(2, 3), [], [], [torch.zeros(1, 2)])
        >>> t.params, t.param_bytes, t.input_bytes
        (9, 36, 8)
    """
    params, buffers = list(model.parameters()), list(model.buffers())
    zeros = model_zeros(model)
    return Totals(
        params=sum(numel(p) for p in params),
        trainable=sum(numel(p) for p in params if p.requires_grad),
        frozen=sum(numel(p) for p in params if not p.requires_grad),
        param_bytes=sum(nbytes(p) for p in params),
        buffers=len(buffers),
        buffer_numel=sum(numel(b) for b in buffers),
        buffer_bytes=sum(nbytes(b) for b in buffers),
        activation_bytes=sum(c.activation_bytes for c in calls),
        input_bytes=sum(nbytes(t) for t in inputs),
        macs=sum(c.own_macs for c in calls),
        calls=len(calls),
        modules=len({r.name for r in rows}),
        not_called=sum(1 for r in rows if not r.called),
        macs_partial=any(c.uncounted for c in calls),
        zeros=zeros.zeros,
        masked=zeros.masked,
        sparse=bool(zeros.masked or zeros.in_weights),
    )


def tensor_shapes(model: nn.Module) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """Every parameter and every buffer by qualified name, each tensor once, with its shape.

    Example:
        >>> tensor_shapes(nn.BatchNorm1d(2))[1]
        {'running_mean': (2,), 'running_var': (2,), 'num_batches_tracked': ()}
    """
    parameters = {n: () if is_lazy(p) else tuple(p.shape) for n, p in model.named_parameters()}
    buffers = {n: tuple(b.shape) for n, b in model.named_buffers() if not is_lazy(b)}
    return parameters, buffers
