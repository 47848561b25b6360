"""Masks by forward pre-hook: element-by-element equal to torch.nn.utils.prune for the same settings.

Every comparison prunes two copies of one model, one with hookscope, one with torch's functions in
the same layer order, and asserts exact equality of masks, originals and computed weights.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune as tprune

from hookscope.analysis.prune.masks import MaskHook, apply_mask, make_permanent, mask_of, masked
from hookscope.analysis.prune.masks._methods import Spec, new_mask
from hookscope.analysis.prune.masks import prune, remove, sparsity
from hookscope.errors import HookscopeError

LAYERS = ["conv1", "conv2", "fc"]


class Small(nn.Module):
    def __init__(self, ties: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 5)
        if ties:  # many equal magnitudes: the tie-breaking of topk must be torch's
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_((p * 4).round() / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.conv2(self.act(self.conv1(x)))).flatten(1))


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def pair(ties: bool = False) -> tuple[nn.Module, nn.Module]:
    net = Small(ties)
    return net, copy.deepcopy(net)


def torch_prune(net: nn.Module, method: str, amount: int | float, n: object = 1, dim: int = 0,
                layers: list[str] = LAYERS) -> None:
    for q in layers:
        m = net.get_submodule(q)
        if method == "l1_unstructured":
            tprune.l1_unstructured(m, "weight", amount)
        elif method == "random_unstructured":
            tprune.random_unstructured(m, "weight", amount)
        elif method == "ln_structured":
            tprune.ln_structured(m, "weight", amount, n=n, dim=dim)
        else:
            tprune.random_structured(m, "weight", amount, dim=dim)


def assert_same(ours: nn.Module, theirs: nn.Module, layers: list[str] = LAYERS, name: str = "weight") -> None:
    for q in layers:
        a, b = ours.get_submodule(q), theirs.get_submodule(q)
        for suffix in ("_mask", "_orig", ""):
            ta, tb = getattr(a, name + suffix), getattr(b, name + suffix)
            assert ta.dtype == tb.dtype and torch.equal(ta, tb), f"{q}.{name}{suffix} differs"
    assert torch.equal(ours(X), theirs(X))


def state(net: nn.Module) -> tuple[dict[str, torch.Tensor], list[tuple[str, list[object]]]]:
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    hooks = [(q, list(m._forward_pre_hooks.values())) for q, m in net.named_modules()]
    return sd, hooks


def assert_unchanged(net: nn.Module, before: tuple[dict[str, torch.Tensor], list[tuple[str, list[object]]]]) -> None:
    sd, hooks = state(net)
    assert sd.keys() == before[0].keys() and all(torch.equal(sd[k], before[0][k]) for k in sd)
    assert [(q, [id(h) for h in hs]) for q, hs in hooks] == [(q, [id(h) for h in hs]) for q, hs in before[1]]


AMOUNTS = [0.0, 0.3, 0.5, 1.0, 0, 2]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("amount", AMOUNTS)
def test_l1_unstructured_equals_torch(amount: int | float, ties: bool) -> None:
    ours, theirs = pair(ties)
    prune(ours, *LAYERS, amount=amount)
    torch_prune(theirs, "l1_unstructured", amount)
    assert_same(ours, theirs)
    expected = {"conv1": 216, "conv2": 432, "fc": 30}
    for q in LAYERS:  # the count by hand: torch's round(amount * numel), half to even
        k = amount if isinstance(amount, int) else round(amount * expected[q])
        assert int((getattr(ours, q).weight_mask == 0).sum()) == k


@pytest.mark.parametrize("amount", AMOUNTS)
def test_random_unstructured_equals_torch_with_the_same_seed(amount: int | float) -> None:
    ours, theirs = pair()
    torch.manual_seed(7)
    prune(ours, *LAYERS, amount=amount, method="random_unstructured")
    torch.manual_seed(7)
    torch_prune(theirs, "random_unstructured", amount)
    assert_same(ours, theirs)


def test_a_generator_seeded_like_the_global_rng_draws_the_same_and_leaves_the_global_rng_alone() -> None:
    ours, theirs = pair()
    torch.manual_seed(11)
    before = torch.get_rng_state()
    prune(ours, *LAYERS, amount=0.4, method="random_unstructured", generator=torch.Generator().manual_seed(11))
    assert torch.equal(torch.get_rng_state(), before)
    torch_prune(theirs, "random_unstructured", 0.4)
    assert_same(ours, theirs)


@pytest.mark.parametrize("n", [1, 2, math.inf, -math.inf, "fro", 3])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("amount", [0.0, 0.5, 1.0, 2])
def test_ln_structured_equals_torch(n: object, dim: int, amount: int | float) -> None:
    ours, theirs = pair(ties=True)
    prune(ours, *LAYERS, amount=amount, method="ln_structured", n=n, dim=dim)  # type: ignore[arg-type]
    torch_prune(theirs, "ln_structured", amount, n=n, dim=dim)
    assert_same(ours, theirs)


def test_ln_structured_zeroes_whole_output_channels_of_lowest_norm() -> None:
    conv = nn.Conv2d(1, 4, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([3.0, -1.0, 2.0, 0.5]).view(4, 1, 1, 1))
    prune(nn.Sequential(conv), amount=2, method="ln_structured")
    assert conv.weight_mask.flatten().tolist() == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("amount", [0.0, 0.5, 1.0, 3])
def test_random_structured_equals_torch(dim: int, amount: int | float) -> None:
    ours, theirs = pair()
    torch.manual_seed(3)
    prune(ours, *LAYERS, amount=amount, method="random_structured", dim=dim)
    torch.manual_seed(3)
    torch_prune(theirs, "random_structured", amount, dim=dim)
    assert_same(ours, theirs)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("amount", [0.0, 0.4, 1.0, 100])
def test_global_unstructured_equals_torch(amount: int | float, ties: bool) -> None:
    ours, theirs = pair(ties)
    prune(ours, *LAYERS, amount=amount, scope="global")
    tprune.global_unstructured([(theirs.get_submodule(q), "weight") for q in LAYERS],
                               pruning_method=tprune.L1Unstructured, amount=amount)
    assert_same(ours, theirs)
    total = sum(int((getattr(ours, q).weight_mask == 0).sum()) for q in LAYERS)
    assert total == (amount if isinstance(amount, int) else round(amount * 678))


def test_global_random_unstructured_equals_torch() -> None:
    ours, theirs = pair()
    torch.manual_seed(5)
    prune(ours, *LAYERS, amount=0.6, scope="global", method="random_unstructured")
    torch.manual_seed(5)
    tprune.global_unstructured([(theirs.get_submodule(q), "weight") for q in LAYERS],
                               pruning_method=tprune.RandomUnstructured, amount=0.6)
    assert_same(ours, theirs)


ROUNDS = [
    [("l1_unstructured", 0.3, {}), ("ln_structured", 0.25, {"n": 2, "dim": 0}), ("random_unstructured", 0.2, {})],
    [("ln_structured", 2, {"n": 1, "dim": 1}), ("l1_unstructured", 0.5, {}), ("random_structured", 0.5, {"dim": 0})],
    [("random_structured", 1, {"dim": 0}), ("ln_structured", 0.5, {"n": 2, "dim": 0}), ("l1_unstructured", 7, {})],
    [("l1_unstructured", 0.5, {}), ("l1_unstructured", 0.5, {}), ("ln_structured", 1.0, {"n": 1, "dim": 0})],
    [("ln_structured", 1.0, {"n": 1, "dim": 0}), ("ln_structured", 0.5, {"n": 2, "dim": 0}),
     ("random_structured", 0.5, {"dim": 1})],  # rounds after everything is pruned prune nothing more
]


@pytest.mark.parametrize("rounds", ROUNDS)
def test_three_rounds_of_mixed_methods_compose_as_torch(rounds: list[tuple[str, int | float, dict]]) -> None:
    ours, theirs = pair(ties=True)
    for i, (method, amount, kw) in enumerate(rounds):
        torch.manual_seed(i)
        prune(ours, *LAYERS, amount=amount, method=method, **kw)
        torch.manual_seed(i)
        torch_prune(theirs, method, amount, **kw)
        assert_same(ours, theirs)
    for q in LAYERS:  # one hook per parameter, whatever the number of rounds
        assert len(getattr(ours, q)._forward_pre_hooks) == 1


def test_global_after_per_layer_rounds_composes_as_torch() -> None:
    ours, theirs = pair()
    prune(ours, "conv2", amount=0.5, method="ln_structured", n=2)
    tprune.ln_structured(theirs.conv2, "weight", 0.5, n=2, dim=0)
    prune(ours, *LAYERS, amount=0.5, scope="global")
    tprune.global_unstructured([(theirs.get_submodule(q), "weight") for q in LAYERS],
                               pruning_method=tprune.L1Unstructured, amount=0.5)
    assert_same(ours, theirs)


@pytest.mark.parametrize("method", ["l1_unstructured", "ln_structured"])
def test_remove_equals_torch_remove_and_keeps_the_parameter_object(method: str) -> None:
    ours, theirs = pair()
    originals = {q: getattr(ours, q).weight for q in LAYERS}
    prune(ours, *LAYERS, amount=0.5, method=method)
    torch_prune(theirs, method, 0.5)
    assert remove(ours) == [f"{q}.weight" for q in LAYERS]
    for q in LAYERS:
        tprune.remove(theirs.get_submodule(q), "weight")
        a, b = getattr(ours, q), getattr(theirs, q)
        assert a.weight is originals[q] and isinstance(a.weight, nn.Parameter)  # an optimizer keeps working
        assert torch.equal(a.weight, b.weight) and not a._forward_pre_hooks
        assert "weight_orig" not in a._parameters and "weight_mask" not in a._buffers
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert masked(ours) == []


def test_a_model_pruned_by_torch_is_read_and_made_permanent() -> None:
    net = Small()
    tprune.l1_unstructured(net.conv1, "weight", 0.5)
    tprune.ln_structured(net.fc, "weight", 2, n=2, dim=0)
    with torch.no_grad():
        net.conv2.bias.zero_()  # zeroed by hand, no mask
    assert masked(net) == [("conv1", "weight"), ("fc", "weight")]
    assert mask_of(net.conv1, "weight") is net.conv1.weight_mask
    r = sparsity(net)
    by = {(row.layer, row.param): row for row in r.rows}
    assert (by["conv1", "weight"].zeros, by["conv1", "weight"].masked) == (108, True)
    assert (by["fc", "weight"].zeros, by["fc", "bias"].zeros) == (12, 0)
    assert (by["conv2", "bias"].zeros, by["conv2", "bias"].masked) == (6, False)
    assert r.numel == sum(p.numel() for p in net.parameters()) and r.zeros == 108 + 12 + 6
    assert r["conv1.weight"].sparsity == 0.5
    assert remove(net, "conv1") == ["conv1.weight"] and masked(net) == [("fc", "weight")]


def test_a_layer_pruned_by_torch_is_adopted_without_a_second_hook_and_torch_can_still_remove_it() -> None:
    ours, theirs = pair()
    for net in (ours, theirs):
        tprune.l1_unstructured(net.conv1, "weight", 0.3)
    prune(ours, "conv1", amount=0.5, method="ln_structured", n=1)
    tprune.ln_structured(theirs.conv1, "weight", 0.5, n=1, dim=0)
    assert_same(ours, theirs, ["conv1"])
    hooks = list(ours.conv1._forward_pre_hooks.values())
    assert len(hooks) == 1 and isinstance(hooks[0], tprune.BasePruningMethod)  # torch's, kept
    tprune.remove(ours.conv1, "weight")
    tprune.remove(theirs.conv1, "weight")
    assert torch.equal(ours.conv1.weight, theirs.conv1.weight)


def test_apply_mask_composes_and_copies_the_mask() -> None:
    lin = nn.Linear(3, 2, bias=False)
    first = torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=torch.bool)
    apply_mask(lin, "weight", first)
    first[0, 0] = False  # the caller's tensor is not kept
    apply_mask(lin, "weight", torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))
    assert lin.weight_mask.tolist() == [[1, 0, 1], [0, 1, 1]] and lin.weight_mask.dtype == torch.float32
    assert torch.equal(lin.weight, lin.weight_orig * lin.weight_mask)
    assert [type(h) for h in lin._forward_pre_hooks.values()] == [MaskHook]


def test_the_weight_is_recomputed_from_orig_before_each_call() -> None:
    net = Small()
    prune(net, "fc", amount=0.5)
    with torch.no_grad():
        net.fc.weight_orig.add_(1.0)  # as an optimizer step would
    out = net(X)
    assert torch.equal(net.fc.weight, net.fc.weight_orig * net.fc.weight_mask)
    ref = nn.functional.linear(net.pool(net.conv2(net.act(net.conv1(X)))).flatten(1),
                               net.fc.weight_orig * net.fc.weight_mask, net.fc.bias)
    assert torch.equal(out, ref)


def test_a_later_prune_ranks_the_current_weights_not_the_last_forward_ones() -> None:
    ours, theirs = pair()
    prune(ours, "fc", amount=0.2)
    tprune.l1_unstructured(theirs.fc, "weight", 0.2)
    for net in (ours, theirs):
        with torch.no_grad():
            net.fc.weight_orig.mul_(torch.linspace(0.1, 3.0, 30).view(5, 6))
    theirs(X)  # torch ranks its `weight` attribute, refreshed only by a forward pass
    prune(ours, "fc", amount=0.5)
    tprune.l1_unstructured(theirs.fc, "weight", 0.5)
    assert_same(ours, theirs, ["fc"])


def test_gradients_reach_weight_orig_only_through_unmasked_entries() -> None:
    net = Small()
    prune(net, *LAYERS, amount=0.5)
    ref = Small()
    ref.load_state_dict({k.replace("_orig", ""): v for k, v in net.state_dict().items() if not k.endswith("_mask")})
    with torch.no_grad():
        for q in LAYERS:
            getattr(ref, q).weight.mul_(getattr(net, q).weight_mask)
    net(X).square().sum().backward()
    ref(X).square().sum().backward()
    for q in LAYERS:
        m, r = getattr(net, q), getattr(ref, q)
        assert torch.allclose(m.weight_orig.grad, r.weight.grad * m.weight_mask, atol=1e-6, rtol=0)
        assert bool((m.weight_orig.grad[m.weight_mask == 0] == 0).all())
        assert bool((m.weight_orig.grad[m.weight_mask == 1] != 0).any())


def test_state_dict_round_trips_into_a_pruned_model_ours_or_torchs() -> None:
    src = Small()
    prune(src, *LAYERS, amount=0.5, method="ln_structured", n=2)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    for make in ("ours", "torch"):
        dst = Small()
        if make == "ours":
            prune(dst, *LAYERS, amount=0.0)
        else:
            torch_prune(dst, "l1_unstructured", 0.0)
        buf.seek(0)
        dst.load_state_dict(torch.load(buf))
        assert torch.equal(dst(X), src(X))
        assert all(torch.equal(getattr(dst, q).weight_mask, getattr(src, q).weight_mask) for q in LAYERS)
    # and into a plain model after remove
    remove(src)
    plain = Small()
    plain.load_state_dict(src.state_dict())
    assert torch.equal(plain(X), src(X))


def test_deepcopy_runs_and_its_masks_are_independent() -> None:
    net = Small()
    prune(net, *LAYERS, amount=0.5)
    twin = copy.deepcopy(net)
    assert torch.equal(twin(X), net(X)) and masked(twin) == masked(net)
    before = net.fc.weight_mask.clone()
    prune(twin, "fc", amount=1.0)
    assert torch.equal(net.fc.weight_mask, before) and int(twin.fc.weight.abs().sum()) == 0
    assert not torch.equal(twin(X), net(X))


def test_pickling_a_pruned_model_keeps_its_masks() -> None:
    net = Small()
    prune(net, *LAYERS, amount=0.3, method="random_unstructured")
    back = pickle.loads(pickle.dumps(net))
    assert torch.equal(back(X), net(X)) and masked(back) == masked(net)
    assert [type(h) for h in back.fc._forward_pre_hooks.values()] == [MaskHook]


@pytest.mark.slow
def test_a_pruned_model_under_torch_compile_gives_the_eager_outputs() -> None:
    net = Small()
    prune(net, *LAYERS, amount=0.5)
    eager = net(X)
    compiled = torch.compile(net)
    assert torch.allclose(compiled(X), eager, atol=1e-6)
    r = prune(compiled, "fc", amount=1.0)  # names through the wrapper, the compiled model sees the change
    assert [row.layer for row in r.rows] == ["fc"] and masked(compiled) == masked(net)
    assert torch.allclose(compiled(X), net(X), atol=1e-6)
    assert torch.allclose(compiled(X), net.fc.bias.expand(2, 5), atol=1e-6)


def test_dataparallel_names_are_those_of_the_inner_model() -> None:
    net = Small()
    dp = nn.DataParallel(net)
    r = prune(dp, "module.conv1", "fc", amount=0.5)
    assert [row.layer for row in r.rows] == ["conv1", "fc"]
    assert masked(dp) == [("conv1", "weight"), ("fc", "weight")]
    assert [row.layer for row in sparsity(dp, name="weight").rows] == ["conv1", "conv2", "fc"]
    assert remove(dp, "conv1") == ["conv1.weight"]


def test_default_selection_is_every_linear_and_conv() -> None:
    net = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4), nn.Flatten(), nn.Linear(4, 3), nn.LayerNorm(3))
    r = prune(net, amount=1)
    assert [(row.layer, row.zeros) for row in r.rows] == [("0", 1), ("3", 1)]
    assert r.numel == 8 + 12 and r.zeros == 2
    assert masked(net) == [("0", "weight"), ("3", "weight")]


def test_a_glob_prunes_the_matches_that_have_the_parameter() -> None:
    net = Small()
    r = prune(net, "*", amount=0.5)  # the ReLU and the pool have no weight: skipped
    assert [row.layer for row in r.rows] == LAYERS
    r = prune(net, "conv1", amount=0.5, name="bias")
    assert (r["conv1"].param, r["conv1"].zeros) == ("bias", 4)


def test_result_speaks_the_protocol() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    r = prune(net, amount=0.5)
    assert "0" in r and "0.weight" in r and "2" not in r
    assert r.to_dict()["sparsity"] == 0.5 and '"zeros": 4' in r.to_json()
    assert str(r).splitlines()[-1].split() == ["total", "8", "4", "50.0%"]
    with pytest.raises(KeyError, match="no layer .O. in this result. It has: .0., .1."):
        r["O"]
    s = sparsity(net)
    with pytest.raises(HookscopeError, match="layer '0' has 2 rows .bias, weight.; ask for one as '0.bias'"):
        s["0"]  # two rows: weight and bias


def bad_calls() -> list[tuple[str, dict, str]]:
    return [
        ("amount above 1", {"amount": 1.5}, r"amount=1\.5 is outside \[0, 1\]"),
        ("negative fraction", {"amount": -0.1}, "outside"),
        ("negative count", {"amount": -1}, "negative count"),
        ("bool amount", {"amount": True}, "not a number"),
        ("text amount", {"amount": "0.5"}, "not a number"),
        ("nan amount", {"amount": float("nan")}, "outside"),
        ("count above units of the last layer", {"amount": 31}, "fc.weight: amount=31 is more than the 30"),
        ("count above channels", {"amount": 6, "method": "ln_structured"}, "fc.weight: amount=6 is more than the 5"),
        ("global count", {"amount": 679, "scope": "global"}, "global pruning of 3 layers: amount=679"),
        ("global structured", {"amount": 0.5, "scope": "global", "method": "ln_structured"}, "ranks channels"),
        ("unknown method", {"amount": 0.5, "method": "l2_unstructured"}, "no pruning method"),
        ("bad scope", {"amount": 0.5, "scope": "model"}, "not a scope"),
        ("dim out of range of the last layer", {"amount": 0.5, "method": "ln_structured", "dim": 2},
         r"fc.weight: dim=2 is out of range for a tensor of shape \(5, 6\)"),
        ("structured bias", {"amount": 0.5, "method": "ln_structured", "name": "bias"}, "structured pruning needs"),
        ("missing parameter", {"amount": 0.5, "name": "gamma"}, "has no parameter 'gamma'"),
        ("bad norm", {"amount": 0.5, "method": "ln_structured", "n": "l2"}, "not a norm order"),
        ("bad generator", {"amount": 0.5, "generator": 3}, "not a torch.Generator"),
        ("nuclear norm of a 4-D weight", {"amount": 0.5, "method": "ln_structured", "n": "nuc"},
         "conv1.weight: n='nuc' needs a parameter of 3 dims"),
    ]


@pytest.mark.parametrize("case", bad_calls(), ids=[c[0] for c in bad_calls()])
def test_bad_input_is_one_line_and_leaves_the_model_unchanged(case: tuple[str, dict, str]) -> None:
    _, kw, message = case
    net = Small()
    prune(net, "conv2", amount=0.25)  # a pruned layer among the targets too
    before = state(net)
    with pytest.raises(HookscopeError, match=message) as err:
        prune(net, *LAYERS, **kw)
    assert "\n" not in str(err.value)
    assert_unchanged(net, before)


@pytest.mark.parametrize("selectors", [("conv1", "act"), ("nope",), ("conv1", "re:zz.*")])
def test_a_selector_without_the_parameter_or_matching_nothing_changes_nothing(selectors: tuple[str, ...]) -> None:
    net = Small()
    before = state(net)
    with pytest.raises(HookscopeError) as err:
        prune(net, *selectors, amount=0.5)
    assert "\n" not in str(err.value)
    if "act" in selectors:
        assert "'act' (ReLU) has no parameter 'weight'" in str(err.value)
    assert_unchanged(net, before)


def test_a_count_above_the_units_left_after_a_round_is_refused() -> None:
    net = Small()
    prune(net, "fc", amount=20)
    before = state(net)
    with pytest.raises(HookscopeError, match="fc.weight: amount=11 is more than the 10 units left"):
        prune(net, "fc", amount=11)
    assert_unchanged(net, before)
    prune(net, "fc", amount=10)
    assert int(net.fc.weight_mask.sum()) == 0


def test_a_soft_mask_and_a_reparametrized_weight_are_refused() -> None:
    net = Small()
    tprune.custom_from_mask(net.fc, "weight", torch.full((5, 6), 0.5))
    before = state(net)
    with pytest.raises(HookscopeError, match="values other than 0 and 1"):
        prune(net, "conv1", "fc", amount=0.5)
    assert_unchanged(net, before)
    with pytest.raises(HookscopeError, match="values other than 0 and 1"):
        apply_mask(net.conv1, "weight", torch.full((8, 3, 3, 3), 0.5))
    norm = nn.utils.parametrizations.weight_norm(nn.Linear(3, 3))
    with pytest.raises(HookscopeError, match="computed by another reparametrization"):
        prune(nn.Sequential(norm), "0", amount=0.5)


def test_remove_and_sparsity_refuse_what_they_cannot_do() -> None:
    net = Small()
    with pytest.raises(HookscopeError, match="no masked parameter"):
        remove(net, "conv1")
    assert remove(net) == []
    with pytest.raises(HookscopeError, match="not masked"):
        make_permanent(net.conv1, "weight")
    with pytest.raises(HookscopeError, match="no parameter 'weight'"):
        sparsity(net, "act", name="weight")


def test_masks_keep_the_parameter_dtype_as_torch_does() -> None:
    ours, theirs = pair()
    ours.double()
    theirs.double()
    prune(ours, "fc", amount=0.5)
    tprune.l1_unstructured(theirs.fc, "weight", 0.5)
    assert ours.fc.weight_mask.dtype == torch.float64
    assert torch.equal(ours.fc.weight_mask, theirs.fc.weight_mask)


def test_new_mask_on_a_hand_worked_tensor() -> None:
    t = torch.tensor([[1.0, -4.0, 2.0], [0.5, 3.0, -0.1]])
    m = new_mask("l1_unstructured", t, None, Spec(0.5))  # round(3.0) = 3 smallest |t|: 0.1, 0.5, 1.0
    assert m.tolist() == [[0, 1, 1], [0, 1, 0]]
    # column 0 is already fully masked: only columns 1 (L1 7.0) and 2 (L1 2.1) are ranked
    s = new_mask("ln_structured", t, m, Spec(1, n=1, dim=1))
    assert s.tolist() == [[0, 1, 0], [0, 1, 0]]
    assert new_mask("ln_structured", t, s, Spec(1, n=1, dim=1)).tolist() == [[0, 0, 0], [0, 0, 0]]
    with pytest.raises(HookscopeError, match="amount=2 is more than the 1 units left"):
        new_mask("ln_structured", t, s, Spec(2, n=1, dim=1))


def test_a_deep_copy_computes_with_its_own_original_also_after_a_forward() -> None:
    net = Small()
    prune(net, *LAYERS, amount=0.5)
    net(X).sum().backward()  # `weight` attributes are now non-leaf tensors of this graph
    twin = copy.deepcopy(net)
    twin.fc.weight.sum().backward()  # before any forward of the copy
    assert torch.equal(twin.fc.weight_orig.grad, twin.fc.weight_mask)
    assert not torch.equal(net.fc.weight_orig.grad, twin.fc.weight_orig.grad)
    assert twin.fc._forward_pre_hooks[next(iter(twin.fc._forward_pre_hooks))]._module() is twin.fc


def test_load_state_dict_refreshes_the_masked_weight_at_once() -> None:
    src, dst = Small(), Small()
    prune(src, *LAYERS, amount=0.5)
    prune(dst, *LAYERS, amount=0.0)
    dst.load_state_dict(src.state_dict())
    for q in LAYERS:  # before any forward pass
        assert torch.equal(getattr(dst, q).weight, getattr(src, q).weight)
    remove(dst)
    assert all(not m._load_state_dict_post_hooks for m in dst.modules())


def test_tied_weights_are_refused() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].weight = net[0].weight
    before = state(net)
    with pytest.raises(HookscopeError, match=r"1.weight is the same Parameter as 0.weight \(tied weights\)"):
        prune(net, "1", amount=0.5)
    assert_unchanged(net, before)


def test_a_bare_layer_and_a_lazy_layer() -> None:
    lin = nn.Linear(4, 2)
    r = prune(lin, amount=3)
    assert [(row.layer, row.zeros) for row in r.rows] == [("", 3)] and masked(lin) == [("", "weight")]
    assert remove(lin) == ["weight"]
    lazy = nn.Sequential(nn.LazyLinear(3))
    with pytest.raises(HookscopeError, match="holds no values yet"):
        prune(lazy, amount=0.5)
    lazy(torch.ones(1, 2))
    assert prune(lazy, amount=0.5).zeros == 3


def layer_scores(net: nn.Module, seed: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {q: (torch.randn(net.get_submodule(q).weight.shape, generator=g) * 2).round() for q in LAYERS}  # ties


def test_scores_rank_as_torch_importance_scores() -> None:
    ours, theirs = pair()
    scores = layer_scores(ours)
    prune(ours, *LAYERS, amount=0.4, scores=scores)
    for q in LAYERS:
        tprune.l1_unstructured(theirs.get_submodule(q), "weight", 0.4, importance_scores=scores[q])
    assert_same(ours, theirs)
    scores = layer_scores(ours, seed=5)
    prune(ours, *LAYERS, amount=0.5, method="ln_structured", n=2, dim=1, scores=scores)
    for q in LAYERS:
        tprune.ln_structured(theirs.get_submodule(q), "weight", 0.5, n=2, dim=1, importance_scores=scores[q])
    assert_same(ours, theirs)
    scores = layer_scores(ours, seed=6)
    prune(ours, *LAYERS, amount=0.3, scope="global", scores=scores)
    tprune.global_unstructured([(theirs.get_submodule(q), "weight") for q in LAYERS],
                               pruning_method=tprune.L1Unstructured, amount=0.3,
                               importance_scores={(theirs.get_submodule(q), "weight"): scores[q] for q in LAYERS})
    assert_same(ours, theirs)


def test_one_score_per_channel_prunes_the_lowest_channels() -> None:
    ours, theirs = pair()
    channel = torch.tensor([5.0, 0.1, 3.0, -0.2, 4.0, 1.0, 2.0, 0.3])  # conv1's 8 output channels
    prune(ours, "conv1", amount=3, method="ln_structured", scores={"conv1": channel})
    assert ours.conv1.weight_mask.sum(dim=(1, 2, 3)).nonzero().flatten().tolist() == [0, 2, 4, 5, 6]
    tprune.ln_structured(theirs.conv1, "weight", 3, n=1, dim=0,
                         importance_scores=channel.view(8, 1, 1, 1).expand(8, 3, 3, 3))
    assert_same(ours, theirs, ["conv1"])


@pytest.mark.parametrize("kw, message", [
    ({"scores": {"conv1": torch.ones(8), "fc": torch.ones(5, 6)}}, r"scores\['conv1'\] has shape \(8,\), conv1.weight \(8, 3, 3, 3\)"),
    ({"scores": {"conv1": torch.ones(8, 3, 3, 3)}}, "no scores for 'fc'"),
    ({"scores": {"conv1": torch.ones(8, 3, 3, 3), "fc": torch.ones(5, 6), "fc2": torch.ones(1)}},
     "'fc2' is not a pruned layer"),
    ({"scores": {"conv1": torch.ones(8, 3, 3, 3), "fc": [1.0]}}, "is not a tensor of numbers"),
    ({"scores": {"conv1": torch.ones(8, 3, 3, 3), "fc": torch.ones(5, 6)}, "method": "random_unstructured"},
     "takes no scores"),
])
def test_bad_scores_are_refused_before_any_change(kw: dict, message: str) -> None:
    net = Small()
    before = state(net)
    with pytest.raises(HookscopeError, match=message):
        prune(net, "conv1", "fc", amount=0.5, **kw)
    assert_unchanged(net, before)


def test_pruning_under_inference_mode_leaves_a_model_that_trains() -> None:
    net = Small()
    with torch.inference_mode():
        prune(net, *LAYERS, amount=0.5)
        prune(net, "fc", amount=0.5)
    assert not any(b.is_inference() for b in net.buffers())
    net(X).sum().backward()
    assert bool((net.fc.weight_orig.grad[net.fc.weight_mask == 0] == 0).all())


def test_torch_pruning_a_layer_hookscope_masked_fails_loudly_not_silently() -> None:
    net = Small()
    prune(net, "fc", amount=0.5)
    before = state(net)
    with pytest.raises(TypeError):  # torch would move the computed `weight` to `weight_orig`: it refuses
        tprune.l1_unstructured(net.fc, "weight", 0.5)
    assert_unchanged(net, before)


def test_random_structured_with_a_generator_draws_as_torch_from_the_same_seed() -> None:
    ours, theirs = pair()
    prune(ours, *LAYERS, amount=0.5, method="random_structured", dim=1, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(9)
    torch_prune(theirs, "random_structured", 0.5, dim=1)
    assert_same(ours, theirs)


_STEP = st.tuples(
    st.sampled_from(["l1_unstructured", "random_unstructured", "ln_structured", "random_structured", "global"]),
    st.one_of(st.floats(0.0, 1.0), st.integers(0, 3)),
    st.sampled_from([1, 2, math.inf, "fro"]),
    st.sampled_from([0, 1, -1]),
)


@settings(derandomize=True, database=None, max_examples=40, deadline=None)
@given(shape=st.sampled_from([(4, 3), (3, 2, 2), (5, 1), (2, 3, 1, 2)]), steps=st.lists(_STEP, min_size=1, max_size=4),
       ties=st.booleans())
def test_any_sequence_of_rounds_equals_torch(shape: tuple[int, ...], steps: list[tuple], ties: bool) -> None:
    """Random shapes, amounts, norms, dims and orders of methods: masks equal torch's, or both refuse."""
    g = torch.Generator().manual_seed(len(steps))
    w, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    ours, theirs = (nn.ParameterDict({"a": nn.Parameter((w * 2).round() if ties else w.clone()),
                                      "b": nn.Parameter(v.clone())}) for _ in range(2))
    holders = [nn.Module() for _ in range(4)]
    for h, p in zip(holders, [ours["a"], ours["b"], theirs["a"], theirs["b"]]):
        h.register_parameter("weight", p)
    ours_net, theirs_net = nn.ModuleList(holders[:2]), nn.ModuleList(holders[2:])
    for i, (method, amount, n, dim) in enumerate(steps):
        torch.manual_seed(i)
        try:
            if method == "global":
                tprune.global_unstructured([(h, "weight") for h in holders[2:]], tprune.L1Unstructured, amount=amount)
            else:
                for h in holders[2:]:
                    torch_prune(nn.ModuleDict({"x": h}), method, amount, n=n, dim=dim, layers=["x"])
        except (ValueError, IndexError):
            with pytest.raises(HookscopeError):
                prune(ours_net, "0", "1", amount=amount, method="l1_unstructured" if method == "global" else method,
                      n=n, dim=dim, scope="global" if method == "global" else "layer")
            return
        torch.manual_seed(i)
        prune(ours_net, "0", "1", amount=amount, method="l1_unstructured" if method == "global" else method,
              n=n, dim=dim, scope="global" if method == "global" else "layer")
        for a, b in zip(holders[:2], holders[2:]):
            assert torch.equal(a.weight_mask, b.weight_mask) and torch.equal(a.weight, b.weight)


