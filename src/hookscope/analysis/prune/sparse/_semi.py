"""``to_semi_structured``: the 2:4 weights of a model's linear layers as ``torch.sparse``'s
semi-structured tensors, which sparse tensor cores multiply about twice as fast on CUDA GPUs of compute
capability 8.0 and later. A mask alone saves nothing (its zeros are still multiplied), and on the CPU
there is no such kernel: that is refused in one line, not emulated. Must not import: any other analysis
module.
"""

from __future__ import annotations

import torch
from torch import nn

from ....errors import HookscopeError, checked
from ....selection import named_modules
from ..masks import make_permanent, mask_of

__all__ = ["semi_structured_layers", "to_semi_structured"]

# the sparse operand's smallest shape per dtype (rows, inputs), as torch's CUTLASS backend asks
_SHAPES = {torch.float16: (32, 64), torch.bfloat16: (32, 64)}


def _weight(m: nn.Module) -> torch.Tensor:
    mask = mask_of(m, "weight")
    w = m.weight if mask is None else getattr(m, "weight_orig") * mask
    assert isinstance(w, torch.Tensor)
    return w.detach()


def _two_of_four(w: torch.Tensor) -> bool:
    if w.dim() != 2 or w.shape[1] % 4 or w.device.type == "meta":
        return False
    return bool(((w.reshape(w.shape[0], -1, 4) == 0).sum(-1) >= 2).all())


def semi_structured_layers(model: nn.Module) -> list[str]:
    """The ``nn.Linear`` layers whose weight (its mask applied) has at least 2 zeros in every 4
    consecutive inputs of each row: the layout semi-structured sparse kernels take.

    Example:
        >>> lin = nn.Linear(8, 2)
        >>> with torch.no_grad(): _ = lin.weight.copy_(torch.tensor([[1., 0, 0, 2] * 2, [0, 3, 4, 0] * 2]))
        >>> semi_structured_layers(nn.Sequential(lin, nn.Linear(8, 2)))
        ['0']
    """
    return [q for q, m in named_modules(model) if type(m) is nn.Linear and _two_of_four(_weight(m))]


def _check(model: nn.Module, names: list[str]) -> None:
    mods = dict(named_modules(model))
    for q in names:
        w = _weight(mods[q])
        if w.device.type != "cuda":
            raise HookscopeError(f"{len(names)} linear layers are 2:4, but {q!r} is on {w.device.type}: semi-structured "
                                 "sparse kernels run on CUDA GPUs only (compute capability 8.0+), and on the CPU there "
                                 "is no speedup; keep the masks there (or remove_masks), or move the model to a GPU")
        if w.dtype not in _SHAPES:
            raise HookscopeError(f"layer {q!r} is {w.dtype}; the sparse kernels multiply float16 or bfloat16: pass "
                                 "model.half() or model.to(torch.bfloat16)")
        rows, cols = _SHAPES[w.dtype]
        if w.shape[0] % rows or w.shape[1] % cols:
            raise HookscopeError(f"layer {q!r} is {w.shape[0]} x {w.shape[1]}; the sparse kernels take multiples of "
                                 f"{rows} x {cols}; leave it dense (prune the other layers)")


@checked
def to_semi_structured(model: nn.Module) -> list[str]:
    """Replace the weight of every 2:4 ``nn.Linear`` (see :func:`semi_structured_layers`) by
    ``torch.sparse.to_sparse_semi_structured`` of it, in place, its mask made permanent first.

    Only on CUDA (compute capability 8.0+), in float16 or bfloat16, each weight a multiple of 32 x 64:
    anything else is refused in one line before a layer changes. On the CPU there is no speedup, and
    the refusal says so. The converted weights are frozen (``requires_grad=False``): for inference.

    Returns:
        The qualified names of the layers converted.

    Example:
        >>> lin = nn.Linear(8, 2)
        >>> with torch.no_grad(): _ = lin.weight.copy_(torch.tensor([[1., 0, 0, 2] * 2, [0, 3, 4, 0] * 2]))
        >>> to_semi_structured(nn.Sequential(lin))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: 1 linear layers are 2:4, but '0' is on cpu: ... no speedup; ...
    """
    names = semi_structured_layers(model)
    if not names:
        raise HookscopeError(f"no nn.Linear weight of {type(model).__name__} is 2:4 sparse; prune with n_m=(2, 4) "
                             "first (hookscope.prune(model, method='wanda', data=ids, n_m=(2, 4)))")
    _check(model, names)
    mods = dict(named_modules(model))
    for q in names:
        m = mods[q]
        if mask_of(m, "weight") is not None:
            make_permanent(m, "weight")
        weight = m.weight
        assert isinstance(weight, torch.Tensor)
        sparse = torch.sparse.to_sparse_semi_structured(weight.detach().contiguous())
        m.weight = nn.Parameter(sparse, requires_grad=False)
    return names
