"""Attention-head pruning: score every head of the attention layers hookscope can follow (by the norm
of its output on data, or of its weights), mask the lowest or the heads you name, ready for
:func:`~hookscope.analysis.prune.compact`, which removes them (query / key / value rows, output columns) and fixes
the head counts the layers and their Hugging Face config read.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.inputs import model_args
from ....anatomy import HeadLayout
from ....core.result import Result
from ....errors import HookscopeError, checked
from ....selection import Layers, Selector, as_selectors, unwrap
from ....selection import layers as select
from ..channels import dropped_channels, mask_channels
from ..graph import ChannelGroups, Group
from ..importance import Loss, check_kind, check_share
from ._groups import HeadGroup, check_heads, head_groups_of, layouts
from ._mlp import MlpRow, MlpScores, check_mlp, mlp_units
from ._score import head_scores

__all__ = ["HEAD_IMPORTANCE", "HeadRow", "HeadPruning", "prune_heads"]

HEAD_IMPORTANCE = ("output", "l2", "taylor", "entropy")


@dataclass(frozen=True)
class HeadRow:
    """One attention layer: its kind, heads (and key/value heads), the query heads masked now
    (``removed``, indices) and before (``already``), and each head's score.

    Example:
        >>> HeadRow("blocks.0.attn", "timm", 4, 4, (1, 3), (0.5, 0.1, 0.9, 0.2)).kept
        2
    """

    layer: str
    kind: str
    heads: int
    kv_heads: int
    removed: tuple[int, ...]
    scores: tuple[float, ...]
    already: tuple[int, ...] = ()

    @property
    def kept(self) -> int:
        """Query heads left."""
        return self.heads - len(self.removed) - len(self.already)


class HeadPruning(Result):
    """What :func:`prune_heads` masked: one row per attention layer, the head groups and the choice
    (``drop``: group index -> channels, as :func:`mask_channels` takes it); with ``mlp=``, one
    :class:`MlpRow` per MLP in ``mlp_rows``, their groups (``mlp_groups``) and choice (``mlp_drop``).

    Example:
        >>> net = nn.TransformerEncoderLayer(8, 4, dim_feedforward=16, batch_first=True)
        >>> res = prune_heads(net, torch.randn(1, 3, 8), amount=0.5)
        >>> res.rows[0].layer, res.rows[0].kept, res.removed
        ('self_attn', 2, 2)
    """

    def __init__(self, importance: str, amount: float | None, rows: list[HeadRow], groups: ChannelGroups,
                 drop: dict[int, list[int]], *, mlp: float | None = None, mlp_rows: list[MlpRow] | None = None,
                 mlp_groups: ChannelGroups | None = None, mlp_drop: dict[int, list[int]] | None = None) -> None:
        self.importance, self.amount, self.rows, self.groups, self.drop = importance, amount, rows, groups, drop
        self.mlp, self.mlp_rows, self.mlp_groups = mlp, list(mlp_rows or []), mlp_groups
        self.mlp_drop = dict(mlp_drop or {})

    @property
    def heads(self) -> int:
        """Query heads of the layers considered."""
        return sum(r.heads for r in self.rows)

    @property
    def removed(self) -> int:
        """Query heads masked now."""
        return sum(len(r.removed) for r in self.rows)

    @property
    def mlp_units(self) -> int:
        """MLP hidden units of the MLPs considered (with ``mlp=``)."""
        return sum(r.units for r in self.mlp_rows)

    @property
    def mlp_removed(self) -> int:
        """MLP hidden units masked now."""
        return sum(len(r.removed) for r in self.mlp_rows)

    def table(self) -> str:
        """One line per attention layer, then the totals."""
        lines = [f"{'layer':<36}  {'kind':<6}  {'heads':>5}  {'kv':>3}  {'kept':>4}  removed"]
        for r in self.rows:
            name = r.layer if len(r.layer) <= 36 else r.layer[:33] + "..."
            lines.append(f"{name:<36}  {r.kind:<6}  {r.heads:>5}  {r.kv_heads:>3}  {r.kept:>4}  "
                         f"{', '.join(map(str, r.removed)) or '-'}")
        how = f"amount {self.amount:g} per layer" if self.amount is not None else "as named"
        lines.append(f"{self.removed} of {self.heads} attention heads masked now in {len(self.rows)} layers "
                     f"by {self.importance} importance, {how}; compact(model, inputs) removes them")
        if self.mlp_rows:
            lines.append(f"{'mlp':<36}  {'units':>5}  {'kept':>5}")
            lines += [f"{r.layer if len(r.layer) <= 36 else r.layer[:33] + '...':<36}  {r.units:>5}  {r.kept:>5}"
                      for r in self.mlp_rows]
            kind = "output" if self.importance == "entropy" else self.importance
            lines.append(f"{self.mlp_removed} of {self.mlp_units} MLP hidden units masked now in {len(self.mlp_rows)} "
                         f"MLPs by {kind} importance, mlp {self.mlp:g} per MLP, in the same calibration pass")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the settings and one dict per layer."""
        return {"importance": self.importance, "amount": self.amount, "heads": self.heads, "removed": self.removed,
                "rows": [{"layer": r.layer, "kind": r.kind, "heads": r.heads, "kv_heads": r.kv_heads,
                          "removed": list(r.removed), "already": list(r.already), "kept": r.kept,
                          "scores": list(r.scores)} for r in self.rows],
                "drop": {str(k): v for k, v in self.drop.items()},
                "mlp": None if self.mlp is None else {
                    "amount": self.mlp, "units": self.mlp_units, "removed": self.mlp_removed,
                    "rows": [{"layer": r.layer, "units": r.units, "removed": list(r.removed), "already": list(r.already),
                              "kept": r.kept, "scores": list(r.scores)} for r in self.mlp_rows],
                    "drop": {str(k): v for k, v in self.mlp_drop.items()}}}


