"""The formulas of the CAM methods: activations (and gradients) in, a raw ``B x h x w`` map out.

Pure tensor code: no hook, no model state. ``A`` is a ``B x K x h x w`` activation, ``G`` the gradient
of each sample's score with respect to it, the same shape. A gradient method is one small function of
``(A, G)`` registered in :data:`GRADIENT`, the way pytorch-grad-cam gives each method its own file.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GRADIENT", "cam_map", "eigen_map", "gradient_map", "weighted_sum"]


def weighted_sum(weights: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[b, k] * A[b, k]``: ``B x K`` and ``B x K x h x w`` -> ``B x h x w``."""
    return torch.einsum("bk,bkhw->bhw", weights, A)


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den != 0``, else 0 (no eps that would shift small values)."""
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def gradcam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Selvaraju et al. 2017: ``w_k = mean_ij G_kij``; ``sum_k w_k A_k``."""
    return weighted_sum(G.mean((2, 3)), A)


def gradcam_pp(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Chattopadhay et al. 2018, eq. 19 with the exponential-score closed form:
    ``alpha_kij = G_kij^2 / (2 G_kij^2 + (sum_ab A_kab) G_kij^3)`` (0 where the denominator is 0),
    ``w_k = sum_ij alpha_kij relu(G_kij)``; ``sum_k w_k A_k``.

    The paper's ``exp(S)`` factor is a positive constant per image, dropped here (min-max normalisation
    removes it). Neither peer agrees with the paper (bench/RESULTS.md): pytorch-grad-cam adds 1e-6 to the
    denominator, which dominates it where ``G^2`` is small (~3e-7 on an untrained resnet18: maps differ by
    5e-2); torchcam's ``alpha`` stays ``G^2`` (its division acts on a copy: 6e-2).
    """
    g2 = G * G
    alpha = safe_div(g2, 2 * g2 + A.sum((2, 3), keepdim=True) * g2 * G)
    return weighted_sum((alpha * G.clamp(min=0)).sum((2, 3)), A)


def xgradcam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Fu et al. 2020: ``w_k = sum_ij A_kij G_kij / sum_ij A_kij`` (0 where the sum is 0); ``sum_k w_k A_k``."""
    return weighted_sum(safe_div((A * G).sum((2, 3)), A.sum((2, 3))), A)


def hirescam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Draelos & Carin 2020: ``sum_k G_k * A_k``, element-wise."""
    return (G * A).sum(1)


def layercam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Jiang et al. 2021: ``sum_k relu(G_k) * A_k``."""
    return (G.clamp(min=0) * A).sum(1)


GRADIENT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gradcam": gradcam, "gradcam++": gradcam_pp, "xgradcam": xgradcam, "hirescam": hirescam, "layercam": layercam,
}


def gradient_map(method: str, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The raw map of the gradient method ``method`` (a key of :data:`GRADIENT`), after its ReLU.

    Example:
        >>> A = torch.ones(1, 2, 2, 2); G = torch.tensor([1., -1.]).view(1, 2, 1, 1).expand(1, 2, 2, 2)
        >>> gradient_map("layercam", A, G)
        tensor([[[1., 1.],
                 [1., 1.]]])
    """
    return GRADIENT[method](A, G).clamp(min=0)


def cam_map(fc_rows: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """CAM (Zhou et al. 2016): ``M = sum_k W[c, k] A_k`` with ``W[c]`` the head's row of class ``c``.

    No ReLU, as in the paper. ``fc_rows`` is ``B x K`` (one row per sample's target).

    Example:
        >>> cam_map(torch.tensor([[2., -1.]]), torch.ones(1, 2, 1, 1))
        tensor([[[1.]]])
    """
    return weighted_sum(fc_rows.to(A.dtype), A)


def eigen_map(A: torch.Tensor) -> torch.Tensor:
    """Eigen-CAM (Muhammad & Yeasin 2020): the activations projected on their first principal component.

    Per image, ``X`` is the ``hw x K`` matrix of activations with each channel centred over the
    pixels (a principal component is that of centred data; pytorch-grad-cam centres too, the paper's
    text does not say). ``v`` is the first right singular vector of ``X``; the map is ``relu(X v)``.
    An SVD's sign is arbitrary, so ``v`` is oriented so that its loadings sum to >= 0, which is the
    same as the map correlating positively with the sum of the channels (``X^T X v = s^2 v``). Peers
    leave the sign to LAPACK, so their maps can be the negative of this one (then all zero after
    their ReLU). Needs no gradient and no target.

    Example:
        >>> eigen_map(torch.tensor([[[[0., 1.]], [[0., 2.]]]]))
        tensor([[[0.0000, 1.1180]]])
    """
    B, K, h, w = A.shape
    X = A.flatten(2).transpose(1, 2).to(torch.float64 if A.dtype == torch.float64 else torch.float32)
    X = X - X.mean(1, keepdim=True)
    _, _, Vh = torch.linalg.svd(X, full_matrices=False)
    v = Vh[:, 0, :]
    v = torch.where(v.sum(1, keepdim=True) < 0, -v, v)
    proj = (X @ v.unsqueeze(2)).squeeze(2)
    return proj.clamp(min=0).view(B, h, w).to(A.dtype)
