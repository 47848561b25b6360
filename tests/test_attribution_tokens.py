"""``hookscope.attribute_tokens`` and ``hookscope.targets.Token``: per-token scores for the next token of a
language model and for each token of a greedy continuation, compared with captum's layer methods, with
the score's own change (completeness) worked out on ``inputs_embeds``, and with separate calls on each
prefix."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.targets import Token

from helpers import no_hooks, rel

transformers = pytest.importorskip("transformers")
captum_attr = pytest.importorskip("captum.attr")
T: Any = transformers


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tensors this small go faster on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    T.utils.logging.set_verbosity_error()
    yield
    torch.set_num_threads(n)



def _rel_detached(a: torch.Tensor, b: torch.Tensor) -> float:
    return rel(a.detach(), b.detach())


@pytest.fixture(scope="module")
def gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel(config).eval()


IDS = torch.tensor([[5, 7, 9, 11], [3, 4, 2, 8]])


def _logit(model: nn.Module, token: list[int], **inputs: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits[:, -1].gather(1, torch.tensor(token)[:, None])[:, 0]


# --- the Token target --------------------------------------------------------------------------------
def test_a_token_target_reads_one_logit_per_sequence():
    logits = torch.arange(2 * 3 * 4, dtype=torch.float).reshape(2, 3, 4)  # logits[b, t, v] = 12b + 4t + v
    assert Token(1)(logits).tolist() == [9.0, 21.0]
    assert Token([0, 3], position=0)(logits).tolist() == [0.0, 15.0]
    assert Token(2, position=-2)({"logits": logits}).tolist() == [6.0, 18.0]
    assert Token([1, 2]).take(torch.tensor([1, 1, 0]))(torch.cat([logits, logits[:1]])).tolist() == [10.0, 22.0, 9.0]
    assert Token(3).take(torch.tensor([0, 0])) is not None and Token(3).token_ids == 3


@pytest.mark.parametrize(("make", "said"), [
    (lambda l: Token(4)(l), "token id 4 (sample 0) is out of range: the model's vocabulary has 4 tokens"),
    (lambda l: Token(1, position=3)(l), "position=3 is out of range for 3 positions"),
    (lambda l: Token(-1), "token id -1 is negative"),
    (lambda l: Token(1.5), "token_id=1.5 is not a token id"),
    (lambda l: Token(1, position="last"), "position='last' must be an int"),
    (lambda l: Token([1, 2, 3])(l), "holds 3 token ids (one per sample) but the model's output has 2 rows"),
    (lambda l: Token(1)(l[:, 0]), "Token needs a language model's B x T x vocab logits, got 2x4"),
])
def test_a_token_target_refuses_in_one_line(make, said):
    with pytest.raises(hookscope.HookscopeError) as e:
        make(torch.zeros(2, 3, 4))
    assert said in str(e.value) and "\n" not in str(e.value)


# --- the next token ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_middle"])
def test_integrated_gradients_equal_captums_layer_integrated_gradients(gpt2, rule):
    res = hookscope.attribute_tokens(gpt2, IDS, steps=16, rule=rule, baseline=1)
    targets = [r.target for r in res.rows]
    with torch.no_grad():
        assert targets == gpt2(IDS).logits[:, -1].argmax(-1).tolist()  # the most likely next token
    lig = captum_attr.LayerIntegratedGradients(lambda i: gpt2(i).logits[:, -1], gpt2.transformer.wte)
    ref = lig.attribute(IDS, baselines=torch.ones_like(IDS), target=targets, n_steps=16, method=rule).sum(-1)
    assert res.scores.shape == (2, 4) and rel(res.scores, ref) <= 1e-5
    assert res.layer == "transformer.wte" and no_hooks(gpt2)


def test_the_default_baseline_is_zeros_at_the_embedding_as_captum_on_inputs_embeds(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS, steps=16, rule="gausslegendre", target=[6, 9])
    emb = gpt2.transformer.wte(IDS).detach()
    ig = captum_attr.IntegratedGradients(lambda e: gpt2(inputs_embeds=e).logits[:, -1])
    ref = ig.attribute(emb, baselines=torch.zeros_like(emb), target=[6, 9], n_steps=16, method="gausslegendre")
    assert _rel_detached(res.scores, ref.sum(-1)) <= 1e-5 and res.settings["baseline"] == "zeros"


def test_a_transformer_block_as_the_layer_equals_captum(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS, layers="transformer.h.0", method="input_x_gradient", target=6)
    ref = captum_attr.LayerGradientXActivation(lambda i: gpt2(i).logits[:, -1], gpt2.transformer.h[0])
    found = ref.attribute(IDS, target=6)
    found = found[0] if isinstance(found, tuple) else found
    assert res.layer == "transformer.h.0" and _rel_detached(res.scores, found.sum(-1)) <= 1e-5 and no_hooks(gpt2)


def test_the_scores_sum_to_the_change_of_the_logit_from_zero_embeddings(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS, steps=32, rule="gausslegendre", target=[17, 3])
    at_zero = _logit(gpt2, [17, 3], inputs_embeds=torch.zeros(2, 4, 32))  # the default baseline, worked out apart
    logit = _logit(gpt2, [17, 3], input_ids=IDS)
    delta = torch.tensor([r.delta for r in res.rows])
    assert torch.allclose(torch.tensor([r.logit for r in res.rows]), logit, atol=1e-6)
    assert torch.allclose(res.scores.sum(1) + delta, logit - at_zero, atol=1e-5)
    assert float(delta.abs().max()) < 1e-3 * float((logit - at_zero).abs().max())


def test_input_x_gradient_and_gradient_equal_the_embedding_times_its_gradient(gpt2):
    emb = gpt2.transformer.wte(IDS).detach().requires_grad_()
    score = gpt2(inputs_embeds=emb).logits[:, -1, 6].sum()
    (g,) = torch.autograd.grad(score, emb)
    x_g = hookscope.attribute_tokens(gpt2, IDS, method="input_x_gradient", target=6)
    grad = hookscope.attribute_tokens(gpt2, IDS, method="gradient", target=6)
    sal = hookscope.attribute_tokens(gpt2, IDS, method="saliency", target=6)
    assert torch.allclose(x_g.scores, (emb * g).sum(-1).detach(), atol=1e-6)
    assert torch.allclose(grad.scores, g.sum(-1), atol=1e-6)
    assert torch.allclose(sal.scores, g.abs().sum(-1), atol=1e-6)
    ref = captum_attr.LayerGradientXActivation(lambda i: gpt2(i).logits[:, -1], gpt2.transformer.wte)
    assert _rel_detached(x_g.scores, ref.attribute(IDS, target=6).sum(-1)) <= 1e-5


def test_a_masked_language_model_at_another_position_equals_captum():
    torch.manual_seed(1)
    config = T.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=16)
    bert = T.BertForMaskedLM(config).eval()
    ids, mask = torch.tensor([[2, 9, 3, 4, 5]]), torch.ones(1, 5, dtype=torch.long)
    res = hookscope.attribute_tokens(bert, ids, target=Token(7, position=2), steps=8, rule="gausslegendre",
                                     baseline=0, kwargs={"attention_mask": mask})
    lig = captum_attr.LayerIntegratedGradients(lambda i, m: bert(i, attention_mask=m).logits[:, 2],
                                               bert.bert.embeddings.word_embeddings)
    ref = lig.attribute(ids, baselines=torch.zeros_like(ids), target=7, n_steps=8, method="gausslegendre",
                        additional_forward_args=(mask,)).sum(-1)
    assert res.layer == "bert.embeddings.word_embeddings" and res.rows[0].position == 2
    assert rel(res.scores, ref) <= 1e-5 and no_hooks(bert)


def test_a_llama_with_a_float_baseline_and_per_sequence_ids():
    torch.manual_seed(2)
    config = T.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    llama = T.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 5, 6], [1, 7, 8]])
    start = torch.full((3, 16), 0.01)  # one sequence's baseline at the layer, the same for both
    res = hookscope.attribute_tokens(llama, ids, target=[4, 9], baseline=start, steps=24, rule="gausslegendre")
    at_start = _logit(llama, [4, 9], inputs_embeds=start.expand(2, 3, 16).contiguous())
    logit = _logit(llama, [4, 9], input_ids=ids)
    assert torch.allclose(res.scores.sum(1) + torch.tensor([r.delta for r in res.rows]), logit - at_start, atol=1e-5)
    assert [r.target for r in res.rows] == [4, 9] and no_hooks(llama)


# --- a continuation -----------------------------------------------------------------------------------
def test_each_generated_token_is_explained_as_a_separate_call_on_its_prefix(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS, generate=3, steps=8)
    written = gpt2.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert res.tokens == written.tolist() and res.prompt == 4
    assert [(r.sample, r.step) for r in res.rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    for r in res.rows:
        prefix = written[r.sample: r.sample + 1, : 4 + r.step]
        with torch.no_grad():  # greedy: each token is the most likely one after its prefix
            assert r.target == int(gpt2(prefix).logits[0, -1].argmax())
        alone = hookscope.attribute_tokens(gpt2, prefix, target=r.target, steps=8).rows[0]
        assert r.scores.shape == (4 + r.step,) and torch.allclose(r.scores, alone.scores, atol=1e-6)
        assert r.delta == pytest.approx(alone.delta, abs=1e-6) and r.position == 3 + r.step
    assert torch.isnan(res.scores[0, 4:]).all() and not torch.isnan(res.scores[2, :6]).any()  # 7 tokens, 6 before the last
    assert no_hooks(gpt2)


class _Counter(nn.Module):
    """A language model by hand: the next token is the last one plus 1 (mod 6), and 5 ends a sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 6)
        with torch.no_grad():
            self.embed.weight.copy_(torch.eye(6))
        self.head = nn.Linear(6, 6, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.roll(torch.eye(6), 1, 0) * 4)
        self.config = type("Config", (), {"eos_token_id": 5})()

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_a_model_without_generate_writes_greedily_and_stops_after_its_end_token():
    lm = _Counter()
    res = hookscope.attribute_tokens(lm, torch.tensor([[0, 2], [1, 3]]), generate=3, method="input_x_gradient",
                                     tokenizer=["a", "b", "c", "d", "e", "<end>"])
    assert res.tokens == [[0, 2, 3, 4, 5], [1, 3, 4, 5]]  # the second stops after its end token
    assert [(r.sample, r.step, r.target) for r in res.rows] == [(0, 0, 3), (0, 1, 4), (0, 2, 5), (1, 0, 4), (1, 1, 5)]
    # logit = 4 * (one-hot of the last token), so x * g puts all 4 on the last token
    for r in res.rows:
        assert r.scores.tolist() == [0.0] * (len(r.scores) - 1) + [4.0]
    assert res.texts == [["a", "c", "d", "e", "<end>"], ["b", "d", "e", "<end>"]] and res.rows[2].text == "<end>"
    assert "0:'a'" in res.table() and "'<end>'" in str(res)


