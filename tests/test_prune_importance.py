"""Channel importance (issue 15, point 2): every kind against an independent computation from
activations and gradients captured by plain hooks, weighting by samples, shared modules, dict batches,
streaming memory, and the model (flags, buffers, .grad, requires_grad, grad mode, hooks) put back."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers import AddBack, no_hooks
from torch import nn

from hookscope.analysis.prune.importance import ChannelImportance, channel_importance
from hookscope.errors import ForwardError, HookscopeError


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 5, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(5, 3))
    with torch.no_grad():  # running statistics that are not the defaults, so eval mode matters
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


def _data(sizes=(2, 3, 5), seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 3, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]


def _outputs(model: nn.Module, name: str, data, *, grads: bool = False):
    """Every output of module ``name`` over ``data`` (and, with ``grads``, d summed-CE / d output),
    call after call (batch order within a call), from :func:`_per_call_outputs`."""
    acts, gs = _per_call_outputs(model, name, data, grads=grads)
    return [t for k in sorted(acts) for t in acts[k]], [t for k in sorted(gs) for t in gs[k]]


def _per_channel(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return t.movedim(dim, 0).reshape(t.shape[dim], -1).double()


def _taylor_ref(acts, gs, dim: int = 1) -> torch.Tensor:
    moved = [(a * g).movedim(dim, 1).double() for a, g in zip(acts, gs)]
    per_sample = [m.reshape(m.shape[0], m.shape[1], -1).mean(2).abs() for m in moved]
    return torch.cat(per_sample).mean(0)


# --- values of every kind ---------------------------------------------------------------------------
@pytest.mark.parametrize("site", ["2", "4"])
def test_activation_is_mean_abs_over_every_sample_and_position(site):
    net, data = _net(), _data()
    acts, _ = _outputs(net, site, data)
    expected = _per_channel(torch.cat(acts)).abs().mean(1)
    res = channel_importance(net, data, layers={site: 1})
    assert res.scores[site].dtype == torch.float64 and res.scores[site].device.type == "cpu"
    torch.testing.assert_close(res.scores[site], expected)
    assert (res.batches, res.samples, res.calls[site]) == (3, 10, 3)
    # weighting by samples: the mean of the three batch means would be another number
    by_batch = torch.stack([_per_channel(a).abs().mean(1) for a in acts]).mean(0)
    assert not torch.allclose(by_batch, expected)


def test_apoz_is_one_minus_the_fraction_of_zeros_after_a_relu():
    net, data = _net(), _data()
    acts, _ = _outputs(net, "2", data)
    expected = 1 - (_per_channel(torch.cat(acts)) == 0).double().mean(1)
    res = channel_importance(net, data, layers={"2": 1}, importance="apoz")
    torch.testing.assert_close(res.scores["2"], expected)
    assert 0 < float(expected.min()) < float(expected.max()) < 1  # the test can tell channels apart


def test_apoz_warns_where_no_value_is_zero():
    with pytest.warns(UserWarning, match="not one exact zero"):
        res = channel_importance(_net(), _data(), layers={"1": 1}, importance="apoz")
    assert res.scores["1"].tolist() == [1.0] * 4


@pytest.mark.parametrize("site", ["2", "3", "4"])
def test_taylor_is_per_sample_abs_mean_of_activation_times_gradient(site):
    net, data = _net(), _data()
    acts, gs = _outputs(net, site, data, grads=True)
    res = channel_importance(net, data, layers={site: 1}, importance="taylor")
    torch.testing.assert_close(res.scores[site], _taylor_ref(acts, gs))
    assert res.samples == 10 and float(res.scores[site].min()) > 0


def test_taylor_with_a_user_loss_per_sample_is_summed():
    net, data = _net(), _data()
    acts, gs = _outputs(net, "4", data, grads=True)
    res = channel_importance(net, data, layers={"4": 1}, importance="taylor",
                             loss=lambda out, batch: F.cross_entropy(out, batch[1], reduction="none"))
    torch.testing.assert_close(res.scores["4"], _taylor_ref(acts, gs))


@pytest.mark.parametrize("kind", ["l1", "l2"])
def test_weight_norms_of_conv_linear_bn_and_depthwise_rows(kind):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, groups=4), nn.Linear(5, 6),
                        nn.ConvTranspose2d(4, 2, 3))
    nn.init.normal_(net[1].weight)
    res = channel_importance(net, None, layers=["0", "1", "2", "3", "4"], importance=kind)
    p = 1 if kind == "l1" else 2
    for name, w in [("0", net[0].weight), ("1", net[1].weight), ("2", net[2].weight), ("3", net[3].weight),
                    ("4", net[4].weight.transpose(0, 1))]:
        expected = torch.linalg.vector_norm(w.detach().double().reshape(w.shape[0], -1), ord=p, dim=1)
        torch.testing.assert_close(res.scores[name], expected)
    assert res.scores["2"].shape == (4,) and res.scores["4"].shape == (2,)
    assert res.batches == 0 and res.dims["0"] is None


def test_weight_kind_on_a_module_without_weight_is_refused():
    with pytest.raises(HookscopeError, match="'2' \\(ReLU\\) has none"):
        channel_importance(_net(), None, layers=["2"], importance="l1")


# --- channel dims -----------------------------------------------------------------------------------
class Tokens(nn.Module):
    """B x N x C tokens through Linear, GELU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 3))

    def forward(self, x):
        return self.mlp(x).mean(1)


