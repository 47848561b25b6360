"""The CAM methods, registered in one table: each is a function from one :class:`Job` (what the hooked pass
left: activations, scores, targets) to :class:`Maps` (a raw map per layer, and notes)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ...errors import HookscopeError
from .._targets import Target, anchored
from ._ablation import ablation_weights
from ._formulas import GRADIENT, cam_map, eigen_map, fem_map, gradient_map, kpca_map, spatial, weighted_sum
from ._fullgrad import fullgrad_maps
from ._hooked import Pass
from ._scorecam import flat_scores, score_weights, scorer
from ._second import finer_score, shapley_weights
from ._shape import as_4d, close

__all__ = ["SETTINGS", "TABLE", "Job", "Maps", "Method", "readers"]

Shaper = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass
class Job:
    """What a method works from: the hooked pass, the chosen layers' activations and the scores."""

    model: nn.Module
    p: Pass
    acts: dict[str, torch.Tensor]  # each layer's output, in the autograd graph
    A: dict[str, torch.Tensor]  # the same, detached, as B x C x h x w in the formulas' precision
    shapers: dict[str, Shaper]
    score: torch.Tensor | None  # each sample's score (None: none read, Eigen-CAM only)
    targets: torch.Tensor | None
    logits: torch.Tensor | None
    coupled: str | None  # a module that mixes the samples of a batch, if any
    kw: dict[str, Any]
    original: torch.Tensor  # the inputs, as given
    target: Target
    output: Callable[[Any], torch.Tensor] | None
    batch_size: int
    progress: bool | None
    settings: dict[str, Any] = field(default_factory=dict)  # the method's own settings, defaults filled in
    modules: dict[str, nn.Module] = field(default_factory=dict)  # the chosen layers, by name
    leaf: torch.Tensor | None = None  # the inputs the pass ran on, as an autograd leaf (None: integer inputs)


@dataclass
class Maps:
    """What a method gives: a raw ``B x ...`` map per layer, notes, and the masked inputs and forwards it ran.
    ``final``: the map at the input's size when the method sums its own terms (FullGrad), else ``None``."""

    raw: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)
    masked: int = 0
    forwards: int = 0
    final: torch.Tensor | None = None


@dataclass(frozen=True)
class Method:
    """A registered method. ``gradient``: it differentiates the score (autograd then says when a layer does
    not reach it; for the others cam checks the graph itself). ``reads``: the settings of :func:`cam` only
    some methods read (``batch_size``, ``progress``), refused for the others."""

    maps: Callable[[Job], Maps]
    gradient: bool
    reads: tuple[str, ...] = ()  # the settings of cam() this method alone reads
    defaults: tuple[tuple[str, Any], ...] = ()  # their values when not given
    scored: bool = True  # needs a target's score (Eigen-CAM, KPCA-CAM, FEM and Random-CAM do not)


def _gradient(name: str, job: Job) -> Maps:
    """The maps of a gradient method, and one note per layer where the score's gradient is exactly zero."""
    G = layer_grads(job.acts, cast(torch.Tensor, job.score), job.shapers, job.coupled, job.original.ndim - 2)
    notes = [note for n in job.acts if (note := blank(n, G[n], job.logits))]
    return Maps({n: gradient_map(name, job.A[n], G[n].to(job.A[n].dtype)) for n in job.acts}, notes)


def _cam(job: Job) -> Maps:
    logits, targets = cast(torch.Tensor, job.logits), cast(torch.Tensor, job.targets)
    return Maps({n: _head_rows(n, a, job.p, logits, targets) for n, a in job.A.items()})


def _eigencam(job: Job) -> Maps:
    return Maps({n: eigen_map(a) for n, a in job.A.items()})


def _scorecam(job: Job) -> Maps:
    # anchored: a region predicted on the inputs stays put on the masked ones, a box lost there scores 0
    score = scorer(job.model, anchored(job.target, job.output, job.p.output), job.output, job.targets, job.kw,
                   job.original.shape[0])
    out = Maps({})
    for n, a in job.A.items():
        weights, runs, calls = score_weights(score, job.original, a, batch_size=job.batch_size,
                                             progress=job.progress)
        out.raw[n] = weighted_sum(weights, a).clamp(min=0)
        out.notes += [note] if (note := flat_scores(n, weights)) else []
        out.masked, out.forwards = out.masked + runs, out.forwards + calls
    return out


