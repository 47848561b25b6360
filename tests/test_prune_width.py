"""The hidden width (residual stream) as one channel group: masked stream channels removed by
``compact`` from every embedding, norm and projection of LLaMA, Qwen2, GPT-2, BERT and ViT, the
compacted model's outputs equal to the masked model's (float64, norms computed in float64), the
RMSNorms rescaled and the LayerNorms normalising over the kept channels as derived by hand, configs
that ``from_pretrained`` loads or a state_dict that ``fit_to`` loads, and models whose width cannot
be followed refused before anything changes."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.prune import compact, prune_heads, prune_width
from hookscope.core import hook_count
from helpers import param_count as _params, rel_first as _rel, state_copy as _state

tr = pytest.importorskip("transformers")

TOL = 1e-8  # relative, float64
KW = {"use_cache": False}


def _rms64(self: Any, x: torch.Tensor) -> torch.Tensor:
    """The RMSNorm of LLaMA / Qwen2 in the input's dtype (theirs computes in float32 whatever the dtype)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture
def exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms64)
    monkeypatch.setattr(modeling_mistral.MistralRMSNorm, "forward", _rms64)
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rms64)


def _hf(kind: str, tie: bool = False, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, hidden_size=width, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, tie_word_embeddings=tie, rms_norm_eps=1e-3)
    build = {"llama": (tr.LlamaForCausalLM, tr.LlamaConfig), "qwen2": (tr.Qwen2ForCausalLM, tr.Qwen2Config),
             "mistral": (tr.MistralForCausalLM, tr.MistralConfig),
             "llama-cls": (tr.LlamaForSequenceClassification, tr.LlamaConfig)}[kind]
    return build[0](build[1](**cfg)).double().eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def _logits(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m(ids, use_cache=False).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind,tie", [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True),
                                      ("mistral", False)])
def test_compacted_equals_masked_and_every_member_shrinks(kind: str, tie: bool, exact: None) -> None:
    model, ids = _hf(kind, tie), _ids()
    res = prune_width(model, ids, amount=0.25, kwargs=KW)
    assert res.removed == 8 and res.kept == 24
    small = compact(model, ids, kwargs=KW)
    assert _rel(_logits(model, ids), _logits(small, ids)) < TOL
    inner = small.model
    assert inner.embed_tokens.weight.shape == (50, 24) and small.lm_head.weight.shape == (50, 24)
    assert (small.lm_head.weight is inner.embed_tokens.weight) == tie
    for layer in inner.layers:
        a, f = layer.self_attn, layer.mlp
        assert [a.q_proj.in_features, a.k_proj.in_features, a.v_proj.in_features, a.o_proj.out_features] == [24] * 4
        assert (a.q_proj.out_features, a.k_proj.out_features, a.o_proj.in_features) == (32, 16, 32)  # heads intact
        assert (f.gate_proj.in_features, f.up_proj.in_features, f.down_proj.out_features) == (24, 24, 24)
        assert f.down_proj.in_features == 40  # MLP hidden units stay
    assert small.config.hidden_size == 24 and small.config.head_dim == 8
    assert model.config.hidden_size == 32  # the masked model's config is its own


