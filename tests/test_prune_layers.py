"""Whole blocks scored and removed: block influence worked out from the hidden states, the perplexity
change equal to physically removing the block, and a decoder with blocks removed equal to the same family
built with fewer layers given those weights: logits, generate() with the cache, save and reload."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from torch import nn

import hookscope
from hookscope.core import hook_count

transformers.logging.set_verbosity_error()


def _llama(n: int = 4) -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=n,
                                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                    bos_token_id=0, eos_token_id=1, pad_token_id=1)


def _gpt2(n: int = 4) -> transformers.PretrainedConfig:
    return transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=n, n_head=2, n_positions=64, bos_token_id=0,
                                   eos_token_id=1, pad_token_id=1)


def _qwen2(n: int = 4) -> transformers.PretrainedConfig:
    # the later layers slide: layer_types is a per-layer list the removal must trim
    return transformers.Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=n,
                                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                    use_sliding_window=True, sliding_window=4, max_window_layers=2,
                                    bos_token_id=0, eos_token_id=1, pad_token_id=1)


def _opt(n: int = 4) -> transformers.PretrainedConfig:
    return transformers.OPTConfig(vocab_size=40, hidden_size=16, ffn_dim=32, num_hidden_layers=n,
                                  num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=16,
                                  bos_token_id=0, eos_token_id=1, pad_token_id=1)


FAMILIES = {"llama": (_llama, transformers.LlamaForCausalLM), "gpt2": (_gpt2, transformers.GPT2LMHeadModel),
            "qwen2": (_qwen2, transformers.Qwen2ForCausalLM), "opt": (_opt, transformers.OPTForCausalLM)}


def _build(name: str, n: int = 4) -> nn.Module:
    cfg, cls = FAMILIES[name]
    torch.manual_seed(0)
    return cls(cfg(n)).eval()


def _ids(seed: int = 0, shape: tuple[int, int] = (3, 12)) -> torch.Tensor:
    return torch.randint(2, 40, shape, generator=torch.Generator().manual_seed(seed))


def _generate(model: nn.Module, ids: torch.Tensor, cache: bool) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=cache,
                              attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_decoder_with_blocks_removed_is_the_smaller_model_given_those_weights(name, tmp_path):
    model = _build(name)
    r = hookscope.remove_layers(model, [0, 2])
    assert r.removed == [0, 2] and r.kept == 2 and [row.new_index for row in r.rows] == [None, 0, None, 1]
    assert model.config.num_hidden_layers == 2
    idx = [m.layer_idx for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)]
    assert idx == [0, 1]
    if name == "qwen2":
        assert model.config.layer_types == ["full_attention", "sliding_attention"]
    cfg, cls = FAMILIES[name]
    small_cfg = cfg(2)
    if name == "qwen2":
        small_cfg.layer_types = ["full_attention", "sliding_attention"]
    small = cls(small_cfg).eval()
    small.load_state_dict(model.state_dict(), strict=True)
    ids = _ids(1, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, small(ids).logits)
    with_cache = _generate(model, ids[:1], True)
    assert torch.equal(with_cache, _generate(small, ids[:1], True))
    assert torch.equal(with_cache, _generate(model, ids[:1], False))  # the cache, indexed by layer_idx, agrees
    model.save_pretrained(tmp_path)
    again = cls.from_pretrained(tmp_path).eval()
    assert again.config.num_hidden_layers == 2
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert hook_count(model) == 0


def test_block_influence_is_one_minus_the_cosine_of_each_blocks_input_and_output():
    model = _build("llama").double()
    ids = _ids()
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states  # hs[i]: block i's input; the last is normed
    held = hook_count(model)  # transformers' own hooks that record the hidden states, left on
    r = hookscope.layer_importance(model, ids)
    for i in range(3):
        x, y = hs[i].reshape(-1, 16), hs[i + 1].reshape(-1, 16)
        want = float((1 - (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))).mean())
        assert abs(r.rows[i].score - want) <= 1e-12
    assert [row.block for row in r.rows] == [f"model.layers.{i}" for i in range(4)]
    assert r["model.layers.2"].score == r.rows[2].score and hook_count(model) == held


def _perplexity(model: nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(ids).logits
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return math.exp(float(loss))


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_perplexity_change_is_that_of_the_model_with_the_block_removed(name):
    model = _build(name).double()
    ids = _ids(2)
    r = hookscope.layer_importance(model, ids, method="perplexity")
    dense = _perplexity(model, ids)
    assert abs(r.dense - dense) <= 1e-9
    for i in range(4):
        cut = copy.deepcopy(model)
        hookscope.remove_layers(cut, [i])
        assert abs(r.rows[i].score - (_perplexity(cut, ids) - dense)) <= 1e-9
    assert hook_count(model) == 0


def test_a_planted_pass_through_block_is_the_one_chosen():
    """A block whose attention and MLP write nothing into the stream has influence 0, the lowest."""
    model = _build("llama")
    with torch.no_grad():
        model.model.layers[2].self_attn.o_proj.weight.zero_()
        model.model.layers[2].mlp.down_proj.weight.zero_()
    r = hookscope.layer_importance(model, _ids())
    assert abs(r.rows[2].score) <= 1e-6 and r.lowest(1) == [2]
    p = hookscope.layer_importance(model, _ids(), method="perplexity")
    assert abs(p.rows[2].score) <= 1e-4 and p.lowest(1) == [2]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("blocks", "text"), [
    ([0, 1, 2, 3], "removing all 4 blocks would leave no block; keep at least one"),
    ([4], "block 4 is out of range: the model has 4 blocks"),
    ([-1], "block -1 is out of range"),
    ("1", "blocks='1' is not a list of block indices"),
    ([1.0], "is not a list of block indices"),
])
def test_bad_removals_are_one_line_and_the_model_untouched(blocks, text):
    model = _build("llama")
    before = _state(model)
    with pytest.raises(hookscope.HookscopeError, match=text) as e:
        hookscope.remove_layers(model, blocks)
    assert "\n" not in str(e.value) and model.config.num_hidden_layers == 4 and len(model.model.layers) == 4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_stack_it_cannot_renumber_is_refused():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(hookscope.HookscopeError, match="is not a transformers decoder") as e:
        hookscope.remove_layers(net, [0])
    assert "\n" not in str(e.value) and len(net) == 3
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=3, n_head=2,
                                                                scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(hookscope.HookscopeError, match="scale_attn_by_inverse_layer_idx"):
        hookscope.remove_layers(gpt2, [1])
    assert gpt2.config.n_layer == 3


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"method": "cosine"}, "no layer score 'cosine'"),
    ({"data": "text"}, "data= is not calibration data"),
    ({"data": torch.randn(2, 5), "method": "perplexity"}, "needs token ids"),
])
def test_bad_scoring_is_one_line(kwargs, text):
    model = _build("llama")
    args = {"data": _ids(), **kwargs}
    with pytest.raises(hookscope.HookscopeError, match=text) as e:
        hookscope.layer_importance(model, **args)
    assert "\n" not in str(e.value) and hook_count(model) == 0


def test_block_influence_leaves_the_padding_out():
    """A padded batch with its attention mask scores each block as the same sequences unpadded, one batch each."""
    model = _build("llama")
    a, b = _ids(1, (1, 9)), _ids(2, (1, 5))
    padded = torch.cat([a, torch.cat([b, torch.full((1, 4), 1)], 1)])
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    one = hookscope.layer_importance(model, {"input_ids": padded, "attention_mask": mask})
    two = hookscope.layer_importance(model, [a, b])
    for r, s in zip(one.rows, two.rows):
        assert r.score == pytest.approx(s.score, rel=1e-9, abs=1e-12)
    assert hook_count(model) == 0


def _gemma2(n: int) -> transformers.PretrainedConfig:
    return transformers.Gemma2Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=n,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=3,
                                     layer_types=["sliding_attention", "full_attention", "full_attention",
                                                  "sliding_attention"][:n], pad_token_id=1)


def _gemma3(n: int) -> transformers.PretrainedConfig:
    return transformers.Gemma3TextConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=n,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=3,
                                         sliding_window_pattern=2, pad_token_id=1)


MORE = {
    "gemma2": (_gemma2, transformers.Gemma2ForCausalLM),
    "gemma3": (_gemma3, transformers.Gemma3ForCausalLM),
    "mistral": (lambda n: transformers.MistralConfig(vocab_size=40, hidden_size=16, intermediate_size=24,
                                                     num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=1,
                                                     sliding_window=3, pad_token_id=1), transformers.MistralForCausalLM),
    "phi3": (lambda n: transformers.Phi3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=n,
                                               num_attention_heads=2, pad_token_id=1, bos_token_id=0, eos_token_id=1,
                                               sliding_window=3), transformers.Phi3ForCausalLM),
    "neox": (lambda n: transformers.GPTNeoXConfig(vocab_size=40, hidden_size=16, intermediate_size=24,
                                                  num_hidden_layers=n, num_attention_heads=2),
             transformers.GPTNeoXForCausalLM),
    "falcon-alibi": (lambda n: transformers.FalconConfig(vocab_size=40, hidden_size=16, num_hidden_layers=n,
                                                         num_attention_heads=2, alibi=True),
                     transformers.FalconForCausalLM),
    "llama-tied": (lambda n: transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24,
                                                      num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=1,
                                                      tie_word_embeddings=True, pad_token_id=1),
                   transformers.LlamaForCausalLM),
}


@pytest.mark.parametrize("blocks", [[0], [3], [2, 0]])
@pytest.mark.parametrize("name", list(MORE))
def test_removal_on_sliding_window_alibi_and_tied_families_is_the_smaller_model(name, blocks, tmp_path):
    """Gemma2's and Gemma3's per-layer layer_types (sliding or full) follow their blocks: the model after removal
    is the family built with the trimmed config and given the kept weights, its cached generation is its uncached
    one, and it reloads to the same logits."""
    make, cls = MORE[name]
    torch.manual_seed(0)
    cfg = make(4)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    types = list(getattr(model.config, "layer_types", None) or [])
    kept = [i for i in range(4) if i not in blocks]
    hookscope.remove_layers(model, blocks)
    assert model.config.num_hidden_layers == len(kept)
    assert list(getattr(model.config, "layer_types", None) or []) == ([types[i] for i in kept] if types else [])
    fresh = cls(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    ids = _ids(3, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=0, atol=0)
    assert torch.equal(_generate(model, ids, True), _generate(model, ids, False))
    model.save_pretrained(tmp_path)
    again = cls.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    if name == "llama-tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight
