"""Infidelity (Yeh et al. 2019) and max-sensitivity (Yeh et al. 2019, Alvarez-Melis and Jaakkola 2018)
of an explanation, equal to captum's ``captum.metrics.infidelity`` and ``sensitivity_max`` for the
same perturbations.

Must not import any analysis: the attributions are the caller's, and max-sensitivity re-explains
through the caller's ``explain(model, inputs)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ...core.inputs import model_kwargs
from ...core.state import restored
from ...errors import HookscopeError, checked
from .._targets import Target
from ._scoring import Scorer

__all__ = ["NORMS", "Explain", "Perturb", "infidelity", "max_sensitivity", "explained"]

Perturb = Callable[[torch.Tensor], Any]
Explain = Callable[[nn.Module, torch.Tensor], torch.Tensor]
NORMS = ("fro", "inf")


def _count(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HookscopeError(f"{what}={n!r} must be a positive integer, e.g. {what}=10")
    return n


def _inputs(inputs: Any, what: str) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or not inputs.is_floating_point():
        got = f"{inputs.dtype} {tuple(inputs.shape)}" if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"{what} needs the inputs as one floating-point tensor with a row per sample, got {got}")
    return inputs


def _perturbations(perturb: Perturb | None, expanded: torch.Tensor, noise: float,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if perturb is None:
        drawn = noise * torch.randn(expanded.shape, generator=generator, dtype=expanded.dtype)
        i = drawn.to(expanded.device)
        return i, expanded - i
    got = perturb(expanded)
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise HookscopeError("perturb= must return (perturbations, perturbed inputs), two tensors, as captum's "
                             f"perturb_func does; it returned {type(got).__name__}")
    i, xp = got
    if i.shape != expanded.shape or xp.shape != expanded.shape:
        raise HookscopeError(f"perturb= returned shapes {tuple(i.shape)} and {tuple(xp.shape)} for inputs "
                             f"{tuple(expanded.shape)}; both must have the inputs' shape")
    return i, xp


@checked
def infidelity(
    model: nn.Module,
    inputs: torch.Tensor,
    attributions: torch.Tensor,
    *,
    perturb: Perturb | None = None,
    noise: float = 0.1,
    n_perturb_samples: int = 10,
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    score: str = "logit",
    normalize: bool = False,
    seed: int = 0,
    batch_size: int = 64,
    kwargs: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Infidelity (Yeh et al. 2019): how far the attributions' dot product with a perturbation is from
    the score's change it causes, ``E_I[(I . a - (f(x) - f(x - I)))^2]`` per sample.

    ``I`` is drawn ``n_perturb_samples`` times per sample. A perfect first-order explanation of a
    linear model scores 0. ``normalize=True`` first scales the attributions by the best
    ``beta = E[(I . a)(f(x) - f(x - I))] / E[(I . a)^2]``, so that a constant scaling of them does
    not count. Equal to captum's ``infidelity(model, perturb, inputs, attributions, target=...,
    n_perturb_samples=..., max_examples_per_batch=batch_size, normalize=...)``.

    Args:
        model: the model, run in eval mode under ``torch.no_grad()`` (every flag restored).
        inputs: the samples, one per row (never written to).
        attributions: one value per input value, the inputs' shape (:func:`hookscope.attribute`'s
            ``.maps``).
        perturb: ``perturb(inputs) -> (perturbations, perturbed inputs)``, captum's ``perturb_func``,
            called with each sample repeated (``inputs.repeat_interleave(k, 0)``) under the global
            generator seeded by ``seed``; ``None``: Gaussian noise ``I`` of standard deviation
            ``noise``, the perturbed inputs ``x - I``.
        noise: the standard deviation of the default perturbation.
        n_perturb_samples: how many perturbations per sample.
        target: a class index, one per sample, ``None`` (the class predicted on ``inputs``), or a
            function of the output giving one score per sample.
        output: how to read ``B x classes`` logits from the model's output.
        score: ``"logit"`` (what the model returns, as captum reads it) or ``"prob"`` (softmax).
        normalize: scale the attributions by the best ``beta`` first.
        seed: seeds the perturbations (the caller's random stream is not used).
        batch_size: at most this many perturbed inputs per call of ``perturb`` (captum's
            ``max_examples_per_batch``: ``batch_size // B`` perturbations of each sample at a time).
        kwargs: keyword inputs of the model; a tensor with ``B`` rows goes with its samples.

    Returns:
        ``B`` infidelities (lower: a more faithful explanation).

    Example:
        >>> net = nn.Linear(3, 2)
        >>> x = torch.rand(4, 3)
        >>> exact = net.weight[0].detach().expand(4, 3)  # a linear model's gradient explains it exactly
        >>> bool(infidelity(net, x, exact, target=0).max() < 1e-10)
        True
    """
    inputs = _inputs(inputs, "infidelity")
    if not isinstance(attributions, torch.Tensor) or attributions.shape != inputs.shape:
        got = tuple(attributions.shape) if isinstance(attributions, torch.Tensor) else type(attributions).__name__
        raise HookscopeError(f"infidelity: attributions of shape {got} do not fit the inputs {tuple(inputs.shape)}; "
                             "pass one value per input value (hookscope.attribute(...).maps)")
    n = _count(n_perturb_samples, "n_perturb_samples")
    b = inputs.shape[0]
    per_call = min(max(_count(batch_size, "batch_size") // max(b, 1), 1), n)
    generator = torch.Generator().manual_seed(seed)
    sums = torch.zeros(3, b, dtype=torch.float64, device=inputs.device)
    with restored(model, train=False, seed=seed), torch.no_grad():
        scorer = Scorer(model, inputs, target=target, output=output, score=score, kwargs=model_kwargs(kwargs),
                        what="infidelity")
        a = attributions.detach().to(inputs.device).flatten(1).double()
        done = 0
        while done < n:
            k = min(per_call, n - done)
            rows = torch.arange(b, device=inputs.device).repeat_interleave(k)
            i, xp = _perturbations(perturb, inputs.repeat_interleave(k, 0), noise, generator)
            after = torch.cat([scorer(xp[s:s + batch_size], rows[s:s + batch_size])
                               for s in range(0, len(rows), batch_size)])
            diff = (scorer.before[rows] - after).double().view(b, k)
            dot = (a[rows] * i.to(inputs.device).flatten(1).double()).sum(1).view(b, k)
            sums += torch.stack([dot.pow(2).sum(1), (dot * diff).sum(1), diff.pow(2).sum(1)])
            done += k
    if normalize:
        beta = torch.where(sums[0] != 0, sums[1] / torch.where(sums[0] != 0, sums[0], 1.0), 0.0)
        values = beta * beta * sums[0] - 2 * beta * sums[1] + sums[2]
    else:
        values = sums[0] - 2 * sums[1] + sums[2]
    return (values / n).to(torch.float32)


def explained(explain: Explain, model: nn.Module, inputs: torch.Tensor, what: str) -> torch.Tensor:
    """``explain(model, inputs)``, checked to give a tensor with one row per sample.

    Example:
        >>> explained(lambda m, x: x * 2, nn.Identity(), torch.ones(2, 3), "test").shape
        torch.Size([2, 3])
    """
    got = explain(model, inputs)
    if not isinstance(got, torch.Tensor) or got.dim() < 1 or got.shape[0] != inputs.shape[0]:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise HookscopeError(f"{what}: explain(model, inputs) returned {shape} for {inputs.shape[0]} samples; it must "
                             "return one map per sample, e.g. lambda m, x: hookscope.attribute(m, x).maps")
    return got.detach()


@checked
def max_sensitivity(
    model: nn.Module,
    inputs: torch.Tensor,
    explain: Explain,
    *,
    perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
    radius: float = 0.02,
    n_perturb_samples: int = 10,
    norm: str = "fro",
    seed: int = 0,
) -> torch.Tensor:
    """Max-sensitivity (Yeh et al. 2019): the largest relative change of the explanation under small
    perturbations of the input, ``max_j ||e(x + d_j) - e(x)|| / ||e(x)||`` per sample.

    Equal to captum's ``sensitivity_max(explanation_func, inputs, perturb_radius=radius,
    n_perturb_samples=...)`` (``max_examples_per_batch=None``) for the same explanation.

    Args:
        model: handed to ``explain``; run in eval mode (every flag restored).
        inputs: the samples, one per row (never written to).
        explain: ``explain(model, inputs) -> maps``, one map per sample, e.g.
            ``lambda m, x: hookscope.attribute(m, x, target=labels).maps``. It is called on the inputs,
            then once per perturbation on a batch holding that perturbation of every sample, in the
            inputs' order (so a ``target=`` with one class per sample still fits).
        perturb: ``perturb(inputs) -> perturbed inputs``, captum's one-argument ``perturb_func``,
            called once with each sample repeated ``n_perturb_samples`` times
            (``inputs.repeat_interleave(n, 0)``) under the global generator seeded by ``seed``;
            ``None``: uniform noise in ``[-radius, radius]``, as captum's default.
        radius: the size of the default perturbation.
        n_perturb_samples: how many perturbations per sample.
        norm: ``"fro"`` (the 2-norm of the flattened maps, captum's default) or ``"inf"``.
        seed: seeds the perturbations (the caller's random stream is not used).

    Returns:
        ``B`` sensitivities (lower: a more robust explanation); a zero map is divided by 1.

    Example:
        >>> x = torch.ones(2, 3)
        >>> max_sensitivity(nn.Identity(), x, lambda m, v: 2 * v, radius=0.5).shape
        torch.Size([2])
    """
    inputs = _inputs(inputs, "max_sensitivity")
    n = _count(n_perturb_samples, "n_perturb_samples")
    if norm not in NORMS:
        raise HookscopeError(f"norm={norm!r} is not a norm; use 'fro' (the 2-norm of the flattened map) or 'inf'")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not radius >= 0:
        raise HookscopeError(f"radius={radius!r} must be 0 or a positive number, e.g. radius=0.02")
    b = inputs.shape[0]
    order = 2.0 if norm == "fro" else float("inf")
    with restored(model, train=False, seed=seed):
        expanded = inputs.detach().repeat_interleave(n, 0)
        if perturb is None:  # captum's draw: one float32 tensor on the CPU, then moved
            shift = torch.empty(expanded.shape).uniform_(-radius, radius, generator=torch.Generator().manual_seed(seed))
            perturbed = expanded + shift.to(expanded.device)
        else:
            perturbed = perturb(expanded)
            if not isinstance(perturbed, torch.Tensor) or perturbed.shape != expanded.shape:
                raise HookscopeError("perturb= must return the perturbed inputs, one tensor of the inputs' shape")
        base = explained(explain, model, inputs.clone(), "max_sensitivity").flatten(1).double()
        scale = torch.linalg.vector_norm(base, ord=order, dim=1)
        scale = torch.where(scale == 0, 1.0, scale)
        worst = torch.full((b,), float("-inf"), dtype=torch.float64, device=base.device)
        for j in range(n):
            moved = explained(explain, model, perturbed[j::n].clone(), "max_sensitivity").flatten(1).double()
            if moved.shape != base.shape:
                raise HookscopeError(f"max_sensitivity: explain returned maps of {tuple(moved.shape)} for perturbed "
                                     f"inputs, {tuple(base.shape)} for the inputs; it must give maps of one shape")
            change = torch.linalg.vector_norm(moved - base.to(moved.device), ord=order, dim=1) / scale
            worst = torch.maximum(worst, change.to(worst.device))
    return worst.to(torch.float32)