def _kpcacam(job: Job) -> Maps:
    s = job.settings
    return Maps({n: kpca_map(a, s["kernel"], s["gamma"], s["degree"], s["coef0"]) for n, a in job.A.items()})


def _fem(job: Job) -> Maps:
    return Maps({n: fem_map(a, job.settings["sigmas"]) for n, a in job.A.items()})


def _randomcam(job: Job) -> Maps:
    # a generator of its own, so the caller's random stream is neither read nor moved; one draw of weights for
    # all samples, so a sample's map does not depend on the batch it is in
    gen = torch.Generator().manual_seed(job.settings["seed"])
    out = {}
    for n, a in job.A.items():
        w = torch.rand(a.shape[1], generator=gen, dtype=torch.float64).mul(2).sub(1).to(a.device, a.dtype)
        out[n] = weighted_sum(w.expand(a.shape[0], -1), a).clamp(min=0)
    return Maps(out)


def _shapleycam(job: Job) -> Maps:
    W = shapley_weights(job.acts, cast(torch.Tensor, job.score), job.shapers, job.coupled, job.original.ndim - 2)
    return Maps({n: weighted_sum(W[n].to(a.dtype), a).clamp(min=0) for n, a in job.A.items()})


def _finercam(job: Job) -> Maps:
    s = job.settings
    score = finer_score(cast(torch.Tensor, job.logits), cast(torch.Tensor, job.targets), s["comparison"], s["alpha"])
    return _gradient("gradcam", dataclasses.replace(job, score=score))


def _ablationcam(job: Job) -> Maps:
    score = scorer(job.model, anchored(job.target, job.output, job.p.output), job.output, job.targets, job.kw,
                   job.original.shape[0])
    out = Maps({})
    for n, a in job.A.items():
        weights, runs, calls = ablation_weights(score, job.modules[n], job.acts[n].detach(), job.shapers[n], a,
                                                job.original, cast(torch.Tensor, job.score).detach(),
                                                batch_size=job.batch_size, ratio=job.settings["ratio"])
        out.raw[n] = weighted_sum(weights.to(a.dtype), a).clamp(min=0)
        out.masked, out.forwards = out.masked + runs, out.forwards + calls
    return out


def _fullgrad(job: Job) -> Maps:
    raw, final = fullgrad_maps(job.acts, job.modules, cast(torch.Tensor, job.leaf), cast(torch.Tensor, job.score),
                               job.original)
    return Maps(raw, final=final)


_KPCA = (("kernel", "sigmoid"), ("gamma", None), ("degree", 3), ("coef0", 1.0))

TABLE: dict[str, Method] = {
    "cam": Method(_cam, gradient=False),
    **{name: Method(functools.partial(_gradient, name), gradient=True) for name in GRADIENT},
    "scorecam": Method(_scorecam, gradient=False, reads=("batch_size", "progress"), defaults=(("batch_size", 16),)),
    "eigencam": Method(_eigencam, gradient=False, scored=False),
    "ablationcam": Method(_ablationcam, gradient=False, reads=("batch_size", "ratio"),
                          defaults=(("batch_size", 32), ("ratio", 1.0))),
    "kpcacam": Method(_kpcacam, gradient=False, reads=tuple(k for k, _ in _KPCA), defaults=_KPCA, scored=False),
    "fem": Method(_fem, gradient=False, reads=("sigmas",), defaults=(("sigmas", 2.0),), scored=False),
    "randomcam": Method(_randomcam, gradient=False, reads=("seed",), defaults=(("seed", 0),), scored=False),
    "shapleycam": Method(_shapleycam, gradient=True),
    "finercam": Method(_finercam, gradient=True, reads=("comparison", "alpha"),
                       defaults=(("comparison", None), ("alpha", 1.0))),
    "fullgrad": Method(_fullgrad, gradient=True),
}


SETTINGS = tuple(dict.fromkeys(s for m in TABLE.values() for s in m.reads))  # read by some methods only


