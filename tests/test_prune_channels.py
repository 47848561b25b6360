"""Structured channel pruning along the dependency graph (``hookscope.prune_channels``): which channels
are chosen, by hand; that every member of a group is masked; that compaction then gives the masked
model's outputs with the parameter count worked out by hand."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookscope
from hookscope.errors import HookscopeError
from hookscope.zoo import demo_model
from hookscope.synthetic import shapes

from helpers import AddBack


class Residual(nn.Module):
    """conv a -> bn -> relu, conv b (residual branch) added to conv a's channels, then a 1x1 head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.act = nn.ReLU()
        self.b = nn.Conv2d(6, 6, 3, padding=1)
        self.act2 = nn.ReLU()
        self.head = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.a(x)))
        return self.head(self.act2(y + self.b(y)))


def _torchvision(name: str) -> nn.Module:
    """torchvision's model ``name``, random weights (seed 0), in eval mode. ``densenet121:short`` and
    ``efficientnet_v2_s:short`` are those models with at most two layers per dense block or stage, at their
    widths: every kind of layer and join of the full model (dense concatenations and transitions; FusedMBConv
    with and without expansion, MBConv with squeeze-excite, stochastic depth) in a fraction of the time."""
    import torchvision
    from torchvision.models import densenet, efficientnet

    torch.manual_seed(0)
    if name == "densenet121:short":
        return densenet.DenseNet(32, (2, 2, 2, 2), 64).eval()
    if name == "efficientnet_v2_s:short":
        setting, last = efficientnet._efficientnet_conf("efficientnet_v2_s")
        short = [dataclasses.replace(c, num_layers=min(c.num_layers, 2)) for c in setting]
        return efficientnet.EfficientNet(short, 0.2, last_channel=last,
                                         norm_layer=functools.partial(nn.BatchNorm2d, eps=1e-03)).eval()
    extra = {"init_weights": False, "aux_logits": False} if name == "googlenet" else {}
    return torchvision.models.get_model(name, weights=None, **extra).eval()


def _residual() -> Residual:
    torch.manual_seed(0)
    net = Residual().eval()
    with torch.no_grad():
        net.bn.weight.uniform_(0.5, 1.5)
        net.bn.bias.normal_(0, 0.2)
        net.bn.running_mean.normal_(0, 0.2)
        net.bn.running_var.uniform_(0.5, 2)
    return net


def test_l2_groups_join_the_residual_branches_and_drop_the_lowest_norms_of_both_producers():
    net, x = _residual(), torch.randn(1, 3, 8, 8)
    expected = (net.a.weight.detach().flatten(1).pow(2).sum(1) + net.b.weight.detach().flatten(1).pow(2).sum(1)).sqrt()
    res = hookscope.prune_channels(net, x, amount=0.5)
    assert [(r.producers, r.channels, r.removed) for r in res.rows] == [("a, b", 6, 3)]
    drop = sorted(torch.sort(expected, stable=True).indices[:3].tolist())
    assert res.drop[res.rows[0].group] == drop
    for t in (net.a.weight, net.b.weight):                       # producers' rows
        assert t.flatten(1).abs().sum(1)[drop].eq(0).all() and t.flatten(1).abs().sum(1).ne(0).sum() == 3
    for t in (net.bn.weight, net.bn.bias, net.b.bias):           # followers and bias
        assert t[drop].eq(0).all()
    assert net.head.weight.ne(0).all()                           # consumers read zeros: not masked


def test_compacted_residual_model_equals_the_masked_one_with_parameters_counted_by_hand():
    net, x = _residual(), torch.randn(2, 3, 8, 8)
    before = sum(p.numel() for p in net.parameters())
    hookscope.prune_channels(net, x[:1], amount=0.5)
    small = hookscope.compact(net, x[:1])
    k = 3  # channels removed from the one group: a's rows (27 each), bn (2), b's rows and columns, bias, head columns
    expected = before - k * 27 - 2 * k - (6 * 6 * 9 - 3 * 3 * 9) - k - 2 * k
    assert sum(p.numel() for p in small.parameters()) == expected
    assert (small.a.out_channels, small.bn.num_features, small.b.in_channels, small.b.out_channels,
            small.head.in_channels) == (3, 3, 3, 3, 3)
    with torch.no_grad():
        assert (small(x) - net(x)).abs().max() < 1e-5


