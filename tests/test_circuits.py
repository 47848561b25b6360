"""The circuit analyses: the logit lens against the model's own logits on every decoder family and
against the final norm computed by hand (its scale recomputed per stream, beside the reused-scale
value that is wrong); direct logit attribution summing to the logit exactly, each head's term by hand;
patching sweeps exact at their ends (every activation patched gives the clean metric, none the
corrupted one) and batched equal to a loop of edit calls; attribution patching by its completeness;
bad input refused in one line; no hook left."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.circuits import activation_patching, attribution_patching, logit_attribution, logit_lens

from helpers import no_hooks

transformers = pytest.importorskip("transformers")
T = transformers

SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=50)
GQA = dict(SMALL, num_key_value_heads=2)
CONFIGS: dict[str, Callable[[], Any]] = {
    "gpt2": lambda: T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32, initializer_range=0.2),
    "gpt_neox": lambda: T.GPTNeoXConfig(**SMALL),
    "llama": lambda: T.LlamaConfig(**GQA),
    "qwen2": lambda: T.Qwen2Config(**GQA),
    "gemma": lambda: T.GemmaConfig(**GQA, head_dim=8),
    "gemma2": lambda: T.Gemma2Config(**GQA, head_dim=8, final_logit_softcapping=3.0),
    "olmo2": lambda: T.Olmo2Config(**SMALL),
    "phi": lambda: T.PhiConfig(**SMALL),
}
IDS = torch.tensor([1, 7, 3, 9, 4, 2])


def build(family: str, attention: str = "eager") -> nn.Module:
    config = CONFIGS[family]()
    config._attn_implementation = attention
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config).eval()


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids.reshape(1, -1)).logits[0]


# --- the logit lens --------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_last_streams_lens_is_the_models_logits(family):
    model = build(family)
    lens = logit_lens(model, IDS)
    assert lens.streams == ["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"]
    want = logits(model, IDS)
    assert float((lens.logits[-1] - want).abs().max()) <= 1e-5  # Gemma2: its final soft cap applied
    assert torch.all(lens.kl[-1].abs() <= 1e-6) and torch.all(lens.ranks[-1] == 0)
    assert no_hooks(model)


def test_the_lens_recomputes_the_final_norms_scale_for_each_stream_and_the_reused_scale_is_wrong():
    model = build("gpt2")
    lens = logit_lens(model, IDS)
    with hookscope.capture(model, "transformer.h.0", keep="input") as rec, torch.no_grad():
        model(IDS[None])
    first = rec["transformer.h.0"][0].input[0].double()  # blocks.0.resid_pre: the embeddings
    ln, w_u = model.transformer.ln_f, model.lm_head.weight.detach().double()
    mean, var = first.mean(-1, keepdim=True), first.var(-1, unbiased=False, keepdim=True)
    right = ((first - mean) / (var + ln.eps).sqrt() * ln.weight.detach().double() + ln.bias.detach().double()) @ w_u.t()
    assert float((lens.logits[0].double() - right).abs().max()) <= 1e-5
    # the scale of the last stream, reused for the first (a cache of the final norm's scale)
    with hookscope.capture(model, "transformer.ln_f", keep="input") as rec, torch.no_grad():
        model(IDS[None])
    final = rec["transformer.ln_f"][0].input[0].double()
    reused = ((first - mean) / (final.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt() * ln.weight.detach().double()
              + ln.bias.detach().double()) @ w_u.t()
    scales = (var.sqrt() / final.var(-1, unbiased=False, keepdim=True).sqrt()).flatten()
    assert float(scales.min()) < 0.5 or float(scales.max()) > 2  # the streams' scales differ
    assert float((reused - right).abs().max()) > 0.1  # the reused scale gives other logits
    assert no_hooks(model)


def test_the_lens_rows_are_the_probability_rank_and_kl_by_hand():
    model = build("llama")
    lens = logit_lens(model, IDS, token=7, top=3)
    row = lens["blocks.0.resid_post"][2]
    logp = torch.log_softmax(lens.logits[1, 2].double(), -1)
    final = torch.log_softmax(logits(model, IDS)[2].double(), -1)
    assert row.prob == pytest.approx(float(logp[7].exp()), abs=1e-6)
    assert row.rank == int((logp > logp[7]).sum())
    assert row.kl == pytest.approx(float((final.exp() * (final - logp)).sum()), abs=1e-5)
    assert list(row.top) == logp.topk(3).indices.tolist() and row.token == 7
    assert "blocks.0.resid_post" in lens and len(lens.rows) == 3 * len(IDS)
    assert lens.to_json().startswith("{") and "logit lens" in lens.table()


def test_the_lens_refuses_bad_input_in_one_line():
    model = build("gpt2")
    for bad, words in [(torch.ones(2, 3, dtype=torch.long), "one sequence"), (torch.ones(3), "token ids")]:
        with pytest.raises(hookscope.HookscopeError, match=words) as e:
            logit_lens(model, bad)
        assert "\n" not in str(e.value)
    with pytest.raises(hookscope.HookscopeError, match="outside the vocabulary"):
        logit_lens(model, IDS, token=99)
    bert = T.BertForMaskedLM(T.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                          intermediate_size=64, vocab_size=50)).eval()
    with pytest.raises(hookscope.SelectionError, match="final norm|norm after every sum"):
        logit_lens(bert, IDS)
    assert no_hooks(model) and no_hooks(bert)


# --- direct logit attribution ------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_terms_sum_to_the_logit_difference_exactly(family):
    model = build(family)
    dla = logit_attribution(model, IDS, answer=3, wrong=5)
    with hookscope.capture(model, hookscope.component(model, "unembed").module) as rec, torch.no_grad():
        model(IDS[None])
    raw = rec[hookscope.component(model, "unembed").module][0].output[0, -1].double()  # before any soft cap
    assert dla.logit == pytest.approx(float(raw[3] - raw[5]), abs=1e-5)
    assert abs(dla.total - dla.logit) <= 1e-5
    if dla.norm == "RMSNorm":
        assert dla.centring == 0.0  # an RMSNorm does not centre
    assert dla.capped == (family == "gemma2")
    heads = [r for r in dla.rows if r.head >= 0]
    assert bool(heads) == (family not in ("gemma2", "olmo2"))  # a norm after attention: attn_out is one term
    assert no_hooks(model)


def test_a_heads_term_is_its_z_through_its_rows_of_the_output_projection_through_the_frozen_norm():
    model = build("gpt2")
    dla = logit_attribution(model, IDS, answer=3)
    comps = hookscope.components(model)
    with hookscope.capture(model, "transformer.h.1.attn.c_proj", "transformer.ln_f", keep="input") as rec, \
            torch.no_grad():
        model(IDS[None])
    z = comps["blocks.1.attn.z"].view.read(rec["transformer.h.1.attn.c_proj"][0].input)[0, -1, 1].double()
    w_o = model.transformer.h[1].attn.c_proj.weight.detach().double()[32 // 2:]  # head 1's rows of Conv1D's [in, out]
    stream = rec["transformer.ln_f"][0].input[0, -1].double()
    ln = model.transformer.ln_f
    term = z @ w_o
    by_hand = ((term - term.mean()) / (stream.var(unbiased=False) + ln.eps).sqrt() * ln.weight.detach().double()) \
        @ model.lm_head.weight.detach().double()[3]
    assert dla["blocks.1.head.1"] == pytest.approx(float(by_hand), abs=1e-6)
    # the raw sum of the uncentred terms is the logit plus what centring took out
    uncentred = sum(r.value for r in dla.rows) + dla.centring
    assert dla.centring != 0.0 and uncentred == pytest.approx(dla.total + dla.centring)
    assert dla.heads().shape == (2, 2)


def test_logit_attribution_refuses_bad_tokens_and_positions():
    model = build("gpt2")
    with pytest.raises(hookscope.HookscopeError, match="answer=99"):
        logit_attribution(model, IDS, answer=99)
    with pytest.raises(hookscope.HookscopeError, match="position=6"):
        logit_attribution(model, IDS, answer=3, position=6)
    with pytest.raises(hookscope.RecordError, match="no term"):
        logit_attribution(model, IDS, answer=3)["blocks.9.head.0"]
    assert no_hooks(model)


# --- activation patching -----------------------------------------------------------------------------
CLEAN, CORRUPTED = torch.tensor([1, 7, 3, 9, 4, 2]), torch.tensor([1, 7, 8, 9, 4, 2])


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_patching_a_whole_stream_gives_the_other_runs_metric_and_patching_what_is_equal_changes_nothing(family,
                                                                                                       direction):
    model = build(family)
    every = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="resid_pre", per="layer",
                                direction=direction)
    other = every.clean if direction == "denoise" else every.corrupted
    assert torch.allclose(every.values, torch.full_like(every.values, other), atol=1e-5)
    cells = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="resid_pre", direction=direction,
                                batch_size=5)
    base = every.base
    assert torch.allclose(cells.values[:, :2], torch.full((2, 2), base, dtype=torch.float64), atol=1e-5)  # same
    assert cells.values[0, 2] == pytest.approx(other, abs=1e-5)  # block 0, the one position that differs
    assert abs(float(cells.values[1, 5]) - base) > 1e-3
    assert no_hooks(model)


@pytest.mark.parametrize("kind", ["resid_pre", "attn_out", "mlp_out", "attn.z", "attn.v"])
def test_a_batched_sweep_equals_a_loop_of_edit_calls(kind):
    model = build("gpt2")
    swept = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component=kind, batch_size=4)
    comps = hookscope.components(model)
    for layer in range(2):
        c = comps[f"blocks.{layer}.{kind}"]
        with hookscope.capture(model, c.module, keep="io") as rec, torch.no_grad():
            model(CLEAN[None])
        kept = rec[c.module][0]
        source = c.view.read(kept.input if c.field == "input" else kept.output)
        for col in range(len(swept.columns)):
            def change(old, col=col, c=c, source=source):
                t = c.view.read(old).clone()
                if c.view.heads:
                    t[:, :, col] = source[:, :, col]
                else:
                    t[:, col] = source[:, col]
                return c.view.write(old, t)
            with hookscope.edit(model, c.module, **{"input" if c.field == "input" else "output": change}), \
                    torch.no_grad():
                out = model(CORRUPTED[None]).logits[0, -1]
            assert float(swept.values[layer, col]) == pytest.approx(float(out[3] - out[5]), abs=1e-5)
    assert no_hooks(model)


def test_all_heads_of_a_layer_are_its_attention_output_and_kinds_make_a_layer_by_kind_grid():
    model = build("llama")
    z = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.z", per="layer")
    out = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn_out", per="layer")
    both = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component=("attn_out", "mlp_out"))
    assert torch.allclose(z.values, out.values, atol=1e-5)
    assert torch.allclose(both.values[:, :1], out.values, atol=1e-5)
    assert both.columns == ["attn_out", "mlp_out"] and both.per == "layer"
    heads = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.z")
    assert heads.values.shape == (2, 4) and heads.columns == ["0", "1", "2", "3"]
    kv = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.k")
    assert kv.values.shape == (2, 2)  # grouped-query attention: two key heads
    assert no_hooks(model)


def test_patching_every_pattern_of_a_layer_with_its_values_patched_too_is_patching_z():
    model = build("gpt2")
    pattern = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.pattern", per="layer")
    assert not torch.allclose(pattern.values, torch.full_like(pattern.values, pattern.corrupted), atol=1e-4)
    # the pattern of the clean run applied to the corrupted run's values, checked by hand on block 1
    comps = hookscope.components(model)
    with hookscope.capture(model, "transformer.h.1.attn", keep="output") as rec, torch.no_grad():
        model(CLEAN[None])
    clean_pattern = rec["transformer.h.1.attn"][0].output[1]
    seen = {}

    def keep_v(old):
        seen["v"] = comps["blocks.1.attn.v"].view.read(old)

    def mix(old):
        return comps["blocks.1.attn.z"].view.write(old, torch.einsum("bhqk,bkhd->bqhd", clean_pattern, seen["v"]))
    with hookscope.edit(model, "transformer.h.1.attn.c_attn", output=keep_v), \
            hookscope.edit(model, "transformer.h.1.attn.c_proj", input=mix), torch.no_grad():
        out = model(CORRUPTED[None]).logits[0, -1]
    assert float(pattern.values[1, 0]) == pytest.approx(float(out[3] - out[5]), abs=1e-5)
    assert no_hooks(model)


def test_metrics_by_name_and_by_function_agree():
    model = build("gpt2")
    prob = activation_patching(model, CLEAN, CORRUPTED, answer=3, metric="prob", component="attn_out")
    fn = activation_patching(model, CLEAN, CORRUPTED, metric=lambda lg: lg[0, -1].softmax(-1)[3], component="attn_out")
    assert torch.allclose(prob.values, fn.values, atol=1e-7)
    with torch.no_grad():
        assert prob.clean == pytest.approx(float(logits(model, CLEAN)[-1].softmax(-1)[3]), abs=1e-6)


def test_bad_sweeps_are_refused_in_one_line_and_leave_no_hook():
    model = build("gpt2")
    neox = build("gpt_neox")
    sdpa = build("gpt2", attention="sdpa")
    cases = [
        (lambda: activation_patching(model, CLEAN, CLEAN[:5], answer=3, wrong=5), "6 and 5 tokens"),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, metric=lambda lg: lg[0, -1]), "one number"),
        (lambda: activation_patching(neox, CLEAN, CORRUPTED, answer=3, wrong=5, component="resid_mid"), "in parallel"),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="resid"), "not a component"),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="mlp_out", per="head"),
         "has no heads"),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, answer=3), "needs wrong="),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, direction="up"), "direction="),
        (lambda: activation_patching(sdpa, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.pattern"), "eager"),
        (lambda: attribution_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, steps=-1), "steps=-1"),
        (lambda: activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, batch_size=0), "batch_size=0"),
    ]
    for call, words in cases:
        with pytest.raises(hookscope.HookscopeError, match=words) as e:
            call()
        assert "\n" not in str(e.value)
    assert no_hooks(model) and no_hooks(neox) and no_hooks(sdpa)


# --- attribution patching -----------------------------------------------------------------------------
def test_integrated_gradients_along_the_embeddings_path_is_complete():
    """The whole first stream is the path itself: its cell's estimate integrates the gradient from one
    prompt to the other, so it tends to the real change (right Riemann sum: error of order 1 / steps)."""
    model = build("gpt2")
    errors = []
    for steps in (16, 64):
        est = attribution_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="resid_pre", per="layer",
                                   steps=steps, batch_size=32)
        errors.append(abs(float(est.values[0, 0]) - est.clean))
    gap = abs(est.clean - est.corrupted)
    assert gap > 1e-2 and errors[1] <= 0.15 * gap
    assert 3 <= errors[0] / errors[1] <= 5  # four times the steps, a quarter of the error
    assert no_hooks(model)


def test_the_first_order_estimate_is_the_gradient_dotted_with_the_change():
    model = build("gpt2")
    est = attribution_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn_out")
    comps = hookscope.components(model)
    c = comps["blocks.0.attn_out"]
    with hookscope.capture(model, c.module) as rec, torch.no_grad():
        model(CLEAN[None])
    clean_out = c.view.read(rec[c.module][0].output)
    held = {}

    def leaf(old):
        t = c.view.read(old)
        held["t"] = t
        return c.view.write(old, t)
    with hookscope.edit(model, c.module, output=leaf):
        out = model(CORRUPTED[None]).logits[0, -1]
        metric = out[3] - out[5]
    grad, = torch.autograd.grad(metric, held["t"])
    product = (grad * (clean_out - held["t"].detach())).double()[0].sum(-1)
    assert torch.allclose(est.values[0] - est.corrupted, product, atol=1e-5)
    real = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn_out")
    assert -1 <= real.correlation(est) <= 1
    assert no_hooks(model)


def test_the_patching_result_speaks_the_protocol():
    model = build("gpt2")
    p = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.z")
    assert p["blocks.1"].shape == (2,) and "blocks.1" in p and "blocks.2" not in p
    with pytest.raises(hookscope.RecordError, match="no layer"):
        p["blocks.2"]
    assert len(p.rows) == 4 and p.to_dict()["values"] == p.values.tolist()
    assert p.table().splitlines()[0].startswith("activation patching of attn.z per head, denoise")
    assert p.to_json().startswith("{")
    layer, col, effect = p.top(1)[0]
    assert effect == pytest.approx(float(p.effects.abs().max()) * (1 if effect > 0 else -1))


def test_each_result_draws_its_picture_in_a_notebook():
    pytest.importorskip("matplotlib")
    from hookscope.core.result import picture_of

    model = build("gpt2")
    for result in (activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.z"),
                   logit_lens(model, IDS), logit_attribution(model, IDS, answer=3)):
        assert picture_of(result)[:4] == b"\x89PNG"
        assert "<img" in result._repr_html_()


# --- the command line ---------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    build("gpt2").save_pretrained(tmp_path / "lm")
    return str(tmp_path / "lm")


def test_the_commands_print_json_the_library_gives(saved, capsys):
    import json

    from hookscope.cli import main

    assert main(["lens", "hf:causal-lm", "--config", saved, "--input-ids", "1 7 3 9 4 2", "--token", "4", "--json"]) == 0
    lens = json.loads(capsys.readouterr().out)
    model = T.AutoModelForCausalLM.from_pretrained(saved).eval()
    want = logit_lens(model, IDS, token=4)
    assert [r["rank"] for r in lens["rows"]] == [r.rank for r in want.rows]
    assert main(["patch", "hf:causal-lm", "--config", saved, "--clean", "1 7 3 9 4 2", "--corrupted", "1 7 8 9 4 2",
                 "--answer", "3", "--wrong", "5", "--component", "attn.z", "--attribution", "--steps", "4",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    real = activation_patching(model, CLEAN, CORRUPTED, answer=3, wrong=5, component="attn.z")
    assert torch.allclose(torch.tensor(out["patching"]["values"], dtype=torch.float64), real.values, atol=1e-5)
    assert -1 <= out["correlation"] <= 1 and out["attribution"]["method"] == "eap-ig"


def test_the_commands_refuse_bad_input_in_one_line(saved, capsys):
    from hookscope.cli import main

    for argv, words in [(["patch", "hf:causal-lm", "--config", saved, "--clean", "1 7 3", "--corrupted", "1 7",
                          "--answer", "3", "--wrong", "5"], "3 and 2 tokens"),
                        (["patch", "hf:causal-lm", "--config", saved, "--clean", "the cat", "--corrupted", "a dog",
                          "--answer", "3", "--wrong", "5"], "not token ids"),
                        (["lens", "hf:causal-lm", "--config", saved, "--input-ids", "1 2", "--position", "5"],
                         "--position 5")]:
        assert main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
