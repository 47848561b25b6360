"""DeconvNet and layer-wise relevance propagation (LRP), by hooks on the user's own model.

LRP, as zennit computes it: the target's score is the relevance at the output; the gradient pass
carries relevance instead of gradients. A forward hook on each layer with a rule hands the model
its output through :class:`_Ruled`, whose backward is the rule (:func:`._lrp_rules.relevance`);
activations and sums are caught by :class:`._activations.RuleMode`. One forward pass, with the
model's own values: the same hooks note which batch norm reads a layer's very output (:class:`_Seen`);
such a batch norm passes relevance on and the layer's rule, whose backward runs after the batch
norm's, computes with the merged weight and bias (new tensors, the model's own never written).
Hooks go when the pass ends, also on errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...core.hooks import HookGroup, ThreadScope
from ...core.text import shape_text
from ...errors import HookscopeError
from ...selection import unwrap
from ._activations import RuleMode, rule_pass
from ._composites import CONVS, LINEARS, Chosen, assign
from ._engine import Job, Pass, grad
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
    scores, leaf = rule_pass(job, RuleMode("deconvnet"), p)
    return grad(job, scores, leaf), None, 1


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
class _Seen:
    """What the pass under the rules showed as it ran: each layer's calls, the batch norms fed by one
    layer's output, the Linear or Conv layer that ran first; after it, the merged weights and biases."""

    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    made: dict[int, tuple[str, Tensor, int]] = dataclasses.field(default_factory=dict)  # id -> layer, tensor, version
    fed: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # batch norm -> layers feeding it
    first: str | None = None
    merged: dict[str, tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)  # layer -> weight, bias

    def layer_ran(self, name: str, out: Any) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.first = self.first or name
        if isinstance(out, Tensor):  # the tensor kept, so that its id stays its own
            self.made[id(out)] = (name, out, out._version)

    def norm_ran(self, name: str, x: Any) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        made = self.made.get(id(x)) if isinstance(x, Tensor) else None
        # the layer's very output: not written in place since (an in-place activation would change it)
        self.fed.setdefault(name, set()).add(made[0] if made and made[2] == x._version else "")

    def merge(self, mods: dict[str, nn.Module], chosen: Chosen) -> None:
        """The merged weight and bias of each layer with a rule whose every call fed the one watched batch
        norm that only it fed."""
        pairs: dict[str, str] = {}
        for bn, feeders in self.fed.items():
            (layer,) = feeders if len(feeders) == 1 else ("",)
            if layer and layer in chosen and self.calls[layer] == self.calls[bn]:
                pairs[layer] = bn if layer not in pairs else ""  # a layer feeding two batch norms keeps both
        self.made.clear()
        self.merged = {k: _merged(mods[k], mods[bn]) for k, bn in pairs.items() if bn}


def _mergeable(m: nn.Module) -> bool:
    return isinstance(m, BATCH_NORMS) and m.running_mean is not None and m.running_var is not None and not m.training


def _back(name: str, m: nn.Module, rule: LRPRule, seen: _Seen) -> Back:
    """The rule's backward for layer ``m``: its relevance given its input and the relevance at its output,
    with the merged weight and bias where the forward pass showed a batch norm right after it (the batch
    norm's backward, passing relevance on, runs first)."""
    if rule.name == "pass":
        return lambda x, g: g
    if not isinstance(m, LINEARS):
        return lambda x, g: norm_relevance(m.forward, x, g, rule.stabilizer)
    layer = _layer_fn(m)

    def back(x: Tensor, g: Tensor) -> Tensor:
        w, b = seen.merged.get(name) or (_param(m, "weight"), _param(m, "bias"))
        assert w is not None
        if rule.name == "norm":
            return norm_relevance(lambda t: layer(t, w, b), x, g, rule.stabilizer)
        return relevance(rule, layer, x, w, b, g)

    return back


def _ruled_hook(name: str, m: nn.Module, rule: LRPRule | None, seen: _Seen, norm: bool, scope: ThreadScope) -> Any:
    """The forward hook of a layer: its output handed on with the rule as its backward (the values the
    model computed, unchanged), and what the pass shows noted in ``seen`` (``norm``: a batch norm to merge
    into the layer feeding it, if one does); the calls of threads outside ``scope`` left alone."""
    back = _back(name, m, rule, seen) if rule is not None else None

    def hook(module: nn.Module, args: Any, out: Any) -> Any:
        if not scope.sees():
            return None
        x = args[0] if args else None
        if norm:
            seen.norm_ran(name, x)
        if back is None or rule is None or not isinstance(x, Tensor) or not x.requires_grad:
            new = None
        elif not isinstance(out, Tensor):
            new = None
        elif rule.name == "pass" and out.shape != x.shape:
            raise HookscopeError(f"rule 'pass' on layer {name!r}: its output {tuple(out.shape)} is not the shape of "
                                 f"its input {tuple(x.shape)}; give it 'norm' or 'gradient'")
        else:
            value = out.detach()
            new = _Ruled.apply(x, lambda: value, back)
        if isinstance(module, LINEARS):
            seen.layer_ran(name, out if new is None else new)
        return new

    return hook


