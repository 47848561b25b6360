"""Attention heads as channel groups: masked heads removed by ``compact`` on every kind of attention
layer hookscope follows, the compacted model's outputs equal to the masked model's in float64, the
head counts fixed in the layers and their configs, and bad requests refused before anything changes."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.prune import compact, prune_heads
from hookscope.core import hook_count
from helpers import only_masks as _only_masks, param_count as _params, rel_first as _rel, state_copy as _state

TOL = 1e-8  # relative, float64


class _Wrap(nn.Module):
    """An MHA between two linears (the output projection's columns are all that read the heads)."""

    def __init__(self, batch_first: bool, **kw: object) -> None:
        super().__init__()
        self.inp, self.mha, self.out = nn.Linear(6, 16), nn.MultiheadAttention(16, 4, batch_first=batch_first, **kw), \
            nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        h = self.inp(x)
        return self.out(self.mha(h, h, h, key_padding_mask=pad, need_weights=False)[0])


# --- nn.MultiheadAttention -------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("extra", [{}, {"bias": False}, {"add_bias_kv": True, "add_zero_attn": True}])
def test_mha_heads_removed_give_the_masked_outputs(batch_first: bool, extra: dict) -> None:
    torch.manual_seed(0)
    net = _Wrap(batch_first, **extra).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64) if batch_first else torch.randn(5, 2, 6, dtype=torch.float64)
    res = prune_heads(net, x, heads={"mha": [0, 2]})
    assert res.rows[0].removed == (0, 2) and res.removed == 2
    small = compact(net, x)
    assert small.mha.num_heads == 2 and small.mha.head_dim == 4 and small.mha.embed_dim == 16
    assert small.mha.in_proj_weight.shape == (24, 16) and small.mha.out_proj.weight.shape == (16, 8)
    assert small.mha.kept_heads == [1, 3]
    assert _rel(net(x), small(x)) <= TOL
    assert _only_masks(net) and hook_count(small) == 0


def test_mha_key_padding_and_per_head_masks_follow_the_kept_heads() -> None:
    torch.manual_seed(1)
    net = _Wrap(True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    prune_heads(net, x, heads={"mha": [1]})
    small = compact(net, (x, pad))
    assert _rel(net(x, pad), small(x, pad)) <= TOL
    mask = torch.randn(2 * 4, 5, 5, dtype=torch.float64)  # one additive mask per sample and original head
    h = net.inp(x)
    ref = net.mha(h, h, h, attn_mask=mask, need_weights=False)[0]
    got = small.mha(h, h, h, attn_mask=mask, need_weights=False)[0]
    assert _rel(ref, got) <= TOL


def test_mha_with_attention_weights_is_refused_unchanged() -> None:
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()  # returns head-averaged weights
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    prune_heads(mha, (x, x, x), heads={"": [0]})
    before = _state(mha)
    with pytest.raises(hookscope.HookscopeError, match="compaction refused: .*output 1 differs") as e:
        compact(mha, (x, x, x))
    assert "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in mha.state_dict().items()) and _only_masks(mha)


def test_encoder_layer_fast_path_is_left_for_the_kept_heads() -> None:
    torch.manual_seed(3)
    net = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    prune_heads(net, x, amount=0.5)
    small = compact(net, x)
    with torch.no_grad():  # torch's fused encoder kernel would read the head size as 16 // 2
        assert (small(x) - net(x)).abs().max() < 1e-5
    assert small.self_attn.num_heads == 2


def test_torchvision_vit_shrinks_and_runs() -> None:
    tv = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(4)
    vit = tv.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=16,
                               mlp_dim=32, num_classes=5).double().eval()
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the classifier at zero
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    before = _params(vit)
    res = prune_heads(vit, x, amount=0.5)
    assert [r.kept for r in res.rows] == [2, 2] and [r.layer for r in res.rows] == [
        "encoder.layers.encoder_layer_0.self_attention", "encoder.layers.encoder_layer_1.self_attention"]
    small = compact(vit, x)
    assert _rel(vit(x), small(x)) <= TOL
    assert before - _params(small) == 2 * (3 * 2 * 4 * 16 + 3 * 2 * 4 + 2 * 4 * 16)  # q/k/v rows, biases, out cols
    assert small(torch.randn(3, 3, 32, 32, dtype=torch.float64)).shape == (3, 5)
    from hookscope.analysis.prune import fit_to

    fresh = tv.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=16,
                                 mlp_dim=32, num_classes=5).double().eval()
    fit_to(fresh, small.state_dict())
    fresh.load_state_dict(small.state_dict())
    assert type(fresh.encoder.layers[0].self_attention).__name__ == "HeadPrunedMultiheadAttention"
    assert _rel(vit(x), fresh(x)) <= TOL


