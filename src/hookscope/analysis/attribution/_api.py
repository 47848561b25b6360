""":func:`hookscope.attribute`: checks the call, runs the first pass on the inputs (the target pinned
there, the bytes of one row counted; the methods of one pass under their rules pin it on that pass),
then hands the job to the method's entry of :data:`~._methods.TABLE`."""

from __future__ import annotations

import contextlib
import dataclasses

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ...core.hooks import ThreadScope
from ...core.inputs import model_kwargs, private
from ...core.state import restored
from ...core.text import shape_text
from ...errors import HookscopeError, SettingError, did_you_mean, checked
from ...selection import Selector, check_hookable, exact_ops, unwrap
from ...selection import layers as select
from .._targets import Target, batch_coupled, pinned, scores_of
from ._engine import Job, Pass, leaf, opened, probe
from ._features import baseline_like
from ._methods import (COPIES, INPUTS_ONLY, LAYER_METHODS, PERTURBATION, REPORTED, TABLE, Settings, readers,
                       settings_of)
from ._composites import assign
from ._lrp import lrp_settings
from ._lrp_rules import LRPRule
from ._result import Attributions
from ._rules import rule_points
from ._settings import LRP, AttributionMethod, IntegratedGradients, same_value, shown_value

__all__ = ["METHODS", "attribute", "chosen_method"]

METHODS = tuple(TABLE)  # every method's name, as attribute(method=) takes it


