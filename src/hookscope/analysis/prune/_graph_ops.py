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

from ._graph_call import Call, Handler, block_inputs, op_name, unknown
from ._graph_moves import MOVEMENT, assign, movement, setitem
from ._graph_shadow import carrying_dims, collapse, coupled_pairs, row_ids
from ._graph_state import Tracer

__all__ = ["handle", "pointwise", "TABLE", "PRODUCERS"]

PROBE = 0.6180339887  # the value of a channel that is NOT zero when masked, in the zero test


def _zero_input(tr: Tracer, t: Any, follower: bool, inplace: bool, fill: int | None = None) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    s = tr.shadow(t)
    if s is not None:  # shadows live on the CPU
        s = s.to(t.device)
        z = torch.where(s > 0, 0.0, torch.where(s < 0, PROBE, t.double()))
        return z.to(t.dtype) if t.is_floating_point() else z
    if follower:
        return torch.zeros_like(t)
    if t.is_floating_point():  # generic positive values: an untracked operand that is zero by chance
        gen = torch.Generator(device=t.device).manual_seed(t.numel())  # must not pass for zero-preserving
        return torch.rand(t.shape, generator=gen, dtype=t.dtype, device=t.device) + 0.5
    if fill is not None and tr.param(t) is None:  # a mask or count from the data: tried all 0 and all 1
        return torch.full_like(t, fill)
    return t.clone() if inplace else t


def _from_data(tr: Tracer, c: Call) -> bool:
    """An untracked bool or integer operand that is not a parameter or buffer (``x < 0``): its values
    depend on the input, so the example's values must not decide whether a channel stays zero."""
    return any(tr.shadow(t) is None and tr.param(t) is None and not t.is_floating_point() and t.numel() > 0
               for t in c.tensors())


def _probe(tr: Tracer, c: Call, followers: set[int], fill: int | None) -> Any:
    def sub(a: Any, first: bool) -> Any:
        if isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
            return type(a)(_zero_input(tr, t, id(t) in followers, False, fill) for t in a)
        return _zero_input(tr, a, id(a) in followers, first and c.inplace, fill)

    args = [sub(a, i == 0) for i, a in enumerate(c.args)]
    kwargs = {k: sub(v, False) for k, v in c.kwargs.items() if k != "out"}
    try:
        return c.func(*args, **kwargs)
    except Exception:  # the op refuses the probe values: assume the worst (not zero)
        return None


def _zero_test(tr: Tracer, c: Call, acc: torch.Tensor, followers: set[int]) -> torch.Tensor:
    """Negate the ids at positions the op makes non-zero when every tracked channel is zero (for
    every value an operand taken from the data may have: as in the example, all 0, all 1)."""
    nonzero = torch.zeros(acc.shape, dtype=torch.bool)
    for fill in (None, 0, 1) if _from_data(tr, c) else (None,):
        z = _probe(tr, c, followers, fill)
        if not isinstance(z, torch.Tensor) or z.shape != acc.shape:
            return -acc.abs()
        nonzero |= (z != 0).cpu()
    nonzero &= acc != 0
    return torch.where(nonzero, -acc.abs(), acc.abs())


# --- pointwise -----------------------------------------------------------------------------------
_VALUE_PRESERVING = {"clone", "contiguous", "detach", "to", "float", "double", "half", "bfloat16",
                     "type_as", "requires_grad", "cpu", "cuda", "dropout", "dropout1d", "dropout2d",
                     "dropout3d", "alpha_dropout", "feature_alpha_dropout", "get:data", "identity"}


