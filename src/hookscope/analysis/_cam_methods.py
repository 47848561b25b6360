"""The per-method formulas of :func:`hookscope.analysis.cam.cam`: activations (and gradients) in, a raw map out.

Pure tensor code: no hook, no model state. ``A`` is a ``B x K x h x w`` activation, ``G`` the gradient
of each sample's score with respect to it, the same shape. Every function returns a ``B x h x w`` map.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["GRADIENT_METHODS", "gradient_map", "cam_map", "eigen_map", "score_weights", "weighted_sum"]

GRADIENT_METHODS = ("gradcam", "gradcam++", "xgradcam", "hirescam", "layercam")


def weighted_sum(weights: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[b, k] * A[b, k]``: ``B x K`` and ``B x K x h x w`` -> ``B x h x w``."""
    return torch.einsum("bk,bkhw->bhw", weights, A)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den != 0``, else 0 (no eps that would shift small values)."""
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def gradient_map(method: str, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The raw map of a gradient method, after its ReLU.

    - ``gradcam`` (Selvaraju et al. 2017): ``w_k = mean_ij G_kij``; ``relu(sum_k w_k A_k)``.
    - ``gradcam++`` (Chattopadhay et al. 2018, eq. 19 with the exponential-score closed form):
      ``alpha_kij = G_kij^2 / (2 G_kij^2 + (sum_ab A_kab) G_kij^3)`` (0 where the denominator is 0),
      ``w_k = sum_ij alpha_kij relu(G_kij)``; ``relu(sum_k w_k A_k)``. The paper's ``exp(S)`` factor is
      a positive constant per image, dropped here (min-max normalisation removes it). Neither peer
      agrees with the paper (bench/RESULTS.md): pytorch-grad-cam adds 1e-6 to the denominator,
      which dominates it where ``G^2`` is small (~3e-7 on an untrained resnet18: maps differ by
      5e-2); torchcam's ``alpha`` stays ``G^2`` (its division acts on a copy: 6e-2).
    - ``xgradcam`` (Fu et al. 2020): ``w_k = sum_ij A_kij G_kij / sum_ij A_kij`` (0 where the sum
      is 0); ``relu(sum_k w_k A_k)``.
    - ``hirescam`` (Draelos & Carin 2020): ``relu(sum_k G_k * A_k)``, element-wise.
    - ``layercam`` (Jiang et al. 2021): ``relu(sum_k relu(G_k) * A_k)``.

    Example:
        >>> A = torch.ones(1, 2, 2, 2); G = torch.tensor([1., -1.]).view(1, 2, 1, 1).expand(1, 2, 2, 2)
        >>> gradient_map("layercam", A, G)
        tensor([[[1., 1.],
                 [1., 1.]]])
    """
    if method == "gradcam":
        m = weighted_sum(G.mean((2, 3)), A)
    elif method == "gradcam++":
        g2 = G * G
        denom = 2 * g2 + A.sum((2, 3), keepdim=True) * g2 * G
        alpha = _safe_div(g2, denom)
        m = weighted_sum((alpha * G.clamp(min=0)).sum((2, 3)), A)
    elif method == "xgradcam":
        m = weighted_sum(_safe_div((A * G).sum((2, 3)), A.sum((2, 3))), A)
    elif method == "hirescam":
        m = (G * A).sum(1)
    elif method == "layercam":
        m = (G.clamp(min=0) * A).sum(1)
    else:  # pragma: no cover - cam() checks the name first
        raise ValueError(method)
    return m.clamp(min=0)


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