@checked
def attribute(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    method: str | AttributionMethod = "saliency",
    target: Target = None,
    baseline: torch.Tensor | float | None = None,
    steps: int | None = None,
    rule: str | None = None,
    samples: int | None = None,
    noise: float | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    memory: int | str | None = None,
    window: int | tuple[int, ...] | None = None,
    stride: int | tuple[int, ...] | None = None,
    features: torch.Tensor | str | None = None,
    kernel_width: float | None = None,
    distance: str | None = None,
    alpha: float | None = None,
    progress: bool | None = None,
    layers: Selector | None = None,
    kwargs: Mapping[str, Any] | None = None,
    composite: str | Mapping[str | type[nn.Module], str | LRPRule] | None = None,
    canonize: bool | None = None,
    bounds: tuple[torch.Tensor | float, torch.Tensor | float] | None = None,
    **unknown: Any,
) -> Attributions:
    """Which input values (or values of one layer's output) a target's score depends on, by its gradient.

    With ``g = d score / d x`` for each sample's own score (the model in eval mode, so the samples of
    a batch do not mix):

    ========================  ==========================================================================
    ``"saliency"``            ``|g|`` (Simonyan et al. 2014).
    ``"gradient"``            ``g``, signed.
    ``"input_x_gradient"``    ``x * g``; at a layer, its output times the gradient there.
    ``"integrated_gradients"`` ``(x - x0) * sum_i w_i g(x0 + a_i (x - x0))`` (Sundararajan et al. 2017),
                              ``x0`` the baseline, ``(a_i, w_i)`` the ``steps`` points of ``rule``; at
                              a layer, the path runs between the layer's outputs for the baseline and
                              for the inputs. ``delta`` says how far ``sum(maps)`` is from
                              ``f(x) - f(x0)``.
    ``"smoothgrad"``          the mean of ``g`` over ``samples`` noisy copies ``x + N(0, s^2)``,
                              ``s = noise * (max(x) - min(x))`` per input (Smilkov et al. 2017).
    ``"smoothgrad_sq"``       the mean of ``g^2`` over the noisy copies.
    ``"vargrad"``             their variance, ``mean(g^2) - mean(g)^2`` (Adebayo et al. 2018).
    ``"guided_backprop"``     ``g`` with every ReLU passing back ``relu(grad) * (x > 0)``
                              (Springenberg et al. 2015).
    ``"deconvnet"``           ``g`` with every ReLU passing back ``relu(grad)``, its forward mask
                              ignored (Zeiler and Fergus 2014).
    ``"guided_gradcam"``      guided backpropagation's map times Grad-CAM at ``layers=`` (the last
                              convolution when ``None``), upsampled bilinearly (Selvaraju et al. 2017).
    ``"lrp"``                 layer-wise relevance propagation (Bach et al. 2015), as zennit computes
                              it: the score is the relevance at the output, each layer hands it back
                              by its rule in ``composite``; ``sum(maps)`` is about the score.
    ``"occlusion"``           a ``window`` slid by ``stride`` and set to the baseline; a value's map is
                              the mean of ``f(x) - f(occluded)`` over the windows covering it (Zeiler
                              and Fergus 2014).
    ``"feature_ablation"``    each feature of ``features`` set to the baseline: ``f(x) - f(ablated)``.
    ``"feature_permutation"`` each feature shuffled across the batch: ``f(x) - f(shuffled)``.
    ``"shapley_value_sampling"`` the mean marginal gain of each feature over ``samples`` random orders
                              (Castro et al. 2009); ``delta`` is ``f(x) - f(baseline) - sum``, 0.
    ``"kernel_shap"``         Shapley values fitted to ``samples`` coalitions by weighted least squares,
                              held to ``sum = f(x) - f(baseline)`` (Lundberg and Lee 2017).
    ``"lime"``                the coefficients of a ridge model of the kept features, fitted to
                              ``samples`` coalitions weighted by similarity (Ribeiro et al. 2016).
    ========================  ==========================================================================

    The perturbation methods (the last six) take no gradient: the copies run under ``torch.no_grad``,
    ``batch_size`` at a time or as many as ``memory=`` holds, so they work on models that are not
    differentiable. A feature's value is given to every input value of the feature.

    Rules: ``"riemann_left"``, ``"riemann_right"``, ``"riemann_middle"``, ``"riemann_trapezoid"``
    (``steps`` points from 0 to 1, the ends half-weighted; the weights sum to 1) and
    ``"gausslegendre"`` (Gauss-Legendre nodes: the smallest ``delta`` for the fewest steps).

    Each method reads its own settings, held by its settings object (:class:`IntegratedGradients`,
    :class:`SmoothGrad`, :class:`LRP`, ...): ``method=IntegratedGradients(steps=32)`` is
    ``method="integrated_gradients", steps=32``, and a name alone is the method with its defaults.
    A setting the method does not read (``steps=`` with saliency, ``noise=`` with integrated
    gradients), a setting that differs from the object's own, and a keyword ``attribute`` does not
    take are refused in one line (:class:`~hookscope.errors.SettingError`).

    The model is left as it was: no hook, every train/eval flag, buffer and random generator put
    back, ``requires_grad`` and ``.grad`` of every parameter untouched (the gradient is taken with
    ``torch.autograd.grad`` at the inputs or the layer only). Your tensors are never written to.
    Calls from several threads, on one model too, do not see each other's hooks or rules.

    Args:
        model: any ``nn.Module`` (DataParallel and ``torch.compile`` seen through).
        inputs: the batch, one row per sample; floating point, or token ids with ``layers=``.
        method: one of :data:`METHODS`, or a method's settings object such as
            ``IntegratedGradients(steps=32)``.
        target: ``None`` (each sample's predicted class on the inputs, kept for every scaled or
            noisy copy), a class index, one per sample, or a function of the model's output giving
            one score per sample, such as the targets of :mod:`hookscope.targets`.
        baseline: integrated gradients' start, or what a perturbed value takes: ``None`` (zeros), a
            number, a tensor of the inputs' shape or of one sample's shape (at a layer: of its output).
        steps: integrated gradients' number of points on the path (``None``: 50).
        rule: integrated gradients' integration rule (above; ``None``: ``"riemann_trapezoid"``).
        samples: the noisy copies of each input (smoothgrad, smoothgrad_sq, vargrad; ``None``: 50); the
            random orders of Shapley value sampling (25), the coalitions of KernelSHAP (25) and LIME (50).
        noise: the noise's standard deviation as a fraction of each input's range (max - min;
            ``None``: 0.1).
        seed: seeds the noise, orders, shuffles or coalitions (the caller's random stream is not used;
            ``None``: 0); ``torch.manual_seed(seed)`` before captum's method draws the same ones.
        batch_size: rows per forward pass for the scaled or noisy copies (``None``: 64).
        memory: a budget for one forward pass of copies, in bytes or as text such as ``"2GB"``: the rows
            per pass are cut to fit, reckoned from the bytes autograd keeps for one row of the inputs
            (the perturbation methods: the peak bytes of a pass of one and of two copies, measured).
        window: occlusion's window, for the last dims of a sample (``None``: every channel and an
            eighth of each later dim).
        stride: occlusion's steps (``None``: half the window).
        features: which values move together (the perturbation methods but occlusion): ``None`` or
            ``"values"``, ``"pixels"``, ``"channels"``, ``"grid:8"``, ``"superpixels:50"``, or a tensor
            of labels ``0..K-1`` of one sample's shape, broadcasting to it or one row per sample;
            labels with a gap are refused.
        kernel_width: LIME's similarity ``exp(-d^2 / (2 w^2))`` (``None``: 1.0).
        distance: LIME's ``"cosine"`` (default) or ``"euclidean"`` distance of a copy to its sample.
        alpha: LIME's ridge penalty (``None``: 0.01).
        progress: the perturbation methods' bar on stderr (``None``: on a terminal, for a run that will
            take more than 5 s).
        layers: one layer (a name, or any selector that picks one) to attribute its output instead
            of the inputs, e.g. a token embedding.
        kwargs: keyword inputs of the model, e.g. ``{"attention_mask": m}``; a tensor with one row
            per sample goes with its sample into every copy.
        composite: LRP's rules: a composite's name (``"epsilon_plus_flat"`` by default,
            ``"epsilon_plus"``, ``"epsilon_gamma_box"``, ``"epsilon_alpha2_beta1"``), or a mapping of
            layer names (globs allowed) or module types to rules, such as
            ``{"features.0": "zbox", nn.Conv2d: "gamma:0.25", nn.Linear: "epsilon"}`` (names win over
            types; layers with weights it leaves out get ``"epsilon"``). A rule is a name with its
            numbers or an :class:`LRPRule`.
        canonize: LRP: each batch norm right after a Linear or Conv layer merged into it for the pass
            (the model's tensors are not written); ``False``: relevance passes through batch norms
            (``None``: ``True``).
        bounds: LRP: ``(low, high)`` of the inputs for the ``zbox`` rule, numbers or tensors that
            broadcast to one sample; ``None``: each sample's smallest and largest value.
        **unknown: refused in one line naming the keyword it was near (a misspelt ``stpes=``), and
            that keyword inputs of the model go in ``kwargs=``.

    Returns:
        An :class:`Attributions`.

    Raises:
        ForwardError: the model's forward pass failed (one line: the module, what it received).
        SettingError: a setting the method does not read, one given twice with two values, or a
            keyword ``attribute`` does not take, in one line.
        HookscopeError: a method, target, baseline, layer, budget, composite or rule that cannot work,
            in one line.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Linear(3, 2)
        >>> res = attribute(net, torch.ones(2, 3), method="integrated_gradients", target=1, steps=4)
        >>> res.maps.shape, bool(res.delta.abs().max() < 1e-5)
        (torch.Size([2, 3]), True)
        >>> same = attribute(net, torch.ones(2, 3), method=hookscope.IntegratedGradients(steps=4), target=1)
        >>> torch.equal(same.maps, res.maps)
        True
        >>> attribute(net, torch.ones(2, 3), method="saliency", steps=4)
        Traceback (most recent call last):
        ...
        hookscope.errors.SettingError: steps= is not a setting of saliency (integrated_gradients reads it); drop it or use method="integrated_gradients"
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Linear(4, 2, bias=False))
        >>> res = attribute(net, torch.ones(1, 3), method="lrp", composite={nn.Linear: "epsilon:0"})
        >>> bool(torch.allclose(res.maps.sum(), res.scores))  # relevance conserved
        True
        >>> net = torch.nn.Linear(4, 2)
        >>> shap = attribute(net, torch.ones(1, 4), method="shapley_value_sampling", samples=4, target=0)
        >>> bool(torch.allclose(shap.maps, net.weight[0].detach()))  # a linear model's Shapley values
        True
    """
    chosen = chosen_method(method, {"baseline": baseline, "steps": steps, "rule": rule, "samples": samples,
                                    "noise": noise, "seed": seed, "batch_size": batch_size, "memory": memory,
                                    "composite": composite, "canonize": canonize, "bounds": bounds, "window": window,
                                    "stride": stride, "features": features, "kernel_width": kernel_width,
                                    "distance": distance, "alpha": alpha, "progress": progress}, unknown)
    key = chosen.name
    _check_layers(key, layers)
    perturbs = key in PERTURBATION
    if not perturbs:  # perturbation takes no gradient: parameters made under inference_mode are fine
        _check_params(model)
    if isinstance(chosen, LRP):
        assign(unwrap(model)[0], chosen.composite)  # a mapping's layers and rules, checked before any pass
    kw = model_kwargs(kwargs)
    _check_inputs(inputs, layers, perturbs)
    layer = _one_layer(model, layers)
    rows, budget = getattr(chosen, "batch_size", 64), getattr(chosen, "memory", None)
    _check_independent(model, inputs, rows, key)
    kept = restored(model, train=False, buffers=True)  # buffers too: a forward may write one in eval mode
    scope = ThreadScope()
    with kept, torch.inference_mode(False), torch.enable_grad(), opened(scope):
        x = cast(torch.Tensor, private(inputs)).detach()  # copied here: never an inference tensor
        job = Job(model, x, kw, layer, scope=scope)
        first = _first_pass(job, key, target, rows, budget)
        with torch.no_grad() if perturbs else contextlib.nullcontext():
            maps, delta, forwards = TABLE[key].run(job, first, _settings(chosen, x))
        assert first.scores is not None
    told = (lrp_settings(chosen.composite, chosen.canonize) if isinstance(chosen, LRP)
            else {k: getattr(chosen, k) for k in REPORTED.get(key, ())} or None)
    classes = job.target if isinstance(job.target, torch.Tensor) else None
    return Attributions(maps=maps.detach(), method=key, target=classes, scores=first.scores.detach(),
                        delta=None if delta is None else delta.detach(), layer=None if layer is None else layer[0],
                        settings=told, forwards=forwards)


