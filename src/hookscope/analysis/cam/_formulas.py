"""The formulas of the CAM methods: activations (and gradients) in, a raw ``B x h x w`` map out.

Pure tensor code: no hook, no model state. ``A`` is a ``B x K x ...`` activation with one, two or three
spatial dimensions (``B x K x l``, ``B x K x h x w``, ``B x K x d x h x w``), ``G`` the gradient of each
sample's score with respect to it, the same shape; a raw map is ``B x ...``, the same spatial shape. A gradient method is one small function of
``(A, G)`` registered in :data:`GRADIENT`, the way pytorch-grad-cam gives each method its own file.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GRADIENT", "KERNELS", "cam_map", "eigen_map", "fem_map", "gradient_map", "kpca_map", "projection", "safe_div", "spatial",
           "weighted_sum"]


def spatial(t: torch.Tensor) -> tuple[int, ...]:
    """The spatial dimensions of a ``B x K x ...`` tensor: ``(2,)``, ``(2, 3)`` or ``(2, 3, 4)``."""
    return tuple(range(2, t.ndim))


def weighted_sum(weights: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[b, k] * A[b, k]``: ``B x K`` and ``B x K x ...`` -> ``B x ...``."""
    return (weights.view(*weights.shape, *([1] * (A.ndim - 2))) * A).sum(1)


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den != 0``, else 0 (no eps that would shift small values)."""
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def gradcam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Selvaraju et al. 2017: ``w_k = mean_ij G_kij``; ``sum_k w_k A_k``."""
    return weighted_sum(G.mean(spatial(G)), A)


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
    alpha = safe_div(g2, 2 * g2 + A.sum(spatial(A), keepdim=True) * g2 * G)
    return weighted_sum((alpha * G.clamp(min=0)).sum(spatial(G)), A)


def xgradcam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Fu et al. 2020: ``w_k = sum_ij A_kij G_kij / sum_ij A_kij`` (0 where the sum is 0); ``sum_k w_k A_k``."""
    return weighted_sum(safe_div((A * G).sum(spatial(A)), A.sum(spatial(A))), A)


def hirescam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Draelos & Carin 2020: ``sum_k G_k * A_k``, element-wise."""
    return (G * A).sum(1)


def layercam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Jiang et al. 2021: ``sum_k relu(G_k) * A_k``."""
    return (G.clamp(min=0) * A).sum(1)


def gradcam_elementwise(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Grad-CAM element-wise (pytorch-grad-cam's ``GradCAMElementWise``): ``sum_k relu(G_k * A_k)``, the
    products clipped before the channels are summed (HiRes-CAM clips after)."""
    return (G * A).clamp(min=0).sum(1)


