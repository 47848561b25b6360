"""Recovery after pruning, checked: the closed-form refit equals the damped least-squares solution worked
out here, bias compensation adds the mean of what was lost, and on a small decoder trained here on a
structured toy language, every recovery narrows the perplexity gap pruning opened (heads and MLP units
compacted; blocks removed); Wanda and SparseGPT stay nearer the dense model than magnitude."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from torch import nn

import hookscope
from hookscope.core import hook_count

transformers.logging.set_verbosity_error()

V, T = 16, 16


def _text(n: int, seed: int) -> torch.Tensor:
    """An order-2 source: each pair of tokens is followed by one of two tokens fixed per pair (p = 0.8, 0.2),
    so the model needs its attention to the token before the last."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(7)
    nxt = torch.stack([torch.randperm(V, generator=fixed)[:2] for _ in range(V * V)])
    out = torch.empty(n, T, dtype=torch.long)
    out[:, :2] = torch.randint(0, V, (n, 2), generator=g)
    for t in range(2, T):
        pick = (torch.rand(n, generator=g) < 0.2).long()
        out[:, t] = nxt[out[:, t - 2] * V + out[:, t - 1], pick]
    return out


@pytest.fixture(scope="module")
def lm() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                   tie_word_embeddings=False, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(150):
        ids = _text(16, step)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


HELD_OUT = _text(32, 10_000)
CALIBRATION = _text(32, 20_000)


def _ppl(model: nn.Module, ids: torch.Tensor = HELD_OUT) -> float:
    with torch.no_grad():
        return math.exp(float(model(ids, labels=ids).loss))


def test_the_trained_model_learnt_the_language(lm):
    floor = math.exp(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))  # 1.649; a uniform guess: 16
    assert floor < _ppl(lm) < V / 4


# --- the closed forms ---------------------------------------------------------------------------------------------
def _pair(seed: int = 0) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    dense = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    small = nn.Sequential(nn.Linear(8, 10), nn.ReLU(), nn.Linear(10, 4)).double()
    keep = torch.tensor([0, 2, 3, 5, 6, 8, 9, 11, 12, 15])
    with torch.no_grad():
        small[0].weight.copy_(dense[0].weight[keep])
        small[0].bias.copy_(dense[0].bias[keep])
        small[2].weight.copy_(dense[2].weight[:, keep])
        small[2].bias.copy_(dense[2].bias)
    return dense, small, torch.randn(200, 8, dtype=torch.float64)


@pytest.mark.parametrize("damping", [0.0, 0.01, 0.5])
def test_lstsq_is_the_damped_least_squares_solution(damping):
    dense, small, x = _pair()
    with torch.no_grad():
        y = dense(x)
        h = torch.relu(small[0](x))
    xa = torch.cat([h, torch.ones(200, 1, dtype=torch.float64)], 1)
    a = xa.T @ xa
    lam = damping * float(torch.diagonal(a)[:10].mean()) + 1e-12
    a[:10, :10] += lam * torch.eye(10, dtype=torch.float64)  # the weights are dampened, the bias is not
    want = torch.linalg.solve(a, xa.T @ y)
    r = hookscope.recover(small, dense, [x[:120], x[120:]], damping=damping)  # two batches, summed
    assert (small[2].weight.detach() - want[:10].T).abs().max() <= 1e-8
    assert (small[2].bias.detach() - want[10]).abs().max() <= 1e-8
    assert [row.layer for row in r.rows] == ["2"] and r.rows[0].error_after < r.rows[0].error_before
    with torch.no_grad():
        err = float(((small(x) - y) ** 2).sum() / (y ** 2).sum())
    assert abs(r.rows[0].error_after - err) <= 1e-9
    assert r.metric == "output mse" and r.dense == 0.0 and r.recovered < r.pruned
    assert hook_count(small) == hook_count(dense) == 0


def test_bias_compensation_adds_the_mean_of_the_lost_contribution():
    dense, small, x = _pair(1)
    with torch.no_grad():
        lost = (dense(x) - small(x)).mean(0)
        want = small[2].bias + lost
        w = small[2].weight.clone()
    r = hookscope.recover(small, dense, x, method="bias")
    assert (small[2].bias.detach() - want).abs().max() <= 1e-10
    assert torch.equal(small[2].weight.detach(), w)
    with torch.no_grad():
        assert (dense(x) - small(x)).mean(0).abs().max() <= 1e-10  # no mean error left
    assert r.rows[0].error_after < r.rows[0].error_before


# --- on the trained decoder ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compacted(lm) -> nn.Module:
    pruned = copy.deepcopy(lm)
    hookscope.prune_heads(pruned, CALIBRATION[:1], amount=0.5, mlp=0.5, data=CALIBRATION)
    return hookscope.compact(pruned, CALIBRATION[:1])