def test_token_outputs_use_the_last_dim_and_selectors_infer_it():
    net, x = Tokens(), torch.randn(3, 7, 4)
    by_dict = channel_importance(net, x, layers={"mlp.1": -1})
    by_type = channel_importance(net, x, layers=nn.GELU)
    expected = _per_channel(net.mlp[:2](x).detach(), 2).abs().mean(1)
    torch.testing.assert_close(by_dict.scores["mlp.1"], expected)
    torch.testing.assert_close(by_type.scores["mlp.1"], expected)
    assert by_type.dims["mlp.1"] == 2 and by_type.scores["mlp.1"].shape == (6,)


def test_relu_after_batch_norm_infers_dim_one():
    res = channel_importance(_net(), _data(), layers=nn.ReLU)
    assert res.dims == {"2": 1, "4": 1} and res.scores["4"].shape == (5,)


class Permute(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1)


@pytest.mark.parametrize("net, shape", [
    (nn.Sequential(nn.Conv2d(3, 4, 1), Permute()), (2, 3, 5, 5)),  # dim 1 no longer holds the 4 channels
    (nn.Sequential(nn.GELU()), (2, 3, 5)),  # nothing before it says where its channels are
])
def test_an_ambiguous_channel_dim_is_refused_naming_sites(net, shape):
    with pytest.raises(HookscopeError, match="cannot tell the channel dim.*sites=") as e:
        channel_importance(net, torch.randn(*shape), layers=[type(net[-1])])
    assert "\n" not in str(e.value) and no_hooks(net)


def test_dim_zero_and_out_of_range_are_refused():
    with pytest.raises(HookscopeError, match="dim 0 is the batch"):
        channel_importance(_net(), _data(), layers={"2": 0})
    with pytest.raises(HookscopeError, match="out of range"):
        channel_importance(_net(), _data(), layers={"2": 5})


# --- shared modules and keyword batches ---------------------------------------------------------------
class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3)
        self.act = nn.Tanh()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.act(self.lin(self.act(self.lin(x)))))


@pytest.mark.parametrize("kind", ["activation", "taylor"])
def test_a_shared_module_accumulates_every_call(kind):
    net, data = Twice(), [(torch.randn(n, 3), torch.randint(0, 2, (n,))) for n in (2, 4)]
    acts, gs = _outputs(net, "lin", data, grads=kind == "taylor")
    assert len(acts) == 4
    res = channel_importance(net, data, layers={"lin": -1}, importance=kind)
    expected = (_per_channel(torch.cat(acts)).abs().mean(1) if kind == "activation"
                else _taylor_ref(acts, gs))
    torch.testing.assert_close(res.scores["lin"], expected)
    assert res.calls["lin"] == 4 and res.samples == 6


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(2, 4)

    def forward(self, x, scale, labels=None):
        return self.proj(x) * scale


def test_dict_batches_are_keyword_inputs_and_their_labels_feed_taylor():
    net = Keywords()
    data = [{"x": torch.randn(n, 2), "scale": torch.full((n, 1), 2.0), "labels": torch.randint(0, 4, (n,))}
            for n in (3, 1)]
    res = channel_importance(net, data, layers={"proj": -1})
    outs = torch.cat([net.proj(b["x"]).detach() for b in data])
    torch.testing.assert_close(res.scores["proj"], outs.abs().double().mean(0))
    tay = channel_importance(net, data, layers={"proj": -1}, importance="taylor")
    ref = []
    for b in data:
        a = net.proj(b["x"]).detach().requires_grad_()
        (g,) = torch.autograd.grad(F.cross_entropy(a * b["scale"], b["labels"], reduction="sum"), a)
        ref.append((a * g).abs().double())
    torch.testing.assert_close(tay.scores["proj"], torch.cat(ref).mean(0))


