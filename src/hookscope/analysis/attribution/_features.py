"""What the perturbation methods perturb: feature masks (labels ``0..K-1`` over one sample's values, given
or made: each value, each position, each channel, a grid of cells, superpixels), occlusion's windows,
and the baseline a perturbed value takes.

Must not import the methods or the engine: it only shapes tensors.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from ...core.text import shape_text
from ...errors import HookscopeError, checked

__all__ = ["Labels", "baseline_like", "feature_grid", "feature_labels", "superpixels", "windows"]


def baseline_like(baseline: torch.Tensor | float | None, x: torch.Tensor, what: str = "inputs") -> torch.Tensor:
    """The baseline as a tensor of ``x``'s shape, dtype and device (``what``: what ``x`` is, for messages)."""
    if not x.is_floating_point() and _fractional(baseline):  # the cast to ids would round it silently
        shown = f"{baseline!r}" if not isinstance(baseline, torch.Tensor) else "(a tensor with fractions)"
        raise HookscopeError(f"baseline={shown} holds values that are not token ids: inputs of dtype {x.dtype} "
                             "start the path at whole ids; pass an int, e.g. the pad token's id")
    if baseline is None or isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        b = torch.full_like(x, 0 if baseline is None else baseline)
    elif isinstance(baseline, torch.Tensor):
        b = baseline.detach().to(device=x.device, dtype=x.dtype)
        b = b.unsqueeze(0) if tuple(b.shape) == tuple(x.shape[1:]) else b
        if b.ndim != x.ndim or b.shape[0] not in (1, x.shape[0]) or tuple(b.shape[1:]) != tuple(x.shape[1:]):
            raise HookscopeError(f"baseline of shape {shape_text(tuple(baseline.shape))} does not fit {what} of "
                                 f"{shape_text(tuple(x.shape))}; pass one of {shape_text(tuple(x.shape))} or "
                                 f"{shape_text(tuple(x.shape[1:]))} (the same for every sample), or a number")
        b = b.expand_as(x).clone()
    else:
        raise HookscopeError(f"baseline= is a {type(baseline).__name__}; pass None (zeros), a number or a tensor")
    if b.is_floating_point() and not bool(b.isfinite().all()):
        raise HookscopeError("the baseline is not finite (nan or inf), so every map would be nan; pass finite "
                             "values, e.g. baseline=0.0")
    return b


def _fractional(baseline: Any) -> bool:
    if isinstance(baseline, torch.Tensor):
        return baseline.is_floating_point() and not bool((baseline == baseline.round()).all())
    return isinstance(baseline, float) and not baseline.is_integer()


Labels = tuple[torch.Tensor, list[int]]  # (B x sample labels, the number of features of each sample)


def feature_labels(spec: Any, x: torch.Tensor, what: str = "inputs") -> Labels:
    """``features=`` as labels of every value of ``x`` (``B x ...``, long) and each sample's feature count.

    Labels must run ``0..K-1`` without a gap in each sample: a label left out would be a feature that
    never moves, scored 0 whatever the model does, so a mask with a gap is refused rather than
    renumbered behind the caller's back.
    """
    B, S = x.shape[0], tuple(x.shape[1:])
    if spec is None or isinstance(spec, str):
        made = _made(spec, x)
    else:
        made = _broadcast(spec.to(x.device), x, what)
        _check_labels(made, spec)
    counts = [int(made[b].max()) + 1 if made[b].numel() else 0 for b in range(B)] if made.shape[0] > 1 else \
        [int(made.max()) + 1 if made.numel() else 0] * B
    return made.expand(B, *S), counts


def _made(spec: str | None, x: torch.Tensor) -> torch.Tensor:
    """The masks ``features=`` names: ``1 x ...`` (one for every sample) or ``B x ...``."""
    S = tuple(x.shape[1:])
    word, _, count = (spec or "values").partition(":")
    if word == "values" or len(S) < 2 and word != "superpixels":
        return torch.arange(math.prod(S), device=x.device).view(1, *S)
    if word == "pixels":
        return torch.arange(math.prod(S[1:]), device=x.device).view(1, 1, *S[1:]).expand(1, *S)
    if word == "channels":
        return torch.arange(S[0], device=x.device).view(1, S[0], *[1] * (len(S) - 1)).expand(1, *S)
    if word == "grid":
        return feature_grid(x, int(count)).unsqueeze(1).expand(-1, *S)
    if len(S) != 3 or not x.is_floating_point():
        raise HookscopeError(f"features='{spec}' makes superpixels of images (C x H x W samples), not of samples "
                             f"of {shape_text(S)}; pass features='grid:8' or a tensor of labels")
    return superpixels(x, segments=int(count)).unsqueeze(1).expand(-1, *S)


