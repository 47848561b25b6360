"""How faithful a saliency map is: deletion / insertion curves and the (energy-based) pointing game.

Maps are plain tensors (``B x H x W``), so any saliency method can be scored, not only
:func:`hookscope.cam`: attribution maps of images (``B x C x H x W``, :func:`hookscope.attribute`) are
reduced over their channels first, as ``reduce=`` says (by default the sum of absolute values).
Also at the short path :mod:`hookscope.metrics`. The curves only call the model, under
``torch.no_grad()``, in eval mode (every submodule's flag, and the random generator, are restored
afterwards), and always on tensors of their own: a model that writes into its input never changes
the caller's images. Nothing here registers a hook; a failing forward pass is one
:class:`~hookscope.ForwardError` naming the module it failed in.

One file past 500 lines: the curves and the pointing game share the checks of maps, masks and batches, and
the rules for running the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import nn

from .._tree import tree_map
from ..core.inputs import model_kwargs, private
from ..core.result import Result
from ..core.state import restored
from ..core.text import num, table
from ..errors import HookscopeError, checked, did_you_mean
from ._targets import (Target, anchored, batch_coupled, call_model, check_range, class_index_of, class_targets,
                       is_function, read_logits, rows_of, user_scores)

__all__ = [
    "Curve",
    "CurveRow",
    "deletion",
    "insertion",
    "pointing_game",
    "energy_pointing_game",
    "box_mask",
    "blur",
    "BASELINES",
    "REDUCTIONS",
    "SCORES",
]

BASELINES = ("zeros", "blur", "mean")
SCORES = ("prob", "logit")
REDUCTIONS = ("abs_sum", "sum", "abs_max", "l2")  # how B x C x H x W maps become B x H x W
_BLUR_SIZE, _BLUR_SIGMA = 11, 5.0  # RISE's insertion substrate: an 11 x 11 Gaussian, sigma 5

Baseline = Union[str, float, torch.Tensor, None]


@dataclass(frozen=True)
class CurveRow:
    """One step of a :class:`Curve` (a row of ``curve.rows``).

    Attributes:
        step: the step, from 0 to ``steps``.
        fraction: the fraction of the pixels removed (deletion) or inserted (insertion).
        mean: the mean score over the images.
        scores: each image's score.
    """

    step: int
    fraction: float
    mean: float
    scores: tuple[float, ...]


_SHOWN = 8  # images with a column of their own in Curve.table()


@dataclass
class Curve(Result):
    """A deletion or insertion curve per image, and its area.

    Speaks hookscope's result protocol: ``rows`` (one :class:`CurveRow` per step), ``table()``
    (also ``str(curve)``), ``to_dict()`` (the tensors as they are) and ``to_json()`` (the same,
    tensors as lists: a curve is small).

    Attributes:
        kind: ``"deletion"`` or ``"insertion"``.
        fractions: ``steps + 1`` fractions of the pixels removed (deletion) or inserted (insertion),
            from 0 to 1.
        scores: ``B x (steps + 1)`` score of the target at each fraction.
        auc: ``B`` areas under the curves (trapezoid rule over ``fractions``). Lower is better for
            deletion, higher for insertion.
        targets: ``B`` class indices scored, or ``None`` when the target was a callable.
    """

    kind: str
    fractions: torch.Tensor
    scores: torch.Tensor
    auc: torch.Tensor
    targets: torch.Tensor | None

    @property
    def rows(self) -> list[CurveRow]:
        """One row per step: the fraction, the mean score over the images, each image's score."""
        per_step = self.scores.t().tolist()
        means = self.scores.mean(0).tolist() if self.scores.shape[0] else [float("nan")] * len(per_step)
        return [CurveRow(i, f, m, tuple(s))
                for i, (f, m, s) in enumerate(zip(self.fractions.tolist(), means, per_step))]

    def table(self) -> str:
        """The curve as text: one line per step, the area under it last (also ``str(curve)``).

        Example:
            >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
            >>> with torch.no_grad():
            ...     _ = net[1].weight.fill_(1.0), net[1].bias.zero_()
            >>> print(deletion(net, torch.ones(1, 1, 2, 2), torch.rand(1, 2, 2), steps=2, score="logit"))
            deletion curve of 1 image (lower area is better)
            step  fraction  mean  image 0
            -----------------------------
               0     0.000     4        4
               1     0.500     2        2
               2     1.000     0        0
             auc               2        2
        """
        b = self.scores.shape[0]
        shown = min(b, _SHOWN)
        head = ["step", "fraction", "mean", *(f"image {i}" for i in range(shown))]
        body = [[str(r.step), f"{r.fraction:.3f}", num(r.mean), *(num(v) for v in r.scores[:shown])]
                for r in self.rows]
        aucs = self.auc.tolist()
        body.append(["auc", "", num(sum(aucs) / b) if b else "-", *(num(v) for v in aucs[:shown])])
        better = "lower" if self.kind == "deletion" else "higher"
        more = f"; the first {shown} shown" if b > shown else ""
        title = f"{self.kind} curve of {b} image{'s' if b != 1 else ''} ({better} area is better{more})"
        return "\n".join([title, *table(head, body)])

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, tensors as they are (``to_json`` writes them as lists).

        Example:
            >>> import json
            >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
            >>> curve = deletion(net, torch.rand(2, 1, 2, 2), torch.rand(2, 2, 2), target=0, steps=2)
            >>> sorted(curve.to_dict()), json.loads(curve.to_json())["fractions"]
            (['auc', 'fractions', 'kind', 'scores', 'targets'], [0.0, 0.5, 1.0])
        """
        return {"kind": self.kind, "fractions": self.fractions, "scores": self.scores, "auc": self.auc,
                "targets": self.targets}


@checked
def deletion(
    model: nn.Module,
    inputs: torch.Tensor,
    maps: torch.Tensor,
    *,
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 100,
    baseline: Baseline = "zeros",
    score: str = "prob",
    batch_size: int = 64,
    reduce: str = "abs_sum",
    kwargs: Mapping[str, Any] | None = None,
) -> Curve:
    """Deletion curve (RISE, Petsiuk et al. 2018): remove the most salient pixels first.

    At step ``i`` of ``steps``, the ``floor(i * H * W / steps)`` pixels with the highest map values
    (all channels; ties in row-major order) are replaced by the baseline, and the target's score is
    read. A faithful map makes the score fall fast: ``auc = trapezoid(scores, fractions)`` is low.

    Args:
        model: the classifier. It is run in eval mode under ``torch.no_grad()``; every submodule's
            training flag is restored afterwards.
        inputs: ``B x C x H x W`` images, on the model's device (never written to: the model gets
            copies, even for ``target=None``). Integer images get integer baselines (rounded).
        maps: ``B x H x W`` saliency maps, larger = more important, or ``B x C x H x W`` maps
            (attributions of each input value, :func:`hookscope.attribute`) reduced over ``C`` as
            ``reduce=`` says. Maps of another size are upsampled bilinearly to ``H x W``.
        target: class index for every image, one index per image (sequence or tensor), ``None``
            for the class the model predicts on ``inputs`` (one extra forward), or a callable that
            gets the model's output for the ``B`` images of one step and returns ``B`` scores
            (``score=`` is then not applied), such as the targets of :mod:`hookscope.targets`
            (``Class(3)``, which has a ``class_index``, is ``3``: ``score=`` applies). A
            target with an ``anchor`` method is anchored on the model's output for ``inputs``
            first (one extra forward): a predicted region stays where it was on the inputs, a box
            found there scores 0 once the model no longer detects it.
        output: how to get ``N x classes`` logits from the model's output (tuples, dicts, Hugging
            Face ``ModelOutput``), for example ``lambda out: out.logits``.
        steps: number of deletion steps; the curve has ``steps + 1`` points.
        baseline: what replaces a deleted pixel: ``"zeros"`` (RISE's choice for deletion),
            ``"blur"`` (the image blurred by an 11 x 11 Gaussian of sigma 5), ``"mean"`` (each
            image's per-channel mean), a number, or a tensor broadcastable to ``inputs``.
        score: ``"prob"`` (softmax probability of the target, as in RISE) or ``"logit"``.
        batch_size: how many modified images go through the model at once.
        reduce: how ``B x C x H x W`` maps become one value per pixel: ``"abs_sum"`` (the sum of the
            channels' absolute values: how much the pixel matters, whatever the sign), ``"sum"`` (the
            signed sum: positive evidence first), ``"abs_max"`` (the largest absolute value, as
            Simonyan et al.'s saliency) or ``"l2"`` (the norm over channels). ``B x H x W`` maps are
            taken as they are.
        kwargs: keyword inputs of the model; a tensor with ``B`` rows goes with its images, so each
            modified image gets the rows of the image it was made from.

    Returns:
        A :class:`Curve`.

    Raises:
        ForwardError: the model's forward pass failed (one line: the module, what it received).

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(1, 1, 2, 2)
        >>> curve = deletion(net, x, x[:, 0], steps=4, score="logit")
        >>> curve.scores.shape, curve.fractions.tolist()
        (torch.Size([1, 5]), [0.0, 0.25, 0.5, 0.75, 1.0])
    """
    return _curve("deletion", model, inputs, _flat_maps(maps, reduce, "deletion"), target, output, steps,
                  baseline, score, batch_size, model_kwargs(kwargs))


@checked
def insertion(
    model: nn.Module,
    inputs: torch.Tensor,
    maps: torch.Tensor,
    *,
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 100,
    baseline: Baseline = "blur",
    score: str = "prob",
    batch_size: int = 64,
    reduce: str = "abs_sum",
    kwargs: Mapping[str, Any] | None = None,
) -> Curve:
    """Insertion curve (RISE, Petsiuk et al. 2018): put the most salient pixels back first.

    Starts from the baseline (by default the blurred image, as in RISE) and, at step ``i`` of
    ``steps``, restores the ``floor(i * H * W / steps)`` pixels with the highest map values. A
    faithful map makes the score rise fast: ``auc = trapezoid(scores, fractions)`` is high.
    Arguments as in :func:`deletion`.

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(2, 1, 2, 2)
        >>> insertion(net, x, x[:, 0], target=[0, 1], steps=2, baseline="zeros").auc.shape
        torch.Size([2])
    """
    return _curve("insertion", model, inputs, _flat_maps(maps, reduce, "insertion"), target, output, steps,
                  baseline, score, batch_size, model_kwargs(kwargs))


def _curve(
    kind: str,
    model: nn.Module,
    inputs: torch.Tensor,
    maps: torch.Tensor,
    target: Target,
    output: Callable[[Any], torch.Tensor] | None,
    steps: int,
    baseline: Baseline,
    score: str,
    batch_size: int,
    kw: dict[str, Any],
) -> Curve:
    _check_curve(kind, inputs, steps, batch_size, score)
    target = class_index_of(target)  # target=Class(3) is target=3: score= applies, targets filled
    b, _, h, w = inputs.shape
    coupled = batch_coupled(model)
    if coupled is not None and (b > 1 or batch_size > 1):
        raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so a score "
                             "would depend on the other images in its batch; pass one image with batch_size=1")
    saliency = _fit_maps(maps, b, h, w, inputs.device)
    substrate = _substrate(baseline, inputs)
    counts = torch.tensor([(i * h * w) // steps for i in range(steps + 1)], device=inputs.device)
    fractions = counts.to(torch.float32) / (h * w)
    if b == 0:  # no image: an empty curve, and no model call
        none = torch.zeros(0, dtype=torch.long)
        targets = None if is_function(target) else none if target is None else class_targets(target, 0)
        return Curve(kind=kind, fractions=fractions, scores=torch.zeros(0, steps + 1), auc=torch.zeros(0),
                     targets=targets)
    # rank[b, p]: position of pixel p in decreasing saliency (stable, so ties go in row-major order)
    order = torch.argsort(saliency.reshape(b, h * w), dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(h * w, device=inputs.device).expand(b, h * w))
    with restored(model, train=False), torch.no_grad():
        target = _anchor(model, inputs, kw, target, output)
        targets = None if is_function(target) else _curve_targets(model, inputs, kw, target, output)
        scores = _step_scores(kind, model, inputs, kw, substrate, rank, counts, target, targets, output, score,
                              batch_size)
    auc = torch.trapezoid(scores, fractions.to(scores.device), dim=1)
    return Curve(kind=kind, fractions=fractions, scores=scores, auc=auc, targets=targets)


def _check_curve(kind: str, inputs: torch.Tensor, steps: int, batch_size: int, score: str) -> None:
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4:
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(
            f"{kind} needs images of shape B x C x H x W, got {shape}; add the missing dimensions"
        )
    if inputs.shape[2] * inputs.shape[3] == 0:
        raise HookscopeError(f"{kind} needs images with pixels, got H x W = {inputs.shape[2]} x {inputs.shape[3]}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise HookscopeError(f"steps={steps!r} must be a positive integer, for example steps=100")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size!r} must be a positive integer")
    if score not in SCORES:
        raise HookscopeError(f"score={score!r} is not a score.{did_you_mean(str(score), SCORES)} Use 'prob' or 'logit'")


def _step_scores(kind: str, model: nn.Module, inputs: torch.Tensor, kw: dict[str, Any], substrate: torch.Tensor,
                 rank: torch.Tensor, counts: torch.Tensor, target: Target, targets: torch.Tensor | None,
                 output: Callable[[Any], torch.Tensor] | None, score: str, batch_size: int) -> torch.Tensor:
    """``B x (steps + 1)`` scores; every batch the model sees is built here, never the caller's tensor."""
    b, _, h, w = inputs.shape
    rows = len(counts) * b  # row r: step r // b of image r % b
    chunk = batch_size if targets is not None else max(1, batch_size // b) * b
    parts = []
    for start in range(0, rows, chunk):
        r = torch.arange(start, min(start + chunk, rows), device=inputs.device)
        step, img = r // b, r % b
        removed = (rank[img] < counts[step].unsqueeze(1)).view(-1, 1, h, w)
        x, base = inputs[img], substrate[img]
        batch = torch.where(removed, base, x) if kind == "deletion" else torch.where(removed, x, base)
        out = call_model(model, (batch,), private(rows_of(kw, img, b)))
        if targets is None:
            parts.append(_call_target(target, output, out, len(r) // b, b))  # type: ignore[arg-type]
        else:
            logits = read_logits(output, out, len(r))
            if start == 0:  # once, before any score is read
                check_range(targets, logits.shape[1])
            parts.append(_score(logits, targets[img], score))
    return torch.cat(parts).reshape(len(counts), b).t().to(torch.float32)


_REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "abs_sum": lambda m: m.abs().sum(1), "sum": lambda m: m.sum(1), "abs_max": lambda m: m.abs().amax(1),
    "l2": lambda m: torch.linalg.vector_norm(m, dim=1),
}


def _flat_maps(maps: Any, reduce: str, what: str) -> Any:
    """``B x C x H x W`` maps reduced over their channels by ``reduce``; any other map as it is."""
    if reduce not in _REDUCE:
        hint = did_you_mean(reduce, REDUCTIONS) if isinstance(reduce, str) else ""
        raise HookscopeError(f"reduce={reduce!r} is not a reduction over channels.{hint} Use one of "
                             f"{', '.join(REDUCTIONS)}")
    if not isinstance(maps, torch.Tensor) or maps.dim() != 4:
        return maps
    if not maps.is_floating_point():
        maps = maps.float()
    _no_nan(maps, f"{what}: maps")
    return _REDUCE[reduce](maps.detach())


def _fit_maps(maps: torch.Tensor, b: int, h: int, w: int, device: torch.device) -> torch.Tensor:
    if not isinstance(maps, torch.Tensor):
        raise HookscopeError(f"maps must be a B x H x W tensor, got {type(maps).__name__}")
    if maps.dim() != 3 or maps.shape[0] != b:
        raise HookscopeError(
            f"maps of shape {tuple(maps.shape)} do not fit {b} images; pass one map per image, "
            f"B x H x W = {b} x {h} x {w}"
        )
    _no_nan(maps, "maps")
    maps = maps.detach().to(device=device, dtype=torch.float32)
    if maps.shape[1:] != (h, w):
        maps = F.interpolate(maps[:, None], size=(h, w), mode="bilinear", align_corners=False)[:, 0]
    return maps


def _no_nan(t: torch.Tensor, what: str) -> None:
    if t.is_floating_point() and bool(t.isnan().any()):
        i = int(t.isnan().flatten(1).any(1).nonzero()[0, 0]) if t.dim() > 1 else 0
        raise HookscopeError(f"{what} hold NaN (image {i}), which has no rank; fix or drop that image's map")


def _like(values: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """``values`` in the inputs' dtype: integer images (uint8) get rounded values, not truncated ones."""
    if not inputs.is_floating_point() and values.is_floating_point():
        values = values.round()
    return values.to(device=inputs.device, dtype=inputs.dtype)


def _substrate(baseline: Baseline, inputs: torch.Tensor) -> torch.Tensor:
    if isinstance(baseline, torch.Tensor):
        try:
            return _like(baseline, inputs).expand_as(inputs)
        except RuntimeError:
            raise HookscopeError(
                f"baseline of shape {tuple(baseline.shape)} does not broadcast to the inputs "
                f"{tuple(inputs.shape)}; pass a tensor of shape C x 1 x 1, C x H x W or B x C x H x W"
            ) from None
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        return _like(torch.tensor(float(baseline)), inputs).expand_as(inputs)
    if baseline == "zeros":
        return torch.zeros_like(inputs)
    if baseline == "mean":
        exact = inputs.double() if inputs.dtype == torch.float64 else inputs.float()
        return _like(exact.mean(dim=(2, 3), keepdim=True), inputs).expand_as(inputs)
    if baseline == "blur":
        return blur(inputs)
    hint = did_you_mean(baseline, BASELINES) if isinstance(baseline, str) else ""
    raise HookscopeError(
        f"baseline={baseline!r} is not a baseline.{hint} Use 'zeros', 'blur', 'mean', a number or a tensor"
    )


@checked
def blur(images: torch.Tensor, *, size: int = _BLUR_SIZE, sigma: float = _BLUR_SIGMA) -> torch.Tensor:
    """Blur ``B x C x H x W`` images with a ``size x size`` Gaussian (borders replicated).

    Integer images (uint8) are blurred in float32 and rounded back to their dtype.

    Example:
        >>> blur(torch.ones(1, 3, 8, 8)).allclose(torch.ones(1, 3, 8, 8))
        True
    """
    if not images.is_floating_point():
        return _like(blur(images.float(), size=size, sigma=sigma), images)
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = (g / g.sum()).to(device=images.device, dtype=images.dtype)
    c, half = images.shape[1], size // 2
    padded = F.pad(images, (half, half, half, half), mode="replicate")
    rows = F.conv2d(padded, g.view(1, 1, size, 1).expand(c, 1, size, 1), groups=c)
    return F.conv2d(rows, g.view(1, 1, 1, size).expand(c, 1, 1, size), groups=c)


def _curve_targets(model: nn.Module, inputs: torch.Tensor, kw: dict[str, Any], target: Target,
                   output: Callable[[Any], torch.Tensor] | None) -> torch.Tensor:
    if target is None:  # a copy: the model may write into its input (x.mul_(2), x[:, 0] = 0)
        out = call_model(model, (inputs.clone(),), private(kw))
        return read_logits(output, out, inputs.shape[0]).argmax(dim=1)
    return class_targets(target, inputs.shape[0], device=inputs.device)


def _anchor(model: nn.Module, inputs: torch.Tensor, kw: dict[str, Any], target: Target,
            output: Callable[[Any], torch.Tensor] | None) -> Target:
    """A target with an ``anchor`` method fixed on the model's output for the inputs themselves."""
    if not is_function(target) or not callable(getattr(target, "anchor", None)):
        return target  # no extra forward for a plain function
    return anchored(target, output, call_model(model, (inputs.clone(),), private(kw)))  # type: ignore[no-any-return]


def _score(logits: torch.Tensor, targets: torch.Tensor, score: str) -> torch.Tensor:
    if score == "prob" and logits.shape[1] == 1:
        raise HookscopeError("score='prob' is a softmax over classes, always 1 for a model with one logit; use "
                             "score='logit' or a target function, e.g. target=lambda o: o[:, 0].sigmoid()")
    values = logits.float().softmax(dim=1) if score == "prob" else logits.float()
    return values.gather(1, targets.unsqueeze(1)).squeeze(1)


def _call_target(fn: Callable[[Any], torch.Tensor], output: Callable[[Any], torch.Tensor] | None, out: Any,
                 copies: int, b: int) -> torch.Tensor:
    """Call the user's target once per step, each time on the output rows of the ``b`` images
    (read through ``output=`` first, as :func:`hookscope.cam` does)."""
    values = []
    # one output per image (torchvision detection models: a list of dicts) is cut as a list
    listed = isinstance(out, (list, tuple)) and len(out) == copies * b and all(isinstance(o, Mapping) for o in out)
    for j in range(copies):
        part = out[j * b : (j + 1) * b] if listed else tree_map(
            lambda t: t[j * b : (j + 1) * b] if t.dim() and t.shape[0] == copies * b else t, out)
        values.append(user_scores(fn, output, part, b, f"a batch of {b} images").float())
    return torch.cat(values)


def _masks(maps: torch.Tensor, masks: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(maps, torch.Tensor) or not isinstance(masks, torch.Tensor):
        raise HookscopeError(f"{what} takes maps and masks as tensors of shape B x H x W")
    if maps.dim() == 2:
        maps = maps[None]
    if masks.dim() == 2:
        masks = masks[None]
    if maps.dim() != 3 or maps.shape != masks.shape:
        raise HookscopeError(
            f"{what}: maps {tuple(maps.shape)} and masks {tuple(masks.shape)} differ; pass both as "
            "B x H x W at the same resolution (upsample the maps to the masks' size)"
        )
    _no_nan(maps, f"{what}: maps")
    masks = masks.to(device=maps.device, dtype=torch.bool)
    empty = ~masks.flatten(1).any(1)
    if bool(empty.any()):
        raise HookscopeError(f"{what}: mask {int(empty.nonzero()[0, 0])} is empty (no object pixel), so no map can "
                             "hit it; drop that image")
    return maps.detach(), masks


@checked
def pointing_game(maps: torch.Tensor, masks: torch.Tensor, *, tolerance: float = 15,
                  reduce: str = "abs_sum") -> torch.Tensor:
    """Pointing game (Zhang et al. 2018): does each map's maximum fall on the object?

    A hit when the map's maximum (the first in row-major order if several pixels share it) lies
    within ``tolerance`` pixels (Euclidean) of a ground-truth pixel: 15 by default, as in the paper;
    ``tolerance=0`` asks for the peak to lie on the object itself.

    Args:
        maps: ``B x H x W`` saliency maps, or ``B x C x H x W`` maps reduced over ``C`` by ``reduce``.
        masks: ``B x H x W`` ground truth (bool or 0/1), same size as the maps; :func:`box_mask`
            makes them from boxes.
        tolerance: distance in pixels within which a miss still counts as a hit.
        reduce: how ``B x C x H x W`` maps become ``B x H x W``: ``"abs_sum"``, ``"sum"``,
            ``"abs_max"`` or ``"l2"`` over the channels, as in :func:`deletion`.

    Returns:
        ``B`` booleans; ``hits.float().mean()`` is the accuracy.

    Example:
        >>> m = torch.zeros(1, 4, 4); m[0, 1, 2] = 1
        >>> pointing_game(m, box_mask([[2, 0, 4, 2]], 4, 4), tolerance=0).tolist()
        [True]
    """
    maps, masks = _masks(_flat_maps(maps, reduce, "pointing_game"), masks, "pointing_game")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise HookscopeError(f"tolerance={tolerance!r} must be 0 or a positive number of pixels")
    b, h, w = maps.shape
    peak = maps.reshape(b, -1).argmax(dim=1)
    py, px = (peak // w).view(b, 1, 1), (peak % w).view(b, 1, 1)
    yy = torch.arange(h, device=maps.device).view(1, h, 1)
    xx = torch.arange(w, device=maps.device).view(1, 1, w)
    near = (yy - py) ** 2 + (xx - px) ** 2 <= tolerance**2
    return (near & masks).flatten(1).any(dim=1)


@checked
def energy_pointing_game(maps: torch.Tensor, masks: torch.Tensor, *, reduce: str = "abs_sum") -> torch.Tensor:
    """Energy-based pointing game (Wang et al. 2020, Score-CAM): share of the map inside the object.

    ``sum(map * mask) / sum(map)`` per image, for non-negative maps; an all-zero map scores 0.

    Args:
        maps: ``B x H x W`` non-negative saliency maps (CAM maps are), or ``B x C x H x W`` maps
            reduced over ``C`` by ``reduce`` (the default, ``"abs_sum"``, is never negative).
        masks: ``B x H x W`` ground-truth masks or boxes (bool or 0/1), same size as the maps.
        reduce: how ``B x C x H x W`` maps become ``B x H x W``, as in :func:`deletion`.

    Returns:
        ``B`` proportions in ``[0, 1]``.

    Example:
        >>> m = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
        >>> energy_pointing_game(m, torch.tensor([[[1, 1], [0, 0]]])).tolist()
        [0.30000001192092896]
    """
    maps, masks = _masks(_flat_maps(maps, reduce, "energy_pointing_game"), masks, "energy_pointing_game")
    if bool((maps < 0).any()):
        raise HookscopeError(
            "energy_pointing_game needs non-negative maps; min-max normalise them (CAM maps already are)"
        )
    maps = maps.float()
    total = maps.flatten(1).sum(dim=1)
    inside = (maps * masks).flatten(1).sum(dim=1)
    return torch.where(total > 0, inside / total.clamp_min(torch.finfo(maps.dtype).tiny), torch.zeros_like(total))


@checked
def box_mask(
    boxes: Sequence[Sequence[float]] | torch.Tensor, height: int, width: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """``B x H x W`` masks from ``B`` boxes ``(x0, y0, x1, y1)`` in pixels, ends exclusive.

    Example:
        >>> box_mask([[1, 0, 3, 1]], 2, 4).int().tolist()
        [[[0, 1, 1, 0], [0, 0, 0, 0]]]
    """
    bx = torch.as_tensor(boxes, dtype=torch.float32, device=device)
    if bx.dim() != 2 or bx.shape[1] != 4:
        raise HookscopeError(
            f"boxes of shape {tuple(bx.shape)} are not B x 4; pass one (x0, y0, x1, y1) per image"
        )
    flipped = (bx[:, 2] <= bx[:, 0]) | (bx[:, 3] <= bx[:, 1]) | bx.isnan().any(1)
    if bool(flipped.any()):
        i = int(flipped.nonzero()[0, 0])
        raise HookscopeError(f"box {i} {bx[i].tolist()} is empty (x1 <= x0 or y1 <= y0); boxes are corners "
                             "(x0, y0, x1, y1), not (x, y, width, height)")
    yy = torch.arange(height, device=bx.device).view(1, height, 1)
    xx = torch.arange(width, device=bx.device).view(1, 1, width)
    x0, y0, x1, y1 = (bx[:, i].view(-1, 1, 1) for i in range(4))
    masks = (xx >= x0) & (xx < x1) & (yy >= y0) & (yy < y1)
    outside = ~masks.flatten(1).any(1)
    if bool(outside.any()):
        i = int(outside.nonzero()[0, 0])
        raise HookscopeError(f"box {i} {bx[i].tolist()} covers no pixel of the {height} x {width} image; boxes are in "
                             "pixels of the maps' size (scale them if they are for the original image)")
    return masks