def readers(setting: str) -> tuple[str, ...]:
    """The CAM methods that read a setting of :func:`cam` only some of them read.

    Example:
        >>> readers("batch_size")
        ('scorecam', 'ablationcam')
    """
    return tuple(n for n, m in TABLE.items() if setting in m.reads)


def blank(name: str, G: torch.Tensor, logits: torch.Tensor | None) -> str | None:
    """One line when the score's gradient at a layer is exactly zero for a sample: its map is blank, not an answer."""
    dead = (G.flatten(1).abs().amax(1) == 0).nonzero().flatten().tolist()
    if not dead:
        return None
    equal = logits is not None and bool((logits[dead].amax(1) == logits[dead].amin(1)).all())
    cause = ("all logits are equal: an untrained or zero-initialised head (torchvision's ViT with weights=None)?"
             if equal else "the score does not vary with this layer there (a dead or saturated path?)")
    return (f"the score's gradient at layer {name!r} is exactly zero for sample{'s' if len(dead) > 1 else ''} "
            f"{', '.join(map(str, dead))}, so {'their maps are all zero and say' if len(dead) > 1 else 'its map is all zero and says'} "
            f"nothing; {cause}")


def layer_grads(acts: dict[str, torch.Tensor], score: torch.Tensor,
                 shapers: dict[str, Callable[[torch.Tensor], torch.Tensor] | None],
                 coupled: str | None, rank: int = 2) -> dict[str, torch.Tensor]:
    """``d score_b / d A_b`` per layer, ``B x C x ...``: one ``autograd.grad`` of the summed scores, or, when
    the samples of a batch interact (``coupled``: a batch norm on batch statistics), one per sample."""
    names, B = list(acts), score.shape[0]
    rounds = [score.sum()] if coupled is None or B == 1 else list(score.unbind())
    out: dict[str, torch.Tensor] = {}
    for b, s in enumerate(rounds):
        grads = (torch.autograd.grad(s, [acts[n] for n in names], allow_unused=True, retain_graph=b + 1 < len(rounds))
                 if score.requires_grad else [None] * len(names))
        for n, g in zip(names, grads):
            if g is None:
                raise HookscopeError(f"layer {n!r}'s output does not reach the target score (no gradient "
                                     "flows back to it); pick a layer the score depends on")
            G = as_4d(n, g, shapers[n], B, rank)
            rows = slice(None) if len(rounds) == 1 else slice(b, b + 1)
            if shapers[n] is not None:  # a reshape (yours, or the token layout's) may drop tokens
                lost = (G[rows].flatten(1).abs().amax(1) == 0) & (g[rows].flatten(1).abs().amax(1) > 0)
                if bool(lost.any()):
                    raise HookscopeError(
                        f"layer {n!r}: the score's gradient reaches only positions that reshape= drops (sample "
                        f"{int(lost.nonzero()[0, 0]) + (rows.start or 0)}), such as a class token the head "
                        "reads; pick a layer before the last mixing of tokens, e.g. the last block's first norm")
            if len(rounds) == 1:
                out[n] = G
            else:
                out.setdefault(n, torch.zeros_like(G))[b] = G[b]
    return out


def _head_rows(name: str, A: torch.Tensor, p: Pass, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CAM's map after checking that the model ends in GAP + the linear head whose rows it uses."""
    if p.head is None:
        raise HookscopeError("method='cam' needs a global-average-pool + nn.Linear head, and no nn.Linear "
                             "ran in the forward pass; use method='gradcam'")
    hname, head, hin, hout = p.head
    pooled = A.mean(spatial(A))
    if not (isinstance(hin, torch.Tensor) and hin.shape == pooled.shape and close(hin, pooled)):
        raise HookscopeError(f"method='cam' needs the head {hname!r} to read the global average of layer "
                             f"{name!r}, and it does not; pick the layer the head pools, or use method='gradcam'")
    if not (hout is logits or (isinstance(hout, torch.Tensor) and hout.shape == logits.shape
                               and torch.allclose(hout, logits))):
        raise HookscopeError(f"method='cam' uses the rows of {hname!r}, but the logits are not that layer's "
                             "output; pass output= that returns it, or use method='gradcam'")
    return cam_map(cast(torch.Tensor, head.weight).detach()[targets], A)
