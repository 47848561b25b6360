"""Mean attention entropy of every head, ``-sum_k p_k log p_k`` in nats over the keys of each query
row, averaged over samples and query positions (padded query rows included; a row with no key to
attend to is left out). The probabilities come from where the layer computes them: the inputs of its
``scaled_dot_product_attention`` call (computed here as the math kernel would, so fused kernels
need no eager attention), the output of the first ``softmax`` its own forward runs (eager
attention), or, for ``nn.MultiheadAttention``, its inputs. Per-head sums on the device, nothing
per token kept. Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ....anatomy import HeadLayout, attend
from ....core.hooks import HookGroup
from ....core.ops import OpSite
from ....core.state import restored
from ....errors import HookscopeError
from ....selection import named_modules
from ..._targets import call_model
from ..importance import Batch, accumulator_dtype, batch_to

__all__ = ["entropy_scores", "entropies", "probabilities", "row_entropy"]

_SDPA = "scaled_dot_product_attention"
_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "attn_mask", "is_causal")


_ROWS_BUDGET = 1 << 24  # probabilities held at once by entropies(): query rows x keys x batch x heads


def probabilities(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                  attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False, *, first_row: int = 0) -> torch.Tensor:
    """The probabilities ``scaled_dot_product_attention`` weighs ``value`` with (dropout left out),
    ``... x heads x queries x keys``; key heads shared by groups of query heads are repeated.
    ``first_row``: the queries are rows ``first_row ...`` of the call's (for the causal mask).

    Example:
        >>> q = torch.randn(1, 2, 3, 4)
        >>> p = probabilities(q, q, is_causal=True)
        >>> float(p[0, 0, 0, 1]), bool(torch.allclose(p.sum(-1), torch.ones(1, 2, 3)))
        (0.0, True)
    """
    hq, hk = (query.size(-3), key.size(-3)) if query.dim() > 2 else (1, 1)
    if hq != hk and hk and hq % hk == 0:
        key = key.repeat_interleave(hq // hk, dim=-3)
    logits = (query @ key.transpose(-2, -1)) * (1 / math.sqrt(query.size(-1)) if scale is None else scale)
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril(first_row)
        logits = logits.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else logits + attn_mask
    return torch.softmax(logits, dim=-1)


def row_entropy(p: torch.Tensor) -> torch.Tensor:
    """``-sum_k p_k log p_k`` over the last dim, in the accumulator dtype (``0 log 0 = 0``).

    Example:
        >>> round(float(row_entropy(torch.tensor([0.5, 0.5, 0.0]))) / math.log(2), 6)
        1.0
    """
    plogp: torch.Tensor = torch.special.xlogy(p, p)
    return -plogp.sum(-1, dtype=accumulator_dtype(p.device))


def entropies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """The entropy of every query row of a ``scaled_dot_product_attention`` call, ``... x heads x
    queries``, from its arguments; computed a block of query rows at a time (half precision in
    float32), so the probabilities of a long sequence are never held whole.

    Example:
        >>> q, k = torch.randn(1, 2, 40, 4), torch.randn(1, 2, 40, 4)
        >>> whole = row_entropy(probabilities(q, k, is_causal=True))
        >>> bool(torch.allclose(entropies(q, k, is_causal=True), whole))
        True
    """
    if query.dtype in (torch.float16, torch.bfloat16):
        query, key = query.float(), key.float()
        attn_mask = attn_mask.float() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
    rows = query.size(-2)
    step = max(1, _ROWS_BUDGET // max(1, key.size(-2) * (query.numel() // max(1, rows * query.size(-1)))))
    out = []
    for r in range(0, rows, step):
        m = attn_mask
        if m is not None and m.dim() >= 2 and m.size(-2) == rows:
            m = m[..., r:r + step, :]
        out.append(row_entropy(probabilities(query[..., r:r + step, :], key, None, m, is_causal=is_causal,
                                             scale=scale, first_row=r)))
    return torch.cat(out, -1)


class _Entropy:
    """One source of one layer's probabilities: per-head sums of the row entropies and row counts."""

    def __init__(self, lay: HeadLayout, source: str) -> None:
        self.lay, self.source, self.total, self.rows = lay, source, torch.zeros(0), torch.zeros(0)

    def check(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 4 or shape[1] != self.lay.heads:
            raise HookscopeError(
                f"'{self.lay.module}' gives attention probabilities of shape {shape} from its "
                f"{self.source}, not batch x {self.lay.heads} heads x queries x keys, so its heads' entropy "
                "cannot be read; use importance='taylor' or 'output', or leave it out with layers=")

    def add(self, ent: torch.Tensor) -> None:
        """Row entropies, ``batch x heads x queries``; a row with no key to attend to (NaN) left out."""
        ok = ~ent.isnan()
        total, rows = ent.nan_to_num(0.0).sum((0, 2)), ok.sum((0, 2), dtype=ent.dtype)
        self.total = total if self.total.numel() == 0 else self.total + total
        self.rows = rows if self.rows.numel() == 0 else self.rows + rows

    def add_probabilities(self, p: torch.Tensor) -> None:
        if p.dim() > 4 and p.size(-3) == self.lay.heads:  # partitions before the heads (MaxViT): more rows
            p = p.flatten(0, p.dim() - 4)
        self.check(tuple(p.shape))
        self.add(row_entropy(p.float() if p.dtype in (torch.float16, torch.bfloat16) else p))


def _sdpa(acc: _Entropy) -> Callable[[nn.Module, Any, Any], None]:
    def hook(site: nn.Module, args: Any, kwargs: Any) -> None:
        got = inspect.signature(entropies).bind(*args, **kwargs).arguments
        q, k = got["query"], got["key"]
        acc.check((*q.shape[:-1], k.shape[-2]))
        acc.add(entropies(*args, **kwargs))
    return hook


def _softmax(acc: _Entropy) -> Callable[[nn.Module, Any, Any], None]:
    def hook(site: nn.Module, args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            acc.add_probabilities(out.detach())
    return hook


def _mha(acc: _Entropy) -> Callable[[nn.Module, Any, Any, Any], None]:
    def hook(module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        assert isinstance(module, nn.MultiheadAttention)
        bound = inspect.signature(nn.MultiheadAttention.forward).bind(module, *args, **kwargs).arguments
        _, probabilities = attend(module, **{k: v for k, v in bound.items() if k in _MHA_ARGS})
        assert probabilities is not None  # asked for: need_weights=True
        acc.add_probabilities(probabilities)
    return hook


def _hooks(mods: dict[str, nn.Module], lay: HeadLayout, group: HookGroup) -> list[_Entropy]:
    """The layer's sources, most direct first: its own inputs (MHA), its attention kernel, its softmax."""
    m = mods[lay.module]
    if lay.out is None:
        acc = _Entropy(lay, "inputs")
        # own hook: the attention probabilities reduced to entropies in the hook; none is kept
        group.add(m.register_forward_hook(_mha(acc), with_kwargs=True))
        return [acc]
    sdpa, soft = _Entropy(lay, _SDPA), _Entropy(lay, "softmax")
    # own hooks: the kernel's inputs or the softmax's output reduced to entropies in the hook, block by block
    group.add(OpSite(m, lay.module, _SDPA).register_forward_pre_hook(_sdpa(sdpa), with_kwargs=True))
    group.add(OpSite(m, lay.module, "softmax").register_forward_hook(_softmax(soft)))
    return [sdpa, soft]


def _scores(lay: HeadLayout, sources: list[_Entropy]) -> torch.Tensor:
    for acc in sources:
        if acc.rows.numel() and bool((acc.rows > 0).all()):
            return (acc.total / acc.rows).cpu()
    raise HookscopeError(f"'{lay.module}' ran no scaled_dot_product_attention or softmax in its own forward on "
                         "the calibration data (a fused kernel of its own?), so its heads' attention cannot be "
                         "read; use importance='taylor' or 'output', or leave it out with layers=")


def entropy_scores(model: nn.Module, lays: list[HeadLayout], batches: Iterable[Batch],
                   device: torch.device | str | None) -> dict[str, torch.Tensor]:
    """Every layer's mean attention entropy per head (nats, float64, on the CPU), one pass over ``batches``.

    Example:
        >>> from hookscope.analysis.prune.heads._groups import layouts
        >>> from hookscope.analysis.prune.importance._run import split_batch
        >>> net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> s = entropy_scores(net, layouts(net), [split_batch(torch.randn(3, 4, 8), 0)], None)
        >>> bool(((s["self_attn"] > 0) & (s["self_attn"] <= math.log(4) + 1e-9)).all())
        True
    """
    mods = dict(named_modules(model))
    where = torch.device(device) if device is not None else None
    with HookGroup() as group, restored(model, train=False, buffers=True), torch.no_grad():
        sources = {lay.module: _hooks(mods, lay, group) for lay in lays}
        for batch in batches:
            b = batch_to(batch, where)
            call_model(model, b.args, b.kwargs)
    return {lay.module: _scores(lay, sources[lay.module]) for lay in lays}
