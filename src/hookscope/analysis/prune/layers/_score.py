"""``layer_importance``: how much each block of a stack changes what flows through it, measured on data.

Two scores: ``"influence"`` (ShortGPT's block influence, Men et al. 2024: one minus the cosine of a
block's input and output hidden state, averaged over every calibration token but
the pad positions an ``attention_mask`` marks; a block that barely turns
the stream scores near 0) and ``"perplexity"`` (the language model's perplexity on the data with the
block skipped, its output replaced by its input, minus the dense perplexity). Must not import: any
other analysis module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.hooks import HookGroup
from ....core.result import Result, missing
from ....core.text import table
from ....errors import HookscopeError, checked, did_you_mean
from ..calibrated import calibration_batches, device_of, find_stack

__all__ = ["LayerRow", "LayerImportance", "layer_importance", "SCORES", "lm_loss"]

SCORES = ("influence", "perplexity")


@dataclass(frozen=True)
class LayerRow:
    """One block: its position in the stack, its qualified name, its score (higher: more important).

    Example:
        >>> LayerRow(2, "model.layers.2", 0.125).index
        2
    """

    index: int
    block: str
    score: float


class LayerImportance(Result):
    """What :func:`layer_importance` measured: one row per block, in the order they run.

    Example:
        >>> r = LayerImportance("influence", [LayerRow(0, "h.0", 0.5), LayerRow(1, "h.1", 0.1)], 1.0)
        >>> r.lowest(1), r["h.1"].score
        ([1], 0.1)
    """

    def __init__(self, method: str, rows: list[LayerRow], dense: float | None) -> None:
        self.method, self.rows, self.dense = method, rows, dense

    def lowest(self, n: int) -> list[int]:
        """The indices of the ``n`` lowest-scoring blocks (ties: the later block first), ascending."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(self.rows):
            raise HookscopeError(f"lowest({n!r}): pass a count in [0, {len(self.rows)}) (every block but one at most)")
        order = sorted(self.rows, key=lambda r: (r.score, -r.index))
        return sorted(r.index for r in order[:n])

    def __getitem__(self, key: str) -> LayerRow:
        for r in self.rows:
            if r.block == key:
                return r
        raise missing(key, "block", [r.block for r in self.rows])

    def __contains__(self, key: object) -> bool:
        return any(r.block == key for r in self.rows)

    def table(self) -> str:
        """One line per block, then what the score is."""
        lines = table(["index", "block", "score"], [[str(r.index), r.block, f"{r.score:.6g}"] for r in self.rows],
                      left=(1,))
        what = ("1 - cos(input, output) over tokens" if self.method == "influence"
                else f"perplexity without the block minus the dense {self.dense:.6g}")
        return "\n".join([*lines, f"{len(self.rows)} blocks scored by {self.method}: {what}"])

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the method, the dense perplexity (``None`` for influence) and the rows."""
        return {"method": self.method, "dense": self.dense,
                "rows": [{"index": r.index, "block": r.block, "score": r.score} for r in self.rows]}


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("hidden_states")


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _run(model: nn.Module, batch: Any) -> Any:
    extra = {"use_cache": False} if hasattr(model, "config") else {}
    with torch.no_grad():
        return model(**batch, **extra) if isinstance(batch, Mapping) else model(batch, **extra)


def _ids(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise HookscopeError("method='perplexity' needs token ids [batch, seqlen] (or dicts with input_ids); "
                             "pass token ids, or method='influence'")
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return ids, mask


def lm_loss(model: nn.Module, batches: list[Any]) -> float:
    """The mean next-token cross entropy of a language model over the tokens of ``batches`` (padding,
    where an ``attention_mask`` says so, left out).

    Example:
        >>> lm = nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))
        >>> with torch.no_grad(): _ = lm[1].weight.zero_(), lm[1].bias.zero_()
        >>> round(math.exp(lm_loss(lm, [torch.tensor([[0, 1, 2, 3]])])), 6)
        4.0
    """
    total, count = 0.0, 0
    for batch in batches:
        ids, mask = _ids(batch)
        out = _run(model, batch)
        logits = getattr(out, "logits", out)
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != ids.shape:
            raise HookscopeError(f"{type(model).__name__} gives no logits [batch, seqlen, vocab]; method='perplexity' "
                                 "scores language models: pass one, or method='influence'")
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), ids[:, 1:].flatten().to(logits.device),
                                           reduction="none")
        keep = torch.ones_like(loss) if mask is None else mask[:, 1:].flatten().to(loss)
        total += float((loss * keep).sum())
        count += int(keep.sum())
    return total / max(count, 1)


def _real_tokens(mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """The batch's ``attention_mask`` as 0/1 over the tokens of a hidden state of ``shape[:-1]``."""
    if mask is None:
        return None
    if tuple(shape) != tuple(mask.shape):
        raise HookscopeError(f"a block's hidden state {tuple(shape)} does not follow the tokens of the attention_mask "
                             f"{tuple(mask.shape)}, so its pad positions cannot be left out; pass unpadded batches "
                             "(a list of token-id tensors, one length each) without attention_mask")
    return (mask != 0).to(torch.float64)


