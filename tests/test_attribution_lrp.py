"""hookscope.attribute's backward-pass rules: DeconvNet against hand computations, LRP against zennit
0.5.1 (every composite on VGG-16 and ResNet-18, each rule alone), conservation, activations that
zennit's module hooks cannot reach, the model left bit-identical, and one-line refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookscope
import hookscope.zoo
from hookscope import HookscopeError
from hookscope.analysis.attribution import LRPRule

from helpers import no_hooks, one_thread_only, rel

zennit = pytest.importorskip("zennit")
torchvision = pytest.importorskip("torchvision")
from zennit import rules as zr  # noqa: E402
from zennit.attribution import Gradient  # noqa: E402
from zennit.canonizers import SequentialMergeBatchNorm  # noqa: E402
from zennit.composites import (EpsilonAlpha2Beta1, EpsilonGammaBox, EpsilonPlus, EpsilonPlusFlat,  # noqa: E402
                               NameMapComposite)
from zennit.torchvision import ResNetCanonizer  # noqa: E402

TARGET = 3


one_thread = pytest.fixture(autouse=True, scope="module")(one_thread_only)


def zennit_lrp(model: nn.Module, x: torch.Tensor, composite: object, target: int = TARGET) -> torch.Tensor:
    """zennit's Gradient attributor with the relevance at the output being the target's score."""
    with Gradient(model, composite) as attributor:
        _, r = attributor(x.clone(), lambda out: F.one_hot(torch.tensor([target] * x.shape[0]), out.shape[1]) * out)
    return r.detach()


def state(model: nn.Module) -> dict[str, object]:
    return {"tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()},
            "flags": [m.training for m in model.modules()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "forward": [m for m in model.modules() if "forward" in vars(m)]}


def unchanged(model: nn.Module, before: dict[str, object]) -> bool:
    now = state(model)
    same = all(torch.equal(now["tensors"][k], v) for k, v in before["tensors"].items())  # bit-identical
    grads = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                for a, b in zip(before["grads"], now["grads"]))
    return (same and grads and no_hooks(model) and now["flags"] == before["flags"]
            and now["requires_grad"] == before["requires_grad"] and not now["forward"])


def _images(dtype: torch.dtype, size: int) -> torch.Tensor:
    return torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1)).to(dtype)


BOUNDS = (torch.zeros(1, 3, 1, 1), torch.ones(1, 3, 1, 1))  # the images lie in [0, 1] per channel


def zennit_composite(name: str, canonizers: list[object], x: torch.Tensor) -> object:
    low, high = (b.to(x.dtype).expand_as(x) for b in BOUNDS)
    return {"epsilon_plus": lambda: EpsilonPlus(canonizers=canonizers),
            "epsilon_plus_flat": lambda: EpsilonPlusFlat(canonizers=canonizers),
            "epsilon_gamma_box": lambda: EpsilonGammaBox(low=low, high=high, canonizers=canonizers),
            "epsilon_alpha2_beta1": lambda: EpsilonAlpha2Beta1(canonizers=canonizers)}[name]()


COMPOSITES = ["epsilon_plus", "epsilon_plus_flat", "epsilon_gamma_box", "epsilon_alpha2_beta1"]


# --- against zennit on torchvision models ---------------------------------------------------------------
@pytest.fixture(scope="module")
def vgg() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.vgg16(weights=None).eval()


def _randomise_batch_norms(model: nn.Module, eps: float) -> nn.Module:
    """Batch norms with statistics and affine parameters of their own, so merging them changes something."""
    g = torch.Generator().manual_seed(5)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
            m.eps = eps
    return model


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    # eps=0: zennit turns a merged batch norm into x / sqrt(1 + eps), ours hands x on, so only then are
    # the two bit for bit comparable (with eps=1e-5 they differ by ~1e-4, see below)
    return _randomise_batch_norms(torchvision.models.resnet18(weights=None), 0.0).double().eval()


@pytest.mark.parametrize("composite", COMPOSITES)
def test_every_composite_equals_zennit_on_vgg16(vgg, composite):
    x = _images(torch.float32, 32)
    before = state(vgg)
    ours = hookscope.attribute(vgg, x, method="lrp", composite=composite, target=TARGET, bounds=BOUNDS)
    assert unchanged(vgg, before)
    theirs = zennit_lrp(vgg, x, zennit_composite(composite, [SequentialMergeBatchNorm()], x))
    assert rel(ours.maps, theirs) <= 1e-5
    assert ours.settings == {"composite": composite, "canonize": True}


@pytest.mark.parametrize("composite", COMPOSITES)
def test_every_composite_equals_zennit_on_resnet18_with_its_canonizer(resnet, composite):
    x = _images(torch.float64, 32)
    before = state(resnet)
    ours = hookscope.attribute(resnet, x, method="lrp", composite=composite, target=TARGET, bounds=BOUNDS)
    assert unchanged(resnet, before)  # batch norms merged for the pass only, every tensor bit-identical
    theirs = zennit_lrp(resnet, x, zennit_composite(composite, [ResNetCanonizer()], x))
    assert rel(ours.maps, theirs) <= 1e-10


def test_batch_norms_with_their_usual_eps_differ_from_zennit_only_by_its_identity_rescaling():
    torch.manual_seed(0)
    net = _randomise_batch_norms(torchvision.models.resnet18(weights=None), 1e-5).double().eval()
    x = _images(torch.float64, 32)
    ours = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", target=TARGET).maps
    theirs = zennit_lrp(net, x, EpsilonPlus(canonizers=[ResNetCanonizer()]))
    assert 1e-8 < rel(ours, theirs) <= 1e-3


def _conv_bn(eps: float) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 8, 3, bias=False),
                        nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))
    return _randomise_batch_norms(net, eps).double().eval()


@pytest.mark.parametrize("canonize", [True, False])
def test_batch_norms_merged_or_passed_on_as_zennit_does_with_and_without_its_canonizer(canonize):
    net, x = _conv_bn(0.0), _images(torch.float64, 12)
    before = state(net)
    ours = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", canonize=canonize, target=TARGET)
    assert unchanged(net, before) and ours.settings == {"composite": "epsilon_plus", "canonize": canonize}
    theirs = zennit_lrp(net, x, EpsilonPlus(canonizers=[SequentialMergeBatchNorm()] if canonize else None))
    assert rel(ours.maps, theirs) <= 1e-10
    other = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", canonize=not canonize, target=TARGET)
    assert rel(other.maps, theirs) > 1e-3  # the setting matters on this net


# --- each rule alone, against zennit's rule on the same layer ------------------------------------------------
def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Conv2d(5, 6, 3, padding=1), nn.ReLU(),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(6 * 4 * 4, 7)).double().eval()


RULES = [("epsilon:0.1", lambda: zr.Epsilon(epsilon=0.1)), ("gamma:0.5", lambda: zr.Gamma(gamma=0.5)),
         ("zplus", lambda: zr.ZPlus()), ("alpha_beta:1:0", lambda: zr.AlphaBeta(alpha=1, beta=0)),
         ("alpha_beta:2:1", lambda: zr.AlphaBeta(alpha=2, beta=1)), ("flat", lambda: zr.Flat()),
         ("wsquare", lambda: zr.WSquare()), ("norm", lambda: zr.Norm())]


@pytest.mark.parametrize("spec, theirs", RULES, ids=[s for s, _ in RULES])
def test_each_rule_equals_zennits_on_every_layer_it_is_given(spec, theirs):
    net, x = _small(), _images(torch.float64, 10) - 0.3  # inputs of both signs
    ours = hookscope.attribute(net, x, method="lrp", composite={"0": spec, "2": spec, "6": spec}, target=TARGET)
    names = [("0", theirs()), ("2", theirs()), ("6", theirs()), ("4", zr.Norm()), ("1", zr.Pass()), ("3", zr.Pass())]
    want = zennit_lrp(net, x, NameMapComposite([((n,), r) for n, r in names]))
    assert rel(ours.maps, want) <= 1e-10 and no_hooks(net)


def test_zbox_with_tensor_bounds_per_channel_equals_zennit():
    net, x = _small(), _images(torch.float64, 10)
    low, high = torch.tensor([0.0, -0.1, 0.05]).view(1, 3, 1, 1), torch.tensor([1.0, 1.1, 0.9]).view(1, 3, 1, 1)
    ours = hookscope.attribute(net, x, method="lrp", target=TARGET,
                               composite={"0": LRPRule("zbox", low=low, high=high), nn.Conv2d: "gamma"})
    zbox = zr.ZBox(low=low.double().expand_as(x), high=high.double().expand_as(x))
    names = [("0", zbox), ("2", zr.Gamma()), ("6", zr.Epsilon()), ("4", zr.Norm()), ("1", zr.Pass()), ("3", zr.Pass())]
    assert rel(ours.maps, zennit_lrp(net, x, NameMapComposite([((n,), r) for n, r in names]))) <= 1e-10


# --- conservation ---------------------------------------------------------------------------------------------
def _bias_free() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8, bias=False), nn.ReLU(), nn.Linear(8, 8, bias=False), nn.ReLU(inplace=True),
                         nn.Linear(8, 4, bias=False)).double()


@pytest.mark.parametrize("spec", ["epsilon:0", "epsilon", "zplus", "alpha_beta:1:0"])
def test_relevance_is_conserved_on_a_bias_free_net(spec):
    net = _bias_free()
    x = torch.rand(3, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.1  # positive inputs
    res = hookscope.attribute(net, x, method="lrp", composite={nn.Linear: spec}, target=1)
    assert torch.allclose(res.maps.sum(1), res.scores, rtol=1e-10 if spec == "epsilon:0" else 1e-4, atol=0)


class _Residual(nn.Module):
    """A bias-free residual block written as torchvision writes it: ``out += identity``, an in-place ReLU used twice."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a, self.b, self.head = nn.Linear(5, 5, bias=False), nn.Linear(5, 5, bias=False), nn.Linear(5, 3, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.relu(x * 1.0)
        out = self.b(self.relu(self.a(identity)))
        out += identity
        return self.head(self.relu(out))


