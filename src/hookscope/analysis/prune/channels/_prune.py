"""Structured channel pruning along the dependency graph: score every removable group's channels (by
weight magnitude or by what the model computes on data), choose the lowest, and mask them group-wise;
:func:`~hookscope.analysis.prune.compact` then removes them physically.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.inputs import model_args
from ....core.result import Result
from ....errors import HookscopeError, checked
from ....selection import Layers, Selector, as_selectors, layers, named_modules, unwrap
from ..graph import ChannelGroups, Group, Site, channel_groups
from ..importance import ChannelImportance, channel_importance, check_kind, check_share
from ._masking import dropped_channels, mask_channels

__all__ = ["ChannelRow", "ChannelPruning", "prune_channels", "IMPORTANCE"]

IMPORTANCE = ("l1", "l2", "activation", "apoz", "taylor")
_MAGNITUDE = ("l1", "l2")
_ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Hardswish, nn.Mish,
                nn.PReLU, nn.SELU, nn.CELU)


@dataclass(frozen=True)
class ChannelRow:
    """One channel group: its producers, its channels, how many were masked now (``removed``) and
    before (``already``, by an earlier call or by zero weights), and where it was scored.

    Example:
        >>> ChannelRow(0, "layer1.0.conv1", 64, 32, "layer1.0.relu").kept
        32
    """

    group: int
    producers: str
    channels: int
    removed: int
    scored_at: str
    already: int = 0

    @property
    def kept(self) -> int:
        """Channels left: neither masked now nor before."""
        return self.channels - self.removed - self.already


class ChannelPruning(Result):
    """What :func:`prune_channels` masked: one row per removable group, the groups and the choice.

    ``drop`` maps a group index to the channels masked (indices within the group); ``groups`` is the
    dependency graph they were chosen on (``groups.blocked`` lists what could not be pruned, and why).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 2, 1))
        >>> res = prune_channels(net, torch.randn(1, 3, 4, 4), amount=0.5)
        >>> (res.channels, res.removed), res.rows[0].producers
        ((8, 4), '0')
    """

    def __init__(self, kind: str, amount: float, scope: str, rows: list[ChannelRow], groups: ChannelGroups,
                 drop: dict[int, list[int]]) -> None:
        self.kind, self.amount, self.scope = kind, amount, scope
        self.rows, self.groups, self.drop = rows, groups, drop

    @property
    def channels(self) -> int:
        """Channels in the removable groups that were considered."""
        return sum(r.channels for r in self.rows)

    @property
    def removed(self) -> int:
        """Channels masked."""
        return sum(r.removed for r in self.rows)

    def table(self) -> str:
        """One line per group, then the totals and what was left out."""
        before = any(r.already for r in self.rows)
        extra = f"  {'before':>6}" if before else ""
        lines = [f"{'group':>5}  {'channels':>8}  {'removed':>7}{extra}  {'producers':<36}  scored at"]
        for r in self.rows:
            prod = r.producers if len(r.producers) <= 36 else r.producers[:33] + "..."
            was = f"  {r.already:>6}" if before else ""
            lines.append(f"{r.group:>5}  {r.channels:>8}  {r.removed:>7}{was}  {prod:<36}  {r.scored_at}")
        share = self.removed / self.channels if self.channels else 0.0
        lines.append(f"{self.removed} of {self.channels} channels masked now ({share:.1%}) in {len(self.rows)} groups "
                     f"by {self.kind} importance, amount {self.amount:g} per {self.scope}; "
                     f"{len(self.groups.blocked)} groups cannot be pruned (groups.blocked says why)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the settings, one dict per group, the masked channels and the blocked groups."""
        return {"kind": self.kind, "amount": self.amount, "scope": self.scope,
                "channels": self.channels, "removed": self.removed,
                "rows": [{"group": r.group, "producers": r.producers, "channels": r.channels,
                          "removed": r.removed, "already": r.already, "kept": r.kept,
                          "scored_at": r.scored_at} for r in self.rows],
                "drop": {str(k): v for k, v in self.drop.items()},
                "blocked": [{"producers": b.producers, "size": b.size, "reason": b.reason}
                            for b in self.groups.blocked]}


def _check(amount: object, importance: object, scope: object, data: object) -> float:
    share = check_share(amount, "amount", "channels", "amount=0.5 (every group keeps at least one channel)")
    check_kind(importance, IMPORTANCE)
    if scope not in ("group", "global"):
        raise HookscopeError(f"scope={scope!r} is not known; pass 'group' (the same share of every group) "
                             "or 'global' (ranked across groups)")
    if importance not in _MAGNITUDE and data is None:
        raise HookscopeError(f"importance={importance!r} is measured on data; pass data= (calibration batches) "
                             "or use importance='l2'")
    return share


