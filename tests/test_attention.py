"""Attention probabilities from the SDPA kernel's inputs, equal to eager ``output_attentions``;
heads edited on the kernel's output."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

import hookscope
from hookscope.errors import HookscopeError

transformers = pytest.importorskip("transformers")


def _pair(config: object, cls: type) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights under the fused kernel and under eager attention (each its own config)."""
    models = []
    for kernel in ("sdpa", "eager"):
        own = copy.deepcopy(config)
        own._attn_implementation = kernel  # type: ignore[attr-defined]
        torch.manual_seed(0)
        models.append(cls(own).eval())
    models[1].load_state_dict(models[0].state_dict())
    return models[0], models[1]


CASES = {
    "bert": lambda T: (T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    vocab_size=50, max_position_embeddings=32), T.BertModel, "ids"),
    "gpt2": lambda T: (T.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=32),
                       T.GPT2Model, "ids"),
    "llama": lambda T: (T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=64, vocab_size=50, max_position_embeddings=32), T.LlamaModel, "ids"),
    "vit": lambda T: (T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  image_size=16, patch_size=4), T.ViTModel, "pixels"),
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_patterns_equal_eager_output_attentions(family: str) -> None:
    config, cls, kind = CASES[family](transformers)
    sdpa, eager = _pair(config, cls)
    torch.manual_seed(1)
    x = torch.randint(0, 50, (2, 7)) if kind == "ids" else torch.randn(2, 3, 16, 16)
    kwargs = {"attention_mask": torch.tensor([[1] * 7, [0, 0] + [1] * 5])} if family == "bert" else None
    got = hookscope.attention(sdpa, x, kwargs=kwargs)
    with torch.no_grad():
        want = eager(x, output_attentions=True, **(kwargs or {})).attentions
    assert len(got) == len(want) == 2
    for (name, p), w in zip(got.items(), want):
        assert name.endswith("::scaled_dot_product_attention")
        assert p.shape == w.shape
        if family == "bert":  # padded keys: eager gives them ~0 (a large negative bias), the kernel exactly 0
            assert torch.allclose(p, w, atol=1e-6)
        else:
            assert (p - w).abs().max() <= 1e-6


def test_grouped_query_kernel_call_and_causal_mask() -> None:
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    p = hookscope.attention_probabilities(q, k, v, is_causal=True, enable_gqa=True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(p @ v.repeat_interleave(2, dim=1), out, atol=1e-6)
    with pytest.raises(HookscopeError, match="3 query heads cannot share 2 key heads"):
        hookscope.attention_probabilities(torch.randn(1, 3, 5, 8), k)


def test_a_head_ablated_on_the_kernel_equals_zeroing_its_slice_by_hand() -> None:
    config, cls, _ = CASES["gpt2"](transformers)
    sdpa, _ = _pair(config, cls)
    ids = torch.randint(0, 50, (1, 6))
    site = "h.1.attn::scaled_dot_product_attention"
    with torch.no_grad(), hookscope.edit(sdpa, site, output=hookscope.ablate([2], dim=1)):
        got = sdpa(ids).last_hidden_state

    def zero_head(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0].clone()
        x[..., 2 * 8:3 * 8] = 0  # head 2 of 4, 8 features each, where c_proj reads the merged heads
        return (x,)

    handle = sdpa.h[1].attn.c_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            want = sdpa(ids).last_hidden_state
    finally:
        handle.remove()
    assert torch.allclose(got, want, atol=1e-6)
    with torch.no_grad():
        assert not torch.allclose(sdpa(ids).last_hidden_state, want, atol=1e-4)


def test_a_module_selected_for_patterns_is_refused() -> None:
    config, cls, _ = CASES["gpt2"](transformers)
    sdpa, _ = _pair(config, cls)
    with pytest.raises(HookscopeError, match=r"'h.0.attn' is a module; attention patterns come from an operation"):
        hookscope.attention(sdpa, torch.randint(0, 50, (1, 4)), layers="h.0.attn")


# --- queries that see no key -------------------------------------------------------------------------
def _no_key_masks() -> dict[str, torch.Tensor]:
    sees = torch.tensor([[False, False, False], [True, False, False], [True, True, True]])
    return {"bool": sees, "float": torch.zeros(3, 3).masked_fill(~sees, float("-inf"))}


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_query_that_sees_no_key_weighs_nothing_as_the_kernel_does(kind: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    mask = _no_key_masks()[kind]
    p = hookscope.attention_probabilities(q, k, v, attn_mask=mask)
    for backend in (SDPBackend.MATH, None):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.allclose(p @ v, out, atol=1e-6)
    assert not p.isnan().any() and (p[..., 0, :] == 0).all()  # the first query sees no key: zeros, as the kernel
    assert torch.allclose(p[..., 1:, :].sum(-1), torch.ones(2, 2, 2))


def test_a_nan_input_stays_nan_where_a_query_sees_a_key() -> None:
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    q[0, 0, 2, 0] = float("nan")
    p = hookscope.attention_probabilities(q, k, attn_mask=_no_key_masks()["bool"])
    assert (p[0, 0, 0] == 0).all() and p[0, 0, 2].isnan().all() and not p[0, 0, 1].isnan().any()


def _padded(family: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    if family == "mistral":  # a window of 2 and two pads on the right: the last query sees only pads
        config = transformers.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, intermediate_size=64, vocab_size=50,
                                            max_position_embeddings=32, sliding_window=2)
        sdpa, eager = _pair(config, transformers.MistralModel)
        return sdpa, eager, torch.tensor([[1] * 5 + [0, 0], [1] * 7])
    config, cls, _ = CASES[family](transformers)
    sdpa, eager = _pair(config, cls)
    return sdpa, eager, torch.tensor([[0, 0] + [1] * 5, [1] * 7])  # left padding: the pads see no key


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral"])
def test_padded_batches_give_the_probabilities_the_kernel_weighs_values_with(family: str) -> None:
    sdpa, eager, mask = _padded(family)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    got = hookscope.attention(sdpa, ids, kwargs={"attention_mask": mask})
    with torch.no_grad(), hookscope.capture(sdpa, *got, keep="io") as rec:
        sdpa(ids, attention_mask=mask)
    for call in rec.calls:
        p = got[call.name]
        v = call.args[2]
        v = v.repeat_interleave(p.shape[1] // v.shape[1], dim=1)
        assert not p.isnan().any() and torch.allclose(p @ v, call.output, atol=1e-5)
    blind = ~hookscope.attention_probabilities(*rec.calls[0].args, **rec.calls[0].kwargs).bool().any(-1)
    assert blind.sum() > 0 and (got[rec.calls[0].name][blind] == 0).all()  # the rows the mask leaves no key
    with torch.no_grad():  # eager attention adds the dtype's lowest number instead: a uniform row there
        eager_p = eager(ids, attention_mask=mask, output_attentions=True).attentions[0]
    assert torch.allclose(eager_p[blind], torch.full_like(eager_p[blind], 1 / 7), atol=1e-6)
    assert hookscope.core.hook_count(sdpa) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_multiplied_in_float32_as_the_kernel_accumulates(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32) * 3 for _ in range(3))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    p = hookscope.attention_probabilities(q, k, is_causal=True)
    wide = hookscope.attention_probabilities(q.float(), k.float(), is_causal=True)
    assert p.dtype == dtype and torch.equal(p, wide.to(dtype))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
    assert ((p @ v).float() - out).abs().max() <= (0.07 if dtype == torch.bfloat16 else 0.01)
