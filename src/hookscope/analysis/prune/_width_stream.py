"""The hidden width (the residual stream) of an RMSNorm transformer as one channel group: every
embedding column, RMSNorm weight and projection that writes the stream (attention output, MLP
down) is a producer or follower, every projection that reads it (query / key / value, MLP gate and
up, the LM head or classifier) a consumer. After slicing, :func:`fix_width` rescales the norms so
that the smaller model computes exactly what the masked one did, and writes the config.

A masked stream channel is zero everywhere, and an RMSNorm over the full width ``D`` still divides
by ``D``: ``w * x / sqrt(sum_kept x^2 / D + eps)``. With ``k`` channels kept this equals a plain
RMSNorm of ``k`` channels with ``eps' = eps * D / k`` and weight ``w * sqrt(D / k)``, so the
compacted model is a plain model of the same class that ``from_pretrained`` loads (``hidden_size
= k``, ``rms_norm_eps = eps'``, ``head_dim`` written out). A LayerNorm's mean over the full width
has no such form, so models with one are refused. Must not import: any other analysis module,
``cli``, ``viz``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...errors import HookscopeError
from ...selection import named_modules
from ._graph import ChannelGroups, Group, GroupMember

__all__ = ["READERS", "WRITERS", "Stream", "WidthGroup", "read_stream", "with_width", "fix_width", "is_rms_norm",
           "refit_width"]

READERS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head", "score", "classifier")
WRITERS = ("o_proj", "down_proj")


@dataclass(frozen=True)
class Stream:
    """Where the hidden width lives: its size, the embeddings (producers, columns), the norms
    (followers), the writers (producers, rows and bias) and the readers (consumers, columns).

    Example:
        >>> Stream(8, ("embed",), ("norm",), ("o",), ("q",)).width
        8
    """

    width: int
    embeddings: tuple[str, ...]
    norms: tuple[str, ...]
    writers: tuple[str, ...]
    readers: tuple[str, ...]


@dataclass
class WidthGroup(Group):
    """The channel group of the hidden width; ``stream`` says where its channels live.

    Example:
        >>> g = WidthGroup(0, [GroupMember("n", "weight", 0, "follower", ((0,), (1,)))], [])
        >>> g.size, g.stream is None
        (2, True)
    """

    stream: Stream | None = field(default=None, repr=False)


def _width_of(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    width = getattr(cfg, "hidden_size", None)
    return width if isinstance(width, int) and not isinstance(width, bool) else None


def _is_rms(m: nn.Module, width: int) -> bool:
    return is_rms_norm(m) and tuple(getattr(m, "weight").shape) == (width,)


def _role(q: str, m: nn.Module, width: int) -> str | None:
    leaf = q.rsplit(".", 1)[-1]
    if isinstance(m, nn.Embedding) and m.embedding_dim == width:
        return "embedding"
    if _is_rms(m, width):
        return "norm"
    if isinstance(m, nn.Linear) and leaf in WRITERS and m.out_features == width:
        return "writer"
    if isinstance(m, nn.Linear) and leaf in READERS and m.in_features == width:
        return "reader"
    return None


def _refusal(q: str, m: nn.Module, width: int) -> str:
    kind = type(m).__name__
    if isinstance(m, nn.LayerNorm) or "LayerNorm" in kind:
        return (f"'{q}' is a {kind} over the hidden width {width}: its mean over all channels has no exact form "
                "with fewer channels, so the hidden width cannot be pruned; hookscope prunes it in RMSNorm "
                "models (LLaMA, Qwen2, Mistral ...)")
    return (f"'{q}' ({kind}) reads or writes the hidden width {width} in a way hookscope cannot follow, so the "
            "hidden width cannot be pruned; it follows embeddings, RMSNorms and the Linear layers "
            f"{', '.join(WRITERS + READERS)}")


def read_stream(model: nn.Module) -> Stream | str:
    """The model's hidden width, or why it cannot be pruned (one line naming the layer or field).

    Example:
        >>> read_stream(nn.Linear(2, 2))[:40]
        'Linear has no config.hidden_size, so its'

    """
    width = _width_of(model)
    if width is None:
        return (f"{type(model).__name__} has no config.hidden_size, so its hidden width is not known; hookscope "
                "prunes the hidden width of Hugging Face RMSNorm models (LLaMA, Qwen2, Mistral ...)")
    found: dict[str, list[str]] = {"embedding": [], "norm": [], "writer": [], "reader": []}
    for q, m in named_modules(model):
        role = _role(q, m, width)
        if role is not None:
            found[role].append(q)
        elif any(width in p.shape for p in m.parameters(recurse=False)):
            return _refusal(q, m, width)
    for q, m in named_modules(model):
        if "q_proj" in dict(m.named_children()) and not isinstance(getattr(m, "head_dim", None), int):
            return (f"'{q}' has no head_dim of its own (its head size comes from the hidden width), so the "
                    "hidden width cannot be pruned with its heads kept")
    if not found["embedding"] or not found["norm"] or not found["writer"]:
        return (f"{type(model).__name__} has no embedding, RMSNorm or stream-writing projection "
                f"({', '.join(WRITERS)}) of width {width}; hookscope prunes the hidden width of RMSNorm models "
                "(LLaMA, Qwen2, Mistral ...)")
    return Stream(width, *(tuple(found[k]) for k in ("embedding", "norm", "writer", "reader")))


def _members(model: nn.Module, s: Stream) -> list[GroupMember]:
    mods = dict(named_modules(model))
    each = tuple((c,) for c in range(s.width))
    out: list[GroupMember] = []
    seen: set[int] = set()
    parts = ([(q, "weight", 1, "producer") for q in s.embeddings] + [(q, "weight", 0, "follower") for q in s.norms]
             + [(q, n, 0, "producer") for q in s.writers for n in ("weight", "bias")]
             + [(q, "weight", 1, "consumer") for q in s.readers])
    for q, name, dim, role in parts:
        t = mods[q]._parameters.get(name)
        if t is None:
            t = getattr(mods[q], name, None)
        if not isinstance(t, torch.Tensor) or id(t) in seen:
            continue  # a tied LM head is the embedding: sliced once, the tie kept
        seen.add(id(t))
        out.append(GroupMember(q, name, dim, role, each))
    return out


def width_group(model: nn.Module, index: int) -> WidthGroup:
    """The hidden width of ``model`` as group ``index``; refused in one line when it cannot be followed.

    Example:
        >>> width_group(nn.Linear(2, 2), 0)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: Linear has no config.hidden_size, ...
    """
    s = read_stream(model)
    if isinstance(s, str):
        raise HookscopeError(s)
    return WidthGroup(index, _members(model, s), [], stream=s)


def with_width(groups: ChannelGroups, model: nn.Module) -> ChannelGroups:
    """``groups`` with the hidden width's group appended when the model has one hookscope follows
    (otherwise unchanged).

    Example:
        >>> with_width(ChannelGroups([], []), nn.Linear(2, 2)).groups
        []
    """
    s = read_stream(model)
    if isinstance(s, str):
        return groups
    g = WidthGroup(len(groups.groups), _members(model, s), [], stream=s)
    return ChannelGroups([*groups.groups, g], groups.blocked, groups.unseen)


def _configs(model: nn.Module) -> list[Any]:
    out: dict[int, Any] = {}
    for _, m in named_modules(model):
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "hidden_size"):
            out.setdefault(id(cfg), cfg)
    return list(out.values())


def is_rms_norm(m: nn.Module) -> bool:
    """Whether ``m`` is an RMSNorm (torch's or a Hugging Face one) whose width hookscope can change.

    Example:
        >>> is_rms_norm(nn.RMSNorm(4)), is_rms_norm(nn.LayerNorm(4))
        (True, False)
    """
    w = getattr(m, "weight", None)
    return "RMSNorm" in type(m).__name__ and isinstance(w, torch.Tensor) and w.dim() == 1 \
        and (hasattr(m, "variance_epsilon") or hasattr(m, "eps"))


def _rescale(m: nn.Module, ratio: float, k: int) -> None:
    attr = "variance_epsilon" if hasattr(m, "variance_epsilon") else "eps"
    eps = getattr(m, attr)
    if eps is None:  # torch's RMSNorm without eps uses its input's machine epsilon
        eps = torch.finfo(getattr(m, "weight").dtype).eps
    setattr(m, attr, eps * ratio)
    if hasattr(m, "normalized_shape"):
        setattr(m, "normalized_shape", (k,))


def _write_configs(model: nn.Module, width: int, k: int) -> None:
    mods = dict(named_modules(model))
    head_dims = {m.head_dim for m in mods.values() if isinstance(getattr(m, "head_dim", None), int)}
    for cfg in _configs(model):
        if getattr(cfg, "hidden_size", None) != width:
            continue
        if len(head_dims) == 1 and getattr(cfg, "head_dim", None) is None:
            cfg.head_dim = next(iter(head_dims))
        cfg.hidden_size = k
        if isinstance(getattr(cfg, "rms_norm_eps", None), float):
            cfg.rms_norm_eps = cfg.rms_norm_eps * width / k


def fix_width(model: nn.Module, groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> list[str]:
    """After slicing ``k`` of ``D`` stream channels: every RMSNorm gets ``eps * D / k`` and its weight
    times ``sqrt(D / k)`` (the masked model's statistics, exactly), and every Hugging Face config
    ``hidden_size = k``, ``rms_norm_eps`` likewise and ``head_dim`` written out. Returns the norms.

    Example:
        >>> fix_width(nn.Linear(2, 2), ChannelGroups([], []), {})
        []
    """
    mods = dict(named_modules(model))
    for g in groups.groups:
        if not isinstance(g, WidthGroup) or g.stream is None or not drop.get(g.index):
            continue
        s, k = g.stream, g.size - len(drop[g.index])
        for q in s.norms:
            m = mods[q]
            _rescale(m, s.width / k, k)
            weight = m.weight
            assert isinstance(weight, torch.Tensor)
            with torch.no_grad():
                weight.mul_(math.sqrt(s.width / k))
        _write_configs(model, s.width, k)
        return list(s.norms)
    return []


def refit_width(model: nn.Module, norms: Sequence[tuple[nn.Module, int, int]]) -> None:
    """After :func:`~._resize.fit_to` shrank RMSNorms from ``D`` to ``k`` channels (a compacted
    model's file, whose weights already hold the ``sqrt(D / k)``): their ``eps`` times ``D / k`` and
    the configs of that width written as :func:`fix_width` does.

    Example:
        >>> n = nn.RMSNorm(2, eps=1e-6); refit_width(n, [(n, 4, 2)]); n.eps
        2e-06
    """
    for m, width, k in norms:
        _rescale(m, width / k, k)
    for width, k in {(w, k) for _, w, k in norms}:
        _write_configs(model, width, k)
