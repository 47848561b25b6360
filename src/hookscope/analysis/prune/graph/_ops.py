"""What each torch op does to channels: one small handler per kind of op, registered in one table.

A handler gets the tracer and the call (function, arguments, result, already computed) and sets the
shadow of the result, couples ids, records parameter members, or blocks ids with a reason. An op
the table does not know that reads a tracked tensor blocks what it reads: never a guess.
Must not import: the trace driver, any analysis module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._call import Call, Handler, block_inputs, op_name, unknown
from ._layers import LAYERS
from ._moves import MOVEMENT, assign, movement, setitem
from ._pointwise import VALUE_PRESERVING, pointwise
from ._shadow import carrying_dims, collapse
from ._state import Tracer

__all__ = ["handle", "TABLE", "PRODUCERS"]


# --- per-channel spatial ops, reductions, ops along a dim ----------------------------------------
def _spatial(k: int | None) -> Handler:
    """Pooling / resizing over the last ``k`` dims (``None``: all but batch and channel)."""
    def run(tr: Tracer, c: Call) -> None:
        x = c.args[0]
        s = tr.shadow(x)
        out = c.out[0] if isinstance(c.out, tuple) else c.out
        if s is None or not isinstance(out, torch.Tensor):
            return
        n = k if k is not None else s.dim() - 2
        coll, pairs = collapse(s, list(range(s.dim() - n, s.dim())))
        tr.union_pairs(pairs)
        try:
            tr.set(out, coll.view(*coll.shape, *[1] * n).expand(out.shape))
        except RuntimeError:
            unknown(tr, c)
    return run


_SAFE_OVER_CHANNELS = {"sum", "nansum"}
_NONZERO_OF_ZEROS = {"logsumexp"}


def _reduction(tr: Tracer, c: Call) -> None:
    """Over spatial dims: one id per remaining position; over a channel dim: block (a sum is safe)."""
    x = c.args[0]
    s = tr.shadow(x)
    if s is None:
        return
    second = c.arg(1, "dim")
    if c.name in ("max", "min") and isinstance(second, torch.Tensor):
        return pointwise(tr, c)
    dim = c.arg(2, "dim") if c.name == "norm" else second
    dims = list(range(s.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    dims = [d % s.dim() for d in dims] if s.dim() else []
    if carrying_dims(s) & set(dims):
        if c.name not in _SAFE_OVER_CHANNELS or bool((s < 0).any()):
            tr.block(s, f"reduced by {c.name} over a channel dim in '{tr.here()}'")
        return
    coll, pairs = collapse(s, dims)
    tr.union_pairs(pairs)
    if c.name in _NONZERO_OF_ZEROS:
        coll = -coll.abs()
    keep = c.arg(3 if c.name == "norm" else 2, "keepdim", False)
    if keep is True:
        for d in sorted(dims):
            coll = coll.unsqueeze(d)
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    assign(tr, out, coll)


def _along(pos: int) -> Handler:
    """An op along one dim (softmax, cumsum, normalize): block a channel dim, else pointwise."""
    def run(tr: Tracer, c: Call) -> None:
        s = tr.shadow(c.args[0]) if c.args else None
        if s is None:
            return
        d = c.arg(pos, "dim", -1 if c.name in ("softmax", "log_softmax") else 1)
        if not isinstance(d, int) or d % s.dim() in carrying_dims(s):
            tr.block(s, f"normalised along a channel dim by {c.name} in '{tr.here()}'")
            return
        pointwise(tr, c)
    return run


def _blocker(why: str) -> Handler:
    """Block every id the op reads (attention, matmul ...); the result carries no channel."""
    def run(tr: Tracer, c: Call) -> None:
        block_inputs(tr, c, f"read by {why or c.name}")
    return run


def _ignore(tr: Tracer, c: Call) -> None:
    """Metadata (size, dim, shape ...) or new tensors of a shape only."""


TABLE: dict[str, Handler] = {
    **{n: movement for n in MOVEMENT},
    "setitem": setitem,
    **{n: pointwise for n in (
        "add", "sub", "rsub", "mul", "div", "true_divide", "where", "maximum", "minimum", "fmax", "fmin",
        "addcmul", "addcdiv", "lerp", "pow", "floor_divide", "remainder", "masked_fill", "relu", "relu6",
        "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "hardtanh", "leaky_relu", "elu",
        "selu", "celu", "mish", "softplus", "exp", "log", "abs", "neg", "sqrt", "rsqrt", "reciprocal",
        "sin", "cos", "erf", "clamp", "clip", "clamp_min", "clamp_max", "square", "sign", "floor",
        "ceil", "round", "logsigmoid", "threshold", "nan_to_num", "square", "negative",
        "hardshrink", "softshrink", "tanhshrink", "silu", "sigmoid", "exp2", "expm1", "log1p",
        "stochastic_depth", *VALUE_PRESERVING)},
    **{n: _reduction for n in ("sum", "nansum", "mean", "nanmean", "amax", "amin", "max", "min", "std",
                              "var", "norm", "prod", "logsumexp")},
    **{n: _along(1) for n in ("softmax", "log_softmax", "softmin", "cumsum", "cumprod")},
    "normalize": _along(2),
    **{n: _blocker("") for n in ("matmul", "bmm", "mm", "einsum", "baddbmm", "addbmm", "mv",
                                "dot", "outer", "tensordot", "scaled_dot_product_attention",
                                "multi_head_attention_forward", "argmax", "argmin", "all", "any",
                                "eq", "ne", "gt", "lt", "ge", "le", "isnan", "isfinite", "item", "tolist",
                                "bool", "int", "float_", "index", "nonzero", "topk", "sort", "argsort")},
    **{n: _ignore for n in ("size", "dim", "numel", "nelement", "len", "element_size", "is_floating_point",
                           "is_complex", "stride", "storage_offset", "data_ptr", "is_contiguous",
                           "get_device", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor",
                           "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                           "_assert", "has_torch_function", "repr", "format", "hash", "get:shape",
                           "get:dtype", "get:device", "get:ndim", "get:is_cuda", "get:requires_grad",
                           "get:layout", "get:names", "get:is_sparse", "get:grad_fn", "get:is_leaf",
                           "is_nonzero", "type_name", "register_hook", "retain_grad")},
    **LAYERS,
}
_BY_FUNC: dict[Any, Handler] = {
    **{f: _spatial(k) for f, k in ((F.max_pool1d, 1), (F.max_pool2d, 2), (F.max_pool3d, 3),
                                  (F.adaptive_max_pool1d, 1), (F.adaptive_max_pool2d, 2),
                                  (F.adaptive_max_pool3d, 3), (F.fractional_max_pool2d, 2),
                                  (F.fractional_max_pool3d, 3))},
}
for _n, _k in (("avg_pool1d", 1), ("avg_pool2d", 2), ("avg_pool3d", 3), ("adaptive_avg_pool1d", 1),
               ("adaptive_avg_pool2d", 2), ("adaptive_avg_pool3d", 3), ("lp_pool1d", 1), ("lp_pool2d", 2),
               ("max_pool1d_with_indices", 1), ("max_pool2d_with_indices", 2), ("interpolate", None),
               ("upsample", None), ("upsample_nearest", None), ("upsample_bilinear", None)):
    TABLE[_n] = _spatial(_k)
PRODUCERS = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
             "linear", "embedding", "addmm"}


def handle(tr: Tracer, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """Record what ``func(*args, **kwargs) -> out`` does to the channels it reads.

    Example:
        >>> tr = Tracer({}); x = torch.ones(1, 4); tr.set(x, tr.fresh(4).view(1, 4))
        >>> out = x.mean(1); handle(tr, torch.Tensor.mean, (x, 1), {}, out); tr.reason_of(2)
        "reduced by mean over a channel dim in '(model)'"
    """
    name, inplace = op_name(func)
    c = Call(func, name, args, kwargs, out, inplace)
    if name not in PRODUCERS and not any(tr.shadow(t) is not None for t in c.tensors()):
        return
    handler = _BY_FUNC.get(func) or TABLE.get(name)
    if handler is None:
        if not isinstance(out, (torch.Tensor, list, tuple)) or name.startswith("get:"):
            if name.startswith("get:") and not isinstance(out, torch.Tensor):
                return
            return block_inputs(tr, c, f"read by {name} (a value leaves the tensors)")
        handler = unknown
    handler(tr, c)
