"""Channel groups: the sets of channels that must be removed together, found by tracing ONE forward
pass under a ``TorchFunctionMode`` that gives every tensor a shadow of channel ids (see
``_state`` and ``_ops``). Collect (trace), result (``ChannelGroups``), render (``table()``).

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ....core.inputs import model_args
from ...._tree import tensors
from ....core.inputs import private
from ....core.result import Result
from ....core.state import restored, rng_devices
from ....errors import HookscopeError, checked
from ....selection import named_modules, unwrap
from ..masks import make_permanent, masked
from ._call import op_name
from ._ops import handle
from ._state import Tracer

__all__ = ["GroupMember", "Site", "Group", "BlockedGroup", "ChannelGroups", "channel_groups", "trace_channels",
           "prepared", "deep_copy", "assemble", "traced_mode"]


@dataclass(frozen=True)
class GroupMember:
    """A parameter or buffer of a group: ``positions[k]`` are the indices along ``dim`` of channel k.

    ``role``: ``producer`` (creates the channel: conv/linear output rows, bias), ``follower`` (masked
    with it: BatchNorm, depthwise conv, layer scale) or ``consumer`` (reads it: next layer's input
    columns).

    Example:
        >>> GroupMember("fc", "weight", 1, "consumer", ((0,), (1,))).positions[1]
        (1,)
    """

    module: str
    name: str
    dim: int
    role: str
    positions: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Site:
    """A module output that carries the group's channels: ``positions[k]`` along ``dim`` for channel k;
    ``call`` is which call of the module it is (0-based, in execution order: one ReLU module may
    serve several groups, one call each).

    Example:
        >>> Site("relu", 1, ((0,), (1,)), call=1).dim
        1
    """

    module: str
    dim: int
    positions: tuple[tuple[int, ...], ...]
    call: int = 0


@dataclass
class Group:
    """Channels removed together: ``size`` channels, the ``members`` to slice and the ``sites``
    (module outputs) where they can be measured. ``blocked`` channels of the group are left out.

    Example:
        >>> g = Group(0, [GroupMember("c", "weight", 0, "producer", ((0,), (1,)))], [], 0, "")
        >>> g.size, g.producers
        (2, ['c'])
    """

    index: int
    members: list[GroupMember]
    sites: list[Site]
    blocked: int = 0
    reason: str = ""

    @property
    def size(self) -> int:
        """Number of removable channels."""
        return len(self.members[0].positions) if self.members else 0

    @property
    def producers(self) -> list[str]:
        """Modules whose output channels start the group."""
        return list(dict.fromkeys(m.module for m in self.members if m.role == "producer"))

    def after_masking(self, modules: Mapping[str, nn.Module]) -> None:
        """What the group's modules need once its channels are masked, beyond the masks: nothing for a
        plain group (its consumers read zeros); a group of the hidden width says its own."""


@dataclass(frozen=True)
class BlockedGroup:
    """A group none of whose channels can be removed, and why.

    Example:
        >>> BlockedGroup(["fc"], 10, "reaches the model's output").reason
        "reaches the model's output"
    """

    producers: list[str]
    size: int
    reason: str


@dataclass
class ChannelGroups(Result):
    """The channel groups of a model: ``groups`` (removable), ``blocked`` (with reasons), ``unseen``
    (modules with parameters that did not run on the example input: left as they are).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1))
        >>> gs = channel_groups(net, torch.randn(1, 3, 4, 4))
        >>> [(g.producers, g.size) for g in gs.groups], [b.reason for b in gs.blocked]
        ([(['0'], 4)], ["reaches the model's output"])
    """

    groups: list[Group]
    blocked: list[BlockedGroup]
    unseen: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per group (removable first)."""
        rows = [{"group": g.index, "channels": g.size, "producers": ", ".join(g.producers),
                 "members": len(g.members), "note": f"{g.blocked} blocked: {g.reason}" if g.blocked else ""}
                for g in self.groups]
        return rows + [{"group": "-", "channels": b.size, "producers": ", ".join(b.producers),
                        "members": 0, "note": b.reason} for b in self.blocked]

    def table(self) -> str:
        """A plain-text table of the groups."""
        lines = [f"{'group':>5}  {'channels':>8}  {'producers':<40}  note"]
        for r in self.rows:
            prod = r["producers"] if len(r["producers"]) <= 40 else r["producers"][:37] + "..."
            lines.append(f"{r['group']:>5}  {r['channels']:>8}  {prod:<40}  {r['note']}")
        lines.append(f"{len(self.groups)} removable groups ({sum(g.size for g in self.groups)} channels), "
                     f"{len(self.blocked)} blocked")
        if self.unseen:
            lines.append(f"did not run on the example input, left as they are: {', '.join(self.unseen[:8])}"
                         + (" ..." if len(self.unseen) > 8 else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, strings, ints)."""
        return {"groups": [asdict(g) for g in self.groups], "blocked": [asdict(b) for b in self.blocked],
                "unseen": list(self.unseen)}


# --- collect -------------------------------------------------------------------------------------
class _Mode(TorchFunctionMode):
    def __init__(self, tr: Tracer) -> None:
        super().__init__()
        self.tr = tr

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tr.touch((*args, *kwargs.values()))
        try:
            handle(self.tr, func, tuple(args), kwargs, out)
        except Exception as exc:  # a tracer gap must block channels, never break the user's forward
            for t in (*args, *kwargs.values()):
                self.tr.block_tensor(t, f"the tracer failed on {op_name(func)[0]} in '{self.tr.here()}' "
                                        f"({type(exc).__name__})")
        return out


def deep_copy(model: nn.Module, share: dict[int, Any] | None = None) -> nn.Module:
    """``copy.deepcopy`` that also copies a model whose masked weights are computed tensors (the
    plain attribute ``weight = weight_orig * weight_mask`` of ``torch.nn.utils.prune``, which
    ``deepcopy`` refuses as a non-leaf): those are copied detached, the pre-hook recomputes them.
    ``share`` maps ``id(tensor)`` to what the copy holds instead (not copied: memory).

    Example:
        >>> from torch.nn.utils import prune
        >>> lin = prune.l1_unstructured(nn.Linear(2, 2), "weight", amount=1)
        >>> sorted(n for n, _ in deep_copy(lin).named_buffers())
        ['weight_mask']
    """
    memo: dict[int, Any] = {}
    for m in model.modules():
        for v in vars(m).values():
            if isinstance(v, torch.Tensor) and not v.is_leaf:
                memo[id(v)] = v.detach().clone()
    memo.update(share or {})
    return copy.deepcopy(model, memo)


def prepared(model: nn.Module) -> nn.Module:
    """The unwrapped model, or a deep copy of it with every mask (hookscope's or ``torch.nn.utils.prune``'s)
    made permanent, so that the weights the layers use are the Parameters themselves. The masks and
    the computed weights are not copied (they are dropped at once): the copy costs one model, not three.

    Example:
        >>> from hookscope.analysis.prune.masks._hooks import apply_mask
        >>> lin = nn.Linear(2, 2); apply_mask(lin, "weight", torch.ones(2, 2))
        >>> [n for n, _ in prepared(lin).named_parameters()], [n for n, _ in lin.named_parameters()]
        (['bias', 'weight'], ['bias', 'weight_orig'])
    """
    inner, _ = unwrap(model)
    todo = masked(inner)
    if not todo:
        return inner
    mods = dict(named_modules(inner))
    share: dict[int, Any] = {}
    for qualname, name in todo:
        m = mods[qualname]
        for t in (m._buffers.get(name + "_mask"), m.__dict__.get(name)):
            if isinstance(t, torch.Tensor):  # read once by make_permanent below, then gone from the copy
                share[id(t)] = t.detach()
    work = deep_copy(inner, share)
    mods = dict(named_modules(work))
    for qualname, name in todo:
        make_permanent(mods[qualname], name)
    return work


_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout}
_RAW_DROPOUTS = {torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout}


class _NoDropout(TorchFunctionMode):
    """Functional dropout off (``F.dropout(x, training=self.training)`` in a container's forward), as
    dropout modules are in eval mode: a pass with the containers in training mode computes eval values."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:  # (input, p, training, inplace)
            kwargs = {**dict(zip(("p", "training", "inplace"), args[1:])), **kwargs, "training": False}
            args = args[:1]
        elif func in _RAW_DROPOUTS:  # (input, p, train)
            kwargs = {**dict(zip(("p", "train"), args[1:])), **kwargs, "train": False}
            args = args[:1]
        return func(*args, **kwargs)


@contextlib.contextmanager
def traced_mode(model: nn.Module, *, wide: bool = False) -> Iterator[None]:
    """The mode of a traced or checked pass: eval mode; with ``wide``, every module that has children in
    training mode (so that the branches a model takes only in training run, such as auxiliary heads)
    while computing eval values: every leaf in eval mode (BatchNorm's running statistics, no dropout
    module), functional dropout off, the random stream seeded. Flags, buffers and generators are put
    back on exit.

    Example:
        >>> net = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Dropout())
        >>> with traced_mode(net, wide=True):
        ...     [m.training for m in net.modules()], torch.equal(F.dropout(torch.ones(3), 0.5), torch.ones(3))
        ([True, True, False, False], True)
        >>> net.training
        True
    """
    used = [*model.parameters(), *model.buffers()] if wide else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(restored(model, train=False, buffers=True, rng=rng_devices(used),
                                     seed=0 if wide else None))
        if wide:
            for m in model.modules():
                m.training = any(True for _ in m.children())
            stack.enter_context(_NoDropout())
        yield


def trace_channels(model: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], *,
                   wide: bool = False) -> Tracer:
    """Run ``model`` once under the channel tracer, in eval mode (``wide``: see :func:`traced_mode`);
    every temporary hook is removed and every module's training flag restored, also on error.
    ``model`` must hold no masks (``prepared``).

    Example:
        >>> tr = trace_channels(nn.Linear(2, 3), (torch.randn(1, 2),), {})
        >>> sorted(tr.members)
        [('', 'bias', 0), ('', 'weight', 0)]
    """
    params: dict[int, tuple[str, str, bool]] = {}
    mods = named_modules(model)
    for qualname, m in mods:
        params.update({id(p): (qualname, n, False) for n, p in m._parameters.items() if p is not None})
        params.update({id(b): (qualname, n, True) for n, b in m._buffers.items() if b is not None})
    tr = Tracer(params)
    handles: list[Any] = []
    try:
        for qualname, m in mods:
            # own hook: tells the channel tracer which module each op runs in; keeps nothing
            handles.append(m.register_forward_pre_hook(_push(tr, qualname)))
            handles.append(m.register_forward_hook(_pop(tr, qualname), always_call=True))
        args, kw = private((inputs, kwargs))  # the model may write into its inputs: never the caller's
        with traced_mode(model, wide=wide), torch.no_grad(), _Mode(tr):
            out = model(*args, **kw)
        for t in tensors(out):
            tr.block_tensor(t, "reaches the model's output")
    except Exception as exc:
        raise HookscopeError(f"the model failed on the example input while tracing channels "
                             f"({type(exc).__name__}: {exc}); pass inputs the model accepts") from exc
    finally:
        for h in handles:
            h.remove()
    return tr


def _push(tr: Tracer, qualname: str) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        tr.stack.append(qualname or "(model)")
    return hook


def _pop(tr: Tracer, qualname: str) -> Any:
    calls = [0]  # this module's calls so far: a site names its call (one ReLU module serves several)

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        if tr.stack:
            tr.stack.pop()
        tr.ran.add(qualname)
        call, calls[0] = calls[0], calls[0] + 1
        s = tr.shadow(out)
        if s is not None:
            tr.sites.append((qualname, call, s))
    return hook


# --- result --------------------------------------------------------------------------------------
def assemble(tr: Tracer, model: nn.Module) -> ChannelGroups:
    """Turn the tracer's union-find into groups: channels sharing a parameter are one group.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
        >>> assemble(trace_channels(net, (torch.randn(1, 2),), {}), net).groups[0].size
        3
    """
    parent: dict[int, int] = {}

    def top(r: int) -> int:
        root = r
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while r != root:
            parent[r], r = root, parent[r]
        return root

    keys = sorted(tr.members, key=lambda k: tr.roles[k] != "producer")
    roots = {key: [tr.find(i) for _, i in sorted(tr.members[key].items())] for key in keys}
    for key in keys:
        first = roots[key][0]
        for r in roots[key][1:]:
            a, b = top(first), top(r)
            if a != b:
                parent[b] = a
    classes: dict[int, dict[int, None]] = {}  # group root -> classes in order of appearance
    for key in keys:
        g = top(roots[key][0])
        tr.keys_of.setdefault(g, []).append(key)
        classes.setdefault(g, {}).update(dict.fromkeys(roots[key]))
    groups: list[Group] = []
    blocked: list[BlockedGroup] = []
    for g, cls in classes.items():
        _one_group(tr, g, list(cls), groups, blocked)
    sites = _sites(tr, {r: (grp.index, k) for grp in groups for k, r in enumerate(_classes_of(grp, tr))})
    for grp in groups:
        grp.sites = sites.get(grp.index, [])
    used = tr.used | {id(p) for q, m in named_modules(model) if q in tr.ran for p in m.parameters(False)}
    unseen = [q for q, m in named_modules(model)  # a shared weight used by a module that ran is seen
              if q not in tr.ran and any(id(p) not in used for p in m.parameters(False))]
    return ChannelGroups(groups, blocked, unseen)


def _one_group(tr: Tracer, g: int, cls: list[int], groups: list[Group], blocked: list[BlockedGroup]) -> None:
    free = [r for r in cls if r not in tr.reasons]
    reasons = [tr.reasons[r] for r in cls if r in tr.reasons]
    mine = tr.keys_of.get(g, [])
    producers = list(dict.fromkeys(k[0] for k in mine if tr.roles[k] == "producer"))
    if not free:
        blocked.append(BlockedGroup(producers, len(cls), reasons[0]))
        return
    members = []
    for k in mine:
        by_class: dict[int, list[int]] = {}
        for pos, i in sorted(tr.members[k].items()):
            by_class.setdefault(tr.find(i), []).append(pos)
        members.append(GroupMember(k[0], k[1], k[2], tr.roles[k],
                                   tuple(tuple(by_class.get(r, ())) for r in free)))
    groups.append(Group(len(groups), members, [], len(cls) - len(free), reasons[0] if reasons else ""))
    tr.group_classes[len(groups) - 1] = free


def _classes_of(grp: Group, tr: Tracer) -> list[int]:
    return tr.group_classes.get(grp.index, [])


def _sites(tr: Tracer, where: dict[int, tuple[int, int]]) -> dict[int, list[Site]]:
    """Module outputs carrying removable channels, by group."""
    out: dict[int, list[Site]] = {}
    sizes: dict[int, int] = {}
    for g, _ in where.values():
        sizes[g] = sizes.get(g, 0) + 1
    for qualname, call, s in tr.sites:
        for d in dict.fromkeys([min(1, s.dim() - 1), s.dim() - 1, *range(s.dim())]):
            if s.shape[d] < 2:
                continue
            rows = s.abs().movedim(d, 0).reshape(s.shape[d], -1)  # the channel dim: one id per slice
            ids = rows.amax(1)
            low = torch.where(rows > 0, rows, ids[:, None]).amin(1)
            if not bool((low == ids).all()) or len(torch.unique(ids)) < 2:
                continue
            per: dict[int, dict[int, list[int]]] = {}
            for pos, i in enumerate(ids.long().tolist()):
                hit = where.get(tr.find(i)) if i else None
                if hit is not None:
                    per.setdefault(hit[0], {}).setdefault(hit[1], []).append(pos)
            for gi, chans in per.items():
                n = sizes[gi]
                positions = tuple(tuple(chans.get(k, ())) for k in range(n))
                out.setdefault(gi, []).append(Site(qualname, d, positions, call))
            break
    return out


@checked
def channel_groups(model: nn.Module, inputs: Any = None, *, kwargs: Mapping[str, Any] | None = None) -> ChannelGroups:
    """The channel groups of ``model`` on one example input (batch 1 is enough), found by tracing
    one forward pass. Names are those of the unwrapped model (DataParallel, ``torch.compile``).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
        >>> _ = net(torch.randn(1, 3, 5, 5))
        >>> g = channel_groups(net, torch.randn(1, 3, 5, 5)).groups[0]
        >>> g.size, [(m.module, m.name, m.dim, m.role) for m in g.members][:3], g.members[-1].positions[1]
        (8, [('0', 'weight', 0, 'producer'), ('0', 'bias', 0, 'producer'), ('1', 'running_mean', 0, 'follower')], (9, 10, 11, 12, 13, 14, 15, 16, 17))
    """
    inputs = model_args(inputs)
    work = prepared(model)
    tr = trace_channels(work, inputs, dict(kwargs or {}))
    return assemble(tr, work)