def _masks(acts: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``n x h x w`` activations -> ``n x 1 x H x W`` masks: upsampled, then min-max normalised each."""
    # align_corners=True as pytorch-grad-cam's UpsamplingBilinear2d, so masks (and maps) match it
    up = F.interpolate(acts.unsqueeze(1), size=size, mode="bilinear", align_corners=True)
    flat = up.flatten(1)
    lo, hi = flat.amin(1), flat.amax(1)
    return (up - lo.view(-1, 1, 1, 1)) / (hi - lo).view(-1, 1, 1, 1)


def _distinct_channels(A: torch.Tensor) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """One (sample, channel) per distinct non-constant mask, and each channel's index into that list.

    Masks are affine in the activation, so two channels whose activations are equal after min-max
    normalisation at their own resolution give equal masks; constant channels (all zero after a
    ReLU, say) all give the zero mask and get index -1.
    """
    B, K = A.shape[:2]
    flat = A.flatten(2)
    lo, hi = flat.amin(2, keepdim=True), flat.amax(2, keepdim=True)
    varying = (hi > lo).squeeze(2)
    unit = (flat - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    owner = torch.full((B, K), -1, dtype=torch.long)
    jobs: list[tuple[int, int]] = []
    for b in range(B):
        idx = varying[b].nonzero().flatten().cpu()
        if idx.numel() == 0:
            continue
        rows, inverse = torch.unique(unit[b, idx.to(A.device)], dim=0, return_inverse=True)
        inverse = inverse.cpu()
        first = torch.full((rows.shape[0],), K, dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(idx.numel()), reduce="amin")
        start = len(jobs)
        jobs.extend((b, int(k)) for k in idx[first])
        owner[b, idx] = start + inverse
    return jobs, owner


class _Progress:
    """Score-CAM's progress bar: tqdm when installed, else a one-line counter on stderr."""

    def __init__(self, total: int, done: int) -> None:
        self.total, self.done, self.bar = total, done, None
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm is optional
            self._print()
        else:
            self.bar = tqdm(total=total, initial=done, desc="scorecam", unit="batch")

    def _print(self) -> None:
        end = "" if self.done < self.total else "\n"
        print(f"\rscorecam: {self.done}/{self.total} batches", end=end, file=sys.stderr, flush=True)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        else:
            self._print()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_SHOW_AFTER = 5.0  # seconds: a run the first batch says will take longer gets a progress bar


def score_weights(
    scores: Scorer,
    inputs: torch.Tensor,
    A: torch.Tensor,
    *,
    batch_size: int,
    progress: bool | None,
) -> tuple[torch.Tensor, int, int]:
    """Score-CAM (Wang et al. 2020) channel weights ``B x K``, masked inputs scored, and model calls.

    ``H_k = minmax(up(A_k))`` (bilinear upsampling to the input size, then min-max to [0, 1]);
    ``s_k = score(X * H_k)``; ``w = softmax_k(s)`` (the paper's Algorithm 1, and pytorch-grad-cam;
    the paper's baseline term ``- f(X_b)`` is the same for every channel, so the softmax ignores it).
    Channels with equal masks share one forward; constant channels give the zero mask, whose input
    ``X * 0`` is the same for every image, so they cost one forward of a single zero image in all.
    ``scores(batch, rows)`` runs the model (no hooks) on masked inputs whose samples are ``rows``
    and returns one score per row; given a single input it scores it for every row.

    Example:
        >>> lin = torch.nn.Linear(4, 2)
        >>> scorer = lambda x, rows: lin(x.flatten(1))[:, 0].expand(len(rows))
        >>> w, masked, calls = score_weights(scorer, torch.ones(1, 1, 2, 2), torch.zeros(1, 3, 2, 2),
        ...                                  batch_size=8, progress=False)
        >>> w, masked, calls   # three constant channels: equal weights, one forward of the zero image
        (tensor([[0.3333, 0.3333, 0.3333]]), 1, 1)
    """
    with torch.no_grad():
        return _score_weights(scores, inputs, A, batch_size, progress)


def _score_weights(scorer: Scorer, inputs: torch.Tensor, A: torch.Tensor, batch_size: int,
                   progress: bool | None) -> tuple[torch.Tensor, int, int]:
    B, K = A.shape[:2]
    size = (inputs.shape[-2], inputs.shape[-1])
    jobs, owner = _distinct_channels(A)
    job_scores = torch.empty(len(jobs), device=A.device, dtype=torch.float32)
    n_batches = math.ceil(len(jobs) / batch_size)
    # On the CPU, oneDNN runs convolutions on channels-last inputs without reordering them each
    # call: 25 against 29 ms per masked resnet18 image here. A model that cannot take that layout
    # (a .view() of its input, say) gets contiguous inputs from its first failure on; that failed
    # first batch ran part of the model once more (its hooks and stateful modules see it).
    layout = torch.channels_last if inputs.dim() == 4 and inputs.device.type == "cpu" else None
    bar: _Progress | None = None
    calls, started = 0, time.perf_counter()
    try:
        for i in range(n_batches):
            chunk = jobs[i * batch_size:(i + 1) * batch_size]
            jb = torch.tensor([b for b, _ in chunk], device=A.device)
            jk = torch.tensor([k for _, k in chunk], device=A.device)
            batch = inputs[jb] * _masks(A[jb, jk], size).to(inputs.dtype)
            if layout is not None:
                try:
                    calls += 1
                    got = scorer(batch.contiguous(memory_format=layout), jb)
                except RuntimeError:
                    layout = None
            if layout is None:
                calls += 1
                got = scorer(batch, jb)
            job_scores[i * batch_size:i * batch_size + len(chunk)] = got
            if bar is not None:
                bar.step()
            elif progress or (progress is None and sys.stderr.isatty()  # no bar in logs and pipes
                              and (time.perf_counter() - started) * n_batches > _SHOW_AFTER):
                bar = _Progress(n_batches, i + 1)
    finally:
        if bar is not None:
            bar.close()
    runs = len(jobs)
    scores = torch.empty(B, K, device=A.device, dtype=torch.float32)
    owner = owner.to(A.device)
    known = owner >= 0
    if len(jobs):
        scores[known] = job_scores[owner[known]]
    if not bool(known.all()):
        zero = scorer(torch.zeros_like(inputs[:1]), torch.arange(B, device=A.device)).to(scores.dtype)
        scores = torch.where(known, scores, zero.unsqueeze(1))
        runs, calls = runs + 1, calls + 1
    return torch.softmax(scores, dim=1).to(A.dtype), runs, calls