def test_a_classifier_loses_its_score_columns_and_a_compacted_model_can_lose_more(exact: None) -> None:
    model, ids = _hf("llama-cls"), _ids()
    model.config.pad_token_id = 0
    prune_width(model, ids, amount=0.25, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    assert small.score.in_features == 24 and small.config.hidden_size == 24
    with torch.no_grad():
        assert _rel(model(ids, use_cache=False).logits, small(ids, use_cache=False).logits) < TOL
    prune_width(small, ids, channels=[0, 23], kwargs=KW)  # the compacted model's own width: 24
    with pytest.warns(UserWarning, match=r"cannot say its new sizes \(The hidden size \(22\) is not a multiple"):
        smaller = compact(small, ids, kwargs=KW)
    assert smaller.config.hidden_size == 24  # as the model compacted first says it
    assert smaller.model.norm.variance_epsilon == pytest.approx(1e-3 * 32 / 22, rel=1e-12)
    with torch.no_grad():
        assert _rel(small(ids, use_cache=False).logits, smaller(ids, use_cache=False).logits) < TOL


def test_norms_are_rescaled_as_derived(exact: None) -> None:
    """RMSNorm over D channels of which k are nonzero = RMSNorm(k) with eps*D/k and weight*sqrt(D/k)."""
    model, ids = _hf("llama"), _ids()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    drop = [0, 5, 6, 17, 31]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "norm" in n}
    prune_width(model, ids, channels=drop, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    keep = [c for c in range(32) if c not in drop]
    for n, p in small.named_parameters():
        if "norm" in n:
            assert torch.allclose(p, before[n][keep] * math.sqrt(32 / 27), rtol=1e-12, atol=0)
    norm = small.model.norm
    assert norm.variance_epsilon == pytest.approx(1e-3 * 32 / 27, rel=1e-12)
    # 27 channels are no multiple of the 4 heads, which transformers refuses: the config stays as built
    assert (small.config.rms_norm_eps, small.config.hidden_size) == (1e-3, 32)
    x = torch.randn(3, 32, dtype=torch.float64)
    x[:, drop] = 0  # a masked stream: the full-width norm by hand against the compacted norm
    want = before["model.norm.weight"] * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / 32 + 1e-3)
    assert torch.allclose(norm(x[:, keep]), want[:, keep], rtol=1e-12, atol=1e-14)