def test_a_residual_sum_splits_relevance_in_proportion_and_conserves_it():
    net = _Residual().double()
    x = torch.rand(4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = hookscope.attribute(net, x, method="lrp", composite={nn.Linear: "epsilon:0"}, target=0)
    assert torch.allclose(res.maps.sum(1), res.scores, rtol=1e-4)  # the sum's stabiliser keeps ~1e-6
    # LRP-0 on a bias-free ReLU net is gradient x input (Ancona et al. 2018), the sum split included
    plain = hookscope.attribute(net, x, method="input_x_gradient", target=0)
    assert rel(res.maps, plain.maps) <= 1e-4


def test_the_residual_sum_equals_zennits_canonized_sum():
    from zennit.layer import Sum

    class Stacked(_Residual):
        def __init__(self) -> None:
            super().__init__()
            self.sum = Sum()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = torch.relu(x * 1.0)
            out = self.b(self.relu(self.a(identity)))
            return self.head(self.relu(self.sum(torch.stack([identity, out], dim=-1))))

    net = _Residual().double()
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", target=0)
    assert rel(ours.maps, zennit_lrp(Stacked().double(), x, EpsilonPlus(), target=0)) <= 1e-10


# --- activations zennit's module hooks cannot reach -------------------------------------------------------------
class _Block(nn.Module):
    """A transformer-like block written with functions: F.gelu, an in-place SiLU, a residual sum, F.relu."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.up, self.down, self.mix, self.head = nn.Linear(6, 12), nn.Linear(12, 6), nn.Linear(6, 6), nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(F.gelu(self.up(x)))
        h = F.silu(self.mix(h), inplace=True)
        return self.head(F.relu(h))


class _BlockOfModules(_Block):
    """The same block with activation modules and zennit's Sum module: what zennit's composites can see."""

    def __init__(self) -> None:
        from zennit.layer import Sum

        super().__init__()
        self.gelu, self.silu, self.relu, self.sum = nn.GELU(), nn.SiLU(), nn.ReLU(), Sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.sum(torch.stack([x, self.down(self.gelu(self.up(x)))], dim=-1))
        return self.head(self.relu(self.silu(self.mix(h))))


def test_lrp_reaches_functional_and_in_place_activations_and_sums_as_zennit_reaches_modules():
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    net = _Block().double()
    before = state(net)
    ours = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", target=1)
    assert unchanged(net, before)
    theirs = zennit_lrp(_BlockOfModules().double(), x, EpsilonPlus(), target=1)
    assert rel(ours.maps, theirs) <= 1e-10
    plain = zennit_lrp(net, x, EpsilonPlus(), target=1)  # zennit on the functional block: gradients through them
    assert rel(plain, theirs) > 1e-3


# --- DeconvNet ---------------------------------------------------------------------------------------------------
class _Relus(nn.Module):
    """An in-place ReLU module used twice, F.relu inside forward, and torch.relu_."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.a(x))
        h = self.act(self.b(h) - 0.1)
        return self.c(torch.relu_(F.relu(h * 2 - 0.2)))


def _deconv_by_hand(net: _Relus, target: int) -> torch.Tensor:
    """relu(g) back through every ReLU whatever its input: c^T e_t, then relu twice, *2, relu, b^T, relu, a^T."""
    g = net.c.weight[target].detach()
    g = (g.clamp(min=0).clamp(min=0) * 2).clamp(min=0)
    return (g @ net.b.weight.detach()).clamp(min=0) @ net.a.weight.detach()


def test_deconvnet_is_worked_out_by_hand_and_ignores_the_forward_masks():
    net = _Relus()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    before = state(net)
    got = hookscope.attribute(net, x, method="deconvnet", target=1)
    assert unchanged(net, before) and got.method == "deconvnet" and got.settings is None
    assert torch.allclose(got.maps, _deconv_by_hand(net, 1).expand(5, -1), atol=1e-6)  # the same for every input


def test_deconvnet_on_two_layers_is_w1_transposed_relu_of_w2_transposed_onehot():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(2, 3)
    want = net[2].weight[0].detach().clamp(min=0) @ net[0].weight.detach()
    got = hookscope.attribute(net, x, method="deconvnet", target=0).maps
    assert torch.allclose(got, want.expand(2, -1), atol=1e-6)


@pytest.mark.parametrize("wrap", [lambda m: torch.compile(m, backend="eager"), nn.DataParallel],
                         ids=["compiled", "data_parallel"])
@pytest.mark.parametrize("method", ["deconvnet", "lrp"])
def test_wrappers_give_the_wrapped_models_maps(wrap, method):
    net = _Relus()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    want = hookscope.attribute(net, x, method=method, target=1).maps
    assert torch.equal(hookscope.attribute(wrap(net), x, method=method, target=1).maps, want) and no_hooks(net)


@pytest.mark.parametrize("method, extra", [("deconvnet", {}), ("lrp", {"composite": "epsilon_gamma_box"}),
                                           ("lrp", {"composite": "epsilon_plus", "canonize": False})])
def test_a_training_model_with_frozen_parameters_is_left_bit_identical(method, extra):
    torch.manual_seed(0)
    net = hookscope.zoo.TinyResNet().train()
    for p in net.stem.parameters():
        p.requires_grad_(False)
    net.fc.weight.grad = torch.full_like(net.fc.weight, 7.0)
    x = torch.rand(2, 3, 16, 16)
    before, kept = state(net), x.clone()
    res = hookscope.attribute(net, x, method=method, **extra)
    assert unchanged(net, before) and torch.equal(x, kept)
    evaluated = hookscope.attribute(copy.deepcopy(net).eval(), x, method=method, **extra)
    assert torch.equal(res.maps, evaluated.maps) and torch.isfinite(res.maps).all()


def test_hooks_go_when_the_forward_pass_fails():
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.bn = nn.Linear(3, 3), nn.BatchNorm1d(3)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls > 0:  # the pass under the rules, the only one
                raise ValueError("boom")
            return self.bn(F.relu(self.lin(x)))

    net = Fails().eval()
    with pytest.raises(hookscope.ForwardError):
        hookscope.attribute(net, torch.randn(2, 3), method="lrp", target=0)
    y = torch.relu(torch.ones(1, requires_grad=True))
    assert no_hooks(net) and type(y.grad_fn).__name__ == "ReluBackward0"  # no rule left on the functions


# --- one-line refusals --------------------------------------------------------------------------------------------
class _WithNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(3, 4, 3), nn.LayerNorm(4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.conv(x).mean((2, 3))))


