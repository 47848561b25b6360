"""DeconvNet and layer-wise relevance propagation (LRP), by hooks on the user's own model.

LRP, as zennit computes it: the target's score is the relevance at the output; the gradient pass
carries relevance instead of gradients. A forward hook on each layer with a rule hands the model
its output through :class:`_Ruled`, whose backward is the rule (:func:`._lrp_rules.relevance`);
activations and sums are caught by :class:`._activations.RuleMode`. A batch norm right after a
Linear or Conv layer is merged into it for the pass: the layer's hook computes with the merged
weight and bias (new tensors, the model's own never written) and the batch norm's hook hands its
input on. Hooks go when the pass ends, also on errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...core.hooks import HookGroup
from ...errors import HookscopeError
from ...selection import unwrap
from ._activations import RuleMode, rule_pass
from ._composites import CONVS, LINEARS, Chosen, assign
from ._engine import Job, Pass, grad, run
from ._lrp_rules import Layer, LRPRule, norm_relevance, parse_rule, relevance, settings_text

__all__ = ["deconvnet", "lrp", "lrp_settings"]

Tensor = torch.Tensor
Back = Callable[[Tensor, Tensor], Tensor]  # (the layer's input, relevance at its output) -> its input's relevance
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _Ruled(torch.autograd.Function):
    """A layer's output as computed; backward: ``back(input, grad)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, value: Callable[[], Tensor], back: Back) -> Tensor:
        ctx.save_for_backward(x)
        ctx.back = back
        return value()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        (x,) = ctx.saved_tensors
        return ctx.back(x, g), None, None


def _eager(job: Job) -> Job:
    return dataclasses.replace(job, model=unwrap(job.model)[0])


def deconvnet(job: Job, p: Pass, s: object) -> tuple[Tensor, None, int]:
    """The target's gradient with every ReLU passing back ``relu(grad)`` (its forward mask ignored)."""
    scores, leaf = rule_pass(job, RuleMode("deconvnet"))
    return grad(job, scores, leaf), None, 2


def _layer_fn(m: nn.Module) -> Layer:
    """The layer's forward with a given weight and bias."""
    if isinstance(m, nn.Linear):
        return F.linear
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return m._conv_forward
    assert isinstance(m, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))
    transposed = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[m.weight.dim() - 2]
    stride, padding, extra, dilation = m.stride, m.padding, m.output_padding, m.dilation
    assert not isinstance(padding, str)
    return lambda x, w, b: transposed(x, w, b, stride, padding, extra, m.groups, dilation)


def _merged(layer: nn.Module, bn: nn.Module) -> tuple[Tensor, Tensor]:
    """The weight and bias of ``layer`` followed by the eval-mode batch norm ``bn``, as new tensors."""
    assert isinstance(bn, BATCH_NORMS) and bn.running_var is not None and bn.running_mean is not None
    w, b = _param(layer, "weight"), _param(layer, "bias")
    assert w is not None
    gamma, beta = _param(bn, "weight"), _param(bn, "bias")
    scale = (gamma if gamma is not None else 1) / (bn.running_var + bn.eps) ** 0.5
    index = (None, slice(None)) if isinstance(layer, CONVS[3:]) else (slice(None),)
    weight = w * scale[index + (None,) * (w.dim() - len(index))]
    bias = ((b if b is not None else 0) - bn.running_mean) * scale
    return weight, bias + (beta if beta is not None else 0)


def _param(m: nn.Module, name: str) -> Tensor | None:
    """A parameter of ``m``, detached (``None`` where it has none)."""
    p = getattr(m, name, None)
    return p.detach() if isinstance(p, Tensor) else None


@dataclasses.dataclass
class _Trace:
    """What one plain pass showed: batch norms fed by one layer, the layer that ran first."""

    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    fed: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # batch norm -> layers feeding it
    first: str | None = None


def _trace(job: Job) -> _Trace:
    t, made, group = _Trace(), {}, HookGroup()
    names = {m: n for n, m in job.model.named_modules()}

    def hook(m: nn.Module, args: Any, out: Any) -> None:
        name = names[m]
        t.calls[name] = t.calls.get(name, 0) + 1
        if isinstance(m, LINEARS):
            t.first = t.first or name
            made[id(out)] = (name, out)  # the tensor kept, so that its id stays its own
        elif args and id(args[0]) in made:
            t.fed.setdefault(name, set()).add(made[id(args[0])][0])
        else:
            t.fed.setdefault(name, set()).add("")

    try:
        for m in names:
            if isinstance(m, LINEARS + BATCH_NORMS):
                # own hook: the order layers run in, to find which batch norm follows which layer
                group.add(m.register_forward_hook(hook))
        with torch.no_grad():
            run(job, job.x, torch.arange(job.batch, device=job.x.device), None)
    finally:
        group.remove()
    return t


Merged = dict[str, tuple[str, tuple[Tensor, Tensor]]]  # layer -> (its batch norm, merged weight and bias)


def _pairs(model: nn.Module, t: _Trace) -> Merged:
    """Layer -> (its batch norm, merged weight and bias) where every call of each feeds the other."""
    mods = dict(model.named_modules())
    out: Merged = {}
    for bn, feeders in t.fed.items():
        (layer,) = feeders if len(feeders) == 1 else ("",)
        m = mods[bn]
        if layer and t.calls[layer] == t.calls[bn] and m.running_mean is not None and not m.training:
            out[layer] = (bn, _merged(mods[layer], m)) if layer not in out else ("", out[layer][1])
    return {k: v for k, v in out.items() if v[0]}  # a layer feeding two batch norms keeps both


