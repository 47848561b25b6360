"""``prune``: one entry point for every element-wise pruning method, the four of ``torch.nn.utils.prune``
(``masks``) and the calibrated ones (``prune_calibrated``), chosen by ``method=``. Must not import: any
other analysis module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....errors import HookscopeError, checked
from ....selection import Selector
from ..masks import Sparsity
from ..masks import prune as prune_masks
from ._api import prune_calibrated
from ._solvers import SOLVERS

__all__ = ["prune"]


def _calibrated(method: str, selectors: tuple[Selector, ...], amount: object, data: object) -> None:
    if data is None:
        raise HookscopeError(f"method={method!r} is calibrated on data; pass data= (token ids [nsamples, seqlen] "
                             "for a language model), e.g. prune(model, method='wanda', data=ids, sparsity=0.5)")
    if amount is not None:
        raise HookscopeError(f"method={method!r} takes sparsity= or n_m=, not amount=; e.g. prune(model, "
                             f"method={method!r}, data=ids, sparsity=0.5)")
    if selectors:
        raise HookscopeError(f"method={method!r} prunes every linear layer of the model's blocks, block by block; "
                             "drop the layer selectors (the embeddings and the head are left alone)")


@checked
def prune(model: nn.Module, *selectors: Selector, amount: int | float | None = None,
          method: str = "l1_unstructured", name: str = "weight", n: int | float | str = 1, dim: int = 0,
          scope: str = "layer", generator: torch.Generator | None = None,
          scores: Mapping[str, torch.Tensor] | None = None, data: Any = None, sparsity: float | None = None,
          n_m: tuple[int, int] | None = None, device: torch.device | str | None = None, blocksize: int = 128,
          percdamp: float = 0.01) -> Sparsity:
    """Mask parameter ``name`` of the selected layers: by ``torch.nn.utils.prune``'s criteria
    (``amount=``), or with ``method="wanda"`` / ``"sparsegpt"`` calibrated on ``data`` (``sparsity=`` or
    ``n_m=``), which is :func:`prune_calibrated`.

    Args:
        model: the model (DataParallel and ``torch.compile`` wrappers are seen through).
        selectors: the layers (names, globs, types...); None: every ``nn.Linear`` and ``nn.Conv*`` that has
            parameter ``name``. Not taken by the calibrated methods, which prune every linear layer of the
            model's blocks.
        amount: a fraction in [0, 1] of the units still unpruned, or a count of them (torch's rounding).
        method: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``, or the calibrated ``"wanda"`` and ``"sparsegpt"``.
        name, n, dim, scope, generator, scores: the element methods' settings (see ``hookscope.prune``'s
            guide): the parameter, the norm and channel dim of structured methods, ``"layer"`` or
            ``"global"`` ranking, the random generator, scores ranked instead of the weight.
        data, sparsity, n_m, device, blocksize, percdamp: the calibrated methods' (see
            :func:`prune_calibrated`).

    Returns:
        :class:`Sparsity` of the pruned layers.

    Example:
        >>> torch.manual_seed(0) and None
        >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> prune(net, method="wanda", data=torch.randn(16, 8), n_m=(2, 4)).sparsity
        0.5
        >>> prune(nn.Linear(4, 2), amount=0.5).sparsity
        0.5
    """
    if isinstance(method, str) and method in SOLVERS:
        _calibrated(method, selectors, amount, data)
        return prune_calibrated(model, data, method=method, sparsity=sparsity, n_m=n_m, device=device,
                                blocksize=blocksize, percdamp=percdamp)
    if data is not None:
        raise HookscopeError(f"data= is for the calibrated methods ({', '.join(SOLVERS)}); method={method!r} "
                             "ranks the weights alone: drop data=, or pass method='wanda'")
    if sparsity is not None or n_m is not None:
        raise HookscopeError(f"sparsity= and n_m= are for the calibrated methods ({', '.join(SOLVERS)}); "
                             f"method={method!r} takes amount= (e.g. amount=0.5)")
    if amount is None:
        raise HookscopeError(f"method={method!r} needs the share to prune; pass amount= (a fraction such as 0.5, "
                             "or a count)")
    return prune_masks(model, *selectors, amount=amount, method=method, name=name, n=n, dim=dim, scope=scope,
                       generator=generator, scores=scores)
