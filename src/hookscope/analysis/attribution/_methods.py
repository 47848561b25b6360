"""The attribution methods, one small function each, in one table (:data:`TABLE`): a method's name, its
settings class (:mod:`._settings`) and its function.

Each function takes the :class:`~._engine.Job`, the first pass on the inputs and the :class:`Settings`,
and returns the maps and, for integrated gradients, the completeness gap of each sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._engine import Job, Make, Pass, grad, gradients, leaf, run
from ._gradcam import guided_gradcam
from ._guided import guided_backprop
from ._lrp import deconvnet, lrp
from ._perturb import feature_ablation, feature_permutation, occlusion, shapley_value_sampling
from ._settings import (LRP, AttributionMethod, Deconvnet, FeatureAblation, FeaturePermutation, Gradient, GuidedBackprop,
                        GuidedGradCam, InputXGradient, IntegratedGradients, KernelShap, Lime, Occlusion, Saliency,
                        ShapleyValueSampling, SmoothGrad, SmoothGradSq, VarGrad, setting_names)
from ._surrogate import kernel_shap, lime

__all__ = ["COPIES", "INPUTS_ONLY", "LAYER_METHODS", "PERTURBATION", "REPORTED", "SETTINGS", "TABLE", "Family", "Made", "Settings",
           "readers", "settings_of"]


@dataclass
class Settings:
    """What the methods are asked for beyond the job: the baseline and path, the noise."""

    baseline: torch.Tensor  # the inputs' shape (a layer method: the model's inputs, e.g. token ids)
    alphas: list[float]
    weights: list[float]
    samples: int
    noise: float
    seed: int
    composite: Any = None  # LRP: a composite's name or a mapping of layers to rules
    canonize: bool = True  # LRP: batch norms merged into the layer before them
    bounds: Any = None  # LRP: the zbox rule's (low, high)
    method: Any = None  # the perturbation methods: their settings object, read whole


Made = tuple[torch.Tensor, torch.Tensor | None, int]  # (maps, delta, forward passes)
Method = Callable[[Job, Pass, Settings], Made]


def _at(job: Job, p: Pass) -> torch.Tensor:
    """What the first pass differentiates at: the inputs' leaf, or the layer's stand-in."""
    at = p.kept[0] if job.layer is not None else p.leaf
    assert at is not None
    return at


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least float32, to sum many gradients in."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _first(job: Job, p: Pass) -> torch.Tensor:
    assert p.scores is not None
    return grad(job, p.scores, _at(job, p))


def gradient(job: Job, p: Pass, s: Settings) -> Made:
    return _first(job, p), None, 1


def saliency(job: Job, p: Pass, s: Settings) -> Made:
    return _first(job, p).abs(), None, 1


def input_x_gradient(job: Job, p: Pass, s: Settings) -> Made:
    return _first(job, p) * _at(job, p).detach(), None, 1


def integrated_gradients(job: Job, p: Pass, s: Settings) -> Made:
    B, dev = job.batch, job.x.device
    # the first pass's own gradient is the path's last point where that point is the inputs (alpha 1: the
    # trapezoid and right rules at the inputs), so the path runs one step fewer
    last = job.layer is None and s.alphas[-1] == 1.0 and p.scores is not None and p.scores.requires_grad
    steps = len(s.alphas) - int(last)
    rows = torch.arange(B, device=dev).repeat(steps)  # step by step, each step a copy of the batch
    step = torch.arange(B * steps, device=dev) // B
    # f(baseline) comes from the path's own first step where that step is the baseline (alpha 0: the
    # trapezoid and left rules at the inputs); at a layer the baseline's output is the path's start
    at_zero = job.layer is None and s.alphas[0] == 0.0
    base = Pass() if at_zero else _baseline_pass(job, s.baseline)
    start = job.x if job.layer is None else p.kept[0].detach()
    origin = s.baseline if job.layer is None else base.kept[0]
    alpha = torch.tensor(s.alphas, dtype=torch.float64, device=dev)
    weight = torch.tensor(s.weights, dtype=torch.float64, device=dev)

    def scaled(lo: int, hi: int) -> torch.Tensor:
        r, a = rows[lo:hi], alpha[step[lo:hi]].to(start.dtype).view(-1, *[1] * (start.dim() - 1))
        return origin[r] + a * (start[r] - origin[r])

    build = scaled if job.layer is None else (lambda lo, hi: job.x[rows[lo:hi]])
    stand = None if job.layer is None else (lambda lo, hi: _fixed(scaled(lo, hi)))
    total = torch.zeros_like(_wide(start))
    if last:
        total += _wide(_first(job, p)) * s.weights[-1]
    forwards = 1 if at_zero else 2
    for lo, hi, scores, g in gradients(job, rows, build, stand):
        w = weight[step[lo:hi]].to(total.dtype).view(-1, *[1] * (g.dim() - 1))
        total.index_add_(0, rows[lo:hi], _wide(g) * w)
        if at_zero and lo < B:  # the rows of the first step: the baseline itself
            base.scores = scores[:B - lo] if base.scores is None else torch.cat([base.scores, scores[:B - lo]])
        forwards += 1
    maps = total * _wide(start - origin)
    assert p.scores is not None and base.scores is not None
    delta = _wide(p.scores.detach()) - _wide(base.scores) - maps.flatten(1).sum(1)
    return maps, delta, forwards


def _baseline_pass(job: Job, baseline: torch.Tensor) -> Pass:
    """The model on the baseline (its layer's output kept at a layer), for ``f(baseline)``."""
    with torch.no_grad():
        return run(job, baseline, torch.arange(job.batch, device=job.x.device), None if job.layer is None else _kept)


def _kept(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


def _fixed(value: torch.Tensor) -> Make:
    """A stand-in that is ``value`` whatever the layer computed (checked to have its shape)."""
    def make(t: torch.Tensor) -> torch.Tensor:
        if t.shape != value.shape:
            raise RuntimeError(f"the layer's output changed shape between passes ({tuple(t.shape)} after "
                               f"{tuple(value.shape)})")
        return leaf(value.to(t.dtype))

    return make


def _noisy(job: Job, s: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The noisy batch, sample by sample (``samples`` copies of each), and which sample each row is."""
    B, n, x = job.batch, s.samples, job.x
    spread = (x.flatten(1).amax(1) - x.flatten(1).amin(1)) * s.noise  # a fraction of each input's range
    std = spread.repeat_interleave(n).view(-1, *[1] * (x.dim() - 1)).expand(B * n, *x.shape[1:]).contiguous()
    generator = torch.Generator(device=x.device).manual_seed(s.seed)
    noise = torch.normal(0.0, std, generator=generator)
    rows = torch.arange(B, device=x.device).repeat_interleave(n)
    return x.repeat_interleave(n, dim=0) + noise, rows


def _moments(job: Job, s: Settings) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The mean gradient and mean squared gradient of each input over its noisy copies."""
    noisy, rows = _noisy(job, s)
    first = torch.zeros_like(_wide(job.x))
    second = torch.zeros_like(first)
    forwards = 1
    for lo, hi, _, g in gradients(job, rows, lambda lo, hi: noisy[lo:hi], None):
        first.index_add_(0, rows[lo:hi], _wide(g))
        second.index_add_(0, rows[lo:hi], _wide(g) ** 2)
        forwards += 1
    return first / s.samples, second / s.samples, forwards


def smoothgrad(job: Job, p: Pass, s: Settings) -> Made:
    mean, _, forwards = _moments(job, s)
    return mean, None, forwards


def smoothgrad_sq(job: Job, p: Pass, s: Settings) -> Made:
    _, square, forwards = _moments(job, s)
    return square, None, forwards


def vargrad(job: Job, p: Pass, s: Settings) -> Made:
    mean, square, forwards = _moments(job, s)
    return square - mean * mean, None, forwards


@dataclass(frozen=True)
class Family:
    """One method of the table: its settings class (the settings it reads, its name), the function that
    computes it, how it runs the model and, for a method of the inputs only, why it takes no layer."""

    settings: type[AttributionMethod]
    run: Method
    runs: str  # "inputs": the gradient of one pass; "copies": scaled or noisy copies; "rules": one pass under its
    # rules; "perturb": perturbed copies scored without gradients
    inputs_only: str | None = None  # why it gives maps at the inputs only; None: at a layer too

    @property
    def name(self) -> str:
        return self.settings.name


_NOISE = "adds noise to the inputs, not to a layer's output"
_RELUS = "changes the backward pass of every ReLU between the inputs and the score, so it gives maps at the inputs only"
# one row a method: a new one joins here with its settings class, nothing else changes
TABLE: dict[str, Family] = {f.name: f for f in (
    Family(Saliency, saliency, "inputs"),
    Family(Gradient, gradient, "inputs"),
    Family(InputXGradient, input_x_gradient, "inputs"),
    Family(IntegratedGradients, integrated_gradients, "copies"),
    Family(SmoothGrad, smoothgrad, "copies", _NOISE),
    Family(SmoothGradSq, smoothgrad_sq, "copies", _NOISE),
    Family(VarGrad, vargrad, "copies", _NOISE),
    Family(GuidedBackprop, guided_backprop, "rules", _RELUS),
    Family(Deconvnet, deconvnet, "rules", _RELUS),
    Family(LRP, lrp, "rules", "hands relevance back layer by layer down to the inputs, so it gives maps at the "
                              "inputs only"),
    Family(GuidedGradCam, guided_gradcam, "inputs"),
    Family(Occlusion, occlusion, "perturb"),
    Family(FeatureAblation, feature_ablation, "perturb"),
    Family(FeaturePermutation, feature_permutation, "perturb"),
    Family(ShapleyValueSampling, shapley_value_sampling, "perturb"),
    Family(KernelShap, kernel_shap, "perturb"),
    Family(Lime, lime, "perturb"),
)}
LAYER_METHODS = tuple(n for n, f in TABLE.items() if f.inputs_only is None)  # those that take layers=
INPUTS_ONLY = {n: f.inputs_only for n, f in TABLE.items() if f.inputs_only is not None}  # why the others do not
COPIES = tuple(n for n, f in TABLE.items() if f.runs == "copies")  # those that run copies of the inputs
PERTURBATION = tuple(n for n, f in TABLE.items() if f.runs == "perturb")  # those that need no gradient
REPORTED = {"integrated_gradients": ("steps", "rule"),  # the settings the result reports, where a method has some
            **dict.fromkeys(("smoothgrad", "smoothgrad_sq", "vargrad"), ("samples", "noise", "seed")),
            "occlusion": ("window", "stride"), "feature_permutation": ("seed",),
            **dict.fromkeys(("shapley_value_sampling", "kernel_shap"), ("samples", "seed")),
            "lime": ("samples", "seed", "kernel_width", "distance", "alpha")}


def readers(setting: str) -> tuple[str, ...]:
    """The methods that read a setting, in the table's order.

    Example:
        >>> readers("steps"), readers("canonize")
        (('integrated_gradients',), ('lrp',))
    """
    return tuple(n for n, f in TABLE.items() if setting in setting_names(f.settings))


def settings_of(method: str) -> tuple[str, ...]:
    """The settings one method of the table reads.

    Example:
        >>> settings_of("saliency"), settings_of("lrp")
        ((), ('composite', 'canonize', 'bounds'))
    """
    return setting_names(TABLE[method].settings)


SETTINGS = tuple(dict.fromkeys(s for n in TABLE for s in settings_of(n)))  # every method's: attribute's flat keywords