def _check(amount: object, heads: object, importance: object, loss: object = None) -> float | None:
    if loss is not None and not callable(loss):
        raise HookscopeError(f"loss={type(loss).__name__} is not callable; pass loss=lambda output, batch: ...")
    if loss is not None and importance != "taylor":
        raise HookscopeError(f"loss= is read by importance='taylor' only, not importance={importance!r}; drop loss=")
    if (amount is None) == (heads is None):
        raise HookscopeError("pass either amount= (a share of every layer's heads) or heads= ({layer: [head "
                             "indices]}), not both or neither")
    check_kind(importance, HEAD_IMPORTANCE)
    return None if amount is None else check_share(amount, "amount", "heads",
                                                   "amount=0.5 (every layer keeps at least one head)")


def _chosen(model: nn.Module, selectors: Sequence[Selector] | None) -> list[HeadLayout]:
    if not selectors:
        found = layouts(model)
    else:
        wanted = {name for name, _ in select(model, *selectors)}
        found = [lay for lay in layouts(model, strict=True) if lay.module in wanted]
    if not found:
        if not selectors:
            layouts(model, strict=True)  # an attention layer whose heads cannot be followed says why
        raise HookscopeError(f"no attention layer of {type(model).__name__}{' among layers=' if selectors else ''} "
                             "has heads hookscope can follow (nn.MultiheadAttention, BERT-, GPT-2-, LLaMA-style, "
                             "torchvision Swin and MaxViT, and timm attention); pass another model or layers=")
    return found


