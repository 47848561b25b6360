"""Language models built from tiny configs (no download): capture across generate(), token positions
(at=), activation patching, and every-leaf capture/edit/trace leaving the outputs bit-identical."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError
from hookscope.selection import at

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

IDS = torch.tensor([[1, 2, 3, 4, 5]])
CORRUPT = torch.tensor([[7, 2, 3, 9, 5]])


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                      intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64)
    return transformers.BertForMaskedLM(config).eval()


def t5() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                                   vocab_size=100, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config).eval()


BLOCKS = {gpt2: r"re:transformer\.h\.\d+", llama: r"re:model\.layers\.\d+"}
BLOCK_NAMES = {gpt2: ["transformer.h.0", "transformer.h.1"], llama: ["model.layers.0", "model.layers.1"]}
MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5}
T5_KW = {"decoder_input_ids": torch.tensor([[0, 3, 4]])}


def _kw(build: Callable[[], nn.Module]) -> dict[str, Any]:
    return dict(T5_KW) if build is t5 else {}


def _generate(model: nn.Module) -> torch.Tensor:
    return model.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)  # type: ignore[operator]


def _reference_generate(model: nn.Module, names: list[str]) -> tuple[torch.Tensor, list[tuple[str, Any]]]:
    """generate() under hand-written forward hooks that clone what they see: blocks' outputs, and the
    root's KV cache (keys and values of each layer at that call)."""
    seen: list[tuple[str, Any]] = []
    handles = []

    def block_hook(name: str) -> Any:
        return lambda m, a, out: seen.append((name, out.clone()))

    def root_hook(m: nn.Module, a: Any, out: Any) -> None:
        cache = out.past_key_values
        seen.append(("", [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]))

    modules = dict(model.named_modules())
    handles.append(model.register_forward_hook(root_hook))
    handles += [modules[n].register_forward_hook(block_hook(n)) for n in names]
    try:
        ids = _generate(model)
    finally:
        for h in handles:
            h.remove()
    return ids, seen


# 1. generate() ----------------------------------------------------------------------------------

@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_generate_records_one_call_per_step_equal_to_hand_hooks_and_the_kv_cache_as_returned(build):
    model = build()
    ref_ids, ref = _reference_generate(model, BLOCK_NAMES[build])
    cache_type = type(model(IDS).past_key_values)
    with hookscope.capture(model, "", BLOCKS[build]) as rec:
        ids = _generate(model)
    assert torch.equal(ids, ref_ids) and no_hooks(model)
    # max_new_tokens=3 is three forward calls: the prompt (5 tokens), then one token at a time;
    # records are in the order calls began (the root first), the hand hooks in the order they ended
    assert [c.name for c in rec.calls] == ["", *BLOCK_NAMES[build]] * 3
    for name in ["", *BLOCK_NAMES[build]]:
        wants = [w for n, w in ref if n == name]
        assert len(rec[name]) == len(wants) == 3
        for i, (call, want) in enumerate(zip(rec[name].calls, wants)):
            if name:
                assert torch.equal(call.output, want) and call.output.shape[1] == (5 if i == 0 else 1)
                continue
            cache = call.output.past_key_values  # the cache object the model returned, as it was then
            assert type(cache) is cache_type and len(cache.layers) == len(want) == 2
            for layer, (k, v) in zip(cache.layers, want):
                assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert [rec[""].calls[i].output.past_key_values.layers[0].keys.shape[2] for i in range(3)] == [5, 6, 7]


class TupleCacheBlock(nn.Module):
    """A block returning ``(hidden, (keys, values))``, the legacy KV-cache tuple, extended each call."""

    def __init__(self) -> None:
        super().__init__()
        self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None) -> Any:
        k, v = self.k(x), self.v(x)
        if past is not None:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        weights = torch.softmax(x @ k.transpose(1, 2), -1)
        return x + weights @ v, (k, v)


def test_tuple_kv_cache_outputs_are_kept_as_tuples_call_by_call():
    block = TupleCacheBlock()
    xs = [torch.randn(1, 3, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 4)]

    def run() -> list[Any]:
        past, outs = None, []
        for x in xs:
            h, past = block(x, past)
            outs.append((h, past))
        return outs

    want = run()
    with hookscope.capture(block, "") as rec:
        got = run()
    assert no_hooks(block) and len(rec[""]) == 3
    for call, (h, (k, v)), (h2, (k2, v2)) in zip(rec[""].calls, want, got):
        out = call.output
        assert type(out) is tuple and type(out[1]) is tuple and out[1][0].shape[1] == k.shape[1]
        assert torch.equal(out[0], h) and torch.equal(out[1][0], k) and torch.equal(out[1][1], v)
        assert torch.equal(h2, h) and torch.equal(k2, k) and torch.equal(v2, v)