def test_float32_model_as_transformers_computes_it() -> None:
    model, ids = _hf("qwen2").float(), _ids()
    prune_width(model, ids, amount=0.5, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    assert _rel(_logits(model, ids), _logits(small, ids)) < 1e-5
    assert small.config.hidden_size == 16


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_save_pretrained_and_from_pretrained_give_the_same_logits(kind: str, tmp_path: Any, exact: None) -> None:
    model, ids = _hf(kind, tie=True), _ids()
    prune_width(model, ids, amount=0.25, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    small.save_pretrained(tmp_path)
    cls = tr.LlamaForCausalLM if kind == "llama" else tr.Qwen2ForCausalLM
    back = cls.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert back.config.hidden_size == 24 and back.model.layers[0].self_attn.head_dim == 8
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert _rel(_logits(small, ids), _logits(back, ids)) < TOL
    assert _rel(_logits(model, ids), _logits(back, ids)) < TOL


def test_a_compacted_state_dict_loads_into_the_original_architecture(exact: None) -> None:
    from hookscope.analysis.prune import fit_to, marked_compacted
    model, ids = _hf("llama"), _ids()
    prune_width(model, ids, amount=0.25, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    fresh = _hf("llama")
    fit_to(fresh, marked_compacted(small.state_dict()))
    fresh.load_state_dict(small.state_dict())
    assert fresh.model.norm.variance_epsilon == pytest.approx(1e-3 * 32 / 24, rel=1e-12)
    assert fresh.config.hidden_size == 24 and fresh.config.rms_norm_eps == pytest.approx(1e-3 * 32 / 24)
    assert _rel(_logits(small, ids), _logits(fresh, ids)) < TOL


def test_output_importance_is_the_mean_absolute_stream_entering_the_norms() -> None:
    model, ids = _hf("llama"), _ids()
    norms = [m for n, m in model.named_modules() if n.endswith("norm") or n.endswith("layernorm")]
    assert len(norms) == 5
    seen: list[torch.Tensor] = []
    hs = [m.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().abs().reshape(-1, 32))) for m in norms]
    with torch.no_grad():
        model(ids, use_cache=False)
    for h in hs:
        h.remove()
    want = torch.cat(seen).mean(0)
    res = prune_width(model, ids, amount=0.25, kwargs=KW)
    got = torch.tensor([r.score for r in res.rows], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-10)
    assert sorted(r.channel for r in res.rows if r.removed) == sorted(want.argsort()[:8].tolist())


def test_l2_importance_is_the_norm_of_every_members_slice() -> None:
    model, ids = _hf("llama", tie=True), _ids()
    ps = dict(model.named_parameters())
    want = ps["model.embed_tokens.weight"].pow(2).sum(0)  # the tied head once
    for n, p in ps.items():
        if "norm" in n:
            want = want + p.pow(2)
        elif n.endswith(("o_proj.weight", "down_proj.weight")):
            want = want + p.pow(2).sum(1)
        elif n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            want = want + p.pow(2).sum(0)
    res = prune_width(model, ids, amount=0.5, importance="l2")
    assert torch.allclose(torch.tensor([r.score for r in res.rows], dtype=torch.float64), want.detach().sqrt())


def test_named_channels_are_zero_in_the_stream_and_a_second_call_keeps_them(exact: None) -> None:
    model, ids = _hf("qwen2"), _ids()
    res = prune_width(model, ids, channels=[3, 4, 9], kwargs=KW)
    assert [r.channel for r in res.rows if r.removed] == [3, 4, 9]
    seen: list[torch.Tensor] = []
    h = model.model.norm.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    _logits(model, ids)
    h.remove()
    assert seen[0][..., [3, 4, 9]].abs().max() == 0 and seen[0].abs().amax((0, 1)).gt(0).sum() == 29
    again = prune_width(model, ids, amount=0.1, kwargs=KW)
    assert [r.channel for r in again.rows if r.already] == [3, 4, 9] and again.removed == 2
    small = compact(model, ids, kwargs=KW)
    assert small.config.hidden_size == 27
    assert _rel(_logits(model, ids), _logits(small, ids)) < TOL


def test_width_and_heads_together(exact: None) -> None:
    model, ids = _hf("llama"), _ids()
    prune_heads(model, ids, amount=0.5, kwargs=KW)
    prune_width(model, ids, amount=0.5, kwargs=KW)
    small = compact(model, ids, kwargs=KW)
    assert _rel(_logits(model, ids), _logits(small, ids)) < TOL
    a = small.model.layers[0].self_attn
    assert (a.q_proj.weight.shape, a.o_proj.weight.shape, small.config.hidden_size) == ((16, 16), (16, 16), 16)


def test_no_hook_left_but_the_masks_and_results_speak_the_protocol() -> None:
    model, ids = _hf("llama"), _ids()
    res = prune_width(model, ids, amount=0.25, kwargs=KW)
    pre = [h for m in model.modules() for h in m._forward_pre_hooks.values()]
    assert hook_count(model) == len(pre) and all(type(h).__name__ == "MaskHook" for h in pre)
    assert len(pre) == 1 + 5 + 4  # embedding, the five norms, the four writers
    d = res.to_dict()
    assert d["width"] == 32 and d["removed"] == 8 and len(d["rows"]) == 32 and "8 of 32 hidden channels" in str(res)
    assert '"kept": 24' in res.to_json()
    assert hookscope.prune_width is prune_width


def _bert_mlm() -> nn.Module:
    return tr.BertForMaskedLM(tr.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=24)).eval()


def _gpt2_double() -> nn.Module:
    return tr.GPT2DoubleHeadsModel(tr.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                                 n_head=2)).eval()