def test_remove_of_a_layer_pruned_twice_by_torch_equals_torch_remove() -> None:
    ours, theirs = pair()
    for net in (ours, theirs):
        tprune.l1_unstructured(net.conv2, "weight", 0.3)
        tprune.ln_structured(net.conv2, "weight", 2, n=2, dim=0)
    assert isinstance(next(iter(ours.conv2._forward_pre_hooks.values())), tprune.PruningContainer)
    assert remove(ours) == ["conv2.weight"]
    tprune.remove(theirs.conv2, "weight")
    assert torch.equal(ours.conv2.weight, theirs.conv2.weight) and not ours.conv2._forward_pre_hooks
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_a_buffer_and_a_container_are_named_as_such() -> None:
    net = nn.Sequential(nn.BatchNorm1d(3), nn.Sequential(nn.Linear(3, 3)))
    with pytest.raises(HookscopeError, match="'running_mean' of '0' .BatchNorm1d. is a buffer, not a parameter"):
        prune(net, "0", amount=0.5, name="running_mean")
    with pytest.raises(HookscopeError, match=r"'1' \(Sequential\) has no parameter 'weight' .its parameters: none; "
                                             r"select its layers, e.g. '1\.\*'"):
        prune(net, "1", amount=0.5)
    import numpy as np

    r = prune(net, "1.*", amount=np.float32(0.5), method="ln_structured", dim=np.int64(1))  # numpy numbers work
    assert r.zeros == 3 * round(0.5 * 3)


