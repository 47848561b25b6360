"""Handlers of the layers that own channels: conv, linear, embedding (producers and consumers) and
the norms (followers, or blockers when they normalise over channels). Registered in ``LAYERS``.
Must not import: the trace driver, any analysis module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._call import Call
from ._pointwise import pointwise
from ._shadow import carrying_dims, row_ids
from ._state import Tracer

__all__ = ["LAYERS"]


def _broadcast(ids: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    view = [1] * out.dim()
    view[dim] = -1
    return ids.view(view).expand(out.shape)


def _read(tr: Tracer, x: Any, dim: int, weight: torch.Tensor, wdim: int, what: str) -> None:
    """The weight positions along ``wdim`` read input channels along ``dim`` of ``x`` (a consumer)."""
    s = tr.shadow(x)
    if s is None:
        return
    ids, pairs = row_ids(s, dim)
    tr.union_pairs(pairs)
    neg = s[s < 0]
    if neg.numel():
        tr.block(neg, f"read by {what} in '{tr.here()}' where it is not zero when masked")
    if not tr.member(weight, wdim, ids, "consumer"):
        tr.block(s, f"read by {what} in '{tr.here()}' whose weight is not a parameter")


def _produce(tr: Tracer, out: torch.Tensor, dim: int, weight: torch.Tensor, wdim: int,
             bias: torch.Tensor | None) -> None:
    """Fresh ids for the output channels along ``dim``; weight rows and bias are their producers."""
    ids = tr.fresh(out.shape[dim])
    if not tr.member(weight, wdim, ids, "producer"):
        return
    if bias is not None and not tr.member(bias, 0, ids, "producer"):
        tr.block(ids.tolist(), f"bias of '{tr.here()}' is not a parameter")
    view = [1] * out.dim()
    view[dim] = -1
    tr.set(out, ids.view(view).expand(out.shape))


def _conv(transposed: bool) -> Callable[[Tracer, Call], None]:
    """F.conv{1,2,3}d and F.conv_transpose{1,2,3}d: groups=1, depthwise and grouped (channel j of
    every group together) followed; grouped transposed convs blocked."""
    def run(tr: Tracer, c: Call) -> None:
        x, w, b = c.args[0], c.arg(1, "weight"), c.arg(2, "bias")
        groups = c.arg(6, "groups", 1)
        out = c.out
        cdim = x.dim() - (w.dim() - 2) - 1
        win, wout = (0, 1) if transposed else (1, 0)
        if groups == 1:
            _read(tr, x, cdim, w, win, c.name)
            _produce(tr, out, cdim, w, wout, b)
        elif not transposed and groups == x.shape[cdim] == out.shape[cdim] and w.shape[1] == 1:
            _depthwise(tr, c, x, w, b, cdim)
        elif transposed or tr.param(w) is None or not _grouped(tr, c, x, w, b, cdim, groups):
            tr.block_tensor(x, f"read by a grouped {c.name} (groups={groups}) in '{tr.here()}'")
            ids = tr.fresh(out.shape[cdim])
            tr.block(ids.tolist(), f"output of a grouped {c.name} (groups={groups}) in '{tr.here()}'")
            tr.set(out, _broadcast(ids, out, cdim))
    return run


def _grouped(tr: Tracer, c: Call, x: torch.Tensor, w: torch.Tensor, b: Any, cdim: int, groups: int) -> bool:
    """Grouped conv: every group must keep the same width, so channel j of every group is one channel
    (a stripe), on the input side and on the output side."""
    cin, cout = x.shape[cdim], c.out.shape[cdim]
    if cin % groups or cout % groups:
        return False
    s = tr.shadow(x)
    if s is not None:
        ids, pairs = row_ids(s, cdim)
        tr.union_pairs(pairs)
        neg = s[s < 0]
        if neg.numel():
            tr.block(neg, f"read by {c.name} in '{tr.here()}' where it is not zero when masked")
        cols = ids.view(groups, cin // groups)
        for j in range(cols.shape[1]):
            col = cols[:, j]
            live = col[col != 0].long().tolist()
            for i in live[1:]:
                tr.union(live[0], i)
            if live and len(live) < groups:  # a stripe that mixes fixed channels cannot go
                tr.block(live, f"read by {c.name} in '{tr.here()}' with channels that are fixed")
        rep = torch.where(cols != 0, cols, 0.0).amax(0)
        tr.member(w, 1, rep, "consumer")
    stripe = tr.fresh(cout // groups).repeat(groups)
    tr.member(w, 0, stripe, "producer")
    if b is not None:
        tr.member(b, 0, stripe, "producer")
    tr.set(c.out, _broadcast(stripe, c.out, cdim))
    return True


def _depthwise(tr: Tracer, c: Call, x: torch.Tensor, w: torch.Tensor, b: Any, cdim: int) -> None:
    """Depthwise conv: output channel i is input channel i; weight rows and bias follow it."""
    s = tr.shadow(x)
    if s is None:  # its input channels are fixed, so its output channels are too
        ids = tr.fresh(c.out.shape[cdim])
        tr.block(ids.tolist(), f"depthwise conv '{tr.here()}' reads fixed channels")
        tr.set(c.out, _broadcast(ids, c.out, cdim))
        return
    ids, pairs = row_ids(s, cdim)
    tr.union_pairs(pairs)
    ok = tr.member(w, 0, ids, "follower") and (b is None or tr.member(b, 0, ids, "follower"))
    if not ok:
        tr.block(s, f"depthwise conv '{tr.here()}' has a weight that is not a parameter")
        return
    view = [1] * c.out.dim()
    view[cdim] = -1
    tr.set(c.out, ids.view(view).expand(c.out.shape))


def _linear(tr: Tracer, c: Call) -> None:
    """F.linear: reads the last dim (weight dim 1), produces the last dim (weight dim 0, bias)."""
    x, w, b = c.args[0], c.arg(1, "weight"), c.arg(2, "bias")
    _read(tr, x, -1, w, 1, "linear")
    _produce(tr, c.out, c.out.dim() - 1, w, 0, b)


def _addmm(tr: Tracer, c: Call) -> None:
    """addmm(bias, x, W) with W of shape (in, out), as in transformers' Conv1D: reads W dim 0,
    produces W dim 1 and the bias."""
    bias, x, w = c.args[0], c.args[1], c.args[2]
    plain = c.kwargs.get("beta", 1) == 1 and c.kwargs.get("alpha", 1) == 1 and bias.dim() == 1
    if not plain or tr.param(w) is None or tr.param(bias) is None:
        tr.block_tensor(x, f"read by addmm in '{tr.here()}'")
        return
    _read(tr, x, -1, w, 0, "addmm")
    _produce(tr, c.out, 1, w, 1, bias)


def _embedding(tr: Tracer, c: Call) -> None:
    """F.embedding: the embedding columns (weight dim 1) produce the last dim."""
    x, w = c.args[0], c.arg(1, "weight")
    tr.block_tensor(x, f"used as indices by _embedding in '{tr.here()}'")
    _produce(tr, c.out, c.out.dim() - 1, w, 1, None)


def _batch_norm(tr: Tracer, c: Call) -> None:
    """batch_norm / instance_norm: per channel, so weight, bias and running stats follow; a masked
    channel (weight and bias zero) stays zero."""
    x = c.args[0]
    s = tr.shadow(x)
    if s is None:
        return
    cdim = 1 if x.dim() > 1 else 0
    ids, pairs = row_ids(s, cdim)
    tr.union_pairs(pairs)
    names = ("running_mean", "running_var", "weight", "bias")
    tensors = {n: c.arg(i + 1, n) for i, n in enumerate(names)}
    for t in tensors.values():
        if t is not None and not tr.member(t, 0, ids, "follower"):
            tr.block(s, f"{c.name} in '{tr.here()}' has statistics that are not buffers")
            return
    w = tensors["weight"]
    sign = 1.0 if w is not None else -1.0
    view = [1] * c.out.dim()
    view[cdim] = -1
    tr.set(c.out, sign * ids.view(view).expand(c.out.shape))


def _prelu(tr: Tracer, c: Call) -> None:
    """F.prelu: a weight of one value is pointwise; one of C values applies along dim 1 (dim 0 of a
    1-d input) whatever the spatial size: it follows the channels. prelu(0) is 0."""
    x, w = c.args[0], c.arg(1, "weight")
    s = tr.shadow(x)
    if s is None or not isinstance(c.out, torch.Tensor):
        return
    if not isinstance(w, torch.Tensor) or w.numel() == 1:
        pointwise(tr, c)
        return
    cdim = 1 if x.dim() >= 2 else 0
    ids, pairs = row_ids(s, cdim)
    tr.union_pairs(pairs)
    if tr.shadow(w) is not None or not tr.member(w, 0, ids, "follower"):
        tr.block(s, f"prelu in '{tr.here()}' has a weight that is not a parameter")
        tr.block_tensor(w, f"used as the weight of prelu in '{tr.here()}'")
        return
    tr.set(c.out, s.clone())


def _norm_over(pos: int) -> Callable[[Tracer, Call], None]:
    """layer_norm / rms_norm / group_norm: statistics over channels change when one is removed."""
    def run(tr: Tracer, c: Call) -> None:
        x = c.args[0]
        s = tr.shadow(x)
        if s is None:
            return
        if c.name in ("group_norm", "local_response_norm"):
            dims = {1}
        else:
            shape = c.arg(pos, "normalized_shape")
            n = 1 if isinstance(shape, int) else len(shape)
            dims = set(range(s.dim() - n, s.dim()))
        if carrying_dims(s) & dims:
            tr.block(s, f"normalised over by {c.name} in '{tr.here()}'")
            return
        pointwise(tr, c)
    return run


LAYERS: dict[str, Callable[[Tracer, Call], None]] = {
    **{f"conv{k}d": _conv(False) for k in (1, 2, 3)},
    **{f"conv_transpose{k}d": _conv(True) for k in (1, 2, 3)},
    "linear": _linear,
    "addmm": _addmm,
    "embedding": _embedding,
    "batch_norm": _batch_norm,
    "instance_norm": _batch_norm,
    "layer_norm": _norm_over(1),
    "rms_norm": _norm_over(1),
    "group_norm": _norm_over(1),
    "local_response_norm": _norm_over(1),
    "prelu": _prelu,
}
