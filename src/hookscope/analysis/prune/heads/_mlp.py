"""The MLP hidden units of transformer blocks, scored in the same calibration pass as the attention
heads and masked as channel groups: the units feeding each block's down / output projection
(LLaMA's ``down_proj`` after ``act(gate) * up``, GPT-2's ``mlp.c_proj``, BERT's ``output.dense``,
timm's ``mlp.fc2``, torchvision's ``mlp[3]``, ``nn.TransformerEncoderLayer.linear2``), found on the
graph :func:`~hookscope.analysis.prune.channel_groups` traces, so that :func:`~hookscope.analysis.prune.compact` removes them.

A forward pre-hook on each down projection reads its input: ``"output"`` reduces ``|a|`` per unit on
the device in the hook; ``"taylor"`` keeps ``a`` for the batch, and the heads' own ``autograd.grad``
call takes ``dL/da`` with the heads' slices (``taylor_scores(also=...)``); ``"l2"`` reads the weights.
Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....anatomy import HeadLayout
from ....core.hooks import HookGroup
from ....errors import HookscopeError
from ....selection import named_modules
from ..channels import dropped_channels, mask_channels
from ..graph import ChannelGroups, Group, GroupMember, channel_groups
from ..importance import accumulator_dtype, check_share

__all__ = ["MlpRow", "MlpUnits", "check_mlp", "mlp_units", "MlpScores", "mlp_rows"]


@dataclass(frozen=True)
class MlpRow:
    """One MLP: its down projection (``layer``), its hidden ``units``, the units masked now
    (``removed``) and before (``already``), and each unit's score.

    Example:
        >>> MlpRow("blocks.0.mlp.fc2", 4, (1,), (0.5, 0.1, 0.9, 0.2), (3,)).kept
        2
    """

    layer: str
    units: int
    removed: tuple[int, ...]
    scores: tuple[float, ...]
    already: tuple[int, ...] = ()

    @property
    def kept(self) -> int:
        """Hidden units left."""
        return self.units - len(self.removed) - len(self.already)


@dataclass(frozen=True)
class MlpUnits:
    """The channel group of one MLP's hidden units and the down projection's columns reading them.

    Example:
        >>> from hookscope.analysis.prune import GroupMember
        >>> down = GroupMember("mlp.fc2", "weight", 1, "consumer", ((0,), (1,)))
        >>> MlpUnits(Group(0, [down], []), down).layer
        'mlp.fc2'
    """

    group: Group
    down: GroupMember

    @property
    def layer(self) -> str:
        """The down projection's name."""
        return self.down.module


def check_mlp(mlp: object) -> float | None:
    """``mlp=`` as a share in [0, 1), or None; anything else refused in one line.

    Example:
        >>> check_mlp(0.25), check_mlp(None)
        (0.25, None)
    """
    return None if mlp is None else check_share(mlp, "mlp", "MLP hidden units",
                                                "mlp=0.25 (every MLP keeps at least one unit)")