# 2. token positions -----------------------------------------------------------------------------

def test_capture_at_the_last_token_across_generate():
    model = gpt2()
    _, ref = _reference_generate(model, BLOCK_NAMES[gpt2])
    with hookscope.capture(model, BLOCKS[gpt2], at=at[:, -1]) as rec:
        _generate(model)
    want = [out[:, -1] for name, out in ref if name]
    assert len(rec.calls) == len(want) == 6 and no_hooks(model)
    for call, w in zip(rec.calls, want):
        assert call.output.shape == (1, 32) and torch.equal(call.output, w)


def test_capture_at_reads_the_first_tensor_of_a_tuple_output():
    model = gpt2()
    with hookscope.capture(model, "transformer.h.0.attn") as whole, \
            hookscope.capture(model, "transformer.h.0.attn", at=at[0, 1:3]) as part:
        model(IDS)
    full = whole["transformer.h.0.attn"].output
    assert type(full) is tuple and full[1] is None  # (attention output, weights not asked for)
    assert torch.equal(part["transformer.h.0.attn"].output, full[0][0, 1:3])


def test_capture_at_is_a_copy_that_a_later_in_place_write_cannot_reach():
    lin = nn.Linear(3, 3)
    net = nn.Sequential(lin, nn.ReLU(inplace=True))
    x = -torch.ones(2, 4, 3)
    with hookscope.capture(net, "0", at=at[:, -1]) as rec:
        net(x)
    assert torch.equal(rec["0"].output, lin(x)[:, -1])  # the pre-ReLU values


def test_at_refuses_positions_that_do_not_fit_in_one_line_and_leaves_no_hook():
    model = gpt2()
    with pytest.raises(HookscopeError, match=r"at\[:, 5\] does not fit the output of 'transformer.h.0'.*\(1, 5, 32\)") as e:
        with hookscope.capture(model, "transformer.h.0", at=at[:, 5]):
            model(IDS)
    assert "\n" not in str(e.value) and no_hooks(model)
    with pytest.raises(HookscopeError, match="does not fit"):
        with hookscope.edit(model, "transformer.h.0", output=lambda t: t, at=at[:, :, :, 0]):
            model(IDS)
    assert no_hooks(model)


@pytest.mark.parametrize("call, match", [
    (lambda m: hookscope.capture(m, "transformer.h.0", at=at), "needs positions"),
    (lambda m: hookscope.capture(m, "transformer.h.0", keep="io", at=at[:, -1]), "keep='output' only"),
    (lambda m: hookscope.edit(m, "transformer.h.0", input=lambda t: t, at=at[:, -1]), "output= alone"),
    (lambda m: hookscope.edit(m, "transformer.h.0", output=lambda t: t, grad_output=lambda g: g, at=at[:, -1]),
     "output= alone"),
    (lambda m: at[:, "a"], "not a tensor position"),
    (lambda m: at[:, 0.5], "not a tensor position"),
])
def test_at_bad_arguments_are_refused_in_one_line(call, match):
    model = gpt2()
    with pytest.raises(HookscopeError, match=match) as e:
        with call(model):
            model(IDS)
    assert "\n" not in str(e.value) and no_hooks(model)


def test_at_names_the_tensor_it_picked_when_the_first_is_not_the_hidden_state():
    model = gpt2()
    with pytest.raises(HookscopeError, match=r"whose first tensor, output\.loss, is a tensor of shape \(\)") as e:
        with hookscope.capture(model, "", at=at[:, -1]):
            model(IDS, labels=IDS)  # a ModelOutput whose first field is the loss
    assert "\n" not in str(e.value) and no_hooks(model)


def test_at_takes_numpy_integers_as_python_ints():
    import numpy as np

    assert repr(at[:, np.int64(-1)]) == "at[:, -1]" and at[np.int32(0):np.int64(2), [np.int64(1)]].index == (
        slice(0, 2, None), [1])
    model = gpt2()
    with hookscope.capture(model, "transformer.h.0", at=at[:, np.int64(2)]) as rec:
        model(IDS)
    with hookscope.capture(model, "transformer.h.0") as full:
        model(IDS)
    assert torch.equal(rec["transformer.h.0"].output, full["transformer.h.0"].output[:, 2])


