"""Mask criteria, one table: each computes a new mask from a tensor, an amount and the current mask,
element by element as ``torch.nn.utils.prune`` computes it (same calls, so the same tie-breaking).

Iterative pruning composes as torch's ``PruningContainer`` does: an unstructured criterion ranks only
the entries still unmasked (the amount is a fraction or count of those); a structured one ranks only
the channels along ``dim`` not yet entirely masked. The tensor ranked is the weight the layer computes
with (``orig * mask``). Entries are ranked in the tensor's logical (row-major) order whatever its memory
layout (``channels_last``, transposed, expanded), so every layout gets the mask torch computes on the
same weight made contiguous. Must not import: ``torch.nn.utils.prune`` (the tests compare against it), any
analysis module.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ....errors import HookscopeError, did_you_mean

__all__ = ["Spec", "Criterion", "METHODS", "criterion", "validate_amount", "to_prune", "units_left",
           "new_mask", "global_masks"]


@dataclass(frozen=True)
class Spec:
    """The settings of one pruning call: ``amount`` (a fraction in [0, 1] or a count of units), the
    norm ``n`` and the ``dim`` of structured methods, and the ``generator`` of random ones (``None``:
    the global RNG, drawn from exactly as torch does).

    Example:
        >>> Spec(0.5).dim, Spec(3, n=2, dim=1).n
        (0, 2)
    """

    amount: int | float
    n: int | float | str = 1
    dim: int = 0
    generator: torch.Generator | None = None


MaskFn = Callable[[torch.Tensor, torch.Tensor, Spec], torch.Tensor]


@dataclass(frozen=True)
class Criterion:
    """One entry of :data:`METHODS`: ``kind`` (``"unstructured"`` or ``"structured"``) and ``compute``,
    torch's ``compute_mask(t, default_mask)`` for that method.

    Example:
        >>> METHODS["ln_structured"].kind
        'structured'
    """

    kind: str
    compute: MaskFn


def validate_amount(amount: object) -> int | float:
    """``amount`` as an ``int`` count (>= 0) or a ``float`` fraction in [0, 1], else a one-line error.

    Example:
        >>> validate_amount(0.3), validate_amount(4)
        (0.3, 4)
        >>> validate_amount(1.5)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: amount=1.5 is outside [0, 1]; pass a fraction in [0, 1] or a whole count of units such as 10
    """
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise HookscopeError(f"amount={amount!r} ({type(amount).__name__}) is not a number; pass a fraction "
                             "in [0, 1] or a whole count of units such as 10")
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise HookscopeError(f"amount={amount} is a negative count; pass a count >= 0 or a fraction in [0, 1]")
        return int(amount)
    value = float(amount)
    if not (0.0 <= value <= 1.0):  # NaN fails too
        raise HookscopeError(f"amount={amount!r} is outside [0, 1]; pass a fraction in [0, 1] or a whole "
                             "count of units such as 10")
    return value


def to_prune(amount: int | float, size: int) -> int:
    """Units to prune among ``size``: the count itself, or ``round(amount * size)`` for a fraction
    (Python's round, half to even, as torch's ``_compute_nparams_toprune``).

    Example:
        >>> to_prune(0.5, 5), to_prune(0.5, 7), to_prune(3, 7)
        (2, 4, 3)
    """
    if isinstance(amount, int):
        if amount > size:
            raise HookscopeError(f"amount={amount} is more than the {size} units left to prune; pass at most {size}")
        return amount
    return round(amount * size)


def _dim(t: torch.Tensor, dim: int) -> int:
    if t.dim() <= 1:
        raise HookscopeError(f"structured pruning needs a tensor of 2 or more dims, this one has shape "
                             f"{tuple(t.shape)}; prune it with an unstructured method")
    if not -t.dim() <= dim < t.dim():
        raise HookscopeError(f"dim={dim} is out of range for a tensor of shape {tuple(t.shape)}; pass a dim in "
                             f"[{-t.dim()}, {t.dim() - 1}] (0: output channels)")
    return dim % t.dim()


def _l1_unstructured(t: torch.Tensor, default: torch.Tensor, spec: Spec) -> torch.Tensor:
    k = to_prune(spec.amount, t.nelement())
    mask = default.clone(memory_format=torch.contiguous_format)
    if k != 0:  # topk(k=0) is fine, but torch skips it: keep the same calls
        # reshape, not torch's view: a channels_last or transposed weight has no flat view
        topk = torch.topk(torch.abs(t).reshape(-1), k=k, largest=False)
        mask.view(-1)[topk.indices] = 0
    return mask


def _random_unstructured(t: torch.Tensor, default: torch.Tensor, spec: Spec) -> torch.Tensor:
    k = to_prune(spec.amount, t.nelement())
    mask = default.clone(memory_format=torch.contiguous_format)
    if k != 0:
        g = spec.generator
        # drawn in logical order (rand_like would follow a channels_last layout: other draws per entry), on the
        # generator's device: a CPU generator cannot draw on CUDA, and the seed gives the same mask on every device
        prob = torch.rand_like(t, memory_format=torch.contiguous_format) if g is None else \
            torch.rand(t.shape, generator=g, dtype=t.dtype, device=g.device).to(t.device)
        topk = torch.topk(prob.view(-1), k=k)
        mask.view(-1)[topk.indices] = 0
    return mask


def _channels(t: torch.Tensor, dim: int, keep: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros_like(t)
    slc: list[Any] = [slice(None)] * t.dim()
    slc[dim] = keep
    mask[tuple(slc)] = 1
    return mask


def _norm(t: torch.Tensor, n: int | float | str, dim: int) -> torch.Tensor:
    """torch's ``_compute_norm``: the Ln norm of each channel along ``dim`` over all other dims."""
    dims = [d for d in range(t.dim()) if d != dim]
    is_matrix_dim = len(dims) == 2
    if n == "nuc" or (n == "fro" and is_matrix_dim):
        out: torch.Tensor = torch.linalg.matrix_norm(t, ord=n, dim=dims if is_matrix_dim else (-2, -1))
        return out
    norm: torch.Tensor = torch.linalg.vector_norm(t, ord=2 if n == "fro" else n, dim=dims)
    return norm