def _broadcast(mask: torch.Tensor, x: torch.Tensor, what: str) -> torch.Tensor:
    B, S = x.shape[0], tuple(x.shape[1:])
    per_sample = mask.ndim == x.ndim
    inner = tuple(mask.shape[1:]) if per_sample else tuple(mask.shape)
    fits = (not per_sample or mask.shape[0] in (1, B)) and len(inner) <= len(S) and all(
        m in (1, s) for m, s in zip(inner[::-1], S[::-1]))
    if not fits:
        raise HookscopeError(f"features of shape {shape_text(tuple(mask.shape))} do not fit {what} of "
                             f"{shape_text(tuple(x.shape))}; pass labels of one sample's shape {shape_text(S)}, a "
                             f"shape that broadcasts to it (such as {shape_text(S[-2:] if len(S) > 1 else S)}), or "
                             f"one row per sample ({shape_text(tuple(x.shape))})")
    m = mask if per_sample else mask.view(1, *mask.shape)
    m = m.view(m.shape[0], *[1] * (len(S) - len(inner)), *inner)
    return m.long().expand(m.shape[0], *S)


def _check_labels(made: torch.Tensor, given: torch.Tensor) -> None:
    if made.numel() and int(made.min()) < 0:
        raise HookscopeError(f"features= holds the label {int(made.min())}; labels run 0..K-1, one per feature")
    for b in range(made.shape[0]):
        found = torch.unique(made[b])
        if found.numel() and int(found[-1]) != found.numel() - 1:
            have = set(found.tolist())
            gap = next(k for k in range(int(found[-1]) + 1) if k not in have)
            where = f" of sample {b}" if made.shape[0] > 1 else ""
            raise HookscopeError(f"features={shape_text(tuple(given.shape))} labels{where} skip {gap} (they run to "
                                 f"{int(found[-1])}); labels must be 0..K-1 with none missing: renumber them, e.g. "
                                 "torch.unique(mask, return_inverse=True)[1]")