# --- importance ------------------------------------------------------------------------------------
def test_output_importance_is_the_mean_norm_of_each_heads_output() -> None:
    torch.manual_seed(5)
    net = _Wrap(True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    with torch.no_grad():
        net.mha.in_proj_weight[2 * 16 + 4:2 * 16 + 8] *= 10  # head 1's values ten times larger
        h = net.inp(x)
        q, k, v = (h @ w.T + b for w, b in zip(net.mha.in_proj_weight.split(16), net.mha.in_proj_bias.split(16)))
        norms = []
        for i in range(4):  # by hand: softmax(q k^T / 2) v per head, then the mean L2 norm per token
            s = slice(4 * i, 4 * i + 4)
            o = torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / 2, -1) @ v[..., s]
            norms.append(float(o.norm(dim=-1).mean()))
    res = prune_heads(net, x, amount=0.25)
    assert res.rows[0].scores == pytest.approx(norms, rel=1e-10)
    assert res.rows[0].removed == (min(range(4), key=norms.__getitem__),)
    assert max(range(4), key=norms.__getitem__) == 1 and _only_masks(net)


def test_l2_importance_and_data_batches() -> None:
    torch.manual_seed(6)
    net = _Wrap(True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    res = prune_heads(copy.deepcopy(net), x, amount=0.5, importance="l2")
    w, b, o = net.mha.in_proj_weight.detach(), net.mha.in_proj_bias.detach(), net.mha.out_proj.weight.detach()
    by_hand = [float(sum(w[j * 16 + 4 * i:j * 16 + 4 * i + 4].pow(2).sum() + b[j * 16 + 4 * i:j * 16 + 4 * i + 4].pow(2).sum()
                         for j in range(3)) + o[:, 4 * i:4 * i + 4].pow(2).sum()) ** 0.5 for i in range(4)]
    assert res.rows[0].scores == pytest.approx(by_hand, rel=1e-12)
    data = [torch.randn(3, 5, 6, dtype=torch.float64) for _ in range(3)]
    one = prune_heads(copy.deepcopy(net), x, amount=0.5, data=data, max_batches=1)
    alone = prune_heads(copy.deepcopy(net), data[0], amount=0.5)
    assert one.rows[0].scores == pytest.approx(alone.rows[0].scores, rel=1e-12)


def test_pruning_again_takes_a_share_of_the_live_heads() -> None:
    torch.manual_seed(7)
    net = _Wrap(True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    prune_heads(net, x, heads={"mha": [3]})
    again = prune_heads(net, x, amount=0.5)  # floor(0.5 * 3 live) = 1 more
    assert again.rows[0].already == (3,) and len(again.rows[0].removed) == 1 and again.rows[0].kept == 2
    assert compact(net, x).mha.num_heads == 2


# --- bad requests ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "match"), [
    ({"heads": {"mha": [0, 1, 2, 3]}}, "'mha' would keep no attention head"),
    ({"heads": {"mha": [4]}}, "'mha' has 4 heads, so head 4 does not exist"),
    ({"heads": {"mhaa": [0]}}, "Did you mean 'mha'"),
    ({"amount": 1.0}, "amount=1.0 is not a fraction"),
    ({"amount": 0.5, "heads": {"mha": [0]}}, "either amount= .* or heads="),
    ({"amount": 0.5, "importance": "outptu"}, "Did you mean 'output'"),
])
def test_bad_requests_are_refused_in_one_line_model_untouched(kw: dict, match: str) -> None:
    net = _Wrap(True).double().eval()
    before = _state(net)
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        prune_heads(net, torch.randn(1, 3, 6, dtype=torch.float64), **kw)
    assert "\n" not in str(e.value) and hook_count(net) == 0
    assert list(net.state_dict()) == list(before) and all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_a_model_without_attention_is_refused() -> None:
    with pytest.raises(hookscope.HookscopeError, match="no attention layer of Sequential"):
        prune_heads(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2), amount=0.5)


