"""Where the heads of an attention layer live: one small reader per kind of attention module,
registered in one table (``READERS``), each saying which rows of the query / key / value projections
and which columns of the output projection belong to each head, and one fixer per kind that sets the
head counts the module reads after its tensors were sliced.

Kinds: ``nn.MultiheadAttention`` (fused ``in_proj_weight`` or separate projections, ``out_proj``),
BERT-style self-attention (``query`` / ``key`` / ``value``, the sibling ``output.dense``: BERT, RoBERTa
...), GPT-2 (fused ``c_attn`` ``Conv1D`` split in three, ``c_proj``), LLaMA-style
(``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj``, grouped-query attention: LLaMA, Qwen2, Mistral,
Hugging Face's ViT ...), torchvision's Swin window attention (fused ``qkv``, ``proj``, one column of
the relative position bias table per head; V2: one ``logit_scale`` entry and one output of the
position bias MLP per head), torchvision's MaxViT attention (fused ``to_qkv``, ``merge``, a bias
table column per head) and timm's ``Attention`` (fused ``qkv``, ``proj``). Must not import:
analysis, ``loading``, ``cli``, ``viz``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.ops import OpSite, split_op

__all__ = ["Part", "HeadLayout", "READERS", "read_layout", "out_site", "holds_head_tables", "fix_layout", "heads_of",
           "config_heads", "refit_heads", "write_head_configs"]


@dataclass(frozen=True)
class Part:
    """One tensor holding a slice per head: head ``h``'s entries along ``dim`` are
    ``offset + h * w ... offset + (h + 1) * w - 1``, ``w`` being ``width`` or, when 0, the layout's
    ``head_dim`` (a per-head table or scale holds one entry per head: ``width=1``). ``per`` is ``"q"`` (one slice per
    query head) or ``"kv"`` (per key/value head); ``role`` is ``producer`` (query / key / value rows and
    biases) or ``follower`` (the output projection's columns: masked with the head, so that a masked
    head adds nothing even where its key/value head stays).

    Example:
        >>> Part("attn.qkv", "weight", 0, 8, "kv", "producer").offset
        8
    """

    module: str
    name: str
    dim: int
    offset: int
    per: str
    role: str
    width: int = 0

    def size(self, head_dim: int) -> int:
        """Entries per head along ``dim``.

        Example:
            >>> Part("attn", "table", 1, 0, "kv", "follower", width=1).size(32)
            1
        """
        return self.width or head_dim


@dataclass(frozen=True)
class HeadLayout:
    """An attention layer's heads: ``heads`` query heads of ``head_dim`` channels, ``kv_heads`` key/value
    heads (fewer under grouped-query attention; query head ``h`` reads key/value head
    ``h // (heads // kv_heads)``), the tensors that hold them, and ``out``, the module whose input holds
    the heads' outputs side by side (``None``: recomputed from the module's own inputs).

    Example:
        >>> lay = HeadLayout("attn", "timm", 4, 4, 8, (), "attn.proj")
        >>> lay.group
        1
    """

    module: str
    kind: str
    heads: int
    kv_heads: int
    head_dim: int
    parts: tuple[Part, ...]
    out: str | None

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


Reader = Callable[[str, nn.Module, Mapping[str, nn.Module]], "HeadLayout | str | None"]


def _name(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child


def _qkv(module: str, names: Sequence[str], m: nn.Module, offsets: Sequence[int], per: Sequence[str],
         dim: int = 0) -> list[Part]:
    """Producer parts of the query, key and value projections, separate (three children) or fused (one
    child named three times, at three offsets): weight rows along ``dim``, bias entries along 0."""
    parts = []
    for child, off, p in zip(names, offsets, per):
        q = _name(module, child)
        parts.append(Part(q, "weight", dim, off, p, "producer"))
        if getattr(m.get_submodule(child), "bias", None) is not None:
            parts.append(Part(q, "bias", 0, off, p, "producer"))
    return parts


def _mha(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    if not isinstance(m, nn.MultiheadAttention):
        return None
    h, d = m.num_heads, m.head_dim
    e = h * d  # embed_dim, or fewer once heads were removed
    parts: list[Part] = []
    if m.in_proj_weight is not None:
        parts += [Part(q, "in_proj_weight", 0, off, "kv", "producer") for off in (0, e, 2 * e)]
    else:
        parts += [Part(q, f"{p}_proj_weight", 0, 0, "kv", "producer") for p in "qkv"]
    if m.in_proj_bias is not None:
        parts += [Part(q, "in_proj_bias", 0, off, "kv", "producer") for off in (0, e, 2 * e)]
    parts += [Part(q, n, 2, 0, "kv", "producer") for n in ("bias_k", "bias_v") if getattr(m, n) is not None]
    parts.append(Part(_name(q, "out_proj"), "weight", 1, 0, "kv", "follower"))
    return HeadLayout(q, "mha", h, h, d, tuple(parts), None)


def _bert(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    kids = dict(m.named_children())
    if not all(isinstance(kids.get(n), nn.Linear) for n in ("query", "key", "value")) or \
            not isinstance(getattr(m, "attention_head_size", None), int):
        return None
    parent = q.rsplit(".", 1)[0] if "." in q else ""
    out = _name(parent, "output.dense") if q else ""
    if not isinstance(mods.get(out), nn.Linear) or mods[out] is m:
        return f"'{q}' has query / key / value but no sibling output.dense reading its heads"
    d, h = int(getattr(m, "attention_head_size")), int(getattr(m, "num_attention_heads"))
    parts = _qkv(q, ("query", "key", "value"), m, (0, 0, 0), ("kv",) * 3)
    parts.append(Part(out, "weight", 1, 0, "kv", "follower"))
    return HeadLayout(q, "bert", h, h, d, tuple(parts), out)


def _gpt2(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    kids = dict(m.named_children())
    if type(kids.get("c_attn")).__name__ != "Conv1D" or not all(hasattr(m, a) for a in ("split_size", "num_heads",
                                                                                         "head_dim")):
        return None
    if getattr(m, "is_cross_attention", False):
        return f"'{q}' is cross-attention (queries from another stream): its heads are not followed"
    h, d, s = int(getattr(m, "num_heads")), int(getattr(m, "head_dim")), int(getattr(m, "split_size"))
    parts = _qkv(q, ("c_attn",) * 3, m, (0, s, 2 * s), ("kv",) * 3, dim=1)  # Conv1D: weight is (in, out)
    parts.append(Part(_name(q, "c_proj"), "weight", 0, 0, "kv", "follower"))
    return HeadLayout(q, "gpt2", h, h, d, tuple(parts), _name(q, "c_proj"))


def _llama(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    kids = dict(m.named_children())
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if not all(isinstance(kids.get(n), nn.Linear) for n in names) or not hasattr(m, "head_dim"):
        return None
    d = int(getattr(m, "head_dim"))
    qp, kp, op = kids["q_proj"], kids["k_proj"], kids["o_proj"]
    assert isinstance(qp, nn.Linear) and isinstance(kp, nn.Linear) and isinstance(op, nn.Linear)
    h, kv = qp.out_features // d, kp.out_features // d
    if h % kv or getattr(m, "num_key_value_groups", h // kv) != h // kv:
        return f"'{q}' has {h} query heads and {kv} key/value heads that do not form equal groups"
    together = [n for n in ("q_norm", "k_norm") if getattr(getattr(m, n, None), "weight", torch.empty(0)).numel() > d]
    if together:  # OLMo 2: one RMSNorm over all the heads' queries, so removing one changes the others
        return f"'{q}' normalises all its heads together ({together[0]}): they cannot be removed one by one"
    parts = _qkv(q, names[:3], m, (0, 0, 0), ("q", "kv", "kv"))
    parts.append(Part(_name(q, "o_proj"), "weight", 1, 0, "q", "follower"))
    return HeadLayout(q, "llama", h, kv, d, tuple(parts), _name(q, "o_proj"))


_TIMM_CHILDREN = {"qkv", "q_norm", "k_norm", "attn_drop", "norm", "gate", "proj", "proj_drop"}


def _timm(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    kids = dict(m.named_children())
    if not isinstance(kids.get("qkv"), nn.Linear) or not isinstance(kids.get("proj"), nn.Linear) \
            or not hasattr(m, "num_heads") or not hasattr(m, "head_dim"):
        return None
    if set(kids) - _TIMM_CHILDREN or any(p is not None for p in m._parameters.values()):
        return f"'{q}' holds more than its projections (per-head biases or tables): its heads are not followed"
    h, d = int(getattr(m, "num_heads")), int(getattr(m, "head_dim"))
    if not isinstance(kids.get("norm", nn.Identity()), nn.Identity) or kids.get("gate") is not None:
        return f"'{q}' normalises or gates its heads together before the projection: they cannot be removed"
    a = h * d
    parts = _qkv(q, ("qkv",) * 3, m, (0, a, 2 * a), ("kv",) * 3)
    parts.append(Part(_name(q, "proj"), "weight", 1, 0, "kv", "follower"))
    return HeadLayout(q, "timm", h, h, d, tuple(parts), _name(q, "proj"))


_SWIN_SOURCE = "torchvision.models.swin_transformer"
_SWIN_OWN = "hookscope.anatomy._heads_swin"


def _swin_base(m: nn.Module) -> type | None:
    """torchvision's window attention class ``m`` is (or was, before its heads were removed)."""
    for cls in type(m).__mro__:
        if cls.__module__ == _SWIN_SOURCE and cls.__name__.startswith("ShiftedWindowAttention"):
            return cls
    return None