@checked
def feature_grid(inputs: torch.Tensor, cell: int) -> torch.Tensor:
    """Labels of square cells of ``cell`` values over each sample's dims after the first (the channels),
    numbered row by row: ``B x H x W`` for ``B x C x H x W`` images; the last cells are cut at the edge.

    Args:
        inputs: the batch (``B x C x ...``).
        cell: the side of a cell, in values.

    Returns:
        A long tensor of the batch's shape without its channel dim.

    Example:
        >>> feature_grid(torch.zeros(1, 3, 4, 6), 2)[0]
        tensor([[0, 0, 1, 1, 2, 2],
                [0, 0, 1, 1, 2, 2],
                [3, 3, 4, 4, 5, 5],
                [3, 3, 4, 4, 5, 5]])
    """
    if isinstance(cell, bool) or not isinstance(cell, int) or cell < 1:
        raise HookscopeError(f"cell={cell!r} must be a positive int (the side of a cell)")
    space = tuple(inputs.shape[2:]) or tuple(inputs.shape[1:])
    per_dim = [torch.arange(n, device=inputs.device) // cell for n in space]
    counts = [math.ceil(n / cell) for n in space]
    label = torch.zeros(space, dtype=torch.long, device=inputs.device)
    for d, (idx, n) in enumerate(zip(per_dim, counts)):
        stride = math.prod(counts[d + 1:])
        label = label + (idx * stride).view(*[1] * d, -1, *[1] * (len(space) - d - 1))
    return label.unsqueeze(0).expand(inputs.shape[0], *space).clone()


@checked
def superpixels(inputs: torch.Tensor, *, segments: int = 50, compactness: float = 10.0,
                iterations: int = 10) -> torch.Tensor:
    """SLIC-like superpixels (Achanta et al. 2012) of each image, in torch: ``segments`` centres on a grid,
    each pixel given to the centre nearest in colour and place, the centres moved to their pixels' mean,
    ``iterations`` times; labels renumbered ``0..K-1``. Segments are not forced to be connected.

    Args:
        inputs: images, ``B x C x H x W``.
        segments: about how many segments (the centres' grid is the closest to it).
        compactness: how much place weighs against colour (colour in the images' own units, over
            their range; place in units of the grid's step); larger makes squarer segments.
        iterations: the assign-and-move rounds.

    Returns:
        ``B x H x W`` long labels.

    Example:
        >>> img = torch.zeros(1, 3, 8, 8); img[..., 4:] = 1.0     # two halves
        >>> lab = superpixels(img, segments=4)
        >>> lab.shape, set(lab[0, :, :4].unique().tolist()).isdisjoint(lab[0, :, 4:].unique().tolist())
        (torch.Size([1, 8, 8]), True)
    """
    if inputs.ndim != 4 or not inputs.is_floating_point():
        raise HookscopeError(f"superpixels takes float images B x C x H x W, not {shape_text(tuple(inputs.shape))}")
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise HookscopeError(f"segments={segments!r} must be a positive int")
    return torch.stack([_slic(img, segments, float(compactness), iterations) for img in inputs])


def _slic(img: torch.Tensor, segments: int, compactness: float, iterations: int) -> torch.Tensor:
    C, H, W = img.shape
    step = math.sqrt(H * W / segments)
    rows, cols = max(1, round(H / step)), max(1, round(W / step))
    cy = (torch.arange(rows, device=img.device, dtype=torch.float32) + 0.5) * H / rows
    cx = (torch.arange(cols, device=img.device, dtype=torch.float32) + 0.5) * W / cols
    yy, xx = torch.meshgrid(torch.arange(H, device=img.device, dtype=torch.float32),
                            torch.arange(W, device=img.device, dtype=torch.float32), indexing="ij")
    colour = img.float().flatten(1).T  # HW x C
    span = float(colour.max() - colour.min()) or 1.0
    colour = colour / span
    place = torch.stack([yy.flatten(), xx.flatten()], 1) / step  # HW x 2, in steps
    centres_p = torch.stack(torch.meshgrid(cy, cx, indexing="ij"), -1).view(-1, 2) / step
    centres_c = colour[(centres_p[:, 0] * step).long().clamp(max=H - 1) * W
                       + (centres_p[:, 1] * step).long().clamp(max=W - 1)]
    weight = compactness / 10.0  # 10, SLIC's usual compactness, weighs a step like a full colour range
    label = torch.zeros(H * W, dtype=torch.long, device=img.device)
    for _ in range(max(1, iterations)):
        d = torch.cdist(colour, centres_c) ** 2 + (weight ** 2) * torch.cdist(place, centres_p) ** 2
        label = d.argmin(1)
        count = torch.bincount(label, minlength=len(centres_p)).clamp(min=1).unsqueeze(1).float()
        moved_c = torch.zeros_like(centres_c).index_add_(0, label, colour) / count
        moved_p = torch.zeros_like(centres_p).index_add_(0, label, place) / count
        used = torch.bincount(label, minlength=len(centres_p)) > 0
        centres_c = torch.where(used.unsqueeze(1), moved_c, centres_c)
        centres_p = torch.where(used.unsqueeze(1), moved_p, centres_p)
    inverse: torch.Tensor = torch.unique(label, return_inverse=True)[1]
    return inverse.view(H, W)


def windows(shape: tuple[int, ...], window: int | tuple[int, ...] | None,
            stride: int | tuple[int, ...] | None) -> list[tuple[slice, ...]]:
    """Occlusion's windows over one sample of ``shape``: the slices of each, in captum's order (the first
    dim fastest); ``window`` names the last dims (the leading ones whole), an int every dim but the first.
    ``None``: every channel, and an eighth of each later dim (rounded up); a stride of ``None`` is half the
    window (rounded up)."""
    if window is None:
        w = (shape[0], *[math.ceil(n / 8) for n in shape[1:]]) if len(shape) > 1 else (math.ceil(shape[0] / 8),)
    else:
        w = (window,) * max(1, len(shape) - 1) if isinstance(window, int) else tuple(window)
    if len(w) > len(shape):
        raise HookscopeError(f"window={window!r} has {len(w)} dims, one sample of the inputs {len(shape)} "
                             f"({shape_text(shape)}); pass at most {len(shape)}")
    w = tuple(shape[:len(shape) - len(w)]) + w
    if isinstance(stride, tuple) and len(stride) > len(shape):
        raise HookscopeError(f"stride={stride!r} has more dims than one sample ({shape_text(shape)})")
    s = (tuple(math.ceil(wd / 2) for wd in w) if stride is None else (stride,) * len(shape)
         if isinstance(stride, int) else tuple(w[:len(shape) - len(stride)]) + tuple(stride))
    for d, (n, wd, sd) in enumerate(zip(shape, w, s)):
        if wd > n:
            raise HookscopeError(f"window {shape_text(w)} is larger than one sample ({shape_text(shape)}) in dim "
                                 f"{d + 1} ({wd} > {n}); pass a window of at most {shape_text(shape)}")
        if sd > wd and n > wd:
            raise HookscopeError(f"stride {sd} is larger than the window ({wd}) in dim {d + 1}, so values between "
                                 f"windows would never be covered; pass stride <= {wd}")
    counts = [math.ceil((n - wd) / sd) + 1 if n > wd else 1 for n, wd, sd in zip(shape, w, s)]
    starts = [[k * sd for k in range(c)] for c, sd in zip(counts, s)]
    # the first dim fastest, as captum numbers its windows
    return [tuple(slice(a, min(a + wd, n)) for a, wd, n in zip(reversed(combo), w, shape))
            for combo in itertools.product(*reversed(starts))]
