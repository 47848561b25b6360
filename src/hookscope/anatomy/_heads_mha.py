"""``nn.MultiheadAttention`` with fewer heads than ``embed_dim / head_dim``: torch's functional
attention derives the head size as ``embed_dim // num_heads`` (and refuses anything else), so a layer
whose heads were removed runs this forward instead, which reads ``head_dim`` as it was. The
parameters and their names are those of ``nn.MultiheadAttention`` (a ``state_dict`` loads as before);
masks, padding masks, ``need_weights``, ``bias_k`` / ``bias_v``, ``add_zero_attn``, ``batch_first``
and separate key / value sizes behave as in torch. Must not import: analysis, ``loading``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["HeadPrunedMultiheadAttention", "attend"]


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: not attended) as an additive float mask, as torch canonicalises it."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


class HeadPrunedMultiheadAttention(nn.MultiheadAttention):
    """A multi-head attention layer that kept ``num_heads`` of its heads (``kept_heads``, their indices
    before) at the head size it had. A per-head 3-D ``attn_mask`` is given for every original head.

    Example:
        >>> from hookscope.anatomy import fix_layout, read_layout
        >>> mha = nn.MultiheadAttention(8, 4, batch_first=True)
        >>> fix_layout(mha, read_layout("", mha, {}), [0, 1, 2, 3])
        >>> x = torch.randn(2, 5, 8); out, w = mha(x, x, x)
        >>> out.shape, w.shape
        (torch.Size([2, 5, 8]), torch.Size([2, 5, 5]))
    """

    kept_heads: list[int]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over the kept heads; arguments and outputs as ``nn.MultiheadAttention.forward``."""
        batched = query.dim() == 3
        heads, weights = attend(self, query, key, value, key_padding_mask, attn_mask, is_causal,
                                need_weights=need_weights)
        out = F.linear(heads, self.out_proj.weight, self.out_proj.bias)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if weights is None:
            return out, None
        w = weights.mean(1) if average_attn_weights else weights
        return out, (w if batched else w.squeeze(0))


def _project(m: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = m.num_heads * m.head_dim
    if m.in_proj_weight is not None:
        ws = m.in_proj_weight.split(a)
    else:
        ws = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    bs = m.in_proj_bias.split(a) if m.in_proj_bias is not None else (None, None, None)
    return F.linear(query, ws[0], bs[0]), F.linear(key, ws[1], bs[1]), F.linear(value, ws[2], bs[2])


def _masks(m: nn.MultiheadAttention, attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, n: int, tgt: int,
           dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    mask = _float_mask(attn_mask, dtype)
    if mask is not None and mask.dim() == 3:  # one mask per (sample, original head)
        mask = mask.view(n, -1, tgt, mask.shape[-1])[:, getattr(m, "kept_heads", list(range(m.num_heads)))]
    elif mask is not None:
        mask = mask[None, None]
    return mask, _float_mask(key_padding_mask, dtype)


def attend(m: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_padding_mask: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
           is_causal: bool = False, need_weights: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The heads' outputs side by side before ``out_proj`` (sequence first: ``L x N x heads * head_dim``)
    and the attention weights (``N x heads x L x S``; ``None`` with ``need_weights=False``, where the fused
    ``scaled_dot_product_attention`` kernel runs instead) of any ``nn.MultiheadAttention``.

    Example:
        >>> mha = nn.MultiheadAttention(8, 2, batch_first=True); x = torch.randn(3, 5, 8)
        >>> heads, w = attend(mha, x, x, x)
        >>> out = F.linear(heads, mha.out_proj.weight, mha.out_proj.bias).transpose(0, 1)
        >>> heads.shape, bool((out - mha(x, x, x)[0]).abs().max() < 1e-5)
        (torch.Size([5, 3, 8]), True)
    """
    if query.dim() != 3:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
    elif m.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    tgt, n, _ = query.shape
    q, k, v = _project(m, query, key, value)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
    mask, pad = _masks(m, attn_mask, key_padding_mask, n, tgt, q.dtype)
    if m.bias_k is not None and m.bias_v is not None:
        k, v = torch.cat([k, m.bias_k.repeat(1, n, 1)]), torch.cat([v, m.bias_v.repeat(1, n, 1)])
        mask = F.pad(mask, (0, 1)) if mask is not None else None
        pad = F.pad(pad, (0, 1)) if pad is not None else None
    h, d = m.num_heads, m.head_dim
    q, k, v = (t.reshape(t.shape[0], n, h, d).permute(1, 2, 0, 3) for t in (q, k, v))
    if m.add_zero_attn:
        k, v = (torch.cat([t, t.new_zeros(n, h, 1, d)], dim=2) for t in (k, v))
        mask = F.pad(mask, (0, 1)) if mask is not None else None
        pad = F.pad(pad, (0, 1)) if pad is not None else None
    if pad is not None:
        mask = pad[:, None, None] if mask is None else mask + pad[:, None, None]
    if not need_weights:  # the fused kernel: the same scale (1 / sqrt(d)) and additive mask, no weights made
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=m.dropout if m.training else 0.0)
        return out.permute(2, 0, 1, 3).reshape(tgt, n, h * d), None
    scores = (q * math.sqrt(1.0 / d)) @ k.transpose(-2, -1)
    weights = torch.softmax(scores + mask if mask is not None else scores, dim=-1)
    weights = F.dropout(weights, m.dropout, training=m.training)
    return (weights @ v).permute(2, 0, 1, 3).reshape(tgt, n, h * d), weights