def eigengradcam(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Eigen-Grad-CAM (pytorch-grad-cam's ``EigenGradCAM``): Eigen-CAM's projection of ``G * A``, the
    gradient-weighted activations, on their first principal component (sign as :func:`projection`)."""
    return projection(G * A)


GRADIENT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gradcam": gradcam, "gradcam++": gradcam_pp, "xgradcam": xgradcam, "hirescam": hirescam, "layercam": layercam,
    "gradcamelementwise": gradcam_elementwise, "eigengradcam": eigengradcam,
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


def _pixels(A: torch.Tensor) -> torch.Tensor:
    """``B x K x ...`` -> ``B x n x K`` (``n`` positions), each channel centred over the positions, in float32/64."""
    X = A.flatten(2).transpose(1, 2).to(torch.float64 if A.dtype == torch.float64 else torch.float32)
    return X - X.mean(1, keepdim=True)


def projection(A: torch.Tensor) -> torch.Tensor:
    """The activations projected on their first principal component, per sample, before any ReLU: ``B x ...``.

    ``X`` is the ``n x K`` matrix of activations (``n`` positions) with each channel centred over the
    positions; ``v`` its first right singular vector, oriented so that its loadings sum to >= 0
    (an SVD's sign is arbitrary; this is the map correlating positively with the channels' sum,
    since ``X^T X v = s^2 v``); the projection is ``X v``.
    """
    X = _pixels(A)
    _, _, Vh = torch.linalg.svd(X, full_matrices=False)
    v = Vh[:, 0, :]
    v = torch.where(v.sum(1, keepdim=True) < 0, -v, v)
    return (X @ v.unsqueeze(2)).squeeze(2).view(A.shape[0], *A.shape[2:]).to(A.dtype)


def eigen_map(A: torch.Tensor) -> torch.Tensor:
    """Eigen-CAM (Muhammad & Yeasin 2020): ``relu`` of the activations projected on their first principal component.

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
    return projection(A).clamp(min=0)


def _kernel(name: str, X: torch.Tensor, gamma: float | None, degree: int, coef0: float) -> torch.Tensor:
    """scikit-learn's pairwise kernels of the rows of ``X`` (``B x n x K``), ``gamma=None``: ``1 / K``."""
    g = 1.0 / X.shape[2] if gamma is None else gamma
    dot = X @ X.transpose(1, 2)
    if name == "linear":
        return dot
    if name == "poly":
        return (g * dot + coef0) ** degree
    if name == "sigmoid":
        return torch.tanh(g * dot + coef0)
    if name == "rbf":
        sq = (X * X).sum(2)
        return torch.exp(-g * (sq.unsqueeze(2) + sq.unsqueeze(1) - 2 * dot).clamp(min=0))
    norm = X.norm(dim=2, keepdim=True)  # cosine
    unit = X / torch.where(norm > 0, norm, torch.ones_like(norm))
    return unit @ unit.transpose(1, 2)


KERNELS = ("linear", "poly", "rbf", "sigmoid", "cosine")  # KPCA-CAM's kernels, as scikit-learn names them


def kpca_map(A: torch.Tensor, kernel: str = "sigmoid", gamma: float | None = None, degree: int = 3,
             coef0: float = 1.0) -> torch.Tensor:
    """KPCA-CAM (Karmani et al. 2024): ``relu`` of the first kernel principal component of the activations.

    Per image, the channel-centred ``n x K`` activations ``X`` (as Eigen-CAM) give the kernel matrix
    ``k(x_i, x_j)`` (one of :data:`KERNELS`, with scikit-learn's parameters: ``gamma`` (``None``:
    ``1 / K``), ``degree``, ``coef0``), centred in feature space (``Kc = K - 1K - K1 + 1K1``); the
    map is the first component's scores, ``sqrt(lambda_1) u_1`` with ``u_1`` the top eigenvector of
    ``Kc``, which is what scikit-learn's ``KernelPCA(n_components=1).fit_transform`` gives. The sign
    is fixed so that the scores correlate positively with the channels' sum (as Eigen-CAM's);
    scikit-learn instead makes the eigenvector's largest entry positive.

    Example:
        >>> A = torch.tensor([[[[0., 1.]], [[0., 2.]]]])
        >>> kpca_map(A, "linear")   # the linear kernel is Eigen-CAM
        tensor([[[0.0000, 1.1180]]])
    """
    X = _pixels(A)
    Km = _kernel(kernel, X, gamma, degree, coef0)
    Kc = Km - Km.mean(1, keepdim=True) - Km.mean(2, keepdim=True) + Km.mean((1, 2), keepdim=True)
    vals, vecs = torch.linalg.eigh(Kc)
    u, lam = vecs[:, :, -1], vals[:, -1].clamp(min=0)
    scores = u * lam.sqrt().unsqueeze(1)
    along = (scores * (X.sum(2) - X.sum(2).mean(1, keepdim=True))).sum(1, keepdim=True)
    scores = torch.where(along < 0, -scores, scores)
    return scores.clamp(min=0).view(A.shape[0], *A.shape[2:]).to(A.dtype)


def fem_map(A: torch.Tensor, sigmas: float = 2.0) -> torch.Tensor:
    """FEM (Fuad et al. 2020): ``w_k`` the share of channel ``k``'s positions above its mean plus ``sigmas``
    standard deviations (over the positions, population std), ``relu(sum_k w_k A_k)``.

    Example:
        >>> fem_map(torch.tensor([[[[0., 0., 0., 4.]]]]), sigmas=1.0)   # 4 > 1 + 1.73: w = 1/4
        tensor([[[0., 0., 0., 1.]]])
    """
    dims = spatial(A)
    th = A.mean(dims, keepdim=True) + sigmas * A.std(dims, correction=0, keepdim=True)
    return weighted_sum((A > th).to(A.dtype).mean(dims), A).clamp(min=0)
