"""The table of transformers families behind the component names: one :class:`Family` row each, saying
where a family keeps the residual stream, the attention's query, key, value and per-head outputs, the
MLP and the unembedding, as module paths under its blocks. A config-dependent layout (GPT-NeoX's
parallel residual, Falcon's three ways of fusing q, k and v) is one small ``variant`` function.

Must not import: ``selection``, capture, edit, analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Family", "Site", "FAMILIES", "family_of_type", "heads_of"]

IN, OUT = "input", "output"


@dataclass(frozen=True)
class Site:
    """Where a per-block component lives: ``module`` under the block (``""``: the block itself), its
    ``input`` or ``output``, and a ``recipe`` for the view: ``tensor`` (as is), ``main`` (the tensor, or
    element 0 of a tuple), ``element:N``, ``heads:q`` / ``heads:kv`` (the last dimension split into the
    query or key/value heads), or a fused projection's part: ``concat:q|k|v`` (q, k and v side by
    side), ``per_head:q|k|v`` (each head's q, k, v side by side), ``grouped:q|k|v`` (each key/value
    group's queries, then its key, then its value).

    Example:
        >>> Site("self_attn.q_proj", "output", "heads:q").recipe
        'heads:q'
    """

    module: str
    field: str
    recipe: str = "tensor"


@dataclass(frozen=True)
class Family:
    """One row of the table. Paths: ``stack`` (the blocks), ``embed``, ``pos_embed`` and ``final_norm``
    under the base model; ``unembed`` under the model with the head; ``sites`` under a block (the
    input of ``attn.z`` is the attention's output projection, which the per-head check reads). ``form``: ``sequential``
    (attention, then the MLP), ``parallel`` (both read the block's input) or ``post_norm`` (BERT: a
    norm after each sum, named in ``post_norms``). ``notes`` are shown beside a name; ``absent`` says
    why a name is refused; ``logit_cap`` names the config field of a soft cap on the logits; ``flat_mlp``: the
    stream between attention and the MLP, and the MLP's tensors, are ``[batch * pos, ...]`` (OPT)."""

    name: str
    model_types: tuple[str, ...]
    stack: str
    embed: str
    final_norm: str | None
    sites: Mapping[str, Site]
    pos_embed: str | None = None
    unembed: str | None = "lm_head"
    form: str = "sequential"
    post_norms: tuple[str, str] = ("", "")
    notes: Mapping[str, str] = field(default_factory=dict)
    absent: Mapping[str, str] = field(default_factory=dict)
    logit_cap: str | None = None
    flat_mlp: bool = False
    kv_heads: Callable[[Any], int] | None = None
    variant: Callable[[Family, Any], Family] | None = None


ROTARY = {"attn.q": "before rotary (and any q norm): the projection's output",
          "attn.k": "before rotary (and any k norm): the projection's output"}
LEARNED = {"attn.q": "as the dot product reads it (its 1/sqrt(d_head) scale applied inside attention)"}
PATTERN = {"attn.pattern": "eager attention only (attn_implementation='eager'); else hookscope.attention"}
NO_POS = {"pos_embed": "{family} has no position embedding: its positions are rotary, applied to q and k "
                       "inside attention"}


def _parallel(family: str) -> dict[str, str]:
    return {"resid_mid": f"{family} runs attention and the MLP in parallel on the block's input: there is no "
                         "stream between them; read resid_pre, attn_out and mlp_out"}


def _attention(attn: str, q: str, k: str, v: str, o: str, fused: str = "") -> dict[str, Site]:
    """q, k, v (separate projections, or parts of one fused projection ``q``), z and the pattern."""
    parts = {n: Site(q, OUT, f"{fused}:{n}") for n in "qkv"} if fused else {
        "q": Site(q, OUT, "heads:q"), "k": Site(k, OUT, "heads:kv"), "v": Site(v, OUT, "heads:kv")}
    return {**{f"attn.{n}": s for n, s in parts.items()}, "attn.z": Site(o, IN, "heads:q"),
            "attn.pattern": Site(attn, OUT, "element:1"), "attn_out": Site(attn, OUT, "main")}


def _mlp(mlp: str, down: str, mid: str | None) -> dict[str, Site]:
    """The MLP's input, hidden units (the input of its output projection: act(gate) * up where gated),
    output, and the stream between attention and the MLP (``mid``'s input)."""
    sites = {"mlp_in": Site(mlp, IN), "mlp.hidden": Site(down, IN), "mlp_out": Site(mlp, OUT, "main")}
    return {**sites, "resid_mid": Site(mid, IN)} if mid else sites


def _llama_like(name: str, *types: str, **extra: Any) -> Family:
    sites = {**_attention("self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
             **_mlp("mlp", "mlp.down_proj", "post_attention_layernorm")}
    sites.update(extra.pop("sites", {}))
    notes = {**ROTARY, **PATTERN, **extra.pop("notes", {})}
    return Family(name, types, "layers", "embed_tokens", "norm", sites, notes=notes, absent=NO_POS,
                  **extra)


def _bert_like(name: str, model_type: str, unembed: str) -> Family:
    """An encoder with a LayerNorm after each sum; its MLM head's decoder is the unembedding."""
    sites = {**_attention("attention.self", "attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense"),
             "attn_out": Site("attention.output.dense", OUT), "resid_mid": Site("attention", OUT, "main"),
             **_mlp("intermediate", "output.dense", None), "mlp_out": Site("output.dense", OUT)}
    notes = {**LEARNED, **PATTERN, "resid_mid": "after the attention's LayerNorm(resid_pre + attn_out)",
             "resid_post": "after the output LayerNorm(resid_mid + mlp_out)",
             "unembed": "the MLM head's decoder (after its dense, activation and LayerNorm)"}
    absent = {"final_norm": "{family} has no final norm: each block ends in its own LayerNorm (resid_post); the MLM "
                            "head's dense, activation and LayerNorm come before unembed"}
    return Family(name, (model_type,), "encoder.layer", "embeddings.word_embeddings", None, sites,
                  pos_embed="embeddings.position_embeddings", unembed=unembed, form="post_norm",
                  post_norms=("attention.output.LayerNorm", "output.LayerNorm"), notes=notes, absent=absent)


def _neox(row: Family, config: Any) -> Family:
    if getattr(config, "use_parallel_residual", True):
        return row
    sites = {**row.sites, "resid_mid": Site("post_attention_layernorm", IN)}
    return dataclasses.replace(row, form="sequential", sites=sites, absent=NO_POS)


def _falcon(row: Family, config: Any) -> Family:
    layout = "grouped" if config.new_decoder_architecture else "concat" if config.multi_query else "per_head"
    sites = {**row.sites, **{f"attn.{n}": Site("self_attention.query_key_value", OUT, f"{layout}:{n}") for n in "qkv"}}
    if config.new_decoder_architecture or config.parallel_attn:
        return dataclasses.replace(row, sites=sites)
    sites["resid_mid"] = Site("post_attention_layernorm", IN)
    return dataclasses.replace(row, sites=sites, form="sequential", absent=NO_POS)


def _olmo(row: Family, config: Any) -> Family:
    if not getattr(config, "clip_qkv", None):
        return row
    why = "OLMo with clip_qkv clamps q, k and v inside attention: the projections' outputs are not what it attends with"
    return dataclasses.replace(row, sites={n: s for n, s in row.sites.items() if n not in ("attn.q", "attn.k", "attn.v")},
                               absent={**row.absent, **{f"attn.{n}": why for n in "qkv"}})


def _falcon_kv(config: Any) -> int:
    if config.new_decoder_architecture:
        return int(config.num_kv_heads)
    return 1 if config.multi_query else int(config.num_attention_heads)


_GEMMA2_SITES = {"attn_out": Site("post_attention_layernorm", OUT), "resid_mid": Site("pre_feedforward_layernorm", IN),
                 "mlp_out": Site("post_feedforward_layernorm", OUT)}
_OLMO2_SITES = {"attn_out": Site("post_attention_layernorm", OUT), "resid_mid": Site("mlp", IN),
                "mlp_out": Site("post_feedforward_layernorm", OUT)}
_FLAT = "[batch * pos, ...]: OPT flattens batch and position before its MLP"
_POST_NORM_OUT = {"attn_out": "after the post-attention norm (what is added to the stream); the heads' z sum, "
                              "through o_proj, to the norm's input",
                  "mlp_out": "after the post-feedforward norm (what is added to the stream)"}

FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", ("gpt2",), "h", "wte", "ln_f",
           {**_attention("attn", "attn.c_attn", "", "", "attn.c_proj", fused="concat"),
            **_mlp("mlp", "mlp.c_proj", "ln_2")}, pos_embed="wpe", notes={**LEARNED, **PATTERN}),
    Family("GPT-J", ("gptj",), "h", "wte", "ln_f",
           {**_attention("attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj"),
            **_mlp("mlp", "mlp.fc_out", None)}, form="parallel", notes={**ROTARY, **PATTERN},
           absent={**NO_POS, **_parallel("GPT-J")}),
    Family("GPT-NeoX", ("gpt_neox",), "layers", "embed_in", "final_layer_norm",
           {**_attention("attention", "attention.query_key_value", "", "", "attention.dense", fused="per_head"),
            **_mlp("mlp", "mlp.dense_4h_to_h", None)}, form="parallel", notes={**ROTARY, **PATTERN},
           absent={**NO_POS, **_parallel("GPT-NeoX with use_parallel_residual=True")}, variant=_neox),
    Family("OPT", ("opt",), "decoder.layers", "decoder.embed_tokens", "decoder.final_layer_norm",
           {**_attention("self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"),
            **_mlp("fc1", "fc2", "final_layer_norm"), "mlp_out": Site("fc2", OUT)},
           pos_embed="decoder.embed_positions",
           notes={"attn.q": "before OPT's 1/sqrt(d_head) scale (applied to the projection's output)", **PATTERN,
                  **{n: _FLAT for n in ("resid_mid", "mlp_in", "mlp.hidden", "mlp_out")}}, flat_mlp=True),
    _llama_like("LLaMA", "llama"),
    _llama_like("Mistral", "mistral"),
    _llama_like("Qwen2", "qwen2"),
    _llama_like("Qwen3", "qwen3"),
    _llama_like("Gemma", "gemma"),
    _llama_like("Gemma2", "gemma2", sites=_GEMMA2_SITES, notes=_POST_NORM_OUT, logit_cap="final_logit_softcapping"),
    _llama_like("OLMo", "olmo", variant=_olmo),
    _llama_like("OLMo2", "olmo2", sites=_OLMO2_SITES, notes=_POST_NORM_OUT),
    _llama_like("Phi-3", "phi3", sites={
        **_attention("self_attn", "self_attn.qkv_proj", "", "", "self_attn.o_proj", fused="concat")}),
    Family("Phi", ("phi",), "layers", "embed_tokens", "final_layernorm",
           {**_attention("self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.dense"),
            **_mlp("mlp", "mlp.fc2", None)}, form="parallel", notes={**ROTARY, **PATTERN},
           absent={**NO_POS, **_parallel("Phi")}),
    Family("Falcon", ("falcon",), "h", "word_embeddings", "ln_f",
           {**_attention("self_attention", "self_attention.query_key_value", "", "", "self_attention.dense",
                         fused="concat"),
            **_mlp("mlp", "mlp.dense_4h_to_h", None)}, form="parallel", notes={**ROTARY, **PATTERN},
           absent={**NO_POS, **_parallel("Falcon with parallel_attn=True")}, kv_heads=_falcon_kv, variant=_falcon),
    _bert_like("BERT", "bert", "cls.predictions.decoder"),
    _bert_like("RoBERTa", "roberta", "lm_head.decoder"),
)


def family_of_type(model_type: str) -> Family | None:
    """The row for a config's ``model_type``, or ``None``.

    Example:
        >>> family_of_type("llama").name, family_of_type("t5")
        ('LLaMA', None)
    """
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def heads_of(family: Family, config: Any) -> tuple[int, int, int]:
    """(query heads, key/value heads, channels per head) as the config says.

    Example:
        >>> from types import SimpleNamespace as C
        >>> heads_of(family_of_type("llama"), C(num_attention_heads=4, num_key_value_heads=2, hidden_size=32))
        (4, 2, 8)
    """
    heads = int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head"))
    kv = family.kv_heads(config) if family.kv_heads else int(getattr(config, "num_key_value_heads", None) or heads)
    width = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))
    d_head = getattr(config, "head_dim", None)
    return heads, kv, int(d_head) if d_head else width // heads
