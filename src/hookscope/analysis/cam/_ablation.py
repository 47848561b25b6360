"""Ablation-CAM (Desai & Ramaswamy 2020): channel weights from the drop of the score when a channel is zeroed.

The model runs on copies of each image, in batches under ``no_grad``, with the layer's output replaced by
copies of the one the first pass recorded, each with one channel set to zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._tree import first_tensor, tree_map
from ...core.hooks import HookGroup
from ._formulas import projection, safe_div

__all__ = ["ablation_weights", "chosen_channels"]

Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def chosen_channels(A: torch.Tensor, ratio: float) -> torch.Tensor:
    """The channels of one sample (``K x ...``) worth ablating: those not all zero (zeroing them changes
    nothing), and with ``ratio < 1`` the ``ceil(ratio * K)`` of them whose magnitude lies most inside the
    region Eigen-CAM finds (its ``|projection|`` min-max scaled, above 0.01), as pytorch-grad-cam ranks them."""
    live = A.flatten(1).abs().amax(1) > 0
    if ratio >= 1.0:
        return live.nonzero().flatten()
    proj = projection(A.unsqueeze(0))[0].abs()
    span = proj.max() - proj.min()
    inside = ((proj - proj.min()) / torch.where(span > 0, span, torch.ones_like(span)) > 0.01).to(A.dtype)
    mag = A.abs()
    low = mag.flatten(1).amin(1).view(-1, *([1] * (A.ndim - 1)))
    norm = mag - low
    top = norm.flatten(1).amax(1).view_as(low)
    norm = norm / torch.where(top > 0, top, torch.ones_like(top))
    share = safe_div((norm * inside).flatten(1).sum(1), norm.flatten(1).sum(1))
    share = torch.where(live, share, torch.full_like(share, -1.0))
    keep = min(math.ceil(ratio * A.shape[0]), int(live.sum()))
    return share.argsort(descending=True, stable=True)[:keep].sort().values


def _positions(out: torch.Tensor, shaper: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """``K x n``: where each channel of the ``B x C x ...`` view lies in one sample's flattened output; the view's
    reshape (tokens, channels last) run on the positions themselves, so any reshape= is inverted."""
    idx = torch.arange(out[0].numel(), device=out.device).view(1, *out.shape[1:])
    shaped = idx if shaper is None else shaper(idx)
    return shaped[0].flatten(1)


def ablation_weights(score_of: Scorer, module: nn.Module, out: torch.Tensor,
                     shaper: Callable[[torch.Tensor], torch.Tensor] | None, A: torch.Tensor, inputs: torch.Tensor,
                     base: torch.Tensor, *, batch_size: int, ratio: float) -> tuple[torch.Tensor, int, int]:
    """Ablation-CAM's weights ``B x K``: ``(y - y_k) / y`` with ``y`` a sample's score and ``y_k`` its score with
    channel ``k`` of the layer's output ``out`` (as the model handed it on) set to zero; 0 for channels not
    ablated (all zero already, or left out by ``ratio``) and where ``y = 0``. Also the ablated inputs scored and
    the model calls."""
    B, K = A.shape[:2]
    pos = _positions(out, shaper)
    drop = torch.zeros(B, K, dtype=torch.float32 if A.dtype != torch.float64 else A.dtype, device=A.device)
    runs = calls = 0
    with torch.no_grad():
        for b in range(B):
            ks = chosen_channels(A[b], ratio).tolist()
            for i in range(0, len(ks), batch_size):
                chunk = ks[i:i + batch_size]
                n = len(chunk)
                ablated = out[b:b + 1].expand(n, *out.shape[1:]).clone(memory_format=torch.contiguous_format).view(n, -1)
                for j, k in enumerate(chunk):
                    ablated[j, pos[k]] = 0
                got = _scores(score_of, module, ablated.view(n, *out.shape[1:]), inputs[b:b + 1], b)
                drop[b, chunk] = (base[b] - got).to(drop.dtype)
                runs, calls = runs + n, calls + 1
    return safe_div(drop, base.to(drop.dtype).unsqueeze(1).expand_as(drop)), runs, calls


def _scores(score_of: Scorer, module: nn.Module, ablated: torch.Tensor, image: torch.Tensor, b: int) -> torch.Tensor:
    n = ablated.shape[0]

    def hook(m: nn.Module, args: Any, output: Any) -> Any:
        t = first_tensor(output)
        return tree_map(lambda u: ablated if u is t else u, output)

    group = HookGroup()
    try:
        # own hook: hands the rest of the model the ablated copies of this layer's output, for this batch only
        group.add(module.register_forward_hook(hook))
        rows = torch.full((n,), b, dtype=torch.long, device=image.device)
        return score_of(image.expand(n, *image.shape[1:]).contiguous(), rows)
    finally:
        group.remove()