def _ln_structured(t: torch.Tensor, default: torch.Tensor, spec: Spec) -> torch.Tensor:
    dim = _dim(t, spec.dim)
    size = t.shape[dim]
    k = to_prune(spec.amount, size)
    topk = torch.topk(_norm(t, spec.n, dim), k=size - k, largest=True)
    if k == 0:
        return default
    return _channels(t, dim, topk.indices) * default.to(dtype=t.dtype)


def _random_structured(t: torch.Tensor, default: torch.Tensor, spec: Spec) -> torch.Tensor:
    dim = _dim(t, spec.dim)
    size = t.shape[dim]
    k = to_prune(spec.amount, size)
    if k == 0:
        return default
    g = spec.generator
    prob = torch.rand(size) if g is None else torch.rand(size, generator=g, device=g.device)
    threshold = torch.kthvalue(prob, k=k).values
    return _channels(t, dim, (prob > threshold).to(t.device)) * default.to(dtype=t.dtype)


METHODS: dict[str, Criterion] = {
    "l1_unstructured": Criterion("unstructured", _l1_unstructured),
    "random_unstructured": Criterion("unstructured", _random_unstructured),
    "ln_structured": Criterion("structured", _ln_structured),
    "random_structured": Criterion("structured", _random_structured),
}
"""Every mask criterion by name: torch's four built-in pruning methods."""


def criterion(method: str) -> Criterion:
    """The entry of :data:`METHODS` named ``method``, or a one-line error listing them.

    Example:
        >>> criterion("l1_unstructured").kind
        'unstructured'
        >>> criterion("l1_unstructed")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: no pruning method 'l1_unstructed'. Did you mean 'l1_unstructured', 'ln_structured', 'random_unstructured'? The methods: l1_unstructured, random_unstructured, ln_structured, random_structured
    """
    found = METHODS.get(method) if isinstance(method, str) else None
    if method in ("wanda", "sparsegpt"):  # ranked on calibration data, which prune() does not take
        raise HookscopeError(f"method={method!r} is calibrated on data; use hookscope.prune_calibrated(model, data, "
                             f"method={method!r}, sparsity=0.5)")
    if found is None:
        hint = did_you_mean(method, METHODS) if isinstance(method, str) else ""
        raise HookscopeError(f"no pruning method {method!r}.{hint} The methods: {', '.join(METHODS)}")
    return found


