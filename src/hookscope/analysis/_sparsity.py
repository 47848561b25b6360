"""Zeros in a model's weights, pruning masks included: the shared engine of sparsity figures.

A weight masked the way ``torch.nn.utils.prune`` does it (and hookscope's pruning, which keeps the
same layout) lives as a parameter ``<name>_orig`` and a buffer ``<name>_mask``; a forward pre-hook
sets ``<name> = <name>_orig * <name>_mask`` before each call. The parameter is ``<name>_orig`` (so
it is counted once), and its zeros are those of the weight the layer computes with: the product,
recomputed here from the two tensors (the ``<name>`` attribute may be stale, e.g. right after
``load_state_dict``). Nothing here registers a hook, runs a model or knows about pruning code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

__all__ = ["Zeros", "masked", "effective", "zeros_in", "module_zeros", "model_zeros"]


@dataclass(frozen=True)
class Zeros:
    """Zero elements among ``elements`` parameter elements; ``zeros`` is ``None`` where they cannot be
    read (meta tensors hold no values). ``masked`` names the masked parameters (``"weight"``...);
    ``in_weights`` counts the zeros of tensors of 2 or more dimensions only (weight matrices and
    kernels: a fresh BatchNorm's bias is all zeros, a fresh weight has none).

    Example:
        >>> Zeros(10, 3).fraction
        0.3
    """

    elements: int
    zeros: int | None
    masked: tuple[str, ...] = ()
    in_weights: int | None = 0

    @property
    def fraction(self) -> float | None:
        """``zeros / elements`` (0.0 for no element); ``None`` when the zeros are unknown."""
        if self.zeros is None:
            return None
        return self.zeros / self.elements if self.elements else 0.0


def masked(module: nn.Module) -> dict[str, str]:
    """The module's masked parameters: ``{"weight": "weight_orig"}`` for each ``<name>_orig``
    parameter that has a ``<name>_mask`` buffer of the same shape.

    Example:
        >>> from torch.nn.utils import prune
        >>> conv = nn.Conv2d(1, 2, 3)
        >>> _ = prune.l1_unstructured(conv, "weight", amount=0.5)
        >>> masked(conv), masked(nn.Linear(2, 2))
        ({'weight': 'weight_orig'}, {})
    """
    found: dict[str, str] = {}
    for local, p in module._parameters.items():
        if p is None or not local.endswith("_orig"):
            continue
        base = local[: -len("_orig")]
        mask = module._buffers.get(base + "_mask")
        if isinstance(mask, torch.Tensor) and not is_lazy(p) and mask.shape == p.shape:
            found[base] = local
    return found


def effective(module: nn.Module, base: str) -> torch.Tensor:
    """The weight a masked parameter computes with: ``<base>_orig * <base>_mask``, without autograd.

    Example:
        >>> from torch.nn.utils import prune
        >>> lin = nn.Linear(2, 2)
        >>> _ = prune.custom_from_mask(lin, "weight", torch.tensor([[1, 0], [0, 1]]))
        >>> bool((effective(lin, "weight") == lin.weight_orig * torch.eye(2)).all())
        True
    """
    with torch.no_grad():
        return module._parameters[base + "_orig"] * module._buffers[base + "_mask"]  # type: ignore[operator]


def zeros_in(t: torch.Tensor) -> int | None:
    """Zero elements of ``t``; ``None`` for a tensor whose values cannot be read (meta, sparse...).

    Example:
        >>> zeros_in(torch.tensor([0.0, 1.0, -0.0])), zeros_in(torch.zeros(3, device="meta"))
        (2, None)
    """
    if is_lazy(t):
        return 0
    if t.device.type == "meta":
        return None
    try:
        return int(t.numel() - torch.count_nonzero(t.detach()).item())
    except (RuntimeError, NotImplementedError, TypeError):  # sparse layouts, some tensor subclasses
        return None


def _count(tensors: list[torch.Tensor], masks: tuple[str, ...]) -> Zeros:
    elements, zeros, in_weights = 0, 0, 0
    known = True
    for t in tensors:
        elements += 0 if is_lazy(t) else t.numel()
        z = zeros_in(t)
        known = known and z is not None
        zeros += z or 0
        in_weights += (z or 0) if t.dim() >= 2 else 0
    return Zeros(elements, zeros if known else None, masks, in_weights if known else None)


def module_zeros(module: nn.Module) -> Zeros:
    """Zeros of the module's own parameters (not its children's), each tensor once, masks applied.

    Example:
        >>> from torch.nn.utils import prune
        >>> lin = nn.Linear(4, 2)  # 8 weights and 2 biases
        >>> _ = prune.l1_unstructured(lin, "weight", amount=3)
        >>> with torch.no_grad(): _ = lin.bias.fill_(1.0)
        >>> module_zeros(lin)
        Zeros(elements=10, zeros=3, masked=('weight',), in_weights=3)
    """
    masks = masked(module)
    originals = set(masks.values())
    distinct: dict[int, torch.Tensor] = {}
    for local, p in module._parameters.items():
        if p is not None and local not in originals:
            distinct.setdefault(id(p), p)
    tensors = list(distinct.values()) + [effective(module, base) for base in masks]
    return _count(tensors, tuple(masks))


def model_zeros(model: nn.Module) -> Zeros:
    """Zeros of every parameter of ``model``, each tensor once (as ``model.parameters()`` lists them),
    a masked parameter as the weight it computes with; ``masked`` holds qualified names.

    Example:
        >>> from torch.nn.utils import prune
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        >>> _ = prune.random_unstructured(net[1], "weight", amount=0.25)
        >>> with torch.no_grad(): _ = net[0].bias.zero_()  # 4 zeros by hand
        >>> z = model_zeros(net)
        >>> z.elements, z.zeros, z.masked
        (40, 8, ('1.weight',))
    """
    seen: dict[int, torch.Tensor] = {}
    names: list[str] = []
    for prefix, m in model.named_modules(remove_duplicate=True):
        for base, orig in masked(m).items():
            p = m._parameters[orig]
            if p is not None and id(p) not in seen:
                seen[id(p)] = effective(m, base)
                names.append(f"{prefix}.{base}" if prefix else base)
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return _count(list(seen.values()), tuple(names))
