"""Fit a model to a smaller state_dict (a compacted model's): give every layer whose tensors in the
file are smaller the file's shapes and fix its size attributes, so that ``load_state_dict`` then
loads the compacted weights into the original architecture without unpickling any code.

Checked first, changed after: a refusal (a layer type whose sizes hookscope cannot fix, a dim that
grew, another number of dims) leaves the model untouched. Must not import: analysis,
``loading``, ``cli``, ``viz``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..core.text import shape_text
from ..errors import HookscopeError
from ._heads import holds_head_tables, refit_heads, write_head_configs
from ._heads_fit import head_misfit
from ._mlp import write_mlp_configs
from ._width import TOKENS, is_layer_norm, is_rms_norm, refit_width

__all__ = ["RESIZABLE", "fit_to", "fix_sizes", "is_compacted", "marked_compacted", "shrinks"]

RESIZABLE: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd, nn.Linear, nn.modules.batchnorm._NormBase,
                                          nn.LayerNorm, nn.Embedding, nn.PReLU, nn.MultiheadAttention)
"""The layer types whose size attributes :func:`fit_to` knows how to fix."""

_MARK = "hookscope"  # in the root module's entry of the state_dict's ``_metadata``, which torch.save keeps
_COMPACTED = "compacted"


def marked_compacted(state_dict: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """A copy of a compacted model's ``state_dict`` that says so in its ``_metadata`` (kept by
    ``torch.save`` and ``torch.load(weights_only=True)``, ignored by ``load_state_dict``): tensors
    detached, cloned and contiguous, the module versions kept.

    Example:
        >>> state = marked_compacted(nn.Linear(2, 1).state_dict())
        >>> is_compacted(state), is_compacted(nn.Linear(2, 1).state_dict())
        (True, False)
    """
    out = OrderedDict((k, v.detach().clone().contiguous()) for k, v in state_dict.items())
    meta = copy.deepcopy(getattr(state_dict, "_metadata", None)) or OrderedDict()
    meta.setdefault("", {})[_MARK] = _COMPACTED
    setattr(out, "_metadata", meta)
    return out


def is_compacted(held: object) -> bool:
    """Whether what a weights file held is a state_dict :func:`marked_compacted` wrote (see there).

    Example:
        >>> is_compacted({"weight": torch.zeros(1)})
        False
    """
    meta = getattr(held, "_metadata", None)
    root = meta.get("") if isinstance(meta, Mapping) else None
    return isinstance(root, Mapping) and root.get(_MARK) == _COMPACTED


_Tensors = dict[str, tuple[nn.Module, str, torch.Tensor]]


def _owned(model: nn.Module) -> _Tensors:
    """state_dict key -> (module, local name, tensor) for every parameter and persistent buffer."""
    found: _Tensors = {}
    for q, m in model.named_modules(remove_duplicate=False):
        transient: set[str] = getattr(m, "_non_persistent_buffers_set", set())
        for local, t in (*m._parameters.items(), *m._buffers.items()):
            if t is not None and local not in transient:
                found.setdefault(f"{q}.{local}" if q else local, (m, local, t))
    return found


def shrinks(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Whether ``new`` has as many dims as ``old``, none larger, and at least one smaller.

    Example:
        >>> shrinks((64, 3, 7, 7), (32, 3, 7, 7)), shrinks((64,), (64,)), shrinks((4, 4), (2, 8))
        (True, False, False)
    """
    return len(old) == len(new) and all(b <= a for a, b in zip(old, new)) and old != new


def _why_not(q: str, m: nn.Module, key: str, old: torch.Tensor, new: torch.Tensor) -> str | None:
    """Why the tensor ``key`` of layer ``q`` cannot take the file's shape, or None when it can."""
    a, b = tuple(old.shape), tuple(new.shape)
    what = f"{key} (file {shape_text(b)}, model {shape_text(a)})"
    if len(a) != len(b) or any(y > x for x, y in zip(a, b)):
        return f"{what} is not a smaller copy of the model's tensor; only shrunk dims are fitted"
    tokens = key.rsplit(".", 1)[-1] in TOKENS  # ViT's class token and position embeddings: no size attribute
    if not isinstance(m, RESIZABLE) and type(m).__name__ != "Conv1D" and not is_rms_norm(m) and not tokens \
            and not holds_head_tables(m):  # GPT-2's Conv1D; Swin's per-head tables, refitted with the heads
        return (f"{what}: {q or 'the model'} is a {type(m).__name__}, whose sizes hookscope cannot fix (it fits "
                "Conv, Linear, BatchNorm, LayerNorm and Embedding layers)")
    if isinstance(m, nn.Embedding) and b[0] != a[0]:
        return f"{what}: an Embedding keeps its rows (token ids); only embedding_dim is fitted"
    return None


