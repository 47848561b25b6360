"""The hidden width (the residual stream) of a transformer as one channel group: every embedding
column (and ViT's class token and position embeddings), norm weight and bias and projection that
writes the stream (attention output, MLP down, ViT's patch projection) is a producer or follower,
every projection that reads it (query / key / value, MLP gate and up, pooler, the LM head or
classifier) a consumer. After slicing, :func:`fix_width` makes the norms plain norms of the smaller
width computing exactly what the masked ones did, and writes the config.

RMSNorm: a masked stream channel is zero everywhere, and an RMSNorm over the full width ``D`` still
divides by ``D``: ``w * x / sqrt(sum_kept x^2 / D + eps)``. With ``k`` channels kept this equals a
plain RMSNorm of ``k`` channels with ``eps' = eps * D / k`` and weight ``w * sqrt(D / k)``, so the
compacted model is a plain model of the same class that ``from_pretrained`` loads (``hidden_size
= k``, ``rms_norm_eps = eps'``, ``head_dim`` written out; ``compact`` checks that the config says it).
Gemma's ``(1 + w)`` norms scale ``1 + w`` alike, and its ``sqrt(hidden_size)`` embedding scale
becomes ``sqrt(k)`` with the embedding's weights times ``sqrt(D / k)``. LayerNorm: its mean over the full width
has no such form, so a masked LayerNorm stream normalises over its kept channels (see
``_norm``) and the compacted ``LayerNorm(k)`` keeps ``eps``, weight and bias. Must not
import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ....anatomy import (
    TOKENS,
    embed_scales,
    is_layer_norm,
    is_rms_norm,
    module_widths,
    rescale_norm,
    write_layer_norm_configs,
    write_width_configs,
)
from ....errors import HookscopeError
from ....selection import named_modules
from ..graph import ChannelGroups, Group, GroupMember
from ._norm import hold_norm, release_norm, rms_offset

__all__ = ["READERS", "WRITERS", "Stream", "WidthGroup", "read_stream", "with_width", "fix_width"]

READERS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head", "score", "classifier", "c_attn", "c_fc",
           "query", "key", "value", "intermediate.dense", "pooler.dense", "fc1")
WRITERS = ("o_proj", "down_proj", "attn.c_proj", "mlp.c_proj", "output.dense", "fc2", "patch_embeddings.projection")
"""Readers and writers by the tail of their qualified name; tokens: parameters of the stream's width
(last dim) that an embedding module holds itself (ViT's class token and position embeddings)."""


@dataclass(frozen=True)
class Stream:
    """Where the hidden width lives: its size, the embeddings (producers, columns), the norms
    (followers), the writers (producers, rows and bias), the readers (consumers, columns) and the
    modules holding token parameters of the width (producers, last dim).

    Example:
        >>> Stream(8, ("embed",), ("norm",), ("o",), ("q",)).width
        8
    """

    width: int
    embeddings: tuple[str, ...]
    norms: tuple[str, ...]
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    tokens: tuple[str, ...] = ()


@dataclass
class WidthGroup(Group):
    """The channel group of the hidden width; ``stream`` says where its channels live.

    Example:
        >>> g = WidthGroup(0, [GroupMember("n", "weight", 0, "follower", ((0,), (1,)))], [])
        >>> g.size, g.stream is None
        (2, True)
    """

    stream: Stream | None = field(default=None, repr=False)

    def after_masking(self, modules: Mapping[str, nn.Module]) -> None:
        """The LayerNorms of a masked hidden width normalise over its kept channels (``_norm``)."""
        if self.stream is not None:
            for q in self.stream.norms:
                if q in modules and is_layer_norm(modules[q]):
                    hold_norm(modules[q])


def _width_of(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    width = getattr(cfg, "hidden_size", None)
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if isinstance(emb, nn.Embedding) and isinstance(width, int) and emb.embedding_dim != width \
            and not any(_norm_of(m, width) for _, m in named_modules(model)):
        return emb.embedding_dim  # compacted earlier, its config kept for the original architecture
    return width if isinstance(width, int) and not isinstance(width, bool) else None


def _norm_of(m: nn.Module, width: int) -> bool:
    """Whether ``m`` is a norm (RMSNorm or LayerNorm) over ``width`` channels."""
    return (is_rms_norm(m) or is_layer_norm(m)) and tuple(getattr(m, "weight").shape) == (width,)


def _named(q: str, names: tuple[str, ...]) -> bool:
    return any(q == n or q.endswith("." + n) for n in names)


def _is_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and isinstance(m._parameters.get("weight"), torch.Tensor)


def _sizes(m: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a Linear, transformers' Conv1D (weight ``(in, out)``) or a Conv2d; else None."""
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features
    if _is_conv1d(m):
        w = m._parameters["weight"]
        assert w is not None
        return int(w.shape[0]), int(w.shape[1])
    if isinstance(m, nn.Conv2d) and m.groups == 1:
        return m.in_channels, m.out_channels
    return None


def _tokens(m: nn.Module, width: int) -> bool:
    own = {n: p for n, p in m._parameters.items() if p is not None}
    return any(n in TOKENS for n in own) and all(n in TOKENS and p.shape[-1] == width
                                                  for n, p in own.items() if width in p.shape)


def _role(q: str, m: nn.Module, width: int, pooled: bool) -> str | None:
    sizes = _sizes(m)
    if isinstance(m, nn.Embedding) and m.embedding_dim == width:
        return "embedding"
    if _named(q, ("q_norm", "k_norm")) and _norm_of(m, width):
        return "outside"  # normalises the query or key heads (OLMo 2: all of them), which keep their width
    if _norm_of(m, width):
        return "norm"
    if sizes is not None and _named(q, WRITERS) and sizes[1] == width:
        return "writer"
    if pooled and _named(q, ("classifier",)):
        return "outside"  # reads the pooler's output, which keeps its width
    if sizes is not None and _named(q, READERS) and not isinstance(m, nn.Conv2d) and sizes[0] == width:
        return "reader"
    if _tokens(m, width):
        return "tokens"
    return None


def _refusal(q: str, m: nn.Module, width: int) -> str:
    kind = type(m).__name__
    return (f"'{q}' ({kind}) reads or writes the hidden width {width} in a way hookscope cannot follow, so the "
            "hidden width cannot be pruned; it follows embeddings, RMSNorms, LayerNorms and the projections of "
            "the LLaMA, GPT-2, BERT and ViT layouts (remove or replace that layer)")


def _attention_refusal(model: nn.Module) -> str | None:
    for q, m in named_modules(model):
        kids = dict(m.named_children())
        if not any(k in kids for k in ("q_proj", "query", "c_attn")):
            continue
        if not any(isinstance(getattr(m, a, None), int) for a in ("head_dim", "attention_head_size")):
            return (f"'{q}' has no head_dim of its own (its head size comes from the hidden width), so the "
                    "hidden width cannot be pruned with its heads kept")
    return None


def read_stream(model: nn.Module) -> Stream | str:
    """The model's hidden width, or why it cannot be pruned (one line naming the layer or field).

    Example:
        >>> read_stream(nn.Linear(2, 2))[:40]
        'Linear has no config.hidden_size, so its'

    """
    width = _width_of(model)
    if width is None:
        return (f"{type(model).__name__} has no config.hidden_size, so its hidden width is not known; hookscope "
                "prunes the hidden width of Hugging Face transformers (LLaMA, Qwen2, Mistral, GPT-2, BERT, ViT ...)")
    pooled = any(_named(q, ("pooler.dense",)) for q, _ in named_modules(model))
    found: dict[str, list[str]] = {"embedding": [], "norm": [], "writer": [], "reader": [], "tokens": [],
                                   "outside": []}
    for q, m in named_modules(model):
        role = _role(q, m, width, pooled)
        if role is not None:
            found[role].append(q)
        elif any(width in p.shape for p in m.parameters(recurse=False)):
            return _refusal(q, m, width)
    mods = dict(named_modules(model))
    kinds = {is_layer_norm(mods[q]) for q in found["norm"]}
    if len(kinds) > 1:
        return (f"{type(model).__name__} mixes RMSNorms and LayerNorms over its hidden width, so the hidden width "
                "cannot be pruned")
    odd = [q for q in found["norm"] if not is_layer_norm(mods[q]) and rms_offset(mods[q]) is None]
    if odd:
        return (f"'{odd[0]}' ({type(mods[odd[0]]).__name__}) computes neither weight * x / rms(x) nor "
                "(1 + weight) * x / rms(x), so the hidden width cannot be pruned exactly through it")
    why = _attention_refusal(model)
    if why is not None:
        return why
    if not (found["embedding"] or found["tokens"]) or not found["norm"] or not found["writer"]:
        return (f"{type(model).__name__} has no embedding, norm or stream-writing projection "
                f"({', '.join(WRITERS)}) of width {width}, so its hidden width cannot be followed")
    return Stream(width, *(tuple(found[k]) for k in ("embedding", "norm", "writer", "reader", "tokens")))


def _parts(model: nn.Module, s: Stream) -> list[tuple[str, str, int, str]]:
    """(module, tensor, dim of the width, role) of every member, in the order they are grouped."""
    mods = dict(named_modules(model))
    parts = [(q, "weight", 1, "producer") for q in s.embeddings]
    for q in s.tokens:
        parts += [(q, n, p.dim() - 1, "producer") for n, p in mods[q]._parameters.items()
                  if n in TOKENS and p is not None and p.shape[-1] == s.width]
    parts += [(q, n, 0, "follower") for q in s.norms for n in ("weight", "bias")]
    for q in s.writers:
        parts += [(q, "weight", 1 if _is_conv1d(mods[q]) else 0, "producer"), (q, "bias", 0, "producer")]
    parts += [(q, "weight", 0 if _is_conv1d(mods[q]) else 1, "consumer") for q in s.readers]
    return parts


def _members(model: nn.Module, s: Stream) -> list[GroupMember]:
    mods = dict(named_modules(model))
    each = tuple((c,) for c in range(s.width))
    out: list[GroupMember] = []
    seen: set[int] = set()
    for q, name, dim, role in _parts(model, s):
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


def fix_width(model: nn.Module, groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> list[str]:
    """After slicing ``k`` of ``D`` stream channels: every RMSNorm gets ``eps * D / k`` and its weight
    times ``sqrt(D / k)`` (Gemma's: ``1 + w``; the masked model's statistics, exactly), an embedding
    scaled by ``sqrt(D)`` the scale ``sqrt(k)``, and every Hugging Face config
    ``hidden_size = k``, ``rms_norm_eps`` likewise and ``head_dim`` written out. A LayerNorm stream's
    norms (which already normalised over the kept channels) become plain LayerNorms of ``k``
    channels, and its config is written only where the model's class rebuilds this model from it.
    Returns the norms.

    Example:
        >>> fix_width(nn.Linear(2, 2), ChannelGroups([], []), {})
        []
    """
    mods = dict(named_modules(model))
    for g in groups.groups:
        if not isinstance(g, WidthGroup) or g.stream is None or not drop.get(g.index):
            continue
        s, k = g.stream, g.size - len(drop[g.index])
        if any(is_layer_norm(mods[q]) for q in s.norms):
            for q in s.norms:
                release_norm(mods[q])
            module_widths(model, s.width, k)
            write_layer_norm_configs(model, s.width, k)
            return list(s.norms)
        tied = embed_scales([mods[q] for q in s.embeddings], s.width, k, heads=[mods[q] for q in s.readers])
        for q in s.norms:
            m = mods[q]
            offset = rms_offset(m) or 0.0
            rescale_norm(m, s.width, k)
            weight = m.weight
            assert isinstance(weight, torch.Tensor)
            # the final norm feeding an LM head tied to a rescaled embedding: the two factors cancel
            factor = 1.0 if tied and q == s.norms[-1] else math.sqrt(s.width / k)
            with torch.no_grad():
                weight.add_(offset).mul_(factor).sub_(offset)  # Gemma's (1 + w) scales as LLaMA's w
        module_widths(model, s.width, k)
        write_width_configs(model, s.width, k)
        return list(s.norms)
    return []