def test_global_scope_ranks_groups_by_scores_divided_by_their_mean():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    with torch.no_grad():  # group 0: norms 1, 2, 3, 10; group 1: norms 1, 1, 1, 1 (all at their mean)
        for k, v in enumerate((1.0, 2.0, 3.0, 10.0)):
            net[0].weight[k].fill_(v / 3 ** 0.5)
        for k in range(4):
            net[2].weight[k].fill_(1.0 / 2.0)
    res = hookscope.prune_channels(net, torch.randn(1, 3, 2, 2), amount=0.25, scope="global")
    # normalised: group 0 -> 0.25, 0.5, 0.75, 2.5; group 1 -> 1, 1, 1, 1; the 2 lowest of 8 are in group 0
    assert {r.producers: r.removed for r in res.rows} == {"0": 2, "2": 0}
    assert res.drop[res.rows[0].group] == [0, 1]


def test_every_group_keeps_a_channel_and_amount_zero_masks_nothing():
    net, x = _residual(), torch.randn(1, 3, 8, 8)
    assert hookscope.prune_channels(net, x, amount=0.99).rows[0].kept == 1
    net = _residual()
    assert hookscope.prune_channels(net, x, amount=0.0).removed == 0 and not hookscope.sparsity(net).zeros


@pytest.mark.parametrize("kind", ["activation", "apoz", "taylor"])
def test_measured_kinds_score_at_the_activation_modules_and_compact_exactly(kind):
    data = shapes(48, seed=11)
    batches = [(data.images[i:i + 16], data.labels[i:i + 16]) for i in range(0, 48, 16)]
    net = demo_model()
    res = hookscope.prune_channels(net, data.images[:1], amount=0.5, importance=kind, data=batches)
    assert [r.scored_at for r in res.rows] == ["stem.2", "layer1.2", "layer1.5", "layer2.2", "layer2.5",
                                               "layer3.2", "layer3.5"]
    imp = hookscope.channel_importance(demo_model(), batches, layers={"layer1.2": 1}, importance=kind)
    chosen = sorted(torch.sort(imp["layer1.2"], stable=True).indices[:16].tolist())
    assert res.drop[res.rows[1].group] == chosen
    small = hookscope.compact(net, data.images[:1])
    with torch.no_grad():
        assert (small(data.images) - net(data.images)).abs().max() < 1e-5


def test_layers_restricts_the_groups_and_bad_input_is_one_line_and_changes_nothing():
    net, x = demo_model(), torch.randn(1, 3, 64, 64)
    res = hookscope.prune_channels(net, x, amount=0.5, layers="layer2.*")
    assert [r.producers for r in res.rows] == ["layer2.0", "layer2.3"]
    net = demo_model()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    for kw, msg in [({"amount": 1.0}, "not a fraction of channels in \\[0, 1\\)"),
                    ({"amount": 0.5, "importance": "taylr"}, "Did you mean 'taylor'"),
                    ({"amount": 0.5, "importance": "apoz"}, "measured on data; pass data="),
                    ({"amount": 0.5, "scope": "layer"}, "scope='layer' is not known"),
                    ({"amount": 0.5, "layers": "fc"}, "no removable channel group starts at \\['fc'\\]")]:
        with pytest.raises(HookscopeError, match=msg) as e:
            hookscope.prune_channels(net, x, **kw)
        assert "\n" not in str(e.value)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items()) and not hookscope.sparsity(net).zeros


def test_a_relu_module_called_on_two_groups_scores_each_group_on_its_own_call():
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    x, batches = torch.randn(1, 3, 32, 32), [torch.randn(2, 3, 32, 32) for _ in range(2)]
    seen: list[torch.Tensor] = []
    handle = net.layer1[0].bn1.register_forward_hook(lambda m, a, out: seen.append(out.relu().abs().mean((0, 2, 3))))
    with torch.no_grad():
        for b in batches:
            net(b)
    handle.remove()
    expected = sorted(torch.sort(torch.stack(seen).mean(0).double(), stable=True).indices[:32].tolist())
    res = hookscope.prune_channels(net, x, amount=0.5, importance="activation", data=batches)
    row = next(r for r in res.rows if r.producers == "layer1.0.conv1")
    assert row.scored_at == "layer1.0.relu#0"      # call 0 of the block's one ReLU: after bn1, not after the add
    assert res.drop[row.group] == expected


def test_pruning_again_takes_the_amount_of_the_live_channels_as_torch_composes():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 2, 1)).eval()
    x = torch.randn(1, 3, 4, 4)
    first = hookscope.prune_channels(net, x, amount=0.5)
    second = hookscope.prune_channels(net, x, amount=0.5)           # half of the 4 left
    third = hookscope.prune_channels(net, x, amount=0.5)            # half of the 2 left
    assert [(r.removed, r.already, r.kept) for r in (first.rows[0], second.rows[0], third.rows[0])] == \
        [(4, 0, 4), (2, 4, 2), (1, 6, 1)]
    assert set(second.drop[0]).isdisjoint(first.drop[0]) and net[0].weight.flatten(1).abs().sum(1).ne(0).sum() == 1
    assert "before" in second.table()