# --- timm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("qk_norm", [False, True])
def test_timm_vit_fused_qkv(qk_norm: bool) -> None:
    vt = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(8)
    vit = vt.VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=4, num_classes=5,
                               mlp_ratio=2.0, qk_norm=qk_norm).double().eval()  # qk_norm: over head_dim
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    prune_heads(vit, x, amount=0.5)
    small = compact(vit, x)
    a = small.blocks[0].attn
    assert (a.num_heads, a.head_dim, a.qkv.out_features, a.proj.in_features) == (2, 4, 24, 8)
    assert _rel(vit(x), small(x)) <= TOL


# --- Hugging Face ------------------------------------------------------------------------------------
def _hf(kind: str) -> nn.Module:
    tr = pytest.importorskip("transformers")
    torch.manual_seed(9)
    small = dict(vocab_size=50, max_position_embeddings=32, num_hidden_layers=2)
    if kind == "bert":
        return tr.BertForSequenceClassification(tr.BertConfig(hidden_size=16, num_attention_heads=4,
                                                              intermediate_size=32, num_labels=3, **small))
    if kind == "gpt2":
        return tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                                use_cache=False))
    cfg = dict(hidden_size=32, intermediate_size=64, num_attention_heads=8, num_key_value_heads=2, use_cache=False,
               **small)
    return tr.LlamaForCausalLM(tr.LlamaConfig(**cfg)) if kind == "llama" else tr.Qwen2ForCausalLM(tr.Qwen2Config(**cfg))


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_bert_and_gpt2_heads(kind: str) -> None:
    model = _hf(kind).double().eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    res = prune_heads(model, ids, amount=0.5)
    assert [r.kept for r in res.rows] == [2, 2]
    small = compact(model, ids)
    assert _rel(model(ids).logits, small(ids).logits) <= TOL
    assert small.config.num_attention_heads == 4  # the head size derives from hidden_size / num_attention_heads
    attn = small.bert.encoder.layer[1].attention.self if kind == "bert" else small.transformer.h[1].attn
    if kind == "bert":
        assert (attn.num_attention_heads, attn.attention_head_size, attn.all_head_size) == (2, 4, 8)
    else:
        assert (attn.num_heads, attn.head_dim, attn.split_size, attn.c_attn.nf) == (2, 4, 8, 24)
    assert small(torch.randint(0, 50, (1, 11))).logits.shape[1] == (11 if kind == "gpt2" else 3)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize(("amount", "heads", "kv"), [(0.5, 4, 1), (0.25, 6, 2), (0.75, 2, 2)])