# --- streaming ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["activation", "taylor"])
def test_memory_is_flat_and_no_activation_outlives_the_pass(kind):
    net, (x, y) = _net(), _data((4,))[0]
    few = channel_importance(net, [(x, y)] * 5, layers={"4": 1}, importance=kind)
    alive: list[weakref.ref] = []
    spy = net[4].register_forward_hook(lambda m, i, o: alive.append(weakref.ref(o)))
    many = channel_importance(net, ((x.clone(), y) for _ in range(50)), layers={"4": 1}, importance=kind)
    spy.remove()
    gc.collect()
    torch.testing.assert_close(few.scores["4"], many.scores["4"])
    assert (few.samples, many.samples, many.batches) == (20, 200, 50)
    assert len(alive) == 50 and all(r() is None for r in alive)


def test_max_batches_stops_reading():
    res = channel_importance(_net(), iter(_data()), layers={"2": 1}, max_batches=2)
    assert (res.batches, res.samples) == (2, 5)


# --- the model as it was -----------------------------------------------------------------------------------
def test_taylor_leaves_grads_requires_grad_grad_mode_flags_and_buffers_as_they_were():
    net, data = _net(), _data()
    net[0].weight.grad = torch.full_like(net[0].weight, 7.0)
    net[3].weight.requires_grad_(False)
    net[7].train()
    state = copy.deepcopy(net.state_dict())
    flags = [m.training for m in net.modules()]
    with torch.no_grad():
        res = channel_importance(net, data, layers={"4": 1}, importance="taylor")
        assert not torch.is_grad_enabled()
    assert float(res.scores["4"].min()) > 0
    assert torch.equal(net[0].weight.grad, torch.full_like(net[0].weight, 7.0))
    assert all(p.grad is None for n, p in net.named_parameters() if n != "0.weight")
    assert not net[3].weight.requires_grad and net[0].weight.requires_grad
    assert [m.training for m in net.modules()] == flags and no_hooks(net)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())


def test_train_true_uses_batch_statistics_and_puts_running_statistics_back():
    net, data = _net(), _data()
    state = copy.deepcopy(net.state_dict())
    res = channel_importance(net, data, layers={"1": 1}, train=True)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items()) and not net.training
    ref = copy.deepcopy(net).train()
    acts = [ref[:2](x).detach() for x, _ in data]
    torch.testing.assert_close(res.scores["1"], _per_channel(torch.cat(acts)).abs().mean(1))


def test_taylor_reads_an_output_rewritten_in_place_as_its_module_returned_it():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Flatten(),
                        nn.LazyLinear(3)).eval()
    net(torch.zeros(1, 3, 6, 6))
    out_of_place = copy.deepcopy(net)
    out_of_place[2] = nn.ReLU()  # the same model without the in-place write: the true values by hand
    acts, gs = _outputs(out_of_place, "1", _data(), grads=True)
    assert float(torch.cat(acts).min()) < 0  # the ReLU would have rewritten these
    res = channel_importance(net, _data(), layers={"1": 1}, importance="taylor")
    torch.testing.assert_close(res.scores["1"], _taylor_ref(acts, gs))
    assert no_hooks(net) and float(res.scores["1"].min()) > 0
    relu = channel_importance(net, _data(), layers={"2": 1}, importance="taylor")  # the ReLU's own output
    acts, gs = _outputs(out_of_place, "2", _data(), grads=True)
    torch.testing.assert_close(relu.scores["2"], _taylor_ref(acts, gs))
    # activation reads the batch norm's output in its hook, before the ReLU rewrites it
    act = channel_importance(net, _data(), layers={"1": 1})
    bn = torch.cat([net[:2](x).detach() for x, _ in _data()])
    assert float(bn.min()) < 0
    torch.testing.assert_close(act.scores["1"], _per_channel(bn).abs().mean(1))


