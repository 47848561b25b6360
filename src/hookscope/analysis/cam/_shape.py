"""Turning a layer's activation into ``B x C x h x w``: the public ``reshape=`` helpers and the layouts cam reads."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...core.text import first_line
from ...errors import HookscopeError, checked
from .._layout import LayoutProbe, grid_of_tokens

__all__ = ["GRIDS", "MODES", "as_4d", "channels_first", "channels_last", "close", "normalise", "shapers", "tokens_to_grid",
           "upsample", "work"]


@checked
def tokens_to_grid(skip: int = 1, grid: tuple[int, int] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``reshape=`` for transformer layers: ``B x (skip + h*w) x C`` tokens -> ``B x C x h x w``.

    The first ``skip`` tokens (a ViT's class token: 1; DeiT's class and distillation tokens: 2) are
    dropped and the rest laid out row by row on an ``h x w`` grid (square unless ``grid`` says).
    For a ``B x h x w x C`` activation (Swin) see :func:`channels_last`.

    Example:
        >>> tokens_to_grid(skip=1)(torch.zeros(2, 1 + 14 * 14, 768)).shape
        torch.Size([2, 768, 14, 14])
    """
    def reshape(t: torch.Tensor) -> torch.Tensor:
        if t.ndim != 3:
            raise ValueError(f"expected B x tokens x C, got {t.ndim} dimensions; a layer of tokens needs it")
        n = t.shape[1] - skip
        h, w = grid if grid is not None else (math.isqrt(max(n, 0)), math.isqrt(max(n, 0)))
        if h * w != n:
            raise ValueError(f"{n} tokens after skipping {skip} do not fill a {h} x {w} grid; pass grid=(h, w) or skip=")
        return grid_of_tokens(t, skip, h, w)

    return reshape


@checked
def channels_last(t: torch.Tensor) -> torch.Tensor:
    """A ``reshape=`` for a ``B x h x w x C`` activation (Swin stages, ConvNeXt blocks inside): ``B x C x h x w``.

    :func:`cam` does this by itself when the modules around the layer say the channels are last.

    Example:
        >>> channels_last(torch.zeros(2, 7, 7, 768)).shape
        torch.Size([2, 768, 7, 7])
    """
    if t.ndim != 4:
        raise ValueError(f"expected B x h x w x C, got {t.ndim} dimensions")
    return t.permute(0, 3, 1, 2)


@checked
def channels_first(t: torch.Tensor) -> torch.Tensor:
    """A ``reshape=`` that says a 4-D activation is ``B x C x h x w`` already (it is returned as it is).

    Example:
        >>> channels_first(torch.zeros(2, 8, 8, 8)).shape
        torch.Size([2, 8, 8, 8])
    """
    if t.ndim != 4:
        raise ValueError(f"expected B x C x h x w, got {t.ndim} dimensions")
    return t


def shapers(acts: dict[str, torch.Tensor], probe: LayoutProbe | None,
            reshape: Callable[[torch.Tensor], torch.Tensor] | None, prefix: int | None, size: tuple[int, ...]
            ) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor] | None], dict[str, str]]:
    """Per layer, what turns its activation (and gradient) into ``B x C x h x w``, and its layout's name.

    ``probe``: what the pass saw around the layers (``None``: not probed, the layer was found by cam);
    ``prefix``: the model's own count of tokens before the patches (``None``: it does not say).
    """
    shaped: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {}
    layouts: dict[str, str] = {}
    grid = (size[0], size[1]) if len(size) == 2 else None  # tokens and channels last: layouts of images only
    for n, a in acts.items():
        if reshape is not None:
            shaped[n], layouts[n] = reshape, "reshape="
        elif probe is not None and grid is not None and a.ndim == 3:
            k, h, w = probe.tokens(n, a, grid, prefix)
            shaped[n], layouts[n] = tokens_to_grid(k, (h, w)), f"tokens(k={k}, {h}x{w})"
        elif probe is not None and grid is not None and a.ndim == 4 and probe.layout(n, a, grid) == "last":
            shaped[n], layouts[n] = channels_last, "BHWC"
        else:  # a layer found by cam() itself is a convolution's output or the map the head pools
            shaped[n], layouts[n] = None, LAYOUTS.get(len(size), "BCHW")
    return shaped, layouts


LAYOUTS = {1: "BCL", 2: "BCHW", 3: "BCDHW"}  # channels first, by the input's spatial rank


def work(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 (float64 kept): half-precision models get their formulas in full precision."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``allclose`` within the rounding of the less precise of the two dtypes."""
    eps = max(torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0 for t in (a, b))
    tol = max(1e-4, 8 * eps)
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol if eps > 1e-6 else 1e-5)


GRIDS = {1: "B x C x l", 2: "B x C x h x w", 3: "B x C x d x h x w"}  # an activation of each spatial rank
MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}  # how maps of each rank are upsampled


def upsample(t: torch.Tensor, size: tuple[int, ...], *, align_corners: bool = False) -> torch.Tensor:
    """``B x C x ...`` (one, two or three spatial dimensions) resized to ``size`` (bi/tri)linearly."""
    return F.interpolate(t, size=size, mode=MODES[len(size)], align_corners=align_corners)


def as_4d(name: str, t: torch.Tensor, reshape: Callable[[torch.Tensor], torch.Tensor] | None, B: int,
          rank: int = 2) -> torch.Tensor:
    """``t`` as ``B x C x ...`` with ``rank`` spatial dimensions (the input's), through ``reshape`` if given."""
    if reshape is not None:
        try:
            t = reshape(t)
        except Exception as e:
            raise HookscopeError(f"reshape= failed on layer {name!r}'s output of shape {tuple(t.shape)}: "
                                 f"{type(e).__name__}: {first_line(e)}") from None
    if not isinstance(t, torch.Tensor) or t.ndim != rank + 2 or t.shape[0] != B:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        fix = "make reshape= return" if reshape is not None else "pass reshape= a function to"
        grid = GRIDS[rank]
        example = (", e.g. reshape=hookscope.tokens_to_grid(skip=1) for ViT tokens (CLI: --tokens 1)" if rank == 2
                   else f" (a {rank}-D input of {B} samples)")
        raise HookscopeError(f"layer {name!r} gives an activation of shape {shape}, not {grid} (B={B}); "
                             f"{fix} {grid}{example}")
    return t


def normalise(m: torch.Tensor) -> torch.Tensor:
    """Min-max per sample (``B x ...``); a constant map becomes all zeros."""
    flat = m.flatten(1)
    lo = flat.amin(1).view(-1, *([1] * (m.ndim - 1)))
    span = flat.amax(1).view_as(lo) - lo
    return (m - lo) / torch.where(span > 0, span, torch.ones_like(span))
