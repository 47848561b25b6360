"""Dense memory helpers for the reductions: a 1-D view of a tensor, and reusable scratch buffers."""

from __future__ import annotations

import torch

__all__ = ["Scratch", "flat"]


class Scratch:
    """Reusable CPU buffers, one per dtype: a fresh large allocation page-faults on every call."""

    def __init__(self) -> None:
        self._buf: dict[torch.dtype, torch.Tensor] = {}

    def get(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buf.get(dtype)
        if buf is None or buf.numel() < n:
            buf = self._buf[dtype] = torch.empty(n, dtype=dtype)
        return buf[:n]


def flat(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 1-D tensor, a view whenever its memory is dense (contiguous or channels-last)."""
    if x.is_contiguous():
        return x.view(-1)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(-1)  # for reductions, which ignore the order
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return x.permute(0, 2, 3, 4, 1).reshape(-1)
    return x.reshape(-1)
