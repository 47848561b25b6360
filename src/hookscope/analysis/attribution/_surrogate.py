"""KernelSHAP and LIME: random coalitions of features scored (``_perturb``'s runs), and a linear model of
which features are kept fitted to the scores, in torch, in float64: KernelSHAP by weighted least
squares held to ``sum = f(x) - f(baseline)``, LIME by ridge regression weighted by similarity.

Coalitions are drawn as captum draws them, sample after sample from one generator, so that
``torch.manual_seed(seed)`` before captum's ``KernelShap`` or ``Lime`` gives the same ones.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F

from ._engine import Job, Pass
from ._features import feature_labels
from ._perturb import Made, Space, expand, generator, what_of

__all__ = ["kernel_shap", "lime", "ridge", "shapley_kernel_fit"]


def _kernel_coalitions(K: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` coalitions of ``K`` features (1: kept) and their weights: the full and the empty one first, then
    sizes drawn from the Shapley kernel's distribution, ``(K - 1) / (k (K - k))``, each of weight 1; or,
    where ``n`` reaches ``2**K``, every coalition once with its kernel weight."""
    if n >= 2 ** K or K < 2:
        every = torch.tensor(list(itertools.product((0, 1), repeat=K)), dtype=torch.float64).view(-1, K)
        k = every.sum(1)
        inner = (k > 0) & (k < K)
        w = torch.zeros(len(every), dtype=torch.float64)
        if K > 1:
            w[inner] = (K - 1) / (torch.tensor([math.comb(K, int(c)) for c in k[inner]], dtype=torch.float64)
                                  * k[inner] * (K - k[inner]))
        return every, w
    size = torch.arange(K, dtype=torch.float)
    probs = torch.tensor(K - 1) / (size * (K - size))
    probs[0] = 0.0
    probs = probs / probs.sum(-1, keepdim=True)  # as torch.distributions.Categorical holds them
    rows = [torch.ones(K), torch.zeros(K)]
    for _ in range(n - 2):
        chosen = int(torch.multinomial(probs.view(1, -1), 1, True, generator=g).item())
        r = torch.randn(1, K, generator=g)
        threshold = torch.kthvalue(r, K - chosen).values.item()
        rows.append((r > threshold).view(-1).float())
    z = torch.stack(rows).to(torch.float64)
    w = torch.ones(n, dtype=torch.float64)
    w[:2] = 0.0  # the two ends are held exactly, not fitted
    return z, w


def shapley_kernel_fit(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, full: float, empty: float) -> torch.Tensor:
    """The ``K`` values ``phi`` minimising ``sum_i w_i (y_i - empty - z_i . phi)^2`` with ``sum(phi) = full -
    empty`` (the last value eliminated; the least-norm solution where the coalitions leave it open).

    Example:
        >>> z = torch.tensor([[1., 0.], [0., 1.]], dtype=torch.float64)
        >>> phi = shapley_kernel_fit(z, torch.tensor([1., 2.], dtype=torch.float64),
        ...                          torch.ones(2, dtype=torch.float64), full=3.0, empty=0.0)
        >>> [round(v, 6) for v in phi.tolist()]
        [1.0, 2.0]
    """
    K, gap = z.shape[1], full - empty
    if K == 1:
        return torch.tensor([gap], dtype=torch.float64)
    used = w > 0
    if not bool(used.any()):
        return torch.full((K,), gap / K, dtype=torch.float64)
    zu, yu, root = z[used], y[used], w[used].sqrt().unsqueeze(1)
    a = (zu[:, :-1] - zu[:, -1:]) * root
    t = (yu - empty - zu[:, -1] * gap).unsqueeze(1) * root
    head = (torch.linalg.pinv(a) @ t).view(-1)
    return torch.cat([head, (gap - head.sum()).view(1)])