def test_non_finite_scores_are_refused_and_nothing_is_masked():
    net = demo_model()
    data = shapes(8, seed=3)
    images = data.images.clone()
    images[0, 0, 0, 0] = float("nan")
    with pytest.raises(HookscopeError, match="not finite: NaN or infinity in the calibration data") as e:
        hookscope.prune_channels(net, images[:1], amount=0.5, importance="activation", data=[images])
    assert "\n" not in str(e.value) and not hookscope.sparsity(net).zeros


def test_a_model_with_nothing_to_remove_says_so():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4), nn.Conv2d(4, 2, 1)).eval()
    with pytest.warns(UserWarning, match="no channel of Sequential can be removed"):
        assert hookscope.prune_channels(net, torch.randn(1, 3, 4, 4), amount=0.5).rows == []


# --- the caller's inputs and calibration batches are never written ---------------------------------------------
class Writes(nn.Module):
    """Divides its input in place before conv -> bn -> relu -> conv -> relu -> linear; records every
    input it receives."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.bn, self.act = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU()
        self.b, self.act2, self.fc = nn.Conv2d(6, 4, 1), nn.ReLU(), nn.Linear(4, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        x.div_(2)
        return self.fc(self.act2(self.b(self.act(self.bn(self.a(x))))).mean((2, 3)))


@pytest.mark.parametrize("kind", ["l2", "activation", "apoz", "taylor"])
def test_prune_channels_writes_neither_the_example_input_nor_the_calibration_batches(kind):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 3, 5, 5, generator=g)
    batches = [(torch.randn(n, 3, 5, 5, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (2, 3)]
    given = [x.clone()] + [b[0].clone() for b in batches]
    net = Writes().eval()
    res = hookscope.prune_channels(net, x, amount=0.5, importance=kind, data=None if kind == "l2" else batches)
    assert torch.equal(x, given[0]) and all(torch.equal(b[0], c) for b, c in zip(batches, given[1:]))
    assert all(any(torch.equal(s, c) for c in given) for s in net.seen)  # each run saw an input as given
    # the same choice as the model computing x / 2 once, on inputs already halved
    twin = Writes().eval()
    twin.forward = lambda t: Writes.forward(twin, t * 2)  # type: ignore[method-assign]
    ref = hookscope.prune_channels(twin, x / 2, amount=0.5, importance=kind,
                                   data=None if kind == "l2" else [(b / 2, y) for b, y in batches])
    assert res.drop == ref.drop and res.removed == 5


# --- groups joined by a concatenation: each channel scored where it is carried -----------------------------------
class Cat(nn.Module):
    """Two branches (2 and 3 channels, each with its ReLU) concatenated, a Hardswish over the five, a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.r1 = nn.Conv2d(3, 2, 1), nn.ReLU()
        self.c2, self.r2 = nn.Conv2d(3, 3, 1), nn.ReLU()
        self.post, self.head = nn.Hardswish(), nn.Conv2d(5, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.r1(self.c1(x)), self.r2(self.c2(x))], 1)
        return self.head(self.post(h)).mean((2, 3))


def _cat_by_hand(net: Cat, batches: list[tuple[torch.Tensor, torch.Tensor]], kind: str) -> dict[str, torch.Tensor]:
    """Per-channel statistic of r1, r2 and post over the batches, from plain outputs (taylor: d summed CE)."""
    acts: dict[str, list[torch.Tensor]] = {"r1": [], "r2": [], "post": []}
    grads: dict[str, list[torch.Tensor]] = {"r1": [], "r2": [], "post": []}
    for x, y in batches:
        a1, a2 = net.r1(net.c1(x)), net.r2(net.c2(x))
        h = torch.cat([a1, a2], 1)
        p = net.post(h)
        outs = {"r1": a1, "r2": a2, "post": p}
        g = torch.autograd.grad(F.cross_entropy(net.head(p).mean((2, 3)), y, reduction="sum"), list(outs.values()))
        for (k, o), gk in zip(outs.items(), g):
            acts[k].append(o.detach().double())
            grads[k].append(gk.double())
    out = {}
    for k in acts:
        a, g = torch.cat(acts[k]), torch.cat(grads[k])
        if kind == "activation":
            out[k] = a.abs().mean((0, 2, 3))
        elif kind == "apoz":
            out[k] = 1 - (a == 0).double().mean((0, 2, 3))
        else:
            out[k] = (a * g).mean((2, 3)).abs().mean(0)
    return out


