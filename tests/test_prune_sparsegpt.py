"""SparseGPT masks and weight update through calibration hooks: equal to the update written out here
column by column in fp64, blocked or not; and both calibrated methods nearer the dense model than magnitude."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch import nn

import hookscope
from hookscope.core import hook_count

transformers.logging.set_verbosity_error()


def _reference(w: torch.Tensor, x: torch.Tensor, sparsity: float | None, n_m: tuple[int, int] | None,
               blocksize: int, percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT's update with no lazy batching: every column's error applied at once to all later columns;
    the unstructured mask chosen at the start of each block of ``blocksize`` columns, N:M at each M."""
    w = w.clone()
    h = 2 * x.T @ x / x.shape[0]
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += percdamp * torch.diag(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    pruned = torch.zeros_like(w, dtype=torch.bool)
    cols = w.shape[1]
    for i in range(cols):
        if n_m is None and i % blocksize == 0:
            j = min(i + blocksize, cols)
            score = (w[:, i:j] ** 2 / torch.diag(u)[i:j] ** 2).flatten()
            chosen = torch.zeros_like(score, dtype=torch.bool)
            chosen[score.argsort()[: int(score.numel() * sparsity)]] = True
            pruned[:, i:j] = chosen.reshape(w.shape[0], j - i)
        if n_m is not None and i % n_m[1] == 0:
            score = w[:, i:i + n_m[1]] ** 2 / torch.diag(u)[i:i + n_m[1]] ** 2
            for r in range(w.shape[0]):
                pruned[r, i + score[r].argsort()[: n_m[0]]] = True
        q = torch.where(pruned[:, i], torch.zeros_like(w[:, i]), w[:, i])
        err = (w[:, i] - q) / u[i, i]
        w[:, i:] -= torch.outer(err, u[i, i:])
        w[:, i] = q
    return w, pruned


def _layer_and_data(seed: int = 0) -> tuple[nn.Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(32, 6, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(6, 32, generator=g, dtype=torch.float64))
    scales = torch.logspace(-1, 1, 32, dtype=torch.float64)
    x = torch.randn(64, 32, generator=g, dtype=torch.float64) * scales
    x[:, 5] = 0  # an input never active: its column is zeroed, as the reference does
    return lin, x


SETTINGS = [{"sparsity": 0.5}, {"sparsity": 0.3}, {"n_m": (2, 4)}, {"n_m": (4, 8)}]


@pytest.mark.parametrize("blocksize", [4, 8, 13, 32, 128])
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_the_pruned_weights_are_the_column_by_column_update_in_fp64(setting, blocksize):
    if "n_m" in setting and blocksize % setting["n_m"][1]:
        pytest.skip("N:M groups must not straddle two blocks (refused: see the test below)")
    lin, x = _layer_and_data()
    want_w, want_pruned = _reference(lin.weight.detach(), x, setting.get("sparsity"), setting.get("n_m"), blocksize)
    # [64, 1, 32]: 64 samples of one token, the count the Hessian is averaged over (2 X X^T / 64)
    r = hookscope.prune_calibrated(lin, x.unsqueeze(1), method="sparsegpt", blocksize=blocksize, **setting)
    assert torch.equal(lin.weight_mask == 0, want_pruned)
    assert (lin.weight_orig.detach() - want_w).abs().max() <= 1e-8
    assert torch.equal(lin.weight, lin.weight_orig * lin.weight_mask)
    assert bool((lin.weight_orig[:, 5] == 0).all())
    assert r.zeros == int((lin.weight == 0).sum())


@pytest.mark.parametrize("n_m", [(2, 4), (4, 8)])
def test_blocked_equals_unblocked_for_n_m(n_m):
    """N:M masks do not depend on the block: the lazy updates in blocks give the column-by-column result."""
    lin, x = _layer_and_data(1)
    one = copy.deepcopy(lin)
    hookscope.prune_calibrated(lin, x, method="sparsegpt", n_m=n_m, blocksize=n_m[1])
    hookscope.prune_calibrated(one, x, method="sparsegpt", n_m=n_m, blocksize=128)
    assert torch.equal(lin.weight_mask, one.weight_mask)
    assert (lin.weight_orig - one.weight_orig).abs().max() <= 1e-10


def test_sparsegpt_on_a_decoder_prunes_half_of_each_layer_and_updates_the_kept_weights():
    torch.manual_seed(0)
    cfg = transformers.OPTConfig(vocab_size=40, hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                 max_position_embeddings=32, word_embed_proj_dim=16, bos_token_id=0, eos_token_id=1,
                                 pad_token_id=1)
    model = transformers.OPTForCausalLM(cfg).eval()
    dense = copy.deepcopy(model)
    r = hookscope.prune_calibrated(model, torch.randint(2, 40, (4, 12)), method="sparsegpt", n_m=(2, 4))
    assert len(r.rows) == 12 and r.sparsity == 0.5
    q = model.model.decoder.layers[1].self_attn.q_proj
    was = dense.model.decoder.layers[1].self_attn.q_proj.weight
    kept = q.weight_mask == 1
    assert not torch.allclose(q.weight_orig[kept], was[kept])  # the update moved the kept weights
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight  # the head is left alone, tied
    hookscope.remove_masks(model)
    assert hook_count(model) == 0


def test_gpt2_conv1d_layers_are_pruned_along_their_inputs():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2,
                                                                 n_positions=32)).eval()
    r = hookscope.prune_calibrated(model, torch.randint(0, 40, (2, 8)), method="sparsegpt", n_m=(2, 4))
    fc = model.transformer.h[0].mlp.c_fc  # weight (in, out): groups of 4 consecutive inputs of each output
    groups = fc.weight_mask.t().reshape(fc.weight_mask.shape[1], -1, 4)
    assert bool((groups.sum(-1) == 2).all()) and len(r.rows) == 8