def test_a_pruned_model_pickled_reloaded_and_run_still_deep_copies(tmp_path):
    import copy as _copy

    from hookscope.analysis.prune import prune as _prune

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    _prune(net, amount=0.5)
    torch.save(net, tmp_path / "net.pt")
    back = torch.load(tmp_path / "net.pt", weights_only=False)
    x = torch.randn(3, 4)
    back(x)
    twin = _copy.deepcopy(back)                       # raised "Only Tensors created explicitly by the user ..."
    assert torch.equal(twin(x), back(x))
    twin[0].weight_orig.data.add_(1.0)
    assert not torch.equal(twin(x), back(x))          # its own parameters


# --- memory layouts: channels_last, transposed, expanded, strided ---------------------------------------------
def _layouts() -> list[tuple[str, nn.Module]]:
    """Layers whose weight is not laid out row-major; their contiguous twin is what torch can prune."""
    torch.manual_seed(3)
    out: list[tuple[str, nn.Module]] = [("channels_last", nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)),
                                        ("channels_last_3d", nn.Conv3d(2, 4, 2).to(memory_format=torch.channels_last_3d))]
    for name, w in (("transposed", torch.randn(4, 6).t()), ("expanded", torch.randn(6, 1).expand(6, 4)),
                    ("strided", torch.randn(6, 8)[:, ::2])):
        lin = nn.Linear(4, 6, bias=False)
        lin.weight = nn.Parameter(w)
        out.append((name, lin))
    return out


