"""Ground truth from a random start: a two-layer attention-only LLaMA trained in the tests until it does
induction (``_learned_induction``; nothing planted). Ablation names what it learned: one previous-token
head in block 0 that everything depends on, and four induction heads in block 1 that share the work (no
one of them is needed alone; all of block 1 is). The head sweeps, direct logit attribution, the residual
sweep, the logit lens and integrated attribution patching must say the same."""

from __future__ import annotations

import pytest
import torch

import hookscope
from hookscope.analysis.circuits import activation_patching, attribution_patching, logit_attribution, logit_lens

from helpers import hook_count

pytest.importorskip("transformers")

import _learned_induction as L  # noqa: E402


@pytest.fixture(scope="module")
def ind() -> L.Learned:
    return L.trained()


@pytest.fixture(scope="module")
def own_hooks(ind) -> int:
    """The hooks transformers itself leaves on the model once a pass asks for the attention probabilities
    (its output recorders): hookscope's calls must leave that many, no more."""
    with torch.no_grad():
        ind.model(ind.pairs[0].clean[None], output_attentions=True)
    return hook_count(ind.model)


def _rise(model: torch.nn.Module, block: int, heads: slice) -> float:
    """How much zeroing ``heads`` of ``block`` (their part of the output projection's input) raises the
    repeated tokens' loss on 256 fresh sequences."""
    ids, mask = L.batch(256, torch.Generator().manual_seed(7))
    d = L.WIDTH // L.HEADS

    def zero(old: torch.Tensor) -> torch.Tensor:
        new = old.clone()
        new[..., heads.start * d:heads.stop * d] = 0
        return new

    with torch.no_grad():
        base = float(L.repeated_loss(model(ids).logits, ids, mask))
        with hookscope.edit(model, f"model.layers.{block}.self_attn.o_proj", input=zero):
            return float(L.repeated_loss(model(ids).logits, ids, mask)) - base


@pytest.fixture(scope="module")
def ablation(ind) -> torch.Tensor:
    """Each head's ablation's rise of the repeated tokens' loss, ``[block, head]``."""
    return torch.tensor([[_rise(ind.model, b, slice(h, h + 1)) for h in range(L.HEADS)] for b in range(2)])


@pytest.fixture(scope="module")
def previous(ablation) -> int:
    """The head of block 0 whose ablation destroys the repeated tokens' prediction."""
    return int(ablation[0].argmax())


def test_it_learned_induction_a_previous_token_head_and_induction_heads(ind, ablation, previous):
    ids, mask = L.batch(256, torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = ind.model(ids, output_attentions=True)
    assert float(L.repeated_loss(out.logits, ids, mask)) < 0.05  # chance: log 31 = 3.4 nats
    assert float(ablation[0, previous]) > 3.0 and float(ablation[0].sort().values[-2]) < 0.1
    assert float(ablation[1].max()) < 0.3 and _rise(ind.model, 1, slice(0, L.HEADS)) > 3.0  # shared, all needed
    first, second = out.attentions
    assert float(first[:, previous].diagonal(-1, -2, -1).mean()) > 0.7  # it attends to the token before
    after = torch.zeros(256, L.LENGTH, L.LENGTH, dtype=torch.bool)  # key j follows an earlier copy of query i's token
    after[:, :, 1:] = ids[:, :, None] == ids[:, None, :-1]
    after &= torch.ones(L.LENGTH, L.LENGTH, dtype=torch.bool).tril(-1)
    matching = (second * after[:, None]).sum(-1).transpose(0, 1)[:, mask].mean(-1)
    assert bool((matching > 0.85).all()), matching  # every head of block 1 prefix-matches


def _shares(ind: L.Learned, direction: str) -> torch.Tensor:
    """Each head's share of the gap between the clean and the corrupted metric, ``[pair, block, head]``:
    what patching it alone restores (denoising) or destroys (noising)."""
    out = []
    for p in ind.pairs:
        sweep = activation_patching(ind.model, p.clean, p.corrupted, answer=p.answer, wrong=p.wrong,
                                    component="attn.z", direction=direction)
        assert sweep.clean > 2 and sweep.corrupted < 0, (sweep.clean, sweep.corrupted)  # the model does induction here
        out.append(sweep.normalised if direction == "denoise" else 1 - sweep.normalised)
    return torch.stack(out)


def test_the_head_sweep_finds_the_previous_token_head(ind, previous, own_hooks):
    shares = _shares(ind, "denoise")
    mean = shares.mean(0)
    assert divmod(int(mean.argmax()), L.HEADS) == (0, previous)
    assert float(shares[:, 0, previous].min()) > 0.8  # alone it restores (nearly) all of the gap, every prompt
    others = [h for h in range(L.HEADS) if h != previous]
    assert float(mean[0, others].abs().max()) < 0.05
    noised = _shares(ind, "noise").mean(0)  # taken from the clean run, it destroys most of it
    assert float(noised[0, previous]) > 0.7 and float(noised[0, others].abs().max()) < 0.05
    assert hook_count(ind.model) == own_hooks


def test_direct_logit_attribution_gives_the_answer_to_the_induction_heads(ind):
    for p in ind.pairs:
        dla = logit_attribution(ind.model, p.clean, answer=p.answer, wrong=p.wrong)
        heads = dla.heads()
        assert abs(dla.total - dla.logit) <= 1e-4
        assert float(heads[1].sum()) > 0.8 * dla.logit  # block 1's heads write the answer
        assert float(heads[0].abs().sum()) < 0.25 * dla.logit  # the previous-token head writes little directly


def test_the_residual_sweep_finds_the_corrupted_token_at_block_0(ind):
    for p in ind.pairs:
        r = activation_patching(ind.model, p.clean, p.corrupted, answer=p.answer, wrong=p.wrong)
        assert float(r.normalised[0, p.copy]) == pytest.approx(1.0, abs=1e-3)  # the only position that differs
        assert float(r.normalised[1, p.copy + 1]) > 0.5  # where the previous-token head moved it


def test_the_logit_lens_sees_the_answer_only_after_block_1(ind):
    early = []
    for p in ind.pairs:
        lens = logit_lens(ind.model, p.clean, token=p.answer)
        last = [lens[s][-1] for s in lens.streams]
        assert last[-1].rank == 0 and last[-1].prob > 0.5
        early += [r.prob for r in last[:-1]]
    assert sum(early) / len(early) < 0.15  # before block 1, the answer is one token among 31


def test_integrated_attribution_patching_ranks_the_previous_token_head_first(ind, previous, own_hooks):
    total, correlations, missed = torch.zeros(2, L.HEADS, dtype=torch.float64), [], []
    for p in ind.pairs:
        kw = dict(answer=p.answer, wrong=p.wrong, component="attn.z")
        real = activation_patching(ind.model, p.clean, p.corrupted, **kw)
        est = attribution_patching(ind.model, p.clean, p.corrupted, steps=8, **kw)
        total += est.effects / (real.clean - real.corrupted)
        correlations.append(real.correlation(est))
        plain = attribution_patching(ind.model, p.clean, p.corrupted, **kw)
        missed.append(abs(float(plain.effects[0, previous])) / abs(float(real.effects[0, previous])))
    assert divmod(int(total.abs().argmax()), L.HEADS) == (0, previous)
    assert sum(correlations) / len(correlations) > 0.9 and min(correlations) > 0.75
    # one gradient: the previous-token head acts through block 1's saturated softmax and is all but missed
    assert sorted(missed)[len(missed) // 2] < 0.25
    assert hook_count(ind.model) == own_hooks