# --- bad input ----------------------------------------------------------------------------------------------
def test_a_failing_batch_is_named_and_leaves_no_hook():
    net, data = _net(), _data()
    data[1] = (torch.randn(3, 2, 6, 6), data[1][1])
    state = copy.deepcopy(net.state_dict())
    for kind in ("activation", "taylor"):
        with pytest.raises(ForwardError, match="^calibration batch 1: the forward pass failed in '0'") as e:
            channel_importance(net, data, layers={"2": 1}, importance=kind)
        assert "\n" not in str(e.value) and no_hooks(net)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize("call, message", [
    (lambda n: channel_importance(n, [], layers={"2": 1}), "no batch"),
    (lambda n: channel_importance(n, None, layers={"2": 1}), "data=None"),
    (lambda n: channel_importance(n, _data(), layers={"2": 1}, importance="taylr"), "Did you mean 'taylor'"),
    (lambda n: channel_importance(n, [x for x, _ in _data()], layers={"2": 1}, importance="taylor"), "loss="),
    (lambda n: channel_importance(n, _data(), layers={"2": 1}, loss=len), "drop loss="),
    (lambda n: channel_importance(n, _data(), layers={"conv9": 1}), "matches no module"),
    (lambda n: channel_importance(n, _data(), layers={"2": 1}, max_batches=0), "max_batches"),
    (lambda n: channel_importance(n, [(1, 2, 3)], layers={"2": 1}), "batch 0 is a tuple of 3"),
])
def test_bad_input_is_one_line(call, message):
    net = _net()
    with pytest.raises(HookscopeError, match=message) as e:
        call(net)
    assert "\n" not in str(e.value) and no_hooks(net)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 2)
        self.pair = nn.LSTM(2, 2, batch_first=True)

    def forward(self, x):
        return self.used(x)


def test_a_site_that_never_ran_or_returns_no_tensor_is_refused():
    net, x = Branchy(), torch.randn(2, 2)
    with pytest.raises(HookscopeError, match="'unused' never ran"):
        channel_importance(net, x, layers={"used": -1, "unused": -1})
    with pytest.raises(HookscopeError, match="'0' \\(LSTM\\) returns a tuple, not a tensor"):
        channel_importance(nn.Sequential(net.pair), torch.randn(2, 3, 2), layers={"0": -1})
    assert no_hooks(net)


# --- the result ---------------------------------------------------------------------------------------------
def test_result_protocol():
    res = channel_importance(_net(), _data(), layers={"2": 1, "4": 1}, device="cpu")
    assert isinstance(res, ChannelImportance) and [r.site for r in res.rows] == ["2", "4"]
    row = res.rows[1]
    assert row.channels == 5 and row.lowest == tuple(res.order("4")[:3])
    assert res.scores["4"][list(row.lowest)].tolist() == sorted(res.scores["4"].tolist())[:3]
    assert str(res).startswith("channel importance (activation, low = prune first), over 10 samples in 3 batches")
    d = json.loads(res.to_json())
    assert d["scores"]["2"] == res.scores["2"].tolist() and d["rows"][0]["dim"] == 1
    with pytest.raises(KeyError, match="no site '3' in this result. It has: '2', '4'"):
        res["3"]
    assert "2" in res and "3" not in res