class _Odd(nn.Module):
    """A LLaMA with an extra projection of the stream hookscope does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = _hf("llama")
        self.config = self.lm.config
        self.lm.model.layers[1].adapter = nn.Linear(32, 32)

    def forward(self, ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return self.lm(ids, use_cache=use_cache).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("build,culprit", [(_gpt2_double, "'multiple_choice_head.summary' (Linear)"),
                                           (_bert_mlm, "'cls.predictions.transform.dense' (Linear)"),
                                           (_Odd, "'lm.model.layers.1.adapter' (Linear)"),
                                           (lambda: nn.Sequential(nn.Linear(4, 4)), "Sequential has no config")])
def test_a_width_hookscope_cannot_follow_is_refused_naming_it(build: Any, culprit: str) -> None:
    model = build()
    ids = torch.randint(0, 4, (1, 4))
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError) as e:
        prune_width(model, ids.double() if isinstance(model, nn.Sequential) else ids, amount=0.25)
    msg = str(e.value)
    assert culprit in msg and "\n" not in msg
    after = _state(model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert hook_count(model) == 0


@pytest.mark.parametrize("given,words", [(dict(amount=0.2, channels=[1]), "not both or neither"),
                                         (dict(), "not both or neither"),
                                         (dict(amount=1.0), "in [0, 1)"),
                                         (dict(amount=True), "in [0, 1)"),
                                         (dict(amount=0.2, importance="outptu"), "Did you mean 'output'?"),
                                         (dict(channels=[32]), "channel 32 does not exist"),
                                         (dict(channels=list(range(32))), "keep at least one")])
def test_bad_requests_are_refused_before_anything_changes(given: dict[str, Any], words: str) -> None:
    model, ids = _hf("llama"), _ids()
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=re.escape(words)):
        prune_width(model, ids, kwargs=KW, **given)
    assert hook_count(model) == 0 and all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_cli_width_compacts_a_llama(tmp_path: Any, capsys: Any) -> None:
    from hookscope.cli import main
    tr.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2).save_pretrained(tmp_path)
    assert main(["prune", "hf:causal-lm", "--config", str(tmp_path), "--width", "0.25", "--compact", "--repeats",
                 "1", "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "width" and doc["pruned"]["kept"] == 24
    assert main(["prune", "hf:causal-lm", "--config", str(tmp_path), "--width", "1.5"]) != 0
    assert "--width 1.5 is not a share" in capsys.readouterr().err


# LayerNorm streams: GPT-2, BERT, ViT

def _ln_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    gpt = dict(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, pad_token_id=0)
    bert = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40)
    vit = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40, image_size=16,
               patch_size=4, num_labels=3)
    build = {"gpt2": lambda: tr.GPT2LMHeadModel(tr.GPT2Config(**gpt)),
             "gpt2-cls": lambda: tr.GPT2ForSequenceClassification(tr.GPT2Config(**gpt, num_labels=3)),
             "bert-cls": lambda: tr.BertForSequenceClassification(tr.BertConfig(**bert)),
             "bert-tok": lambda: tr.BertForTokenClassification(tr.BertConfig(**bert)),
             "vit": lambda: tr.ViTForImageClassification(tr.ViTConfig(**vit))}[kind]
    model = build().double().eval()
    with torch.no_grad():  # norms away from 1 and 0, so that a norm handled wrongly shows
        for n, p in model.named_parameters():
            if "norm" in n.lower() or ".ln_" in n:
                p.uniform_(0.5, 1.5) if n.endswith("weight") else p.uniform_(-0.5, 0.5)
    return model


def _ln_input(kind: str) -> torch.Tensor:
    if kind == "vit":
        return torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return _ids()


def _ln_out(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m(x).logits  # type: ignore[no-any-return]


def _stream_shapes(kind: str, small: nn.Module) -> list[tuple[int, ...]]:
    """Shapes that hold the stream in the compacted model (24 of 32 kept), picked by hand per layout."""
    if kind.startswith("gpt2"):
        t, a = small.transformer, small.transformer.h[0]
        return [t.wte.weight.shape, t.wpe.weight.shape, t.ln_f.weight.shape, a.attn.c_attn.weight.shape,
                a.attn.c_proj.weight.shape, a.mlp.c_fc.weight.shape, a.mlp.c_proj.weight.shape]
    if kind.startswith("bert"):
        e, layer = small.bert.embeddings, small.bert.encoder.layer[0]
        return [e.word_embeddings.weight.shape, e.token_type_embeddings.weight.shape, e.LayerNorm.bias.shape,
                layer.attention.self.query.weight.shape, layer.attention.output.dense.weight.shape,
                layer.intermediate.dense.weight.shape, layer.output.dense.weight.shape]
    e, layer = small.vit.embeddings, small.vit.layers[0]
    return [e.cls_token.shape, e.position_embeddings.shape, e.patch_embeddings.projection.weight.shape,
            layer.attention.q_proj.weight.shape, layer.attention.o_proj.weight.shape, layer.mlp.fc1.weight.shape,
            layer.mlp.fc2.weight.shape, small.classifier.weight.shape]


_SHAPES = {"gpt2": [(50, 24), (16, 24), (24,), (24, 96), (32, 24), (24, 128), (128, 24)],
           "bert": [(50, 24), (2, 24), (24,), (32, 24), (24, 32), (40, 24), (24, 40)],
           "vit": [(1, 1, 24), (1, 17, 24), (24, 3, 4, 4), (32, 24), (24, 32), (40, 24), (24, 40), (3, 24)]}


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-cls", "bert-cls", "bert-tok", "vit"])
def test_layer_norm_stream_compacted_equals_masked(kind: str) -> None:
    model, x = _ln_model(kind), _ln_input(kind)
    before, n_before = _ln_out(model, x), _params(model)
    res = prune_width(model, x, amount=0.25)
    assert res.removed == 8 and res.kept == 24
    masked = _ln_out(model, x)
    assert _rel(before, masked) > 1e-3  # the norms now see 24 channels: the model changed
    small = compact(model, x)
    assert _rel(masked, _ln_out(small, x)) < TOL
    assert _params(small) < n_before
    assert [tuple(s) for s in _stream_shapes(kind, small)] == _SHAPES[kind.split("-")[0]]
    assert hook_count(small) == 0
    norms = [m for m in small.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(m.normalized_shape == (24,) and m.weight.shape == (24,) for m in norms)
    if kind == "bert-cls":  # the pooler keeps its output width, which the classifier reads
        assert small.bert.pooler.dense.weight.shape == (32, 24) and small.classifier.weight.shape == (2, 32)
    if kind == "gpt2":
        assert small.lm_head.weight is small.transformer.wte.weight and small.lm_head.in_features == 24


def test_a_masked_layer_norm_normalises_over_the_kept_channels_as_derived() -> None:
    model, ids = _ln_model("gpt2"), _ids()
    drop = [0, 5, 6, 17, 31]
    keep = [c for c in range(32) if c not in drop]
    ln = model.transformer.ln_f
    w, b, eps = ln.weight.detach().clone(), ln.bias.detach().clone(), ln.eps
    prune_width(model, ids, channels=drop)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    h = ln.register_forward_hook(lambda m, a, out: seen.append((a[0].detach(), out.detach())))
    _ln_out(model, ids)
    h.remove()
    x, y = seen[0]
    assert x[..., drop].abs().max() == 0  # the stream reaching the norm is masked
    xk = x[..., keep]
    mean = xk.mean(-1, keepdim=True)
    var = (xk - mean).pow(2).mean(-1, keepdim=True)  # biased, over the 27 kept channels
    want = (xk - mean) / torch.sqrt(var + eps) * w[keep] + b[keep]
    assert torch.allclose(y[..., keep], want, rtol=1e-12, atol=1e-13)
    assert y[..., drop].abs().max() == 0
    full = nn.functional.layer_norm(x, (32,), w, b, eps)[..., keep]  # what the full-width norm would give
    assert not torch.allclose(full, want, atol=1e-3)


def test_layer_norm_masks_are_hooks_that_copy_pickle_and_leave_no_other_hook() -> None:
    import copy
    import pickle
    model, ids = _ln_model("gpt2"), _ids()
    prune_width(model, ids, amount=0.25)
    post = [type(h).__name__ for m in model.modules() for h in m._forward_hooks.values()]
    pre = [type(h).__name__ for m in model.modules() for h in m._forward_pre_hooks.values()]
    assert post == ["KeptNormHook"] * 5 and pre == ["MaskHook"] * (2 + 5 * 2 + 4 * 2)  # wte, wpe; norms; writers
    want = _ln_out(model, ids)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(_ln_out(twin, ids), want)


@pytest.mark.parametrize("kind", ["gpt2", "bert-cls"])
def test_fit_to_a_fresh_model_of_the_original_config_gives_the_compacted_logits(kind: str) -> None:
    from hookscope.analysis.prune import fit_to, marked_compacted
    model, ids = _ln_model(kind), _ids()
    prune_width(model, ids, amount=0.25)
    small = compact(model, ids)
    assert small.config.hidden_size == 32  # head size = hidden_size / heads: a config of 24 would rebuild wrongly
    fresh = _ln_model(kind)
    fit_to(fresh, marked_compacted(small.state_dict()))
    fresh.load_state_dict(small.state_dict())
    assert _rel(_ln_out(small, ids), _ln_out(fresh, ids)) < TOL
    assert _rel(_ln_out(model, ids), _ln_out(fresh, ids)) < TOL


def test_vit_save_pretrained_and_from_pretrained_round_trip(tmp_path: Any) -> None:
    model, x = _ln_model("vit"), _ln_input("vit")
    prune_width(model, x, amount=0.25)
    small = compact(model, x)
    assert small.config.hidden_size == 24 and small.config.head_dim == 8
    small.save_pretrained(tmp_path)
    back = tr.ViTForImageClassification.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert back.vit.layers[0].attention.q_proj.weight.shape == (32, 24)
    assert _rel(_ln_out(model, x), _ln_out(back, x)) < TOL
    from hookscope.analysis.prune import fit_to, marked_compacted
    fresh = _ln_model("vit")  # fit_to also shrinks the class token and position embeddings, and writes the config
    fit_to(fresh, marked_compacted(small.state_dict()))
    fresh.load_state_dict(small.state_dict())
    assert fresh.config.hidden_size == 24 and fresh.config.head_dim == 8
    assert _rel(_ln_out(small, x), _ln_out(fresh, x)) < TOL


def test_a_compacted_gpt2_can_lose_more_width() -> None:
    model, ids = _ln_model("gpt2"), _ids()
    prune_width(model, ids, amount=0.25)
    small = compact(model, ids)
    res = prune_width(small, ids, channels=[0, 23])  # its own width, 24, read from its embedding
    assert res.width == 24
    smaller = compact(small, ids)
    assert smaller.transformer.wte.weight.shape == (50, 22)
    assert _rel(_ln_out(small, ids), _ln_out(smaller, ids)) < TOL


def test_output_importance_of_a_layer_norm_stream() -> None:
    model, ids = _ln_model("gpt2"), _ids()
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 5
    seen: list[torch.Tensor] = []
    hs = [m.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().abs().reshape(-1, 32))) for m in norms]
    _ln_out(model, ids)
    for h in hs:
        h.remove()
    want = torch.cat(seen).mean(0)
    res = prune_width(model, ids, amount=0.25)
    assert torch.allclose(torch.tensor([r.score for r in res.rows], dtype=torch.float64), want, rtol=1e-10)
    assert sorted(r.channel for r in res.rows if r.removed) == sorted(want.argsort()[:8].tolist())


def test_l2_importance_of_a_layer_norm_stream_counts_norm_biases_and_tokens() -> None:
    model = _ln_model("vit")
    ps = dict(model.named_parameters())
    want = ps["vit.embeddings.cls_token"].pow(2).sum((0, 1)) + ps["vit.embeddings.position_embeddings"].pow(2).sum((0, 1))
    want = want + ps["vit.embeddings.patch_embeddings.projection.weight"].pow(2).sum((1, 2, 3))
    for n, p in ps.items():
        if "layernorm" in n or n.endswith(("o_proj.bias", "fc2.bias", "projection.bias")):
            want = want + p.pow(2)
        elif n.endswith(("o_proj.weight", "fc2.weight")):
            want = want + p.pow(2).sum(1)
        elif n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight", "classifier.weight")):
            want = want + p.pow(2).sum(0)
    res = prune_width(model, importance="l2", amount=0.5)
    assert torch.allclose(torch.tensor([r.score for r in res.rows], dtype=torch.float64), want.detach().sqrt())


def test_cli_width_compacts_a_gpt2(tmp_path: Any, capsys: Any) -> None:
    from hookscope.cli import main
    from hookscope.loading.model import load_model
    config = tmp_path / "config"  # --out is refused inside the folder the model is read from
    tr.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=4).save_pretrained(config)
    out = tmp_path / "small.pt"
    assert main(["prune", "hf:causal-lm", "--config", str(config), "--width", "0.25", "--compact", "--repeats",
                 "1", "--json", "--out", str(out)]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "width" and doc["pruned"]["kept"] == 24
    with pytest.warns(UserWarning, match="is a compacted"):  # the --weights path: fit_to, and a note saying so
        back = load_model("hf:causal-lm", config=str(config), weights=str(out))
    assert back.transformer.wte.weight.shape == (50, 24) and back.transformer.h[0].attn.c_attn.nf == 96
    assert back(torch.randint(0, 50, (1, 5))).logits.shape == (1, 5, 50)


@pytest.mark.parametrize("kind", ["bert", "vit", "gpt2"])
def test_a_bare_encoder_outputs_the_kept_stream_channels(kind: str) -> None:
    torch.manual_seed(0)
    model = {"bert": lambda: tr.BertModel(tr.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=40)),
             "vit": lambda: tr.ViTModel(tr.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=40, image_size=16, patch_size=4)),
             "gpt2": lambda: tr.GPT2Model(tr.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2,
                                                        n_head=4))}[kind]().double().eval()
    x = _ln_input(kind)
    drop = [1, 2, 30]
    prune_width(model, x, channels=drop)
    small = compact(model, x)
    keep = [c for c in range(32) if c not in drop]
    with torch.no_grad():
        want, got = model(x), small(x)
    assert got.last_hidden_state.shape[-1] == 29 and want.last_hidden_state[..., drop].abs().max() == 0
    assert _rel(want.last_hidden_state[..., keep], got.last_hidden_state) < TOL
    if kind != "gpt2":  # the pooler keeps its width
        assert _rel(want.pooler_output, got.pooler_output) < TOL and got.pooler_output.shape[-1] == 32


def test_masks_made_permanent_keep_the_kept_channel_norms_and_float32_compacts() -> None:
    from hookscope.analysis.prune import remove
    model, ids = _ln_model("gpt2"), _ids()
    prune_width(model, ids, amount=0.25)
    want = _ln_out(model, ids)
    remove(model)  # the dropped channels now are zero weights and biases, no masks
    assert not any(n.endswith("_orig") for n, _ in model.named_parameters())
    assert _rel(want, _ln_out(model, ids)) < 1e-12
    small = compact(model, ids)
    assert _rel(want, _ln_out(small, ids)) < TOL and small.transformer.ln_f.weight.shape == (24,)
    single, ids = _ln_model("bert-cls").float(), _ids()
    prune_width(single, ids, amount=0.5)
    assert _rel(_ln_out(single, ids), _ln_out(compact(single, ids), ids)) < 1e-5


class _ScaledRMSNorm(nn.Module):
    """Named like an RMSNorm, computing something else: 2 * w * x / rms(x) + 0.1."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(n, dtype=torch.float64)), 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) + 0.1


def test_a_norm_computing_neither_form_is_refused_before_anything_is_masked() -> None:
    model, ids = _hf("llama"), _ids()
    model.model.norm = _ScaledRMSNorm(32)
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=r"'model.norm' \(_ScaledRMSNorm\) computes neither "
                                                       r"weight \* x / rms\(x\) nor \(1 \+ weight\)"):
        prune_width(model, ids, amount=0.25, kwargs=KW)
    after = _state(model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert hook_count(model) == 0
