"""Per-head scores: the mean L2 norm of each head's slice of the attention output before the output
projection (read by a forward pre-hook on that projection, or recomputed from the inputs of an
``nn.MultiheadAttention``, whose ``out_proj`` is never called as a module), over calibration batches;
or the norm of each head's weights; ``"taylor"`` and ``"entropy"`` are measured by
``_score_taylor`` and ``_score_entropy``. Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ...._tree import first_tensor
from ....anatomy import HeadLayout, attend, out_site
from ....errors import HookscopeError
from ....selection import named_modules
from ..importance import Batch, Loss, batches_of, plain_passes, split_batch
from ._score_entropy import entropy_scores
from ._score_taylor import Kept, taylor_scores

__all__ = ["head_scores"]


class _Sums:
    """Per-head sums of the slice norms and the number of token positions, on the device."""

    def __init__(self, lay: HeadLayout) -> None:
        self.lay, self.total, self.count = lay, torch.zeros(0), 0

    def add(self, heads: torch.Tensor) -> None:
        per = heads.detach().reshape(-1, heads.shape[-1] // self.lay.head_dim, self.lay.head_dim)
        norms = per.double().norm(dim=-1).sum(0)
        self.total = norms if self.total.numel() == 0 else self.total + norms
        self.count += per.shape[0]

    def scores(self) -> torch.Tensor:
        if self.count == 0:
            raise HookscopeError(f"'{self.lay.module}' did not run on the calibration data, so its heads have no "
                                 "output to score; pass data that runs it or importance='l2'")
        return (self.total / self.count).cpu()


def _pre(sums: _Sums) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor):
            sums.add(args[0])
    return hook


def _mha(sums: _Sums) -> Callable[[nn.Module, Any, Any, Any], None]:
    def hook(module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        assert isinstance(module, nn.MultiheadAttention)
        bound = inspect.signature(nn.MultiheadAttention.forward).bind(module, *args, **kwargs).arguments
        keep = ("query", "key", "value", "key_padding_mask", "attn_mask", "is_causal")
        heads, _ = attend(module, **{k: v for k, v in bound.items() if k in keep})
        sums.add(heads)
    return hook


def _weights(model: nn.Module, lay: HeadLayout) -> torch.Tensor:
    """The L2 norm of each query head's entries in every tensor of its layer (a key/value head's
    entries counted for every query head that reads it)."""
    mods = dict(named_modules(model))
    total = torch.zeros(lay.heads, dtype=torch.float64)
    for part in lay.parts:
        t = getattr(mods[part.module], part.name).detach().double().cpu().movedim(part.dim, 0)
        for h in range(lay.heads):
            c = h if part.per == "q" else h // lay.group
            w = part.size(lay.head_dim)
            total[h] += t[part.offset + c * w:part.offset + (c + 1) * w].pow(2).sum()
    return total.sqrt()


def _calibrate(model: nn.Module, lays: list[HeadLayout], batches: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
               device: torch.device | str | None) -> dict[str, torch.Tensor]:
    mods = dict(named_modules(model))
    sums = {lay.module: _Sums(lay) for lay in lays}
    handles: list[Any] = []
    try:
        for lay in lays:
            if lay.out is None:  # own hook: the MHA's inputs, to recompute its heads (out_proj is never called)
                handles.append(mods[lay.module].register_forward_hook(_mha(sums[lay.module]), with_kwargs=True))
            else:  # own hook: per-head norms of the output projection's input, reduced on the device
                handles.append(out_site(lay, mods).register_forward_pre_hook(_pre(sums[lay.module])))
        plain_passes(model, batches, device)
    finally:
        for h in handles:
            h.remove()
    return {q: s.scores() for q, s in sums.items()}


def _example(inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Batch:
    """The example input as the one calibration batch (``loss(output, batch)`` gets the input itself, or
    the keyword inputs when there is no positional one); its labels are ``kwargs["labels"]``."""
    raw = (inputs[0] if len(inputs) == 1 else tuple(inputs)) if inputs else dict(kwargs)
    first = first_tensor((inputs, kwargs))
    size = int(first.shape[0]) if first is not None and first.ndim else 1
    return Batch(tuple(inputs), dict(kwargs), kwargs.get("labels"), size, raw)


def head_scores(model: nn.Module, lays: list[HeadLayout], importance: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any], data: Any, device: torch.device | str | None,
                max_batches: int | None, loss: Loss | None = None, also: Sequence[Kept] = ()) -> dict[str, torch.Tensor]:
    """Every layer's per-head scores (float64, on the CPU): ``"l2"`` from the weights; ``"output"``,
    ``"taylor"`` (with ``loss``) and ``"entropy"`` measured on ``data`` or, without data, on ``inputs``
    (with ``kwargs``). Hooks the caller placed read the same passes; for ``"taylor"``, ``also`` gets the
    gradients of what it kept in the same backward.

    Example:
        >>> from hookscope.analysis.prune.heads._groups import layouts
        >>> net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> s = head_scores(net, layouts(net), "output", (torch.randn(1, 4, 8),), {}, None, None, None)
        >>> s["self_attn"].shape, net.training
        (torch.Size([2]), True)
    """
    if importance == "l2":
        return {lay.module: _weights(model, lay) for lay in lays}
    if data is None:
        if not inputs and not kwargs:
            raise HookscopeError(f"importance={importance!r} runs the model: pass an example input, data=, or use "
                                 "importance='l2'")
        batches: Iterable[Batch] = [_example(inputs, kwargs)]
    else:
        batches = itertools.islice((split_batch(b, i) for i, b in enumerate(batches_of(data))), max_batches)
    if importance == "taylor":
        return taylor_scores(model, lays, batches, loss, device, also)
    if importance == "entropy":
        return entropy_scores(model, lays, batches, device)
    return _calibrate(model, lays, ((b.args, b.kwargs) for b in batches), device)