# --- more batches and outputs -----------------------------------------------------------------------------
class Wrapped(nn.Module):
    """A Hugging Face-like model: keyword inputs, a ModelOutput-like result holding ``logits``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(3, 4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 2)

    def forward(self, input_ids, labels=None):
        from helpers import FakeModelOutput
        return FakeModelOutput(logits=self.head(self.act(self.body(input_ids))))


def test_a_dataloader_of_lists_and_a_model_output_with_logits():
    net = Wrapped()
    x, y = torch.randn(7, 3), torch.randint(0, 2, (7,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3)
    res = channel_importance(net, loader, layers={"act": -1}, importance="taylor")
    a = net.act(net.body(x)).detach().requires_grad_()
    (g,) = torch.autograd.grad(F.cross_entropy(net.head(a), y, reduction="sum"), a)
    torch.testing.assert_close(res.scores["act"], (a * g).abs().double().mean(0))
    assert (res.batches, res.samples) == (3, 7)
    by_kw = channel_importance(net, [{"input_ids": x, "labels": y}], layers={"act": -1}, importance="taylor")
    torch.testing.assert_close(by_kw.scores["act"], res.scores["act"])


def test_selectors_in_the_mapping_and_globs():
    res = channel_importance(_net(), _data(), layers={"[24]": 1})
    assert list(res.scores) == ["2", "4"]


def test_a_detached_loss_and_a_site_changing_its_channels_are_refused():
    net = _net()
    with pytest.raises(HookscopeError, match="does not depend on the model's output"):
        channel_importance(net, _data(), layers={"4": 1}, importance="taylor", loss=lambda out, b: out.detach().sum())
    flat = nn.Sequential(nn.Flatten())
    with pytest.raises(HookscopeError, match="'0' gave 12 channels on one call"):
        channel_importance(flat, [torch.randn(2, 3, 4), torch.randn(2, 5, 4)], layers={"0": 1})
    assert no_hooks(net) and no_hooks(flat) and torch.is_grad_enabled()


def test_flags_are_restored_after_a_failing_batch():
    net = _net().train()
    net[3].eval()
    flags = [m.training for m in net.modules()]
    with pytest.raises(ForwardError):
        channel_importance(net, [_data()[0], (torch.randn(1, 1), torch.zeros(1).long())], layers={"2": 1}, importance="taylor")
    assert [m.training for m in net.modules()] == flags and no_hooks(net)
    assert all(p.grad is None and p.requires_grad for p in net.parameters())


def test_taylor_inside_inference_mode_and_bfloat16_activations():
    net, data = _net(), _data()
    acts, gs = _outputs(net, "4", data, grads=True)
    with torch.inference_mode():
        res = channel_importance(net, data, layers={"4": 1}, importance="taylor")
        assert torch.is_inference_mode_enabled()
    torch.testing.assert_close(res.scores["4"], _taylor_ref(acts, gs))
    tok = Tokens().to(torch.bfloat16)
    x = torch.randn(3, 7, 4).to(torch.bfloat16)
    got = channel_importance(tok, x, layers={"mlp.0": -1})
    expected = tok.mlp[0](x).double().abs().reshape(-1, 6).mean(0)
    torch.testing.assert_close(got.scores["mlp.0"], expected)


def test_take_reads_a_groups_positions_and_checks_its_dim():
    res = channel_importance(Tokens(), torch.randn(3, 7, 4), layers={"mlp.1": -1})
    assert res.dims["mlp.1"] == 2 and res.ndims["mlp.1"] == 3
    assert res.take("mlp.1", [4, 1], dim=-1).tolist() == [res.scores["mlp.1"][4].item(), res.scores["mlp.1"][1].item()]
    assert torch.equal(res.take("mlp.1", dim=2), res.scores["mlp.1"])
    with pytest.raises(HookscopeError, match="scored along dim 2 of its 3-D output, not dim 1"):
        res.take("mlp.1", [0], dim=1)


# --- one module called several times per forward, read call by call (issue 15, point 2 follow-up) --------
class TwoSizes(nn.Module):
    """One ReLU called on a 4-channel then on a 6-channel tensor in each forward pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 6, 3, padding=1)
        self.act = nn.ReLU()
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.act(self.b(self.act(self.a(x)))).mean((2, 3)))


def _per_call_outputs(model: nn.Module, name: str, data, *, grads: bool = False):
    """call number -> every output of that call of module ``name`` (and d summed-CE / d output), from a
    plain hook counting the calls of each forward pass, on an independent copy of the model."""
    model = copy.deepcopy(model)
    module = dict(model.named_modules())[name]
    seen: list[torch.Tensor] = []

    def keep(m, i, o):
        if grads:
            o.retain_grad()
        seen.append(o)

    handle = module.register_forward_hook(keep)
    acts: dict[int, list[torch.Tensor]] = {}
    gs: dict[int, list[torch.Tensor]] = {}
    for x, y in data:
        seen.clear()
        with torch.set_grad_enabled(grads):
            out = model(x)
            if grads:
                F.cross_entropy(out, y, reduction="sum").backward()
        for k, o in enumerate(seen):
            acts.setdefault(k, []).append(o.detach().clone())
            if grads:
                gs.setdefault(k, []).append(o.grad.clone())
    handle.remove()
    return acts, gs


def _reference(kind: str, acts, gs) -> torch.Tensor:
    if kind == "activation":
        return _per_channel(torch.cat(acts)).abs().mean(1)
    if kind == "apoz":
        return 1 - (_per_channel(torch.cat(acts)) == 0).double().mean(1)
    return _taylor_ref(acts, gs)


