"""Wanda and SparseGPT against the reference programs' own loops, rewritten here from the published
algorithms step by step (``locuslab/wanda`` ``lib/prune.py`` / ``lib/layerwrapper.py``, ``IST-DASLab/sparsegpt``
``sparsegpt.py``): the statistics folded in sample by sample, one decoder layer at a time fed one sequence at a
time, the weights zeroed in the layer itself, SparseGPT's Cholesky factor of the dampened inverse, its blocks of
columns with lazy updates and its N:M choice inside blocks. One layer in fp64 and a decoder family the other
tests do not use (Qwen2), to <= 1e-8; and ``prune(method=...)`` as the one entry point."""

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


class _Wrapped:
    """The reference's per-layer statistics: a running mean over samples, folded in call by call."""

    def __init__(self, columns: int, dtype: torch.dtype) -> None:
        self.scaler_row = torch.zeros(columns, dtype=dtype)
        self.h = torch.zeros(columns, columns, dtype=dtype)
        self.nsamples = 0

    def add_batch(self, inp: torch.Tensor) -> None:
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        inp = inp.reshape(-1, inp.shape[-1]).t()
        self.scaler_row *= self.nsamples / (self.nsamples + tmp)
        self.h *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        self.scaler_row += torch.norm(inp, p=2, dim=1) ** 2 / self.nsamples
        x = math.sqrt(2 / self.nsamples) * inp
        self.h += x.matmul(x.t())


def _wanda_mask(w: torch.Tensor, scaler_row: torch.Tensor, sparsity: float, prune_n: int, prune_m: int) -> torch.Tensor:
    metric = torch.abs(w) * torch.sqrt(scaler_row.reshape(1, -1))
    mask = torch.zeros_like(metric) == 1
    if prune_n != 0:
        for ii in range(metric.shape[1]):
            if ii % prune_m == 0:
                tmp = metric[:, ii:ii + prune_m]
                mask.scatter_(1, ii + torch.topk(tmp, prune_n, dim=1, largest=False)[1], True)
    else:
        indices = torch.sort(metric, dim=-1, stable=True)[1][:, :int(metric.shape[1] * sparsity)]
        mask.scatter_(1, indices, True)
    return mask


def _fasterprune(w: torch.Tensor, h: torch.Tensor, sparsity: float, prune_n: int, prune_m: int, blocksize: int,
                 percdamp: float, rank: int | None = None) -> torch.Tensor:
    """SparseGPT's pruning of one weight ``(out, in)``. ``rank``: the index into each block's sorted scores
    used as the unstructured threshold (``tmp <= thresh``); the reference's own is ``int(numel * sparsity)``,
    which prunes one entry more than the fraction; hookscope prunes exactly the fraction (index one lower)."""
    w, h = w.clone(), h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    damp = percdamp * torch.mean(torch.diag(h))
    diag = torch.arange(h.shape[0])
    h[diag, diag] += damp
    h = torch.linalg.cholesky(h)
    h = torch.cholesky_inverse(h)
    hinv = torch.linalg.cholesky(h, upper=True)
    for i1 in range(0, w.shape[1], blocksize):
        i2 = min(i1 + blocksize, w.shape[1])
        w1 = w[:, i1:i2].clone()
        q1, err1 = torch.zeros_like(w1), torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        if prune_n == 0:
            tmp = w1 ** 2 / (torch.diag(hinv1).reshape(1, -1)) ** 2
            k = int(tmp.numel() * sparsity) if rank is None else rank(tmp.numel())
            mask1 = tmp <= torch.sort(tmp.flatten())[0][k] if k >= 0 else torch.zeros_like(w1) == 1
        else:
            mask1 = torch.zeros_like(w1) == 1
        for i in range(i2 - i1):
            col = w1[:, i]
            d = hinv1[i, i]
            if prune_n != 0 and i % prune_m == 0:
                tmp = w1[:, i:i + prune_m] ** 2 / (torch.diag(hinv1)[i:i + prune_m].reshape(1, -1)) ** 2
                mask1.scatter_(1, i + torch.topk(tmp, prune_n, dim=1, largest=False)[1], True)
            q = col.clone()
            q[mask1[:, i]] = 0
            q1[:, i] = q
            err = (col - q) / d
            w1[:, i:] -= err.unsqueeze(1).matmul(hinv1[i, i:].unsqueeze(0))
            err1[:, i] = err
        w[:, i1:i2] = q1
        w[:, i2:] -= err1.matmul(hinv[i1:i2, i2:])
    return w


def _exact(sparsity: float):  # type: ignore[no-untyped-def]
    return lambda numel: int(numel * sparsity) - 1


