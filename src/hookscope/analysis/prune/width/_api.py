"""Hidden-width pruning: score every channel of the residual stream of a transformer (the
mean absolute value the stream carries into its norms, measured on data, or the norm of its
weights), mask the lowest or the channels you name, ready for :func:`~hookscope.analysis.prune.compact`, which
removes them from every embedding, norm and projection and writes the config.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.inputs import model_args
from ....core.result import Result
from ....errors import HookscopeError, checked
from ....selection import named_modules, unwrap
from ..channels import dropped_channels, mask_channels
from ..graph import ChannelGroups
from ..importance import batches_of, check_kind, check_share, plain_passes, split_batch
from ._stream import WidthGroup, width_group

__all__ = ["WIDTH_IMPORTANCE", "WidthPruning", "prune_width"]

WIDTH_IMPORTANCE = ("output", "l2")


@dataclass(frozen=True)
class WidthRow:
    """One channel of the hidden width: its score, whether it is masked now or was before.

    Example:
        >>> WidthRow(3, 0.25, True, False).channel
        3
    """

    channel: int
    score: float
    removed: bool
    already: bool


class WidthPruning(Result):
    """What :func:`prune_width` masked: one row per channel of the hidden width, the group and the
    choice (``drop``: group index -> channels, as :func:`mask_channels` takes it).

    Example:
        >>> res = WidthPruning("l2", 0.5, [WidthRow(0, 1.0, False, False), WidthRow(1, 0.1, True, False)],
        ...                    ChannelGroups([], []), {0: [1]})
        >>> res.width, res.removed, res.kept
        (2, 1, 1)
    """

    def __init__(self, importance: str, amount: float | None, rows: list[WidthRow], groups: ChannelGroups,
                 drop: dict[int, list[int]]) -> None:
        self.importance, self.amount, self.rows, self.groups, self.drop = importance, amount, rows, groups, drop

    @property
    def width(self) -> int:
        """Channels of the hidden width."""
        return len(self.rows)

    @property
    def removed(self) -> int:
        """Channels masked now."""
        return sum(r.removed for r in self.rows)

    @property
    def kept(self) -> int:
        """Channels left."""
        return sum(not (r.removed or r.already) for r in self.rows)

    def table(self) -> str:
        """The lowest-scoring channels, then the totals."""
        lines = [f"{'channel':>7}  {'score':>12}  state"]
        for r in sorted(self.rows, key=lambda r: (r.score, r.channel))[:12]:
            state = "masked now" if r.removed else "masked before" if r.already else "kept"
            lines.append(f"{r.channel:>7}  {r.score:>12.6g}  {state}")
        how = f"amount {self.amount:g}" if self.amount is not None else "as named"
        lines.append(f"{self.removed} of {self.width} hidden channels masked now ({self.kept} kept) by "
                     f"{self.importance} importance, {how}; compact(model, inputs) removes them")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the settings and one dict per channel."""
        return {"importance": self.importance, "amount": self.amount, "width": self.width, "removed": self.removed,
                "kept": self.kept, "rows": [{"channel": r.channel, "score": r.score, "removed": r.removed,
                                             "already": r.already} for r in self.rows],
                "drop": {str(k): v for k, v in self.drop.items()}}


def _check(amount: object, channels: object, importance: object) -> float | None:
    if (amount is None) == (channels is None):
        raise HookscopeError("pass either amount= (a share of the hidden width) or channels= (indices of hidden "
                             "channels), not both or neither")
    check_kind(importance, WIDTH_IMPORTANCE)
    return None if amount is None else check_share(amount, "amount", "the hidden width", "amount=0.25")


def _l2(model: nn.Module, g: WidthGroup) -> torch.Tensor:
    mods = dict(named_modules(model))
    total = torch.zeros(g.size, dtype=torch.float64)
    for m in g.members:
        t = getattr(mods[m.module], m.name).detach().double().cpu().movedim(m.dim, 0)
        total += t.reshape(g.size, -1).pow(2).sum(1)
    return total.sqrt()


def _pre(sums: list[Any]) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor):
            x = args[0].detach()
            part = x.double().abs().reshape(-1, x.shape[-1]).sum(0)
            sums[0] = part if sums[0] is None else sums[0] + part
            sums[1] += x.numel() // x.shape[-1]
    return hook


def _measured(model: nn.Module, g: WidthGroup, batches: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
              device: torch.device | str | None) -> torch.Tensor:
    """Mean |value| of each stream channel where it enters a norm, over tokens, norms and batches."""
    assert g.stream is not None
    mods = dict(named_modules(model))
    sums: list[Any] = [None, 0]
    handles: list[Any] = []
    try:
        for q in g.stream.norms:  # own hooks: the stream read where every norm reads it, reduced on the device
            handles.append(mods[q].register_forward_pre_hook(_pre(sums)))
        plain_passes(model, batches, device)
    finally:
        for h in handles:
            h.remove()
    if sums[0] is None:
        raise HookscopeError("no norm of the hidden width ran on the calibration data, so its channels have no "
                             "value to score; pass data that runs the model or importance='l2'")
    mean: torch.Tensor = (sums[0] / sums[1]).cpu()
    return mean


