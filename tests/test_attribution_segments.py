"""hookscope.attribute_segments: each segment's score per token written equals the log-probabilities worked
by hand with the segment replaced, Shapley values over segments are efficient and near the exact ones,
and a segment that does not occur is refused in one line."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import hookscope

from helpers import no_hooks

transformers = pytest.importorskip("transformers")

VOCAB = ["<pad>", " The", " cat", " sat", ".", " It", " was", " happy", "!", " dog", " ran", " on"]
IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])  # " The cat sat. It was happy!"


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(VOCAB), n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _logp(model, ids: torch.Tensor, written: list[int]) -> torch.Tensor:
    """Each written token's log-probability after ``ids``, by teacher forcing, by hand."""
    full = torch.cat([ids, torch.tensor([written])], 1)
    with torch.no_grad():
        logits = model(full).logits[0, ids.shape[1] - 1:-1].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(written)), written]


def test_ablation_of_sentences_equals_the_log_probabilities_by_hand(gpt2):
    res = hookscope.attribute_segments(gpt2, IDS, segments="sentences", generate=3, tokenizer=VOCAB, baseline=0)
    assert res.segments == [" The cat sat.", " It was happy!"] and res.spans == [[(0, 4)], [(4, 8)]]
    whole = _logp(gpt2, IDS, res.written)
    assert torch.allclose(res.logprobs, whole, atol=1e-6)
    for k, (lo, hi) in enumerate([(0, 4), (4, 8)]):
        cut = IDS.clone()
        cut[0, lo:hi] = 0
        assert torch.allclose(res.matrix[k], whole - _logp(gpt2, cut, res.written), atol=1e-6)
    assert torch.allclose(res.scores, res.matrix.sum(1))
    with torch.no_grad():  # the continuation is the model's own greedy one
        greedy = gpt2.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, 8:].tolist()
    assert res.written == greedy[:len(res.written)] and no_hooks(gpt2)


def test_named_slots_and_a_given_continuation(gpt2):
    res = hookscope.attribute_segments(gpt2, IDS, segments={"who": " The cat", "mood": " happy"}, target=[9, 10],
                                       tokenizer=VOCAB, baseline=11)
    assert res.segments == ["who", "mood"] and res.spans == [[(0, 2)], [(6, 7)]] and res.written == [9, 10]
    cut = IDS.clone()
    cut[0, 6] = 11
    assert torch.allclose(res.matrix[1], _logp(gpt2, IDS, [9, 10]) - _logp(gpt2, cut, [9, 10]), atol=1e-6)
    assert "who" in res.table() and res.to_dict()["written"] == [9, 10]


def _exact(model, labels: list[int], K: int, written: list[int]) -> torch.Tensor:
    def value(kept: set[int]) -> torch.Tensor:
        ids = IDS.clone()
        for i, lab in enumerate(labels):
            if lab >= 0 and lab not in kept:
                ids[0, i] = 0
        return _logp(model, ids, written)

    phi = torch.zeros(K, len(written), dtype=torch.float64)
    for k in range(K):
        others = [j for j in range(K) if j != k]
        for r in range(K):
            for S in itertools.combinations(others, r):
                w = math.factorial(r) * math.factorial(K - r - 1) / math.factorial(K)
                phi[k] += w * (value(set(S) | {k}) - value(set(S)))
    return phi


def test_shapley_over_words_is_efficient_and_near_the_exact_values(gpt2):
    labels = [0, 0, 1, 1, 2, 2, 2, -1]  # three spans; the last token held
    res = hookscope.attribute_segments(gpt2, IDS, segments=labels, generate=2, method="shapley_value_sampling",
                                       samples=200, seed=1, baseline=0)
    empty = IDS.clone()
    empty[0, :7] = 0
    # every order's gains telescope: the segments share exactly the whole change, token by token
    assert torch.allclose(res.matrix.sum(0), res.logprobs - _logp(gpt2, empty, res.written), atol=1e-9)
    exact = _exact(gpt2, labels, 3, res.written)
    assert float((res.matrix - exact).abs().max()) <= 0.1 * float(exact.abs().max())


def test_words_come_from_the_tokens_text(gpt2):
    res = hookscope.attribute_segments(gpt2, IDS, tokenizer=VOCAB, target=[9])
    assert res.segments == [" The", " cat", " sat.", " It", " was", " happy!"]


@pytest.mark.parametrize("call, match", [
    (dict(segments=[" The dog"], tokenizer=VOCAB), r"segment ' The dog' does not occur in the prompt"),
    (dict(segments=[" happy", " cat"], tokenizer=VOCAB), r"segment ' cat' does not occur after the segment before"),
    (dict(segments=[0, 0, 2, 2, 2, 2, 2, 2]), r"1 is missing"),
    (dict(segments=[0, 1]), r"gives 2 labels for a prompt of 8 tokens"),
    (dict(segments="words"), r"pass tokenizer="),
    (dict(method="lime"), r"method='lime' is not a segment method"),
    (dict(baseline=99, segments="tokens"), r"baseline=99 must be a token id of the vocabulary"),
    (dict(segments="tokens", samples=0, method="shapley_value_sampling"), r"samples=0 must be an int >= 1"),
])
def test_bad_input_is_one_line(gpt2, call, match):
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        hookscope.attribute_segments(gpt2, IDS, target=[9], **call)
    assert "\n" not in str(e.value)


def test_one_prompt_at_a_time(gpt2):
    with pytest.raises(hookscope.HookscopeError, match="one prompt of token ids, 1 x T"):
        hookscope.attribute_segments(gpt2, IDS.repeat(2, 1), segments="tokens", target=[9])