@pytest.mark.parametrize("method", ["lstsq", "distill"])
def test_recovery_after_heads_and_mlp_units_narrows_the_gap(lm, compacted, method):
    small = copy.deepcopy(compacted)
    setting = {"steps": 30, "lr": 3e-3} if method == "distill" else {}
    r = hookscope.recover(small, lm, CALIBRATION, method=method, held_out=HELD_OUT, **setting)
    assert r.metric == "perplexity"
    assert abs(r.dense - _ppl(lm)) <= 1e-4 * r.dense and abs(r.pruned - _ppl(compacted)) <= 1e-4 * r.pruned
    assert abs(r.recovered - _ppl(small)) <= 1e-4 * r.recovered
    assert r.dense < r.recovered < r.pruned, r.table()
    if method == "lstsq":
        assert {row.layer.rsplit(".", 1)[-1] for row in r.rows} == {"o_proj", "down_proj"} and len(r.rows) == 6
        assert all(row.error_after < row.error_before for row in r.rows)
    else:
        assert len(r.losses) == 30 and r.losses[-1] < r.losses[0]
    assert "of the gap closed" in r.table() and hook_count(small) == 0


def test_distillation_after_layer_removal_narrows_the_gap_and_generation_still_works(lm):
    cut = copy.deepcopy(lm)
    blocks = hookscope.layer_importance(cut, CALIBRATION).lowest(1)
    hookscope.remove_layers(cut, blocks)
    r = hookscope.recover(cut, lm, CALIBRATION, method="distill", held_out=HELD_OUT, steps=30, lr=3e-3,
                          layers="model.norm")
    assert r.dense < r.recovered < r.pruned, r.table()
    with torch.no_grad():
        ids = HELD_OUT[:1, :4]
        a = cut.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False, use_cache=True, attention_mask=torch.ones_like(ids))
        b = cut.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False, use_cache=False, attention_mask=torch.ones_like(ids))
    assert torch.equal(a, b) and a.shape == (1, 9)


def _magnitude(model: nn.Module, setting: dict[str, object]) -> None:
    """Magnitude masks on the same layers as the calibrated methods: the decoder blocks' linear layers."""
    for block in model.model.layers:
        for m in block.modules():
            if type(m) is nn.Linear:
                w = m.weight.detach()
                if "n_m" in setting:
                    n, k = setting["n_m"]
                    idx = w.abs().reshape(w.shape[0], -1, k).topk(n, -1, largest=False).indices
                    pruned = torch.zeros_like(w.reshape(w.shape[0], -1, k), dtype=torch.bool).scatter_(-1, idx, True)
                    pruned = pruned.reshape(w.shape)
                else:
                    idx = w.abs().sort(dim=-1, stable=True).indices[:, :int(w.shape[1] * setting["sparsity"])]
                    pruned = torch.zeros_like(w, dtype=torch.bool).scatter_(1, idx, True)
                with torch.no_grad():
                    m.weight[pruned] = 0


@pytest.mark.parametrize("setting", [{"sparsity": 0.5}, {"n_m": (2, 4)}], ids=str)
def test_wanda_and_sparsegpt_stay_nearer_the_dense_decoder_than_magnitude(lm, setting):
    mag = copy.deepcopy(lm)
    _magnitude(mag, setting)
    got = {}
    for method in ("wanda", "sparsegpt"):
        net = copy.deepcopy(lm)
        hookscope.prune(net, method=method, data=CALIBRATION, **setting)
        got[method] = _ppl(net)
    dense, magnitude = _ppl(lm), _ppl(mag)
    assert dense < got["sparsegpt"] < magnitude, (dense, got, magnitude)
    # Wanda's edge comes from inputs of very different scales (planted in test_prune_sparsegpt.py, where it
    # holds at 2:4 too); this decoder has none, and at 2:4 Wanda lands on either side of magnitude with the
    # training length (bench/RESULTS.md), so only the 50% claim is asserted here
    if "sparsity" in setting:
        assert dense < got["wanda"] < magnitude, (dense, got, magnitude)


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"method": "lsq"}, "no recovery method 'lsq'. Did you mean 'lstsq'"),
    ({"steps": 0}, "steps=0 is not a count of steps"),
    ({"damping": -1.0}, "damping=-1.0 is not a number >= 0"),
    ({"data": "text"}, "data= is not calibration data"),
])
def test_bad_recovery_is_one_line_and_the_model_untouched(kwargs, text):
    dense, small, x = _pair()
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(hookscope.HookscopeError, match=text) as e:
        hookscope.recover(small, dense, **{"data": x, **kwargs})
    assert "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in small.state_dict().items())