def _settings(chosen: AttributionMethod, x: torch.Tensor) -> Settings:
    """What the method's function reads, from its settings object (the baseline as a tensor, the path's points)."""
    points = (rule_points(chosen.rule, chosen.steps) if isinstance(chosen, IntegratedGradients) else ([], []))
    if chosen.name in PERTURBATION:  # its baseline is of what it perturbs (the inputs or a layer's output)
        return Settings(x[:0], [], [], 0, 0.0, 0, method=chosen)
    return Settings(baseline_like(getattr(chosen, "baseline", None), x), points[0], points[1],
                    getattr(chosen, "samples", 0), getattr(chosen, "noise", 0.0), getattr(chosen, "seed", 0),
                    getattr(chosen, "composite", None), getattr(chosen, "canonize", True), getattr(chosen, "bounds", None))


def _first_pass(job: Job, key: str, target: Target, batch_size: int, memory: int | None) -> Pass:
    """The pass on the inputs that pins the target and counts a row's bytes; none for the methods of
    one pass under their rules, which pin the target on that pass's output (the model's own values)."""
    if TABLE[key].runs == "rules":
        job.target = target
        return Pass()
    if TABLE[key].runs == "perturb":  # no gradient anywhere; at a layer its output on the inputs is kept
        with torch.no_grad():
            first = probe(job, None if job.layer is None else leaf, count=False)
        job.target = pinned(target, first.output, job.batch)
        first.scores = scores_of(job.target, first.output, torch.arange(job.batch, device=job.x.device))
        return first
    # the methods of copies differentiate only the copies: their first pass keeps no graph unless it is
    # measured for memory= or is integrated gradients' last point (the inputs themselves)
    keep = key not in COPIES or memory is not None or (key == "integrated_gradients" and job.layer is None)
    with contextlib.nullcontext() if keep else torch.no_grad():
        first = probe(job, None if job.layer is None else leaf, count=memory is not None)
    job.target = pinned(target, first.output, job.batch)
    first.scores = scores_of(job.target, first.output, torch.arange(job.batch, device=job.x.device))
    job.chunk = _chunk(first.saved, job.x, batch_size, memory)
    return first