@pytest.mark.parametrize("kind", ["activation", "apoz", "taylor"])
@pytest.mark.parametrize("sites", [{"act": 1}, "act"])
def test_each_call_of_a_shared_module_has_its_own_scores_and_size(kind, sites):
    net, data = TwoSizes(), _data((2, 3, 5))
    acts, gs = _per_call_outputs(net, "act", data, grads=kind == "taylor")
    assert [a[0].shape[1] for a in acts.values()] == [4, 6]
    res = channel_importance(net, data, layers=sites, importance=kind)
    assert res.calls_per_forward == {"act": 2} and res.calls["act"] == 6 and res.uneven == {}
    for k in (0, 1):
        expected = _reference(kind, acts[k], gs.get(k))
        torch.testing.assert_close(res.take("act", call=k), expected)
        torch.testing.assert_close(res.take("act", [3, 0], dim=1, call=k), expected[[3, 0]])
        assert res.order("act", call=k) == torch.sort(expected, stable=True).indices.tolist()
    assert [c.scores.dtype for c in res.per_call["act"]] == [torch.float64] * 2
    assert 0 < float(res.take("act", call=1).min())  # the test tells channels apart: no call is all zeros
    # the two calls carry different channels: no scores for every call together, one line naming call=
    with pytest.raises(HookscopeError, match=r"'act' carries 4, 6 channels on its 2 calls per forward.*"
                                             r"take\('act', call=k\)") as e:
        res.scores["act"]
    assert "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match="take"):
        res.take("act")
    assert "act" in res and no_hooks(net)


def test_per_call_rows_table_and_json():
    res = channel_importance(TwoSizes(), _data(), layers={"act": 1, "b": 1})
    assert [(r.site, r.call, r.channels, r.calls) for r in res.rows] == [("b", None, 6, 3), ("act", 0, 4, 3),
                                                                          ("act", 1, 6, 3)]
    lines = str(res).splitlines()
    assert lines[1].split()[:4] == ["site", "call", "dim", "channels"]
    assert lines[3].split()[:4] == ["b", "all", "1", "6"] and lines[5].split()[:4] == ["act", "1", "1", "6"]
    d = json.loads(res.to_json())
    assert d["calls_per_forward"] == {"act": 2, "b": 1} and "act" not in d["scores"]
    assert d["call_scores"]["act"][1] == res.take("act", call=1).tolist() and "b" not in d["call_scores"]
    assert torch.equal(copy.deepcopy(res).take("act", call=0), res.take("act", call=0))


@pytest.mark.parametrize("kind", ["activation", "taylor"])
def test_calls_of_the_same_size_are_read_together_and_one_by_one(kind):
    net, data = Twice(), [(torch.randn(n, 3), torch.randint(0, 2, (n,))) for n in (2, 4)]
    acts, gs = _per_call_outputs(net, "act", data, grads=kind == "taylor")
    res = channel_importance(net, data, layers={"act": -1}, importance=kind)
    every = _reference(kind, acts[0] + acts[1], (gs[0] + gs[1]) if gs else None)
    torch.testing.assert_close(res.scores["act"], every)
    for k in (0, 1):
        torch.testing.assert_close(res.take("act", call=k), _reference(kind, acts[k], gs.get(k)))
    assert not torch.allclose(res.take("act", call=0), res.take("act", call=1))
    assert res.calls_per_forward["act"] == 2 and [r.call for r in res.rows] == [None]


@pytest.mark.parametrize("call, message", [
    (2, r"call=2: 'act' ran 2 times per forward, so call is one of 0..1"),
    (-1, r"call=-1: 'act' ran 2 times"),
    (True, r"call=True"),
])
def test_a_call_that_did_not_happen_is_one_line(call, message):
    res = channel_importance(TwoSizes(), _data((2,)), layers={"act": 1})
    with pytest.raises(HookscopeError, match=message) as e:
        res.take("act", call=call)
    assert "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match="scored along dim 1 of its 4-D output, not dim 2"):
        res.take("act", dim=2, call=0)