def ridge(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """The coefficients of ``y ~ b + z . beta`` by weighted ridge regression, the intercept free: scikit-learn's
    ``Ridge(alpha).fit(z, y, sample_weight=w).coef_``.

    Example:
        >>> z = torch.tensor([[0., 0.], [1., 0.], [0., 1.], [1., 1.]], dtype=torch.float64)
        >>> beta = ridge(z, 1 + z @ torch.tensor([2., -1.], dtype=torch.float64), torch.ones(4, dtype=torch.float64), 0.0)
        >>> [round(v, 6) for v in beta.tolist()]
        [2.0, -1.0]
    """
    total = w.sum()
    zc = z - (w @ z) / total
    yc = y - (w @ y) / total
    gram = zc.T @ (zc * w.unsqueeze(1)) + alpha * torch.eye(z.shape[1], dtype=z.dtype)
    beta: torch.Tensor = torch.linalg.pinv(gram) @ (zc.T @ (w * yc))
    return beta


def _perturbed(space: Space, coalitions: torch.Tensor, who: torch.Tensor, labels: torch.Tensor,
               base: torch.Tensor) -> Any:
    """The build of ``space.scores``: copy ``i`` keeps the features ``coalitions[i]`` of sample ``who[i]``."""
    dev = space.value.device
    co, who = coalitions.to(dev).bool(), who.to(dev)

    def build(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = who[lo:hi]
        lab = labels[b]
        kept = co[lo:hi].gather(1, lab.reshape(hi - lo, -1)).view(lab.shape)
        return torch.where(kept, space.value[b], base[b]), b

    return build


def kernel_shap(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "kernel_shap")
    V, B = space.value, space.value.shape[0]
    base = space.baseline(method.baseline)
    labels, counts = feature_labels(method.features, V, what_of(job))
    K, g = max(counts), generator(method.seed)
    drawn = [_kernel_coalitions(counts[b], method.samples, g) for b in range(B)]
    full = [z.bool().all(1) for z, _ in drawn]  # the full coalition's score is f(x), known: not scored again
    padded = torch.cat([F.pad(z[~f], (0, K - z.shape[1])) for (z, _), f in zip(drawn, full)])
    who = torch.cat([torch.full((int((~f).sum()),), b, dtype=torch.long) for b, f in enumerate(full)])
    scores = space.scores(len(who), _perturbed(space, padded, who, labels, base)).cpu()
    f0 = space.f0.to(torch.float64).cpu()
    per = torch.zeros(B, K, dtype=torch.float64)
    f_base = torch.zeros(B, dtype=torch.float64)
    at = 0
    for b, ((z, w), f) in enumerate(zip(drawn, full)):
        y = torch.empty(len(z), dtype=torch.float64)
        y[f], m = f0[b], int((~f).sum())
        y[~f] = scores[at:at + m]
        at += m
        f_base[b] = y[z.sum(1) == 0][0]
        per[b, :counts[b]] = shapley_kernel_fit(z, y, w, float(f0[b]), float(f_base[b]))
    delta = (f0 - f_base - per.sum(1)).to(V.device)
    return expand(per.to(V.device), labels, V), delta, space.forwards


def lime(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "lime")
    V, B = space.value, space.value.shape[0]
    base = space.baseline(method.baseline)
    labels, counts = feature_labels(method.features, V, what_of(job))
    K, n, g = max(counts), method.samples, generator(method.seed)
    drawn = []
    for b in range(B):  # captum's draw: each coalition on its own, sample after sample
        half = torch.full((1, counts[b]), 0.5)
        drawn.append(torch.cat([torch.bernoulli(half, generator=g) for _ in range(n)]).to(torch.float64))
    padded = torch.cat([F.pad(z, (0, K - z.shape[1])) for z in drawn])
    who = torch.arange(B).repeat_interleave(n)
    build = _perturbed(space, padded, who, labels, base)
    similar: list[torch.Tensor] = []

    def weighed(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        copies, b = build(lo, hi)
        similar.append(_similarity(V[b], copies, method.distance, method.kernel_width))
        return copies, b

    scores = space.scores(len(who), weighed).cpu()
    weights = torch.cat(similar).cpu()
    per = torch.zeros(B, K, dtype=torch.float64)
    for b in range(B):
        rows = slice(b * n, (b + 1) * n)
        per[b, :counts[b]] = ridge(drawn[b], scores[rows], weights[rows], float(method.alpha))
    return expand(per.to(V.device), labels, V), None, space.forwards


def _similarity(x: torch.Tensor, copies: torch.Tensor, distance: str, width: float) -> torch.Tensor:
    """captum's exponential kernel ``exp(-d^2 / (2 w^2))`` of each copy's distance to its sample, flattened."""
    a, c = x.flatten(1).double(), copies.flatten(1).double()
    d = 1 - F.cosine_similarity(a, c, dim=1, eps=1e-8) if distance == "cosine" else (a - c).norm(dim=1)
    return torch.exp(-(d ** 2) / (2 * width ** 2))
