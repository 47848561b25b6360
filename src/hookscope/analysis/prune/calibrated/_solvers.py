"""What Wanda and SparseGPT do to one weight matrix once its inputs are measured, one table.

A weight is handled as a matrix ``(out, in)``: rows are output units, columns inputs. Each solver
takes the weight (in the dtype the statistics were gathered in), the statistic its method gathers
and the settings, and returns the new weight (``None``: unchanged) and the entries it prunes (a
bool matrix). Wanda: Sun et al. 2023 (``locuslab/wanda``, ``lib/prune.py``); SparseGPT: Frantar and
Alistarh 2023 (``IST-DASLab/sparsegpt``, ``sparsegpt.py``). Must not import: anything that registers
a hook, any other analysis module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ....errors import HookscopeError

__all__ = ["Settings", "Solver", "SOLVERS", "wanda", "sparsegpt"]


@dataclass(frozen=True)
class Settings:
    """``sparsity``: the fraction of each row (Wanda) or of each block of columns (SparseGPT) pruned,
    when ``n_m`` is ``None``; ``n_m = (N, M)``: N of every M consecutive inputs of a row pruned.
    ``blocksize`` and ``percdamp``: SparseGPT's block of columns and dampening.

    Example:
        >>> Settings(0.5).n_m is None, Settings(0.0, (2, 4)).blocksize
        (True, 128)
    """

    sparsity: float
    n_m: tuple[int, int] | None = None
    blocksize: int = 128
    percdamp: float = 0.01


def _lowest_per_group(score: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """True at the ``n`` lowest scores of every ``m`` consecutive columns of each row."""
    rows, cols = score.shape
    groups = score.reshape(rows, cols // m, m)
    idx = torch.topk(groups, n, dim=-1, largest=False).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, idx, True).reshape(rows, cols)


def wanda(weight: torch.Tensor, norms_sq: torch.Tensor, settings: Settings) -> tuple[None, torch.Tensor]:
    """Wanda's pruned entries: score ``|W_ij| * sqrt(norms_sq_j)`` (``norms_sq``: the squared L2 norm of
    input ``j`` over the calibration tokens, up to a common factor), the lowest ``int(in * sparsity)``
    of each row pruned (a stable sort, as the reference), or the N lowest of every M.

    Example:
        >>> w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
        >>> wanda(w, torch.tensor([4.0, 1.0, 0.01, 1.0]), Settings(0.5))[1]
        tensor([[False, False,  True,  True]])
    """
    score = weight.abs() * torch.sqrt(norms_sq.reshape(1, -1))
    if settings.n_m is not None:
        return None, _lowest_per_group(score, *settings.n_m)
    k = int(score.shape[1] * settings.sparsity)
    idx = torch.sort(score, dim=-1, stable=True).indices[:, :k]
    return None, torch.zeros_like(score, dtype=torch.bool).scatter_(1, idx, True)


def _inverse_factor(hessian: torch.Tensor, percdamp: float) -> torch.Tensor:
    """The upper Cholesky factor of the dampened ``H^-1``, as the reference computes it."""
    diag = torch.arange(hessian.shape[0], device=hessian.device)
    hessian[diag, diag] += percdamp * torch.mean(torch.diag(hessian))
    try:
        lower = torch.linalg.cholesky(hessian)
    except RuntimeError:  # torch.linalg.LinAlgError is a RuntimeError
        raise HookscopeError(f"the input Hessian is not positive definite even dampened by percdamp={percdamp}; "
                             "pass a larger percdamp= (0.1) or more calibration data") from None
    upper: torch.Tensor = torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)
    return upper


def _block_mask(w1: torch.Tensor, d1: torch.Tensor, settings: Settings) -> torch.Tensor:
    """The unstructured choice for one block of columns: the lowest ``w^2 / [H^-1]_jj^2`` over the block.

    The reference thresholds at the entry of rank ``int(numel * sparsity)`` inclusively, which prunes
    one entry more than the fraction (one even at sparsity 0); exactly ``int(numel * sparsity)`` here."""
    if settings.n_m is not None:
        return torch.zeros_like(w1, dtype=torch.bool)
    score = (w1 ** 2 / d1.reshape(1, -1) ** 2).flatten()
    k = int(score.numel() * settings.sparsity)
    mask = torch.zeros_like(score, dtype=torch.bool)
    mask[torch.sort(score, stable=True).indices[:k]] = True
    return mask.reshape(w1.shape)


def _prune_block(w1: torch.Tensor, hinv1: torch.Tensor, settings: Settings) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         torch.Tensor]:
    """One block of columns, column by column: the pruned block, its mask, and each column's error."""
    d1 = torch.diag(hinv1)
    mask1 = _block_mask(w1, d1, settings)
    q1, err1 = torch.zeros_like(w1), torch.zeros_like(w1)
    for i in range(w1.shape[1]):
        if settings.n_m is not None and i % settings.n_m[1] == 0:
            n, m = settings.n_m
            score = w1[:, i:i + m] ** 2 / d1[i:i + m].reshape(1, -1) ** 2
            mask1.scatter_(1, i + torch.topk(score, n, dim=1, largest=False).indices, True)
        w = w1[:, i]
        q = w.clone()
        q[mask1[:, i]] = 0
        q1[:, i] = q
        err = (w - q) / hinv1[i, i]
        w1[:, i:] -= err.unsqueeze(1).matmul(hinv1[i, i:].unsqueeze(0))
        err1[:, i] = err
    return q1, mask1, err1


def sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT's pruned weight and entries: ``hessian`` is ``2 X X^T / nsamples``; inputs never active
    (a zero diagonal) get a unit diagonal and their column zeroed; the upper Cholesky factor of the
    dampened inverse drives a column-by-column optimal-brain-surgeon update, lazily batched in blocks
    of ``blocksize`` columns, the mask chosen per block (unstructured) or per M columns (N:M).

    Example:
        >>> w = torch.tensor([[1.0, 0.1, 2.0, 0.2]], dtype=torch.float64)
        >>> new, pruned = sparsegpt(w, torch.eye(4, dtype=torch.float64), Settings(0.5))
        >>> pruned.tolist(), new.tolist()
        ([[False, True, False, True]], [[1.0, 0.0, 2.0, 0.0]])
    """
    w, h = weight.clone(), hessian.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    hinv = _inverse_factor(h, settings.percdamp)
    pruned = torch.zeros_like(w, dtype=torch.bool)
    cols, size = w.shape[1], settings.blocksize
    for i1 in range(0, cols, size):
        i2 = min(i1 + size, cols)
        q1, mask1, err1 = _prune_block(w[:, i1:i2].clone(), hinv[i1:i2, i1:i2], settings)
        w[:, i1:i2] = q1
        pruned[:, i1:i2] = mask1
        w[:, i2:] -= err1.matmul(hinv[i1:i2, i2:])
    return w, pruned


Solver = Callable[[torch.Tensor, torch.Tensor, Settings], tuple[torch.Tensor | None, torch.Tensor]]


@dataclass(frozen=True)
class Method:
    """One entry of :data:`SOLVERS`: the statistic its hooks gather (``"norms"``: the squared norm of
    each input; ``"hessian"``: ``2 X X^T / nsamples``) and the solver.

    Example:
        >>> SOLVERS["sparsegpt"].statistic
        'hessian'
    """

    statistic: str
    solve: Solver


SOLVERS: dict[str, Method] = {"wanda": Method("norms", wanda), "sparsegpt": Method("hessian", sparsegpt)}
"""Every calibrated pruning method by name."""
