"""Component names on every supported transformers family: tiny configs with random weights, the stream
read back through the names (with hookscope.capture, independently of the check) recomputing the logits,
the residual sums and the heads' outputs by value; q and k giving the model's own attention probabilities;
names a family does not have, unsupported families and changed layouts refused in one line."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.anatomy import View
from hookscope.core import hook_count

from helpers import no_hooks

transformers = pytest.importorskip("transformers")
T = transformers

SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=50)
GQA = dict(SMALL, num_key_value_heads=2)
# family -> (its config, the row's name, the form of its blocks)
CONFIGS: dict[str, tuple[Callable[[], Any], str, str]] = {
    "gpt2": (lambda: T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32), "GPT-2", "sequential"),
    "gptj": (lambda: T.GPTJConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32, rotary_dim=8),
             "GPT-J", "parallel"),
    "gpt_neox": (lambda: T.GPTNeoXConfig(**SMALL), "GPT-NeoX", "parallel"),
    "gpt_neox_sequential": (lambda: T.GPTNeoXConfig(**SMALL, use_parallel_residual=False), "GPT-NeoX", "sequential"),
    "opt": (lambda: T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, ffn_dim=64, vocab_size=50,
                                word_embed_proj_dim=32), "OPT", "sequential"),
    "llama": (lambda: T.LlamaConfig(**GQA), "LLaMA", "sequential"),
    "mistral": (lambda: T.MistralConfig(**GQA), "Mistral", "sequential"),
    "qwen2": (lambda: T.Qwen2Config(**GQA), "Qwen2", "sequential"),
    "qwen3": (lambda: T.Qwen3Config(**GQA, head_dim=8), "Qwen3", "sequential"),
    "gemma": (lambda: T.GemmaConfig(**GQA, head_dim=8), "Gemma", "sequential"),
    "gemma2": (lambda: T.Gemma2Config(**GQA, head_dim=8), "Gemma2", "sequential"),
    "phi3": (lambda: T.Phi3Config(**GQA, pad_token_id=0), "Phi-3", "sequential"),
    "phi": (lambda: T.PhiConfig(**SMALL), "Phi", "parallel"),
    "falcon": (lambda: T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=50),
               "Falcon", "parallel"),
    "falcon_classic": (lambda: T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=50,
                                              multi_query=False), "Falcon", "parallel"),
    "falcon_sequential": (lambda: T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                                 vocab_size=50, parallel_attn=False), "Falcon", "sequential"),
    "falcon_new": (lambda: T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                                          vocab_size=50, new_decoder_architecture=True), "Falcon", "parallel"),
    "olmo": (lambda: T.OlmoConfig(**SMALL), "OLMo", "sequential"),
    "olmo2": (lambda: T.Olmo2Config(**SMALL), "OLMo2", "sequential"),
    "bert": (lambda: T.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=50), "BERT", "post_norm"),
    "roberta": (lambda: T.RobertaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                        intermediate_size=64, vocab_size=50), "RoBERTa", "post_norm"),
}
ENCODERS = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}
IDS = torch.tensor([[1, 7, 3, 9, 4, 2], [5, 5, 11, 0, 8, 13]])


def build(family: str, attention: str = "eager") -> nn.Module:
    config = CONFIGS[family][0]()
    config._attn_implementation = attention
    torch.manual_seed(0)
    head = getattr(T, ENCODERS[family]) if family in ENCODERS else T.AutoModelForCausalLM.from_config
    return head(config).eval()


def read_back(model: nn.Module, comps: hookscope.Components, *inputs: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Every name's value on one pass, read with hookscope.capture through each component's view:
    what capture will do once it takes the names."""
    modules = sorted({c.module for c in comps.values()} | {comps["blocks.0.attn.z"].module})
    with torch.no_grad(), hookscope.capture(model, *modules, keep="io") as rec:
        out = model(*inputs, **kwargs)
    values = {}
    for name, c in comps.items():
        raw = rec[c.module].output if c.field == "output" else rec[c.module].input
        values[name] = c.view.read(raw)
    return values, out


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and float((a.detach().double() - b.detach().double()).abs().max()) <= tol