def _back(m: nn.Module, rule: LRPRule, params: tuple[Tensor, Tensor | None] | None) -> Back:
    """The rule's backward for layer ``m``: its relevance given its input and the relevance at its output."""
    if rule.name == "pass":
        return lambda x, g: g
    if isinstance(m, LINEARS):
        w, b = params if params is not None else (_param(m, "weight"), _param(m, "bias"))
        assert w is not None
        layer = _layer_fn(m)
        if rule.name == "norm":
            return lambda x, g: norm_relevance(lambda t: layer(t, w, b), x, g, rule.stabilizer)
        return lambda x, g: relevance(rule, layer, x, w, b, g)
    return lambda x, g: norm_relevance(m.forward, x, g, rule.stabilizer)


def _ruled_hook(name: str, m: nn.Module, rule: LRPRule, params: tuple[Tensor, Tensor] | None) -> Any:
    back = _back(m, rule, params)
    layer = _layer_fn(m) if params is not None else None

    def hook(module: nn.Module, args: Any, out: Any) -> Any:
        x = args[0] if args else None
        if not isinstance(x, Tensor) or not x.requires_grad or not isinstance(out, Tensor):
            return None
        if rule.name == "pass" and out.shape != x.shape:
            raise HookscopeError(f"rule 'pass' on layer {name!r}: its output {tuple(out.shape)} is not the shape of "
                                 f"its input {tuple(x.shape)}; give it 'norm' or 'gradient'")
        if layer is not None and params is not None:
            with torch.no_grad():
                value = layer(x, *params)
        else:
            value = out.detach()
        return _Ruled.apply(x, lambda: value, back)

    return hook


def _handed_on(module: nn.Module, args: Any, out: Any) -> Any:
    return args[0]  # a batch norm merged into the layer before it: that layer's output already has it


@contextmanager
def _rules_on(chosen: Chosen, merged: Merged, mods: dict[str, nn.Module]) -> Iterator[None]:
    group = HookGroup()
    try:
        for name, (m, rule) in chosen.items():
            params = merged[name][1] if name in merged else None
            # own hook: the layer's output swapped for a function whose backward is the LRP rule
            group.add(m.register_forward_hook(_ruled_hook(name, m, rule, params)))
        for bn, _ in merged.values():
            # own hook: a merged batch norm hands its input on (its layer's rule already counts it)
            group.add(mods[bn].register_forward_hook(_handed_on))
        yield
    finally:
        group.remove()


def _bounded(chosen: Chosen, x: Tensor, bounds: Any, first: str | None) -> Chosen:
    """zbox rules given their bounds (``bounds``, else each sample's smallest and largest value), checked
    to sit on the layer that runs first."""
    out = dict(chosen)
    view = (-1,) + (1,) * (x.dim() - 1)
    lo, hi = bounds if bounds is not None else (x.flatten(1).amin(1).view(view), x.flatten(1).amax(1).view(view))
    for name, (m, rule) in chosen.items():
        if rule.name != "zbox":
            continue
        if name != first:
            raise HookscopeError(f"rule 'zbox' on layer {name!r}: it bounds the model's inputs, so it belongs on the "
                                 f"first layer ({first!r}); give {name!r} another rule such as 'gamma'")
        low, high = (lo if rule.low is None else rule.low), (hi if rule.high is None else rule.high)
        out[name] = (m, dataclasses.replace(rule, low=low, high=high))
    return out


def lrp(job: Job, p: Pass, s: Any) -> tuple[Tensor, None, int]:
    """The relevance of each input value: the target's score propagated back by the composite's rules."""
    eager = _eager(job)
    model = eager.model
    chosen = assign(model, s.composite)
    needed = any(r.name == "zbox" for _, r in chosen.values()) or (
        s.canonize and any(isinstance(m, BATCH_NORMS) for m in model.modules()))
    t = _trace(eager) if needed else _Trace()  # a plain pass, only to find batch norms or the first layer
    chosen = _bounded(chosen, job.x, s.bounds, t.first)
    # merged where the layer has a rule to compute with and the batch norm no rule of its own
    merged = {k: v for k, v in (_pairs(model, t) if s.canonize else {}).items() if k in chosen and v[0] not in chosen}
    norms = {bn for bn, _ in merged.values()}
    chosen.update({n: (m, LRPRule("pass")) for n, m in model.named_modules()  # as zennit: relevance passes on
                   if isinstance(m, BATCH_NORMS) and n not in norms and n not in chosen})
    with _rules_on(chosen, merged, dict(model.named_modules())):
        scores, leaf = rule_pass(job, RuleMode("lrp"))
    # the relevance at the output is the score itself: d(s * s.detach())/ds = s
    return grad(job, scores * scores.detach(), leaf), None, 3 if needed else 2


def lrp_settings(composite: Any, canonize: bool) -> dict[str, Any]:
    """How the result reports the composite: its name, or each mapped rule."""
    if isinstance(composite, str):
        told = composite.lower().replace("-", "_")
    else:
        told = ", ".join(f"{k if isinstance(k, str) else k.__name__}={settings_text(parse_rule(v))}"
                         for k, v in composite.items())
    return {"composite": told, "canonize": canonize}
