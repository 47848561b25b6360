"""compare_models(..., data=): perplexity and accuracy of both models, worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import hookscope
from hookscope import HookscopeError


class Bigram(nn.Module):
    """Logits at position t depend on token t only: row ``ids[t]`` of a fixed table of log-probabilities."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table).log())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.table[input_ids]


def _stay() -> Bigram:
    return Bigram([[0.75, 0.25], [0.25, 0.75]])  # the next token is the same one with p = 0.75


def _uniform() -> Bigram:
    return Bigram([[0.5, 0.5], [0.5, 0.5]])


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_perplexity_is_exp_of_the_mean_next_token_nll_by_hand() -> None:
    ids = torch.tensor([[0, 0, 1]])  # transitions 0->0 (p .75), 0->1 (p .25); the first token is not scored
    c = hookscope.compare_models(_stay(), _uniform(), ids, data=[ids], repeats=1, warmup=0)
    row = c["perplexity"]
    assert row.before == pytest.approx(math.exp(-(math.log(0.75) + math.log(0.25)) / 2))  # 2.3094
    assert row.before == pytest.approx(1 / math.sqrt(0.75 * 0.25))
    assert row.after == pytest.approx(2.0)
    assert "2 tokens" in row.note and "perplexity" in c.table()


def test_perplexity_over_batches_is_token_weighted_not_a_mean_of_perplexities() -> None:
    a = torch.tensor([[0, 0, 0, 0, 0]])  # 4 transitions, each p .75
    b = torch.tensor([[1, 0]])           # 1 transition, p .25
    row = hookscope.compare_models(_stay(), _stay(), data=[a, b], repeats=1, warmup=0)["perplexity"]
    expected = math.exp(-(4 * math.log(0.75) + math.log(0.25)) / 5)
    assert row.before == pytest.approx(expected) and row.after == pytest.approx(expected)
    assert row.before != pytest.approx((0.75 ** -1 + 0.25 ** -1) / 2)
    assert "5 tokens in 2 batch(es)" in row.note


def test_padding_and_ignored_labels_are_not_scored() -> None:
    ids = torch.tensor([[0, 0, 1, 1]])
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0]])}  # 1->1 at the end is padding
    row = hookscope.compare_models(_stay(), _uniform(), data=[padded], repeats=1, warmup=0)["perplexity"]
    assert row.before == pytest.approx(1 / math.sqrt(0.75 * 0.25)) and "2 tokens" in row.note
    labelled = {"input_ids": ids, "labels": torch.tensor([[-100, -100, 1, 1]])}  # only 0->1 and 1->1 count
    row = hookscope.compare_models(_stay(), _uniform(), data=[labelled], repeats=1, warmup=0)["perplexity"]
    assert row.before == pytest.approx(1 / math.sqrt(0.25 * 0.75))
    pairs = [(ids, torch.tensor([[-100, -100, -100, 1]]))]  # (input_ids, labels): 1->1 only
    row = hookscope.compare_models(_stay(), _uniform(), data=pairs, quality="perplexity", repeats=1,
                                   warmup=0)["perplexity"]
    assert row.before == pytest.approx(1 / 0.75) and row.after == pytest.approx(2.0)


def test_perplexity_matches_hugging_face_loss_with_labels_shifted_by_one() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, use_cache=False)).eval()
    ids = torch.randint(0, 50, (3, 9))
    with torch.no_grad():
        expected = math.exp(float(lm(ids, labels=ids).loss))
    row = hookscope.compare_models(lm, lm, data=[ids], repeats=1, warmup=0)["perplexity"]
    assert row.before == pytest.approx(expected, rel=1e-5) and row.ratio == pytest.approx(1.0)
    assert "24 tokens" in row.note  # 3 x (9 - 1)


def test_accuracy_of_a_tiny_classifier_by_hand() -> None:
    right, wrong = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        right.weight.copy_(torch.eye(2))                     # class = argmax of x
        wrong.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))  # the other one
    x = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 4.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1, 0, 1, 0])                          # right on 3 of 5, wrong on 2 of 5
    c = hookscope.compare_models(right, wrong, data=[(x[:3], y[:3]), (x[3:], y[3:])], repeats=1, warmup=0)
    assert c["accuracy"].before == pytest.approx(3 / 5) and c["accuracy"].after == pytest.approx(2 / 5)
    assert "5 samples" in c["accuracy"].note
    assert c["parameters"].before == 4 and "perplexity" not in c  # the example input: the first batch


def test_accuracy_reads_logits_from_a_tuple_or_a_dict_output() -> None:
    class Both(nn.Module):
        def __init__(self, as_dict: bool) -> None:
            super().__init__()
            self.fc, self.as_dict = nn.Linear(2, 2, bias=False), as_dict
            with torch.no_grad():
                self.fc.weight.copy_(torch.eye(2))

        def forward(self, x: torch.Tensor) -> object:
            out = self.fc(x)
            return {"logits": out, "hidden": x} if self.as_dict else (out, x)

    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
    c = hookscope.compare_models(Both(False), Both(True), data=[(x, y)], repeats=1, warmup=0)
    assert (c["accuracy"].before, c["accuracy"].after) == (0.5, 0.5)


