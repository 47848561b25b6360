"""ROAD, RemOve And Debias (Rong et al. 2022): remove the most (or least) relevant pixels of each map,
impute them from their neighbours, and read how the target's score changes.

Equal to pytorch-grad-cam's ``ROADMostRelevantFirst`` / ``ROADLeastRelevantFirst`` / ``ROADCombined``
on the same maps: the same percentile thresholds, the same imputation, and, with the same seed, the
same noise. Must not import any analysis: the maps are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import math

import torch
from torch import nn

from ...core.inputs import model_kwargs
from ...core.result import Result
from ...core.state import restored
from ...core.text import num, table
from ...errors import HookscopeError, checked
from .._targets import Target
from ._impute import impute
from ._maps import check_images, image_maps
from ._scoring import Scorer

__all__ = ["PERCENTILES", "RoadCurves", "RoadRow", "road"]

PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
_ORDERS = ("least", "most")  # pytorch-grad-cam's ROADCombined runs least relevant first first: same noise


@dataclass(frozen=True)
class RoadRow:
    """One percentile of :class:`RoadCurves` (a row of ``road.rows``), means over the images.

    Attributes:
        percentile: the map's percentile that splits removed from kept pixels.
        removed: the fraction of the pixels removed (most relevant first; least relevant first removes
            as many from the other end, up to ties).
        most: the score's change after removing the most relevant pixels (lower: a more faithful map).
        least: the score's change after removing the least relevant pixels (near 0: a more faithful map).
        combined: ``(least - most) / 2`` (higher: a more faithful map).
    """

    percentile: float
    removed: float
    most: float
    least: float
    combined: float


@dataclass
class RoadCurves(Result):
    """What :func:`road` returns: the score's change per image and percentile, both orders.

    Speaks hookscope's result protocol: ``rows`` (one :class:`RoadRow` per percentile), ``table()``
    (also ``str(road)``), ``to_dict()`` and ``to_json()``.

    Attributes:
        percentiles: the ``P`` percentiles.
        removed: ``B x P`` fractions of the pixels removed, most relevant first.
        most: ``B x P`` changes of the score, ``after - before``, most relevant removed first
            (pytorch-grad-cam's ``ROADMostRelevantFirst``).
        least: ``B x P`` changes, least relevant removed first (``ROADLeastRelevantFirst``).
        before: ``B`` scores of the images themselves.
        combined: ``B`` means over the percentiles of ``(least - most) / 2`` (``ROADCombined``).
        targets: ``B`` class indices scored, or ``None`` for a target function.
        score: ``"prob"`` or ``"logit"``.
        noise: the standard deviation of the noise added to the imputed pixels.
    """

    percentiles: torch.Tensor
    removed: torch.Tensor
    most: torch.Tensor
    least: torch.Tensor
    before: torch.Tensor
    combined: torch.Tensor
    targets: torch.Tensor | None
    score: str
    noise: float

    @property
    def rows(self) -> list[RoadRow]:
        """One row per percentile, each a mean over the images."""
        half = (self.least - self.most) / 2
        return [RoadRow(float(p), float(self.removed[:, i].mean()), float(self.most[:, i].mean()),
                        float(self.least[:, i].mean()), float(half[:, i].mean()))
                for i, p in enumerate(self.percentiles.tolist())]

    def table(self) -> str:
        """The percentiles as text, the mean over them last (also ``str(road)``).

        Example:
            >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
            >>> print(road(net, torch.rand(1, 1, 4, 4), torch.rand(1, 4, 4), target=0, percentiles=[50]))
            ... # doctest: +ELLIPSIS
            ROAD of 1 image, change of the prob after imputation (most relevant first: lower is better; ...)
            percentile  removed  most  least  combined
            ...
        """
        b = self.most.shape[0]
        body = [[num(r.percentile), f"{r.removed:.3f}", num(r.most), num(r.least), num(r.combined)] for r in self.rows]
        body.append(["mean", "", num(float(self.most.mean())), num(float(self.least.mean())),
                     num(float(self.combined.mean()))])
        title = (f"ROAD of {b} image{'s' if b != 1 else ''}, change of the {self.score} after imputation (most "
                 "relevant first: lower is better; least relevant first: nearer 0 is better; combined: higher)")
        return "\n".join([title, *table(["percentile", "removed", "most", "least", "combined"], body)])

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, tensors as they are (``to_json`` writes them as lists)."""
        return {"percentiles": self.percentiles, "removed": self.removed, "most": self.most, "least": self.least,
                "before": self.before, "combined": self.combined, "targets": self.targets, "score": self.score,
                "noise": self.noise}


def _percentiles(percentiles: Sequence[float]) -> torch.Tensor:
    try:
        p = torch.as_tensor(percentiles, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"percentiles={percentiles!r} must be numbers from 0 to 100, e.g. [10, 50, 90]") from None
    if p.numel() == 0:
        raise HookscopeError("percentiles is empty; pass at least one, e.g. percentiles=[50]")
    bad = ~((p >= 0) & (p <= 100))
    if bool(bad.any()):
        raise HookscopeError(f"percentile {float(p[bad][0])!r} is outside [0, 100]; ROAD's percentiles are of the "
                             "map's values, from 0 to 100")
    if bool((p == 0).any()):
        raise HookscopeError("percentile 0 removes every pixel, leaving nothing to impute them from; use "
                             "percentiles above 0, e.g. [10, 20, ..., 90]")
    return p


def removed_pixels(maps: torch.Tensor, percentile: float, order: str) -> torch.Tensor:
    """``B x H x W``: the pixels ROAD removes at ``percentile``: the ``N - ceil(p (N - 1) / 100)`` of
    the ``N`` pixels with the highest map values (most relevant first) or the lowest (least
    relevant first), ties broken in row-major order. Without ties at the cut these are exactly the
    pixels pytorch-grad-cam removes (those at or above numpy's linearly interpolated percentile).

    Example:
        >>> removed_pixels(torch.tensor([[[0.0, 1.0, 2.0, 3.0]]]), 50, "most").tolist()
        [[[False, False, True, True]]]
    """
    b, n = maps.shape[0], maps[0].numel()
    count = n - math.ceil(percentile * (n - 1) / 100)
    ranked = torch.argsort(maps.reshape(b, n), dim=1, descending=order == "most", stable=True)
    removed = torch.zeros(b, n, dtype=torch.bool, device=maps.device)
    removed.scatter_(1, ranked[:, :count], True)
    return removed.view(maps.shape)


def _noise(removed: torch.Tensor, channels: int, noise: float, generator: torch.Generator) -> torch.Tensor:
    """The noise of each image's imputed pixels, drawn as pytorch-grad-cam draws it: one
    ``channels x n`` draw per image (the layout its solver's answer has), pixels in row-major order."""
    b, h, w = removed.shape
    full = torch.zeros(b, channels, h * w)
    for i in range(b):
        where = removed[i].flatten().nonzero().squeeze(1).cpu()
        n = len(where)
        full[i][:, where] = noise * torch.randn(channels, n, generator=generator)
    return full.view(b, channels, h, w)


def _order_scores(scorer: Scorer, inputs: torch.Tensor, maps: torch.Tensor, p: torch.Tensor, order: str,
                  noise: float, generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``B x P`` score changes and fractions removed for one order."""
    b, c, h, w = inputs.shape
    changes, fractions = [], []
    rows = torch.arange(b, device=inputs.device)
    for percentile in p.tolist():
        removed = removed_pixels(maps, percentile, order)
        imputed = impute(inputs, removed)
        if noise:
            imputed = imputed + _noise(removed, c, noise, generator).to(inputs.device, inputs.dtype)
        scores = torch.cat([scorer(imputed[s:s + batch_size], rows[s:s + batch_size]) for s in range(0, b, batch_size)])
        changes.append(scores - scorer.before)
        fractions.append(removed.flatten(1).float().mean(1))
    return torch.stack(changes, 1), torch.stack(fractions, 1)


@checked
def road(
    model: nn.Module,
    inputs: torch.Tensor,
    maps: torch.Tensor,
    *,
    percentiles: Sequence[float] = PERCENTILES,
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    score: str = "prob",
    noise: float = 0.01,
    seed: int = 0,
    batch_size: int = 64,
    reduce: str = "abs_sum",
    kwargs: Mapping[str, Any] | None = None,
) -> RoadCurves:
    """ROAD (Rong et al. 2022): the score's change once the most, or the least, relevant pixels are
    removed and imputed from their neighbours, at several percentiles of each map.

    At percentile ``p``, most relevant first removes the pixels whose map value is above the map's
    ``p``-th percentile (``100 - p`` % of them: ``p=80`` removes the top fifth), least relevant first
    as many from the other end: pytorch-grad-cam's meaning of its ``percentile``. Ties at the cut
    are broken in row-major order, so that exactly that many pixels go (pytorch-grad-cam removes
    every pixel tied at the cut: all of them where a map's zeros fill more than ``p`` %, as ReLU'd
    CAM maps' often do, leaving its solver a singular system with nothing to impute from). Each
    removed pixel becomes the weighted mean of its eight neighbours (sides 1/6, corners 1/12), solved exactly with the kept pixels fixed, plus
    Gaussian noise of standard deviation ``noise``, so that the shape of the hole tells the model
    nothing. A faithful map makes the score fall when its most relevant pixels go (``most`` low) and
    stay when its least relevant go (``least`` near 0): ``combined = mean((least - most) / 2)``.

    Args:
        model: the classifier, run in eval mode under ``torch.no_grad()`` (every flag restored).
        inputs: ``B x C x H x W`` float images (never written to).
        maps: ``B x H x W`` saliency maps (larger: more relevant), or ``B x C x H x W`` attributions
            reduced over ``C`` by ``reduce``; maps of another size are upsampled bilinearly.
        percentiles: where to cut each map, each above 0 and at most 100.
        target: a class index, one per image, ``None`` (the class predicted on ``inputs``), or a
            function of the output giving one score per image (``score=`` then does not apply).
        output: how to read ``B x classes`` logits from the model's output.
        score: ``"prob"`` (softmax probability of the target) or ``"logit"``.
        noise: standard deviation of the noise on the imputed pixels (pytorch-grad-cam's 0.01);
            ``0`` for none.
        seed: seeds the noise (the caller's random stream is not used). pytorch-grad-cam draws the
            same noise from the global generator after ``torch.manual_seed(seed)``, least relevant
            first, then most relevant first, percentile by percentile, image by image.
        batch_size: how many imputed images go through the model at once.
        reduce: how ``B x C x H x W`` maps become ``B x H x W`` (``"abs_sum"``, ``"sum"``,
            ``"abs_max"``, ``"l2"``).
        kwargs: keyword inputs of the model; a tensor with ``B`` rows goes with its images.

    Returns:
        :class:`RoadCurves`.

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
        >>> x = torch.rand(2, 1, 4, 4)
        >>> res = road(net, x, x[:, 0], target=0, percentiles=[25, 75], score="logit")
        >>> res.most.shape, res.combined.shape, [r.percentile for r in res.rows]
        (torch.Size([2, 2]), torch.Size([2]), [25.0, 75.0])
    """
    inputs = check_images(inputs, "road")
    if not bool(torch.isfinite(inputs).all()):
        raise HookscopeError("road: the images hold NaN or infinite values, which no imputation can average; "
                             "fix or drop those images")
    p = _percentiles(percentiles)
    fitted = image_maps(maps, inputs, reduce, "road")
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
        raise HookscopeError(f"noise={noise!r} must be 0 or a positive standard deviation, e.g. noise=0.01")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size!r} must be a positive integer")
    generator = torch.Generator().manual_seed(seed)
    with restored(model, train=False), torch.no_grad():
        scorer = Scorer(model, inputs, target=target, output=output, score=score, kwargs=model_kwargs(kwargs),
                        what="road")
        found = {order: _order_scores(scorer, inputs, fitted, p, order, float(noise), generator, batch_size)
                 for order in _ORDERS}
    most, removed = found["most"]
    least = found["least"][0]
    return RoadCurves(percentiles=p.float(), removed=removed, most=most, least=least, before=scorer.before,
                      combined=((least - most) / 2).mean(1), targets=scorer.targets, score=score, noise=float(noise))
