"""FullGrad (Srinivas & Fleuret 2019): the input-gradient term and the bias-gradient term of every convolution
and batch norm, each rescaled, upsampled and summed."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ...errors import HookscopeError
from ._shape import upsample

__all__ = ["BIASED", "bias_of", "biased_layers", "fullgrad_maps"]

INPUT = "<input>"  # the key of the input-gradient term in CamMaps.raw

BIASED: dict[int, tuple[type[nn.Module], ...]] = {  # by the input's spatial rank
    1: (nn.Conv1d, nn.BatchNorm1d), 2: (nn.Conv2d, nn.BatchNorm2d), 3: (nn.Conv3d, nn.BatchNorm3d)}


def biased_layers(model: nn.Module, rank: int) -> list[tuple[str, nn.Module]]:
    """Every convolution with a bias and every batch norm of the input's rank, in ``named_modules()`` order."""
    kinds = BIASED[rank]
    return [(n, m) for n, m in model.named_modules() if n and isinstance(m, kinds)
            and (isinstance(m, nn.modules.batchnorm._BatchNorm) or getattr(m, "bias", None) is not None)]


def bias_of(name: str, m: nn.Module) -> torch.Tensor:
    """The per-channel constant a layer adds: a convolution's bias; for a batch norm in eval mode, the bias of the
    affine map it is, ``beta - mean * gamma / sqrt(var + eps)`` (``gamma = 1, beta = 0`` without affine)."""
    if not isinstance(m, nn.modules.batchnorm._BatchNorm):
        return cast(torch.Tensor, m.bias).detach()
    if m.running_mean is None or m.running_var is None:
        raise HookscopeError(f"fullgrad needs the bias of batch norm {name!r}, which keeps no running statistics "
                             "(track_running_stats=False), so it has none; use another method")
    mean, var = m.running_mean.detach(), m.running_var.detach()
    gamma = m.weight.detach() if m.weight is not None else torch.ones_like(mean)
    beta = m.bias.detach() if m.bias is not None else torch.zeros_like(mean)
    return beta - mean * gamma / torch.sqrt(var + m.eps)


def _psi(t: torch.Tensor) -> torch.Tensor:
    """The paper's post-processing: ``|t|``, min-max rescaled per sample over all its channels and positions."""
    a = t.abs()
    flat = a.flatten(1)
    lo = flat.amin(1).view(-1, *([1] * (a.ndim - 1)))
    span = flat.amax(1).view_as(lo) - lo
    return (a - lo) / torch.where(span > 0, span, torch.ones_like(span))


def fullgrad_maps(acts: dict[str, torch.Tensor], modules: dict[str, nn.Module], leaf: torch.Tensor,
                  score: torch.Tensor, inputs: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each term (the input's at the input's size under ``"<input>"``, each layer's at its own) and their sum.

    ``sum_c psi(x * dS/dx)_c + sum_l sum_c up(psi(b_l * dS/dA_l))_c`` with ``psi`` :func:`_psi` and ``up``
    (bi/tri)linear with ``align_corners=True``, as the authors' code. A layer the score does not reach adds
    nothing.
    """
    names = list(acts)
    grads = torch.autograd.grad(score.sum(), [leaf, *[acts[n] for n in names]], allow_unused=True)
    if grads[0] is None:
        raise HookscopeError("fullgrad needs the score's gradient at the inputs, and none flows back to them")
    work = torch.float64 if inputs.dtype == torch.float64 else torch.float32
    size = tuple(inputs.shape[2:])
    raw = {INPUT: _psi(grads[0].to(work) * inputs.to(work)).sum(1)}
    total = raw[INPUT].clone()
    for n, g in zip(names, grads[1:]):
        if g is None:
            continue
        b = bias_of(n, modules[n]).to(work)
        term = _psi(g.to(work) * b.view(1, -1, *([1] * (g.ndim - 2))))
        raw[n] = term.sum(1)
        total += upsample(term, size, align_corners=True).sum(1)
    return raw, total