def test_models_and_inputs_are_left_as_they_were() -> None:
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.drop = nn.Linear(2, 2), nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.fc(x.mul_(2)))  # writes into its input; dropout off only in eval mode

    torch.manual_seed(0)
    a, b = Writes().train(), Writes().train()
    b.drop.eval()
    state = {k: v.clone() for k, v in a.state_dict().items()}
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    first = hookscope.compare_models(a, b, data=[(x, y)], repeats=2, warmup=1)["accuracy"]
    again = hookscope.compare_models(a, b, data=[(x, y)], repeats=2, warmup=1)["accuracy"]
    assert torch.equal(x, torch.ones(4, 2)) and first.before == again.before  # eval mode: no dropout
    assert a.training and a.drop.training and b.training and not b.drop.training
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in state.items())
    assert _no_hooks(a) and _no_hooks(b)


def test_hooks_are_removed_when_a_batch_fails() -> None:
    net = nn.Linear(2, 2)
    good, bad = (torch.ones(1, 2), torch.tensor([0])), (torch.ones(1, 3), torch.tensor([0]))
    with pytest.raises(Exception, match="batch 1"):
        hookscope.compare_models(net, net, data=[good, bad], repeats=1, warmup=0)
    assert _no_hooks(net) and net.training


@pytest.mark.parametrize(("data", "quality", "match"), [
    ([torch.ones(2, 3, dtype=torch.long)], "bleu", "quality='bleu' is not a measure"),
    ([torch.randn(2, 2)], None, "cannot tell from the batches"),
    ([], None, "holds no batch"),
    ([torch.ones(1, 1, dtype=torch.long)], None, "no scored token"),
    ([(torch.randn(2, 2), torch.tensor([[0, 1]] * 2))], "perplexity", r"perplexity needs \[batch, tokens, vocab"),
    ([torch.randn(2, 2)], "perplexity", r"batch 0 holds \(2, 2\) torch.float32 labels; perplexity needs token ids"),
    ([torch.ones(2, 3, dtype=torch.long)], "accuracy", "accuracy needs"),
])
def test_bad_data_is_refused_in_one_line(data: list[object], quality: str | None, match: str) -> None:
    net = nn.Linear(2, 2) if quality == "perplexity" else _stay()
    example = torch.zeros(1, 2) if quality == "perplexity" else torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(HookscopeError, match=match) as e:
        hookscope.compare_models(net, net, example, data=data, quality=quality, repeats=1, warmup=0)
    assert "\n" not in str(e.value)
    assert _no_hooks(net)


def test_quality_without_data_and_a_classifier_on_token_ids_are_refused() -> None:
    with pytest.raises(HookscopeError, match="needs data="):
        hookscope.compare_models(_stay(), _stay(), torch.zeros(1, 2, dtype=torch.long), quality="perplexity")
    with pytest.raises(HookscopeError, match=r"accuracy needs \[batch, classes\]"):
        hookscope.compare_models(_stay(), _stay(), data=[(torch.zeros(2, 3, dtype=torch.long),
                                                          torch.tensor([0, 1]))], repeats=1, warmup=0)


def test_quality_survives_pruning_and_compaction_of_a_small_classifier() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    x = torch.randn(32, 4)
    y = net(x).argmax(-1).detach()  # labels the dense model gets all right
    import copy
    masked = copy.deepcopy(net)
    hookscope.prune_channels(masked, x, amount=0.5)
    small = hookscope.compact(masked, x)
    c = hookscope.compare_models(net, small, data=[(x, y)], repeats=1, warmup=0)
    assert c["accuracy"].before == 1.0 and c["parameters"].after == 4 * 8 + 8 + 8 * 3 + 3
    masked_acc = float((masked(x).argmax(-1) == y).float().mean())
    assert c["accuracy"].after == pytest.approx(masked_acc)
    d = c.to_dict()
    assert d["rows"][-1]["name"] == "accuracy" and d["rows"][-1]["ratio"] == pytest.approx(masked_acc)


def test_multiply_adds_of_attention_with_heads_removed_by_hand() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()  # head_dim 4
    x = torch.randn(1, 5, 16)

    class Self(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=False)[0]

    net = Self()
    hookscope.prune_heads(net, x, heads={"attn": [0, 1, 2]})
    small = hookscope.compact(net, x)
    c = hookscope.compare_models(net, small, x, repeats=1, warmup=0)
    dense = 5 * 16 * 16 * 4 + 2 * 5 * 5 * 16  # q, k, v, out projections, then QK^T and AV: 5,920
    one_head = 5 * 16 * 4 * 4 + 2 * 5 * 5 * 4  # inner width 4 (one head of 4) instead of 16: 1,480
    assert (c["multiply-adds"].before, c["multiply-adds"].after) == (dense, one_head)
