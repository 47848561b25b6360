"""Each attribution method's own settings: one small frozen dataclass per method, its fields the only
settings that method reads, checked when it is made.

``attribute(model, x, method=IntegratedGradients(steps=32))`` is ``method="integrated_gradients",
steps=32``; a string is the method with its defaults. Every field is keyword-only, so a new field
can join a class without moving the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ...errors import HookscopeError, checked_init
from ._composites import composite_name
from ._lrp_rules import LRPRule
from ._rules import rule_name, rule_points

__all__ = ["LRP", "AttributionMethod", "Deconvnet", "Gradient", "GuidedBackprop", "GuidedGradCam", "InputXGradient",
           "IntegratedGradients", "Saliency", "SmoothGrad", "SmoothGradSq", "VarGrad", "same_value", "setting_names",
           "shown_value"]


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of one setting are the same (tensors by their values)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b)))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return bool(a == b)  # 1 and 1.0 are one noise
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # a mapping of rules holding tensors, say
        return False


def shown_value(v: Any) -> str:
    """A setting's value as a message shows it: a tensor by its shape and dtype."""
    if isinstance(v, torch.Tensor):
        return f"tensor({'x'.join(map(str, v.shape)) or 'scalar'}, {str(v.dtype).removeprefix('torch.')})"
    return repr(v)


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise HookscopeError(f"{name}={v!r} must be a positive int")


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class AttributionMethod:
    """What every method's settings share: ``name``, the method as ``attribute(method=)`` takes it as a
    string. Two settings objects are equal when they are of one method with the same values (tensors
    compared by value)."""

    name: ClassVar[str] = ""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(same_value(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    def __hash__(self) -> int:
        return hash((type(self), tuple(shown_value(getattr(self, f.name)) for f in dataclasses.fields(self))))

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={shown_value(getattr(self, n))}" for n in setting_names(type(self)))
        return f"{type(self).__name__}({shown})"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class Saliency(AttributionMethod):
    """``|d score / d x|`` (Simonyan et al. 2014); no settings."""

    name: ClassVar[str] = "saliency"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class Gradient(AttributionMethod):
    """``d score / d x``, signed; no settings."""

    name: ClassVar[str] = "gradient"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class InputXGradient(AttributionMethod):
    """``x * d score / d x`` (at a layer: its output times the gradient there); no settings."""

    name: ClassVar[str] = "input_x_gradient"


@dataclass(frozen=True, eq=False, repr=False)
class _Copies(AttributionMethod):
    """The methods that run copies of the inputs: how many rows go into one forward pass."""

    batch_size: int = field(default=64, kw_only=True)
    memory: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size)
        if self.memory is not None:
            _positive("memory", self.memory)


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class IntegratedGradients(_Copies):
    """Integrated gradients (Sundararajan et al. 2017): ``(x - x0) * sum_i w_i g(x0 + a_i (x - x0))``.

    Attributes:
        steps: the number of points on the path from the baseline to the inputs.
        rule: where the points lie and what they weigh: ``"riemann_left"``, ``"riemann_right"``,
            ``"riemann_middle"``, ``"riemann_trapezoid"`` or ``"gausslegendre"``.
        baseline: the path's start: ``None`` (zeros), a number, a tensor of the inputs' shape or of
            one sample's shape.
        batch_size: rows of scaled copies per forward pass.
        memory: a budget in bytes for one forward pass of copies (the rows per pass cut to fit);
            ``None``: ``batch_size`` rows.

    Example:
        >>> IntegratedGradients(steps=8, rule="gauss-legendre")
        IntegratedGradients(steps=8, rule='gausslegendre', baseline=None, batch_size=64, memory=None)
    """

    name: ClassVar[str] = "integrated_gradients"
    steps: int = field(default=50, kw_only=True)
    rule: str = field(default="riemann_trapezoid", kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "rule", rule_name(self.rule))
        rule_points(self.rule, self.steps)  # too few steps for the rule are said here
        b = self.baseline
        if not (b is None or isinstance(b, torch.Tensor) or isinstance(b, (int, float)) and not isinstance(b, bool)):
            raise HookscopeError(f"baseline= is a {type(b).__name__}; pass None (zeros), a number or a tensor")


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class SmoothGrad(_Copies):
    """SmoothGrad (Smilkov et al. 2017): the mean gradient over noisy copies ``x + N(0, s^2)``.

    Attributes:
        samples: the noisy copies of each input.
        noise: the noise's standard deviation as a fraction of each input's range (max - min).
        seed: seeds the noise (the caller's random stream is not used).
        batch_size: rows of noisy copies per forward pass.
        memory: a budget in bytes for one forward pass of copies; ``None``: ``batch_size`` rows.
    """

    name: ClassVar[str] = "smoothgrad"
    samples: int = field(default=50, kw_only=True)
    noise: float = field(default=0.1, kw_only=True)
    seed: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("samples", self.samples)
        n = self.noise
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 <= n < math.inf:
            raise HookscopeError(f"noise={n!r} must be a finite number >= 0 (a fraction of each input's range)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise HookscopeError(f"seed={self.seed!r} must be an int")


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class SmoothGradSq(SmoothGrad):
    """SmoothGrad-squared: the mean of the squared gradient over the noisy copies (settings as :class:`SmoothGrad`)."""

    name: ClassVar[str] = "smoothgrad_sq"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class VarGrad(SmoothGrad):
    """VarGrad (Adebayo et al. 2018): the variance of the gradient over the noisy copies (settings as
    :class:`SmoothGrad`)."""

    name: ClassVar[str] = "vargrad"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class GuidedBackprop(AttributionMethod):
    """Guided backpropagation (Springenberg et al. 2015); no settings."""

    name: ClassVar[str] = "guided_backprop"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class Deconvnet(AttributionMethod):
    """DeconvNet (Zeiler and Fergus 2014); no settings."""

    name: ClassVar[str] = "deconvnet"


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class GuidedGradCam(AttributionMethod):
    """Guided Grad-CAM (Selvaraju et al. 2017), its Grad-CAM at ``attribute(layers=)``; no settings."""

    name: ClassVar[str] = "guided_gradcam"


Composite = str | Mapping[str | type[nn.Module], str | LRPRule]
Bounds = tuple[torch.Tensor | float, torch.Tensor | float]


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class LRP(AttributionMethod):
    """Layer-wise relevance propagation (Bach et al. 2015), as zennit computes it.

    Attributes:
        composite: a composite's name (``"epsilon_plus_flat"``, ``"epsilon_plus"``,
            ``"epsilon_gamma_box"``, ``"epsilon_alpha2_beta1"``), or a mapping of layer names (globs
            allowed) or module types to rules, such as ``{nn.Conv2d: "gamma:0.25", nn.Linear: "epsilon"}``.
        canonize: each batch norm right after a Linear or Conv layer merged into it for the pass;
            ``False``: relevance passes through batch norms.
        bounds: ``(low, high)`` of the inputs for the ``zbox`` rule; ``None``: each sample's smallest
            and largest value.

    Example:
        >>> LRP(composite="epsilon-plus")
        LRP(composite='epsilon_plus', canonize=True, bounds=None)
    """

    name: ClassVar[str] = "lrp"
    composite: Composite = field(default="epsilon_plus_flat", kw_only=True)
    canonize: bool = field(default=True, kw_only=True)
    bounds: Bounds | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.composite, Mapping):
            object.__setattr__(self, "composite", composite_name(self.composite))
        if not isinstance(self.canonize, bool):
            raise HookscopeError(f"canonize={self.canonize!r} must be True or False")
        b = self.bounds
        if b is not None and not (isinstance(b, tuple) and len(b) == 2):
            raise HookscopeError(f"bounds={b!r} must be a pair (low, high) of numbers or tensors, e.g. (0.0, 1.0)")


_RUNNING = ("batch_size", "memory")  # how the copies run, not what they compute: said last


def setting_names(cls: type[AttributionMethod]) -> tuple[str, ...]:
    """The settings a method reads: its own, then how its copies run.

    Example:
        >>> setting_names(SmoothGrad)
        ('samples', 'noise', 'seed', 'batch_size', 'memory')
    """
    names = [f.name for f in dataclasses.fields(cls)]
    return tuple([n for n in names if n not in _RUNNING] + [n for n in names if n in _RUNNING])