def test_a_left_padded_batch_grows_its_attention_mask(gpt2):
    ids = torch.tensor([[0, 0, 5, 7], [3, 4, 2, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    res = hookscope.attribute_tokens(gpt2, ids, generate=2, method="input_x_gradient", kwargs={"attention_mask": mask})
    written = torch.tensor(res.tokens)
    r = res.rows[1]  # sample 0, the second token written
    grown = torch.cat([mask[:1], torch.ones(1, 1, dtype=torch.long)], 1)
    alone = hookscope.attribute_tokens(gpt2, written[:1, :5], target=r.target, method="input_x_gradient",
                                       kwargs={"attention_mask": grown})
    assert (r.sample, r.step) == (0, 1) and torch.allclose(r.scores, alone.rows[0].scores, atol=1e-6)


# --- the model left as it was, and bad requests --------------------------------------------------------
def test_the_model_is_left_exactly_as_it_was(gpt2):
    lm = copy.deepcopy(gpt2).train()
    lm.lm_head.weight.grad = torch.ones_like(lm.lm_head.weight)
    lm.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    flags = [m.training for m in lm.modules()]
    rng = torch.random.get_rng_state()
    hookscope.attribute_tokens(lm, IDS, generate=2, steps=4)
    hookscope.attribute_tokens(lm, IDS, steps=4, baseline=2)
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert [m.training for m in lm.modules()] == flags and torch.equal(rng, torch.random.get_rng_state())
    assert torch.equal(lm.lm_head.weight.grad, torch.ones_like(lm.lm_head.weight))
    assert not lm.transformer.h[0].mlp.c_fc.weight.requires_grad and lm.transformer.wpe.weight.grad is None  # (wte is lm_head: tied)
    with pytest.raises(hookscope.HookscopeError):
        hookscope.attribute_tokens(lm, IDS, target=99)  # out of the vocabulary: fails inside the forward passes
    assert no_hooks(lm) and [m.training for m in lm.modules()] == flags
    # dropout was off: the same scores as in eval mode
    evaluated = hookscope.attribute_tokens(gpt2, IDS, steps=4)
    assert torch.allclose(hookscope.attribute_tokens(lm, IDS, steps=4).scores, evaluated.scores, atol=1e-6)


@pytest.mark.parametrize(("call", "said"), [
    (dict(method="smoothgrad"), "method='smoothgrad' is not a token attribution method"),
    (dict(inputs=torch.rand(1, 4)), "are not token ids; pass a B x T (or T) tensor of ints"),
    (dict(inputs=torch.tensor([[1, -2]])), "a negative id"),
    (dict(generate=2, target=3), "generate= explains the tokens the model writes, so it takes no target="),
    (dict(generate=-1), "generate=-1 must be an int >= 0"),
    (dict(baseline="pad"), "baseline='pad' is not a baseline"),
    (dict(baseline=torch.tensor([1, 2])), "baseline ids of shape 1x2 do not fit inputs of 2x4"),
    (dict(target=50), "token id 50 (sample 0) is out of range: the model's vocabulary has 50 tokens"),
    (dict(layers=["transformer.h.0", "transformer.h.1"]), "selects 2 layers"),
    (dict(tokenizer=3.5), "tokenizer= is a float"),
])
def test_bad_requests_are_refused_in_one_line(gpt2, call, said):
    args = {"inputs": IDS, **call}
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute_tokens(gpt2, args.pop("inputs"), **args)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(gpt2)


def test_a_model_with_several_embeddings_asks_which():
    lm = nn.Sequential(nn.Embedding(5, 4), nn.Embedding(4, 4))
    with pytest.raises(hookscope.HookscopeError, match=r"cannot tell which layer embeds the tokens .*'0', '1'"):
        hookscope.attribute_tokens(lm, torch.tensor([[1, 2]]))
    with pytest.raises(hookscope.HookscopeError, match="not one row per token"):
        hookscope.attribute_tokens(nn.Sequential(nn.Embedding(5, 4), nn.Flatten(), nn.Linear(8, 5)),
                                   torch.tensor([[1, 2]]), layers="1", target=0)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(5, 4), nn.Linear(4, 5)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids) + self.embed(ids.flip(1)))

    twice = Twice()
    with pytest.raises(hookscope.HookscopeError, match=r"layer 'embed' ran 2 times in the forward pass"):
        hookscope.attribute_tokens(twice, torch.tensor([[1, 2]]))
    assert no_hooks(twice)


# --- the result ------------------------------------------------------------------------------------
def test_the_result_speaks_the_protocol(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS, steps=4, tokenizer=lambda i: f"w{i}")
    data = json.loads(res.to_json())
    assert data == json.loads(json.dumps(hookscope.core.result.jsonable(res.to_dict())))
    assert data["rows"][0]["scores"] == pytest.approx(res.rows[0].scores.tolist())
    assert data["texts"][0] == ["w5", "w7", "w9", "w11"] and data["settings"]["baseline"] == "zeros"
    assert len(res.table().splitlines()) == 3 + 2 and str(res) == res.table()  # title, head, rule; a line per row
    assert res.forwards == 3  # the probe, the inputs, one pass of 4 steps x 2 rows (its first step the baseline)
    assert res.table().splitlines()[0].startswith("integrated_gradients (steps=4, rule=riemann_trapezoid, "
                                                  "baseline=zeros) at layer 'transformer.wte': 2 tokens explained")
    assert "\n" not in res.to_json()


def test_one_sequence_and_a_wrapped_model_give_the_same_rows(gpt2):
    res = hookscope.attribute_tokens(gpt2, IDS[:1], steps=8)
    assert torch.equal(hookscope.attribute_tokens(gpt2, IDS[0], steps=8).scores, res.scores)
    wrapped = hookscope.attribute_tokens(nn.DataParallel(gpt2), IDS[:1], steps=8, generate=2)
    assert wrapped.layer == "transformer.wte" and torch.allclose(wrapped.rows[0].scores, res.rows[0].scores)
    assert wrapped.tokens == gpt2.generate(IDS[:1], max_new_tokens=2, do_sample=False, pad_token_id=0).tolist()


# --- end tokens named by the generation config -------------------------------------------------------------
@pytest.fixture(scope="module")
def llama() -> nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=64, vocab_size=50, max_position_embeddings=32, eos_token_id=0,
                           bos_token_id=0, pad_token_id=49)
    return T.LlamaForCausalLM(config).eval()


