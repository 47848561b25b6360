"""Movement ops for the channel tracer (view, permute, cat, indexing, ``x[i] = v`` ...): the same op is
applied to the shadows; a channel dim that is split, sliced or indexed with sizes fixed at trace time
is blocked. Must not import: the handler table, any analysis module.
"""

from __future__ import annotations

from typing import Any

import torch

from ._call import Call, unknown
from ._shadow import carrying_dims, indexed_dims, reshape_blocks
from ._state import Tracer

__all__ = ["MOVEMENT", "movement", "setitem", "assign"]

# --- movement ------------------------------------------------------------------------------------
_ALWAYS_SPLIT = {"pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle"}
_DIM_ARG = {"narrow": (1, "dim", 0), "select": (1, "dim", 0), "index_select": (1, "dim", 0),
            "unbind": (1, "dim", 0), "chunk": (2, "dim", 0), "split": (2, "dim", 0),
            "tensor_split": (2, "dim", 0), "split_with_sizes": (2, "dim", 0), "unsafe_chunk": (2, "dim", 0),
            "unsafe_split": (2, "dim", 0), "gather": (1, "dim", 0), "take_along_dim": (2, "dim", None),
            "roll": (2, "dims", None)}
MOVEMENT = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "swapaxes", "swapdims",
             "movedim", "moveaxis", "t", "unsqueeze", "squeeze", "expand", "expand_as", "repeat", "tile",
             "cat", "concat", "concatenate", "stack", "hstack", "vstack", "flip", "fliplr", "flipud",
             "view_as", "reshape_as", "get:T", "get:mT", "get:H", "get:mH", "getitem", "repeat_interleave",
             "narrow", "select", "index_select", "unbind", "chunk", "split", "tensor_split", "gather",
             "split_with_sizes", "unsafe_chunk", "unsafe_split", "take_along_dim", "roll", "pad",
             "contiguous", "clone", "ravel", "atleast_2d", "atleast_3d", "rot90"} | _ALWAYS_SPLIT


def _shadow_arg(tr: Tracer, a: Any, in_list: bool) -> Any:
    if isinstance(a, torch.Tensor):
        s = tr.shadow(a)
        if s is not None:
            return s
        return torch.zeros(a.shape, dtype=torch.float64) if in_list and a.is_floating_point() else a
    if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
        return type(a)(_shadow_arg(tr, t, True) for t in a)
    return a


def movement(tr: Tracer, c: Call) -> None:
    """Apply the same op to the shadows; block ids on a dim that is split, sliced or indexed (sizes
    fixed at trace time would be wrong once channels are removed).
    Example:
        >>> tr = Tracer({}); x = torch.ones(1, 4, 2); tr.set(x, tr.fresh(4).view(1, 4, 1).expand(1, 4, 2))
        >>> y = x.flatten(1); movement(tr, Call(torch.flatten, "flatten", (x, 1), {}, y)); tr.shadow(y).tolist()
        [[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]]
        >>> a, b = x.chunk(2, 1); movement(tr, Call(torch.chunk, "chunk", (x, 2, 1), {}, (a, b))); tr.reason_of(1)
        "chunk splits, slices or reorders a channel dim in '(model)'"
    """
    first = c.args[0] if c.args else None
    s = tr.shadow(first)
    if s is not None and _breaks_channels(tr, c, s):
        tr.block(s, f"{c.name} splits, slices or reorders a channel dim in '{tr.here()}'")
    args = [_shadow_arg(tr, a, False) for a in c.args]
    kwargs = {k: _shadow_arg(tr, v, False) for k, v in c.kwargs.items()}
    if c.name == "pad":
        kwargs.pop("value", None)
        args = args[:3]
    func = torch.Tensor.reshape if c.name == "view" else c.func  # a shadow may not be contiguous
    try:
        shadow = func(*args, **kwargs)
    except Exception:
        return unknown(tr, c)
    assign(tr, c.out, shadow)
    return None


def assign(tr: Tracer, out: Any, shadow: Any) -> None:
    """Give each output tensor (nested in tuples and lists) its shadow when the shapes agree.

    Example:
        >>> tr = Tracer({}); t = torch.ones(2); assign(tr, (t,), (torch.tensor([0.0, 5.0]),))
        >>> tr.shadow(t).tolist()
        [0.0, 5.0]
    """
    if isinstance(out, torch.Tensor) and isinstance(shadow, torch.Tensor) and out.shape == shadow.shape:
        tr.set(out, shadow.to(torch.float64))
    elif isinstance(out, (list, tuple)) and isinstance(shadow, (list, tuple)) and len(out) == len(shadow):
        for o, s in zip(out, shadow):
            assign(tr, o, s)


def _breaks_channels(tr: Tracer, c: Call, s: torch.Tensor) -> bool:
    if c.name in _ALWAYS_SPLIT:
        return True
    if c.name in ("view", "reshape") and isinstance(c.out, torch.Tensor):
        splits = [bo for bo, bn in reshape_blocks(list(s.shape), list(c.out.shape))
                  if sum(c.out.shape[j] > 1 for j in bn) > 1]
        return bool(splits) and bool(carrying_dims(s) & {d for bo in splits for d in bo})
    dims: list[int] = []
    if c.name == "getitem":
        dims = indexed_dims(list(s.shape), c.args[1])
    elif c.name in _DIM_ARG:
        pos, key, default = _DIM_ARG[c.name]
        d = c.arg(pos, key, default)
        dims = list(range(s.dim())) if d is None else [d] if isinstance(d, int) else list(d)
    return bool(dims) and bool(carrying_dims(s) & {d % s.dim() for d in dims})


def setitem(tr: Tracer, c: Call) -> None:
    """``x[index] = value``: the shadow is written the same way; a channel dim indexed is blocked.

    Example:
        >>> tr = Tracer({}); x = torch.ones(1, 3); tr.set(x, tr.fresh(3).view(1, 3))
        >>> setitem(tr, Call(torch.Tensor.__setitem__, "setitem", (x, (0, 1), 0.0), {}, None))
        >>> tr.shadow(x).tolist(), tr.reason_of(2)
        ([[1.0, 0.0, 3.0]], "channels written by index in '(model)'")
    """
    x, index = c.args[0], c.args[1]
    value = c.args[2] if len(c.args) > 2 else None
    sx, sv = tr.shadow(x), tr.shadow(value)
    if sx is None and sv is None:
        return
    base = sx if sx is not None else torch.zeros(x.shape, dtype=torch.float64)
    if sx is not None and carrying_dims(sx) & set(indexed_dims(list(x.shape), index)):
        tr.block(sx, f"channels written by index in '{tr.here()}'")
    new = base.clone()
    try:
        new[index] = sv if sv is not None else 0.0
    except Exception:
        return unknown(tr, c)
    tr.set(x, new)


