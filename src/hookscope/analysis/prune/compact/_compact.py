"""Physical removal of masked channels: mask whole channels group-wise, then compact a deep copy
(slice every member, fix the layers' sizes) and VERIFY it against the masked model on the example
input; refuse in one line otherwise, the user's model untouched.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....core.inputs import model_args
from ....anatomy import fix_sizes, write_mlp_configs
from ....core.text import first_line
from ....errors import HookscopeError, checked
from ....selection import named_modules, unwrap
from ..channels import dropped_channels, tensor_of
from ..graph import ChannelGroups, assemble, deep_copy, prepared, trace_channels
from ..heads import check_heads, fix_heads, with_heads
from ..width import fix_width, with_width
from ._reload import settle_config
from ._verify import verify

__all__ = ["compact"]

Plan = dict[tuple[str, str, int], set[int]]


def _plan(groups: ChannelGroups, drop: dict[int, list[int]]) -> Plan:
    plan: Plan = {}
    by_index = {g.index: g for g in groups.groups}
    for gi, chans in drop.items():
        for m in by_index[gi].members:
            plan.setdefault((m.module, m.name, m.dim), set()).update(p for k in chans for p in m.positions[k])
    return plan


def _slice(model: nn.Module, plan: Plan) -> None:
    """Remove the planned positions from every parameter and buffer (shared ones everywhere) and set
    the layers' size attributes from the new shapes."""
    mods = dict(named_modules(model))
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for n, t in (*m._parameters.items(), *m._buffers.items()):
            if t is not None:
                owners.setdefault(id(t), []).append((m, n))
    depthwise = {q for q, m in mods.items() if isinstance(m, nn.modules.conv._ConvNd)
                 and m.groups > 1 and m.groups == m.in_channels == m.out_channels}
    touched: set[int] = set()
    for (q, name, dim), drop in plan.items():
        t = tensor_of(mods[q], name)
        if t is None or not drop:
            continue
        keep = torch.tensor([i for i in range(t.shape[dim]) if i not in drop], dtype=torch.long, device=t.device)
        data = t.detach().index_select(dim, keep)
        new: torch.Tensor = nn.Parameter(data, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
            else data
        places = owners.pop(id(t), [(mods[q], name)])
        for m, n in places:
            if isinstance(new, nn.Parameter):
                m._parameters[n] = new
            else:
                m._buffers[n] = new
            touched.add(id(m))
        owners[id(new)] = places
    for q, m in mods.items():  # also a layer sharing a sliced tensor (a tied LM head): its sizes follow
        if id(m) in touched:
            fix_sizes(m, depthwise=q in depthwise)


def _unseen(groups: ChannelGroups, why: str) -> HookscopeError:
    names = f"{', '.join(repr(u) for u in groups.unseen[:3])}{' ...' if len(groups.unseen) > 3 else ''}"
    return HookscopeError(
        f"compaction refused: {names} did not run on the example input in eval mode, and {why}, so the "
        "channels they read cannot be followed; pass allow_unseen=True (--allow-unseen on the command line) "
        "to leave them as they are (they may then fail on the compacted model), or remove them")


def _with_training_branches(inner: nn.Module, work: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any],
                            atol: float, ran: set[str], allow_unseen: bool) -> tuple[nn.Module | None, str]:
    """A compacted copy of ``work`` that also follows the layers the model runs only in training mode
    (auxiliary heads), or ``None`` and why not. Traced with the containers in training mode and the
    leaves in eval mode (``traced_mode(wide=True)``), the branches a model takes only in training run
    and read the channels they read in training; the result is checked in eval mode and in that mode."""
    wide = deep_copy(work)
    try:
        tr = trace_channels(wide, inputs, kw, wide=True)
    except HookscopeError as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        return None, f"the model's training-mode branches fail on it ({type(cause).__name__}: {first_line(cause, 120)})"
    groups = with_width(with_heads(assemble(tr, wide), wide, tr.ran), wide)
    if not ran <= tr.ran:
        return None, "its training-mode branches skip layers that eval mode runs"
    if groups.unseen and not allow_unseen:
        return None, "not in its training-mode branches either"
    drop = dropped_channels(wide, groups)
    check_heads(groups, drop)
    _slice(wide, _plan(groups, drop))
    fix_heads(wide, groups, drop)
    fix_width(wide, groups, drop)
    write_mlp_configs(wide)
    try:
        for _ in range(2):  # again with the original config, where the compacted one cannot say the sizes
            verify(inner, wide, inputs, kw, atol, groups, drop)
            verify(inner, wide, inputs, kw, atol, groups, drop, wide=True)
            if not (drop and settle_config(inner, wide, inputs, kw)):
                break
    except HookscopeError as e:
        refused = first_line(e, 160).removeprefix("compaction refused: ")
        return None, f"following them through its training-mode branches was refused ({refused})"
    return wide, ""