def test_a_block_that_would_split_n_m_groups_is_one_line():
    lin, x = _layer_and_data()
    before = lin.weight.detach().clone()
    with pytest.raises(hookscope.HookscopeError, match="blocksize=12 is not a multiple of M=8") as e:
        hookscope.prune_calibrated(lin, x, method="sparsegpt", n_m=(4, 8), blocksize=12)
    assert "\n" not in str(e.value) and torch.equal(lin.weight, before) and hook_count(lin) == 0
    hookscope.prune_calibrated(lin, x, method="wanda", n_m=(4, 8), blocksize=12)  # Wanda has no blocks
    assert bool((lin.weight_mask.reshape(6, 4, 8).sum(-1) == 4).all())


def test_a_hessian_that_stays_singular_is_one_line_and_the_model_untouched():
    lin, x = _layer_and_data()
    before = lin.weight.detach().clone()
    with pytest.raises(hookscope.HookscopeError, match="not positive definite") as e:
        hookscope.prune_calibrated(lin, x[:2], method="sparsegpt", sparsity=0.5, percdamp=0.0)
    assert "\n" not in str(e.value)
    assert torch.equal(lin.weight, before) and hook_count(lin) == 0


# --- quality: a model trained here on inputs of very different scales ----------------------------------
def _task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # 8 inputs that matter, on large scales (their weights small), and 24 that do not, on a tiny scale:
    # magnitude keeps the useless weights, an activation-aware score the useful ones
    scales = torch.cat([torch.logspace(0.5, 1.5, 8), torch.full((24,), 0.05)])
    z = torch.randn(n, 32, generator=g)
    teacher = torch.randn(8, 4, generator=torch.Generator().manual_seed(99)) / 2
    return z * scales, torch.tanh(z[:, :8] @ teacher) + 0.1 * z[:, :4] ** 2


@pytest.fixture(scope="module")
def trained() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = _task(2048, 0)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net.eval()


def _loss(net: nn.Module) -> float:
    x, y = _task(1024, 1)
    with torch.no_grad():
        return float(nn.functional.mse_loss(net(x), y))


def _magnitude(net: nn.Module, setting: dict[str, object]) -> nn.Module:
    """Magnitude pruning, the baseline: per row (as Wanda ranks) or the N smallest |w| of every M."""
    net = copy.deepcopy(net)
    with torch.no_grad():
        for lin in (m for m in net if isinstance(m, nn.Linear)):
            w = lin.weight
            if "n_m" in setting:
                n, m = setting["n_m"]  # type: ignore[misc]
                groups = w.abs().reshape(w.shape[0], -1, m)
                idx = groups.argsort(-1)[..., :n]
                w.view(w.shape[0], -1, m).scatter_(-1, idx, 0.0)
            else:
                k = int(w.shape[1] * float(setting["sparsity"]))  # type: ignore[arg-type]
                w.scatter_(1, w.abs().argsort(1)[:, :k], 0.0)
    return net


@pytest.mark.parametrize("setting", [{"sparsity": 0.5}, {"n_m": (2, 4)}], ids=str)
def test_wanda_and_sparsegpt_stay_nearer_the_dense_loss_than_magnitude(trained, setting):
    dense = _loss(trained)
    calib = _task(256, 2)[0]
    magnitude = _loss(_magnitude(trained, setting))
    layer_magnitude = copy.deepcopy(trained)  # hookscope's own magnitude masks, each layer ranked as a whole
    if "sparsity" in setting:
        hookscope.prune(layer_magnitude, amount=0.5)
        magnitude = min(magnitude, _loss(layer_magnitude))
    got = {}
    for method in ("wanda", "sparsegpt"):
        net = copy.deepcopy(trained)
        r = hookscope.prune_calibrated(net, calib, method=method, **setting)
        assert r.sparsity == pytest.approx(0.5)
        got[method] = _loss(net)
    assert dense < got["wanda"] < magnitude and dense < got["sparsegpt"] < magnitude, (dense, got, magnitude)
    assert got["sparsegpt"] - dense < 0.75 * (magnitude - dense)  # the weight update wins back much of the loss
