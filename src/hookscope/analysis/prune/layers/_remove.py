"""``remove_layers``: whole blocks taken out of a transformers decoder, the model kept consistent.

The decoder's ``nn.ModuleList`` is rebuilt from the kept blocks; every module in them that holds a
``layer_idx`` (the attention layers, which index the key-value cache by it) is renumbered to its new
position; the config's layer count and its per-layer lists (``layer_types`` and the like) are trimmed,
so ``generate()`` with the cache, ``save_pretrained`` and ``from_pretrained`` see the model of fewer
layers it now is. Must not import: any other analysis module.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ....core.result import Result
from ....core.text import table
from ....errors import HookscopeError, checked
from ..calibrated import find_stack

__all__ = ["RemovedRow", "LayerRemoval", "remove_layers"]


@dataclass(frozen=True)
class RemovedRow:
    """One block of the stack before: its index, name, and its new index (``None``: removed).

    Example:
        >>> RemovedRow(1, "model.layers.1", None).removed
        True
    """

    index: int
    block: str
    new_index: int | None

    @property
    def removed(self) -> bool:
        """Whether the block was taken out."""
        return self.new_index is None


class LayerRemoval(Result):
    """What :func:`remove_layers` did: one row per block of the stack before.

    Example:
        >>> r = LayerRemoval([RemovedRow(0, "h.0", 0), RemovedRow(1, "h.1", None)])
        >>> r.removed, r.kept
        ([1], 1)
    """

    def __init__(self, rows: list[RemovedRow]) -> None:
        self.rows = rows

    @property
    def removed(self) -> list[int]:
        """The indices (before) of the blocks removed."""
        return [r.index for r in self.rows if r.removed]

    @property
    def kept(self) -> int:
        """How many blocks are left."""
        return sum(not r.removed for r in self.rows)

    def table(self) -> str:
        """One line per block, then the totals."""
        body = [[str(r.index), r.block, "removed" if r.removed else f"now {r.new_index}"] for r in self.rows]
        lines = table(["index", "block", "state"], body, left=(1, 2))
        return "\n".join([*lines, f"{len(self.removed)} of {len(self.rows)} blocks removed, {self.kept} kept"])

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the rows, the removed indices and the count kept."""
        return {"removed": self.removed, "kept": self.kept,
                "rows": [{"index": r.index, "block": r.block, "new_index": r.new_index} for r in self.rows]}


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _decoder(model: nn.Module) -> tuple[str, nn.ModuleList, Any]:
    """The decoder's list of blocks, its name, and the config that counts them; or a one-line refusal."""
    config = _text_config(model)
    count = getattr(config, "num_hidden_layers", None)
    stack = find_stack(model)
    if config is None or not isinstance(count, int) or stack.kind != "list" or len(stack.blocks) != count:
        raise HookscopeError(f"{type(model).__name__} is not a transformers decoder whose config counts its blocks "
                             "(num_hidden_layers); remove_layers renumbers those only")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise HookscopeError("the config scales attention by 1 / layer_idx (scale_attn_by_inverse_layer_idx): "
                             "renumbering the kept blocks would change what they compute; remove none, or "
                             "retrain")
    name = stack.blocks[0][0].rsplit(".", 1)[0]
    blocks = model.get_submodule(name)
    assert isinstance(blocks, nn.ModuleList)
    return name, blocks, config


def _chosen(blocks: object, count: int) -> list[int]:
    ok = isinstance(blocks, Sequence) and not isinstance(blocks, str) and all(
        isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in blocks)
    if not ok:
        raise HookscopeError(f"blocks={blocks!r} is not a list of block indices; pass ints, e.g. [2, 3] "
                             "(layer_importance(model, data).lowest(2) gives them)")
    assert isinstance(blocks, Sequence)
    chosen = sorted({int(b) for b in blocks})
    bad = [b for b in chosen if not 0 <= b < count]
    if bad:
        raise HookscopeError(f"block {bad[0]} is out of range: the model has {count} blocks (0 to {count - 1})")
    if len(chosen) == count:
        raise HookscopeError(f"removing all {count} blocks would leave no block; keep at least one")
    return chosen


def _trim(config: Any, old: int, keep: list[int]) -> None:
    """The layer count and every per-layer list of the config, for the kept blocks."""
    for key, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == old and "layer" in key:
            setattr(config, key, type(value)(value[i] for i in keep))
    config.num_hidden_layers = len(keep)


@checked
def remove_layers(model: nn.Module, blocks: Sequence[int]) -> LayerRemoval:
    """Take the blocks at ``blocks`` out of a transformers decoder, in place.

    The decoder's block list is rebuilt from the others, each attention layer's ``layer_idx`` renumbered
    (the cache is indexed by it), the config's ``num_hidden_layers`` (GPT-2's ``n_layer``) and per-layer
    lists such as ``layer_types`` trimmed: the model is the same family built with fewer layers and
    given the kept blocks' weights, so ``generate()``, ``save_pretrained`` and ``from_pretrained`` work.

    Args:
        model: a transformers decoder (LLaMA, Qwen2, Mistral, GPT-2, OPT...).
        blocks: the indices of the blocks to remove (:meth:`LayerImportance.lowest` gives the least
            important); at least one block must stay.

    Returns:
        :class:`LayerRemoval`, one row per block before.

    Example:
        >>> import transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
        ...                                num_hidden_layers=3, num_attention_heads=2)
        >>> lm = transformers.LlamaForCausalLM(cfg)
        >>> remove_layers(lm, [1]).removed, lm.config.num_hidden_layers, lm.model.layers[1].self_attn.layer_idx
        ([1], 2, 1)
    """
    name, stack, config = _decoder(model)
    removed = _chosen(blocks, len(stack))
    keep = [i for i in range(len(stack)) if i not in removed]
    rows = [RemovedRow(i, f"{name}.{i}", keep.index(i) if i in keep else None) for i in range(len(stack))]
    new = nn.ModuleList([stack[i] for i in keep])
    for j, block in enumerate(new):
        for m in block.modules():
            if isinstance(getattr(m, "layer_idx", None), int):
                setattr(m, "layer_idx", j)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)
    _trim(config, len(stack), keep)
    return LayerRemoval(rows)