def test_grouped_query_attention_keeps_equal_groups(kind: str, amount: float, heads: int, kv: int) -> None:
    model = _hf(kind).double().eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    res = prune_heads(model, ids, amount=amount)
    small = compact(model, ids)
    attn = small.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.num_key_value_groups) == (4 * heads, 4 * kv,
                                                                                                 heads // kv)
    # transformers refuses a LLaMA config whose 32 channels are no multiple of the heads: 6 leave it as built
    said = (8, 2, 4) if kind == "llama" and 32 % heads else (heads, kv, 4)
    assert (small.config.num_attention_heads, small.config.num_key_value_heads, small.config.head_dim) == said
    assert _rel(model(ids).logits, small(ids).logits) <= TOL
    kept = [h for h in range(8) if h not in res.rows[0].removed]
    assert len({sum(1 for h in kept if h // 4 == j) for j in {h // 4 for h in kept}}) == 1  # equal groups


@pytest.mark.parametrize(("kw", "match"), [
    ({"amount": 0.375}, "removes 3 of the 8 query heads of 'model.layers.0.self_attn'.*neither whole groups"),
    ({"heads": {"model.layers.1.self_attn": [0, 1, 4]}}, "'model.layers.1.self_attn' would keep 2, 3 query heads"),
])
def test_gqa_requests_that_break_groups_are_refused_untouched(kw: dict, match: str) -> None:
    model = _hf("llama").double().eval()
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        prune_heads(model, torch.randint(0, 50, (1, 5)), **kw)
    assert "\n" not in str(e.value) and hook_count(model) == 0
    assert list(model.state_dict()) == list(before) and all(torch.equal(before[k], v)
                                                           for k, v in model.state_dict().items())


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_save_pretrained_round_trip(kind: str, tmp_path) -> None:
    model = _hf(kind).double().eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    prune_heads(model, ids, amount=0.5)
    small = compact(model, ids)
    small.save_pretrained(tmp_path)
    back = type(small).from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert back.config.num_attention_heads == 4 and back.config.num_key_value_heads == 1
    assert _params(back) == _params(small) < _params(model)
    assert _rel(model(ids).logits, back(ids).logits) <= TOL


def test_channels_and_heads_pruned_together_compact_in_one_pass() -> None:
    model = _hf("bert").double().eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    before = _params(model)
    hookscope.prune_channels(model, ids, amount=0.5)  # the MLP hidden units
    prune_heads(model, ids, amount=0.5)
    small = compact(model, ids)
    layer = small.bert.encoder.layer[0]
    assert (layer.intermediate.dense.out_features, layer.attention.self.query.out_features) == (16, 8)
    assert _rel(model(ids).logits, small(ids).logits) <= TOL
    heads, mlp, pooler = 2 * (3 * 8 * 16 + 3 * 8 + 8 * 16), 2 * (16 * 16 + 16 + 16 * 16), 8 * 16 + 8 + 3 * 8
    assert small.classifier.in_features == 8 and before - _params(small) == heads + mlp + pooler


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_unequal_heads_per_layer_and_fit_to_rebuilds_them_from_the_shapes(kind: str) -> None:
    from hookscope.analysis.prune import fit_to

    model = _hf(kind).double().eval()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(4))
    names = {"gpt2": "transformer.h.{}.attn", "bert": "bert.encoder.layer.{}.attention.self",
             "llama": "model.layers.{}.self_attn"}[kind]
    heads = {names.format(0): [1], names.format(1): [0, 2]} if kind != "llama" else \
        {names.format(0): [0, 4], names.format(1): [4, 5, 6, 7]}
    prune_heads(model, ids, heads=heads)
    if kind == "llama":  # a config that says the head counts holds one count for all layers
        with pytest.warns(UserWarning, match=r"config keeps num_attention_heads=8: its layers now keep \[4, 6\]"):
            small = compact(model, ids)
    else:
        small = compact(model, ids)
    assert small.config.num_attention_heads == model.config.num_attention_heads
    assert _rel(model(ids).logits, small(ids).logits) <= TOL
    state = small.state_dict()
    fresh = type(model)(copy.deepcopy(model.config)).double().eval()  # the architecture as built
    if kind == "llama":
        with pytest.warns(UserWarning, match="config keeps"):
            fit_to(fresh, state)
    else:
        proj = ".c_attn" if kind == "gpt2" else ".query"
        assert names.format(0) + proj in fit_to(fresh, state)
    fresh.load_state_dict(state)
    assert _rel(model(ids).logits, fresh(ids).logits) <= TOL


@pytest.mark.parametrize("kind, cut, match", [
    ("gpt2", {"transformer.h.1.attn.c_attn.weight": (1, 30), "transformer.h.1.attn.c_attn.bias": (0, 30)},
     r"transformer\.h\.1\.attn .*30 query, key and value channels are not 3 x whole heads of 4"),
    ("bert", {"bert.encoder.layer.0.attention.self.query.weight": (0, 6),
              "bert.encoder.layer.0.attention.self.query.bias": (0, 6)},
     r"layer\.0\.attention\.self .*6 query channels are not whole heads of 4"),
    ("llama", {"model.layers.1.self_attn.k_proj.weight": (0, 6)}, r"layers\.1\.self_attn .*6 key channels are not"),
    ("llama", {"model.layers.1.self_attn.q_proj.weight": (0, 12), "model.layers.1.self_attn.o_proj.weight": (1, 12)},
     r"layers\.1\.self_attn .*3 query heads do not share its 2 key/value heads equally")])
def test_fit_to_refuses_shapes_that_are_no_whole_heads_model_untouched(kind: str, cut: dict, match: str) -> None:
    from hookscope.analysis.prune import fit_to

    model = _hf(kind).eval()
    state = dict(model.state_dict())
    for key, (dim, n) in cut.items():
        state[key] = state[key].narrow(dim, 0, n).clone()
    fresh = type(model)(copy.deepcopy(model.config)).eval()
    before = _state(fresh)
    with pytest.raises(hookscope.HookscopeError, match=match) as err:
        fit_to(fresh, state)
    assert "\n" not in str(err.value)
    after = _state(fresh)
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    assert fresh.config.to_dict() == model.config.to_dict()


def test_layers_limits_the_pruning_and_whole_kv_groups_can_be_named() -> None:
    model = _hf("llama").double().eval()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(5))
    res = prune_heads(model, ids, heads={"model.layers.1.self_attn": [4, 5, 6, 7]}, layers="model.layers.1.*")
    assert [r.layer for r in res.rows] == ["model.layers.1.self_attn"] and res.rows[0].removed == (4, 5, 6, 7)
    with pytest.warns(UserWarning, match="config keeps"):  # layer 0 keeps 8 heads, layer 1 four
        small = compact(model, ids)
    a0, a1 = small.model.layers[0].self_attn, small.model.layers[1].self_attn
    assert (a0.k_proj.out_features, a1.k_proj.out_features, a1.q_proj.out_features) == (8, 4, 16)
    assert _rel(model(ids).logits, small(ids).logits) <= TOL


def test_compacted_llama_generates_the_masked_models_tokens() -> None:
    model = _hf("llama").double().eval()
    model.config.use_cache = True
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(6))
    prune_heads(model, ids, amount=0.5)
    small = compact(model, ids, kwargs={"use_cache": False})  # a returned cache holds the old key/value heads
    assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False),
                       small.generate(ids, max_new_tokens=4, do_sample=False))


