"""Histograms that count every value: the finite ones in bins, NaN, +Inf and -Inf apart, and (with
fixed edges) those below and above the edges."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch

from ...core.guard import plain
from ...errors import HookscopeError

__all__ = ["Bins", "Counted", "check_bins", "histogram"]

Bins = Union[int, Sequence[float], torch.Tensor]
"""``histograms=``: a number of bins spread over each tensor's finite range, or fixed edges."""

Counted = tuple[list[float], list[int], int, int, int, int, int]
"""``(edges, counts, nan, posinf, neginf, below, above)``."""


def check_bins(bins: Bins | None) -> int | torch.Tensor | None:
    """``histograms=`` checked: ``None``, a number of bins (1 or more), or increasing edges (float64).

    Example:
        >>> check_bins(8), check_bins([0, 1, 2]).tolist()
        (8, [0.0, 1.0, 2.0])
    """
    if bins is None:
        return None
    if isinstance(bins, int) and not isinstance(bins, bool):
        if bins < 1:
            raise HookscopeError(f"histograms={bins} must be 1 or more bins per tensor (or a list of edges)")
        return bins
    try:
        edges = torch.as_tensor(bins, dtype=torch.float64).reshape(-1).clone()
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"histograms={bins!r} must be a number of bins or a list of edges") from None
    if edges.numel() < 2 or not bool(torch.isfinite(edges).all()) or not bool((edges[1:] > edges[:-1]).all()):
        raise HookscopeError(f"histograms= edges must be 2 or more finite, increasing numbers; got {edges.tolist()}")
    return edges


def histogram(t: torch.Tensor, bins: int | torch.Tensor) -> Counted:
    """Count ``t``'s values. With a number of bins they span the finite values' range (as
    ``torch.histc`` over them; a constant tensor gets the range ``v - 0.5 .. v + 0.5``); with edges,
    values in ``[edges[i], edges[i + 1])`` go to bin ``i``, the last bin closed.

    Example:
        >>> x = torch.tensor([0.0, 0.5, 1.0, float("nan"), float("inf"), float("-inf"), 7.0])
        >>> histogram(x, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
        ([0.0, 0.5, 1.0], [1, 2], 1, 1, 1, 0, 1)
        >>> histogram(x, 2)[:2]
        ([0.0, 3.5, 7.0], [3, 1])
    """
    x = plain(t).detach()
    x = x.abs() if x.is_complex() else x
    x = x.float() if not x.is_floating_point() or x.element_size() < 4 else x
    counts = torch.stack([torch.isnan(x).sum(), torch.isposinf(x).sum(), torch.isneginf(x).sum()]).tolist()
    nan, posinf, neginf = (int(c) for c in counts)
    finite = x[torch.isfinite(x)].reshape(-1)
    if isinstance(bins, int):
        return (*_spread(finite, bins), nan, posinf, neginf, 0, 0)
    edges = bins.to(finite.device)
    v = finite.to(torch.float64)
    full = torch.bincount(torch.bucketize(v, edges, right=True), minlength=edges.numel() + 1)
    on_last = (v == edges[-1]).sum()
    inside = full[1:-1].clone()
    inside[-1] += on_last
    found = torch.cat([full[:1], inside, (full[-1] - on_last).reshape(1)]).tolist()
    return edges.tolist(), [int(c) for c in found[1:-1]], nan, posinf, neginf, int(found[0]), int(found[-1])


def _spread(finite: torch.Tensor, bins: int) -> tuple[list[float], list[int]]:
    if finite.numel() == 0:
        return [], []
    lo, hi = (float(v) for v in torch.stack(list(torch.aminmax(finite))).tolist())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(finite, bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64).tolist()
    return edges, [int(c) for c in counts.tolist()]