def _chosen(groups: ChannelGroups, model: nn.Module, selectors: Sequence[Selector] | None) -> list[Group]:
    if not groups.groups:
        reasons = sorted({b.reason for b in groups.blocked})
        warnings.warn(f"no channel of {type(model).__name__} can be removed ({'; '.join(reasons[:3]) or 'no groups'}); "
                      "nothing was masked", stacklevel=4)
    if not selectors:
        return list(groups.groups)
    wanted = {name for name, _ in layers(model, *selectors)}
    found = [g for g in groups.groups if wanted & set(g.producers)]
    if not found:
        raise HookscopeError(f"no removable channel group starts at {sorted(wanted)[:5]}; "
                             "channel_groups(model, x).table() lists the groups and why others are blocked")
    return found


def _magnitude(group: Group, mods: Mapping[str, nn.Module], p: int) -> torch.Tensor:
    """Per channel: the L``p`` norm of every producer's weight rows together."""
    total = torch.zeros(group.size, dtype=torch.float64)
    for m in group.members:
        weight = getattr(mods[m.module], m.name, None) if m.role == "producer" and m.name == "weight" else None
        if not isinstance(weight, torch.Tensor):
            continue
        w = weight.detach().double().cpu().movedim(m.dim, 0)
        for k, pos in enumerate(m.positions):
            rows = w[list(pos)].abs()
            total[k] += rows.sum() if p == 1 else rows.pow(2).sum()
    return total if p == 1 else total.sqrt()


def _sites(group: Group, mods: Mapping[str, nn.Module]) -> list[tuple[Site, list[int]]]:
    """Where each channel of a group is measured: at the outputs of the activation modules carrying it,
    else of the leaf modules carrying it. A site (a branch before a concatenation) may carry only some
    of the group's channels: each site comes with the channels it scores."""
    leaf = [s for s in group.sites if s.module in mods and not any(True for _ in mods[s.module].children())]
    act = {id(s) for s in leaf if isinstance(mods[s.module], _ACTIVATIONS)}
    at_act = {k for s in leaf if id(s) in act for k, pos in enumerate(s.positions) if pos}
    picks = [(s, [k for k, pos in enumerate(s.positions) if pos and (id(s) in act or k not in at_act)]) for s in leaf]
    return [(s, ks) for s, ks in picks if ks]


def _named(site: Site, res: ChannelImportance) -> str:
    """A site as the table shows it: ``layer1.0.relu#2`` when the module runs several times."""
    return site.module if res.calls_per_forward.get(site.module, 1) == 1 else f"{site.module}#{site.call}"


def _unmeasured(g: Group, picks: list[tuple[Site, list[int]]], kind: str) -> HookscopeError | None:
    seen = {k for _, ks in picks for k in ks}
    lacking = [k for k in range(g.size) if k not in seen]
    if not lacking:
        return None
    what = "no module output" if not picks else f"channels {lacking[:3]}{' ...' if len(lacking) > 3 else ''} no module output"
    return HookscopeError(f"channel group {g.index} ({', '.join(g.producers)}) has {what} to measure {kind} at; "
                          "use importance='l2' or restrict layers= to other groups")


def _group_scores(g: Group, picks: list[tuple[Site, list[int]]], res: ChannelImportance) -> torch.Tensor:
    """Each channel's mean over the sites that carry it of its statistic there (the mean over its
    positions at that site: a concatenation puts it at its offset)."""
    sums = torch.zeros(g.size, dtype=torch.float64)
    counts = torch.zeros(g.size, dtype=torch.float64)
    for s, ks in picks:
        per = res.take(s.module, dim=s.dim, call=s.call)
        flat = torch.tensor([p for k in ks for p in s.positions[k]], dtype=torch.long)
        chan = torch.repeat_interleave(torch.tensor(ks), torch.tensor([len(s.positions[k]) for k in ks]))
        total = torch.zeros(g.size, dtype=torch.float64).index_add_(0, chan, per[flat])
        n = torch.bincount(chan, minlength=g.size).double()
        sums[ks] += total[ks] / n[ks]
        counts[ks] += 1
    return sums / counts


def _measured(model: nn.Module, chosen: list[Group], mods: Mapping[str, nn.Module], kind: str, data: Any,
              loss: Any, device: Any, max_batches: int | None) -> tuple[dict[int, torch.Tensor], dict[int, str]]:
    picks = {g.index: _sites(g, mods) for g in chosen}
    for g in chosen:
        problem = _unmeasured(g, picks[g.index], kind)
        if problem is not None:
            raise problem
    sites = {s.module: s.dim for ss in picks.values() for s, _ in ss}
    res: ChannelImportance = channel_importance(model, data, layers=sites, importance=kind, loss=loss, device=device,
                                         max_batches=max_batches)
    scores = {g.index: _group_scores(g, picks[g.index], res) for g in chosen}
    where = {g.index: ", ".join(_named(s, res) for s, _ in picks[g.index]) for g in chosen}
    return scores, where


