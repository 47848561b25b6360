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


# --- nn.MultiheadAttention (torchvision's ViT) --------------------------------------------------------
def _vit() -> torch.nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                                                hidden_dim=16, mlp_dim=32).eval()


def test_torchvision_vit_gives_the_weights_of_its_multihead_attention_per_head() -> None:
    vit = _vit()
    x = torch.randn(2, 3, 32, 32)
    got = hookscope.attention(vit, x)
    site = "encoder.layers.encoder_layer_0.self_attention::multi_head_attention_forward"
    assert list(got) == [site, site.replace("layer_0", "layer_1")]
    with torch.no_grad(), hookscope.capture(vit, "encoder.layers.encoder_layer_0.ln_1") as rec:
        vit(x)
    h = rec["encoder.layers.encoder_layer_0.ln_1"][0].output
    with torch.no_grad():
        _, want = vit.encoder.layers[0].self_attention(h, h, h, need_weights=True, average_attn_weights=False)
    assert got[site].shape == (2, 2, 5, 5) and torch.allclose(got[site], want, atol=1e-6)
    assert hookscope.core.hook_count(vit) == 0


def test_multihead_attention_with_a_sample_that_sees_no_key_matches_what_the_module_gives() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 4, 8)
    pads = torch.tensor([[False, False, True, True], [True, True, True, True]])  # sample 1 sees no key
    net = torch.nn.Sequential()
    net.attn = mha

    class Call(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return mha(x, x, x, key_padding_mask=pads, need_weights=False)[0]

    model = Call()
    model.attn = mha
    site = "attn::multi_head_attention_forward"
    p = hookscope.attention(model, x)[site]
    with torch.no_grad(), hookscope.capture(model, site, keep="io") as rec:
        model(x)
        _, w = mha(x[:1], x[:1], x[:1], key_padding_mask=pads[:1], need_weights=True, average_attn_weights=False)
    assert torch.allclose(p[:1], w, atol=1e-6) and (p[0, :, :, 2:] == 0).all()
    ran = rec.calls[0].output[0]  # queries x batch x features: the kernel weighed sample 1 with zeros
    assert torch.equal(ran[:, 1], torch.zeros(4, 8) + mha.out_proj.bias)
    assert torch.equal(p[1], torch.zeros(2, 4, 4)) and hookscope.core.hook_count(model) == 0


class _ByHand(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, dim=-1) @ v


@pytest.mark.parametrize("kind", ["cnn", "by hand"])
def test_a_model_whose_attention_is_not_found_is_told_the_truth_and_a_remedy_that_works(kind: str) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()) if kind == "cnn" else torch.nn.Sequential()
    if kind == "by hand":
        net.attn = _ByHand()
    x = torch.randn(1, 3, 8, 8) if kind == "cnn" else torch.randn(1, 5, 8)
    with pytest.raises(HookscopeError) as e:
        hookscope.attention(net, x)
    said = str(e.value)
    assert said.startswith(f"no scaled_dot_product_attention or multi_head_attention_forward ran in Sequential")
    assert "\n" not in said and "hookscope.operations(model, inputs)" in said
    if kind == "by hand":  # the remedy: the softmax the operations list, selected
        ops = [r for r in str(hookscope.operations(net, x)).split() if r.endswith("::softmax")]
        assert ops == ["attn::softmax"]
        p = hookscope.attention(net, x, layers=ops[0])[ops[0]]
        assert p.shape == (1, 5, 5) and torch.allclose(p.sum(-1), torch.ones(1, 5))
    assert hookscope.core.hook_count(net) == 0


@pytest.mark.parametrize(("family", "module", "suggested"), [
    ("gpt2", "h.0", "h.0.attn::scaled_dot_product_attention"),
    ("gpt2", "h.0.attn", "h.0.attn::scaled_dot_product_attention"),
    ("vit", "encoder.layers.encoder_layer_1", "encoder.layers.encoder_layer_1.self_attention::multi_head_attention_forward"),
    ("by hand", "attn", "attn::softmax"),
])
def test_a_module_selected_for_patterns_is_told_the_operation_that_runs_in_it(family: str, module: str,
                                                                             suggested: str) -> None:
    if family == "gpt2":
        net, _ = _pair(*CASES["gpt2"](transformers)[:2])
        x = torch.randint(0, 50, (1, 4))
    elif family == "vit":
        net, x = _vit(), torch.randn(1, 3, 32, 32)
    else:
        net, x = torch.nn.Sequential(), torch.randn(1, 5, 8)
        net.attn = _ByHand()
    with pytest.raises(HookscopeError) as e:
        hookscope.attention(net, x, layers=module)
    said = str(e.value)
    assert said.startswith(f"{module!r} is a module; attention patterns come from an operation") and "\n" not in said
    assert f"select {suggested!r}" in said
    assert list(hookscope.attention(net, x, layers=suggested)) == [suggested]  # the remedy selects what ran
    assert hookscope.core.hook_count(net) == 0


def test_unbatched_multihead_attention_gives_heads_x_queries_x_keys() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2).eval()

    class Call(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return mha(x, x, x, need_weights=False, attn_mask=torch.ones(3, 3, dtype=torch.bool).triu(1))[0]

    model = Call()
    model.attn = mha
    x = torch.randn(3, 8)  # queries x features: no batch
    p = hookscope.attention(model, x)["attn::multi_head_attention_forward"]
    with torch.no_grad():
        _, w = mha(x, x, x, attn_mask=torch.ones(3, 3, dtype=torch.bool).triu(1), average_attn_weights=False)
    assert p.shape == (2, 3, 3) and torch.allclose(p, w, atol=1e-6) and (p.triu(1) == 0).all()


def test_a_module_without_attention_selected_is_told_none_runs_inside_it() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    with pytest.raises(HookscopeError) as e:
        hookscope.attention(net, torch.randn(1, 3, 8, 8), layers="0")
    assert str(e.value) == ("'0' is a module; attention patterns come from an operation: no scaled_dot_product_attention, "
                            "multi_head_attention_forward, softmax runs inside it; list the operations of one pass "
                            "with hookscope.operations(model, inputs) and select the one giving its probabilities")
    assert hookscope.core.hook_count(net) == 0
