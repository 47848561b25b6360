"""The CAM methods that differentiate twice or score a difference of classes: Shapley-CAM and Finer-CAM."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...errors import HookscopeError
from ._formulas import safe_div, spatial
from ._shape import as_4d

__all__ = ["finer_score", "shapley_weights"]

DEFAULT_RANKS = (1, 2, 3)  # Finer-CAM's comparison classes: the three whose logits are nearest the target's


def shapley_weights(acts: dict[str, torch.Tensor], score: torch.Tensor,
                    shapers: dict[str, Callable[[torch.Tensor], torch.Tensor] | None],
                    coupled: str | None, rank: int = 2) -> dict[str, torch.Tensor]:
    """Shapley-CAM (Cai 2025) channel weights per layer, ``B x K``: ``mean(G - H A / 2)`` over the positions.

    ``G = d score / d A`` and ``H A`` the Hessian-vector product of the score at ``A`` along ``A`` itself
    (``d (G . v) / d A`` with ``v = A`` held fixed), as pytorch-grad-cam's ``ShapleyCAM``. Where the
    score is piecewise linear in ``A`` (ReLU networks, batch norm in eval mode) ``H A`` is zero and the
    weights are Grad-CAM's. One gradient of the summed scores, or one per sample when the samples of a
    batch interact (``coupled``).
    """
    names, B = list(acts), score.shape[0]
    rounds = [score.sum()] if coupled is None or B == 1 else list(score.unbind())
    out: dict[str, torch.Tensor] = {}
    for b, s in enumerate(rounds):
        grads = (torch.autograd.grad(s, [acts[n] for n in names], allow_unused=True, create_graph=True)
                 if s.requires_grad else (None,) * len(names))
        for n, g in zip(names, grads):
            if g is None:
                raise HookscopeError(f"layer {n!r}'s output does not reach the target score (no gradient "
                                     "flows back to it); pick a layer the score depends on")
            hv = (torch.autograd.grad(g, acts[n], grad_outputs=acts[n].detach(), retain_graph=True,
                                      allow_unused=True)[0] if g.requires_grad else None)
            G = as_4d(n, g.detach(), shapers[n], B, rank)
            HA = torch.zeros_like(G) if hv is None else as_4d(n, hv.detach(), shapers[n], B, rank)
            W = (G - 0.5 * HA).float() if G.dtype != torch.float64 else G - 0.5 * HA
            w = W.mean(spatial(W))
            if len(rounds) == 1:
                out[n] = w
            else:
                out.setdefault(n, torch.zeros_like(w))[b] = w[b]
    return out


def finer_score(logits: torch.Tensor, targets: torch.Tensor, ranks: Sequence[int] | None, alpha: float) -> torch.Tensor:
    """Finer-CAM's score (Zhang et al. 2025): the target's logit against those of the classes nearest it.

    Per sample, the other classes are ranked by ``|y_j - y_c|`` (1: the nearest); for the classes at
    ``ranks`` (``None``: 1, 2 and 3, fewer when the model has fewer other classes)
    ``score = sum_j p_j (y_c - alpha y_j) / sum_j p_j`` with ``p = softmax(y)``, the probabilities kept
    in the graph, as pytorch-grad-cam's ``FinerWeightedTarget`` (which adds 1e-9 to the denominator).

    Example:
        >>> y = torch.tensor([[3.0, 2.0, 0.0]], requires_grad=True)
        >>> finer_score(y, torch.tensor([0]), [1], 1.0)   # 3 - 2, the nearest class 1
        tensor([1.], grad_fn=<...>)
    """
    B, C = logits.shape
    if ranks is None:
        ranks = DEFAULT_RANKS[:max(C - 1, 0)]
    if not ranks:
        raise HookscopeError(f"finercam compares the target with other classes, and a model of {C} class has none; "
                             "use method='gradcam'")
    if max(ranks) > C - 1:
        raise HookscopeError(f"comparison={list(ranks)} asks for the class ranked {max(ranks)} nearest the target, "
                             f"but the model has {C - 1} other classes; pass ranks from 1 to {C - 1}")
    y = logits.float() if logits.dtype != torch.float64 else logits
    yc = y.gather(1, targets.unsqueeze(1))
    dist = (y - yc).abs().detach().scatter(1, targets.unsqueeze(1), float("inf"))  # the target itself last
    nearest = dist.argsort(dim=1, stable=True)[:, [r - 1 for r in ranks]]
    p = torch.softmax(y, 1).gather(1, nearest)
    return safe_div((p * (yc - alpha * y.gather(1, nearest))).sum(1), p.sum(1))