BAD = [
    ({"method": "lrp", "composite": "epsilon_pluss"}, "composite='epsilon_pluss' is not an LRP composite. Did you mean 'epsilon_plus'"),
    ({"method": "lrp", "composite": {nn.Conv2d: "gama"}}, "'gama' is not an LRP rule. Did you mean 'gamma'"),
    ({"method": "lrp", "composite": {"norm": "gamma"}}, "rule 'gamma' on layer 'norm' (LayerNorm): it needs the weight"),
    ({"method": "lrp", "composite": {nn.LayerNorm: "epsilon"}}, "rule 'epsilon' on layer 'norm' (LayerNorm)"),
    ({"method": "lrp", "composite": {"fc": "zbox"}}, "rule 'zbox' on layer 'fc': it bounds the model's inputs"),
    ({"method": "lrp", "composite": {"fcc": "epsilon"}}, "names layer 'fcc', which the model does not have. Did you mean 'fc'"),
    ({"method": "lrp", "composite": {"fc": "alpha_beta:2:2"}}, "alpha - beta == 1"),
    ({"method": "lrp", "composite": {"fc": "epsilon:x"}}, "rule 'epsilon:x' has a part that is not a number"),
    ({"method": "lrp", "composite": {"fc": "zplus:1"}}, "rule 'zplus:1' has 1 numbers; 'zplus' takes none"),
    ({"method": "lrp", "composite": {"fc": 3}}, "an LRP rule is a name such as 'gamma:0.25' or an LRPRule, not a int"),
    ({"method": "lrp", "composite": {"norm": "pass", "conv": "zbox"}, "target": 0}, None),  # fine: a pass rule on a norm
    ({"method": "lrp", "composite": {"*": "zplus"}, "target": 0}, None),  # a glob: the layers with weights it matches
    ({"method": "saliency", "composite": "epsilon_plus"}, "composite= is not a setting of saliency (lrp reads it); drop it or use method=\"lrp\""),
    ({"method": "deconvnet", "canonize": False}, "canonize= is not a setting of deconvnet (lrp reads it)"),
    ({"method": "lrp", "bounds": 1.0}, "bounds=1.0 must be a pair (low, high)"),
    ({"method": "lrp", "composite": {"fc": "epsilon:nan"}}, "rule 'epsilon:nan' has a number that is not finite"),
    ({"method": "lrp", "composite": {"conv": "gamma:inf"}}, "rule 'gamma:inf' has a number that is not finite"),
    ({"method": "lrp", "composite": {"conv": "zbox"}, "bounds": (torch.zeros(5), 1.0)},
     "bounds of shape 5 do not broadcast to the inputs' 1x3x6x6"),
    ({"method": "lrp", "composite": {"conv": "zbox:-1:1", "fc": "epsilon:1e-6"}, "target": 0}, None),  # as documented
]