@pytest.mark.parametrize("family", list(CONFIGS))
def test_every_family_resolves_and_the_check_measures_its_identities(family):
    model = build(family)
    comps = hookscope.components(model)
    assert comps.family == CONFIGS[family][1] and comps.blocks == 2
    assert {"residual", "heads", "logits", "stream"} <= set(comps.errors)
    assert "pattern" in comps.errors  # eager attention: z is the pattern applied to v
    assert all(e <= 1e-5 for e in comps.errors.values()), comps.errors
    assert all(c.module in dict(model.named_modules()) and c.field in ("input", "output") for c in comps.values())
    assert no_hooks(model)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_stream_read_back_through_the_names_recomputes_the_logits(family):
    model = build(family)
    comps = hookscope.components(model)
    v, out = read_back(model, comps, IDS)
    modules = dict(model.named_modules())
    last = v["blocks.1.resid_post"]
    with torch.no_grad():
        if family in ENCODERS:  # the MLM head: its dense, activation and norm, then the decoder
            logits = modules[comps["unembed"].module.rsplit(".", 1)[0]](last)
        else:
            logits = modules[comps["unembed"].module](modules[comps["final_norm"].module](last))
            assert close(v["final_norm"], modules[comps["final_norm"].module](last))
    if family == "gemma2":  # its soft cap on the logits comes after the unembedding
        cap = model.config.final_logit_softcapping
        logits = torch.tanh(logits / cap) * cap
    assert close(logits, out.logits)
    assert no_hooks(model)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_each_block_is_its_residual_sum_and_its_heads_sum_to_the_attention_output(family):
    model = build(family)
    comps = hookscope.components(model)
    v, _ = read_back(model, comps, IDS)
    modules, form = dict(model.named_modules()), CONFIGS[family][2]
    for i in range(2):
        b = f"blocks.{i}"
        pre, attn, mlp, post = (v[f"{b}.{n}"] for n in ("resid_pre", "attn_out", "mlp_out", "resid_post"))
        if form == "parallel":
            assert close(pre + attn + mlp, post)
            assert f"{b}.resid_mid" not in comps
        elif form == "sequential":
            mid = v[f"{b}.resid_mid"].reshape(pre.shape)  # OPT: [batch * pos, d] before its MLP
            assert close(pre + attn, mid) and close(mid + mlp.reshape(pre.shape), post)
        else:
            block = modules[comps[f"{b}.resid_pre"].module]
            with torch.no_grad():
                assert close(block.attention.output.LayerNorm(pre + attn), v[f"{b}.resid_mid"])
                assert close(block.output.LayerNorm(v[f"{b}.resid_mid"] + mlp), post)
        # the per-head z through the output projection: sum over heads of z_h @ W_O[h] + bias
        proj = modules[comps[f"{b}.attn.z"].module]
        z = v[f"{b}.attn.z"]
        heads, d_head = z.shape[-2:]
        w = proj.weight.t() if isinstance(proj, nn.Linear) else proj.weight  # GPT-2's Conv1D keeps [in, out]
        per_head = torch.einsum("bphd,hdo->bpho", z, w.reshape(heads, d_head, -1))
        with torch.no_grad():
            o = proj(z.flatten(-2))
        assert close(per_head.sum(-2) + (proj.bias if proj.bias is not None else 0), o)
        if family not in ("gemma2", "olmo2", *ENCODERS):  # those norm the projection's output before adding it
            assert close(o, attn)
    assert no_hooks(model)


def _heads_of(model: nn.Module) -> tuple[int, int, int]:
    c = model.config
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    kv = getattr(c, "num_key_value_heads", None) or heads
    if c.model_type == "falcon":
        kv = c.num_kv_heads if c.new_decoder_architecture else 1 if c.multi_query else heads
    width = getattr(c, "hidden_size", None) or c.n_embd
    return heads, kv, getattr(c, "head_dim", None) or width // heads