def _influence(model: nn.Module, blocks: list[tuple[str, nn.Module]], batches: list[Any]) -> list[float]:
    sums = [torch.zeros((), dtype=torch.float64) for _ in blocks]
    counts = [0 for _ in blocks]
    seen: dict[int, torch.Tensor] = {}
    tokens: list[torch.Tensor | None] = [None]  # the running batch's attention mask: its pad positions

    def pre(k: int) -> Any:
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen[k] = _hidden(args, kwargs)
        return hook

    def post(k: int) -> Any:
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x, y = seen.pop(k), _first(out)
            cos = nn.functional.cosine_similarity(x.double().flatten(0, -2), y.double().flatten(0, -2), dim=-1)
            keep = _real_tokens(tokens[0], x.shape[:-1])
            keep = torch.ones_like(cos) if keep is None else keep.flatten().to(cos)
            sums[k] = sums[k] + ((1 - cos) * keep).sum().cpu()
            counts[k] += int(keep.sum())
        return hook

    with HookGroup() as hooks:
        for k, (_, block) in enumerate(blocks):
            # own hook: each block's input and output stream, compared token by token as they pass
            hooks.add(block.register_forward_pre_hook(pre(k), with_kwargs=True))
            hooks.add(block.register_forward_hook(post(k), with_kwargs=True))
        for batch in batches:
            mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
            tokens[0] = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
            _run(model, batch)
    return [float(s) / max(c, 1) for s, c in zip(sums, counts)]


def _skipped(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    x = _hidden(args, kwargs)
    if isinstance(out, tuple):
        return (x, *out[1:])
    return x


def _perplexity(model: nn.Module, blocks: list[tuple[str, nn.Module]], batches: list[Any]) -> tuple[list[float], float]:
    dense = math.exp(lm_loss(model, batches))
    out = []
    for _, block in blocks:
        with HookGroup() as hooks:
            # own hook: the block skipped, its output replaced by its input, for one scoring pass
            hooks.add(block.register_forward_hook(_skipped, with_kwargs=True))
            out.append(math.exp(lm_loss(model, batches)) - dense)
    return out, dense


def _moved(batches: list[Any], device: torch.device) -> list[Any]:
    def to(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) else v
    return [{k: to(v) for k, v in b.items()} if isinstance(b, Mapping) else to(b) for b in batches]


@checked
def layer_importance(model: nn.Module, data: Any, *, method: str = "influence",
                     device: torch.device | str | None = None) -> LayerImportance:
    """Score every block of ``model``'s stack (a transformers decoder's layers, an ``nn.Sequential``'s
    children) on ``data``, for :func:`remove_layers`.

    Args:
        model: the model, left as it is (the scoring hooks are removed as it ends).
        data: token ids ``[batch, seqlen]``, a dict of keyword inputs, or a list or DataLoader of those.
        method: ``"influence"``: ``1 - cos(x_in, x_out)`` of each block's hidden state, averaged over
            every token but the padding an ``attention_mask`` marks (ShortGPT's block influence); ``"perplexity"``:
            the perplexity with the block skipped minus the dense perplexity (language models).
        device: where the inputs go (default: the model's first parameter's).

    Returns:
        :class:`LayerImportance`; ``lowest(n)`` gives the ``n`` blocks to remove.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 4))
        >>> r = layer_importance(net, torch.randn(8, 4))
        >>> abs(r.rows[1].score) < 1e-12, r.lowest(1)  # the identity does not turn the stream
        (True, [1])
    """
    if method not in SCORES:
        hint = did_you_mean(method, SCORES) if isinstance(method, str) else ""
        raise HookscopeError(f"no layer score {method!r}.{hint} The scores: {', '.join(SCORES)}")
    batches = _moved(calibration_batches(data), device_of(device, model))
    stack = find_stack(model)
    if stack.kind == "whole":
        raise HookscopeError(f"{type(model).__name__} has no stack of blocks (an nn.Sequential or a decoder's "
                             "nn.ModuleList of layers) to score")
    if method == "perplexity":
        scores, dense = _perplexity(model, stack.blocks, batches)
        return LayerImportance(method, [LayerRow(i, q, s) for i, ((q, _), s) in enumerate(zip(stack.blocks, scores))],
                               dense)
    scores = _influence(model, stack.blocks, batches)
    return LayerImportance(method, [LayerRow(i, q, s) for i, ((q, _), s) in enumerate(zip(stack.blocks, scores))],
                           None)