LLAMA_IDS = torch.tensor([[5, 7, 9, 11], [3, 4, 2, 8]])


@pytest.mark.parametrize("ends", [[0, 1], 1], ids=["list", "int"])
def test_an_end_token_the_generation_config_alone_names_ends_its_sequence(llama, ends):
    lm = copy.deepcopy(llama)
    free = lm.generate(LLAMA_IDS, max_new_tokens=5, do_sample=False)
    assert free[0, 4:].tolist() == [39, 1, 46, 12, 35] and 1 not in free[1, 4:].tolist()
    lm.generation_config.eos_token_id = ends  # as Llama-3 and Qwen2.5-Instruct name theirs; config.eos_token_id is 0
    res = hookscope.attribute_tokens(lm, LLAMA_IDS, generate=5, method="input_x_gradient")
    assert res.tokens == [[5, 7, 9, 11, 39, 1], free[1].tolist()]  # sample 0 ends after 1, no pad explained
    assert [(r.sample, r.step, r.target) for r in res.rows] == \
        [(0, 0, 39), (0, 1, 1)] + [(1, k, int(free[1, 4 + k])) for k in range(5)]
    assert no_hooks(lm)


# --- encoder-decoder models: the encoder's tokens scored for each token the decoder writes ---------------
@pytest.fixture(scope="module")
def t5() -> nn.Module:
    torch.manual_seed(2)
    config = T.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                        decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, initializer_factor=5.0)
    return T.T5ForConditionalGeneration(config).eval()