@pytest.mark.parametrize("family", list(CONFIGS))
def test_q_k_v_and_z_are_per_head(family):
    model = build(family)
    comps = hookscope.components(model)
    v, _ = read_back(model, comps, IDS)
    heads, kv, d_head = _heads_of(model)
    for i in range(2):
        assert v[f"blocks.{i}.attn.q"].shape == (2, 6, heads, d_head)
        assert v[f"blocks.{i}.attn.k"].shape == v[f"blocks.{i}.attn.v"].shape == (2, 6, kv, d_head)
        assert v[f"blocks.{i}.attn.z"].shape == (2, 6, heads, d_head)
        assert v[f"blocks.{i}.attn.pattern"].shape == (2, heads, 6, 6)
    assert no_hooks(model)


def attending(family: str) -> tuple[nn.Module, int]:
    """The model, and the hooks transformers itself leaves once output_attentions=True has run
    (its output recorder stays on the attention modules)."""
    model = build(family)
    with torch.no_grad():
        model(IDS, output_attentions=True)
    return model, hook_count(model)


def _causal(scores: torch.Tensor) -> torch.Tensor:
    n = scores.shape[-1]
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("family", ["gpt2", "opt", "bert", "roberta"])
def test_q_k_softmax_is_the_attention_probabilities_of_learned_position_families(family):
    model, left = attending(family)
    comps = hookscope.components(model)
    v, out = read_back(model, comps, IDS, output_attentions=True)
    for i in range(2):
        q, k = (v[f"blocks.{i}.attn.{n}"].transpose(1, 2) for n in "qk")  # [batch, head, pos, d_head]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        probs = torch.softmax(scores if family in ENCODERS else _causal(scores), dim=-1)
        assert close(probs, out.attentions[i])
        assert close(v[f"blocks.{i}.attn.pattern"], out.attentions[i])
    assert hook_count(model) == left


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gemma", "olmo", "phi3", "gpt_neox", "falcon"])
def test_q_k_before_rotary_give_the_attention_probabilities_once_rotated(family):
    """q and k are the projections' outputs: rotary is applied inside attention, here with the
    family's own rotary embedding, before the scaled dot product."""
    model, left = attending(family)
    comps = hookscope.components(model)
    v, out = read_back(model, comps, IDS, output_attentions=True)
    base = model.base_model
    rotate = importlib.import_module(type(model).__module__).apply_rotary_pos_emb
    positions = torch.arange(IDS.shape[1])[None].expand(2, -1)
    for i in range(2):
        q, k = (v[f"blocks.{i}.attn.{n}"].transpose(1, 2) for n in "qk")
        cos, sin = base.rotary_emb(q, positions)
        q, k = rotate(q, k, cos, sin)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # grouped-query: query head h reads h // group
        probs = torch.softmax(_causal(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])), dim=-1)
        assert close(probs, out.attentions[i])
    assert hook_count(model) == left


@pytest.mark.parametrize("family", ["gpt2", "llama", "falcon_new", "gpt_neox"])
def test_a_sdpa_model_resolves_the_same_names_and_checks_without_the_pattern(family):
    eager, sdpa = hookscope.components(build(family)), hookscope.components(build(family, "sdpa"))
    assert eager.rows == sdpa.rows
    assert "pattern" in eager.errors and "pattern" not in sdpa.errors


@pytest.mark.parametrize("family", ["gptj", "gpt_neox", "falcon", "falcon_new", "phi"])
def test_parallel_families_refuse_resid_mid_in_one_line(family):
    comps = hookscope.components(build(family))
    assert "blocks.0.resid_mid" not in comps
    with pytest.raises(KeyError) as e:
        comps["blocks.0.resid_mid"]
    assert isinstance(e.value, hookscope.HookscopeError) and "\n" not in str(e.value)
    assert "parallel" in str(e.value) and "resid_pre, attn_out and mlp_out" in str(e.value)