def pointwise(tr: Tracer, c: Call) -> None:
    """Ids meeting at one position after broadcasting are one channel; parameters met are followers.
    The zero test negates ids at positions the op makes non-zero when the channels are masked.

    Example:
        >>> tr = Tracer({}); a, b = torch.ones(2), torch.ones(2)
        >>> tr.set(a, tr.fresh(2)); tr.set(b, tr.fresh(2))
        >>> out = a + b; pointwise(tr, Call(torch.add, "add", (a, b), {}, out))
        >>> tr.find(1) == tr.find(3), tr.shadow(out).tolist()
        (True, [1.0, 2.0])
        >>> out = torch.sigmoid(a); pointwise(tr, Call(torch.sigmoid, "sigmoid", (a,), {}, out))
        >>> tr.shadow(out).tolist()
        [-1.0, -2.0]
    """
    out = c.out
    if not isinstance(out, torch.Tensor):
        return unknown(tr, c)
    if c.name in _VALUE_PRESERVING:
        first = next(c.tensors(), None)
        s = tr.shadow(first)
        if s is not None and s.shape == out.shape:
            tr.set(out, s.contiguous())
            return None
    acc = torch.zeros(out.shape, dtype=torch.float64)
    params: list[torch.Tensor] = []
    for t in c.tensors():
        s = tr.shadow(t)
        if s is None:
            if tr.param(t) is not None:
                params.append(t)
            continue
        try:
            sb = s.expand(out.shape)
        except RuntimeError:
            return unknown(tr, c)
        tr.union_pairs(coupled_pairs(acc, sb))
        acc = torch.where(acc != 0, acc, sb.abs())
    if not bool(acc.any()):
        return None
    follow = [p for p in params if _follow(tr, p, acc)]
    followers = {id(p) for p in follow}
    shadow = _zero_test(tr, c, acc, followers)
    buffers = [p for p in follow if (tr.param(p) or ("", "", False))[2]]
    if buffers:  # a buffer cannot be masked: the channels it makes non-zero cannot go
        unmasked = _zero_test(tr, c, acc, followers - {id(b) for b in buffers})
        info = tr.param(buffers[0]) or ("", "", True)
        name = f"{info[0]}.{info[1]}" if info[0] else info[1]
        tr.block(acc[(unmasked < 0) & (shadow > 0)], f"a buffer '{name}' is added to these channels in "
                                                     f"'{tr.here()}': it cannot be masked")
        shadow = unmasked
    tr.set(out, shadow)
    return None


def _follow(tr: Tracer, p: torch.Tensor, acc: torch.Tensor) -> bool:
    """Parameter ``p`` (a layer scale, a position embedding) meets channels: record along which dim.
    One that is the same for every channel (a scalar, a (1, 1, H, W) map) is no follower: the zero
    test gives it generic values."""
    lead = acc.dim() - p.dim()
    chans = carrying_dims(acc)
    if lead < 0 or not any(p.shape[d] > 1 and d + lead in chans for d in range(p.dim())):
        return False
    try:
        idx = torch.arange(p.numel(), dtype=torch.float64).view(p.shape).expand(acc.shape)
    except RuntimeError:
        return False
    m = acc != 0
    pairs = torch.unique(torch.stack([idx[m], acc.abs()[m]], 1), dim=0)
    pshadow = torch.zeros(p.numel(), dtype=torch.float64)
    for e, i in pairs.long().tolist():
        if pshadow[e] and int(pshadow[e]) != i:
            tr.union(int(pshadow[e]), i)
        pshadow[e] = i
    pshadow = pshadow.view(p.shape)
    dims = [d for d in range(p.dim()) if p.shape[d] > 1]
    carry = carrying_dims(pshadow) if len(dims) > 1 else set(dims)
    info = tr.param(p)
    if not carry:
        return False
    if len(carry) > 1:
        tr.block(pshadow, f"parameter '{info and info[0]}.{info and info[1]}' meets channels _along "
                          f"several dims in '{tr.here()}'")
        return False
    d = carry.pop()
    ids, inner = row_ids(pshadow, d)
    tr.union_pairs(inner)
    return tr.member(p, d, ids, "follower")


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
            tr.block(s, f"normalised _along a channel dim by {c.name} in '{tr.here()}'")
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


from ._graph_layers import LAYERS  # noqa: E402  (the layer handlers use the helpers above)

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
        "stochastic_depth", *_VALUE_PRESERVING)},
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