T5_IDS = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])


def _t5_by_hand(t5: nn.Module, ids: torch.Tensor, decoder: torch.Tensor, target: int) -> torch.Tensor:
    """input x gradient at the encoder's token embedding for ``target`` after the decoder's tokens ``decoder``."""
    embedded = t5.encoder.embed_tokens(ids).detach().requires_grad_(True)
    logit = t5(inputs_embeds=embedded, decoder_input_ids=decoder).logits[0, -1, target]
    (grad,) = torch.autograd.grad(logit, embedded)
    return (embedded * grad).sum(-1)[0].detach()


def test_an_encoder_decoder_model_scores_the_encoder_tokens_of_each_token_written(t5):
    written = t5.generate(T5_IDS, max_new_tokens=3, do_sample=False)  # the decoder's start token, then 3
    assert written.tolist() == [[0, 20, 4, 19], [0, 20, 4, 32]]
    res = hookscope.attribute_tokens(t5, T5_IDS, generate=3, method="input_x_gradient")
    assert res.layer == "encoder.embed_tokens" and res.prompt == 5
    assert res.tokens == [T5_IDS[b].tolist() + written[b, 1:].tolist() for b in range(2)]
    assert [(r.sample, r.step) for r in res.rows] == [(b, k) for b in range(2) for k in range(3)]
    for r in res.rows:
        decoder = written[r.sample: r.sample + 1, : 1 + r.step]
        assert r.target == int(written[r.sample, 1 + r.step]) and r.position == r.step  # read at the decoder's last
        want = _t5_by_hand(t5, T5_IDS[r.sample: r.sample + 1], decoder, r.target)
        # logits near 100 (initializer_factor=5): float32 rounding, batched or alone, is ~1e-5 of them
        assert r.scores.shape == (5,) and torch.allclose(r.scores, want, atol=1e-4)
    assert no_hooks(t5)


