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

tr = pytest.importorskip("transformers")

TOL = 1e-8  # relative, float64
KW = {"use_cache": False}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / a.abs().max()).detach())


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _state(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


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
    smaller = compact(small, ids, kwargs=KW)
    assert smaller.config.hidden_size == 22
    assert smaller.config.rms_norm_eps == pytest.approx(1e-3 * 32 / 22, rel=1e-12)
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
    assert small.config.rms_norm_eps == pytest.approx(1e-3 * 32 / 27, rel=1e-12)
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
