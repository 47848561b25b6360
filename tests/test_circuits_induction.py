"""Ground truth for the circuit analyses: a two-layer attention-only GPT-2 trained to do induction
(``_induction``). Ablation names the heads that matter (each head's z zeroed, the loss of the tokens
the repetition decides measured on fresh sequences); the patching sweeps, direct logit attribution,
the logit lens and attribution patching must name the same ones."""

from __future__ import annotations

import pytest
import torch

import hookscope
from hookscope.analysis.circuits import activation_patching, attribution_patching, logit_attribution, logit_lens

from helpers import no_hooks

pytest.importorskip("transformers")

import _induction  # noqa: E402


@pytest.fixture(scope="module")
def ind() -> _induction.Induction:
    return _induction.trained()


@pytest.fixture(scope="module")
def ablation(ind) -> torch.Tensor:
    """How much each head's ablation raises the repeated tokens' loss, ``[block, head]``."""
    ids, mask = _induction.batch(256, torch.Generator().manual_seed(7))
    d_head = _induction.WIDTH // _induction.HEADS
    with torch.no_grad():
        base = float(_induction.repeated_loss(ind.model(ids).logits, ids, mask))
        rise = torch.zeros(2, _induction.HEADS)
        for block in range(2):
            for head in range(_induction.HEADS):
                def zero(old, head=head):
                    new = old.clone()
                    new[..., head * d_head:(head + 1) * d_head] = 0
                    return new
                with hookscope.edit(ind.model, f"transformer.h.{block}.attn.c_proj", input=zero):
                    rise[block, head] = float(_induction.repeated_loss(ind.model(ids).logits, ids, mask)) - base
    assert base < 0.3  # the model does induction
    return rise


def _heads(ablation: torch.Tensor) -> set[tuple[int, int]]:
    """The heads whose ablation destroys the repeated half (the loss up by more than 1 nat)."""
    return {(int(b), int(h)) for b, h in (ablation > 1.0).nonzero()}


def test_ablation_finds_one_previous_token_head_and_one_induction_head(ind, ablation):
    heads = _heads(ablation)
    assert {b for b, _ in heads} == {0, 1} and len(heads) == 2
    assert float(ablation.sort(descending=True).values.flatten()[2]) < 0.1  # the other six barely matter
    (prev, induction) = sorted(heads)
    names = [f"transformer.h.{b}.attn" for b in range(2)]  # eager attention returns its probabilities
    with hookscope.capture(ind.model, *names) as rec, torch.no_grad():
        ind.model(ind.clean[None])
    attn = [rec[n][0].output[1] for n in names]
    diag = torch.stack([attn[0][0, prev[1], i, i - 1] for i in range(1, len(ind.clean))])
    assert float(diag.mean()) > 0.9  # block 0's head attends to the previous token
    assert int(attn[1][0, induction[1], -1].argmax()) == 5  # the token after the last token's earlier copy


def _top_heads(p: hookscope.Patching, k: int = 2) -> set[tuple[int, int]]:
    return {(p.layers.index(layer), int(col)) for layer, col, _ in p.top(k)}


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_head_sweep_finds_the_two_heads(ind, ablation, direction):
    p = activation_patching(ind.model, ind.clean, ind.corrupted, answer=ind.answer, wrong=ind.wrong, component="attn.z",
                            direction=direction)
    assert p.clean > 5 and p.corrupted < -5
    assert _top_heads(p) == _heads(ablation)
    for block, head in _heads(ablation):  # each of them alone restores (or destroys) most of the gap
        assert abs(float(p.normalised[block, head]) - (1.0 if direction == "denoise" else 0.0)) < 0.1
    assert no_hooks(ind.model)


def test_the_pattern_sweep_finds_the_induction_head_and_the_stream_sweep_the_positions(ind, ablation):
    p = activation_patching(ind.model, ind.clean, ind.corrupted, answer=ind.answer, wrong=ind.wrong,
                            component="attn.pattern")
    induction = max(_heads(ablation))
    assert _top_heads(p, 1) == {induction} and float(p.normalised[induction]) > 0.9
    r = activation_patching(ind.model, ind.clean, ind.corrupted, answer=ind.answer, wrong=ind.wrong)
    # block 0: the corrupted token itself; block 1: the next position, where the previous-token head wrote it
    assert float(r.normalised[0, 4]) == pytest.approx(1.0, abs=1e-4)
    assert float(r.normalised[1, 5]) > 0.9 and float(r.normalised[1, 4]) < 0.1


def test_direct_logit_attribution_names_the_induction_head(ind, ablation):
    dla = logit_attribution(ind.model, ind.clean, answer=ind.answer, wrong=ind.wrong)
    heads = dla.heads()
    block, head = max(_heads(ablation))
    assert divmod(int(heads.abs().argmax()), heads.shape[1]) == (block, head)
    assert float(heads[block, head]) > 0.8 * dla.logit  # it writes the answer; nothing else comes close
    assert abs(dla.total - dla.logit) <= 1e-5


def test_the_logit_lens_sees_the_answer_only_after_the_induction_head(ind):
    lens = logit_lens(ind.model, ind.clean, token=ind.answer)
    last = [rows[-1] for rows in (lens[s] for s in lens.streams)]
    assert [r.rank == 0 for r in last] == [False, False, True]
    assert last[-1].prob > 0.9 and last[0].kl > 1.0


@pytest.mark.parametrize("steps", [0, 8])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_patching_ranks_the_two_heads_first(ind, ablation, steps, direction):
    kw = dict(answer=ind.answer, wrong=ind.wrong, component="attn.z", direction=direction)
    est = attribution_patching(ind.model, ind.clean, ind.corrupted, steps=steps, **kw)
    real = activation_patching(ind.model, ind.clean, ind.corrupted, **kw)
    prev, induction = sorted(_heads(ablation))
    if steps:  # integrated along the path: close to the real sweep
        assert _top_heads(est) == _heads(ablation) and real.correlation(est) > 0.9
    else:
        # one gradient: the induction head comes first, but the previous-token head, whose effect goes
        # through block 1's saturated softmax (gradient ~0 at either end), is all but missed
        assert _top_heads(est, 1) == {induction}
        assert abs(float(est.effects[prev])) < 0.25 * abs(float(real.effects[prev]))
    assert no_hooks(ind.model)
