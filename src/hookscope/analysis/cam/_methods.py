"""The CAM methods, registered in one table: each is a function from one :class:`Job` (what the hooked pass
left: activations, scores, targets) to :class:`Maps` (a raw map per layer, and notes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ...errors import HookscopeError
from .._targets import Target, anchored
from ._formulas import GRADIENT, cam_map, eigen_map, gradient_map
from ._hooked import Pass
from ._scorecam import flat_scores, score_weights, scorer
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


@dataclass
class Maps:
    """What a method gives: a raw ``B x h x w`` map per layer, notes, and the masked inputs and forwards it ran."""

    raw: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)
    masked: int = 0
    forwards: int = 0


@dataclass(frozen=True)
class Method:
    """A registered method. ``gradient``: it differentiates the score (autograd then says when a layer does
    not reach it; for the others cam checks the graph itself). ``reads``: the settings of :func:`cam` only
    some methods read (``batch_size``, ``progress``), refused for the others."""

    maps: Callable[[Job], Maps]
    gradient: bool
    reads: tuple[str, ...] = ()  # the settings of cam() this method alone reads


def _gradient(name: str, job: Job) -> Maps:
    """The maps of a gradient method, and one note per layer where the score's gradient is exactly zero."""
    G = layer_grads(job.acts, cast(torch.Tensor, job.score), job.shapers, job.coupled)
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
        out.raw[n] = torch.einsum("bk,bkhw->bhw", weights, a).clamp(min=0)
        out.notes += [note] if (note := flat_scores(n, weights)) else []
        out.masked, out.forwards = out.masked + runs, out.forwards + calls
    return out


TABLE: dict[str, Method] = {
    "cam": Method(_cam, gradient=False),
    **{name: Method(functools.partial(_gradient, name), gradient=True) for name in GRADIENT},
    "scorecam": Method(_scorecam, gradient=False, reads=("batch_size", "progress")),
    "eigencam": Method(_eigencam, gradient=False),
}


SETTINGS = tuple(dict.fromkeys(s for m in TABLE.values() for s in m.reads))  # read by some methods only


def readers(setting: str) -> tuple[str, ...]:
    """The CAM methods that read a setting of :func:`cam` only some of them read.

    Example:
        >>> readers("batch_size")
        ('scorecam',)
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
                 coupled: str | None) -> dict[str, torch.Tensor]:
    """``d score_b / d A_b`` per layer, ``B x C x h x w``: one ``autograd.grad`` of the summed scores, or, when
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
            G = as_4d(n, g, shapers[n], B)
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
    pooled = A.mean((2, 3))
    if not (isinstance(hin, torch.Tensor) and hin.shape == pooled.shape and close(hin, pooled)):
        raise HookscopeError(f"method='cam' needs the head {hname!r} to read the global average of layer "
                             f"{name!r}, and it does not; pick the layer the head pools, or use method='gradcam'")
    if not (hout is logits or (isinstance(hout, torch.Tensor) and hout.shape == logits.shape
                               and torch.allclose(hout, logits))):
        raise HookscopeError(f"method='cam' uses the rows of {hname!r}, but the logits are not that layer's "
                             "output; pass output= that returns it, or use method='gradcam'")
    return cam_map(cast(torch.Tensor, head.weight).detach()[targets], A)