class Sometimes(nn.Module):
    """Runs its ReLU once, or twice when the batch has more than 2 samples."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.act(self.lin(x))
        return self.act(self.lin(h)) if x.shape[0] > 2 else h


def test_calls_per_forward_that_differ_between_batches_refuse_per_call_reading():
    net = Sometimes()
    data = [torch.randn(n, 3) for n in (2, 4)]
    res = channel_importance(net, data, layers={"act": -1})
    assert res.uneven == {"act": (1, 2)} and "act" not in res.calls_per_forward and res.calls["act"] == 3
    with pytest.raises(HookscopeError, match=r"'act' ran 1 or 2 times per forward.*drop call=") as e:
        res.take("act", call=0)
    assert "\n" not in str(e.value)
    outs = [net.act(net.lin(x)) for x in data]
    outs.append(net.act(net.lin(outs[1])))
    torch.testing.assert_close(res.scores["act"], torch.cat(outs).detach().abs().double().mean(0))


def test_weight_kinds_have_no_calls_to_read():
    res = channel_importance(TwoSizes(), None, layers=["a"], importance="l1")
    with pytest.raises(HookscopeError, match="importance='l1' reads the weights, not calls of 'a'; drop call="):
        res.take("a", call=0)
    with pytest.raises(KeyError, match="no site 'b'"):
        res.take("b", call=0)


@pytest.mark.parametrize("kind", ["activation", pytest.param("taylor", marks=pytest.mark.slow)])
def test_resnet50_bottleneck_relu_calls_match_the_block_computed_by_hand(kind):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)  # ResNet-50's stem and layer1 (three bottlenecks), one bottleneck in each later stage
    net = tv.models.resnet.ResNet(tv.models.resnet.Bottleneck, [3, 1, 1, 1], num_classes=4).eval()
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in (2, 3)]
    res = channel_importance(net, data, layers="layer1.0.relu", importance=kind)  # dim inferred though calls differ
    assert res.calls_per_forward == {"layer1.0.relu": 3} and res.dims == {"layer1.0.relu": 1}
    blk = net.layer1[0]
    if kind == "activation":
        calls: dict[int, list[torch.Tensor]] = {0: [], 1: [], 2: []}
        with torch.no_grad():
            for x, _ in data:
                h = net.maxpool(net.relu(net.bn1(net.conv1(x))))
                c0 = torch.relu(blk.bn1(blk.conv1(h)))
                c1 = torch.relu(blk.bn2(blk.conv2(c0)))
                c2 = torch.relu(blk.bn3(blk.conv3(c1)) + blk.downsample(h))
                for k, c in enumerate((c0, c1, c2)):
                    calls[k].append(c)
        expected = {k: _per_channel(torch.cat(v)).abs().mean(1) for k, v in calls.items()}
    else:
        acts, gs = _per_call_outputs(net, "layer1.0.relu", data, grads=True)
        expected = {k: _taylor_ref(acts[k], gs[k]) for k in range(3)}
    assert [len(expected[k]) for k in range(3)] == [64, 64, 256]
    for k in range(3):
        torch.testing.assert_close(res.take("layer1.0.relu", call=k), expected[k])
    with pytest.raises(HookscopeError, match="take\\('layer1.0.relu', call=k\\)"):
        res.take("layer1.0.relu", list(range(3)))
    assert no_hooks(net)


# --- the calibration batches are never written --------------------------------------------------------------
class Halves(nn.Module):
    """_net() behind an in-place halving of its input (and of a keyword input)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
        x.div_(2)
        if gain is not None:
            gain.mul_(2)
            x = x * gain
        return self.net(x)


@pytest.mark.parametrize("kind", ["activation", "apoz", "taylor"])
def test_a_model_writing_into_its_input_leaves_the_batches_and_every_run_sees_them_as_given(kind):
    data = _data()
    given = [(x.clone(), y.clone()) for x, y in data]
    model = Halves()
    first = channel_importance(model, data, layers={"net.2": 1}, importance=kind)
    again = channel_importance(model, data, layers={"net.2": 1}, importance=kind)
    assert all(torch.equal(x, gx) and torch.equal(y, gy) for (x, y), (gx, gy) in zip(data, given))
    acts, gs = _outputs(_net(), "2", [(x / 2, y) for x, y in given], grads=kind == "taylor")
    if kind == "activation":
        expected = _per_channel(torch.cat(acts)).abs().mean(1)
    elif kind == "apoz":
        expected = 1 - (_per_channel(torch.cat(acts)) == 0).double().mean(1)
    else:
        expected = _taylor_ref(acts, gs)
    torch.testing.assert_close(first.scores["net.2"], expected)
    torch.testing.assert_close(again.scores["net.2"], expected)


def test_keyword_inputs_of_dict_batches_are_copied_too():
    x = _data((3,))[0][0]
    gain = torch.full((1,), 1.5)
    batch = {"x": x.clone(), "gain": gain.clone()}
    res = channel_importance(Halves(), [batch, batch], layers={"net.2": 1})
    assert torch.equal(batch["x"], x) and torch.equal(batch["gain"], gain)
    acts, _ = _outputs(_net(), "2", [(x / 2 * 3, None)])
    torch.testing.assert_close(res.scores["net.2"], _per_channel(torch.cat(acts * 2)).abs().mean(1))


# --- taylor where the model rewrites a site's output in place -----------------------------------------------------
@pytest.mark.parametrize("site", ["bn0", "bn", "conv", "stem"])
def test_taylor_at_a_batch_norm_rewritten_by_a_residual_add_or_relu_equals_the_hand_computation(site):
    net, data = AddBack().eval(), _data()
    acts, gs = _outputs(AddBack(inplace=False).eval(), site, data, grads=True)
    res = channel_importance(net, data, layers={site: 1}, importance="taylor")
    torch.testing.assert_close(res.scores[site], _taylor_ref(acts, gs))
    assert res.samples == 10 and float(res.scores[site].min()) > 0 and no_hooks(net)