def chosen_method(method: Any, given: Mapping[str, Any], unknown: Mapping[str, Any], *, fn: str = "attribute",
                  among: Sequence[str] = METHODS) -> AttributionMethod:
    """The settings object of ``method`` (a name, or an object of :mod:`._settings`) with the flat
    settings ``given`` (``None``: not given) applied; a keyword the function does not take, a setting
    the method does not read, or one given twice with two values is refused in one line."""
    _refuse_unknown(fn, unknown, given)
    made = _made(method, among, fn)
    passed = {k: v for k, v in given.items() if v is not None}
    for k, v in passed.items():
        if k not in settings_of(made.name):
            raise SettingError(_not_read(k, made.name, [m for m in readers(k) if m in among]))
    if isinstance(method, AttributionMethod):
        changed = dataclasses.replace(method, **passed)  # the given values as the object would hold them
        for k in passed:
            if not same_value(getattr(changed, k), getattr(method, k)):
                raise SettingError(f"{k}={shown_value(passed[k])} conflicts with method={method!r}; give {k} in one "
                                   f'place: {type(method).__name__}({k}=...), or {k}= with method="{made.name}"')
        return method
    return type(made)(**passed)


def _made(method: Any, among: Sequence[str], fn: str) -> AttributionMethod:
    """The method's settings object: as given, or its class's defaults for a name."""
    if isinstance(method, type) and issubclass(method, AttributionMethod):
        raise SettingError(f"method={method.__name__} is the class; pass {method.__name__}() for its defaults, or "
                           f"{method.__name__}(...) with its settings")
    key = method.name if isinstance(method, AttributionMethod) else (
        method.lower().replace("-", "_") if isinstance(method, str) else "")
    if key not in among:
        what = "a token attribution method" if fn == "attribute_tokens" else "an attribution method"
        shown = f"{type(method).__name__}()" if isinstance(method, AttributionMethod) else repr(method)
        raise HookscopeError(f"method={shown} is not {what}.{did_you_mean(str(method), among)} "
                             f"Use one of {', '.join(among)}")
    return method if isinstance(method, AttributionMethod) else TABLE[key].settings()