@contextmanager
def _rules_on(model: nn.Module, chosen: Chosen, seen: _Seen, norms: set[str], scope: ThreadScope) -> Iterator[None]:
    """Every layer with a rule hooked, every Linear and Conv layer and the batch norms ``norms`` watched."""
    group = HookGroup()
    try:
        for name, m in model.named_modules():
            if name in chosen or isinstance(m, LINEARS):
                rule = chosen[name][1] if name in chosen else None
                # own hook: the output handed on through a function whose backward is the rule (batch norms merged)
                group.add(m.register_forward_hook(_ruled_hook(name, m, rule, seen, name in norms, scope)))
        yield
    finally:
        group.remove()


def _bounded(chosen: Chosen, x: Tensor, bounds: Any) -> Chosen:
    """zbox rules given their bounds (``bounds``, else each sample's smallest and largest value)."""
    out = dict(chosen)
    view = (-1,) + (1,) * (x.dim() - 1)
    lo, hi = bounds if bounds is not None else (x.flatten(1).amin(1).view(view), x.flatten(1).amax(1).view(view))
    for name, (m, rule) in chosen.items():
        if rule.name == "zbox":
            low, high = (lo if rule.low is None else rule.low), (hi if rule.high is None else rule.high)
            for bound in (low, high):
                _check_bound(bound, x)
            out[name] = (m, dataclasses.replace(rule, low=low, high=high))
    return out


def _check_bound(bound: Any, x: Tensor) -> None:
    """A zbox bound: a number, or a tensor that broadcasts to the inputs."""
    shape = tuple(bound.shape) if isinstance(bound, Tensor) else ()
    try:
        fits = torch.broadcast_shapes(shape, x.shape) == x.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise HookscopeError(f"bounds of shape {shape_text(shape)} do not broadcast to the inputs' "
                             f"{shape_text(tuple(x.shape))}; pass numbers, or tensors of one sample's shape or "
                             "one value per channel, e.g. shape (3, 1, 1)")


def _check_zbox(chosen: Chosen, first: str | None) -> None:
    """zbox bounds the model's inputs: only the Linear or Conv layer that ran first may have it."""
    for name, (m, rule) in chosen.items():
        if rule.name == "zbox" and name != first:
            raise HookscopeError(f"rule 'zbox' on layer {name!r}: it bounds the model's inputs, so it belongs on the "
                                 f"first layer ({first!r}); give {name!r} another rule such as 'gamma'")


def lrp(job: Job, p: Pass, s: Any) -> tuple[Tensor, None, int]:
    """The relevance of each input value: the target's score propagated back by the composite's rules,
    in one forward pass (the target pinned on its output, the batch norms to merge found as it runs)."""
    model = _eager(job).model
    chosen = _bounded(assign(model, s.composite), job.x, s.bounds)
    free = {n: m for n, m in model.named_modules() if isinstance(m, BATCH_NORMS) and n not in chosen}
    chosen.update({n: (m, LRPRule("pass")) for n, m in free.items()})  # as zennit: relevance passes on
    seen = _Seen()  # batch norms without a rule of their own may be merged into the layer feeding them
    with _rules_on(model, chosen, seen, {n for n, m in free.items() if s.canonize and _mergeable(m)}, job.scope):
        scores, leaf = rule_pass(job, RuleMode("lrp"), p)
    _check_zbox(chosen, seen.first)
    seen.merge(dict(model.named_modules()), chosen)
    # the relevance at the output is the score itself: d(s * s.detach())/ds = s
    return grad(job, scores * scores.detach(), leaf), None, 1


def lrp_settings(composite: Any, canonize: bool) -> dict[str, Any]:
    """How the result reports the composite: its name, or each mapped rule."""
    if isinstance(composite, str):
        told = composite.lower().replace("-", "_")
    else:
        told = ", ".join(f"{k if isinstance(k, str) else k.__name__}={settings_text(parse_rule(v))}"
                         for k, v in composite.items())
    return {"composite": told, "canonize": canonize}