def _swin(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    base, qkv = _swin_base(m), getattr(m, "qkv", None)
    if base is None or not isinstance(qkv, nn.Linear) or not isinstance(getattr(m, "proj", None), nn.Linear):
        return None
    mro = type(m).__mro__
    if any("forward" in vars(c) and c.__module__ != _SWIN_OWN for c in mro[:mro.index(base)]):
        return f"'{q}' is a {base.__name__} with a forward of its own: its heads are not followed"
    h = int(getattr(m, "num_heads"))
    a = int(qkv.weight.shape[0]) // 3
    parts = _qkv(q, ("qkv",) * 3, m, (0, a, 2 * a), ("kv",) * 3)
    parts.append(Part(_name(q, "proj"), "weight", 1, 0, "kv", "follower"))
    mlp = getattr(m, "cpb_mlp", None)
    if isinstance(mlp, nn.Sequential) and isinstance(mlp[-1], nn.Linear):  # V2: a per-head scale and bias MLP
        last = _name(q, f"cpb_mlp.{len(mlp) - 1}")
        parts.append(Part(q, "logit_scale", 0, 0, "kv", "follower", width=1))
        parts += [Part(last, n, 0, 0, "kv", "follower", width=1) for n in ("weight", "bias")
                  if getattr(mlp[-1], n) is not None]
    else:  # one column of the relative position bias table per head
        parts.append(Part(q, "relative_position_bias_table", 1, 0, "kv", "follower", width=1))
    # torchvision calls the output projection as F.linear (its second linear): read there
    return HeadLayout(q, "swin", h, h, a // h, tuple(parts), f"{q}::linear.1")


_MAXVIT_SOURCE = "torchvision.models.maxvit"
_MAXVIT_OWN = "hookscope.anatomy._heads_maxvit"


def _maxvit_base(m: nn.Module) -> type | None:
    """torchvision's MaxViT attention class ``m`` is (or was, before its heads were removed)."""
    for cls in type(m).__mro__:
        if cls.__module__ == _MAXVIT_SOURCE and cls.__name__ == "RelativePositionalMultiHeadAttention":
            return cls
    return None


def _maxvit(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    base, qkv = _maxvit_base(m), getattr(m, "to_qkv", None)
    if base is None or not isinstance(qkv, nn.Linear) or not isinstance(getattr(m, "merge", None), nn.Linear):
        return None
    mro = type(m).__mro__
    if any("forward" in vars(c) and c.__module__ != _MAXVIT_OWN for c in mro[:mro.index(base)]):
        return f"'{q}' is a {base.__name__} with a forward of its own: its heads are not followed"
    h, d = int(getattr(m, "n_heads")), int(getattr(m, "head_dim"))
    parts = _qkv(q, ("to_qkv",) * 3, m, (0, h * d, 2 * h * d), ("kv",) * 3)  # chunked in three
    parts.append(Part(_name(q, "merge"), "weight", 1, 0, "kv", "follower"))
    parts.append(Part(q, "relative_position_bias_table", 1, 0, "kv", "follower", width=1))
    return HeadLayout(q, "maxvit", h, h, d, tuple(parts), _name(q, "merge"))


READERS: dict[str, Reader] = {"mha": _mha, "bert": _bert, "gpt2": _gpt2, "llama": _llama, "swin": _swin,
                              "maxvit": _maxvit, "timm": _timm}
"""One reader per kind of attention module: ``(qualname, module, modules by name) -> HeadLayout``, a
reason (the module looks like attention but its heads cannot be followed) or ``None`` (not this kind)."""


def out_site(lay: HeadLayout, mods: Mapping[str, nn.Module]) -> nn.Module:
    """Where the heads' outputs, side by side, are the first input: the module ``lay.out`` or, for a
    layout whose output projection is a call of its layer's own forward (``layer::linear.1``), that call.

    Example:
        >>> lay = HeadLayout("a", "swin", 2, 2, 4, (), "a::linear.1")
        >>> type(out_site(lay, {"a": nn.Identity()})).__name__
        'OpSite'
    """
    assert lay.out is not None
    at = split_op(lay.out)
    return OpSite(mods[at[0]], at[0], at[1]) if at is not None else mods[lay.out]


def read_layout(q: str, m: nn.Module, mods: Mapping[str, nn.Module]) -> HeadLayout | str | None:
    """The head layout of module ``m`` named ``q``: the first reader that knows it.

    Example:
        >>> read_layout("a", nn.MultiheadAttention(8, 2), {}).heads
        2
    """
    for reader in READERS.values():
        found = reader(q, m, mods)
        if found is not None:
            return found
    return None


def heads_of(lay: HeadLayout, kept: Sequence[int]) -> tuple[int, int]:
    """(query heads, key/value heads) left when the query heads ``kept`` stay.

    Example:
        >>> heads_of(HeadLayout("a", "llama", 8, 2, 4, (), None), [0, 1, 4, 5])
        (4, 2)
    """
    kv = len({h // lay.group for h in kept})
    return len(kept), kv


def _fix_mha(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    from ._heads_mha import (
        HeadPrunedMultiheadAttention,  # the compacted layer's own forward
    )

    before = getattr(m, "kept_heads", list(range(lay.heads)))
    m.__class__ = HeadPrunedMultiheadAttention
    setattr(m, "num_heads", len(kept))
    setattr(m, "kept_heads", [before[h] for h in kept])
    # torch's fused kernels (nn.TransformerEncoderLayer's and the layer's own fast path) read the
    # head size as embed_dim // num_heads: this flag turns them off, the forward reads in_proj_weight
    setattr(m, "_qkv_same_embed_dim", False)


def _fix_bert(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    setattr(m, "num_attention_heads", len(kept))
    setattr(m, "all_head_size", len(kept) * lay.head_dim)


def _fix_gpt2(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    setattr(m, "num_heads", len(kept))
    setattr(m, "split_size", len(kept) * lay.head_dim)


def _fix_llama(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    _fix_llama_counts(m, *heads_of(lay, kept))


def _fix_timm(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    setattr(m, "num_heads", len(kept))
    if hasattr(m, "attn_dim"):
        setattr(m, "attn_dim", len(kept) * lay.head_dim)


def _fix_swin(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    from ._heads_swin import (
        pruned_class,  # torchvision's forward reads the head size from the input width
    )

    m.__class__ = pruned_class(m)
    setattr(m, "num_heads", len(kept))


def _fix_maxvit(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    from ._heads_maxvit import (
        HeadPrunedRelativePositionalMultiHeadAttention,  # reshapes to the input width
    )

    m.__class__ = HeadPrunedRelativePositionalMultiHeadAttention
    setattr(m, "n_heads", len(kept))


FIXERS: dict[str, Callable[[nn.Module, HeadLayout, Sequence[int]], None]] = {
    "mha": _fix_mha, "bert": _fix_bert, "gpt2": _fix_gpt2, "llama": _fix_llama, "swin": _fix_swin,
    "maxvit": _fix_maxvit, "timm": _fix_timm}


def fix_layout(m: nn.Module, lay: HeadLayout, kept: Sequence[int]) -> None:
    """Set the head counts module ``m`` reads when the query heads ``kept`` (original indices) stay.

    Example:
        >>> mha = nn.MultiheadAttention(8, 4); lay = read_layout("", mha, {})
        >>> fix_layout(mha, lay, [0, 2]); mha.num_heads, mha.head_dim, type(mha).__name__
        (2, 2, 'HeadPrunedMultiheadAttention')
    """
    FIXERS[lay.kind](m, lay, kept)


def config_heads(lay: HeadLayout, cfg: Any, heads: int, kv_heads: int) -> bool:
    """Write the head counts into a Hugging Face config (every layer keeps ``heads``) where it can say
    them: LLaMA-style configs, with ``head_dim`` explicitly (it would otherwise be derived as hidden /
    heads). BERT and GPT-2 derive the head size from ``hidden_size / num_attention_heads``: their config
    keeps the count the head size comes from (``fit_to`` rebuilds the heads from the tensors' shapes).
    Returns whether the config was changed."""
    if lay.kind != "llama":
        return False
    setattr(cfg, "num_attention_heads", heads)
    if hasattr(cfg, "num_key_value_heads"):
        setattr(cfg, "num_key_value_heads", kv_heads)
    setattr(cfg, "head_dim", lay.head_dim)
    return True


def _rows(t: torch.Tensor | None, dim: int = 0) -> int:
    return int(t.shape[dim]) if isinstance(t, torch.Tensor) else 0


def _counts(m: nn.Module) -> tuple[str, int, int, int] | None:
    """(kind, query heads, key/value heads, head_dim) an attention module's tensors hold now."""
    if isinstance(m, nn.MultiheadAttention):
        fused = m.in_proj_weight is not None
        h = _rows(m.in_proj_weight if fused else m.q_proj_weight) // (3 if fused else 1) // m.head_dim
        return "mha", h, h, m.head_dim
    tables = _table_counts(m)
    if tables is not None:
        return tables
    kids = dict(m.named_children())
    d = getattr(m, "attention_head_size", getattr(m, "head_dim", None))
    if not isinstance(d, int) or d < 1:
        return None
    if "query" in kids and isinstance(getattr(m, "attention_head_size", None), int):
        h = _rows(getattr(kids["query"], "weight", None)) // d
        return "bert", h, h, d
    if type(kids.get("c_attn")).__name__ == "Conv1D" and hasattr(m, "split_size"):
        h = _rows(getattr(kids["c_attn"], "weight", None), 1) // 3 // d
        return "gpt2", h, h, d
    if "q_proj" in kids and "k_proj" in kids and hasattr(m, "num_key_value_groups"):
        h, kv = _rows(getattr(kids["q_proj"], "weight", None)) // d, _rows(getattr(kids["k_proj"], "weight", None)) // d
        return ("llama", h, kv, d) if kv and not h % kv else None
    if "qkv" in kids and "proj" in kids and hasattr(m, "num_heads"):
        h = _rows(getattr(kids["qkv"], "weight", None)) // 3 // d
        return "timm", h, h, d
    return None


def _table_counts(m: nn.Module) -> tuple[str, int, int, int] | None:
    """The heads of a torchvision attention holding per-head tables: the bias table's columns (Swin V2:
    the bias MLP's outputs)."""
    kind = "swin" if _swin_base(m) is not None else "maxvit" if _maxvit_base(m) is not None else None
    qkv, mlp = getattr(m, "qkv" if kind == "swin" else "to_qkv", None), getattr(m, "cpb_mlp", None)
    if kind is None or not isinstance(qkv, nn.Linear):
        return None
    if isinstance(mlp, nn.Sequential):
        h = _rows(getattr(mlp[-1], "weight", None))
    else:
        h = _rows(getattr(m, "relative_position_bias_table", None), 1)
    return (kind, h, h, _rows(qkv.weight) // 3 // h) if h else None


def holds_head_tables(m: nn.Module) -> bool:
    """Whether ``m`` is an attention layer whose own tensors are per-head tables that
    :func:`refit_heads` fits with its heads (torchvision's Swin window attention).

    Example:
        >>> holds_head_tables(nn.MultiheadAttention(8, 2))
        False
    """
    return _table_counts(m) is not None


def refit_heads(m: nn.Module) -> tuple[HeadLayout, int, int] | None:
    """Set the head counts of attention module ``m`` from the shapes its tensors have now (after
    :func:`~hookscope.anatomy.fit_to` gave them a compacted file's shapes). Returns its layout as it was built,
    with the counts it reads now, or ``None`` when it is no attention hookscope follows.

    Example:
        >>> mha = nn.MultiheadAttention(8, 4)
        >>> mha.in_proj_weight = nn.Parameter(mha.in_proj_weight[:12].detach())
        >>> lay, h, kv = refit_heads(mha); (lay.heads, h, mha.num_heads, mha.head_dim)
        (4, 2, 2, 2)
    """
    found = _counts(m)
    if found is None:
        return None
    kind, h, kv, d = found
    if h < 1:
        return None
    before = {"mha": "num_heads", "bert": "num_attention_heads", "gpt2": "num_heads", "timm": "num_heads",
              "swin": "num_heads", "maxvit": "n_heads"}
    was = int(getattr(m, before[kind], h)) if kind in before else h
    lay = HeadLayout("", kind, was, kv if kind == "llama" else was, d, (), None)
    if kind == "llama":
        _fix_llama_counts(m, h, kv)
    elif h != was:
        FIXERS[kind](m, lay, list(range(h)))
    return lay, h, kv


def _fix_llama_counts(m: nn.Module, h: int, kv: int) -> None:
    setattr(m, "num_key_value_groups", h // kv)
    for name, value in (("num_heads", h), ("num_attention_heads", h), ("num_key_value_heads", kv)):
        if hasattr(m, name):
            setattr(m, name, value)


def write_head_configs(counts: Sequence[tuple[nn.Module, HeadLayout, tuple[int, int]]]) -> None:
    """Write the head counts into the Hugging Face config the layers share, when every layer sharing it
    keeps the same counts (a config holds one count for all layers) and the config can say them
    (``config_heads``); layers left with different counts leave it as it was, with a warning.

    Example:
        >>> write_head_configs([])
    """
    configs: dict[int, tuple[Any, HeadLayout, set[tuple[int, int]]]] = {}
    for m, lay, hk in counts:
        cfg = getattr(m, "config", None)
        if cfg is not None and lay.kind != "mha":
            configs.setdefault(id(cfg), (cfg, lay, set()))[2].add(hk)
    for cfg, lay, seen in configs.values():
        if len(seen) == 1:
            config_heads(lay, cfg, *next(iter(seen)))
        elif lay.kind == "llama":
            warnings.warn(f"the model's config keeps num_attention_heads={getattr(cfg, 'num_attention_heads', '?')}: "
                          f"its layers now keep {sorted(h for h, _ in seen)} heads, and a config holds one count "
                          "for all layers (save_pretrained / from_pretrained need the same count everywhere)",
                          stacklevel=3)
