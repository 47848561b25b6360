"""A compacted transformers model comes back from the folder save_pretrained writes, for every family
the pruning follows: load_pretrained gives the compacted model's logits exactly, and from_pretrained
either gives them too (the config says every new size) or refuses the folder, with a warning at
compact time saying so; never a model that differs. Configs transformers itself refuses (LLaMA: a
hidden size not a multiple of the head count) are never written."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.prune import load_pretrained

tr = pytest.importorskip("transformers")

KW = {"use_cache": False}
SAYS = "config cannot say its new sizes"


def _causal(name: str, **extra: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        cfg = dict(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=16, pad_token_id=0)
        cfg.update(extra)
        return getattr(tr, f"{name}ForCausalLM")(getattr(tr, f"{name}Config")(**cfg))
    return build


def _gpt2() -> nn.Module:
    return tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=16, n_inner=24))


def _bert() -> nn.Module:
    return tr.BertForSequenceClassification(tr.BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
        max_position_embeddings=16, num_labels=3))


def _vit() -> nn.Module:
    return tr.ViTForImageClassification(tr.ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=24, num_labels=3))


def _gemma3() -> nn.Module:
    return tr.Gemma3ForCausalLM(tr.Gemma3TextConfig(
        vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=16, sliding_window=4, pad_token_id=0))


FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "gpt2": _gpt2, "bert": _bert, "vit": _vit, "llama": _causal("Llama"), "mistral": _causal("Mistral"),
    "qwen2": _causal("Qwen2"), "qwen3": _causal("Qwen3", head_dim=8), "stablelm": _causal("StableLm"),
    "gemma": _causal("Gemma", head_dim=8), "gemma-untied": _causal("Gemma", head_dim=8, tie_word_embeddings=False),
    "gemma2": _causal("Gemma2", head_dim=8), "gemma3": _gemma3, "granite": _causal("Granite"), "olmo2": _causal("Olmo2"),
    "starcoder2": _causal("Starcoder2"), "helium": _causal("Helium", head_dim=8), "smollm3": _causal("SmolLM3")}


def _input(model: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
    if "ViT" in type(model).__name__:
        return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), {}
    kw = {} if "Bert" in type(model).__name__ else dict(KW)
    return torch.randint(1, 40, (2, 6), generator=torch.Generator().manual_seed(1)), kw


def _logits(model: nn.Module, x: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(x, **kw).logits  # type: ignore[no-any-return]


def _round_trip(model: nn.Module, x: torch.Tensor, kw: dict[str, Any], folder: Path) -> tuple[nn.Module, bool]:
    """Compact, save and load back both ways: the compacted model and whether compact warned that
    from_pretrained refuses it."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        small = hookscope.compact(model, x, kwargs=kw)
    said = [str(w.message) for w in seen if SAYS in str(w.message)]
    assert len(said) <= 1 and all("\n" not in s for s in said)
    want = _logits(small, x, kw)
    small.save_pretrained(folder)
    assert torch.equal(_logits(load_pretrained(folder), x, kw), want)
    if said:
        with pytest.raises(Exception):  # loud: the shapes the config builds are not the file's
            type(small).from_pretrained(folder)
    else:
        assert torch.equal(_logits(type(small).from_pretrained(folder).eval(), x, kw), want)
    return small, bool(said)


def _prune(how: str, model: nn.Module, x: torch.Tensor, kw: dict[str, Any]) -> None:
    if how in ("heads", "heads+mlp"):
        hookscope.prune_heads(model, x, amount=0.5, mlp=0.5 if how == "heads+mlp" else None, kwargs=kw)
    else:
        hookscope.prune_width(model, x, amount=0.25, kwargs=kw)


