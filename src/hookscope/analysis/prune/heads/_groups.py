"""Attention heads as channel groups: every head of an attention layer is one channel of a group whose
members are that head's query / key / value rows (producers) and the output projection's columns
that read it (followers), so that masking, finding what is masked and slicing are those of every
other channel group (``mask_channels``, ``dropped_channels``, ``compact``).

Under grouped-query attention a layer has two groups: its key/value heads (one channel: the key and
value rows of a key/value head with the rows and columns of every query head that reads it) and its
query heads (one channel: a query head's rows and output columns, its key/value head staying).
The models' reshapes (``repeat_kv``) give every key/value head the same number of query heads, so
a compaction that would leave unequal groups is refused. Must not import: any other analysis
module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ....anatomy import (
    HeadLayout,
    fix_layout,
    heads_of,
    read_layout,
    write_head_configs,
)
from ....errors import HookscopeError
from ....selection import named_modules
from ..graph import ChannelGroups, Group, GroupMember

__all__ = ["HeadGroup", "layouts", "head_groups_of", "with_heads", "kept_heads", "check_heads", "fix_heads"]


@dataclass
class HeadGroup(Group):
    """A channel group whose channels are attention heads: ``layout`` says where they live, ``per``
    whether a channel is a query head (``"q"``) or a key/value head with its query heads (``"kv"``).

    Example:
        >>> from hookscope.anatomy import read_layout
        >>> g = head_groups_of(read_layout("a", nn.MultiheadAttention(8, 2), {}), 0)[0]
        >>> g.size, g.producers, g.members[0].positions[1]
        (2, ['a'], (4, 5, 6, 7))
    """

    layout: HeadLayout | None = field(default=None, repr=False)
    per: str = "kv"


def layouts(model: nn.Module, *, strict: bool = False) -> list[HeadLayout]:
    """The head layouts of every attention layer the readers know, in ``named_modules`` order; an
    attention-like layer whose heads cannot be followed is skipped (``strict``: refused, naming it).

    Example:
        >>> [lay.module for lay in layouts(nn.TransformerEncoderLayer(8, 2))]
        ['self_attn']
    """
    mods = dict(named_modules(model))
    found: list[HeadLayout] = []
    for q, m in mods.items():
        lay = read_layout(q, m, mods)
        if isinstance(lay, str):
            if strict:
                raise HookscopeError(f"{lay}; leave it out with layers=")
            continue
        if lay is not None:
            found.append(lay)
    return found


def _member(lay: HeadLayout, part: Any, chans: Sequence[Sequence[int]]) -> GroupMember:
    d = part.size(lay.head_dim)
    pos = tuple(tuple(p for h in hs for p in range(part.offset + h * d, part.offset + (h + 1) * d)) for hs in chans)
    return GroupMember(part.module, part.name, part.dim, part.role, pos)


def head_groups_of(lay: HeadLayout, first: int) -> list[HeadGroup]:
    """The groups of one attention layer, numbered from ``first``: one group of heads, or under
    grouped-query attention a group of key/value heads and a group of query heads.

    Example:
        >>> from hookscope.anatomy import HeadLayout, Part
        >>> lay = HeadLayout("a", "llama", 4, 2, 1, (Part("a.q", "weight", 0, 0, "q", "producer"),
        ...                  Part("a.k", "weight", 0, 0, "kv", "producer")), "a.o")
        >>> [(g.per, [m.positions for m in g.members]) for g in head_groups_of(lay, 0)]
        [('kv', [((0, 1), (2, 3)), ((0,), (1,))]), ('q', [((0,), (1,), (2,), (3,))])]
    """
    g = lay.group
    by_kv = [[j * g + r for r in range(g)] for j in range(lay.kv_heads)]
    kv_members = [_member(lay, p, by_kv if p.per == "q" else [[j] for j in range(lay.kv_heads)])
                  for p in lay.parts]
    groups = [HeadGroup(first, kv_members, [], layout=lay, per="kv")]
    if g > 1:
        q_members = [_member(lay, p, [[h] for h in range(lay.heads)]) for p in lay.parts if p.per == "q"]
        groups.append(HeadGroup(first + 1, q_members, [], layout=lay, per="q"))
    return groups


def with_heads(groups: ChannelGroups, model: nn.Module, ran: set[str] | None = None) -> ChannelGroups:
    """``groups`` with the head groups of every attention layer that ran appended (numbered after).

    Example:
        >>> import torch
        >>> net = nn.TransformerEncoderLayer(8, 2, batch_first=True)
        >>> gs = with_heads(ChannelGroups([], []), net)
        >>> [(g.index, g.size, type(g).__name__) for g in gs.groups]
        [(0, 2, 'HeadGroup')]
    """
    extra: list[Group] = []
    for lay in layouts(model):
        if ran is None or lay.module in ran:
            extra += head_groups_of(lay, len(groups.groups) + len(extra))
    return ChannelGroups([*groups.groups, *extra], groups.blocked, groups.unseen)


def kept_heads(groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> dict[str, tuple[HeadLayout, list[int]]]:
    """For every attention layer with heads dropped: its layout and the query heads that stay."""
    gone: dict[str, tuple[HeadLayout, set[int]]] = {}
    for g in groups.groups:
        if not isinstance(g, HeadGroup) or g.layout is None or not drop.get(g.index):
            continue
        lay = g.layout
        heads = gone.setdefault(lay.module, (lay, set()))[1]
        for c in drop[g.index]:
            heads.update(range(c * lay.group, (c + 1) * lay.group) if g.per == "kv" else [c])
    return {q: (lay, [h for h in range(lay.heads) if h not in hs]) for q, (lay, hs) in gone.items()}


def check_heads(groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> None:
    """Refuse (one line, naming the layer) heads whose removal the layer's reshape cannot follow: a
    layer left without heads, or key/value heads left with unequal numbers of query heads.

    Example:
        >>> from hookscope.anatomy import HeadLayout
        >>> gs = ChannelGroups(head_groups_of(HeadLayout("attn", "llama", 4, 2, 1, (), None), 0), [])
        >>> check_heads(gs, {1: [0]})
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: 'attn' would keep 1, 2 query heads per key/value head, ...
    """
    for q, (lay, kept) in kept_heads(groups, drop).items():
        if not kept:
            raise HookscopeError(f"'{q}' would keep no attention head; keep at least one per layer")
        per = {j: sum(1 for h in kept if h // lay.group == j) for j in range(lay.kv_heads)}
        counts = sorted({n for n in per.values() if n})
        if len(counts) > 1 or any(n == 0 and _kv_alive(groups, drop, lay, j) for j, n in per.items()):
            raise HookscopeError(
                f"'{q}' would keep {', '.join(str(per[j]) for j in sorted(per))} query heads per key/value head, "
                f"but its reshape (repeat_kv) gives every key/value head the same number; remove whole "
                f"key/value groups or the same number of query heads in every group")


def _kv_alive(groups: ChannelGroups, drop: Mapping[int, Sequence[int]], lay: HeadLayout, j: int) -> bool:
    return not any(isinstance(g, HeadGroup) and g.layout is lay and g.per == "kv" and j in drop.get(g.index, ())
                   for g in groups.groups)


def fix_heads(model: nn.Module, groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> list[str]:
    """After slicing: set the head counts each attention layer reads, then those of its Hugging Face
    config (see :func:`write_configs`). Returns the layers changed.

    Example:
        >>> net = nn.TransformerEncoderLayer(8, 2)
        >>> fix_heads(net, with_heads(ChannelGroups([], []), net), {})
        []
    """
    mods = dict(named_modules(model))
    kept = kept_heads(groups, drop)
    counts: list[tuple[nn.Module, HeadLayout, tuple[int, int]]] = []
    for lay in dict.fromkeys(g.layout for g in groups.groups if isinstance(g, HeadGroup) and g.layout is not None):
        m = mods[lay.module]
        heads = kept[lay.module][1] if lay.module in kept else list(range(lay.heads))
        if lay.module in kept:
            fix_layout(m, lay, heads)
        counts.append((m, lay, heads_of(lay, heads)))
    if kept:
        write_head_configs(counts)
    return list(kept)