def _not_read(setting: str, method: str, reading: Sequence[str]) -> str:
    if not reading:
        return f"{setting}= is not a setting of {method}; drop it"
    who = f"{', '.join(reading)} read{'s' if len(reading) == 1 else ''} it"
    return f'{setting}= is not a setting of {method} ({who}); drop it or use method="{reading[0]}"'


def _refuse_unknown(fn: str, unknown: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """A keyword the function does not take (Python's own TypeError, with the name it was near)."""
    if not unknown:
        return
    name = next(iter(unknown))
    known = ["method", "target", "layers", "kwargs", *given] + (["generate", "tokenizer"] if fn != "attribute" else [])
    hint = did_you_mean(name, known)
    raise SettingError(f"{fn}() got an unexpected keyword argument {name!r}.{hint} Keyword inputs of the model go "
                       f"in kwargs=, e.g. kwargs={{{name!r}: ...}}")


def _check_layers(key: str, layers: Any) -> None:
    if layers is not None and key not in LAYER_METHODS:
        raise HookscopeError(f"method={key!r} {INPUTS_ONLY[key]}; drop layers=, or with layers= use one of "
                             f"{', '.join(LAYER_METHODS)} (guided_gradcam's layer is the one of its Grad-CAM)")


def _check_params(model: nn.Module) -> None:
    """Refuse parameters autograd cannot differentiate through."""
    made = next((n for n, p in unwrap(model)[0].named_parameters() if p.is_inference()), None)
    if made is not None:
        raise HookscopeError(f"parameter {made!r} was made under torch.inference_mode(), so autograd cannot "
                             "differentiate through it; build or load the model outside inference_mode")


def _check_inputs(inputs: Any, layers: Any, perturbs: bool = False) -> None:
    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 1:
        got = shape_text(tuple(inputs.shape)) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"inputs ({got}) are not a batch; pass a tensor with one row per sample")
    if inputs.shape[0] == 0:
        raise HookscopeError(f"inputs ({shape_text(tuple(inputs.shape))}) hold no sample; pass a batch of at least one")
    if inputs.is_floating_point() and not bool(inputs.isfinite().all()):
        where = tuple(int(i) for i in (~inputs.isfinite()).nonzero()[0])
        raise HookscopeError(f"inputs hold {float(inputs[where])} at sample {where[0]} (index {where}), so the "
                             "score is not a number and no attribution holds; replace it first, e.g. "
                             "torch.nan_to_num(inputs, nan=0.0, posinf=0.0, neginf=0.0), or drop that sample")
    if not inputs.is_floating_point() and layers is None and not perturbs:
        raise HookscopeError(f"inputs of dtype {inputs.dtype} have no gradient; pass float inputs, or for token "
                             "ids layers= the embedding layer, e.g. layers='bert.embeddings'")