def _contiguous_twin(layer: nn.Module) -> nn.Module:
    twin = copy.deepcopy(layer)
    twin.weight = nn.Parameter(layer.weight.detach().contiguous().clone())
    assert twin.weight.is_contiguous()
    return twin


_TORCH_METHODS = {"l1_unstructured": lambda m, a: tprune.l1_unstructured(m, "weight", a),
                  "random_unstructured": lambda m, a: tprune.random_unstructured(m, "weight", a),
                  "ln_structured": lambda m, a: tprune.ln_structured(m, "weight", a, n=2, dim=0),
                  "random_structured": lambda m, a: tprune.random_structured(m, "weight", a, dim=1)}


@pytest.mark.parametrize("layout", [name for name, _ in _layouts()])
@pytest.mark.parametrize("method", list(_TORCH_METHODS))
def test_every_method_on_every_weight_layout_equals_torch_on_the_contiguous_weight(method: str, layout: str) -> None:
    layer = dict(_layouts())[layout]
    twin = _contiguous_twin(layer)
    kw = {"n": 2} if method == "ln_structured" else {"dim": 1} if method == "random_structured" else {}
    strides = layer.weight.stride()
    for step, amount in enumerate((0.3, 1)):  # a fraction, then a count composed on the first mask
        torch.manual_seed(10 + step)
        _TORCH_METHODS[method](twin, amount)
        torch.manual_seed(10 + step)
        prune(layer, amount=amount, method=method, **kw)
        assert torch.equal(layer.weight_mask, twin.weight_mask)
        assert torch.equal(layer.weight, twin.weight) and torch.equal(layer.weight_orig, twin.weight_orig)
    assert float((layer.weight_mask == 0).float().mean()) >= 0.3
    dense = layout not in ("expanded", "strided")  # a dense layout is kept by the mask and the weight
    assert layer.weight_orig.stride() == strides
    assert layer.weight_mask.stride() == layer.weight.stride() == (strides if dense else twin.weight.stride())
    tprune.remove(twin, "weight")
    remove(layer)
    assert torch.equal(layer.weight, twin.weight) and (not dense or layer.weight.stride() == strides)


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
def test_a_channels_last_model_keeps_its_layout_and_computes_what_the_contiguous_one_does(method: str) -> None:
    net = Small()
    twin = copy.deepcopy(net)
    net = net.to(memory_format=torch.channels_last)
    for n, m in (("hookscope", net), ("torch", twin)):
        torch.manual_seed(4)
        if n == "hookscope":
            prune(m, amount=0.4, method=method)
        else:
            torch_prune(m, method, 0.4)
    for q in LAYERS:
        assert torch.equal(net.get_submodule(q).weight_mask, twin.get_submodule(q).weight_mask)
    assert net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = X.to(memory_format=torch.channels_last)
    torch.testing.assert_close(net(x), twin(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
def test_global_pruning_over_channels_last_and_transposed_weights_equals_torch(method: str) -> None:
    layers = [layer for name, layer in _layouts() if name in ("channels_last", "transposed", "strided")]
    net = nn.ModuleList(layers)
    twin = nn.ModuleList([_contiguous_twin(m) for m in layers])
    torch.manual_seed(6)
    kind = {"l1_unstructured": tprune.L1Unstructured, "random_unstructured": tprune.RandomUnstructured}[method]
    tprune.global_unstructured([(m, "weight") for m in twin], kind, amount=0.5)
    torch.manual_seed(6)
    prune(net, "0", "1", "2", amount=0.5, method=method, scope="global")
    for a, b in zip(net, twin):
        assert torch.equal(a.weight_mask, b.weight_mask) and torch.equal(a.weight, b.weight)