def _region(kind: str, t: torch.Tensor, mask: torch.Tensor, dim: int) -> tuple[Any, ...]:
    """The part of ``t`` a composed criterion ranks: unmasked entries, or channels not entirely masked."""
    if kind == "unstructured":
        return (mask == 1,)
    dim = _dim(t, dim)
    keep = mask.sum(dim=[d for d in range(t.dim()) if d != dim]) != 0
    slc: list[Any] = [slice(None)] * t.dim()
    slc[dim] = keep
    return tuple(slc)


def units_left(method: str, t: torch.Tensor, mask: torch.Tensor | None, spec: Spec) -> int:
    """How many units ``amount`` is counted against: entries (unstructured) or channels along ``dim``
    (structured) not yet masked; every unit when there is no mask.

    Example:
        >>> units_left("l1_unstructured", torch.ones(2, 3), torch.tensor([[1.0, 0, 0], [1, 1, 1]]), Spec(1))
        4
        >>> units_left("ln_structured", torch.ones(2, 3), torch.tensor([[0.0, 0, 0], [1, 0, 1]]), Spec(1))
        1
    """
    kind = criterion(method).kind
    if kind == "structured":
        dim = _dim(t, spec.dim)
        if mask is None:
            return t.shape[dim]
        return int((mask.sum(dim=[d for d in range(t.dim()) if d != dim]) != 0).sum())
    return t.nelement() if mask is None else int((mask == 1).sum())


def new_mask(method: str, t: torch.Tensor, mask: torch.Tensor | None, spec: Spec) -> torch.Tensor:
    """The mask after pruning ``t`` with ``method``: from scratch when ``mask`` is ``None``, else
    composed with ``mask`` as torch's ``PruningContainer`` does (the old zeros kept).

    Example:
        >>> t = torch.tensor([[0.1, -2.0], [3.0, -0.4]])
        >>> first = new_mask("l1_unstructured", t, None, Spec(1))
        >>> first
        tensor([[0., 1.],
                [1., 1.]])
        >>> new_mask("l1_unstructured", t * first, first, Spec(1))  # 1 of the 3 left
        tensor([[0., 1.],
                [1., 0.]])
    """
    crit = criterion(method)
    spec = Spec(validate_amount(spec.amount), spec.n, spec.dim, spec.generator)
    if mask is None:
        return crit.compute(t, torch.ones_like(t), spec)
    new = mask.to(dtype=t.dtype, copy=True)
    slc = _region(crit.kind, t, mask, spec.dim)
    partial = crit.compute(t[slc], mask[slc], spec)
    new[slc] = partial.to(dtype=new.dtype)
    return new


def global_masks(method: str, tensors: list[torch.Tensor], masks: list[torch.Tensor | None],
                 spec: Spec) -> list[torch.Tensor]:
    """Masks of several tensors ranked together, as torch's ``global_unstructured``: one vector of
    every tensor and one of every mask (ones where none), composed as a ``PruningContainer`` does.

    Example:
        >>> a, b = torch.tensor([1.0, -5.0]), torch.tensor([[0.5, 2.0]])
        >>> global_masks("l1_unstructured", [a, b], [None, None], Spec(2))
        [tensor([0., 1.]), tensor([[0., 1.]])]
    """
    if criterion(method).kind != "unstructured":
        raise HookscopeError(f"global pruning ranks single weights across layers, {method!r} ranks channels; "
                             "use l1_unstructured or random_unstructured with scope='global', or scope='layer'")
    flat = torch.cat([t.reshape(-1) for t in tensors])
    old = torch.cat([(torch.ones_like(t) if m is None else m).reshape(-1) for t, m in zip(tensors, masks)])
    full = new_mask(method, flat, old, spec)
    out, start = [], 0
    for t in tensors:
        out.append(full[start:start + t.numel()].view_as(t).clone())
        start += t.numel()
    return out