@pytest.mark.parametrize("given, said", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_are_refused_in_one_line_naming_the_fix(given, said):
    torch.manual_seed(0)
    net = _WithNorm()
    if said is None:
        assert hookscope.attribute(net, torch.rand(1, 3, 6, 6), **given).maps.shape == (1, 3, 6, 6)
        return
    with pytest.raises(HookscopeError) as err:
        hookscope.attribute(net, torch.rand(1, 3, 6, 6), **given)
    assert said in str(err.value) and "\n" not in str(err.value) and no_hooks(net)


def test_the_result_names_the_composite_and_speaks_the_protocol():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    res = hookscope.attribute(net, torch.rand(2, 3), method="lrp", composite={"0": "flat", nn.Linear: "gamma:0.5"})
    assert res.settings == {"composite": "0=flat, Linear=gamma:0.5", "canonize": True}
    assert str(res).splitlines()[0] == ("lrp (composite=0=flat, Linear=gamma:0.5, canonize=True) on the inputs: "
                                        "2 maps of 3, 1 forward pass")  # the target pinned on the pass under the rules
    assert '"composite": "0=flat, Linear=gamma:0.5"' in res.to_json()


def test_a_batch_norm_is_merged_only_into_a_layer_with_a_rule_and_only_without_a_rule_of_its_own():
    net, x = _conv_bn(0.0), _images(torch.float64, 12)
    passed = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", canonize=False, target=TARGET).maps
    # the first batch norm given 'pass' by name: as if not merged; the second stays merged
    mixed = hookscope.attribute(net, x, method="lrp", composite={"1": "pass", "4": "pass", nn.Conv2d: "zplus"},
                                target=TARGET).maps
    assert torch.allclose(mixed, passed, rtol=1e-10)
    # layers left to their gradient keep their batch norms unmerged, which pass relevance on
    res = hookscope.attribute(net, x, method="lrp", composite={"0": "gradient", "3": "gradient"}, target=TARGET)
    names = [("1", zr.Pass()), ("4", zr.Pass()), ("2", zr.Pass()), ("5", zr.Pass()), ("6", zr.Norm()),
             ("8", zr.Epsilon())]
    assert rel(res.maps, zennit_lrp(net, x, NameMapComposite([((n,), r) for n, r in names]))) <= 1e-10


def test_a_layer_called_twice_gets_its_rule_on_each_call():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(3)
            self.lin, self.head = nn.Linear(5, 5, bias=False), nn.Linear(5, 2, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(F.relu(self.lin(F.relu(self.lin(x)))))

    net = Shared().double()
    x = torch.rand(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    res = hookscope.attribute(net, x, method="lrp", composite={nn.Linear: "epsilon:0"}, target=1)
    # LRP-0 on a bias-free ReLU net is gradient x input, whichever call of the layer relevance passes through
    assert rel(res.maps, hookscope.attribute(net, x, method="input_x_gradient", target=1).maps) <= 1e-10
    zplus = hookscope.attribute(net, x, method="lrp", composite={nn.Linear: "zplus"}, target=1)
    assert torch.allclose(zplus.maps.sum(1), zplus.scores, rtol=1e-4) and no_hooks(net)


@pytest.mark.parametrize("method", ["deconvnet", "guided_backprop", "lrp"])
def test_a_target_function_keeps_its_own_gradient(method):
    net = _Relus()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    # the ReLU is the target's, not the model's: below zero it passes nothing back, under any rule
    score = hookscope.attribute(net, x, method=method, target=lambda out: torch.relu(out[:, 0] - 1e3) + out[:, 1])
    assert torch.allclose(score.maps, hookscope.attribute(net, x, method=method, target=1).maps, atol=1e-6)


# --- one forward pass: the target, the batch norms to merge and the first layer read from it ------------------
class _Counted(nn.Module):
    """TinyResNet, counting its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = hookscope.zoo.TinyResNet(), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


@pytest.mark.parametrize("method", ["lrp", "guided_backprop", "deconvnet"])
def test_one_forward_pass_pins_each_samples_predicted_class_and_its_score_as_the_model_computes_them(method):
    net = _Counted().eval()
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = net(x)
    net.calls = 0
    res = hookscope.attribute(net, x, method=method)
    assert net.calls == 1 and res.forwards == 1
    assert torch.equal(res.target, out.argmax(1))  # the model's own values, batch norms merged or not
    assert torch.equal(res.scores, out.gather(1, out.argmax(1)[:, None])[:, 0])
    assert torch.equal(res.maps, hookscope.attribute(net, x, method=method, target=out.argmax(1)).maps)


def test_a_batch_norm_after_an_in_place_activation_is_not_merged_into_the_layer_before_it():
    # the conv's output is rewritten in place by the ReLU before the batch norm reads it: as in zennit's
    # SequentialMergeBatchNorm, which merges only a batch norm right after the layer, nothing is merged
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(inplace=True), nn.BatchNorm2d(6), nn.Conv2d(6, 4, 3),
                        nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
    net = _randomise_batch_norms(net, 0.0).double().eval()
    x = _images(torch.float64, 10)
    ours = hookscope.attribute(net, x, method="lrp", composite="epsilon_plus", target=TARGET).maps
    assert rel(ours, zennit_lrp(net, x, EpsilonPlus(canonizers=[SequentialMergeBatchNorm()]))) <= 1e-10
    merged_both = nn.Sequential(*[net[i] for i in (0, 2, 1, 3, 4, 5, 6, 7, 8)])  # the batch norm first: merged
    assert rel(ours, zennit_lrp(merged_both, x, EpsilonPlus(canonizers=[SequentialMergeBatchNorm()]))) > 1e-3


class _Backwards(nn.Module):
    """Layers defined in the opposite order to the one they run in."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.conv = nn.Linear(4 * 4 * 4, 3), nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.conv(x)).flatten(1))


def test_zbox_goes_on_the_layer_that_runs_first_whatever_the_order_of_definition():
    net, x = _Backwards().double(), _images(torch.float64, 6)
    ours = hookscope.attribute(net, x, method="lrp", composite={"conv": "zbox"}, bounds=(0.0, 1.0), target=1)
    zbox = zr.ZBox(low=torch.zeros_like(x), high=torch.ones_like(x))
    assert rel(ours.maps, zennit_lrp(net, x, NameMapComposite([(("conv",), zbox), (("fc",), zr.Epsilon())]),
                                     target=1)) <= 1e-10
    with pytest.raises(HookscopeError, match="rule 'zbox' on layer 'fc'.*first layer \\('conv'\\)") as err:
        hookscope.attribute(net, x, method="lrp", composite={"fc": "zbox"}, target=1)
    assert "\n" not in str(err.value) and no_hooks(net)


class _WritesAfterRelu(nn.Module):
    """A ReLU's output doubled in place afterwards (PyTorch's own ReLU backward refuses this too)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h.mul_(2)
        return self.b(h)


def test_guided_backprop_refuses_a_relu_output_written_in_place_later():
    net, x = _WritesAfterRelu(), torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError):  # the model's own backward
        torch.autograd.grad(net(x.requires_grad_())[:, 0].sum(), x)
    with pytest.raises(hookscope.HookscopeError, match="wrote into a ReLU's output after the ReLU") as e:
        hookscope.attribute(net, x.detach(), method="guided_backprop", target=0)
    assert "\n" not in str(e.value) and no_hooks(net)
    # DeconvNet reads no mask: b^T e_0 doubled, relu'd, then a^T
    res = hookscope.attribute(net, x.detach(), method="deconvnet", target=0)
    by_hand = (2 * net.b.weight[0]).clamp(min=0) @ net.a.weight
    assert torch.allclose(res.maps, by_hand.expand(2, 4), atol=1e-6)


def test_an_in_place_relu_on_a_relus_output_changes_nothing_under_any_rule():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor, again: bool = True) -> torch.Tensor:
            h = F.relu(self.a(x))
            return self.b(torch.relu_(h) if again else h)

    net, x = Twice(), torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    for method in ("guided_backprop", "deconvnet", "lrp"):
        twice = hookscope.attribute(net, x, method=method, target=1)
        once = hookscope.attribute(net, x, method=method, target=1, kwargs={"again": False})
        assert torch.equal(twice.maps, once.maps), method


@pytest.mark.parametrize("spec, rule", [("zbox:-1:1", LRPRule("zbox", low=-1.0, high=1.0)),
                                        ("epsilon:1e-6", LRPRule("epsilon", epsilon=1e-6)),
                                        ("Alpha-Beta:2:1", LRPRule("alpha_beta", alpha=2.0, beta=1.0)),
                                        ("gamma:.5", LRPRule("gamma", gamma=0.5))])
def test_a_rule_string_reads_negative_numbers_and_exponents(spec, rule):
    from hookscope.analysis.attribution._lrp_rules import parse_rule  # its '-' was read as the name's '_'

    assert parse_rule(spec) == rule
    net, x = _WithNorm(), torch.rand(2, 3, 6, 6)
    layer = "conv" if rule.name == "zbox" else "fc"
    by_string = hookscope.attribute(net, x, method="lrp", composite={layer: spec}, target=1)
    assert torch.equal(by_string.maps, hookscope.attribute(net, x, method="lrp", composite={layer: rule}, target=1).maps)
