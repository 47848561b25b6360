"""Saliency maps checked against the images they explain: one map per image, no NaN, the images' size.

Must not import any analysis: the maps come from whatever explanation the user ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import HookscopeError, did_you_mean

__all__ = ["REDUCTIONS", "check_images", "image_maps", "no_nan"]

REDUCTIONS = ("abs_sum", "sum", "abs_max", "l2")  # how B x C x H x W maps become B x H x W

_REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "abs_sum": lambda m: m.abs().sum(1), "sum": lambda m: m.sum(1), "abs_max": lambda m: m.abs().amax(1),
    "l2": lambda m: torch.linalg.vector_norm(m, dim=1),
}


def check_images(inputs: Any, what: str) -> torch.Tensor:
    """``inputs`` as ``B x C x H x W`` images with pixels, or one line saying what is wrong."""
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4:
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"{what} needs images of shape B x C x H x W, got {shape}; add the missing dimensions")
    if inputs.shape[2] * inputs.shape[3] == 0:
        raise HookscopeError(f"{what} needs images with pixels, got H x W = {inputs.shape[2]} x {inputs.shape[3]}")
    if not inputs.is_floating_point():
        raise HookscopeError(f"{what} needs floating-point images, got {inputs.dtype}; pass inputs.float()")
    return inputs


def no_nan(t: torch.Tensor, what: str) -> None:
    """One line naming the first sample whose values hold NaN."""
    if t.is_floating_point() and bool(t.isnan().any()):
        i = int(t.isnan().flatten(1).any(1).nonzero()[0, 0]) if t.dim() > 1 else 0
        raise HookscopeError(f"{what} hold NaN (image {i}), which has no rank; fix or drop that image's map")


def image_maps(maps: Any, inputs: torch.Tensor, reduce: str, what: str) -> torch.Tensor:
    """``B x H x W`` float32 maps at the images' size: ``B x C x H x W`` maps reduced over ``C`` by
    ``reduce``, maps of another size upsampled bilinearly."""
    if reduce not in _REDUCE:
        hint = did_you_mean(reduce, REDUCTIONS) if isinstance(reduce, str) else ""
        raise HookscopeError(f"reduce={reduce!r} is not a reduction over channels.{hint} Use one of "
                             f"{', '.join(REDUCTIONS)}")
    b, _, h, w = inputs.shape
    if not isinstance(maps, torch.Tensor):
        raise HookscopeError(f"{what}: maps must be a B x H x W tensor, got {type(maps).__name__}")
    if maps.dim() not in (3, 4) or maps.shape[0] != b:
        raise HookscopeError(f"{what}: maps of shape {tuple(maps.shape)} do not fit {b} images; pass one map per "
                             f"image, B x H x W = {b} x {h} x {w} (or B x C x H x W)")
    maps = maps.detach().to(device=inputs.device, dtype=torch.float32)
    no_nan(maps, f"{what}: maps")
    if maps.dim() == 4:
        maps = _REDUCE[reduce](maps)
    if maps.shape[1:] != (h, w):
        maps = F.interpolate(maps[:, None], size=(h, w), mode="bilinear", align_corners=False)[:, 0]
    if bool(maps.isnan().any()):  # an infinite value summed with its opposite, or weighted by 0 when upsampled
        i = int(maps.isnan().flatten(1).any(1).nonzero()[0, 0])
        raise HookscopeError(f"{what}: maps hold infinite values (image {i}), which reducing over channels or "
                             "upsampling turns into NaN; clip them first, e.g. maps.clamp(-1e30, 1e30)")
    fitted: torch.Tensor = maps
    return fitted