@checked
def compact(model: nn.Module, inputs: Any = None, *, kwargs: Mapping[str, Any] | None = None,
            atol: float = 1e-5, allow_unseen: bool = False) -> nn.Module:
    """A NEW model with every masked (all-zero) channel physically removed along its group, its
    masks made permanent, verified to give the masked model's outputs on the example input (max abs
    difference below ``atol`` times the outputs' scale, at least 1). The user's model is never touched
    (it runs on private copies of the inputs); on a mismatch or a shape error the compaction is
    refused naming the first module that differs.

    The groups are those of the path the example input takes: a Python branch on the input's values
    (``if x.mean() < 0``) is not seen, and the check runs on the example input only; give one that
    takes the paths you will use.
    Layers that do not run in eval mode because the model calls them only in training (auxiliary
    heads: GoogLeNet's ``aux1``, Inception v3's ``AuxLogits``) are followed by a second traced pass
    with the model's containers in training mode and its leaves in eval mode, and the result is also
    checked in that mode. Layers that run in neither pass cannot be followed: compaction is refused
    unless ``allow_unseen=True`` (they are then left as they are).

    Example:
        >>> torch.manual_seed(0); net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        ...     nn.Conv2d(8, 4, 1)).eval()
        <torch._C.Generator object at ...>
        >>> from hookscope.analysis.prune import channel_groups, mask_channels
        >>> x = torch.randn(1, 3, 6, 6)
        >>> mask_channels(net, channel_groups(net, x), {0: [0, 1, 2]})
        >>> small = compact(net, x)
        >>> small[0].out_channels, small[1].num_features, small[3].in_channels
        (5, 5, 5)
        >>> bool((small(x) - net(x)).abs().max() < 1e-5)
        True
    """
    inputs = model_args(inputs)
    inner, _ = unwrap(model)
    kw = dict(kwargs or {})
    work = prepared(inner)  # masks made permanent in a copy that costs one model
    if work is inner:
        work = deep_copy(inner)
    tr = trace_channels(work, inputs, kw)
    groups = with_width(with_heads(assemble(tr, work), work, tr.ran), work)  # heads, hidden width: groups of their own
    drop = dropped_channels(work, groups)
    check_heads(groups, drop)
    if drop and groups.unseen:
        followed, why = _with_training_branches(inner, work, inputs, kw, atol, tr.ran, allow_unseen)
        if followed is not None:
            return _flags_of(inner, followed)
        if not allow_unseen:
            raise _unseen(groups, why)
    _slice(work, _plan(groups, drop))
    fix_heads(work, groups, drop)
    fix_width(work, groups, drop)
    write_mlp_configs(work)
    verify(inner, work, inputs, kw, atol, groups, drop)
    if drop and settle_config(inner, work, inputs, kw):
        verify(inner, work, inputs, kw, atol, groups, drop)  # the original config: the model reads it too
    return _flags_of(inner, work)


def _flags_of(inner: nn.Module, work: nn.Module) -> nn.Module:
    """``work`` with every module's training flag that of ``inner``'s."""
    for (_, a), (_, b) in zip(inner.named_modules(), work.named_modules()):
        b.training = a.training
    return work
