"""Component names as layers (hookscope.named): capture records a component's value as the view reads it,
keyed by its name, and equals what transformers itself says (the hidden states; the heads through the
output projection); edit writes back through the view and equals a hand-written hook on the module;
globs, one head's spelling, gradients, the command line; refusals in one line with no hook left; the
check run once per model and again when its modules change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core import hook_count
from hookscope.errors import HookscopeError, SelectionError

transformers = pytest.importorskip("transformers")
T = transformers

SMALL = dict(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=50)
GQA = dict(SMALL, num_key_value_heads=2)
# family -> (its config, the path of block i, the output projection under it)
FAMILIES: dict[str, tuple[Callable[[], Any], str, str]] = {
    "gpt2": (lambda: T.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=50, n_positions=32),
             "transformer.h.{i}", "attn.c_proj"),
    "llama": (lambda: T.LlamaConfig(**GQA), "model.layers.{i}", "self_attn.o_proj"),
    "qwen2": (lambda: T.Qwen2Config(**GQA), "model.layers.{i}", "self_attn.o_proj"),
    "gemma2": (lambda: T.Gemma2Config(**GQA, head_dim=8), "model.layers.{i}", "self_attn.o_proj"),
    "gpt_neox": (lambda: T.GPTNeoXConfig(**SMALL), "gpt_neox.layers.{i}", "attention.dense"),
    "falcon": (lambda: T.FalconConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, vocab_size=50),
               "transformer.h.{i}", "self_attention.dense"),
    "opt": (lambda: T.OPTConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, ffn_dim=64, vocab_size=50,
                                word_embed_proj_dim=32), "model.decoder.layers.{i}", "self_attn.out_proj"),
    "phi3": (lambda: T.Phi3Config(**GQA, pad_token_id=0), "model.layers.{i}", "self_attn.o_proj"),
}
IDS = torch.tensor([[1, 7, 3, 9, 4, 2], [5, 5, 11, 0, 8, 13]])


def build(family: str, attention: str = "eager") -> nn.Module:
    config = FAMILIES[family][0]()
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    hookscope.components(model)  # checked once here: the tests below then run no extra pass
    return model


def module(model: nn.Module, family: str, i: int, under: str = "") -> nn.Module:
    path = FAMILIES[family][1].format(i=i)
    return model.get_submodule(f"{path}.{under}" if under else path)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and float((a.detach().double() - b.detach().double()).abs().max()) <= tol


@pytest.mark.parametrize("family", list(FAMILIES))
def test_resid_post_and_final_norm_are_the_models_own_hidden_states(family):
    model = build(family)
    with torch.no_grad():
        want = model(IDS, output_hidden_states=True).hidden_states  # [embeddings, after block 0, 1, final norm]
    before = hook_count(model)  # transformers leaves its own hooks for output_hidden_states
    with torch.no_grad(), hookscope.capture(model, "blocks.0.resid_post", "blocks.1.resid_post", "final_norm") as rec:
        model(IDS)
    assert list(rec.selected) == ["blocks.0.resid_post", "blocks.1.resid_post", "final_norm"]
    assert close(rec["blocks.0.resid_post"].output, want[1], 0) and close(rec["blocks.1.resid_post"].output, want[2], 0)
    assert close(rec["final_norm"].output, want[3], 0)  # the last hidden state is after the final norm
    assert hook_count(model) == before


@pytest.mark.parametrize("family", list(FAMILIES))
def test_z_heads_through_w_o_plus_its_bias_is_the_attention_output(family):
    model = build(family)
    proj = module(model, family, 0, FAMILIES[family][2])
    name = f"{FAMILIES[family][1].format(i=0)}.{FAMILIES[family][2]}"
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.z", name) as rec:
        model(IDS)
    z = rec["blocks.0.attn.z"].output
    heads, d_head = model.config.num_attention_heads, 32 // model.config.num_attention_heads
    if family == "gemma2":
        d_head = 8
    assert z.shape == (*IDS.shape, heads, d_head)
    w = proj.weight if isinstance(proj, nn.Linear) else proj.weight.t()  # GPT-2's Conv1D keeps [in, out]
    by_hand = sum(z[..., h, :].double() @ w[:, h * d_head:(h + 1) * d_head].double().t() for h in range(heads))
    if proj.bias is not None:
        by_hand = by_hand + proj.bias.double()
    out = rec[name].output
    assert close(by_hand, out.reshape(by_hand.shape))
    assert hook_count(model) == 0


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("head", [0, 3])
def test_an_edit_of_one_heads_z_is_a_hand_hook_zeroing_its_columns_of_the_projections_input(family, head):
    model = build(family)
    d_head = 8
    with torch.no_grad():
        plain = model(IDS).logits
        with hookscope.edit(model, f"blocks.1.attn.head.{head}.z", output=torch.zeros_like) as e:
            edited = model(IDS).logits
    assert e.counts == {f"blocks.1.attn.head.{head}.z": 1}

    def zero_columns(m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x, *args[1:])

    handle = module(model, family, 1, FAMILIES[family][2]).register_forward_pre_hook(zero_columns)
    try:
        with torch.no_grad():
            by_hand = model(IDS).logits
    finally:
        handle.remove()
    assert torch.equal(edited, by_hand) and not torch.equal(edited, plain)
    assert hook_count(model) == 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_edit_adding_a_vector_to_resid_post_is_a_forward_hook_on_the_block(family):
    model = build(family)
    vector = torch.linspace(-1, 1, 32)
    with torch.no_grad(), hookscope.edit(model, "blocks.1.resid_post", output=lambda x: x + vector):
        edited = model(IDS).logits

    def add(m: nn.Module, args: Any, out: Any) -> Any:
        return out + vector if isinstance(out, torch.Tensor) else (out[0] + vector, *out[1:])

    handle = module(model, family, 1).register_forward_hook(add)
    try:
        with torch.no_grad():
            by_hand = model(IDS).logits
    finally:
        handle.remove()
    assert torch.equal(edited, by_hand)
    assert hook_count(model) == 0


def test_an_edit_of_resid_pre_writes_the_blocks_input_and_the_capture_after_it_sees_the_edit():
    model = build("llama")
    with torch.no_grad(), hookscope.edit(model, "blocks.2.resid_pre", output=torch.zeros_like), \
            hookscope.capture(model, "blocks.1.resid_post", "blocks.2.resid_pre", "blocks.2.attn.z") as rec:
        model(IDS)
    assert rec["blocks.1.resid_post"].output.abs().sum() > 0
    assert torch.equal(rec["blocks.2.resid_pre"].output, torch.zeros(2, 6, 32))
    z = rec["blocks.2.attn.z"].output  # attention of a zero stream: the v projection's output of zeros
    assert float(z.abs().max()) == 0.0
    assert hook_count(model) == 0


def test_a_change_made_in_place_on_a_fused_projections_head_is_written_back():
    model = build("gpt2")  # q is read out of c_attn's fused output: a head's slice is a copy
    with torch.no_grad():
        with hookscope.edit(model, "blocks.0.attn.head.1.v", output=lambda v: v.zero_()):
            in_place = model(IDS).logits
        with hookscope.edit(model, "blocks.0.attn.head.1.v", output=torch.zeros_like):
            returned = model(IDS).logits
        plain = model(IDS).logits
    assert torch.equal(in_place, returned) and not torch.equal(in_place, plain)
    assert hook_count(model) == 0


def test_globs_select_every_block_and_head_names_only_where_they_ask_for_heads():
    model = build("llama")
    with torch.no_grad(), hookscope.capture(model, "blocks.*.mlp_out", "blocks.1.attn.head.*.z") as rec:
        model(IDS)
    assert list(rec.selected) == ["blocks.0.mlp_out", "blocks.1.attn.head.0.z", "blocks.1.attn.head.1.z",
                                  "blocks.1.attn.head.2.z", "blocks.1.attn.head.3.z", "blocks.1.mlp_out",
                                  "blocks.2.mlp_out"]
    with torch.no_grad(), hookscope.capture(model, "blocks.1.attn.z", "blocks.1.*.k") as whole:
        model(IDS)
    assert list(whole.selected) == ["blocks.1.attn.k", "blocks.1.attn.z"]  # no head names: the glob asked for none
    for h in range(4):
        assert torch.equal(rec[f"blocks.1.attn.head.{h}.z"].output, whole["blocks.1.attn.z"].output[..., h, :])
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.head.*.k") as kv:
        model(IDS)
    assert list(kv.selected) == ["blocks.0.attn.head.0.k", "blocks.0.attn.head.1.k"]  # its two key/value heads
    assert hook_count(model) == 0


def test_one_heads_pattern_is_its_row_of_the_attention_probabilities():
    model = build("gpt2")
    with torch.no_grad():
        want = model(IDS, output_attentions=True).attentions[0]
    before = hook_count(model)
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.pattern", "blocks.0.attn.head.2.pattern") as rec:
        model(IDS)
    assert torch.equal(rec["blocks.0.attn.pattern"].output, want)
    assert torch.equal(rec["blocks.0.attn.head.2.pattern"].output, want[:, 2])
    assert hook_count(model) == before


def test_gradients_of_a_component_are_those_of_the_tensor_the_model_goes_on_with():
    model = build("gpt2")
    o_proj, qkv = module(model, "gpt2", 0, "attn.c_proj"), module(model, "gpt2", 0, "attn.c_attn")
    seen: dict[str, torch.Tensor] = {}
    handles = [o_proj.register_forward_pre_hook(lambda m, a: [a[0].register_hook(lambda g: seen.__setitem__("z", g))][1:]
                                                or None),
               qkv.register_forward_hook(lambda m, a, o: [o.register_hook(lambda g: seen.__setitem__("qkv", g))][1:]
                                         or None)]
    try:
        model(IDS).logits.sum().backward()
    finally:
        for h in handles:
            h.remove()
    with hookscope.capture(model, "blocks.0.attn.z", "blocks.0.attn.q", "blocks.0.attn.head.1.k",
                           keep="grad_output") as rec:
        model(IDS).logits.sum().backward()
    assert close(rec["blocks.0.attn.z"].grad_output.flatten(-2), seen["z"], 1e-6)
    assert close(rec["blocks.0.attn.q"].grad_output.flatten(-2), seen["qkv"][..., :32], 1e-6)
    assert close(rec["blocks.0.attn.head.1.k"].grad_output, seen["qkv"][..., 32 + 8:32 + 16], 1e-6)
    assert hook_count(model) == 0


def test_a_gradient_edit_of_a_component_scales_what_reaches_the_weights_before_it():
    model = build("llama")
    q_proj = module(model, "llama", 0, "self_attn.q_proj")
    model(IDS).logits.sum().backward()
    plain = q_proj.weight.grad.clone()
    model.zero_grad()
    with hookscope.edit(model, "blocks.0.attn.q", grad_output=lambda g: g * 3):
        model(IDS).logits.sum().backward()
    assert close(q_proj.weight.grad, 3 * plain, 1e-5)
    assert hook_count(model) == 0


def test_the_check_runs_once_per_model_and_again_when_its_modules_change():
    model = build("gpt2")
    passes = []
    model.register_forward_pre_hook(lambda m, a: passes.append(1))
    for _ in range(3):
        with torch.no_grad(), hookscope.capture(model, "blocks.0.resid_post"):
            pass
    assert passes == []  # resolved and checked once, by components() in build
    model.transformer.h[0].mlp = type(model.transformer.h[0].mlp)(64, model.config)  # a new module there
    with torch.no_grad(), hookscope.capture(model, "blocks.0.resid_post"):
        pass
    assert passes == [1]  # checked again: the layout changed
    with torch.no_grad(), hookscope.capture(model, "blocks.0.resid_post"):
        pass
    assert passes == [1]
    model._forward_pre_hooks.clear()
    assert hook_count(model) == 0


def test_a_model_whose_names_were_never_resolved_is_checked_on_first_use():
    config = FAMILIES["qwen2"][0]()
    model = T.AutoModelForCausalLM.from_config(config).eval()
    passes = []
    handle = model.register_forward_pre_hook(lambda m, a: passes.append(1))
    with torch.no_grad(), hookscope.edit(model, "blocks.0.mlp_out", output=torch.zeros_like):
        pass
    with torch.no_grad(), hookscope.capture(model, "blocks.1.mlp_out"):
        pass
    handle.remove()
    assert passes == [1]
    assert hook_count(model) == 0


@pytest.mark.parametrize("selector, says", [
    ("blocks.0.resid_mid", "no component 'blocks.0.resid_mid' in this GPTNeoXForCausalLM: GPT-NeoX with "
                           "use_parallel_residual=True runs attention and the MLP in parallel"),
    ("blocks.7.resid_post", "no component 'blocks.7.resid_post': this GPTNeoXForCausalLM has 3 blocks, blocks.0 to "
                            "blocks.2"),
    ("blocks.0.attn.head.4.z", "no component 'blocks.0.attn.head.4.z': blocks.0.attn.z of this GPTNeoXForCausalLM "
                               "holds 4 query heads, head.0 to head.3"),
    ("blocks.0.attn.zz", "no component 'blocks.0.attn.zz' of this GPTNeoXForCausalLM. Did you mean 'blocks.0.attn.z'"),
    ("blocks.*.resid_mid", "the glob 'blocks.*.resid_mid' matches no component name of this GPTNeoXForCausalLM"),
    ("pos_embed", "no component 'pos_embed' in this GPTNeoXForCausalLM: GPT-NeoX has no position embedding"),
])
def test_names_the_family_lacks_are_refused_in_one_line_with_nothing_attached(selector, says):
    model = build("gpt_neox")
    for make in (lambda: hookscope.capture(model, "blocks.0.resid_post", selector),
                 lambda: hookscope.edit(model, "blocks.0.resid_post", selector, output=torch.zeros_like)):
        with pytest.raises(SelectionError) as e:
            with make():
                model(IDS)
        assert str(e.value).startswith(says) and "\n" not in str(e.value)
        assert hook_count(model) == 0


def test_an_unsupported_family_is_refused_naming_the_closest_supported_one():
    model = T.MixtralForCausalLM(T.MixtralConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                                                 num_key_value_heads=1, intermediate_size=16, vocab_size=30,
                                                 num_local_experts=2)).eval()
    with pytest.raises(SelectionError, match=r"^component names do not know 'mixtral' models \(MixtralForCausalLM\): "
                                             r"the closest supported family is Mistral \('mistral'\)"):
        hookscope.capture(model, "blocks.0.resid_post")
    assert hook_count(model) == 0


def test_a_module_of_that_name_wins_and_a_model_without_a_config_has_no_component_names():
    net = nn.Sequential()
    net.add_module("embed", nn.Linear(2, 2))
    with hookscope.capture(net, "embed") as rec:
        net(torch.ones(1, 2))
    assert rec["embed"].output.shape == (1, 2)
    with pytest.raises(SelectionError, match="selector 'blocks.0.resid_post' matches no module of Sequential"):
        hookscope.capture(net, "blocks.0.resid_post")
    assert hook_count(net) == 0


def test_an_edit_of_the_pattern_is_refused_and_sdpa_has_none_to_read():
    model = build("gpt2")
    with pytest.raises(HookscopeError, match=r"^'blocks.0.attn.pattern' cannot be edited: the attention returns "
                                             r"its weights after applying them"):
        hookscope.edit(model, "blocks.0.attn.pattern", output=torch.zeros_like)
    with pytest.raises(HookscopeError, match=r"^'blocks.0.attn.head.0.pattern' cannot be edited"):
        hookscope.edit(model, "blocks.*.attn.head.0.pattern", output=torch.zeros_like)
    sdpa = build("llama", attention="sdpa")
    with pytest.raises(HookscopeError, match="only eager attention returns its weights; build the model with "
                                             "attn_implementation='eager'"):
        with torch.no_grad(), hookscope.capture(sdpa, "blocks.0.attn.pattern"):
            sdpa(IDS)
    assert hook_count(model) == 0 and hook_count(sdpa) == 0


def test_an_edit_returning_the_wrong_shape_or_dtype_is_refused_in_one_line():
    model = build("llama")
    for change, says in ((lambda x: x[..., :3], r"returned torch.float32 of shape \(2, 6, 3\)"),
                         (lambda x: x.double(), "returned torch.float64 of shape")):
        with pytest.raises(HookscopeError, match=f"the change of 'blocks.0.resid_post' {says}"):
            with torch.no_grad(), hookscope.edit(model, "blocks.0.resid_post", output=change):
                model(IDS)
        assert hook_count(model) == 0


def test_a_wrapped_model_takes_the_names_of_the_model_inside():
    model = build("gpt2")
    wrapped = nn.DataParallel(model)  # on the CPU it runs the model as is
    with torch.no_grad(), hookscope.capture(wrapped, "blocks.0.resid_post") as rec:
        wrapped(IDS)
    with torch.no_grad(), hookscope.capture(model, "transformer.h.0") as direct:
        model(IDS)
    assert torch.equal(rec["blocks.0.resid_post"].output, direct["transformer.h.0"].output
                       if isinstance(direct["transformer.h.0"].output, torch.Tensor)
                       else direct["transformer.h.0"].output[0])
    assert hook_count(model) == 0


def test_trace_on_the_command_line_takes_component_names(tmp_path, capsys, monkeypatch):
    from hookscope.cli import main

    config = T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    T.GPT2LMHeadModel(config).save_pretrained(tmp_path / "lm")
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "hf:causal-lm", "--config", "lm", "--layers", "blocks.*.resid_post",
                 "blocks.0.attn.head.1.z", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["module"], r["shape"]) for r in rows] == [("blocks.0.attn.head.1.z", [1, 16, 16]),
                                                          ("blocks.0.resid_post", [1, 16, 32]),
                                                          ("blocks.1.resid_post", [1, 16, 32])]
    assert main(["trace", "hf:causal-lm", "--config", "lm", "--layers", "blocks.2.resid_post"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("hookscope trace: error: no component 'blocks.2.resid_post': this GPT2LMHeadModel has 2 blocks, "
                   "blocks.0 to blocks.1")


# adversarial: shared holding modules, capture with edit, heads, gradients, calls, dtypes, modes ---------------------

def tiny_gpt2(attention: str = "eager", layers: int = 2) -> nn.Module:
    config = T.GPT2Config(n_layer=layers, n_embd=16, n_head=2, vocab_size=30, n_positions=32)
    config._attn_implementation = attention
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(config).eval()


def with_hook(model: nn.Module, path: str, run: Callable[[], Any], pre: Any = None, post: Any = None) -> Any:
    """``run()`` with a hand-written pre- or forward hook on ``path``, removed after."""
    target = model.get_submodule(path)
    handle = target.register_forward_pre_hook(pre) if pre else target.register_forward_hook(post)
    try:
        return run()
    finally:
        handle.remove()


def test_the_whole_z_and_one_heads_z_on_one_module_both_hold_the_projections_input():
    model = tiny_gpt2()
    store = {}
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.z", "blocks.0.attn.head.1.z") as rec:
        with_hook(model, "transformer.h.0.attn.c_proj", lambda: model(IDS[:1]),
                  pre=lambda m, a: store.__setitem__("x", a[0].clone()))
    assert torch.equal(rec["blocks.0.attn.z"].output, store["x"].unflatten(-1, (2, 8)))
    assert torch.equal(rec["blocks.0.attn.head.1.z"].output, store["x"][..., 8:])
    assert hook_count(model) == 0


def test_two_edits_on_one_module_are_both_written_the_later_on_what_the_earlier_wrote():
    model = tiny_gpt2()
    with torch.no_grad(), hookscope.edit(model, ["blocks.0.attn.z", "blocks.0.attn.head.1.z"],
                                         output=lambda v: v * 0 if v.dim() == 3 else v * 2):
        got = model(IDS).logits

    def by_hand(m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[..., :8] *= 2
        x[..., 8:] = 0
        return (x,)

    with torch.no_grad():
        want = with_hook(model, "transformer.h.0.attn.c_proj", lambda: model(IDS).logits, pre=by_hand)
    assert torch.equal(got, want) and hook_count(model) == 0


def test_resid_post_and_the_next_resid_pre_are_one_tensor_and_an_edit_of_one_reaches_the_other():
    model = tiny_gpt2()
    with torch.no_grad():
        plain = model(IDS, output_hidden_states=True).hidden_states[1]
        before = hook_count(model)  # transformers leaves its own hooks for output_hidden_states
        with hookscope.capture(model, "blocks.0.resid_post", "blocks.1.resid_pre") as rec:
            model(IDS)
        assert torch.equal(rec["blocks.0.resid_post"].output, plain)
        assert torch.equal(rec["blocks.1.resid_pre"].output, plain)
        # a capture entered inside the edit sees the edited stream on both names
        with hookscope.edit(model, "blocks.0.resid_post", output=torch.zeros_like):
            with hookscope.capture(model, "blocks.0.resid_post", "blocks.1.resid_pre") as inner:
                model(IDS)
        # entered before the edit, the capture of the edited name holds the model's own value, as a
        # module's capture does; the next block's input is the stream the edit left
        with hookscope.capture(model, "blocks.0.resid_post", "blocks.1.resid_pre", "transformer.h.0") as outer:
            with hookscope.edit(model, "blocks.0.resid_post", output=torch.zeros_like):
                model(IDS)
    assert not inner["blocks.0.resid_post"].output.any() and not inner["blocks.1.resid_pre"].output.any()
    assert torch.equal(outer["blocks.0.resid_post"].output, plain)
    block_out = outer["transformer.h.0"].output
    assert torch.equal(block_out[0] if isinstance(block_out, tuple) else block_out, plain)
    assert not outer["blocks.1.resid_pre"].output.any()
    assert hook_count(model) == before


def test_an_edit_of_a_component_inside_a_capture_of_its_module_follows_the_modules_hook_order():
    model = tiny_gpt2()
    with torch.no_grad():
        with hookscope.edit(model, "blocks.0.attn.z", output=torch.zeros_like):
            with hookscope.capture(model, "transformer.h.0.attn.c_proj", keep="input") as inner:
                model(IDS)
        with hookscope.capture(model, "transformer.h.0.attn.c_proj", keep="input") as outer:
            with hookscope.edit(model, "blocks.0.attn.z", output=torch.zeros_like):
                model(IDS)
    assert not inner["transformer.h.0.attn.c_proj"].input.any()
    assert outer["transformer.h.0.attn.c_proj"].input.abs().max() > 0
    assert hook_count(model) == 0


def test_at_takes_the_last_position_of_a_heads_view_and_an_edit_there_writes_only_it():
    model = tiny_gpt2()
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.z", "blocks.0.attn.head.1.z",
                                            at=hookscope.at[:, -1]) as rec, hookscope.capture(model, "blocks.0.attn.z") as full:
        model(IDS)
    assert torch.equal(rec["blocks.0.attn.z"].output, full["blocks.0.attn.z"].output[:, -1])
    assert torch.equal(rec["blocks.0.attn.head.1.z"].output, full["blocks.0.attn.z"].output[:, -1, 1])

    def last(m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[:, -1, 8:] = 0
        return (x,)

    with torch.no_grad():
        with hookscope.edit(model, "blocks.0.attn.head.1.q", output=torch.zeros_like, at=hookscope.at[:, -1]):
            pass
        with hookscope.edit(model, "blocks.0.attn.head.1.z", output=torch.zeros_like, at=hookscope.at[:, -1]):
            got = model(IDS).logits
        want = with_hook(model, "transformer.h.0.attn.c_proj", lambda: model(IDS).logits, pre=last)
    assert torch.equal(got, want) and hook_count(model) == 0


def test_grad_output_of_fused_heads_with_an_in_place_op_after_is_the_gradient_the_model_takes():
    model = tiny_gpt2()
    store = {}

    def keep(m: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out.register_hook(lambda g: store.__setitem__("g", g))
        return out

    def doubled(m: nn.Module, a: Any, out: torch.Tensor) -> None:
        out.mul_(2)  # in place, after the heads were read

    c_attn = model.transformer.h[0].attn.c_attn
    handles = [c_attn.register_forward_hook(keep), c_attn.register_forward_hook(doubled)]
    model(IDS).logits.sum().backward()
    for h in handles:
        h.remove()
    names = ["blocks.0.attn.head.1.q", "blocks.0.attn.head.0.k", "blocks.0.attn.v"]
    with hookscope.capture(model, *names, keep="grad_output") as rec:
        with_hook(model, "transformer.h.0.attn.c_attn", lambda: model(IDS).logits.sum().backward(), post=doubled)
    g = store["g"]
    assert close(rec["blocks.0.attn.head.1.q"].grad_output, g[..., 8:16])
    assert close(rec["blocks.0.attn.head.0.k"].grad_output, g[..., 16:24])
    assert close(rec["blocks.0.attn.v"].grad_output, g[..., 32:].unflatten(-1, (2, 8)))
    assert hook_count(model) == 0


def test_a_model_run_twice_in_one_block_gives_one_call_each_and_generation_one_per_step():
    model = tiny_gpt2()
    with torch.no_grad(), hookscope.capture(model, "blocks.1.resid_post", "blocks.0.attn.head.0.z") as rec:
        model(IDS)
        model(IDS[:, :3])
    assert [c.output.shape[1] for c in rec["blocks.1.resid_post"]] == [6, 3]
    assert [c.output.shape for c in rec["blocks.0.attn.head.0.z"]] == [(2, 6, 8), (2, 3, 8)]
    with torch.no_grad(), hookscope.capture(model, "blocks.1.resid_post", "blocks.1.attn.head.1.pattern") as gen:
        out = model.generate(IDS[:1], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert [tuple(c.output.shape) for c in gen["blocks.1.resid_post"]] == [(1, 6, 16), (1, 1, 16), (1, 1, 16)]
    assert [tuple(c.output.shape) for c in gen["blocks.1.attn.head.1.pattern"]] == [(1, 6, 6), (1, 1, 7), (1, 1, 8)]
    with torch.no_grad(), hookscope.capture(model, "transformer.h.1") as whole:  # no cache: all tokens at once
        model(out[:, :8])
    hidden = whole["transformer.h.1"].output
    hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    assert close(gen["blocks.1.resid_post"][2].output[0, -1], hidden[0, 7])
    assert hook_count(model) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_check_and_edit_a_head_as_a_hand_hook_does(dtype):
    model = tiny_gpt2().to(dtype)
    assert hookscope.components(model).errors
    with torch.no_grad(), hookscope.edit(model, "blocks.0.attn.head.1.z", output=lambda v: v * 3) as e:
        got = model(IDS).logits

    def tripled(m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[..., 8:] *= 3
        return (x,)

    with torch.no_grad():
        want = with_hook(model, "transformer.h.0.attn.c_proj", lambda: model(IDS).logits, pre=tripled)
    assert e.counts == {"blocks.0.attn.head.1.z": 1} and got.dtype == dtype and torch.equal(got, want)
    with pytest.raises(HookscopeError, match="return a tensor of that shape and dtype"):
        with torch.no_grad(), hookscope.edit(model, "blocks.0.attn.head.1.z", output=lambda v: v.float()):
            model(IDS)
    assert hook_count(model) == 0


def test_the_first_use_check_on_a_training_model_keeps_its_modes_and_the_random_state():
    model = tiny_gpt2()
    model.train()
    model.transformer.h[1].eval()  # a mix of modes, put back as it was
    torch.manual_seed(7)
    state = torch.get_rng_state()
    with hookscope.capture(model, "blocks.0.resid_post"):
        pass
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training and model.transformer.h[0].attn.attn_dropout.training
    assert not model.transformer.h[1].training
    assert hook_count(model) == 0


def test_a_replaced_module_after_the_memo_is_the_one_hooked():
    model = tiny_gpt2()
    with torch.no_grad(), hookscope.capture(model, "blocks.0.mlp_out"):
        model(IDS)
    torch.manual_seed(1)
    model.transformer.h[0].mlp.c_proj = T.pytorch_utils.Conv1D(16, 64)
    with torch.no_grad(), hookscope.capture(model, "blocks.0.mlp_out", "transformer.h.0.mlp.c_proj") as rec:
        model(IDS)
    assert torch.equal(rec["blocks.0.mlp_out"].output, rec["transformer.h.0.mlp.c_proj"].output)
    assert hook_count(model) == 0


def test_two_threads_capturing_two_models_each_get_their_own_values():
    import threading
    models = [tiny_gpt2(), tiny_gpt2(layers=3)]
    got: list[Any] = [None, None]
    errors: list[str] = []
    with torch.no_grad():
        want = [m(IDS[:, :3 + i], output_hidden_states=True).hidden_states[1] for i, m in enumerate(models)]
    before = [hook_count(m) for m in models]  # transformers leaves its own hooks for output_hidden_states

    def run(i: int) -> None:
        try:
            for _ in range(4):
                with torch.no_grad(), hookscope.capture(models[i], "blocks.*.attn.head.1.z", "blocks.0.resid_post") as r:
                    models[i](IDS[:, :3 + i])
                got[i] = (len(r.selected), torch.equal(r["blocks.0.resid_post"].output, want[i]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == [(3, True), (4, True)]
    assert [hook_count(m) for m in models] == before


def test_a_compiled_model_gives_the_eager_values():
    model = tiny_gpt2()
    compiled = torch.compile(model, backend="eager")
    names = ("blocks.0.resid_post", "blocks.0.attn.head.1.z")
    with torch.no_grad():
        with hookscope.capture(model, *names) as eager:
            model(IDS)
        with hookscope.capture(compiled, *names) as rec:
            compiled(IDS)
        with hookscope.edit(model, "blocks.0.attn.head.1.z", output=torch.zeros_like):
            want = model(IDS).logits
        with hookscope.edit(compiled, "blocks.0.attn.head.1.z", output=torch.zeros_like):
            got = compiled(IDS).logits
    assert all(torch.equal(rec[n].output, eager[n].output) for n in names)
    assert close(got, want) and hook_count(model) == 0


def test_a_glob_reaching_the_pattern_of_an_sdpa_model_says_so_in_one_line_and_leaves_no_hook():
    model = tiny_gpt2("sdpa")
    with pytest.raises(HookscopeError, match="only eager attention returns its weights") as e:
        with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.*"):
            model(IDS)
    assert "\n" not in str(e.value) and hook_count(model) == 0
    with torch.no_grad(), hookscope.capture(model, "blocks.0.attn.z") as rec:  # the rest reads as with eager
        model(IDS)
    assert rec["blocks.0.attn.z"].output.shape == (2, 6, 2, 8)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_encoder_names_are_the_models_hidden_states_and_attentions(family):
    config = (T.BertConfig if family == "bert" else T.RobertaConfig)(
        num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=40)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = (T.BertForMaskedLM if family == "bert" else T.RobertaForMaskedLM)(config).eval()
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    with torch.no_grad():
        want = model(ids, output_hidden_states=True, output_attentions=True)
        with hookscope.capture(model, "blocks.*.resid_post", "blocks.1.attn.pattern", "blocks.0.attn.head.1.pattern",
                               "unembed") as rec:
            model(ids)
    assert all(torch.equal(rec[f"blocks.{i}.resid_post"].output, want.hidden_states[i + 1]) for i in range(2))
    assert torch.equal(rec["blocks.1.attn.pattern"].output, want.attentions[1])
    assert torch.equal(rec["blocks.0.attn.head.1.pattern"].output, want.attentions[0][:, 1])
    assert torch.equal(rec["unembed"].output, want.logits)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError, GeneratorExit])
def test_an_exception_inside_a_change_leaves_no_hook(raised):
    model = tiny_gpt2()

    def boom(v: torch.Tensor) -> torch.Tensor:
        raise raised("stop")

    for name in ("blocks.0.attn.head.0.z", "blocks.1.resid_pre", "blocks.0.attn.q"):
        with pytest.raises(BaseException):
            with torch.no_grad(), hookscope.edit(model, name, output=boom), hookscope.capture(model, name):
                model(IDS)
        assert hook_count(model) == 0


def test_component_and_components_take_one_heads_name_as_selectors_do():
    model = tiny_gpt2()
    comps = hookscope.components(model)
    one = hookscope.component(model, "blocks.0.attn.head.1.z")
    assert (one.name, one.module, one.field, one.head) == ("blocks.0.attn.head.1.z", "transformer.h.0.attn.c_proj",
                                                           "input", 1)
    assert one.view == comps["blocks.0.attn.z"].view and comps["blocks.1.attn.head.0.k"].head == 0
    assert "blocks.0.attn.head.1.pattern" in comps and "blocks.0.attn.head.2.z" not in comps
    assert len(comps) == len(list(comps))  # iterating gives the whole components only
    with pytest.raises(HookscopeError, match=r"holds 2 query heads, head.0 to head.1"):
        hookscope.component(model, "blocks.0.attn.head.2.z")
    with pytest.raises(HookscopeError, match="has 2 blocks"):
        comps["blocks.5.attn.head.0.z"]
    with pytest.raises(HookscopeError, match="cannot be edited"):  # one head's pattern is the pattern, read only
        hookscope.edit(model, "blocks.0.attn.head.1.pattern", output=torch.zeros_like)
    assert hook_count(model) == 0


def test_layers_on_the_command_line_shows_the_shape_of_each_component_it_selects(tmp_path, capsys, monkeypatch):
    import json

    from hookscope.cli import main

    config = T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    T.GPT2LMHeadModel(config).save_pretrained(tmp_path / "lm")
    monkeypatch.chdir(tmp_path)
    assert main(["layers", "hf:causal-lm", "--config", "lm", "blocks.1.attn.*", "--json"]) == 0
    rows = {r["name"]: r["output"] for r in json.loads(capsys.readouterr().out)}
    assert rows["blocks.1.attn.z"] == "1x16x2x16" and rows["blocks.1.attn.k"] == "1x16x2x16"
    assert rows["blocks.1.attn.pattern"] == "none (eager attention only)"  # the folder's model runs SDPA
    assert "not called" not in rows.values() and len(rows) == 5
    assert main(["layers", "hf:causal-lm", "--config", "lm", "blocks.0.attn.head.1.z"]) == 0
    out = capsys.readouterr().out
    assert "blocks.0.attn.head.1.z" in out and "not called" not in out


def test_a_data_parallel_model_gives_the_values_of_the_model_inside():
    model = tiny_gpt2()
    wrapped = nn.DataParallel(model)
    with torch.no_grad():
        with hookscope.capture(model, "blocks.0.resid_post", "blocks.1.attn.head.0.q") as plain:
            model(IDS)
        with hookscope.capture(wrapped, "blocks.0.resid_post", "blocks.1.attn.head.0.q") as rec:
            wrapped(IDS)
    assert list(rec.selected) == list(plain.selected)
    assert all(torch.equal(rec[n].output, plain[n].output) for n in plain.selected)
    assert hook_count(model) == 0