@pytest.mark.parametrize("kind", ["activation", "apoz", "taylor"])
def test_a_concatenated_group_scores_each_channel_at_the_sites_that_carry_it_by_hand(kind):
    from hookscope.analysis.prune.channels._prune import _measured

    net = Cat().eval()
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(n, 3, 4, 4, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in (3, 2)]
    ref = _cat_by_hand(net, batches, kind)
    gs = hookscope.channel_groups(net, batches[0][0][:1])
    (group,) = gs.groups
    assert group.size == 5
    mods = dict(net.named_modules())
    scores, where = _measured(net, [group], mods, kind, batches, None, None, None)
    assert where[0] == "r1, r2, post"
    expected = torch.zeros(5, dtype=torch.float64)
    for member in group.members:
        if (member.module, member.name) in (("c1", "weight"), ("c2", "weight")):
            for k, pos in enumerate(member.positions):
                if pos:  # channel k is the branch's channel pos[0], at the concatenation's offset 0 or 2
                    branch, offset = ("r1", 0) if member.module == "c1" else ("r2", 2)
                    expected[k] = (ref[branch][pos[0]] + ref["post"][offset + pos[0]]) / 2
    torch.testing.assert_close(scores[0], expected)
    assert bool(torch.isfinite(scores[0]).all())
    res = hookscope.prune_channels(net, batches[0][0][:1], amount=0.6, importance=kind, data=batches)
    assert res.drop[0] == sorted(torch.sort(expected, stable=True).indices[:3].tolist())


def test_a_channel_without_an_activation_site_is_scored_at_its_leaf_modules():
    """Branch 2 has no activation module: its channels are scored at its conv's output, branch 1's at r1."""
    from hookscope.analysis.prune.channels._prune import _measured

    class Mixed(Cat):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.cat([self.r1(self.c1(x)), self.c2(x)], 1)
            return self.head(h).mean((2, 3))

    net = Mixed().eval()
    x = torch.randn(4, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    (group,) = hookscope.channel_groups(net, x[:1]).groups
    scores, where = _measured(net, [group], dict(net.named_modules()), "activation", x, None, None, None)
    assert where[0] == "r1, c2"
    with torch.no_grad():
        by_channel = torch.cat([net.r1(net.c1(x)), net.c2(x)], 1).abs().double().mean((0, 2, 3))
    producer = {m.module: m.positions for m in group.members if m.name == "weight" and m.role == "producer"}
    expected = torch.tensor([by_channel[producer["c1"][k][0] if producer["c1"][k] else 2 + producer["c2"][k][0]]
                             for k in range(5)], dtype=torch.float64)
    torch.testing.assert_close(scores[0], expected)


@pytest.mark.parametrize("name", ["squeezenet1_1", pytest.param("googlenet", marks=pytest.mark.slow),
                                  pytest.param("densenet121:short", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["activation", "apoz", "taylor"])
def test_torchvision_models_with_concatenations_score_every_group(name, kind):
    import warnings

    net = _torchvision(name)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 64, 64, generator=g), torch.tensor([1, 7]))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apoz at sites without a ReLU module warns
        res = hookscope.prune_channels(net, batches[0][0][:1], amount=0.25, importance=kind, data=batches)
    joined = [r for r in res.rows if "," in r.scored_at]  # several sites: a concatenation's branches
    assert joined and res.removed > 0.2 * res.channels
    assert all(r.removed == int(0.25 * r.channels) for r in res.rows)


def test_squeezenet_fire_channels_are_scored_at_their_own_expand_branch():
    import torchvision

    from hookscope.analysis.prune.channels._prune import _measured

    torch.manual_seed(0)
    net = torchvision.models.squeezenet1_1(weights=None).eval()
    batches = [torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))]
    gs = hookscope.channel_groups(net, batches[0][:1])
    group = next(g for g in gs.groups if "features.3.expand1x1" in g.producers)
    scores, where = _measured(net, [group], dict(net.named_modules()), "activation", batches, None, None, None)
    assert where[group.index] == "features.3.expand1x1_activation, features.3.expand3x3_activation"
    imp = hookscope.channel_importance(net, batches, layers=["features.3.expand1x1_activation",
                                                      "features.3.expand3x3_activation"])
    expected = torch.full((group.size,), float("nan"), dtype=torch.float64)
    for m in group.members:
        if m.name == "weight" and m.role == "producer":
            site = m.module + "_activation"
            for k, pos in enumerate(m.positions):
                if pos:
                    expected[k] = imp.scores[site][pos[0]]
    assert group.size == 128 and bool(torch.isfinite(expected).all())
    torch.testing.assert_close(scores[group.index], expected)