@pytest.mark.parametrize("how", ["heads", "heads+mlp", "width"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_comes_back_from_its_folder(family: str, how: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    x, kw = _input(model)
    if family == "olmo2" and how != "width":  # one query norm over all heads: refused before any mask
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(hookscope.HookscopeError, match="normalises all its heads together"):
            _prune(how, model, x, kw)
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
        assert hookscope.core.hook_count(model) == 0
        return
    _prune(how, model, x, kw)
    small, _ = _round_trip(model, x, kw, tmp_path)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("prune, left", [
    (lambda m, ids: hookscope.prune_heads(m, ids, amount=0.25, kwargs=KW), "num_attention_heads"),
    (lambda m, ids: hookscope.prune_width(m, ids, amount=0.1, kwargs=KW), "hidden_size")])
def test_a_llama_config_transformers_would_refuse_is_never_written(prune: Any, left: str, tmp_path: Path) -> None:
    cfg = tr.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=16)
    torch.manual_seed(0)
    model, ids = tr.LlamaForCausalLM(cfg).eval(), torch.randint(0, 40, (2, 6))
    prune(model, ids)
    small, said = _round_trip(model, ids, KW, tmp_path)  # save_pretrained itself validates the config
    assert said and (small.config.hidden_size, small.config.num_attention_heads) == (32, 8)
    lay = small.model.layers[0].self_attn
    shrunk = (lay.q_proj.out_features, lay.k_proj.out_features) == (24, 12) or lay.q_proj.in_features == 29
    assert shrunk, left


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_a_qwen3_keeps_its_query_and_key_norms_epsilon(eps: float, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _causal("Qwen3", head_dim=8, rms_norm_eps=eps)().eval()
    ids = torch.randint(1, 40, (2, 6))
    hookscope.prune_width(model, ids, amount=0.25, kwargs=KW)
    small, said = _round_trip(model, ids, KW, tmp_path)
    attn = small.model.layers[0].self_attn
    assert attn.q_norm.variance_epsilon == attn.k_norm.variance_epsilon == eps  # per head: not the stream's
    assert small.model.norm.variance_epsilon == eps * 32 / 24 and said
    back = load_pretrained(tmp_path).model.layers[0].self_attn
    assert back.q_norm.variance_epsilon == eps and back.k_norm.variance_epsilon == eps


def test_a_stablelm_whose_config_cannot_say_fewer_heads_loads_with_load_pretrained(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _causal("StableLm")().eval()
    ids = torch.randint(1, 40, (2, 6))
    hookscope.prune_heads(model, ids, amount=0.5, kwargs=KW)
    small, said = _round_trip(model, ids, KW, tmp_path)
    assert said and small.config.num_attention_heads == 4  # StableLM derives head_dim as hidden / heads
    back = load_pretrained(tmp_path).model.layers[1].self_attn
    assert (back.q_proj.out_features, back.head_dim, back.num_key_value_groups) == (16, 8, 2)


@pytest.mark.parametrize("tie", [True, False])
def test_a_gemma_width_follows_its_one_plus_weight_norms_and_its_scaled_embedding(tie: bool, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _causal("Gemma", head_dim=8, tie_word_embeddings=tie)().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5)  # (1 + w) differs from w everywhere
    ids = torch.randint(1, 40, (2, 6))
    res = hookscope.prune_width(model, ids, amount=0.25, kwargs=KW)
    keep = [r.channel for r in res.rows if not r.removed]
    small, said = _round_trip(model, ids, KW, tmp_path)
    assert not said and small.config.hidden_size == 24
    emb = small.model.embed_tokens
    assert float(emb.embed_scale) == pytest.approx(24 ** 0.5) and emb.scalar_embed_scale == 24 ** 0.5
    assert torch.allclose(emb.weight * emb.embed_scale, model.model.embed_tokens.weight[:, keep] * 32 ** 0.5, atol=1e-6)
    norm, was = small.model.layers[0].input_layernorm, model.model.layers[0].input_layernorm
    assert torch.allclose(1 + norm.weight, (1 + was.weight[keep]) * (32 / 24) ** 0.5, atol=1e-6)
    assert (small.lm_head.weight is emb.weight) == tie
    assert (_logits(small, ids, KW) - _logits(model, ids, KW)).abs().max() < 1e-5


def test_a_class_built_from_more_than_its_config_is_compacted_without_a_folder_check() -> None:
    class Extra(tr.LlamaForCausalLM):
        def __init__(self, config: Any, extra: int) -> None:
            super().__init__(config)

    torch.manual_seed(0)
    model = Extra(tr.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2), 1).eval()
    ids = torch.randint(1, 40, (2, 6))
    hookscope.prune_heads(model, ids, amount=0.5, kwargs=KW)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small = hookscope.compact(model, ids, kwargs=KW)
    assert (small.config.num_attention_heads, small.model.layers[0].self_attn.q_proj.out_features) == (2, 16)
    assert (_logits(small, ids, KW) - _logits(model, ids, KW)).abs().max() < 1e-5


def test_a_model_neither_way_gives_back_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookscope.analysis.prune.compact import _reload

    def no_fit(model: nn.Module, state: Any) -> None:
        raise hookscope.HookscopeError("cannot fit it")

    monkeypatch.setattr(_reload, "fit_to", no_fit)  # as if the original architecture could not take the shapes
    torch.manual_seed(0)
    model = _causal("StableLm")().eval()
    ids = torch.randint(1, 40, (2, 6))
    hookscope.prune_heads(model, ids, amount=0.5, kwargs=KW)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(hookscope.HookscopeError, match=r"compaction refused: the compacted StableLmForCausalLM could "
                                                       r"not be loaded back .*\(HookscopeError: cannot fit it\)") as err:
        hookscope.compact(model, ids, kwargs=KW)
    assert "\n" not in str(err.value) and model.config.num_attention_heads == 4
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