def test_taylor_on_every_site_of_a_rewritten_block_at_once_and_a_loss_from_a_user():
    net, data = AddBack().eval(), _data()
    twin = AddBack(inplace=False).eval()
    sites = {"stem": 1, "bn0": 1, "conv": 1, "bn": 1}
    per_sample = lambda out, batch: F.cross_entropy(out, batch[1], reduction="none")  # noqa: E731
    res = channel_importance(net, data, layers=sites, importance="taylor", loss=per_sample)
    for site in sites:
        acts, gs = _outputs(twin, site, data, grads=True)
        torch.testing.assert_close(res.scores[site], _taylor_ref(acts, gs))


def test_taylor_refuses_a_view_output_whose_gradient_an_in_place_op_detached():
    """A Flatten output (a view) rewritten in place loses its gradient hooks: refused, never zero."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.ReLU(inplace=True), nn.LazyLinear(3)).eval()
    net(torch.zeros(1, 3, 6, 6))
    with pytest.raises(HookscopeError, match="taylor at '1'.*in-place op rewrote") as e:
        channel_importance(net, _data(), layers={"1": -1}, importance="taylor")
    assert "\n" not in str(e.value) and no_hooks(net)


@pytest.mark.parametrize("passing", [nn.Identity, lambda: nn.Dropout(0.3)])
def test_taylor_at_a_module_that_returns_its_input_before_an_in_place_add(passing):
    """A site returning the very tensor another site returned (StochasticDepth or Dropout in eval mode),
    rewritten in place afterwards: both read as returned, both with the gradient of that value."""

    class Through(AddBack):
        def __init__(self, inplace: bool = True) -> None:
            super().__init__(inplace)
            self.through = passing()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idn = F.relu(self.bn0(self.stem(x)), inplace=self.inplace)
            out = self.through(self.bn(self.conv(idn)))
            out = out.add_(idn) if self.inplace else out + idn
            return self.head(out.mean((2, 3)))

    net, data = Through().eval(), _data()
    res = channel_importance(net, data, layers={"bn": 1, "through": 1}, importance="taylor")
    twin = Through(inplace=False).eval()
    for site in ("bn", "through"):
        acts, gs = _outputs(twin, site, data, grads=True)
        torch.testing.assert_close(res.scores[site], _taylor_ref(acts, gs))
    torch.testing.assert_close(res.scores["bn"], res.scores["through"])


def test_taylor_per_call_of_a_shared_module_whose_every_output_is_rewritten_in_place():
    """One BatchNorm-free block called twice, each call's output rewritten by an in-place add: every
    call is read as it returned, with the gradient of that value, and paired with its own call."""

    class Twice(nn.Module):
        def __init__(self, inplace: bool = True) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.inplace = inplace
            self.stem, self.conv, self.head = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.stem(x)
            for scale in (1.0, -0.5):
                out = self.conv(h)
                h = out.add_(h * scale) if self.inplace else out + h * scale
            return self.head(h.mean((2, 3)))

    net, data = Twice().eval(), _data()
    res = channel_importance(net, data, layers={"conv": 1}, importance="taylor")
    acts, gs = _per_call_outputs(Twice(inplace=False).eval(), "conv", data, grads=True)
    assert res.calls_per_forward["conv"] == 2
    for call in (0, 1):
        torch.testing.assert_close(res.take("conv", call=call), _taylor_ref(acts[call], gs[call]))
    torch.testing.assert_close(res.scores["conv"], _taylor_ref(acts[0] + acts[1], gs[0] + gs[1]))


def test_every_kind_on_a_channels_last_model_equals_the_contiguous_one():
    net, data = _net(), _data()
    last = copy.deepcopy(net).to(memory_format=torch.channels_last)
    batches = [(x.to(memory_format=torch.channels_last), y) for x, y in data]
    for kind in ("activation", "apoz", "taylor"):
        a = channel_importance(net, data, layers={"2": 1, "4": 1}, importance=kind)
        b = channel_importance(last, batches, layers={"2": 1, "4": 1}, importance=kind)
        for site in ("2", "4"):
            torch.testing.assert_close(a.scores[site], b.scores[site], rtol=1e-5, atol=1e-7)
