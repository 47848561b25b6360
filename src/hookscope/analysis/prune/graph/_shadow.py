"""Shadow tensors of the channel tracer: same shape as the traced tensor, float64, each value a channel
id (0: carries no channel; negative: the channel is NOT zero when masked, e.g. after ``sigmoid``).

Pure tensor helpers, no state: which dims carry ids, collapsing dims into one id per position, how a
reshape groups dims, which dims an index touches. Must not import: the tracer, any analysis module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["carrying_dims", "collapse", "coupled_pairs", "reshape_blocks", "indexed_dims", "row_ids"]


def carrying_dims(shadow: torch.Tensor) -> set[int]:
    """Dims along which the SETS of ids differ between slices (empty slices ignored): channel dims.

    Spatial dims of a conv output carry the same set in every slice, so they do not count.

    Example:
        >>> s = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1).expand(1, 3, 2, 2)
        >>> carrying_dims(s)
        {1}
    """
    a = shadow.abs()
    out: set[int] = set()
    for d in range(a.dim()):
        if a.shape[d] < 2:
            continue
        rows = a.movedim(d, 0).reshape(a.shape[d], -1)
        cnt = (rows > 0).sum(1)
        keep = cnt > 0
        if int(keep.sum()) < 2:
            continue
        lo = torch.where(rows > 0, rows, math.inf).amin(1)[keep]
        sig = torch.stack([lo, rows.amax(1)[keep], cnt[keep].double(), rows.sum(1)[keep]], 1)
        if bool((sig != sig[:1]).any()):
            out.add(d)
    return out


def coupled_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distinct (id, id) pairs that meet at the same position of two same-shape shadows (both nonzero).

    Example:
        >>> coupled_pairs(torch.tensor([1.0, 2.0, 0.0, 1.0]), torch.tensor([5.0, -6.0, 7.0, 5.0])).tolist()
        [[1.0, 5.0], [2.0, 6.0]]
    """
    a, b = a.abs().reshape(-1), b.abs().reshape(-1)
    m = (a > 0) & (b > 0) & (a != b)
    if not bool(m.any()):
        return torch.zeros(0, 2, dtype=torch.float64)
    pairs: torch.Tensor = torch.unique(torch.stack([a[m], b[m]], 1), dim=0)
    return pairs


def collapse(shadow: torch.Tensor, dims: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce ``dims`` (removed from the shape) to one id per remaining position.

    Returns the collapsed shadow (negative where any collapsed value was) and the (id, id) pairs
    that met inside one collapsed slice (to be coupled by the caller).

    Example:
        >>> s, pairs = collapse(torch.tensor([[1.0, 1.0], [2.0, -3.0]]), [1])
        >>> s.tolist(), pairs.tolist()
        ([1.0, -3.0], [[3.0, 2.0]])
    """
    dims = sorted(d % shadow.dim() for d in dims)
    rest = [d for d in range(shadow.dim()) if d not in dims]
    moved = shadow.permute(*rest, *dims)
    rows = moved.reshape(-1, max(1, math.prod(shadow.shape[d] for d in dims)))
    a = rows.abs()
    top = a.amax(1) if rows.shape[1] else torch.zeros(rows.shape[0], dtype=rows.dtype)
    other = (a > 0) & (a != top[:, None])
    pairs = torch.zeros(0, 2, dtype=torch.float64)
    if bool(other.any()):
        pairs = torch.unique(torch.stack([top[:, None].expand_as(a)[other], a[other]], 1), dim=0)
    neg = (rows < 0).any(1) if rows.shape[1] else torch.zeros_like(top, dtype=torch.bool)
    out = torch.where(neg, -top, top)
    return out.reshape([shadow.shape[d] for d in rest]), pairs


def row_ids(shadow: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One id per index of ``dim`` (absolute values), and the pairs met inside a slice.

    Example:
        >>> ids, pairs = row_ids(torch.tensor([[1.0, 2.0], [1.0, 2.0]]), 1)
        >>> ids.tolist(), pairs.tolist()
        ([1.0, 2.0], [])
    """
    rest = [d for d in range(shadow.dim()) if d != dim % shadow.dim()]
    ids, pairs = collapse(shadow, rest)
    return ids.abs(), pairs


def reshape_blocks(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Group the dims of a reshape: each block of old dims maps onto a block of new dims of the same
    product (size-1 dims attached to a neighbour). A block with one old dim and several new dims of
    size > 1 is a split.

    Example:
        >>> reshape_blocks([1, 6, 4], [1, 2, 3, 4])
        [([0], [0]), ([1], [1, 2]), ([2], [3])]
    """
    blocks: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        bo: list[int] = []
        bn: list[int] = []
        po = pn = 1
        while True:
            if po <= pn and i < len(old) and (not bo or po < pn or old[i] == 1):
                po *= old[i]
                bo.append(i)
                i += 1
            elif j < len(new) and (not bn or pn < po or new[j] == 1):
                pn *= new[j]
                bn.append(j)
                j += 1
            else:
                break
        if not bo and not bn:
            break
        blocks.append((bo, bn))
    return blocks


def indexed_dims(shape: Sequence[int], index: Any) -> list[int]:
    """Dims of a tensor of ``shape`` that ``tensor[index]`` does not keep whole.

    Example:
        >>> indexed_dims([2, 5, 3], (slice(None), 0))
        [1]
        >>> indexed_dims([2, 5, 3], (..., slice(0, 2)))
        [2]
    """
    items = list(index) if isinstance(index, tuple) else [index]
    used = sum(_width(it) for it in items if it is not Ellipsis and it is not None)
    out: list[int] = []
    d = 0
    for it in items:
        if it is None:
            continue
        if it is Ellipsis:
            d += len(shape) - used
            continue
        w = _width(it)
        if not (isinstance(it, slice) and _whole(it, shape[d] if d < len(shape) else 0)):
            out.extend(range(d, d + w))
        d += w
    return out


def _width(item: Any) -> int:
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return max(1, item.dim())
    return 1


def _whole(s: slice, size: int) -> bool:
    return s.start in (None, 0) and (s.stop is None or s.stop >= size) and s.step in (None, 1)