def test_an_encoder_decoder_model_explains_its_first_token_and_integrated_gradients_add_up(t5):
    res = hookscope.attribute_tokens(t5, T5_IDS, steps=32, rule="gausslegendre")
    start = torch.zeros(2, 1, dtype=torch.long)
    with torch.no_grad():
        logits = t5(input_ids=T5_IDS, decoder_input_ids=start).logits[:, -1]
        zero = t5(inputs_embeds=torch.zeros(2, 5, 16), decoder_input_ids=start).logits[:, -1]
    chosen = logits.argmax(-1)
    assert [r.target for r in res.rows] == chosen.tolist() and res.tokens == T5_IDS.tolist()
    for b, r in enumerate(res.rows):
        change = float(logits[b, chosen[b]] - zero[b, chosen[b]])
        assert r.logit == pytest.approx(float(logits[b, chosen[b]]), rel=1e-6)  # ~95, in float32
        assert float(r.scores.sum()) + r.delta == pytest.approx(change, rel=1e-4)  # RMSNorm at zeros: delta is large
    given = hookscope.attribute_tokens(t5, T5_IDS[:1], target=7, method="input_x_gradient",
                                       kwargs={"decoder_input_ids": torch.tensor([[0, 5, 6]])})
    want = _t5_by_hand(t5, T5_IDS[:1], torch.tensor([[0, 5, 6]]), 7)
    assert given.rows[0].position == 2 and torch.allclose(given.rows[0].scores, want, atol=1e-4)
    assert no_hooks(t5)