def _drop(scores: Mapping[int, torch.Tensor], dead: Mapping[int, list[int]], amount: float,
          scope: str) -> dict[int, list[int]]:
    """The lowest-scoring live channels: ``amount`` of each group's live channels, or of all groups'
    ranked together after dividing each group's scores by their mean (groups of different scales become
    comparable). Channels already masked are not counted (pruning again takes ``amount`` of what is
    left, as ``torch.nn.utils.prune`` composes); every group keeps one live channel."""
    live = {g: [k for k in range(len(s)) if k not in set(dead.get(g, ()))] for g, s in scores.items()}
    if scope == "group":
        return {g: sorted(sorted(live[g], key=lambda k: (float(s[k]), k))[:min(math.floor(amount * len(live[g])),
                                                                               len(live[g]) - 1)])
                for g, s in scores.items()}
    ranked = sorted((float(s[k]) / (float(s[live[g]].mean()) or 1.0), g, k)
                    for g, s in scores.items() if live[g] for k in live[g])
    budget = math.floor(amount * len(ranked))
    drop: dict[int, list[int]] = {g: [] for g in scores}
    for _, g, k in ranked:
        if budget == 0:
            break
        if len(drop[g]) < len(live[g]) - 1:
            drop[g].append(k)
            budget -= 1
    return {g: sorted(v) for g, v in drop.items()}


def _finite(scores: Mapping[int, torch.Tensor], where: Mapping[int, str], kind: str) -> None:
    for g, s in scores.items():
        if not bool(torch.isfinite(s).all()):
            raise HookscopeError(f"the {kind} scores of channel group {g} (at {where[g]}) are not finite: NaN or "
                                 "infinity in the calibration data, the weights or the loss; fix those, the ranking "
                                 "would be arbitrary")


@checked
def prune_channels(model: nn.Module, inputs: Any = None, *, amount: float, importance: str = "l2", data: Any = None,
                   layers: Layers | None = None, scope: str = "group",
                   loss: Any = None, kwargs: Mapping[str, Any] | None = None,
                   device: torch.device | str | None = None, max_batches: int | None = None) -> ChannelPruning:
    """Mask whole channels, group by group along the dependency graph, ready for :func:`compact`.

    The groups come from one forward pass on ``inputs`` (:func:`channel_groups`): a conv's output
    channels with the BatchNorm after it, the next layers' inputs, every branch a residual add or a
    concatenation joins. In each group the ``amount`` lowest-scoring channels are masked (forward
    pre-hooks, the layout of ``torch.nn.utils.prune``) on every member that must be zero for the
    channel to be zero downstream; at least one channel of a group stays. Scores: ``"l1"`` / ``"l2"``,
    the norm of the producers' weight rows; ``"activation"`` (mean |activation|), ``"apoz"`` (1 - the
    share of zeros after a ReLU) or ``"taylor"`` (|activation x gradient|) measured on ``data`` at the
    activation modules the group's channels pass (:func:`channel_importance`).

    Args:
        model: the model; pruned in place (masks), wrappers seen through.
        inputs: an example input for the one traced forward pass.
        amount: the share of the live channels to mask, in [0, 1): channels already masked (an
            earlier call, zero weights) are not counted, so pruning again composes as torch's does.
        importance: ``"l1"``, ``"l2"``, ``"activation"``, ``"apoz"`` or ``"taylor"``.
        data: calibration batches for the measured kinds (see :func:`channel_importance`).
        layers: a selector or a list of them: only the groups these modules start.
        scope: ``"group"`` (``amount`` of every group) or ``"global"`` (ranked across groups).
        loss: for ``"taylor"``: ``(output, batch) -> loss``; default cross entropy on labelled batches.
        kwargs: keyword inputs of the traced pass.
        device: where calibration batches go. max_batches: stop calibrating after this many.

    Returns:
        A :class:`ChannelPruning`; ``compact(model, inputs)`` then makes the model smaller.

    Example:
        >>> torch.manual_seed(0); net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        ...     nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
        <torch._C.Generator object at ...>
        >>> res = prune_channels(net, torch.randn(1, 3, 8, 8), amount=0.5)
        >>> [(r.producers, r.channels, r.removed) for r in res.rows]
        [('0', 8, 4), ('3', 4, 2)]
    """
    inputs = model_args(inputs)
    share = _check(amount, importance, scope, data)
    inner, _ = unwrap(model)
    groups = channel_groups(inner, inputs, kwargs=dict(kwargs or {}))
    sel = None if layers is None else as_selectors(layers)
    chosen = _chosen(groups, inner, sel)
    mods = dict(named_modules(inner))
    if importance in _MAGNITUDE:
        p = 1 if importance == "l1" else 2
        scores = {g.index: _magnitude(g, mods, p) for g in chosen}
        where = {g.index: "weights of " + ", ".join(g.producers) for g in chosen}
    else:
        scores, where = _measured(inner, chosen, mods, importance, data, loss, device, max_batches)
    _finite(scores, where, importance)
    dead = dropped_channels(inner, groups)
    drop = _drop(scores, dead, share, scope)
    mask_channels(inner, groups, {g: v for g, v in drop.items() if v})
    rows = [ChannelRow(g.index, ", ".join(g.producers), g.size, len(drop[g.index]), where[g.index],
                       len(dead.get(g.index, ()))) for g in chosen]
    return ChannelPruning(importance, share, scope, rows, groups, drop)
