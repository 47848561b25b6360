"""Whether the shapes a file gives an attention layer's projections are whole heads of its head size:
``fit_to`` asks before changing anything, so a file cut across a head is refused, not fitted to a
head count the layer's forward then fails on.

Must not import: analysis, ``loading``, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from ._heads import holds_head_tables

__all__ = ["Shape", "head_misfit"]



Shape = Callable[[nn.Module | None, str], tuple[int, ...] | None]


def _misfit_llama(m: nn.Module, kids: Mapping[str, nn.Module], shape: Shape, d: int) -> str | None:
    rows = {k: (shape(kids.get(f"{k}_proj"), "weight") or (0,))[0] for k in ("q", "k", "v")}
    for k, what in (("q", "query"), ("k", "key"), ("v", "value")):
        if rows[k] % d:
            return f"its {rows[k]} {what} channels are not whole heads of {d}"
    h, kv = rows["q"] // d, rows["k"] // d
    if rows["k"] != rows["v"] or not kv or h % kv:
        return f"its {h} query heads do not share its {kv} key/value heads equally"
    return None


def head_misfit(m: nn.Module, shape: Shape) -> str | None:
    """Why the shapes an attention module's projections are to take (``shape(module, tensor name)``)
    are no whole heads of its head size, or None (``fit_to`` refuses such a file before any change).

    Example:
        >>> mha = nn.MultiheadAttention(8, 4)
        >>> head_misfit(mha, lambda mod, name: (9, 8) if name == "in_proj_weight" else None)
        'its 9 query, key and value channels are not 3 x whole heads of 2'
    """
    kids = dict(m.named_children())
    d = m.head_dim if isinstance(m, nn.MultiheadAttention) else \
        getattr(m, "attention_head_size", getattr(m, "head_dim", None))
    # per-head tables (Swin, MaxViT) are refitted with their heads; GPT-2's cross-attention is not followed
    if not isinstance(d, int) or d < 1 or holds_head_tables(m) or "q_attn" in kids:
        return None
    fused = {"in_proj_weight": (m, 0), "c_attn": (kids.get("c_attn"), 1), "qkv": (kids.get("qkv"), 0)}
    which = "in_proj_weight" if isinstance(m, nn.MultiheadAttention) else \
        "c_attn" if type(kids.get("c_attn")).__name__ == "Conv1D" else "qkv" if "proj" in kids else None
    if which is not None:
        mod, dim = fused[which]
        s = shape(mod, "weight" if mod is not m else which)
        n = s[dim] if s else 0
        return f"its {n} query, key and value channels are not 3 x whole heads of {d}" if n % (3 * d) else None
    if "query" in kids:
        for what in ("query", "key", "value"):
            n = (shape(kids.get(what), "weight") or (0,))[0]
            if n % d:
                return f"its {n} {what} channels are not whole heads of {d}"
        return None
    return _misfit_llama(m, kids, shape, d) if "q_proj" in kids and "k_proj" in kids else None