def test_a_rotary_family_says_it_has_no_position_embedding_and_bert_no_final_norm():
    with pytest.raises(hookscope.RecordError, match="rotary"):
        hookscope.components(build("llama"), check=False)["pos_embed"]
    assert hookscope.components(build("gpt2"), check=False)["pos_embed"].module == "transformer.wpe"
    with pytest.raises(hookscope.RecordError, match="no final norm"):
        hookscope.components(build("bert"), check=False)["final_norm"]


def test_names_are_spelled_the_same_way_in_every_family():
    every = {f: set(hookscope.components(build(f), check=False)) for f in CONFIGS}
    per_block = {n.split(".", 2)[2] for names in every.values() for n in names if n.startswith("blocks.")}
    assert per_block == set(hookscope.anatomy.BLOCK_NAMES)
    for family, names in every.items():
        form = CONFIGS[family][2]
        missing = {"resid_mid"} if form == "parallel" else set()
        assert {n.split(".", 2)[2] for n in names if n.startswith("blocks.0.")} == per_block - missing, family
        assert {"embed", "unembed"} <= names and ("final_norm" in names) == (family not in ENCODERS)


def test_the_resolved_names_of_gpt2_and_llama():
    gpt2 = hookscope.components(build("gpt2"))
    assert [(c.module, c.field) for c in map(gpt2.__getitem__, ["blocks.1.resid_pre", "blocks.1.attn.k",
                                                                  "blocks.1.attn.z", "blocks.1.mlp.hidden"])] == [
        ("transformer.h.1", "input"), ("transformer.h.1.attn.c_attn", "output"), ("transformer.h.1.attn.c_proj", "input"),
        ("transformer.h.1.mlp.c_proj", "input")]
    assert gpt2["blocks.1.attn.k"].view == View(heads=2, d_head=16, offset=32, head_stride=16, width=96)
    llama = hookscope.components(build("llama"))
    assert llama["blocks.0.attn.z"].module == "model.layers.0.self_attn.o_proj"
    assert llama["blocks.0.attn.k"].view.heads == 2 and llama["blocks.0.attn.q"].view.heads == 4
    assert llama["blocks.0.mlp.hidden"].module == "model.layers.0.mlp.down_proj"  # act(gate) * up
    assert llama["unembed"].module == "lm_head" and llama["final_norm"].module == "model.norm"
    assert hookscope.component(build("llama"), "blocks.1.attn_out") == llama["blocks.1.attn_out"]


def test_the_table_prints_and_writes_plain_data():
    comps = hookscope.components(build("llama"))
    text = str(comps)
    assert text.splitlines()[0].startswith("LLaMA components of LlamaForCausalLM (2 blocks; checked")
    assert "blocks.1.attn.z" in text and "model.layers.1.self_attn.o_proj" in text and "before rotary" in text
    d = comps.to_dict()
    assert d["components"]["blocks.0.attn.q"]["view"] == "heads 4 x 8 at columns 8*h + d of 32"
    assert d["absent"]["pos_embed"].startswith("LLaMA has no position embedding")


def test_a_mlp_hidden_is_act_gate_times_up():
    model = build("llama")
    comps = hookscope.components(model)
    v, _ = read_back(model, comps, IDS)
    mlp = model.model.layers[0].mlp
    x = v["blocks.0.mlp_in"]
    with torch.no_grad():
        assert close(v["blocks.0.mlp.hidden"], mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))


def test_a_base_model_has_no_unembed_and_checks_against_its_last_hidden_state():
    torch.manual_seed(0)
    model = T.LlamaModel(T.LlamaConfig(**GQA)).eval()
    comps = hookscope.components(model)
    assert comps["blocks.0.attn.z"].module == "layers.0.self_attn.o_proj" and comps.errors["logits"] <= 1e-5
    with pytest.raises(hookscope.RecordError, match="base model with no unembedding"):
        comps["unembed"]
    assert no_hooks(model)