def test_a_layer_that_never_runs_names_the_layers_sharing_its_weights_that_do(t5):
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute_tokens(t5, T5_IDS, layers="shared", method="gradient")
    said = str(e.value)
    assert said.startswith("layer 'shared' did not run in the forward pass") and "\n" not in said
    assert "'encoder.embed_tokens'" in said  # which shares its weight, ran once, and gives one row per token
    res = hookscope.attribute_tokens(t5, T5_IDS, layers="encoder.embed_tokens", method="gradient")
    assert res.layer == "encoder.embed_tokens" and no_hooks(t5)


def test_an_encoder_decoder_batch_that_ends_early_explains_every_token_written(t5):
    lm = copy.deepcopy(t5)
    lm.generation_config.eos_token_id = [1, 4]  # both sequences end at their second token
    res = hookscope.attribute_tokens(lm, T5_IDS, generate=4, method="gradient")
    assert res.tokens == [T5_IDS[b].tolist() + [20, 4] for b in range(2)]
    assert [(r.sample, r.step, r.target) for r in res.rows] == [(0, 0, 20), (0, 1, 4), (1, 0, 20), (1, 1, 4)]
    given = hookscope.attribute_tokens(lm, T5_IDS[:1], generate=2, method="gradient",  # the decoder's start given
                                       kwargs={"decoder_input_ids": torch.tensor([[0, 20]])})
    assert given.tokens == [T5_IDS[0].tolist() + [4]] and [r.position for r in given.rows] == [1]
    assert no_hooks(lm)


@pytest.mark.parametrize(("setting", "value"), [("num_return_sequences", 2), ("penalty_alpha", 0.6),
                                                ("do_sample", True), ("num_beams", 3)])
def test_a_generation_config_asking_for_more_than_greedy_writes_greedily_anyway(llama, setting, value):
    lm = copy.deepcopy(llama)
    setattr(lm.generation_config, setting, value)
    if setting == "penalty_alpha":
        lm.generation_config.top_k = 4  # with a penalty: contrastive search
    res = hookscope.attribute_tokens(lm, LLAMA_IDS, generate=3, method="gradient")
    assert res.tokens == llama.generate(LLAMA_IDS, max_new_tokens=3, do_sample=False).tolist()
    assert len(res.rows) == 6 and no_hooks(lm)