def _scores(model: nn.Module, g: WidthGroup, importance: str, inputs: tuple[Any, ...], kwargs: dict[str, Any],
            data: Any, device: torch.device | str | None, max_batches: int | None) -> torch.Tensor:
    if importance == "l2":
        return _l2(model, g)
    if data is None:
        if not inputs and not kwargs:
            raise HookscopeError("importance='output' runs the model: pass an example input, data=, or use "
                                 "importance='l2'")
        return _measured(model, g, [(tuple(inputs), dict(kwargs))], device)
    split = ((b.args, b.kwargs) for b in (split_batch(raw, i) for i, raw in enumerate(batches_of(data))))
    return _measured(model, g, itertools.islice(split, max_batches), device)


def _named(g: WidthGroup, channels: Sequence[int]) -> list[int]:
    bad = [c for c in channels if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < g.size]
    if bad:
        raise HookscopeError(f"the hidden width is {g.size}, so channel {bad[0]!r} does not exist; pass indices "
                             f"in [0, {g.size})")
    return sorted(set(channels))


@checked
def prune_width(model: nn.Module, inputs: Any = None, *, amount: float | None = None, channels: Sequence[int] | None = None,
                importance: str = "output", data: Any = None, kwargs: Mapping[str, Any] | None = None,
                device: torch.device | str | None = None, max_batches: int | None = None) -> WidthPruning:
    """Mask channels of the hidden width (the residual stream) of a transformer, ready for
    :func:`compact`: their embedding columns, norm weights (and biases) and the rows of the
    projections that write the stream (attention output, MLP down). Projections reading the stream
    read zeros.

    Followed: Hugging Face models with ``config.hidden_size`` whose stream is made of embeddings,
    norms and the projections of the LLaMA layout (``o_proj``/``down_proj`` write, ``q_proj``,
    ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` read: LLaMA, Qwen2, Mistral; Gemma's ``(1 + w)``
    norms and scaled embedding too), GPT-2's
    (``wte``, ``wpe``, Conv1D ``c_attn``, ``c_fc`` read, ``c_proj`` writes), BERT's
    (``query``/``key``/``value``, ``intermediate.dense`` and ``pooler.dense`` read, ``output.dense``
    writes) and ViT's (the patch projection, class token and position embeddings write, ``fc1`` reads,
    ``fc2`` writes), with the head ``lm_head``, ``score`` or ``classifier``. Anything else holding a
    tensor of the hidden width is refused, naming it.
    An RMSNorm of the masked model still divides by the full width; :func:`compact` gives a plain
    model of the smaller width computing exactly that (``rms_norm_eps`` and the norm weights
    rescaled). A LayerNorm's mean over the full width has no smaller form, so each LayerNorm of a
    masked stream normalises over the kept channels only (mean and variance over them, same
    ``eps``): masking changes what the norms see, which is the pruning (check its cost with
    ``compare_models``), and the compacted ``LayerNorm(k)`` computes exactly that.
    With ``amount``, ``floor(amount * width)`` live channels go, the lowest-scoring: ``"output"``
    (the default) is the mean absolute value of the stream where it enters every norm, measured on
    ``data`` (or on ``inputs``); ``"l2"`` the norm of each channel's weights in every member.

    Args:
        model: the model; masked in place, wrappers seen through.
        inputs: an example input (the calibration batch when ``data`` is None).
        amount: the share of the hidden width to mask, in [0, 1).
        channels: instead of ``amount``: the hidden channels to mask, by index.
        importance: ``"output"`` or ``"l2"``.
        data: calibration batches (a tensor, ``(inputs, labels)``, a dict of keyword inputs, or a
            list or DataLoader of them).
        kwargs: keyword inputs of the model for ``inputs``.
        device: where calibration batches go. max_batches: stop calibrating after this many.

    Returns:
        A :class:`WidthPruning`; ``compact(model, inputs)`` then makes the model smaller.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> torch.manual_seed(0); lm = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16,
        ...     intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
        <torch._C.Generator object at ...>
        >>> ids = torch.randint(0, 40, (1, 6))
        >>> res = prune_width(lm, ids, amount=0.25, kwargs={"use_cache": False})
        >>> from hookscope.analysis.prune import compact
        >>> small = compact(lm, ids, kwargs={"use_cache": False})
        >>> res.kept, small.config.hidden_size, small.model.layers[0].self_attn.q_proj.in_features
        (12, 12, 12)
    """
    inputs = model_args(inputs)
    share = _check(amount, channels, importance)
    inner, _ = unwrap(model)
    g = width_group(inner, 0)
    gs = ChannelGroups([g], [])
    dead = set(dropped_channels(inner, gs).get(0, []))
    chosen = _named(g, channels) if channels is not None else []
    scores = _scores(inner, g, importance, inputs, dict(kwargs or {}), data, device, max_batches)
    if share is not None:
        live = [c for c in range(g.size) if c not in dead]
        chosen = sorted(sorted(live, key=lambda c: (float(scores[c]), c))[:math.floor(share * len(live))])
    gone = sorted(set(chosen) | dead)
    if len(gone) >= g.size:
        raise HookscopeError(f"that would mask all {g.size} hidden channels; keep at least one")
    mask_channels(inner, gs, {0: gone} if gone else {})
    rows = [WidthRow(c, float(scores[c]), c in chosen and c not in dead, c in dead) for c in range(g.size)]
    return WidthPruning(importance, share, rows, gs, {0: gone} if gone else {})