def _inside(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def _depth(name: str, prefix: str) -> int:
    return name.count(".") + 1 - (prefix.count(".") + 1 if prefix else 0)


def _beside(down: str, every: Sequence[HeadLayout], chosen: Sequence[HeadLayout]) -> bool:
    """Whether the down projection sits in a transformer block beside one of the ``chosen`` attention
    layers: its nearest ancestor holding any attention layer holds a chosen one, and holds it and the
    down projection at most two levels down (a classifier after the blocks is not an MLP of a block)."""
    parts = down.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        block = ".".join(parts[:cut])
        if any(_inside(lay.module, block) for lay in every):
            near = [lay.module for lay in chosen if _inside(lay.module, block)]
            return bool(near) and _depth(down, block) <= 2 and min(_depth(q, block) for q in near) <= 2
    return False


def _down_of(g: Group, every: Sequence[HeadLayout]) -> GroupMember | None:
    """The one consumer weight of a group of Linear hidden units outside any attention layer."""
    if any(_inside(m.module, lay.module) for m in g.members for lay in every if lay.module):
        return None
    downs = [m for m in g.members if m.role == "consumer" and m.name == "weight"]
    producers = [m for m in g.members if m.role == "producer" and m.name == "weight"]
    return downs[0] if len(downs) == 1 and producers else None


def mlp_units(model: nn.Module, every: Sequence[HeadLayout], chosen: Sequence[HeadLayout], inputs: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[ChannelGroups, list[MlpUnits]]:
    """The channel groups traced on the example input and the MLPs beside the ``chosen`` attention
    layers (``every``: all attention layers, whose own groups are left out).

    Example:
        >>> from hookscope.analysis.prune.heads._groups import layouts
        >>> net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
        >>> _, units = mlp_units(net, layouts(net), layouts(net), (torch.randn(1, 3, 8),), {})
        >>> [(u.layer, u.group.size) for u in units]
        [('linear2', 16)]
    """
    if not inputs and not kwargs:
        raise HookscopeError("mlp= finds the MLPs on an example input; pass one: prune_heads(model, x, ..., mlp=)")
    gs = channel_groups(model, inputs, kwargs=kwargs)
    units = []
    for g in gs.groups:
        down = _down_of(g, every)
        if down is not None and _beside(down.module, every, chosen):
            units.append(MlpUnits(g, down))
    if not units:
        raise HookscopeError(f"mlp=: no MLP of {type(model).__name__} beside the attention layers chosen has hidden "
                             "units hookscope can remove (channel_groups(model, x).table() shows why); drop mlp=")
    return gs, units


class _Units:
    """One MLP's running per-column sums on the device; for taylor the inputs of this batch's calls,
    kept until the backward (the ``calls`` / ``add`` pair ``taylor_scores(also=...)`` reads)."""

    def __init__(self, unit: MlpUnits) -> None:
        self.unit, self.total, self.count = unit, torch.zeros(0), 0
        self.calls: list[tuple[torch.Tensor, int]] = []

    def _sum(self, per: torch.Tensor, n: int) -> None:
        self.total = per if self.total.numel() == 0 else self.total + per
        self.count += n

    def add_output(self, a: torch.Tensor) -> None:
        flat = a.detach().reshape(-1, a.shape[-1])
        self._sum(flat.abs().sum(0, dtype=accumulator_dtype(a.device)), flat.shape[0])

    def keep(self, a: torch.Tensor) -> None:
        if not a.requires_grad:
            raise HookscopeError(f"taylor: no gradient reaches the input of '{self.unit.layer}'; prune its MLP "
                                 "with importance='output' or drop mlp=")
        self.calls.append((a, 0))

    def add(self, z: torch.Tensor, g: torch.Tensor | None, batch_dim: int) -> None:
        z = z.detach().movedim(batch_dim, 0)
        g = torch.zeros_like(z) if g is None else g.movedim(batch_dim, 0)
        if z.dtype in (torch.float16, torch.bfloat16):  # products and sums of half precision lose the score
            z, g = z.float(), g.float()
        per = (z * g).reshape(z.shape[0], -1, z.shape[-1]).sum(1, dtype=accumulator_dtype(z.device))
        self._sum(per.abs().sum(0), z.shape[0])  # per sample |sum over positions of a * dL/da|

    def scores(self) -> torch.Tensor:
        if self.count == 0:
            raise HookscopeError(f"'{self.unit.layer}' did not run on the calibration data, so its MLP units have "
                                 "nothing to score; pass data that runs it or importance='l2'")
        per = (self.total / self.count).cpu().double()
        return torch.stack([per[list(pos)].mean() for pos in self.unit.down.positions])


def _pre(acc: _Units, taylor: bool) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor):
            if taylor:
                acc.keep(args[0])
            else:
                acc.add_output(args[0])
    return hook


def _l2(mods: dict[str, nn.Module], unit: MlpUnits) -> torch.Tensor:
    """Per unit: the L2 norm of its weight rows in the producers and its columns in the down projection."""
    total = torch.zeros(unit.group.size, dtype=torch.float64)
    for m in unit.group.members:
        w = getattr(mods[m.module], m.name, None) if m.name == "weight" and m.role != "follower" else None
        if isinstance(w, torch.Tensor):
            t = w.detach().double().cpu().movedim(m.dim, 0)
            for k, pos in enumerate(m.positions):
                total[k] += t[list(pos)].pow(2).sum()
    return total.sqrt()


class MlpScores:
    """The MLP side of one head pruning: hooks for the heads' calibration pass, then the choice and the
    masks (the lowest ``share`` of each MLP's live units; every MLP keeps one).

    Example:
        >>> from hookscope.analysis.prune.heads._groups import layouts
        >>> torch.manual_seed(0); net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
        <torch._C.Generator object at ...>
        >>> x = torch.randn(1, 3, 8); gs, units = mlp_units(net, layouts(net), layouts(net), (x,), {})
        >>> mlp = MlpScores(net, gs, units, "output", 0.25)
        >>> with mlp.measuring():
        ...     _ = net(x)
        >>> rows = mlp.mask(mlp.choose()); rows[0].units, len(rows[0].removed)
        (16, 4)
    """

    def __init__(self, model: nn.Module, groups: ChannelGroups, units: list[MlpUnits], importance: str,
                 share: float) -> None:
        self.model, self.groups, self.units, self.share = model, groups, units, share
        self.importance = "output" if importance == "entropy" else importance  # no attention in an MLP
        self.accs = [_Units(u) for u in units]
        self.drop: dict[int, list[int]] = {}
        self.scores: list[torch.Tensor] = []
        self.dead: dict[int, list[int]] = {}

    @property
    def also(self) -> list[_Units]:
        """What the heads' Taylor backward also takes the gradient of."""
        return self.accs if self.importance == "taylor" else []

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """The hooks on every down projection, while the calibration pass runs; removed after."""
        if self.importance == "l2":
            yield
            return
        mods = dict(named_modules(self.model))
        with HookGroup() as group:
            for acc in self.accs:
                # own hook: the down projection's input, reduced on the device (output) or kept for the backward
                group.add(mods[acc.unit.layer].register_forward_pre_hook(_pre(acc, self.importance == "taylor")))
            yield

    def choose(self) -> dict[int, list[int]]:
        """Every MLP's units to mask (with those already masked), by group index; checks the scores."""
        mods = dict(named_modules(self.model))
        self.scores = [_l2(mods, u) if self.importance == "l2" else a.scores() for u, a in zip(self.units, self.accs)]
        self.dead = dropped_channels(self.model, self.groups)
        for u, s in zip(self.units, self.scores):
            if not bool(torch.isfinite(s).all()):
                raise HookscopeError(f"the {self.importance} scores of the MLP units of '{u.layer}' are not finite "
                                     "(NaN or infinity in the data or the weights); fix those, the ranking would be "
                                     "arbitrary")
            dead = set(self.dead.get(u.group.index, ()))
            live = [k for k in range(u.group.size) if k not in dead]
            n = min(math.floor(self.share * len(live)), len(live) - 1)
            low = sorted(live, key=lambda k: (float(s[k]), k))[:max(n, 0)]
            self.drop[u.group.index] = sorted(dead | set(low))
        return self.drop

    def mask(self, drop: dict[int, list[int]]) -> list[MlpRow]:
        """Masks the chosen units (ready for ``compact``); one row per MLP."""
        mask_channels(self.model, self.groups, {g: v for g, v in drop.items() if v})
        return mlp_rows(self.units, self.scores, self.dead, drop)


def mlp_rows(units: Sequence[MlpUnits], scores: Sequence[torch.Tensor], dead: dict[int, list[int]],
             drop: dict[int, list[int]]) -> list[MlpRow]:
    """One row per MLP: units masked now (``drop`` less ``dead``) and before.

    Example:
        >>> from hookscope.analysis.prune import GroupMember
        >>> down = GroupMember("fc2", "weight", 1, "consumer", ((0,), (1,), (2,)))
        >>> mlp_rows([MlpUnits(Group(0, [down], []), down)], [torch.ones(3)], {0: [2]}, {0: [0, 2]})[0].removed
        (0,)
    """
    out = []
    for u, s in zip(units, scores):
        before = set(dead.get(u.group.index, ()))
        now = tuple(k for k in drop.get(u.group.index, ()) if k not in before)
        out.append(MlpRow(u.layer, u.group.size, now, tuple(float(v) for v in s), tuple(sorted(before))))
    return out