def test_a_returned_key_value_cache_is_refused_naming_use_cache() -> None:
    model = _hf("llama").double().eval()
    model.config.use_cache = True
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(6))
    prune_heads(model, ids, amount=0.5)
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=r"past_key_values.*kwargs=\{'use_cache': False\}") as err:
        compact(model, ids)
    assert "\n" not in str(err.value) and "report this model" not in str(err.value)
    assert _state(model).keys() == before.keys() and all(torch.equal(_state(model)[k], v) for k, v in before.items())
    assert _only_masks(model)


def test_a_half_precision_mismatch_is_refused_naming_the_dtype_and_atol() -> None:
    model = _hf("llama").to(torch.bfloat16).eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    hookscope.prune_width(model, ids, amount=0.25)
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=r"computes in bfloat16.*float32 copy.*atol=") as err:
        compact(model, ids, atol=1e-9)  # a narrower sum rounds differently in bfloat16
    assert "\n" not in str(err.value) and "report this model" not in str(err.value)
    assert all(torch.equal(_state(model)[k], v) for k, v in before.items())
    small = compact(model.float(), ids)  # the slicing is exact: compacted in float32, cast back alike
    assert small.to(torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16


def test_an_unmasked_model_compacts_with_its_attention_as_it_was() -> None:
    net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    small = compact(net, torch.randn(1, 3, 8))
    assert type(small.self_attn) is nn.MultiheadAttention and small.self_attn._qkv_same_embed_dim


# --- the command line ------------------------------------------------------------------------------
def _bert_folder(tmp_path) -> str:
    tr = pytest.importorskip("transformers")
    tr.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, intermediate_size=64,
                  max_position_embeddings=64, num_labels=2).save_pretrained(tmp_path / "bert-tiny")
    return str(tmp_path / "bert-tiny")


