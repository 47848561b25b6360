"""The check that makes compaction safe: run the masked model and the compacted copy on the example
input and compare; when they differ, name the first module whose (kept) output differs, or the module
that raised. Every temporary hook is removed and every training flag restored, also on error. A
model whose output is its hidden width (a bare encoder) is compared on the kept stream channels.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ...._tree import tensors
from ....core.inputs import private
from ....errors import HookscopeError
from ....selection import named_modules
from ..graph import ChannelGroups, traced_mode
from ..width import WidthGroup

__all__ = ["verify", "output_gap"]


def _run(model: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any], wide: bool = False) -> Any:
    """One pass (eval mode; ``wide``: see ``traced_mode``) on a private copy of the inputs (a model may
    write into them)."""
    args, kwargs = private((inputs, kw))
    with traced_mode(model, wide=wide), torch.no_grad():
        return model(*args, **kwargs)


Narrow = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def output_gap(ref: Any, got: Any, atol: float, narrow: Narrow | None = None) -> tuple[float, str]:
    """Largest absolute difference between two nested outputs, and what is wrong ('' when within
    ``atol`` times the scale of the reference, at least 1). ``narrow(ref_tensor, got_tensor)`` may
    first take removed channels out of a reference tensor whose shape differs.

    Example:
        >>> output_gap((torch.ones(2),), (torch.ones(2) + 1e-7,), 1e-5)[1]
        ''
    """
    a, b = list(tensors(ref)), list(tensors(got))
    if len(a) != len(b):
        return float("inf"), f"{len(b)} output tensors instead of {len(a)}"
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        if narrow is not None and x.shape != y.shape:
            x = narrow(x, y)
        if x.shape != y.shape:
            return float("inf"), f"output {i} has shape {tuple(y.shape)} instead of {tuple(x.shape)}"
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return float("inf"), f"output {i} differs"
            continue
        gap = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        scale = max(1.0, float(x.double().abs().max()) if x.numel() else 1.0)
        worst = max(worst, gap)
        if not gap <= atol * scale:
            return gap, f"output {i} differs by {gap:.3g} (tolerance {atol * scale:.3g})"
    return worst, ""


def _outputs(model: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any],
             wide: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """First output tensor of every module, by name, and the stack of modules running when it raised."""
    seen: dict[str, torch.Tensor] = {}
    stack: list[str] = []
    handles = []

    def pre(name: str) -> Any:
        return lambda m, a: stack.append(name)

    def post(name: str) -> Any:
        def hook(m: nn.Module, a: Any, out: Any) -> None:
            stack.pop()
            t = next(tensors(out), None)
            if t is not None:
                seen.setdefault(name, t.detach().clone())
        return hook

    try:
        for name, m in named_modules(model):
            # own hook: the first output of every module, and the modules running when the pass raised
            handles.append(m.register_forward_pre_hook(pre(name or "(model)")))
            handles.append(m.register_forward_hook(post(name or "(model)")))
        try:
            _run(model, inputs, kw, wide)
        except Exception:
            pass
    finally:
        for h in handles:
            h.remove()
    return seen, stack


def _kept(ref: torch.Tensor, name: str, groups: ChannelGroups, drop: dict[int, list[int]]) -> torch.Tensor:
    """The reference output of ``name`` with the removed channels taken out (via the group sites)."""
    by_dim: dict[int, set[int]] = {}
    for g in groups.groups:
        for s in g.sites:
            if s.module == name:
                by_dim.setdefault(s.dim, set()).update(p for k in drop.get(g.index, []) for p in s.positions[k])
    for d, gone in by_dim.items():
        if d < ref.dim():
            keep = [i for i in range(ref.shape[d]) if i not in gone]
            ref = ref.index_select(d, torch.tensor(keep, dtype=torch.long, device=ref.device))
    return ref


def _first_difference(inner: nn.Module, work: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any],
                      atol: float, groups: ChannelGroups, drop: dict[int, list[int]], wide: bool) -> str:
    ref, _ = _outputs(inner, inputs, kw, wide)
    got, stack = _outputs(work, inputs, kw, wide)
    if stack:
        return f"'{stack[-1]}' raised"
    for name, r in ref.items():
        o = got.get(name)
        if o is None or name == "(model)":
            continue
        r = _kept(r, name, groups, drop) if r.shape != o.shape else r
        if r.shape == o.shape and r.is_floating_point() and output_gap(r, o, atol)[1]:
            return f"first at '{name}'"
    return "no single module output differs"


def _stream_narrow(groups: ChannelGroups, drop: dict[int, list[int]]) -> Narrow | None:
    """For a model whose output is its hidden width (a bare encoder): the masked output with the
    removed stream channels taken out, when they are zero in it (the compacted output lacks them)."""
    cut = [(g.size, sorted(drop[g.index])) for g in groups.groups if isinstance(g, WidthGroup) and drop.get(g.index)]
    if not cut:
        return None
    size, gone = cut[0]
    keep = [c for c in range(size) if c not in set(gone)]

    def narrow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[:-1] != y.shape[:-1] or (x.shape[-1], y.shape[-1]) != (size, len(keep)):
            return x
        if bool(x[..., gone].ne(0).any()):
            return x
        return x[..., keep]
    return narrow


def _returns_cache(out: Any) -> bool:
    """Whether a Hugging Face output holds a key/value cache (``use_cache=True``)."""
    return isinstance(out, Mapping) and out.get("past_key_values") is not None


def _why(ref: Any, problem: str) -> str:
    """The likely cause of a compacted model that differs, and its fix."""
    if _returns_cache(ref):
        return ("it returns a key/value cache (past_key_values), which holds the masked model's key/value heads: "
                "compact with kwargs={'use_cache': False}")
    low = [t.dtype for t in tensors(ref) if t.dtype in (torch.float16, torch.bfloat16)]
    if low and "differs by" in problem:
        return (f"the model computes in {str(low[0]).removeprefix('torch.')}, whose rounding changes when fewer "
                "channels are summed: compact a float32 copy (the slicing is exact; cast the result back) or pass "
                "a larger atol=")
    return "a dependency the tracer could not see: report this model"


def verify(inner: nn.Module, work: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any], atol: float,
           groups: ChannelGroups, drop: dict[int, list[int]], *, wide: bool = False) -> None:
    """Refuse (one line) unless ``work`` gives ``inner``'s outputs on the example input (in eval mode;
    ``wide``: with the branches taken only in training, see ``traced_mode``).

    Example:
        >>> verify(nn.Linear(2, 2), nn.Linear(2, 2), (torch.randn(1, 2),), {}, 1e-5, ChannelGroups([], []), {})
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: compaction refused: the compacted model's output 0 differs ...
    """
    ref = _run(inner, inputs, kw, wide)
    mode = " with its training-only branches" if wide else ""
    try:
        got = _run(work, inputs, kw, wide)
    except Exception as exc:
        where = _first_difference(inner, work, inputs, kw, atol, groups, drop, wide)
        msg = str(exc).splitlines()[0] if str(exc) else ""
        raise HookscopeError(f"compaction refused: the compacted model fails{mode} ({where}: {type(exc).__name__}: "
                             f"{msg[:200]}); your model is unchanged, and the groups of channel_groups() "
                             "show what was followed") from None
    gap, problem = output_gap(ref, got, atol, _stream_narrow(groups, drop))
    if problem:
        where = _first_difference(inner, work, inputs, kw, atol, groups, drop, wide)
        why = _why(ref, problem)
        raise HookscopeError(f"compaction refused: the compacted model's {problem}{mode}, {where}; your model is "
                             f"unchanged ({why})")