def test_a_generate_that_fails_says_so_in_one_line(llama, monkeypatch):
    lm = copy.deepcopy(llama)

    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise ValueError("`max_new_tokens` must be greater than 0\n(more detail)")

    monkeypatch.setattr(lm, "generate", refuse)
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute_tokens(lm, LLAMA_IDS, generate=2, method="gradient")
    said = str(e.value)
    assert said.startswith("LlamaForCausalLM.generate() failed writing 2 tokens: `max_new_tokens` must be greater than "
                           "0; fix its generation_config or pass generate=0") and "\n" not in said
    assert no_hooks(lm)


def test_a_layer_that_never_runs_and_shares_nothing_is_told_where_names_are_listed():
    class Spare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.spare, self.head = nn.Embedding(5, 4), nn.Embedding(5, 4), nn.Linear(4, 5)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    lm = Spare()
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute_tokens(lm, torch.tensor([[1, 2]]), layers="spare", target=0)
    assert str(e.value) == ("layer 'spare' did not run in the forward pass; attribute at a layer that runs once with "
                            "one row per token, named as hookscope.names(model) lists it")
    assert "embed" in hookscope.names(lm)
    assert hookscope.attribute_tokens(lm, torch.tensor([[1, 2]]), layers="embed", target=0).rows[0].scores.shape == (2,)
    assert no_hooks(lm)


# --- a continuation given (or written) and explained by each token's log-probability ---------------------
class _Words:
    """The least of a tokenizer captum's LLMGradientAttribution reads: ids written as 't5 t7 ...'."""

    def encode(self, text, return_tensors=None, add_special_tokens=True):
        return torch.tensor([[int(w[1:]) for w in text.split(" ")]])

    def decode(self, ids):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return " ".join(f"t{i}" for i in ([ids] if isinstance(ids, int) else ids))

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]

    def __call__(self, text, **kw):
        ids, offsets, at = [], [], 0
        for w in text.split(" "):
            ids.append(int(w[1:]))
            offsets.append((at, at + len(w)))
            at += len(w) + 1
        return {"input_ids": ids, "offset_mapping": offsets}


def _captum_llm(lm, layer_method, prompt, written, **kw):
    words = _Words()
    llm = captum_attr.LLMGradientAttribution(layer_method(lm, lm.transformer.wte), words)
    return llm.attribute(captum_attr.TextTokenInput(words.decode(prompt), words), target=written, **kw)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_a_continuation_equals_captums_llm_gradient_attribution(gpt2, sample):
    torch.manual_seed(3)
    out = gpt2.generate(IDS[:1], max_new_tokens=3, do_sample=sample, top_k=0, pad_token_id=0)
    ig = hookscope.attribute_tokens(gpt2, IDS[:1], continuation=out, steps=16, baseline=0, rule="gausslegendre")
    theirs = _captum_llm(gpt2, captum_attr.LayerIntegratedGradients, IDS[0], out[0, 4:], n_steps=16)
    assert ig.matrix().shape == (4, 3) and torch.allclose(ig.matrix(), theirs.token_attr.T, atol=1e-6)
    assert torch.allclose(ig.totals(), theirs.seq_attr, atol=1e-6)
    xg = hookscope.attribute_tokens(gpt2, IDS[:1], continuation=out, method="input_x_gradient")
    theirs = _captum_llm(gpt2, captum_attr.LayerGradientXActivation, IDS[0], out[0, 4:])
    assert torch.allclose(xg.matrix(), theirs.token_attr.T, atol=1e-6) and no_hooks(gpt2)
    assert [r.target for r in xg.rows] == out[0, 4:].tolist() and xg.tokens == out.tolist()


