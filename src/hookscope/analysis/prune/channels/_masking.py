"""Channels masked group-wise (forward pre-hooks on every producer and follower of a group), and the
channels of each group that its masks or zero weights drop: what ``prune_channels``, ``prune_heads``
and ``prune_width`` write, and what ``compact`` removes.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ....errors import HookscopeError
from ....selection import named_modules, unwrap
from ..graph import ChannelGroups, Group
from ..masks import apply_mask

__all__ = ["tensor_of", "mask_channels", "dropped_channels"]


def tensor_of(module: nn.Module, name: str) -> torch.Tensor | None:
    """The parameter or buffer ``name`` of ``module`` (its own tables first: a masked weight's ``weight`` is an
    attribute the mask's pre-hook writes).

    Example:
        >>> tensor_of(nn.Linear(2, 3), "bias").shape
        torch.Size([3])
    """
    for table in (module._parameters, module._buffers):
        t = table.get(name)
        if t is not None:
            return t
    t = getattr(module, name, None)
    return t if isinstance(t, torch.Tensor) else None


def mask_channels(model: nn.Module, groups: ChannelGroups, drop: Mapping[int, Sequence[int]]) -> None:
    """Zero channels group-wise by masks (forward pre-hooks): the producers' weight rows and bias and
    every follower (BatchNorm weight and bias, depthwise rows, layer scales). Consumers need no mask:
    they read zeros. ``drop`` maps a group index to channel indices of that group. The LayerNorms of
    a masked hidden width then normalise over its kept channels (what the compacted ones compute).

    Example:
        >>> from hookscope.analysis.prune import channel_groups
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1))
        >>> x = torch.randn(1, 3, 2, 2)
        >>> mask_channels(net, channel_groups(net, x), {0: [1, 3]})
        >>> net[0].weight.flatten(1).abs().sum(1).gt(0).tolist(), net[0].bias.ne(0).tolist()
        ([True, False, True, False], [True, False, True, False])
    """
    inner, _ = unwrap(model)
    mods = dict(named_modules(inner))
    by_index = {g.index: g for g in groups.groups}
    for gi, chans in drop.items():
        g = by_index.get(gi)
        if g is None:
            raise HookscopeError(f"there is no removable channel group {gi}; pass one of "
                                 f"{sorted(by_index)[:10]} (groups.table() lists them)")
        bad = [k for k in chans if not 0 <= k < g.size]
        if bad:
            raise HookscopeError(f"group {gi} has {g.size} channels, so channel {bad[0]} does not exist; "
                                 f"pass indices in [0, {g.size})")
    for gi, chans in drop.items():
        for m in by_index[gi].members:
            module = mods.get(m.module)
            if m.role == "consumer" or module is None or m.name in module._buffers:
                continue
            t = tensor_of(module, m.name)
            if t is None:
                continue
            pos = [p for k in chans for p in m.positions[k]]
            mask = torch.ones(t.shape, dtype=t.dtype, device=t.device)
            mask.index_fill_(m.dim, torch.tensor(pos, dtype=torch.long, device=t.device), 0)
            apply_mask(module, m.name, mask)
        by_index[gi].after_masking(mods)


def dropped_channels(model: nn.Module, groups: ChannelGroups) -> dict[int, list[int]]:
    """The channels of each group that are zero in every producer and follower parameter (masked or
    zero weights): the ones :func:`compact` removes. Masks are read through their pre-hooks.

    Example:
        >>> from hookscope.analysis.prune import channel_groups
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1))
        >>> x = torch.randn(1, 3, 2, 2); gs = channel_groups(net, x)
        >>> mask_channels(net, gs, {0: [2]}); dropped_channels(net, gs)
        {0: [2]}
    """
    inner, _ = unwrap(model)
    mods = dict(named_modules(inner))
    out: dict[int, list[int]] = {}
    for g in groups.groups:
        zero = _zero_channels(g, mods)
        if zero:
            out[g.index] = zero
    return out


def _zero_channels(g: Group, mods: dict[str, nn.Module]) -> list[int]:
    owners = [m for m in g.members if m.role != "consumer" and m.module in mods
              and m.name not in mods[m.module]._buffers]
    if not any(m.role == "producer" for m in owners):
        return []
    alive = torch.zeros(g.size, dtype=torch.bool)
    for m in owners:
        t = tensor_of(mods[m.module], m.name)
        if t is None:
            return []
        nz = t.detach().ne(0).movedim(m.dim, 0).reshape(t.shape[m.dim], -1).any(1).cpu()
        idx = torch.tensor([p for pos in m.positions for p in pos], dtype=torch.long)
        chan = torch.repeat_interleave(torch.arange(g.size), torch.tensor([len(p) for p in m.positions]))
        if idx.numel():
            alive |= torch.zeros(g.size, dtype=torch.uint8).scatter_reduce(
                0, chan, nz[idx].to(torch.uint8), "amax").bool()
    zero = (~alive).nonzero().flatten().tolist()
    return _keep_one(g, mods, zero)


def _keep_one(g: Group, mods: dict[str, nn.Module], zero: list[int]) -> list[int]:
    """Every member keeps at least one position (a conv of 0 channels cannot run): un-drop one."""
    gone = set(zero)
    for m in g.members:
        t = tensor_of(mods[m.module], m.name) if m.module in mods else None
        held = [k for k in gone if m.positions[k]]
        if t is not None and held and sum(len(m.positions[k]) for k in held) >= t.shape[m.dim]:
            gone.discard(max(held))
    return sorted(gone)