@pytest.mark.parametrize("change, said", [
    (lambda t: t.mean(), "returned torch.float32 of shape ()"),  # would broadcast silently
    (lambda t: t.double(), "returned torch.float64 of shape (1, 32)"),  # would be cast silently
])
def test_edit_at_refuses_a_change_of_another_shape_or_dtype(change, said):
    model = gpt2()
    with pytest.raises(HookscopeError, match=re.escape(said)) as e:
        with hookscope.edit(model, "transformer.h.0", output=change, at=at[:, -1]):
            model(IDS)
    assert "\n" not in str(e.value) and no_hooks(model)


def _hand_patched_logits(model: nn.Module, name: str, fn: Callable[[torch.Tensor], torch.Tensor],
                         ids: torch.Tensor) -> torch.Tensor:
    """The logits with ``name``'s output at the last token replaced by ``fn(it)``, by a raw hook."""
    def hook(m: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor:
        new = out.clone()
        new[:, -1] = fn(out[:, -1])
        return new

    handle = dict(model.named_modules())[name].register_forward_hook(hook)
    try:
        return model(ids).logits  # type: ignore[no-any-return]
    finally:
        handle.remove()


def test_edit_at_changes_only_those_positions_out_of_place():
    model = gpt2()
    with torch.no_grad():
        want = _hand_patched_logits(model, "transformer.h.0", lambda t: t * 0, IDS)
        with hookscope.capture(model, "transformer.h.0") as plain:
            base = model(IDS).logits
        with hookscope.edit(model, "transformer.h.0", output=lambda t: t * 0, at=at[:, -1]) as ed, \
                hookscope.capture(model, "transformer.h.0") as seen:
            got = model(IDS).logits
    assert ed.counts == {"transformer.h.0": 1} and no_hooks(model)
    assert torch.equal(got, want) and not torch.equal(got[:, -1], base[:, -1])
    assert torch.equal(got[:, :-1], base[:, :-1])  # causal: the earlier tokens never see the last one
    edited, original = seen["transformer.h.0"].output, plain["transformer.h.0"].output
    assert torch.equal(edited[:, :-1], original[:, :-1]) and bool((edited[:, -1] == 0).all())


def test_edit_at_a_change_that_writes_in_place_never_reaches_the_model_memory():
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 4, 3)
    with hookscope.edit(lin, "", output=lambda t: t.mul_(0), at=at[:, 0]):
        y = lin(x)
    want = lin(x)
    assert bool((y[:, 0] == 0).all()) and torch.equal(y[:, 1:], want[:, 1:])


def test_edit_at_lets_gradients_flow_to_the_change_and_to_the_rest_of_the_tensor():
    model = gpt2()
    w = torch.full((32,), 0.5, requires_grad=True)
    ref_w = w.detach().clone().requires_grad_()
    want = _hand_patched_logits(model, "transformer.h.0", lambda t: t * ref_w, IDS)
    want.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with hookscope.edit(model, "transformer.h.0", output=lambda t: t * w, at=at[:, -1]):
        got = model(IDS).logits
    got.sum().backward()
    assert torch.equal(got, want) and w.grad is not None and torch.allclose(w.grad, ref_w.grad, atol=0, rtol=1e-6)
    assert bool(w.grad.abs().sum() > 0) and no_hooks(model)
    for n, p in model.named_parameters():  # the untouched positions carry gradient to earlier layers too
        assert torch.allclose(p.grad, ref_grads[n], atol=1e-7, rtol=1e-5), n
    assert bool(model.transformer.wte.weight.grad.abs().sum() > 0)


def test_edit_at_with_a_fixed_value_of_the_wrong_shape_is_refused():
    model = gpt2()
    with pytest.raises(HookscopeError, match=r"shape \(1, 5, 32\) but the module's output has shape \(1, 32\)"):
        with hookscope.edit(model, "transformer.h.0", output=torch.zeros(1, 5, 32), at=at[:, -1]):
            model(IDS)
    assert no_hooks(model)


# 3. activation patching -------------------------------------------------------------------------