def _one_layer(model: nn.Module, layers: Any) -> tuple[str, nn.Module] | None:
    if layers is None:
        return None
    chosen = exact_ops(select(model, cast(Selector, layers)), "attribute")
    check_hookable(chosen)
    if len(chosen) != 1:
        shown = ", ".join(repr(n) for n, _ in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        raise HookscopeError(f"layers={layers!r} selects {len(chosen)} layers ({shown}); attribution at a layer "
                             "takes one: pass its exact name")
    return chosen[0]


def _check_independent(model: nn.Module, inputs: torch.Tensor, batch_size: int, key: str) -> None:
    """Refuse rows that would mix: each row's gradient is read from the gradient of the batch's summed score."""
    coupled = batch_coupled(unwrap(model)[0])
    copies = key in COPIES or key in PERTURBATION  # runs copies of the inputs
    if coupled is not None and (inputs.shape[0] > 1 or (copies and batch_size > 1)):
        raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so a row's "
                             "score would depend on the other rows of its batch; pass one input"
                             + (" with batch_size=1" if copies else ""))


def _chunk(saved: int, x: torch.Tensor, batch_size: int, memory: int | None) -> int:
    """Rows per forward pass: ``batch_size``, fewer where ``memory`` bytes cannot hold them."""
    if memory is None:
        return batch_size
    row = saved // max(x.shape[0], 1) + x[:1].numel() * x.element_size()  # what autograd keeps, the row itself
    if memory < row:
        raise HookscopeError(f"memory={memory} bytes cannot hold one row of a forward pass, which keeps about "
                             f"{row} bytes for the backward pass; pass memory >= {row}, or None for batch_size rows")
    return max(1, min(batch_size, memory // row))
