"""torchvision's window attention (Swin, Swin V2) with fewer heads than its input width: torchvision's
``shifted_window_attention`` derives the head size as ``C // num_heads`` from the input's channels and
reshapes the heads' outputs to ``C``, so a layer whose heads were removed runs this forward instead,
which reads the head size from ``qkv`` (its rows are ``3 * num_heads * head_dim``). The arithmetic is
torchvision's, operation for operation (window partition, cyclic shift and its mask, cosine attention
with ``logit_scale`` and the continuous position bias of V2); parameters, buffers and ``state_dict``
keys are those of the layer it was. Imported only when such a layer is compacted (torchvision is
optional). Must not import: analysis, ``loading``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.swin_transformer import (
    ShiftedWindowAttention,
    ShiftedWindowAttentionV2,
)

__all__ = ["HeadPrunedShiftedWindowAttention", "HeadPrunedShiftedWindowAttentionV2", "pruned_class",
           "window_attention"]


def _windows(x: torch.Tensor, ws: list[int], shift: list[int]) -> tuple[torch.Tensor, list[int], int, int]:
    """Pad to whole windows, shift, partition: ``(B * windows) x tokens x C``, the shift used (none
    along a side no longer than a window), the padded height and width."""
    B, H, W, C = x.shape
    x = F.pad(x, (0, 0, 0, (ws[1] - W % ws[1]) % ws[1], 0, (ws[0] - H % ws[0]) % ws[0]))
    _, ph, pw, _ = x.shape
    shift = [0 if ws[0] >= ph else shift[0], 0 if ws[1] >= pw else shift[1]]
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    x = x.view(B, ph // ws[0], ws[0], pw // ws[1], ws[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, ws[0] * ws[1], C), shift, ph, pw


def _shift_mask(attn: torch.Tensor, ws: list[int], shift: list[int], ph: int, pw: int) -> torch.Tensor:
    """torchvision's mask between tokens that the cyclic shift brought into one window (-100)."""
    n = (ph // ws[0]) * (pw // ws[1])
    mask = attn.new_zeros((ph, pw))
    count = 0
    for h in ((0, -ws[0]), (-ws[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -ws[1]), (-ws[1], -shift[1]), (-shift[1], None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    mask = mask.view(ph // ws[0], ws[0], pw // ws[1], ws[1]).permute(0, 2, 1, 3).reshape(n, ws[0] * ws[1])
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    mask = mask.masked_fill(mask != 0, float(-100.0)).masked_fill(mask == 0, float(0.0))
    t = attn.size(-1)
    attn = attn.view(attn.size(0) // n, n, attn.size(1), t, t) + mask.unsqueeze(1).unsqueeze(0)
    return attn.view(-1, attn.size(2), t, t)


def _attend(m: ShiftedWindowAttention, x: torch.Tensor, bias: torch.Tensor,
            logit_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention logits (position bias added) and values of the windows ``x``, per kept head."""
    heads = int(m.num_heads)
    d = int(m.qkv.weight.shape[0]) // 3 // heads
    qkv_bias = m.qkv.bias
    if logit_scale is not None and qkv_bias is not None:  # V2: the key bias is held at zero
        qkv_bias = qkv_bias.clone()
        n = qkv_bias.numel() // 3
        qkv_bias[n:2 * n].zero_()
    qkv = F.linear(x, m.qkv.weight, qkv_bias)
    q, k, v = qkv.reshape(x.size(0), x.size(1), 3, heads, d).permute(2, 0, 3, 1, 4)
    if logit_scale is not None:
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(logit_scale, max=math.log(100.0)).exp()
    else:
        attn = (q * d ** -0.5).matmul(k.transpose(-2, -1))
    return attn + bias, v


def window_attention(m: ShiftedWindowAttention, x: torch.Tensor,
                     logit_scale: torch.Tensor | None = None) -> torch.Tensor:
    """torchvision's ``shifted_window_attention`` of layer ``m`` on ``x`` (``B x H x W x C``), the head
    size read from ``m.qkv``.

    Example:
        >>> m = ShiftedWindowAttention(8, [2, 2], [1, 1], 2).eval()
        >>> x = torch.randn(1, 4, 4, 8)
        >>> bool(torch.allclose(window_attention(m, x), m(x), atol=1e-6))
        True
    """
    B, H, W, C = x.shape
    ws = list(m.window_size)
    bias = m.get_relative_position_bias()
    win, shift, ph, pw = _windows(x, ws, list(m.shift_size))
    attn, v = _attend(m, win, bias, logit_scale)
    if sum(shift) > 0:
        attn = _shift_mask(attn, ws, shift, ph, pw)
    attn = F.dropout(F.softmax(attn, dim=-1), p=m.attention_dropout, training=m.training)
    out = attn.matmul(v).transpose(1, 2).reshape(win.size(0), win.size(1), -1)
    out = F.dropout(F.linear(out, m.proj.weight, m.proj.bias), p=m.dropout, training=m.training)
    out = out.view(B, ph // ws[0], pw // ws[1], ws[0], ws[1], C).permute(0, 1, 3, 2, 4, 5).reshape(B, ph, pw, C)
    if sum(shift) > 0:
        out = torch.roll(out, shifts=(shift[0], shift[1]), dims=(1, 2))
    return out[:, :H, :W, :].contiguous()


class HeadPrunedShiftedWindowAttention(ShiftedWindowAttention):  # type: ignore[misc]
    """A Swin window attention that kept ``num_heads`` of its heads at the head size it had.

    Example:
        >>> m = ShiftedWindowAttention(8, [2, 2], [0, 0], 2)
        >>> m.__class__ = HeadPrunedShiftedWindowAttention
        >>> m(torch.randn(1, 4, 4, 8)).shape
        torch.Size([1, 4, 4, 8])
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Window attention of ``x`` (``B x H x W x C``)."""
        return window_attention(self, x)


class HeadPrunedShiftedWindowAttentionV2(ShiftedWindowAttentionV2):  # type: ignore[misc]
    """A Swin V2 window attention (cosine attention, continuous position bias) that kept
    ``num_heads`` of its heads.

    Example:
        >>> m = ShiftedWindowAttentionV2(8, [2, 2], [0, 0], 2)
        >>> m.__class__ = HeadPrunedShiftedWindowAttentionV2
        >>> m(torch.randn(1, 4, 4, 8)).shape
        torch.Size([1, 4, 4, 8])
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Window attention of ``x`` (``B x H x W x C``)."""
        return window_attention(self, x, self.logit_scale)


def pruned_class(m: nn.Module) -> type[nn.Module]:
    """The class a torchvision window attention ``m`` runs as once heads were removed.

    Example:
        >>> pruned_class(ShiftedWindowAttentionV2(8, [2, 2], [0, 0], 2)).__name__
        'HeadPrunedShiftedWindowAttentionV2'
    """
    return HeadPrunedShiftedWindowAttentionV2 if isinstance(m, ShiftedWindowAttentionV2) \
        else HeadPrunedShiftedWindowAttention
