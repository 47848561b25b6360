"""The LRP rules of layers with weights (and the norm rule of pooling layers), as zennit defines them.

A rule turns the relevance ``R`` arriving at a layer's output into the relevance of its input by
recomputing the layer's forward with modified inputs and parameters (``z_i = f(x_i; w_i, b_i)``),
dividing ``R`` by a stabilised sum of them and taking the gradient back to the inputs
(Montavon et al. 2019). :class:`LRPRule` names a rule and its parameters; :func:`parse_rule` reads
one from ``"gamma"``, ``"gamma:0.5"``, ``"alpha_beta:2:1"`` or ``"zbox:-1:1"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from ...errors import HookscopeError, did_you_mean, checked_init
from ._activations import stabilize

__all__ = ["LRPRule", "RULES", "WEIGHTED", "Layer", "norm_relevance", "parse_rule", "relevance", "settings_text"]

Tensor = torch.Tensor
Layer = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]  # (x, weight, bias) -> the layer's output
Mod = Callable[[Tensor], Tensor]
Variant = tuple[Mod, Mod, "Mod | None"]  # how the input, the weight and the bias are changed (None: no bias)

WEIGHTED = ("epsilon", "gamma", "zplus", "alpha_beta", "flat", "wsquare", "zbox")  # need a weight and bias
RULES = WEIGHTED + ("norm", "pass", "gradient")
_ARGS = {"epsilon": ("epsilon",), "gamma": ("gamma",), "alpha_beta": ("alpha", "beta"), "zbox": ("low", "high")}


@checked_init
@dataclass(frozen=True)
class LRPRule:
    """One LRP rule and its parameters, for :func:`hookscope.attribute`'s ``composite=`` mapping.

    Rules of layers with weights (``nn.Linear``, ``nn.Conv*d``, ``nn.ConvTranspose*d``):
    ``"epsilon"`` (``epsilon`` added to the denominator; 0 is LRP-0), ``"gamma"`` (positive weights
    favoured by ``gamma``), ``"zplus"``, ``"alpha_beta"`` (``alpha - beta == 1``), ``"flat"``,
    ``"wsquare"`` and ``"zbox"`` (inputs bounded by ``low`` and ``high``, a number or a tensor that
    broadcasts to one sample: the input layer only). ``"norm"`` (any layer: relevance in proportion
    to each input's share of the output, as for average pooling), ``"pass"`` (relevance passed on
    unchanged: an elementwise layer) and ``"gradient"`` (the plain gradient, no rule).

    Example:
        >>> LRPRule("gamma", gamma=0.5)
        LRPRule(name='gamma', epsilon=1e-06, gamma=0.5, alpha=2.0, beta=1.0, low=None, high=None, stabilizer=1e-06)
    """

    name: str
    epsilon: float = 1e-6
    gamma: float = 0.25
    alpha: float = 2.0
    beta: float = 1.0
    low: Tensor | float | None = None
    high: Tensor | float | None = None
    stabilizer: float = 1e-6

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise HookscopeError(f"{self.name!r} is not an LRP rule.{did_you_mean(str(self.name), RULES)} "
                                 f"Use one of {', '.join(RULES)}")
        if self.name == "alpha_beta" and (self.alpha < 0 or self.beta < 0 or self.alpha - self.beta != 1):
            raise HookscopeError(f"alpha_beta with alpha={self.alpha}, beta={self.beta}: LRP needs alpha, beta >= 0 "
                                 "and alpha - beta == 1, e.g. 'alpha_beta:2:1'")


def parse_rule(spec: str | LRPRule) -> LRPRule:
    """An :class:`LRPRule` from ``"name"`` or ``"name:p1:p2"`` (the rule's numbers in order).

    Example:
        >>> parse_rule("alpha_beta:1:0").alpha, parse_rule("epsilon:0.25").epsilon
        (1.0, 0.25)
    """
    if isinstance(spec, LRPRule):
        return spec
    if not isinstance(spec, str):
        raise HookscopeError(f"an LRP rule is a name such as 'gamma:0.25' or an LRPRule, not a {type(spec).__name__}")
    name, *numbers = spec.strip().lower().split(":")
    name = name.replace("-", "_")  # the name's only: a number's '-' is its sign
    names = _ARGS.get(name, ())
    if len(numbers) > len(names):
        raise HookscopeError(f"rule {spec!r} has {len(numbers)} numbers; '{name}' takes "
                             + (", ".join(names) if names else "none") + f", e.g. {_example(name)!r}")
    try:
        values = {k: float(v) for k, v in zip(names, numbers)}
    except ValueError:
        raise HookscopeError(f"rule {spec!r} has a part that is not a number; write e.g. {_example(name)!r}") from None
    if not all(math.isfinite(v) for v in values.values()):
        raise HookscopeError(f"rule {spec!r} has a number that is not finite; write e.g. {_example(name)!r}")
    return LRPRule(name, **values)


def _example(name: str) -> str:
    return {"epsilon": "epsilon:0.25", "gamma": "gamma:0.25", "alpha_beta": "alpha_beta:2:1",
            "zbox": "zbox:-1:1"}.get(name, name)


def settings_text(rule: LRPRule) -> str:
    """The rule as ``name:numbers``, the way :func:`parse_rule` reads it."""
    keep = [f.name for f in fields(rule) if f.name in _ARGS.get(rule.name, ())]
    numbers = [getattr(rule, k) for k in keep if getattr(rule, k) is not None]  # zbox's bounds may come later
    return ":".join([rule.name] + [f"{v:g}" if isinstance(v, (int, float)) else "tensor" for v in numbers])


def _pos(t: Tensor) -> Tensor:
    return t.clamp(min=0)


def _neg(t: Tensor) -> Tensor:
    return t.clamp(max=0)


def _same(t: Tensor) -> Tensor:
    return t


def _ones(t: Tensor) -> Tensor:
    return torch.ones_like(t)


def _variants(rule: LRPRule, x: Tensor) -> list[Variant]:
    """zennit's input and parameter modifiers of each rule, one per recomputed output."""
    if rule.name == "epsilon":
        return [(_same, _same, _same)]
    if rule.name in ("zplus", "alpha_beta"):
        plus: list[Variant] = [(_pos, _pos, _pos), (_neg, _neg, None)]
        return plus + ([(_pos, _neg, _neg), (_neg, _pos, None)] if rule.name == "alpha_beta" else [])
    if rule.name == "gamma":
        def up(t: Tensor) -> Tensor:
            return t + rule.gamma * t.clamp(min=0)

        def down(t: Tensor) -> Tensor:
            return t + rule.gamma * t.clamp(max=0)

        return [(_pos, up, up), (_neg, down, None), (_pos, down, down), (_neg, up, None), (_same, _same, _same)]
    if rule.name == "flat":
        return [(_ones, _ones, None)]
    if rule.name == "wsquare":
        return [(_ones, torch.square, torch.square)]
    low, high = (_bound(v, x) for v in (rule.low, rule.high))
    return [(_same, _same, _same), (lambda t: low, _pos, _pos), (lambda t: high, _neg, _neg)]


def _bound(v: Tensor | float | None, x: Tensor) -> Tensor:
    assert v is not None  # bounds are filled in before the pass
    return torch.as_tensor(v).to(x).expand_as(x)


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a + b


def _denominators(rule: LRPRule, z: Sequence[Tensor | None], grad: Tensor) -> list[Tensor]:
    """zennit's gradient mappers: the relevance divided by each output's stabilised denominator (an
    output left out, ``None``, is zero: its input is all zeros and it has no bias)."""
    s = rule.epsilon if rule.name == "epsilon" else rule.stabilizer
    z0, z2 = z[0], z[2] if len(z) > 2 else None
    assert z0 is not None
    if rule.name in ("epsilon", "flat", "wsquare"):
        return [grad / stabilize(z0, s)]
    if rule.name == "zplus":
        return [grad / stabilize(_plus(z0, z[1]), s)] * 2
    assert z2 is not None
    if rule.name == "alpha_beta":
        return [grad / stabilize(_plus(z0, z[1]), s)] * 2 + [grad / stabilize(_plus(z2, z[3]), s)] * 2
    if rule.name == "gamma":
        up, down = grad / stabilize(_plus(z0, z[1]), s), grad / stabilize(_plus(z2, z[3]), s)
        sign = z[4]
        assert sign is not None
        return [(sign > 0) * up] * 2 + [(sign < 0) * down] * 2
    z1 = z[1]  # zbox: no output left out
    assert z1 is not None
    return [grad / stabilize(z0 - z1 - z2, s)] * 3


def _dot(xs: Sequence[Tensor], gs: Sequence[Tensor | None], idx: Sequence[int]) -> Tensor:
    """``sum(xs[i] * gs[i])`` over ``idx``, the terms of outputs left out (zero) skipped."""
    terms = [xs[i] * g for i in idx if (g := gs[i]) is not None]
    return sum(terms[1:], terms[0])


def _reduce(rule: LRPRule, xs: Sequence[Tensor], gs: Sequence[Tensor | None]) -> Tensor:
    g0 = gs[0]
    assert g0 is not None  # the first output is never left out
    if rule.name in ("flat", "wsquare"):
        return g0
    if rule.name == "zbox":
        return _dot(xs, gs, [0]) - _dot(xs, gs, [1]) - _dot(xs, gs, [2])
    if rule.name == "alpha_beta":
        return rule.alpha * _dot(xs, gs, [0, 1]) - rule.beta * _dot(xs, gs, [2, 3])
    return _dot(xs, gs, range(4 if rule.name == "gamma" else len(xs)))


def relevance(rule: LRPRule, layer: Layer, x: Tensor, weight: Tensor, bias: Tensor | None, grad: Tensor) -> Tensor:
    """The relevance of the layer's input ``x`` given ``grad``, the relevance at its output.

    An output whose modified input is all zeros and that has no bias is zero: it is left out, along
    with its gradient (e.g. the negative inputs of ``zplus`` after a ReLU), which changes no value. The
    gamma rule's plain output only gives the sign of each output value and is not differentiated.
    """
    variants = _variants(rule, x)
    nonneg = rule.name in ("zplus", "alpha_beta", "gamma") and bool(x.min() >= 0)  # as after a ReLU
    xs: list[Tensor] = []
    zs: list[Tensor | None] = []
    with torch.enable_grad():
        for i, (on_x, on_w, on_b) in enumerate(variants):
            left_out = nonneg and on_x is _neg and on_b is None  # its input is all zeros
            xi = x.detach() if left_out or (nonneg and on_x is _pos) else on_x(x.detach()).detach()
            b = None if bias is None or on_b is None else on_b(bias)
            sign_only = rule.name == "gamma" and i == 4
            xs.append(xi.requires_grad_(not (left_out or sign_only)))
            with torch.set_grad_enabled(not sign_only):
                zs.append(None if left_out else layer(xi, on_w(weight), b))
        live = [(i, z) for i, z in enumerate(zs) if z is not None and z.requires_grad]
        ds = _denominators(rule, [None if z is None else z.detach() for z in zs], grad)
        found = torch.autograd.grad([z for _, z in live], [xs[i] for i, _ in live], [ds[i] for i, _ in live],
                                    allow_unused=True)
    gs: list[Tensor | None] = [None] * len(xs)
    for (i, _), g in zip(live, found):
        gs[i] = torch.zeros_like(x) if g is None else g
    return _reduce(rule, xs, gs)


def norm_relevance(run: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor, epsilon: float) -> Tensor:
    """The norm rule on a layer without weights: ``x * J^T (R / stabilize(f(x)))``."""
    with torch.enable_grad():
        xi = x.detach().requires_grad_()
        z = run(xi)
        (g,) = torch.autograd.grad(z, xi, grad / stabilize(z.detach(), epsilon))
    return xi.detach() * g