def test_nothing_to_refit_or_the_same_model_is_refused():
    dense, _, x = _pair()
    other = copy.deepcopy(dense)
    with pytest.raises(hookscope.HookscopeError, match="compact the pruned model first"):
        hookscope.recover(other, dense, x)
    with pytest.raises(hookscope.HookscopeError, match="model and dense are the same object"):
        hookscope.recover(dense, dense, x)
    with pytest.raises(hookscope.HookscopeError, match="has no bias to compensate"):
        d = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2, bias=False))
        s = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2, bias=False))
        hookscope.recover(s, d, torch.randn(8, 4), method="bias")


@pytest.mark.parametrize("method", ["lstsq", "bias", "distill"])
def test_a_dense_model_that_fails_on_the_data_is_one_line_and_the_model_untouched(method):
    dense, small, x = _pair()
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(hookscope.HookscopeError, match="the dense or the pruned model fails on the data") as e:
        hookscope.recover(small, dense.float(), x, method=method, steps=2)
    assert "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in small.state_dict().items())
    assert hook_count(small) == 0 and hook_count(dense) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to put the dense model on another device than the pruned one")
@pytest.mark.parametrize("method", ["lstsq", "distill"])
def test_the_dense_model_may_sit_on_another_device(method):
    dense, small, x = _pair()
    here = copy.deepcopy(small)
    want = hookscope.recover(here, dense, x, method=method, steps=2)
    got = hookscope.recover(small.cuda(), dense, x, method=method, steps=2)
    assert got.recovered == pytest.approx(want.recovered, rel=1e-6)
    for (n, p), (_, q) in zip(small.named_parameters(), here.named_parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-6, atol=1e-9, msg=n)


def test_lstsq_without_damping_on_rank_deficient_inputs_stays_finite_and_fits():
    """Inputs on a 2-dimensional subspace (the Gram matrix singular), damping 0: the refit is finite and as
    good as the pseudo-inverse's least-squares fit."""
    dense, small, _ = _pair()
    x = torch.randn(200, 2, dtype=torch.float64) @ torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        h = torch.relu(small[0](x))
        h = torch.cat([h, torch.ones_like(h[:, :1])], 1)
        y = dense(x)
        best = float(((y - h @ torch.linalg.pinv(h) @ y) ** 2).sum() / (y ** 2).sum())
    r = hookscope.recover(small, dense, x, damping=0.0)
    assert all(math.isfinite(p.abs().max().item()) for p in small.parameters())
    assert r.rows[0].error_after == pytest.approx(best, rel=1e-4, abs=1e-9)
    assert max(p.abs().max().item() for p in small.parameters()) < 1e3


@pytest.mark.parametrize("method", ["lstsq", "bias"])
def test_the_refit_leaves_the_padding_out(method):
    """A padded batch with its attention mask refits as the same sequences unpadded, one batch each."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, pad_token_id=0, mlp_bias=True)
    dense = transformers.LlamaForCausalLM(cfg).eval()
    small_cfg = copy.deepcopy(cfg)
    small_cfg.intermediate_size = 20
    small = transformers.LlamaForCausalLM(small_cfg).eval()
    sd = dense.state_dict()
    with torch.no_grad():
        for k, v in small.state_dict().items():
            w = sd[k]
            v.copy_(w[:, :20] if k.endswith("down_proj.weight") else w[:20] if v.shape != w.shape else w)
    a, b = torch.randint(1, 32, (1, 10)), torch.randint(1, 32, (1, 6))
    padded = torch.cat([a, torch.cat([b, torch.zeros(1, 4, dtype=torch.long)], 1)])
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    one, two = copy.deepcopy(small), copy.deepcopy(small)
    hookscope.recover(one, dense, {"input_ids": padded, "attention_mask": mask}, method=method,
                      held_out=[a, b])
    hookscope.recover(two, dense, [a, b], method=method)
    for (n, p), (_, q) in zip(one.named_parameters(), two.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=n)


def test_distillation_leaves_the_padding_out():
    """Two padded batches that differ only in what sits at their pad positions distil alike: the pads
    are not text, so neither the KL term nor a layer's squared error reads them."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, pad_token_id=0)
    dense = transformers.LlamaForCausalLM(cfg).eval()
    small = copy.deepcopy(dense)
    with torch.no_grad():
        small.model.layers[1].mlp.down_proj.weight.mul_(0.5)
    a, b = torch.randint(1, 32, (1, 10)), torch.randint(1, 32, (1, 6))
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    pads = [torch.cat([a, torch.cat([b, torch.full((1, 4), fill, dtype=torch.long)], 1)]) for fill in (0, 7)]
    models = [copy.deepcopy(small), copy.deepcopy(small)]
    for model, ids in zip(models, pads):
        hookscope.recover(model, dense, {"input_ids": ids, "attention_mask": mask}, method="distill", steps=3,
                          layers=["model.norm"], held_out=[a, b])
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=n)
    assert hook_count(models[0]) == 0 and hook_count(dense) == 0
