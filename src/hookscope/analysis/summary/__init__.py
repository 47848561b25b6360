"""Summarise a model from one real forward pass: module tree, shapes, parameters, buffers, mult-adds.

Parameters are counted by identity, so a tensor shared by several modules (tied embeddings, one
module under two parents) counts once in every total, as ``model.parameters()`` counts it; a module
called several times gets one row per call, its parameters counted once.

Laid out by concern, as torchinfo separates them: ``_arguments`` checks every argument and places
the inputs before anything runs; ``_collect`` runs the one traced pass (hooks always removed, the
model put back); ``_rows`` holds the record of one call and turns calls into rows; ``_totals``
adds up the whole model; ``_result`` holds :class:`Summary`, ``_render`` its text. Mult-adds come
from the shared ``analysis._macs``. Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ...core.inputs import model_args
from ..._tree import tensors
from ...core.state import rng_devices
from ...errors import HookscopeError, checked
from ...selection import check_hookable, layers, unwrap
from .._macs import own_macs
from ...core.inputs import model_kwargs, private
from ._arguments import check_depth, placed
from ._collect import collect
from ._result import Summary
from ._rows import Row, described, rows_of
from ._totals import Totals, tensor_shapes, totals_of

__all__ = ["summary", "Summary", "Row", "Totals", "own_macs"]


@checked
def summary(
    model: nn.Module,
    inputs: Any = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    depth: int | None = None,
    device: torch.device | str | None = None,
) -> Summary:
    """Run one forward pass (under ``torch.no_grad()``) and summarise every module.

    Per module call, in execution order: qualified name (indented by its depth in the module
    tree), type, the shape of every tensor of its (nested) output, own and total parameters
    (trainable / frozen), buffers, train/eval flag and multiply-adds; modules the pass never
    reached get a row with ``called=False``. Totals count each parameter tensor once, however many
    modules share it.

    Multiply-adds come from a rule per common layer (convolutions, linear, bilinear,
    ``MultiheadAttention``, recurrent layers), and, in any other module, from the matrix products
    of the torch functions its own forward calls (``@``, ``matmul``, ``mm``, ``bmm``, ``baddbmm``,
    ``addmm``, ``einsum`` of one or two operands, ``F.linear``, ``F.conv*``,
    ``F.scaled_dot_product_attention``: both products of every query head, whichever kernel runs
    it), seen by a torch function mode active during this pass only and counted in the row of the
    innermost module running them. The total equals ``FlopCounterMode``'s flops / 2 wherever that
    counter has a formula (it counts the CPU's fused attention kernels 0). A product it cannot
    count (``einsum`` of three operands, ``tensordot``) is named in ``Row.uncounted`` and the
    counts above it are marked as lower bounds.

    The train/eval flags are left as they are; in training mode, buffers the pass updates
    (BatchNorm's running statistics) are restored afterwards, and so are the caller's random
    number generators (dropout draws). Every hook is removed, also on errors.

    Args:
        model: any ``nn.Module``; DataParallel / DDP / ``torch.compile`` wrappers are seen through
            and rows are named as in the model inside.
        inputs: the example positional input of ``model(...)`` (a tuple for several).
        kwargs: the example keyword inputs of ``model(...)``, e.g. ``{"attention_mask": m}``.
        depth: keep rows down to this depth of the module tree (the model is 0); totals always
            cover every module.
        device: move tensor inputs there first (default: the device of the model's first parameter
            or buffer). The model itself is never moved.

    Returns:
        A :class:`Summary`: ``print(s)`` shows the table, ``s.to_json()`` gives it to programs.

    Raises:
        ForwardError: the forward pass failed (for example an input of the wrong shape or dtype):
            one line naming the module where it failed, what it received and what ran before it.
        HookscopeError: an argument that cannot work (``device`` is not a device this machine has,
            an unknown keyword...), in one line.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> s = summary(net, torch.randn(3, 4))
        >>> s.totals.params, s.totals.macs, s["2"][0].output_shapes
        (58, 144, [(3, 2)])
    """
    inputs = model_args(inputs)
    check_depth(depth)
    kw = model_kwargs(kwargs)
    if not inputs and not kw:
        raise HookscopeError("summary() runs the model once and needs an example input: "
                             "summary(model, torch.randn(1, 3, 224, 224))")
    inner, _ = unwrap(model)
    selected = layers(model, lambda name, module: True)  # every module once, the model itself too
    check_hookable(selected)
    args, kw = placed(inner, private((inputs, kw)), device)  # the model may write into its inputs: ours
    used = list(tensors((args, kw)))
    calls = collect(model, selected, args, kw, rng_devices([*inner.parameters(), *inner.buffers(), *used]))
    rows = rows_of(inner, selected, calls)  # after the pass: lazy modules are built now
    parameters, buffers = tensor_shapes(inner)
    return Summary(type(inner).__name__, described(used), rows, totals_of(inner, calls, rows, used),
                   {n: type(m).__name__ for n, m in selected}, parameters, buffers, depth)