def _check_layer(m: nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why the layer's new shapes do not make a consistent layer, or None."""
    if isinstance(m, nn.modules.conv._ConvNd):
        w = shapes.get("weight", tuple(m.weight.shape))
        depthwise = m.groups > 1 and m.groups == m.in_channels == m.out_channels
        out = w[0] if not m.transposed else w[1] * m.groups
        if not depthwise and out % m.groups:
            return f"its {out} output channels do not divide into its {m.groups} groups"
        if "bias" in shapes and shapes["bias"][0] != (w[0] if depthwise else out):
            return f"its bias ({shapes['bias'][0]}) does not match its {out} output channels"
    if isinstance(m, nn.Linear) and "bias" in shapes and shapes["bias"][0] != shapes.get("weight", m.weight.shape)[0]:
        return "its bias does not match its weight's rows"
    return None


def fix_sizes(m: nn.Module, *, depthwise: bool | None = None) -> None:
    """Set a resized layer's size attributes from its tensors (``compact`` and :func:`fit_to` share it).

    ``depthwise``: whether a conv keeps one group per channel (``None``: as its attributes say).

    Example:
        >>> conv = nn.Conv2d(4, 4, 3, groups=4)
        >>> conv.weight = nn.Parameter(conv.weight[:2].detach())
        >>> fix_sizes(conv); conv.in_channels, conv.out_channels, conv.groups
        (2, 2, 2)
    """
    if isinstance(m, nn.modules.conv._ConvNd):
        w = m.weight
        if depthwise is None:
            depthwise = m.groups > 1 and m.groups == m.in_channels == m.out_channels
        if depthwise:
            m.groups = m.in_channels = m.out_channels = w.shape[0]
        elif m.transposed:
            m.in_channels, m.out_channels = w.shape[0], w.shape[1] * m.groups
        else:
            m.out_channels, m.in_channels = w.shape[0], w.shape[1] * m.groups
    elif isinstance(m, nn.Linear):
        m.out_features, m.in_features = m.weight.shape
    elif isinstance(m, nn.PReLU):
        m.num_parameters = m.weight.numel()
    elif isinstance(m, nn.modules.batchnorm._NormBase):
        t = m.weight if m.weight is not None else m.running_mean
        if t is not None:
            m.num_features = t.shape[0]
    elif isinstance(m, nn.LayerNorm) and m.weight is not None:
        m.normalized_shape = tuple(m.weight.shape)
    elif isinstance(m, nn.Embedding):
        m.embedding_dim = m.weight.shape[1]
    elif type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers' GPT-2 layer: weight (in, out)
        cw = m._parameters.get("weight")
        if cw is not None:
            setattr(m, "nf", cw.shape[1])
            if hasattr(m, "nx"):
                setattr(m, "nx", cw.shape[0])


def _plan(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[int, tuple[str, nn.Module, dict[str, tuple[int, ...]]]]:
    """id(layer) -> (its name, it, local tensor name -> the file's shape) for every tensor that shrinks;
    one line naming the first tensor that cannot."""
    owned = _owned(model)
    names = {id(m): q for q, m in model.named_modules()}
    plan: dict[int, tuple[str, nn.Module, dict[str, tuple[int, ...]]]] = {}
    for key, (m, local, t) in owned.items():
        new = state.get(key)
        if not isinstance(new, torch.Tensor) or tuple(new.shape) == tuple(t.shape):
            continue
        q = names.get(id(m), key.rsplit(".", 1)[0])
        why = _why_not(q, m, key, t, new)
        if why is not None:
            raise HookscopeError(f"cannot fit the model to the file: {why}; load such a file into the model "
                                 "that wrote it")
        plan.setdefault(id(m), (q, m, {}))[2][local] = tuple(new.shape)
    checks = [(q, m, _check_layer(m, shapes)) for q, m, shapes in plan.values()]
    for q, m, why in checks + [(q, m, head_misfit(m, _planned(plan))) for q, m in _attention(model, plan)]:
        if why is not None:
            raise HookscopeError(f"cannot fit {q} ({type(m).__name__}) to the file: {why}; the file is not a "
                                 "compacted copy of this model")
    return plan


Plan = dict[int, tuple[str, nn.Module, dict[str, tuple[int, ...]]]]


def _attention(model: nn.Module, plan: Plan) -> list[tuple[str, nn.Module]]:
    """The modules the plan changes a child of, or an ``nn.MultiheadAttention`` it changes (attention
    layers among them, whose heads must stay whole)."""
    return [(q, m) for q, m in model.named_modules() if any(id(c) in plan for c in m.children())
            or (id(m) in plan and isinstance(m, nn.MultiheadAttention))]


def _planned(plan: Plan) -> Callable[[nn.Module | None, str], tuple[int, ...] | None]:
    """The shape a module's tensor will have once fitted (its own shape where the plan leaves it)."""
    def shape(m: nn.Module | None, name: str) -> tuple[int, ...] | None:
        if m is None:
            return None
        if id(m) in plan and name in plan[id(m)][2]:
            return plan[id(m)][2][name]
        t = getattr(m, name, None)
        return tuple(t.shape) if isinstance(t, torch.Tensor) else None
    return shape


def _swap(store: dict[str, Any], old: torch.Tensor, new: torch.Tensor) -> None:
    for k, v in list(store.items()):
        if v is old:
            store[k] = new


def _refit_attention(model: nn.Module, resized: set[int]) -> None:
    """The head counts of every attention layer whose projections were resized (heads removed)."""
    counts = []
    for m in model.modules():
        if any(id(c) in resized for c in (m, *m.children())):
            found = refit_heads(m)
            if found is not None:
                counts.append((m, found[0], (found[1], found[2])))
    write_head_configs(counts)


def fit_to(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Resize every layer whose tensors in ``state_dict`` are smaller along some dims (a compacted
    model's file, see :func:`hookscope.compact`): new uninitialised tensors of the file's shapes (dtype,
    device and ``requires_grad`` kept; a tensor shared by several layers replaced in all) and the
    layers' sizes fixed (Conv ``in/out_channels`` and ``groups`` when depthwise, Linear
    ``in/out_features``, BatchNorm ``num_features``, LayerNorm ``normalized_shape``, Embedding
    ``embedding_dim``; for a narrower hidden width an RMSNorm's ``eps`` and the Hugging Face config).
    Load the state_dict afterwards; keys the model lacks are left to that load.

    Refuses in one line, leaving the model untouched, a tensor that grew or changed its number of
    dims and a layer of any other type.

    Args:
        model: the original architecture, changed in place.
        state_dict: the compacted model's ``state_dict()`` (keys as the model names them).

    Returns:
        The qualified names of the layers resized, in ``named_modules`` order.

    Example:
        >>> big = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
        >>> small = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.ReLU(), nn.Conv2d(5, 4, 1))
        >>> fit_to(big, small.state_dict())
        ['0', '1', '3']
        >>> _ = big.load_state_dict(small.state_dict()); big[0].out_channels, big[1].num_features, big[3].in_channels
        (5, 5, 5)
    """
    plan = _plan(model, state_dict)
    norms = [(m, int(getattr(m, "weight").shape[0]), shapes["weight"][0]) for _, m, shapes in plan.values()
             if (is_rms_norm(m) or is_layer_norm(m)) and "weight" in shapes]
    replaced: dict[int, torch.Tensor] = {}
    for _, m, shapes in plan.values():
        for local, shape in shapes.items():
            is_param = local in m._parameters
            old = m._parameters[local] if is_param else m._buffers[local]
            assert old is not None
            new = replaced.get(id(old))
            if new is None:
                data = torch.empty(shape, dtype=old.dtype, device=old.device)
                new = nn.Parameter(data, requires_grad=old.requires_grad) if is_param else data
                replaced[id(old)] = new
            for owner in model.modules():  # a tensor two layers share stays shared
                _swap(owner._parameters, old, new)
                _swap(owner._buffers, old, new)
    for _, m, _ in plan.values():
        fix_sizes(m)
    _refit_attention(model, {id(m) for _, m, _ in plan.values()})
    refit_width(model, norms)  # norms of a narrower hidden width: an RMSNorm's eps, the config
    write_mlp_configs(model)
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    return [q for q, m, _ in sorted(plan.values(), key=lambda item: order.get(id(item[1]), 0))]
