"""Score-CAM (Wang et al. 2020): channel weights from the scores of the input masked by each channel.

Masked inputs run in batches under ``no_grad``, without hooks; channels with equal masks share one forward.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ...core.inputs import private
from .._targets import Target, call_model, for_rows, per_sample, read_logits, rows_of, user_scores
from ._shape import upsample

__all__ = ["Scorer", "flat_scores", "score_weights", "scorer"]


def _masks(acts: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """``n x ...`` activations -> ``n x 1 x ...`` masks at the input's size: upsampled, then min-max normalised each."""
    # align_corners=True as pytorch-grad-cam's UpsamplingBilinear2d, so masks (and maps) match it
    up = upsample(acts.unsqueeze(1), size, align_corners=True)
    flat = up.flatten(1)
    lo, hi = flat.amin(1), flat.amax(1)
    shape = (-1, *([1] * (up.ndim - 1)))
    return (up - lo.view(shape)) / (hi - lo).view(shape)


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

    ``H_k = minmax(up(A_k))`` ((bi/tri)linear upsampling to the input size, then min-max to [0, 1]);
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


def _score_weights(score_of: Scorer, inputs: torch.Tensor, A: torch.Tensor, batch_size: int,
                   progress: bool | None) -> tuple[torch.Tensor, int, int]:
    B, K = A.shape[:2]
    size = tuple(inputs.shape[2:])
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
                    got = score_of(batch.contiguous(memory_format=layout), jb)
                except RuntimeError:
                    layout = None
            if layout is None:
                calls += 1
                got = score_of(batch, jb)
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
        zero = score_of(torch.zeros_like(inputs[:1]), torch.arange(B, device=A.device)).to(scores.dtype)
        scores = torch.where(known, scores, zero.unsqueeze(1))
        runs, calls = runs + 1, calls + 1
    return torch.softmax(scores, dim=1).to(A.dtype), runs, calls


def scorer(model: nn.Module, target: Target, output: Callable[[Any], torch.Tensor] | None,
           targets: torch.Tensor | None, kw: dict[str, Any], B: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Score-CAM's scores of a batch of masked inputs; ``rows`` are their samples (one input: every row)."""
    # keyword inputs, or a target's data (hookscope.targets), with a row per sample go with each masked input
    spread = per_sample(kw, B) or callable(getattr(target, "take", None))

    def scores(batch: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if spread and batch.shape[0] != len(rows):  # the zero image differs per sample only by its kwargs
            batch = batch.expand(len(rows), *batch.shape[1:]).contiguous()  # rows the model may write
        out = call_model(model, (batch,), private(rows_of(kw, rows, B) if spread else kw))
        n = batch.shape[0]
        if targets is None:  # a target function, which scores each row on its own
            fn = cast(Callable[[Any], Any], for_rows(target, rows))
            return user_scores(fn, output, out, n, f"a batch of {n} masked inputs").float().expand(len(rows))
        logits = read_logits(output, out, n).float()
        return logits.expand(len(rows), -1).gather(1, targets[rows].unsqueeze(1)).squeeze(1)

    return scores


def flat_scores(name: str, weights: torch.Tensor) -> str | None:
    """One line when every masked input of a sample scored the same (softmax weights all equal, exactly): its
    Score-CAM map is then the plain sum of the channels, whatever the target."""
    flat = ((weights.amax(1) == weights.amin(1)) if weights.shape[1] > 1 else torch.zeros(0, dtype=torch.bool))
    dead = flat.nonzero().flatten().tolist()
    if not dead:
        return None
    return (f"every masked input of sample{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} scores the "
            f"same at layer {name!r}, so all channels weigh the same and the map is the sum of the activations, "
            "not the target's; an untrained or zero-initialised head (all logits equal)?")