def test_cli_heads_compact_json(tmp_path, capsys) -> None:
    import json

    from hookscope.cli import main

    folder = _bert_folder(tmp_path)
    code = main(["prune", "hf:BertForSequenceClassification", "--config", folder, "--heads", "0.5", "--channels",
                 "--amount", "0.5", "--compact", "--repeats", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["mode"] == "channels"
    assert [r["kept"] for r in doc["pruned"]["heads"]["rows"]] == [4, 4]
    assert doc["pruned"]["channels"]["removed"] == 2 * 32 + 16  # MLP hidden units and the pooler
    params = next(r for r in doc["comparison"]["rows"] if r["name"] == "parameters")
    assert params["after"] < 0.7 * params["before"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--heads", "1"], "--heads 1 is not a share of heads"),
    (["--heads", "0.5", "--amount", "0.5"], "--heads alone removes attention heads only"),
    (["--heads", "0.5", "--importance", "taylor"], "--importance ranks channels"),
])
def test_cli_heads_bad_options_exit_non_zero_in_one_line(argv: list[str], match: str, capsys) -> None:
    from hookscope.cli import main

    code = main(["prune", "demo", *argv, "--repeats", "1"])
    err = capsys.readouterr().err
    assert code != 0 and re.search(match, err) and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_heads_on_a_model_without_attention_says_so(capsys) -> None:
    from hookscope.cli import main

    code = main(["prune", "demo", "--heads", "0.5", "--repeats", "1"])
    err = capsys.readouterr().err
    assert code != 0 and "no attention layer of DemoNet" in err and "Traceback" not in err


def test_a_wrapped_model_is_named_as_the_users_own() -> None:
    torch.manual_seed(10)
    net = _Wrap(True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    res = prune_heads(nn.DataParallel(net), x, heads={"mha": [2]})
    assert res.rows[0].layer == "mha" and compact(nn.DataParallel(net), x).mha.num_heads == 3


def test_hugging_face_vit_and_qwen3_follow_their_families() -> None:
    tr = pytest.importorskip("transformers")
    torch.manual_seed(11)
    vit = tr.ViTForImageClassification(tr.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=4, intermediate_size=32, num_labels=3))
    vit = vit.double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    assert prune_heads(vit, x, amount=0.5).rows[0].kind == "llama"  # q_proj ... o_proj, head_dim in its config
    small = compact(vit, x)
    assert (small.config.num_attention_heads, small.config.head_dim) == (2, 4)
    assert _rel(vit(x).logits, small(x).logits) <= TOL
    if not hasattr(tr, "Qwen3ForCausalLM"):
        return
    qwen3 = tr.Qwen3ForCausalLM(tr.Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                               max_position_embeddings=32, use_cache=False)).double().eval()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(7))
    assert prune_heads(qwen3, ids, amount=0.5).rows[0].kv_heads == 2  # q_norm / k_norm act per head
    small = compact(qwen3, ids)
    assert (small.config.num_attention_heads, small.config.num_key_value_heads) == (2, 1)
    assert _rel(qwen3(ids).logits, small(ids).logits) <= TOL
