"""The runs of :func:`hookscope.attribute`: the model called on batches made of the inputs' samples
(scaled, noisy or as they are), the target's score read, and its gradient taken with
``torch.autograd.grad`` at the inputs or at one layer's output, never ``.backward()``.

At a layer, a forward hook hands the model a stand-in for the layer's output (a leaf that the
gradient is taken at, or the scaled outputs of integrated gradients) and keeps it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..._tree import first_tensor, tree_map
from ...core.compiled import HookRefresh, eager, is_compiled
from ...core.hooks import HookGroup, ThreadScope
from ...errors import HookscopeError
from .._targets import call_model, rows_of, scores_of

__all__ = ["Job", "Make", "Pass", "grad", "gradients", "leaf", "opened", "probe", "run", "sharing"]

Make = Callable[[torch.Tensor], torch.Tensor]  # the layer's output -> what stands in for it


@dataclass
class Job:
    """What every run of one attribution shares."""

    model: nn.Module
    x: torch.Tensor  # the inputs, a private detached copy
    kw: dict[str, Any]
    layer: tuple[str, nn.Module] | None
    target: Any = None  # pinned on the inputs by the first pass
    chunk: int = 64  # rows per forward pass
    # the threads whose forward passes this call's hooks act on: its own (and those it starts), not
    # another thread's call on the same model
    scope: ThreadScope = field(default_factory=ThreadScope)

    @property
    def batch(self) -> int:
        return self.x.shape[0]


@dataclass
class Pass:
    """One forward pass: the model's output, the target's scores, the stand-ins kept at the layer."""

    output: Any = None
    scores: torch.Tensor | None = None
    kept: list[torch.Tensor] = field(default_factory=list)
    saved: int = 0  # bytes autograd kept for the backward pass (parameters not counted)
    leaf: torch.Tensor | None = None  # the inputs the gradient is taken at (float inputs only)


@contextmanager
def opened(scope: ThreadScope) -> Iterator[None]:
    """``scope`` open for the block: the calling thread's forward passes are this call's."""
    scope.open()
    try:
        yield
    finally:
        scope.close()


def _stand_in(kept: list[torch.Tensor], make: Make, scope: ThreadScope) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        t = first_tensor(output) if scope.sees() else None
        if t is None:
            return None
        a = make(t)
        kept.append(a)
        # the model gets a copy: an in-place op after the layer must not rewrite what is differentiated
        copy = a.clone()
        return tree_map(lambda u: copy if u is t else u, output)

    return hook


@contextmanager
def _hooked(job: Job, kept: list[torch.Tensor], make: Make | None) -> Iterator[None]:
    if job.layer is None or make is None:
        yield
        return
    group, refresh = HookGroup(), HookRefresh(job.model)
    wrap: Callable[[Any], Any] = eager if is_compiled(job.model) else (lambda f: f)
    try:
        # own hook: replaces the layer's output with a stand-in to differentiate at (capture detaches)
        group.add(job.layer[1].register_forward_hook(wrap(_stand_in(kept, make, job.scope))))
        refresh.open()
        yield
    finally:
        group.remove()
        refresh.close()


def run(job: Job, x: torch.Tensor, rows: torch.Tensor, make: Make | None, count: bool = False) -> Pass:
    """The model on ``x``, the batch of the samples ``rows``; the layer's output replaced by ``make``."""
    p = Pass()
    params = {t.data_ptr() for t in job.model.parameters()} if count else set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            p.saved += t.numel() * t.element_size()
        return t

    counting: AbstractContextManager[Any] = (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if count
                                             else nullcontext())
    with _hooked(job, p.kept, make), counting:
        # a copy: a model that writes into its input must not rewrite the leaf differentiated at
        p.output = call_model(job.model, (x.clone(),), rows_of(job.kw, rows, job.batch))
    if job.layer is not None and make is not None and len(p.kept) != 1:
        others = sharing(job.model, job.layer[1]) if not p.kept else []
        what = "did not run" if not p.kept else f"ran {len(p.kept)} times"
        raise HookscopeError(f"layer {job.layer[0]!r} {what} in the forward pass; attribution at a layer needs "
                             "one tensor output from one call, so pick a layer that runs once"
                             + (f" (its weights are used by {', '.join(map(repr, others))})" if others else ""))
    p.scores = None if job.target is None else scores_of(job.target, p.output, rows)
    return p


def sharing(model: nn.Module, module: nn.Module) -> list[str]:
    """The other modules holding one of ``module``'s parameters as their own: where a tied embedding
    that never runs (T5's ``shared``) is used instead."""
    own = {id(t) for t in module.parameters()}
    return [n for n, m in model.named_modules() if m is not module and own & {id(t) for t in m.parameters(recurse=False)}]


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` to take the gradient at."""
    return t.detach().clone().requires_grad_()


def probe(job: Job, make: Make | None, count: bool) -> Pass:
    """The first pass, on the inputs themselves; ``count``: the bytes autograd keeps counted."""
    x = leaf(job.x) if job.x.is_floating_point() else job.x
    p = run(job, x, torch.arange(job.batch, device=job.x.device), make, count=count)
    p.leaf = x if x.requires_grad else None
    return p


def gradients(job: Job, rows: torch.Tensor, build: Callable[[int, int], torch.Tensor],
              stand: Callable[[int, int], Make] | None) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """``(lo, hi, scores, d score / d x)`` for the rows ``lo:hi`` of a batch of the samples ``rows``,
    ``job.chunk`` rows per forward pass. ``build(lo, hi)`` makes those rows of the input; at a layer
    ``stand(lo, hi)`` makes its stand-in, and the gradient is taken there."""
    for lo in range(0, len(rows), job.chunk):
        hi = min(lo + job.chunk, len(rows))
        x = build(lo, hi)
        x = leaf(x) if job.layer is None else x
        p = run(job, x, rows[lo:hi], None if stand is None else stand(lo, hi))
        at = x if job.layer is None else p.kept[0]
        assert p.scores is not None
        yield lo, hi, p.scores.detach(), grad(job, p.scores, at)


def grad(job: Job, scores: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``d scores.sum() / d at``: each row's own gradient, since the samples of an eval-mode batch do not mix."""
    try:
        (g,) = torch.autograd.grad(scores.sum(), at)
    except RuntimeError as e:
        if "modified by an inplace operation" in str(e):
            raise _written(str(e)) from None
        if "not have been used in the graph" not in str(e) and "does not require grad" not in str(e):
            raise
        where = "the inputs" if job.layer is None else f"layer {job.layer[0]!r}'s output"
        raise HookscopeError(f"the target's score does not depend on {where}, so every attribution would be "
                             "zero; pick a target the model computes from them"
                             + ("" if job.layer is None else " or a layer on the path to it")) from None
    return g


def _written(message: str) -> HookscopeError:
    """One line for autograd's refusal of a tensor its backward reads that the forward wrote into later."""
    found = re.search(r"which is output \d+ of (\w+)", message)
    what = f"{found.group(1).removesuffix('Backward0')}'s output" if found else "a tensor its backward pass reads"
    return HookscopeError(f"the model's forward pass (or target=) writes in place into {what} after computing it, "
                          "so autograd cannot take the gradient; make that operation out of place (h = h + 1, not "
                          "h += 1)")