# --- refused: unsupported families, changed layouts, bad names, bad input -------------------------------------------
def test_an_unsupported_family_is_refused_naming_the_closest_supported_one():
    torch.manual_seed(0)
    mixtral = T.MixtralForCausalLM(T.MixtralConfig(**GQA, num_local_experts=2, num_experts_per_tok=1)).eval()
    with pytest.raises(hookscope.SelectionError) as e:
        hookscope.components(mixtral)
    assert "'mixtral'" in str(e.value) and "closest supported family is Mistral" in str(e.value)
    assert "\n" not in str(e.value) and no_hooks(mixtral)
    with pytest.raises(hookscope.SelectionError, match="not a transformers model"):
        hookscope.components(nn.Linear(2, 2))


def test_a_layout_that_differs_from_the_row_is_refused_not_read_wrong():
    torch.manual_seed(0)  # OPT with its norms after the sums (and no final norm): not the OPT row's layout
    post_norm = T.OPTForCausalLM(T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, ffn_dim=64,
                                             vocab_size=50, word_embed_proj_dim=32, do_layer_norm_before=False)).eval()
    for check in (True, False):
        with pytest.raises(hookscope.SelectionError) as e:
            hookscope.components(post_norm, check=check)
        assert "OPT row" in str(e.value) and "layout differs from the table" in str(e.value)
        assert "\n" not in str(e.value) and no_hooks(post_norm)
    torch.manual_seed(0)  # OPT projecting its embeddings in and out: the stream is not the embedding's width
    projected = T.OPTForCausalLM(T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, ffn_dim=64,
                                             vocab_size=50, word_embed_proj_dim=16)).eval()
    with pytest.raises(hookscope.SelectionError, match="OPT row.*layout differs from the table"):
        hookscope.components(projected)
    assert no_hooks(projected)


def test_a_block_whose_forward_differs_is_refused():
    model = build("llama")
    layer = model.model.layers[1]
    forward = layer.forward
    layer.forward = lambda *a, **kw: forward(*a, **kw) * 0.5  # type: ignore[method-assign]
    with pytest.raises(hookscope.SelectionError, match="blocks.1.resid_post != resid_mid \\+ mlp_out"):
        hookscope.components(model)
    assert no_hooks(model)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_heads_that_differ_from_the_config_are_refused(attention):
    model = build("llama", attention)
    model.config.num_attention_heads = 2  # the config says 2 heads of 16, the projections hold 4 of 8
    model.config.head_dim = 16
    model.config.num_key_value_heads = 1
    with pytest.raises(hookscope.SelectionError, match="the config says d_head 16, the attention module") as e:
        hookscope.components(model)
    assert "\n" not in str(e.value) and no_hooks(model)


def test_bad_names_are_refused_in_one_line():
    comps = hookscope.components(build("gpt2"), check=False)
    with pytest.raises(hookscope.RecordError, match="has 2 blocks, blocks.0 to blocks.1"):
        comps["blocks.9.attn.z"]
    with pytest.raises(hookscope.RecordError, match="Did you mean 'blocks.0.attn.z'"):
        comps["blocks.0.attn.zz"]
    for bad in (0, None, "", "transformer.h.0"):
        with pytest.raises(KeyError):
            comps[bad]
        assert bad not in comps


def test_an_input_the_model_refuses_fails_in_one_line_and_leaves_no_hook():
    model = build("gpt2")
    with pytest.raises(hookscope.ForwardError) as e:
        hookscope.components(model, torch.tensor([[1, 999]]))  # beyond the vocabulary
    assert "\n" not in str(e.value) and no_hooks(model)


def test_the_check_runs_on_the_callers_input_and_keyword_inputs_in_eval_mode():
    model = build("llama").train()
    comps = hookscope.components(model, IDS, kwargs={"attention_mask": torch.ones_like(IDS)})
    assert comps.errors["logits"] <= 1e-5
    assert model.training and all(m.training for m in model.modules())
    assert no_hooks(model)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_bf16_model_checks_within_its_dtype(family):
    model = build(family).to(torch.bfloat16)
    comps = hookscope.components(model)
    assert comps.errors["logits"] == 0.0
    assert no_hooks(model)


