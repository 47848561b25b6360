"""summary() on GPT-2 / BERT / T5 / LLaMA from tiny configs: unique parameter counts (tied embeddings
once, shared tensors named in the table) and mult-adds equal to torch's FlopCounterMode / 2."""

from __future__ import annotations

import pytest
import torch
from helpers import no_hooks
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import hookscope

pytest.importorskip("transformers")
from test_capture_lm import IDS, MODELS, gpt2, t5  # noqa: E402 - the same tiny models

SEQ = IDS.shape[1]  # 5 tokens; T5's decoder reads 3
# Q K^T and weights @ V over every head (2 heads x 16 = 32 wide), 2 layers, by hand
ATTENTION = {
    "gpt2": 2 * 2 * SEQ * SEQ * 32,
    "llama": 2 * 2 * SEQ * SEQ * 32,
    "bert": 2 * 2 * SEQ * SEQ * 32,
    "t5": 2 * 2 * (SEQ * SEQ + 3 * 3 + 3 * SEQ) * 32,  # encoder self, decoder self, cross attention
}
SHARED = {  # the tied tensors each model's table must name
    "gpt2": {"lm_head": {"weight": "transformer.wte.weight"}},
    "llama": {},
    "bert": {"cls.predictions.decoder": {"weight": "bert.embeddings.word_embeddings.weight",
                                         "bias": "cls.predictions.bias"}},
    "t5": {n: {"weight": "shared.weight"} for n in ("encoder.embed_tokens", "decoder.embed_tokens", "lm_head")},
}


def _kw(name: str) -> dict[str, torch.Tensor]:
    return {"decoder_input_ids": torch.tensor([[0, 3, 4]])} if name == "t5" else {}


def _flops_macs(model: torch.nn.Module, name: str) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(IDS, **_kw(name))
    return int(counter.get_total_flops()) // 2


@pytest.mark.parametrize("name", list(MODELS))
def test_parameters_are_counted_once_and_tied_tensors_are_named(name):
    model = MODELS[name]()
    s = hookscope.summary(model, IDS, kwargs=_kw(name))
    unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert s.totals.params == s[""][0].params_total == unique and no_hooks(model)
    assert {r.name: r.shared for r in s.rows if r.shared} == SHARED[name]
    for row, shared in SHARED[name].items():
        for local, owner in shared.items():
            assert f"{local} shared with {owner}" in str(s)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("attention", ["sdpa-math", "eager"])
def test_mult_adds_equal_flop_counter_mode(name, attention):
    """FlopCounterMode sees the attention products as bmm under the math SDPA backend and under
    eager attention; hookscope counts the same products, so the totals are equal."""
    model = MODELS[name]()
    if attention == "eager":
        model.set_attn_implementation("eager")
    with sdpa_kernel(SDPBackend.MATH):
        s = hookscope.summary(model, IDS, kwargs=_kw(name))
        want = _flops_macs(model, name)
    assert s.totals.macs == want and not s.totals.macs_partial and no_hooks(model)


@pytest.mark.parametrize("name", list(MODELS))
def test_with_the_default_cpu_attention_kernel_flop_counter_mode_misses_exactly_the_attention(name):
    """On the CPU, F.scaled_dot_product_attention runs aten._scaled_dot_product_flash_attention_for_cpu,
    for which FlopCounterMode has no formula in this torch: it counts 0 for attention, hookscope its products."""
    model = MODELS[name]()
    s = hookscope.summary(model, IDS, kwargs=_kw(name))
    counted = _flops_macs(model, name)
    missed = 0 if torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_registry else ATTENTION[name]
    assert s.totals.macs - counted == missed


def test_gpt2_mult_adds_by_hand():
    model = gpt2()
    s = hookscope.summary(model, IDS)
    per_layer = SEQ * 32 * 96 + SEQ * 32 * 32 + 2 * SEQ * 32 * 128 + 2 * SEQ * SEQ * 32  # qkv, proj, mlp, attention
    assert s.totals.macs == 2 * per_layer + SEQ * 32 * 100  # + lm_head
    assert s["transformer.h.0.attn"][0].macs == SEQ * 32 * 96 + SEQ * 32 * 32 + 2 * SEQ * SEQ * 32


def test_t5_summary_runs_the_encoder_and_decoder_once_each():
    model = t5()
    s = hookscope.summary(model, IDS, kwargs=_kw("t5"))
    assert len(s["encoder"]) == len(s["decoder"]) == 1 and s["lm_head"][0].output_shapes == [(1, 3, 100)]