def _pick(lay: HeadLayout, scores: torch.Tensor, dead: set[int], n: int, amount: float) -> tuple[str, list[int]]:
    """Which channels go in one layer: ``("kv", key/value heads)`` or ``("q", query heads)``."""
    g = lay.group
    live_q = [h for h in range(lay.heads) if h not in dead]

    def lowest(ks: list[int], score: Callable[[int], float], k: int) -> list[int]:
        return sorted(sorted(ks, key=lambda c: (score(c), c))[:k])

    def head(h: int) -> float:
        return float(scores[h])

    if g == 1:
        return "kv", lowest(live_q, head, n)
    live_kv = sorted({h // g for h in live_q})
    per = len(live_q) // len(live_kv)
    if n % per == 0:
        return "kv", lowest(live_kv, lambda j: float(scores[j * g:(j + 1) * g].sum()), n // per)
    if n % len(live_kv) == 0:
        return "q", sorted(h for j in live_kv for h in lowest([h for h in live_q if h // g == j], head,
                                                               n // len(live_kv)))
    raise HookscopeError(
        f"amount={amount:g} removes {n} of the {len(live_q)} query heads of '{lay.module}', which share {len(live_kv)} "
        f"key/value heads in groups of {per}: neither whole groups (a multiple of {per}) nor the same number in "
        f"every group (a multiple of {len(live_kv)}); pass an amount that gives one of those")


def _named(lays: list[HeadLayout], heads: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    by_name = {lay.module: lay for lay in lays}
    out: dict[str, list[int]] = {}
    for name, idx in heads.items():
        lay = by_name.get(name)
        if lay is None:
            near = difflib.get_close_matches(str(name), list(by_name), n=1)
            hint = f"Did you mean {near[0]!r}? " if near else ""
            raise HookscopeError(f"heads= names {name!r}, which is not an attention layer whose heads hookscope "
                                 f"follows. {hint}Pass one of {', '.join(list(by_name)[:4])}{' ...' if len(by_name) > 4 else ''}")
        bad = [h for h in idx if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < lay.heads]
        if bad:
            raise HookscopeError(f"'{name}' has {lay.heads} heads, so head {bad[0]!r} does not exist; pass indices "
                                 f"in [0, {lay.heads})")
        out[name] = sorted(set(idx))
    return out


def _as_drop(lay: HeadLayout, groups: list[Group], heads: list[int]) -> dict[int, list[int]]:
    """Query heads to drop as channels of the layer's groups: whole key/value groups as such."""
    g = lay.group
    whole = [j for j in range(lay.kv_heads) if all(h in heads for h in range(j * g, (j + 1) * g))]
    rest = [h for h in heads if h // g not in whole]
    drop = {groups[0].index: whole} if whole else {}
    if rest:  # query heads within groups (grouped-query attention: the layer's second group)
        drop[groups[-1].index] = rest
    return drop


@checked
def prune_heads(model: nn.Module, inputs: Any = None, *, amount: float | None = None,
                heads: Mapping[str, Sequence[int]] | None = None, importance: str = "output", data: Any = None,
                layers: Layers | None = None, kwargs: Mapping[str, Any] | None = None,
                device: torch.device | str | None = None, max_batches: int | None = None,
                loss: Loss | None = None, mlp: float | None = None) -> HeadPruning:
    """Mask whole attention heads, ready for :func:`compact`: a head's query, key and value rows and
    the output projection's columns that read it.

    Layers followed: ``nn.MultiheadAttention`` (torchvision's ViT), BERT-style self-attention,
    GPT-2, LLaMA-style attention with grouped-query attention (Qwen2, Mistral ...), torchvision's
    Swin and Swin V2 window attention and MaxViT attention (a head's column of the relative position
    bias table goes with it; Swin V2: its ``logit_scale`` and its output of the position bias MLP)
    and timm's ``Attention``. With ``amount``, every layer loses ``floor(amount * heads)`` of its live
    heads, the lowest-scoring: ``"output"`` (the default) is the mean L2 norm of the head's slice of the
    attention output before the output projection, measured on ``data`` (or on ``inputs`` when no
    data is given); ``"l2"`` the norm of the head's weights; ``"taylor"`` the first-order Taylor
    importance of Michel et al. (2019), per sample ``|sum over positions and head channels of
    z * dL/dz|`` for the head's slice ``z`` of that output, averaged over samples (the loss:
    ``loss(output, batch)``, else the model's own ``.loss``, else cross entropy against the batch's
    labels); ``"entropy"`` the mean entropy of the head's attention probabilities, where the
    highest-entropy (most diffuse) heads go first. Under grouped-query attention whole
    key/value groups go (their scores summed) when the count allows, else the same number of query
    heads in every group; anything else is refused, as the models' ``repeat_kv`` needs equal groups.
    Every layer loses the same share, so a Hugging Face config keeps one head count for all layers.

    Args:
        model: the model; masked in place, wrappers seen through.
        inputs: an example input (the calibration batch when ``data`` is None).
        amount: the share of every layer's live heads to mask, in [0, 1).
        heads: instead of ``amount``: ``{attention layer: [query head indices]}``.
        importance: ``"output"``, ``"l2"``, ``"taylor"`` or ``"entropy"``.
        data: calibration batches (a tensor, ``(inputs, labels)``, a dict of keyword inputs, or a list
            or DataLoader of them).
        layers: a selector or a list of them: only these attention layers.
        kwargs: keyword inputs of the model for ``inputs``.
        device: where calibration batches go. max_batches: stop calibrating after this many.
        loss: for ``"taylor"``: ``(output, batch) -> loss`` (a scalar, or per-sample losses, summed).
        mlp: also mask this share, in [0, 1), of the hidden units of every MLP beside the attention
            layers (the input of LLaMA's ``down_proj``, GPT-2's ``mlp.c_proj``, BERT's ``output.dense``,
            timm's ``mlp.fc2``, torchvision's ``mlp[3]``, ``linear2``), scored in the same calibration
            pass as the heads: ``"output"`` the mean ``|a|`` over samples and positions, ``"l2"`` the
            norm of the unit's weight rows and columns, ``"taylor"`` per sample ``|sum over positions
            of a * dL/da|`` averaged over samples (Molchanov et al. 2019); an MLP has no attention, so
            with ``"entropy"`` its units are ranked by ``"output"``. The MLPs are found on the channel
            graph traced on ``inputs`` (the example input is needed); every MLP keeps one unit.

    Returns:
        A :class:`HeadPruning` (with ``mlp=``, its ``mlp_rows``); ``compact(model, inputs)`` then makes
        the model smaller.

    Example:
        >>> torch.manual_seed(0); net = nn.TransformerEncoderLayer(8, 4, 16, batch_first=True).eval()
        <torch._C.Generator object at ...>
        >>> x = torch.randn(2, 5, 8)
        >>> res = prune_heads(net, x, heads={"self_attn": [0, 3]})
        >>> from hookscope.analysis.prune import compact
        >>> small = compact(net, x); small.self_attn.num_heads, small.self_attn.in_proj_weight.shape
        (2, torch.Size([12, 8]))
    """
    inputs = model_args(inputs)
    share, mlp_share = _check(amount, heads, importance, loss), check_mlp(mlp)
    inner, _ = unwrap(model)
    sel = None if layers is None else as_selectors(layers)
    lays = _chosen(inner, sel)
    named = _named(lays, heads) if heads is not None else None
    groups: list[Group] = []
    per_layer: dict[str, list[Group]] = {}
    for lay in lays:
        per_layer[lay.module] = list(head_groups_of(lay, len(groups)))
        groups += per_layer[lay.module]
    gs = ChannelGroups(groups, [])
    dead = _dead(lays, gs, dropped_channels(inner, gs))
    mlps = None if mlp_share is None else MlpScores(inner, *mlp_units(inner, layouts(inner), lays, inputs, dict(
        kwargs or {})), importance, mlp_share)
    with mlps.measuring() if mlps is not None else contextlib.nullcontext():  # the heads' passes score the MLPs too
        scores = head_scores(inner, lays, importance, inputs, dict(kwargs or {}), data, device, max_batches, loss,
                             mlps.also if mlps is not None else ())
    order = {q: -s if importance == "entropy" else s for q, s in scores.items()}  # low = masked first
    drop: dict[int, list[int]] = {}
    for lay in lays:
        if named is not None:
            chosen = [h for h in named.get(lay.module, []) if h not in dead[lay.module]]
        else:
            live = lay.heads - len(dead[lay.module])
            per, picks = _pick(lay, order[lay.module], dead[lay.module], math.floor((share or 0.0) * live),
                               share or 0.0)
            g = lay.group if per == "kv" else 1
            chosen = sorted(h for c in picks for h in range(c * g, (c + 1) * g))
        drop.update(_as_drop(lay, per_layer[lay.module], sorted(set(chosen) | dead[lay.module])))
    check_heads(gs, drop)
    mlp_drop = mlps.choose() if mlps is not None else {}
    mask_channels(inner, gs, drop)
    mlp_rows = mlps.mask(mlp_drop) if mlps is not None else []
    return HeadPruning(importance, share, _rows(lays, scores, dead, drop, gs), gs, drop, mlp=mlp_share,
                       mlp_rows=mlp_rows, mlp_groups=mlps.groups if mlps is not None else None, mlp_drop=mlp_drop)


def _dead(lays: list[HeadLayout], gs: ChannelGroups, zero: Mapping[int, Sequence[int]]) -> dict[str, set[int]]:
    """Query heads already masked (an earlier call, zero weights), by layer."""
    out: dict[str, set[int]] = {lay.module: set() for lay in lays}
    for g in gs.groups:
        if isinstance(g, HeadGroup) and g.layout is not None:
            step = g.layout.group if g.per == "kv" else 1
            out[g.layout.module].update(h for c in zero.get(g.index, ()) for h in range(c * step, (c + 1) * step))
    return out


def _rows(lays: list[HeadLayout], scores: Mapping[str, torch.Tensor], dead: Mapping[str, set[int]],
          drop: Mapping[int, Sequence[int]], gs: ChannelGroups) -> list[HeadRow]:
    gone = _dead(lays, gs, drop)
    return [HeadRow(lay.module, lay.kind, lay.heads, lay.kv_heads, tuple(sorted(gone[lay.module] - dead[lay.module])),
                    tuple(float(s) for s in scores[lay.module]), tuple(sorted(dead[lay.module]))) for lay in lays]