def test_patching_every_layer_from_the_clean_run_reproduces_the_clean_logits_exactly():
    model = gpt2()
    blocks = BLOCK_NAMES[gpt2]
    with torch.no_grad():
        with hookscope.capture(model, BLOCKS[gpt2]) as clean:
            clean_logits = model(IDS).logits
        corrupt_logits = model(CORRUPT).logits
        with contextlib.ExitStack() as stack:
            for name in blocks:
                stack.enter_context(hookscope.edit(model, name, output=clean[name].output))
            patched = model(CORRUPT).logits
    assert not torch.equal(corrupt_logits, clean_logits)
    assert torch.equal(patched, clean_logits) and no_hooks(model)


def test_patching_one_layer_at_one_position_is_what_a_hand_written_hook_gives():
    model = gpt2()
    with torch.no_grad():
        with hookscope.capture(model, BLOCKS[gpt2]) as clean:
            clean_logits = model(IDS).logits
        corrupt_logits = model(CORRUPT).logits
        sweep = {}
        for name in BLOCK_NAMES[gpt2]:
            for pos in range(IDS.shape[1]):
                with hookscope.edit(model, name, output=clean[name].output[:, pos], at=at[:, pos]):
                    sweep[name, pos] = model(CORRUPT).logits
        first = clean["transformer.h.0"].output[:, -1]
        want = _hand_patched_logits(model, "transformer.h.0", lambda t: first, CORRUPT)
    assert torch.equal(sweep["transformer.h.0", 4], want)
    for pos in range(5):
        # the last block at one token: that token's logits become the clean ones, the others stay
        last = sweep["transformer.h.1", pos]
        assert torch.equal(last[:, pos], clean_logits[:, pos])
        others = [i for i in range(5) if i != pos]
        assert torch.equal(last[:, others], corrupt_logits[:, others])
        # the first block at one token: causal attention, so the tokens before it are untouched
        first_block = sweep["transformer.h.0", pos]
        assert torch.equal(first_block[:, :pos], corrupt_logits[:, :pos])
        assert not torch.equal(first_block[:, pos:], corrupt_logits[:, pos:])
    assert no_hooks(model)


# 5. every leaf ----------------------------------------------------------------------------------

def _logits(model: nn.Module, build: Callable[[], nn.Module]) -> torch.Tensor:
    return model(IDS, **_kw(build)).logits  # type: ignore[no-any-return]


def _leaves(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if n and not list(m.children())]


@pytest.mark.parametrize("build", list(MODELS.values()), ids=list(MODELS))
def test_capture_edit_and_trace_of_every_leaf_leave_the_outputs_bit_identical(build):
    model = build()
    with torch.no_grad():
        want = _logits(model, build)
        with hookscope.capture(model, _leaves(model), keep="io") as rec:
            captured = _logits(model, build)
        with hookscope.edit(model, _leaves(model), output=lambda t: None) as ed:
            edited = _logits(model, build)
        with hookscope.trace(model, _leaves(model)) as tr:
            traced = _logits(model, build)
    assert torch.equal(captured, want) and torch.equal(edited, want) and torch.equal(traced, want)
    assert set(rec) == {n for n, c in ed.counts.items() if c} and len(tr.rows) > 0 and no_hooks(model)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_generate_under_capture_edit_and_trace_of_every_leaf_gives_the_same_ids(build):
    model = build()
    want = _generate(model)
    with hookscope.capture(model, _leaves(model)):
        captured = _generate(model)
    with hookscope.edit(model, _leaves(model), output=lambda t: None):
        edited = _generate(model)
    with hookscope.trace(model, _leaves(model)):
        traced = _generate(model)
    assert torch.equal(captured, want) and torch.equal(edited, want) and torch.equal(traced, want)
    assert no_hooks(model)


@pytest.mark.parametrize("build", [gpt2, bert], ids=["gpt2", "bert"])
def test_capture_of_every_leaf_with_gradients_leaves_logits_and_parameter_gradients_bit_identical(build):
    model = build()
    _logits(model, build).square().sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with hookscope.capture(model, _leaves(model), keep="all") as rec:
        _logits(model, build).square().sum().backward()
    assert all(torch.equal(p.grad, want[n]) for n, p in model.named_parameters()) and no_hooks(model)
    head = "lm_head" if build is gpt2 else "cls.predictions.decoder"
    assert torch.equal(rec[head].grad_output, 2 * rec[head].output)  # d(sum x^2)/dx, by hand
