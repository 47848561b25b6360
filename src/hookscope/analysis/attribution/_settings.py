"""Each attribution method's own settings: one small frozen dataclass per method, its fields the only
settings that method reads, checked when it is made.

``attribute(model, x, method=IntegratedGradients(steps=32))`` is ``method="integrated_gradients",
steps=32``; a string is the method with its defaults. Every field is keyword-only, so a new field
can join a class without moving the others.

The file runs past 500 lines because it is the one place every method's settings live: one small
frozen class a method, which ``attribute``, its command and the table read alike.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ...errors import HookscopeError, checked_init
from ._composites import composite_name
from ._lrp_rules import LRPRule
from ._rules import rule_name, rule_points

__all__ = ["LRP", "AttributionMethod", "Deconvnet", "FeatureAblation", "FeaturePermutation", "Gradient",
           "GuidedBackprop", "GuidedGradCam", "InputXGradient", "IntegratedGradients", "KernelShap", "Lime", "Occlusion",
           "Saliency", "ShapleyValueSampling", "SmoothGrad", "SmoothGradSq", "VarGrad", "budget_bytes", "same_value",
           "setting_names", "shown_value"]


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


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def budget_bytes(memory: int | str) -> int:
    """``memory=`` in bytes: an int, or text such as ``"2GB"``, ``"512MiB"`` (the units of ``extract``'s
    ``shard_size=``).

    Example:
        >>> budget_bytes("2GB"), budget_bytes("1KiB"), budget_bytes(100)
        (2000000000, 1024, 100)
    """
    if isinstance(memory, bool) or not isinstance(memory, (int, str)):
        raise HookscopeError(f"memory={memory!r} is not a size; give bytes (an int) or text such as '2GB'")
    if isinstance(memory, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", memory)
        if not m or m.group(2).lower() not in _UNITS:
            raise HookscopeError(f"memory={memory!r} is not a size; write e.g. '2GB', '512MiB' or bytes")
        return max(0, int(float(m.group(1)) * _UNITS[m.group(2).lower()])) or _refuse_zero(memory)
    if memory < 1:
        _refuse_zero(memory)
    return memory


def _refuse_zero(memory: Any) -> int:
    raise HookscopeError(f"memory={memory!r} must be positive; give e.g. '2GB', or None for batch_size rows")


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
    memory: int | str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size)
        if self.memory is not None:
            object.__setattr__(self, "memory", budget_bytes(self.memory))


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


FeatureSpec = torch.Tensor | str | None
_FEATURE_WORDS = ("values", "pixels", "channels")


def _check_baseline(b: Any) -> None:
    if not (b is None or isinstance(b, torch.Tensor) or isinstance(b, (int, float)) and not isinstance(b, bool)):
        raise HookscopeError(f"baseline= is a {type(b).__name__}; pass None (zeros), a number or a tensor")


def _check_features(spec: Any) -> None:
    if spec is None or isinstance(spec, torch.Tensor):
        if isinstance(spec, torch.Tensor) and (spec.is_floating_point() or spec.is_complex() or spec.dtype == torch.bool):
            raise HookscopeError(f"features= is a tensor of {str(spec.dtype).removeprefix('torch.')}; pass integer "
                                 "labels 0..K-1, one per input value (e.g. mask.long())")
        return
    word = spec.split(":")[0] if isinstance(spec, str) else None
    counted = isinstance(spec, str) and word in ("grid", "superpixels") and spec.count(":") == 1 \
        and spec.split(":")[1].isdigit() and int(spec.split(":")[1]) > 0
    if not (counted or spec in _FEATURE_WORDS):
        raise HookscopeError(f"features={spec!r} is not a feature mask; pass a tensor of labels 0..K-1, or one of "
                             "'values', 'pixels', 'channels', 'grid:8' (8 x 8 cells), 'superpixels:50'")


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise HookscopeError(f"seed={seed!r} must be an int")


@dataclass(frozen=True, eq=False, repr=False)
class _Perturbation(AttributionMethod):
    """The methods that run the model on perturbed copies, without gradients: how the copies run."""

    batch_size: int = field(default=64, kw_only=True)
    memory: int | str | None = field(default=None, kw_only=True)
    progress: bool | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size)
        if self.memory is not None:
            object.__setattr__(self, "memory", budget_bytes(self.memory))
        if self.progress is not None and not isinstance(self.progress, bool):
            raise HookscopeError(f"progress={self.progress!r} must be True, False or None (a bar on long runs)")
        if hasattr(self, "baseline"):
            _check_baseline(getattr(self, "baseline"))
        if hasattr(self, "features"):
            _check_features(getattr(self, "features"))
        if hasattr(self, "seed"):
            _check_seed(getattr(self, "seed"))
        if hasattr(self, "samples"):
            _positive("samples", getattr(self, "samples"))


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class Occlusion(_Perturbation):
    """Occlusion (Zeiler and Fergus 2014): a window slid over each input, set to the baseline; each value's
    attribution is the mean of ``f(x) - f(x occluded)`` over the windows that cover it.

    Attributes:
        window: the window's shape, for the last dims of one sample (``(8, 8)`` on ``3 x 32 x 32``
            covers every channel; ``(1, 8, 8)`` one channel at a time), or an int for every dim but
            the first; ``None``: every channel and an eighth of each later dim, rounded up.
        stride: how far the window moves, an int or one per dim of ``window`` (at most the window:
            no value left uncovered); the last window in each dim is cut at the edge, as captum's is.
            ``None``: half the window, rounded up (captum's default is 1).
        baseline: what the window holds: ``None`` (zeros), a number, a tensor of the inputs' shape or
            of one sample's shape.
        batch_size: occluded copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``): the copies per pass
            cut to fit, reckoned from the bytes one copy's forward pass holds at its peak.
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).

    Example:
        >>> Occlusion(window=(4, 4), stride=2)
        Occlusion(window=(4, 4), stride=2, baseline=None, batch_size=64, memory=None, progress=None)
        >>> Occlusion()
        Occlusion(window=None, stride=None, baseline=None, batch_size=64, memory=None, progress=None)
    """

    name: ClassVar[str] = "occlusion"
    window: int | tuple[int, ...] | None = field(default=None, kw_only=True)
    stride: int | tuple[int, ...] | None = field(default=None, kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for what, v in (("window", self.window), ("stride", self.stride)):
            if v is None:
                continue
            if isinstance(v, list):
                v = tuple(v)
                object.__setattr__(self, what, v)
            parts = v if isinstance(v, tuple) else (v,)
            if not parts or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in parts):
                raise HookscopeError(f"{what}={v!r} must be a positive int or a tuple of them, e.g. {what}=(8, 8)")


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class FeatureAblation(_Perturbation):
    """Feature ablation: each feature (a group of input values) set to the baseline in turn; its attribution,
    given to every value of the group, is ``f(x) - f(x with the feature ablated)``.

    Attributes:
        features: which values move together: ``None`` or ``"values"`` (each value on its own),
            ``"pixels"`` (each position, every channel together), ``"channels"`` (each channel),
            ``"grid:8"`` (8 x 8 cells), ``"superpixels:50"`` (about 50 segments of colour and place),
            or a tensor of labels ``0..K-1`` of one sample's shape (or broadcasting to it, such as
            ``H x W`` for images, ``T x 1`` for token spans at an embedding), or with one row per sample.
        baseline: what an ablated feature holds: ``None`` (zeros), a number, a tensor of the inputs'
            shape or of one sample's shape.
        batch_size: perturbed copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``).
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).
    """

    name: ClassVar[str] = "feature_ablation"
    features: FeatureSpec = field(default=None, kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class FeaturePermutation(_Perturbation):
    """Feature permutation (Fisher et al. 2019): each feature's values shuffled across the samples of the
    batch; its attribution is ``f(x) - f(x with the feature shuffled)``, so the batch needs two samples.

    Attributes:
        features: which values move together, as for :class:`FeatureAblation`.
        seed: seeds the shuffles (the caller's random stream is not used): ``torch.manual_seed(seed)``
            before captum's ``FeaturePermutation`` draws the same ones.
        batch_size: shuffled copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``).
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).
    """

    name: ClassVar[str] = "feature_permutation"
    features: FeatureSpec = field(default=None, kw_only=True)
    seed: int = field(default=0, kw_only=True)


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class ShapleyValueSampling(_Perturbation):
    """Shapley value sampling (Castro et al. 2009): features added to the baseline one by one in ``samples``
    random orders; a feature's attribution is its mean marginal gain. Every order's gains sum to
    ``f(x) - f(baseline)``, so the attributions do too.

    Attributes:
        features: which values move together, as for :class:`FeatureAblation`.
        baseline: the value of a feature left out: ``None`` (zeros), a number or a tensor.
        samples: the random orders (each costs one forward pass per feature).
        seed: seeds the orders: ``torch.manual_seed(seed)`` before captum's ``ShapleyValueSampling``
            draws the same ones.
        batch_size: perturbed copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``).
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).
    """

    name: ClassVar[str] = "shapley_value_sampling"
    features: FeatureSpec = field(default=None, kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)
    samples: int = field(default=25, kw_only=True)
    seed: int = field(default=0, kw_only=True)


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class KernelShap(_Perturbation):
    """KernelSHAP (Lundberg and Lee 2017): Shapley values as the weighted least-squares fit of the scores of
    random coalitions of features, held to sum to ``f(x) - f(baseline)``.

    Attributes:
        features: which values move together, as for :class:`FeatureAblation`.
        baseline: the value of a feature left out: ``None`` (zeros), a number or a tensor.
        samples: the coalitions scored, the full and the empty one first (captum's draw); with
            ``samples >= 2**K`` every coalition is scored once with its Shapley kernel weight and the
            values are exact.
        seed: seeds the draw: ``torch.manual_seed(seed)`` before captum's ``KernelShap`` draws the same
            coalitions.
        batch_size: perturbed copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``).
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).
    """

    name: ClassVar[str] = "kernel_shap"
    features: FeatureSpec = field(default=None, kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)
    samples: int = field(default=25, kw_only=True)
    seed: int = field(default=0, kw_only=True)


@checked_init
@dataclass(frozen=True, eq=False, repr=False)
class Lime(_Perturbation):
    """LIME (Ribeiro et al. 2016): a linear model of which features are kept, fitted by ridge regression to
    the scores of random coalitions, each weighted by its similarity to the inputs; the attributions
    are its coefficients.

    Attributes:
        features: which values move together, as for :class:`FeatureAblation`.
        baseline: the value of a feature left out: ``None`` (zeros), a number or a tensor.
        samples: the random coalitions (each feature kept with probability 1/2).
        seed: seeds the draw: ``torch.manual_seed(seed)`` before captum's ``Lime`` draws the same ones.
        kernel_width: the similarity ``exp(-d^2 / (2 w^2))`` of a perturbed copy at distance ``d``.
        distance: ``"cosine"`` (1 - the cosine similarity of the flattened copy and inputs) or
            ``"euclidean"``.
        alpha: the ridge penalty on the coefficients (the intercept is not penalised), as
            scikit-learn's ``Ridge(alpha=)``.
        batch_size: perturbed copies per forward pass.
        memory: a budget for one forward pass (bytes or text such as ``"2GB"``).
        progress: a bar on stderr (``None``: on a terminal, when the run will take more than 5 s).
    """

    name: ClassVar[str] = "lime"
    features: FeatureSpec = field(default=None, kw_only=True)
    baseline: torch.Tensor | float | None = field(default=None, kw_only=True)
    samples: int = field(default=50, kw_only=True)
    seed: int = field(default=0, kw_only=True)
    kernel_width: float = field(default=1.0, kw_only=True)
    distance: str = field(default="cosine", kw_only=True)
    alpha: float = field(default=0.01, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        w, a = self.kernel_width, self.alpha
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
            raise HookscopeError(f"kernel_width={w!r} must be a finite number > 0")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < math.inf:
            raise HookscopeError(f"alpha={a!r} must be a finite number >= 0 (the ridge penalty)")
        if self.distance not in ("cosine", "euclidean"):
            raise HookscopeError(f"distance={self.distance!r} is not a distance; pass 'cosine' or 'euclidean'")


_RUNNING = ("batch_size", "memory", "progress")  # how the copies run, not what they compute: said last


def setting_names(cls: type[AttributionMethod]) -> tuple[str, ...]:
    """The settings a method reads: its own, then how its copies run.

    Example:
        >>> setting_names(SmoothGrad)
        ('samples', 'noise', 'seed', 'batch_size', 'memory')
    """
    names = [f.name for f in dataclasses.fields(cls)]
    return tuple([n for n in names if n not in _RUNNING] + [n for n in names if n in _RUNNING])
