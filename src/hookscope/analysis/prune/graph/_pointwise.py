"""The pointwise handler of the channel tracer: ids meeting at one position are one channel, and the
zero test tells which positions an op makes non-zero when the tracked channels are masked. Shared by
the op table (``_ops``) and the layer handlers (``_layers``), which fall back to it.
Must not import: the trace driver, the op table, any analysis module.
"""

from __future__ import annotations

from typing import Any

import torch

from ._call import Call, unknown
from ._shadow import carrying_dims, coupled_pairs, row_ids
from ._state import Tracer

__all__ = ["PROBE", "VALUE_PRESERVING", "pointwise"]

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


VALUE_PRESERVING = {"clone", "contiguous", "detach", "to", "float", "double", "half", "bfloat16",
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
    if c.name in VALUE_PRESERVING:
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
        tr.block(pshadow, f"parameter '{info and info[0]}.{info and info[1]}' meets channels along "
                          f"several dims in '{tr.here()}'")
        return False
    d = carry.pop()
    ids, inner = row_ids(pshadow, d)
    tr.union_pairs(inner)
    return tr.member(p, d, ids, "follower")