# --- taylor on groups that pass no activation module, whose batch norm outputs are rewritten in place ------------
def test_taylor_scores_a_group_at_batch_norms_rewritten_in_place_as_by_hand():
    from hookscope.analysis.prune.channels._prune import _measured

    net, twin = AddBack().eval(), AddBack(inplace=False).eval()
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randn(n, 3, 5, 5, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (3, 2)]
    (group,) = hookscope.channel_groups(net, batches[0][0][:1]).groups
    scores, where = _measured(net, [group], dict(net.named_modules()), "taylor", batches, None, None, None)
    assert where[0] == "stem, bn0, conv, bn"
    # by hand on the out-of-place twin: per sample |mean over positions of a * dL/da|, averaged over samples,
    # then each channel's mean over the four sites (every site carries every channel, at its own index)
    per_site = {}
    for name in ("stem", "bn0", "conv", "bn"):
        outs: list[torch.Tensor] = []
        h = dict(twin.named_modules())[name].register_forward_hook(lambda m, a, o: outs.append(o))
        rows = []
        for x, y in batches:
            outs.clear()
            loss = F.cross_entropy(twin(x), y, reduction="sum")
            (grad,) = torch.autograd.grad(loss, outs)
            rows.append((outs[0] * grad).double().mean((2, 3)).abs())
        h.remove()
        per_site[name] = torch.cat(rows).mean(0)
    expected = torch.stack(list(per_site.values())).mean(0)
    torch.testing.assert_close(scores[0], expected)
    res = hookscope.prune_channels(net, batches[0][0][:1], amount=0.5, importance="taylor", data=batches)
    assert res.drop[0] == sorted(torch.sort(expected, stable=True).indices[:2].tolist())


@pytest.mark.parametrize("name", ["mobilenet_v3_small", pytest.param("mobilenet_v3_large", marks=pytest.mark.slow),
                                  pytest.param("efficientnet_b0", marks=pytest.mark.slow),
                                  pytest.param("efficientnet_v2_s:short", marks=pytest.mark.slow),
                                  pytest.param("googlenet", marks=pytest.mark.slow)])
def test_taylor_scores_every_group_of_models_rewriting_batch_norm_outputs_in_place(name):
    from hookscope.analysis.prune.channels._prune import _measured

    net = _torchvision(name)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 32, 32, generator=g), torch.tensor([3, 8]))]
    x = batches[0][0][:1]
    groups = hookscope.channel_groups(net, x).groups
    scores, where = _measured(net, groups, dict(net.named_modules()), "taylor", batches, None, None, None)
    mods = dict(net.named_modules())
    kinds = {gi: {type(mods[s.split("#")[0]]).__name__ for s in w.split(", ")} for gi, w in where.items()}
    assert any("BatchNorm2d" in k and k <= {"BatchNorm2d", "Conv2d", "StochasticDepth"} for k in kinds.values())
    for gi, s in scores.items():
        assert s.shape == (groups[gi].size,) and bool(torch.isfinite(s).all()) and float(s.min()) >= 0
        assert float(s.max()) > 0, (gi, where[gi])
    everything = torch.cat(list(scores.values()))
    assert float((everything > 0).double().mean()) > 0.5  # most channels get a gradient
    res = hookscope.prune_channels(net, x, amount=0.25, importance="taylor", data=batches)
    assert res.removed > 0.2 * res.channels


@pytest.mark.parametrize("kind", ["l2", "taylor"])
def test_a_channels_last_model_prunes_and_compacts_like_the_contiguous_one(kind):
    torch.manual_seed(0)
    net = AddBack().eval()
    last = AddBack().eval().to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(8)
    batches = [(torch.randn(3, 3, 5, 5, generator=g), torch.randint(0, 3, (3,), generator=g))]
    x = batches[0][0][:1]
    a = hookscope.prune_channels(net, x, amount=0.5, importance=kind, data=None if kind == "l2" else batches)
    x_last = x.to(memory_format=torch.channels_last)
    data_last = [(b.to(memory_format=torch.channels_last), y) for b, y in batches]
    b = hookscope.prune_channels(last, x_last, amount=0.5, importance=kind, data=None if kind == "l2" else data_last)
    assert a.drop == b.drop and a.removed == 2
    assert last.stem.weight.is_contiguous(memory_format=torch.channels_last)
    small = hookscope.compact(last, x_last)
    with torch.no_grad():
        torch.testing.assert_close(small(x_last), last(x_last), rtol=0, atol=1e-5)
        torch.testing.assert_close(small(x), net(x), rtol=0, atol=1e-5)