def test_each_column_is_input_x_gradient_of_that_tokens_log_probability_by_autograd(gpt2):
    out = gpt2.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)
    res = hookscope.attribute_tokens(gpt2, IDS, continuation=out, method="input_x_gradient")
    for r in res.rows:
        emb = gpt2.transformer.wte(out[r.sample:r.sample + 1, : 4 + r.step]).detach().requires_grad_()
        logp = torch.log_softmax(gpt2(inputs_embeds=emb).logits[0, -1], -1)[out[r.sample, 4 + r.step]]
        (g,) = torch.autograd.grad(logp, emb)
        assert r.logit == pytest.approx(float(logp.detach()), abs=1e-5)
        assert torch.allclose(r.scores, (emb * g).sum(-1)[0].detach(), atol=1e-6)
        assert torch.allclose(res.matrix(r.sample)[:, r.step], (emb * g).sum(-1)[0, :4].detach(), atol=1e-6)
    assert [(r.sample, r.step, r.position) for r in res.rows][:3] == [(0, 0, 3), (0, 1, 4), (0, 2, 5)]


def test_integrated_gradients_of_a_continuation_add_up_to_its_log_probability_change(gpt2):
    out = gpt2.generate(IDS[:1], max_new_tokens=2, do_sample=False, pad_token_id=0)
    res = hookscope.attribute_tokens(gpt2, IDS[:1], continuation=out, steps=64, rule="gausslegendre")
    with torch.no_grad():
        emb = gpt2.transformer.wte(out)
        zeroed = emb.clone()
        zeroed[:, :4] = 0  # the prompt at the baseline, the tokens written held as they are
        change = [float(torch.log_softmax(gpt2(inputs_embeds=e).logits[0, 3 + k], -1)[out[0, 4 + k]])
                  for e in (emb, zeroed) for k in range(2)]
    for k, r in enumerate(res.rows):
        assert float(r.scores.sum()) + r.delta == pytest.approx(change[k] - change[2 + k], abs=1e-5)
        assert abs(r.delta) < 1e-3 and (r.scores[4:] == 0).all()  # the tokens written are not moved
    assert torch.allclose(res.totals(), res.matrix().sum(1))


def test_a_number_of_tokens_writes_greedily_what_generate_writes(gpt2):
    out = gpt2.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)
    given = hookscope.attribute_tokens(gpt2, IDS, continuation=out, method="gradient")
    written = hookscope.attribute_tokens(gpt2, IDS, continuation=3, method="gradient")
    assert written.tokens == given.tokens and all(torch.equal(a.scores, b.scores) for a, b in zip(given.rows, written.rows))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_pads_of_a_continuation_score_zero_and_change_nothing(gpt2, llama, family):
    lm = gpt2 if family == "gpt2" else llama
    ids, mask = torch.tensor([[0, 0, 5, 7], [3, 4, 2, 8]]), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = lm.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    res = hookscope.attribute_tokens(lm, ids, continuation=out, method="input_x_gradient", kwargs={"attention_mask": mask})
    alone = hookscope.attribute_tokens(lm, ids[:1, 2:], continuation=out[:1, 2:], method="input_x_gradient")
    assert (res.matrix(0)[:2] == 0).all() and torch.allclose(res.matrix(0)[2:], alone.matrix(), atol=1e-5)
    assert [r.logit for r in res.rows if r.sample == 0] == pytest.approx([r.logit for r in alone.rows], abs=1e-5)
    assert no_hooks(lm)


@pytest.mark.parametrize(("call", "said"), [
    (dict(continuation=torch.tensor([[5, 7, 9, 12, 3]])), "continuation= does not start with the prompt; pass the "
                                                          "output of model.generate(inputs, ...)"),
    (dict(continuation=IDS[:1]), "continuation= holds no token after the prompt"),
    (dict(continuation=2, target=3), "continuation= explains the tokens written after the prompt, so it takes no"),
    (dict(continuation=0), "continuation=0 must be the output of generate() or a number of tokens to write"),
    (dict(continuation=torch.ones(1, 6)), "continuation= is 1x6; pass the token ids generate() returns"),
])
def test_a_bad_continuation_is_refused_in_one_line(gpt2, call, said):
    with pytest.raises(hookscope.HookscopeError) as caught:
        hookscope.attribute_tokens(gpt2, IDS[:1], method="gradient", **call)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value) and no_hooks(gpt2)