def _layer(seed: int = 0) -> tuple[nn.Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(64, 12, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(12, 64, generator=g, dtype=torch.float64))
    x = torch.randn(8, 10, 64, generator=g, dtype=torch.float64) * torch.logspace(-1, 1, 64, dtype=torch.float64)
    x[..., 7] = 0  # an input never active: the reference zeroes its column
    return lin, x


SETTINGS = [(0.5, 0, 0), (0.3, 0, 0), (0.0, 2, 4), (0.0, 4, 8)]


@pytest.mark.parametrize("blocksize", [8, 16, 128])
@pytest.mark.parametrize(("sparsity", "n", "m"), SETTINGS, ids=str)
def test_sparsegpt_on_one_layer_is_the_reference_loop_in_fp64(sparsity, n, m, blocksize):
    lin, x = _layer()
    stats = _Wrapped(64, torch.float64)
    for j in range(x.shape[0]):  # one sequence at a time, as the reference feeds its samples
        stats.add_batch(x[j])
    want = _fasterprune(lin.weight.detach(), stats.h, sparsity, n, m, blocksize, 0.01,
                        rank=_exact(sparsity) if n == 0 else None)
    setting = {"n_m": (n, m)} if n else {"sparsity": sparsity}
    hookscope.prune_calibrated(lin, x, method="sparsegpt", blocksize=blocksize, **setting)  # one batch of 8
    got = lin.weight.detach()
    assert (got - want).abs().max() <= 1e-8
    assert torch.equal(got == 0, want == 0)


@pytest.mark.parametrize(("sparsity", "n", "m"), SETTINGS, ids=str)
def test_wanda_on_one_layer_is_the_reference_mask(sparsity, n, m):
    lin, x = _layer(1)
    stats = _Wrapped(64, torch.float64)
    for j in range(x.shape[0]):
        stats.add_batch(x[j])
    want = _wanda_mask(lin.weight.detach(), stats.scaler_row, sparsity, n, m)
    setting = {"n_m": (n, m)} if n else {"sparsity": sparsity}
    hookscope.prune_calibrated(lin, x, method="wanda", **setting)
    assert torch.equal(lin.weight_mask == 0, want)


def test_the_reference_threshold_prunes_one_entry_more_per_block_than_the_fraction():
    """The documented difference: ``tmp <= sorted[int(numel * sparsity)]`` keeps one entry too few per block
    (one even at sparsity 0); hookscope prunes exactly ``int(numel * sparsity)``."""
    lin, x = _layer(2)
    stats = _Wrapped(64, torch.float64)
    stats.add_batch(x)
    ref = _fasterprune(lin.weight.detach(), stats.h, 0.5, 0, 0, 16, 0.01)
    ours = _fasterprune(lin.weight.detach(), stats.h, 0.5, 0, 0, 16, 0.01, rank=_exact(0.5))
    blocks = 64 // 16
    assert int((ours == 0).sum()) == blocks * 12 * 16 // 2
    assert int((ref == 0).sum()) == int((ours == 0).sum()) + blocks
    hookscope.prune_calibrated(lin, x, method="sparsegpt", sparsity=0.5, blocksize=16)
    assert int((lin.weight == 0).sum()) == int((ours == 0).sum())


def _qwen2() -> nn.Module:
    torch.manual_seed(5)
    cfg = transformers.Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.Qwen2ForCausalLM(cfg).eval().double()


class _Stop(Exception):
    pass


def _layer_inputs(model: nn.Module, data: torch.Tensor) -> tuple[list[torch.Tensor], dict[str, object]]:
    """The reference's Catcher: each sequence's input to the first decoder layer, and the keywords it gets."""
    inps: list[torch.Tensor] = []
    kwargs: dict[str, object] = {}

    def catch(module: nn.Module, args: tuple[object, ...], kw: dict[str, object]) -> None:
        inps.append(args[0] if args else kw["hidden_states"])
        kwargs.update({k: v for k, v in kw.items() if k not in ("hidden_states", "past_key_values", "past_key_value")})
        raise _Stop

    handle = model.model.layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        for j in range(data.shape[0]):
            try:
                model(data[j:j + 1], use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    kwargs["use_cache"] = False
    return inps, kwargs


def _reference_decoder(model: nn.Module, data: torch.Tensor, method: str, sparsity: float, n: int,
                       m: int) -> None:
    """The reference's ``prune_wanda`` / ``prune_sparsegpt``: layer by layer, the pruned weights written in."""
    with torch.no_grad():
        inps, kwargs = _layer_inputs(model, data)
        for layer in model.model.layers:
            subset = {q: mod for q, mod in layer.named_modules() if type(mod) is nn.Linear}
            wrapped = {q: _Wrapped(mod.in_features, torch.float64) for q, mod in subset.items()}
            handles = [mod.register_forward_hook(lambda _, i, o, q=q: wrapped[q].add_batch(i[0].data))
                       for q, mod in subset.items()]
            for inp in inps:
                layer(inp, **kwargs)
            for h in handles:
                h.remove()
            for q, mod in subset.items():
                if method == "wanda":
                    mod.weight.data[_wanda_mask(mod.weight.data, wrapped[q].scaler_row, sparsity, n, m)] = 0
                else:
                    mod.weight.data = _fasterprune(mod.weight.data, wrapped[q].h, sparsity, n, m, 128, 0.01,
                                                   rank=_exact(sparsity) if n == 0 else None)
            outs = [layer(inp, **kwargs) for inp in inps]
            inps = [o[0] if isinstance(o, tuple) else o for o in outs]


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize(("sparsity", "n", "m"), [(0.5, 0, 0), (0.0, 2, 4)], ids=str)
def test_a_held_out_decoder_is_pruned_as_the_reference_prunes_it(method, sparsity, n, m):
    model = _qwen2()
    ref = copy.deepcopy(model)
    data = torch.randint(0, 48, (4, 16), generator=torch.Generator().manual_seed(3))
    _reference_decoder(ref, data, method, sparsity, n, m)
    setting = {"n_m": (n, m)} if n else {"sparsity": sparsity}
    r = hookscope.prune_calibrated(model, data, method=method, **setting)
    assert len(r.rows) == 3 * 7
    for q, mod in model.named_modules():
        if type(mod) is nn.Linear and q.startswith("model.layers."):
            want = ref.get_submodule(q).weight.detach()
            assert torch.equal(mod.weight == 0, want == 0), q
            assert (mod.weight.detach() - want).abs().max() <= 1e-8, q
    with torch.no_grad():
        assert (model(data).logits - ref(data).logits).abs().max() <= 1e-8
    hookscope.remove_masks(model)
    assert hook_count(model) == 0


def test_prune_with_a_calibrated_method_is_the_calibrated_path():
    model, data = _qwen2(), torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(4))
    other = copy.deepcopy(model)
    r = hookscope.prune(model, method="wanda", data=data, sparsity=0.5)
    s = hookscope.prune_calibrated(other, data, method="wanda", sparsity=0.5)
    assert r.to_dict() == s.to_dict() and r.sparsity == 0.5
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"method": "wanda", "sparsity": 0.5}, "method='wanda' is calibrated on data; pass data="),
    ({"method": "wanda", "data": 1, "amount": 0.5}, "method='wanda' takes sparsity= or n_m="),
    ({"method": "l1_unstructured", "amount": 0.5, "data": 1}, "data= is for the calibrated methods"),
    ({"method": "l1_unstructured", "amount": 0.5, "sparsity": 0.5}, "sparsity= and n_m= are for the calibrated"),
    ({"method": "l1_unstructured"}, "pass amount="),
])
def test_prune_refuses_mixed_words_in_one_line(kwargs, text):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(hookscope.HookscopeError, match=text.replace("(", r"\(").replace(")", r"\)")) as e:
        hookscope.prune(model, **kwargs)
    assert "\n" not in str(e.value) and hook_count(model) == 0 and hookscope.sparsity(model).zeros == 0


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_padded_tokens_are_not_counted_in_the_input_statistics(method):
    """A padded batch with its attention mask prunes exactly as the same sequences unpadded, one batch each:
    the pad positions (attention_mask 0) add nothing to ||X_j|| nor to H."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, pad_token_id=0)
    base = transformers.LlamaForCausalLM(cfg).eval()
    a, b = torch.randint(1, 64, (1, 8)), torch.randint(1, 64, (1, 5))
    padded = torch.cat([a, torch.cat([b, torch.zeros(1, 3, dtype=torch.long)], 1)])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    one, two = copy.deepcopy(base), copy.deepcopy(base)
    hookscope.prune(one, method=method, data={"input_ids": padded, "attention_mask": mask}, sparsity=0.5)
    hookscope.prune(two, method=method, data=[a, b], sparsity=0.5)
    masks = {n: t for n, t in two.named_buffers() if n.endswith("weight_mask")}
    assert len(masks) == 14
    for n, t in one.named_buffers():
        if n.endswith("weight_mask"):
            assert torch.equal(t, masks[n]), n
    for (n, p), (_, q) in zip(one.named_parameters(), two.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


def test_the_input_statistics_skip_the_tokens_masked_out():
    from hookscope.analysis.prune.calibrated import InputStats

    s = InputStats("norms", 2, torch.device("cpu"), torch.float64)
    s.tokens = torch.tensor([[1, 0], [1, 1]])
    s.add(torch.tensor([[[1.0, 2.0], [100.0, 100.0]], [[3.0, 0.0], [0.0, 1.0]]], dtype=torch.float64))
    torch.testing.assert_close(s.value, torch.tensor([(1 + 9) / 2, (4 + 1) / 2], dtype=torch.float64))
    assert s.nsamples == 2
    h = InputStats("hessian", 2, torch.device("cpu"), torch.float64)
    h.tokens = torch.tensor([[0, 1]])
    h.add(torch.tensor([[[5.0, 5.0], [1.0, 2.0]]], dtype=torch.float64))
    torch.testing.assert_close(h.value, torch.tensor([[2.0, 4.0], [4.0, 8.0]], dtype=torch.float64))


def test_a_layer_whose_inputs_are_not_the_padded_tokens_is_refused():
    from hookscope.analysis.prune.calibrated import InputStats

    s = InputStats("norms", 2, torch.device("cpu"), torch.float64)
    s.tokens = torch.tensor([[1, 0]])
    with pytest.raises(hookscope.HookscopeError, match="attention_mask"):
        s.add(torch.ones(3, 2, dtype=torch.float64))