# --- views: read, and write back out of place ----------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "falcon", "falcon_classic", "falcon_new", "phi3", "llama"])
def test_a_view_writes_back_exactly_what_it_reads(family):
    comps = hookscope.components(build(family), check=False)
    views = [comps[f"blocks.0.attn.{n}"].view for n in "qkv"]
    width = views[0].width
    fused = torch.randn(2, 3, width)
    for view in views:
        if view.width != width:
            continue
        assert torch.equal(view.write(fused, view.read(fused)), fused)
        changed = view.write(fused, view.read(fused) + 1)
        assert torch.equal(view.read(changed), view.read(fused) + 1)
        others = [w for w in views if w is not view and w.width == width]
        assert all(torch.equal(w.read(changed), w.read(fused)) for w in others)
        assert float((changed - fused).abs().gt(0).sum()) == view.read(fused).numel()


def test_a_view_of_a_tuple_writes_its_element_and_keeps_the_rest():
    out = (torch.zeros(2, 4), "cache")
    new = View().write(out, torch.ones(2, 4))
    assert isinstance(new, tuple) and new[1] == "cache" and torch.equal(new[0], torch.ones(2, 4))
    assert torch.equal(out[0], torch.zeros(2, 4))  # out of place
    with pytest.raises(hookscope.SelectionError):
        View(element=3).read(out)
    with pytest.raises(hookscope.SelectionError, match="expects 8"):
        View(heads=2, d_head=4, head_stride=4, width=8).read(torch.zeros(1, 6))


# --- more shapes of the same families ------------------------------------------------------------------------
def test_a_wrapped_model_keeps_the_wrappers_prefix_in_its_module_names():
    model = build("llama")
    wrapped = nn.DataParallel(model)
    comps = hookscope.components(wrapped)
    assert comps["blocks.0.attn.z"].module == "module.model.layers.0.self_attn.o_proj"
    assert all(c.module in dict(wrapped.named_modules()) for c in comps.values())
    assert comps.errors["logits"] <= 1e-5 and no_hooks(wrapped)


def test_olmo_with_clip_qkv_refuses_q_k_v_and_keeps_the_rest():
    torch.manual_seed(0)
    model = T.OlmoForCausalLM(T.OlmoConfig(**SMALL, clip_qkv=0.01)).eval()
    model.config._attn_implementation = "eager"
    comps = hookscope.components(model)
    for n in "qkv":
        with pytest.raises(hookscope.RecordError, match="clip_qkv"):
            comps[f"blocks.0.attn.{n}"]
    assert comps.errors["heads"] <= 1e-5 and "blocks.1.attn.z" in comps and no_hooks(model)


def test_biases_in_attention_and_mlp_are_part_of_the_sums():
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**GQA, attention_bias=True, mlp_bias=True)).eval()
    for p in model.parameters():  # biases start at zero: make them count
        torch.nn.init.normal_(p, std=0.2)
    comps = hookscope.components(model)
    assert all(e <= 1e-5 for e in comps.errors.values()), comps.errors


def test_one_block_models_check_too():
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=8)).eval()
    comps = hookscope.components(model)
    assert comps.blocks == 1 and "stream" not in comps.errors and comps.errors["logits"] == 0.0


def test_token_ids_by_keyword_are_the_checks_input():
    model = build("llama")
    comps = hookscope.components(model, kwargs={"input_ids": IDS, "attention_mask": torch.ones_like(IDS)})
    assert comps.errors["logits"] <= 1e-5 and no_hooks(model)
    with pytest.raises(hookscope.SelectionError, match="never ran: model.embed_tokens"):
        hookscope.components(model, kwargs={"inputs_embeds": torch.randn(1, 3, 32)})  # no token embedding to read
    assert no_hooks(model)


def test_a_model_on_the_meta_device_resolves_but_is_not_checked():
    with torch.device("meta"):
        model = T.LlamaForCausalLM(T.LlamaConfig(**GQA))
    assert hookscope.components(model, check=False)["blocks.1.attn.q"].module == "model.layers.1.self_attn.q_proj"
    with pytest.raises(hookscope.HookscopeError, match="meta device.*check=False"):
        hookscope.components(model)
    assert no_hooks(model)
