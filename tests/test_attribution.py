"""hookscope.attribute: every method against captum's for the same settings, integrated gradients'
completeness, the model left as it was, wrappers, dtypes and one-line refusals."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import hookscope
import hookscope.zoo
from hookscope.analysis.attribution import METHODS, settings_of
from hookscope.targets import Class

from helpers import no_hooks, one_thread_only, rel



def few(method: str, **settings: object) -> dict[str, object]:
    """Fast settings for the methods that read them: each method is given only its own."""
    return {k: v for k, v in {"steps": 2, "samples": 2, **settings}.items() if k in settings_of(method)}


captum_attr = pytest.importorskip("captum.attr")
torchvision = pytest.importorskip("torchvision")

TARGETS = [3, 7]


one_thread = pytest.fixture(autouse=True, scope="module")(one_thread_only)


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    lo, hi = x.flatten(1).amin(1).view(-1, 1, 1, 1), x.flatten(1).amax(1).view(-1, 1, 1, 1)
    return (x - lo) / (hi - lo)  # every image spans exactly [0, 1]: the noise's spread is `noise` for each


# --- against captum -------------------------------------------------------------------------------
SIMPLE = [("saliency", lambda m: captum_attr.Saliency(m), {"abs": True}),
          ("gradient", lambda m: captum_attr.Saliency(m), {"abs": False}),
          ("input_x_gradient", lambda m: captum_attr.InputXGradient(m), {})]


@pytest.mark.parametrize("method, make, extra", SIMPLE, ids=[m for m, _, _ in SIMPLE])
def test_gradient_methods_equal_captum(resnet, images, method, make, extra):
    ours = hookscope.attribute(resnet, images, method=method, target=TARGETS)
    theirs = make(resnet).attribute(images.clone().requires_grad_(), target=TARGETS, **extra).detach()
    assert ours.maps.shape == images.shape and rel(ours.maps, theirs) <= 1e-5
    assert ours.target.tolist() == TARGETS and ours.delta is None
    assert no_hooks(resnet)


RULES = ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]


@pytest.mark.parametrize("model, rule", [(m, r) for m in ("resnet", "smooth") for r in RULES])
def test_integrated_gradients_equal_captum(resnet, images, model, rule):
    net, x = (resnet, images) if model == "resnet" else (_smooth(), torch.rand(2, 6))
    steps, baseline = 4, torch.full_like(x, 0.25)
    ours = hookscope.attribute(net, x, method="integrated_gradients", target=TARGETS, baseline=baseline,
                               steps=steps, rule=rule, batch_size=3)
    ig = captum_attr.IntegratedGradients(net)
    theirs, delta = ig.attribute(x, baselines=baseline, target=TARGETS, n_steps=steps, method=rule,
                                 return_convergence_delta=True, internal_batch_size=3)
    if rule == "riemann_trapezoid":
        # captum weighs its n points 1/n (ends 1/2n): they sum to (n-1)/n; ours are 1/(n-1) apart and sum to 1
        theirs = theirs * steps / (steps - 1)
    else:  # captum's delta is sum(attr) - (f(x) - f(x0)); ours is the gap the other way round
        assert torch.allclose(ours.delta, -delta.float(), atol=1e-4 * float(theirs.abs().sum()))
    assert rel(ours.maps, theirs) <= 1e-5
    assert no_hooks(net)


@pytest.mark.parametrize("model, method", [(m, t) for m in ("resnet", "tiny") for t in ("smoothgrad", "smoothgrad_sq",
                                                                                       "vargrad")])
def test_noise_tunnel_equals_captum_with_the_same_draws(resnet, images, model, method):
    net, x = (resnet, images) if model == "resnet" else (_tiny(), images[:, :, :16, :16])
    x = (x - x.flatten(1).amin(1).view(-1, 1, 1, 1)) / (x.flatten(1).amax(1) - x.flatten(1).amin(1)).view(-1, 1, 1, 1)
    ours = hookscope.attribute(net, x, method=method, target=TARGETS, samples=3, noise=0.2, seed=5)
    torch.manual_seed(5)  # captum draws from the global generator; ours from a generator seeded alike
    nt = captum_attr.NoiseTunnel(captum_attr.Saliency(net))
    theirs = nt.attribute(x, nt_type=method, nt_samples=3, stdevs=0.2, target=TARGETS, abs=False)
    assert rel(ours.maps, theirs) <= 1e-5
    assert ours.settings == {"samples": 3, "noise": 0.2, "seed": 5}


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return hookscope.zoo.TinyResNet().eval()


# --- a Hugging Face model, at its token embedding --------------------------------------------------
@pytest.fixture(scope="module")
def bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return ids, mask


def test_layer_integrated_gradients_equal_captum_on_bert(bert):
    ids, mask = _tokens()
    ours = hookscope.attribute(bert, ids, method="integrated_gradients", layers="bert.embeddings", target=[0, 2],
                               kwargs={"attention_mask": mask}, steps=8, rule="gausslegendre")
    lig = captum_attr.LayerIntegratedGradients(lambda i, m: bert(i, attention_mask=m).logits, bert.bert.embeddings)
    theirs, delta = lig.attribute(ids, baselines=torch.zeros_like(ids), target=[0, 2], additional_forward_args=(mask,),
                                  n_steps=8, method="gausslegendre", return_convergence_delta=True)
    assert ours.maps.shape == (2, 7, 16) and ours.layer == "bert.embeddings"
    assert rel(ours.maps, theirs) <= 1e-5
    assert torch.allclose(ours.delta, -delta, atol=1e-5)
    assert no_hooks(bert)


def test_layer_gradient_x_activation_equals_captum_on_bert(bert):
    ids, mask = _tokens()
    ours = hookscope.attribute(bert, ids, method="input_x_gradient", layers="bert.embeddings", target=Class([1, 2]),
                               kwargs={"attention_mask": mask})
    layer = captum_attr.LayerGradientXActivation(lambda i, m: bert(i, attention_mask=m).logits, bert.bert.embeddings)
    theirs = layer.attribute(ids, target=[1, 2], additional_forward_args=(mask,))
    assert rel(ours.maps, theirs) <= 1e-5
    assert no_hooks(bert)


def test_token_ids_without_a_layer_are_refused_with_the_fix(bert):
    with pytest.raises(hookscope.HookscopeError, match="layers=") as e:
        hookscope.attribute(bert, _tokens()[0])
    assert "\n" not in str(e.value)


# --- integrated gradients: completeness --------------------------------------------------------------
def _smooth() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8)).eval()


@pytest.mark.parametrize("rule", ["riemann_trapezoid", "gausslegendre", "riemann_middle"])
def test_the_attributions_sum_to_the_change_of_the_score_up_to_delta(rule):
    net, x = _smooth(), torch.randn(3, 6, generator=torch.Generator().manual_seed(4))
    res = hookscope.attribute(net, x, method="integrated_gradients", target=2, baseline=0.5, steps=10, rule=rule)
    change = net(x)[:, 2] - net(torch.full_like(x, 0.5))[:, 2]
    assert torch.allclose(res.maps.sum(1) + res.delta, change.detach(), atol=1e-6)
    assert torch.allclose(res.scores, net(x)[:, 2].detach())


def test_gauss_legendre_makes_delta_small():
    net, x = _smooth(), torch.randn(3, 6, generator=torch.Generator().manual_seed(4))
    res = hookscope.attribute(net, x, method="integrated_gradients", target=1, steps=16, rule="gausslegendre")
    change = (net(x)[:, 1] - net(torch.zeros_like(x))[:, 1]).detach()
    assert float(res.delta.abs().max()) < 1e-5 * max(1.0, float(change.abs().max()))


def test_a_memory_budget_cuts_the_passes_and_changes_nothing(images):
    resnet, images = _tiny(), images[:, :, :16, :16]
    whole = hookscope.attribute(resnet, images, method="integrated_gradients", target=TARGETS, steps=4)
    with pytest.raises(hookscope.HookscopeError, match="memory >= ") as e:
        hookscope.attribute(resnet, images, method="integrated_gradients", target=TARGETS, steps=4, memory=1000)
    row = int(str(e.value).split("memory >= ")[1].split(",")[0])
    assert row > 16 * 16 * 3 * 4  # more than the row itself: what autograd keeps for it
    cut = hookscope.attribute(resnet, images, method="integrated_gradients", target=TARGETS, steps=4,
                              memory=3 * row)
    assert (whole.forwards, cut.forwards) == (1 + 1, 1 + 2)  # the first pass (alpha 1), then 6 rows: 6, or 3 and 3
    assert rel(cut.maps, whole.maps) <= 1e-5


# --- the model is left as it was ------------------------------------------------------------------
def _state(model: nn.Module) -> dict[str, object]:
    return {"flags": [m.training for m in model.modules()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "buffers": {k: v.clone() for k, v in model.state_dict().items()}}


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    grads = all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
                for x, y in zip(a["grads"], b["grads"]))
    buffers = all(torch.equal(a["buffers"][k], b["buffers"][k]) for k in a["buffers"])
    return a["flags"] == b["flags"] and a["requires_grad"] == b["requires_grad"] and grads and buffers


@pytest.fixture
def frozen_in_training() -> nn.Module:
    torch.manual_seed(0)
    net = hookscope.zoo.TinyResNet().train()
    for p in net.stem.parameters():
        p.requires_grad_(False)
    net.fc.weight.grad = torch.full_like(net.fc.weight, 7.0)  # a gradient of the caller's own
    return net


@pytest.mark.parametrize("method", list(METHODS))
def test_the_model_is_left_exactly_as_it_was(frozen_in_training, method):
    net, x = frozen_in_training, torch.rand(2, 3, 16, 16)
    before, kept = _state(net), x.clone()
    res = hookscope.attribute(net, x, method=method, **few(method, steps=3))
    assert _same(before, _state(net)) and torch.equal(x, kept) and no_hooks(net)
    evaluated = hookscope.attribute(copy.deepcopy(net).eval(), x, method=method, **few(method, steps=3))
    assert torch.allclose(res.maps, evaluated.maps)  # batch norm read its running statistics, as in eval


def test_a_layer_method_leaves_no_hook_and_the_flags(frozen_in_training):
    net = frozen_in_training
    before = _state(net)
    hookscope.attribute(net, torch.rand(2, 3, 16, 16), method="integrated_gradients", layers="layer1", steps=3)
    assert _same(before, _state(net)) and no_hooks(net)


def test_a_model_writing_into_its_input_changes_neither_the_caller_nor_the_maps():
    class Halves(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul_(0.5).sum(1, keepdim=True) * torch.tensor([[1.0, 2.0]])

    x = torch.ones(2, 3)
    res = hookscope.attribute(Halves(), x, method="input_x_gradient", target=1)
    assert torch.equal(x, torch.ones(2, 3)) and torch.allclose(res.maps, torch.full((2, 3), 1.0))


# --- wrappers, dtypes, targets ----------------------------------------------------------------------
def test_data_parallel_gives_the_wrapped_models_attributions():
    net, x = _smooth(), torch.randn(2, 6)
    plain = hookscope.attribute(net, x, method="integrated_gradients", steps=4)
    wrapped = hookscope.attribute(nn.DataParallel(net), x, method="integrated_gradients", steps=4)
    assert torch.allclose(plain.maps, wrapped.maps) and no_hooks(net)
    at_layer = hookscope.attribute(nn.DataParallel(net), x, method="input_x_gradient", layers="1")
    assert at_layer.layer == "1" and no_hooks(net)


def test_a_compiled_model_gives_the_same_attributions():
    net, x = _smooth(), torch.randn(2, 6)
    compiled = torch.compile(net, backend="eager")
    for layers in (None, "1"):
        plain = hookscope.attribute(net, x, method="integrated_gradients", steps=4, layers=layers)
        other = hookscope.attribute(compiled, x, method="integrated_gradients", steps=4, layers=layers)
        assert torch.allclose(plain.maps, other.maps, atol=1e-6)
    assert no_hooks(net)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_inputs_of_any_float_dtype(dtype):
    net, x = _smooth(), torch.randn(2, 6)
    reference = hookscope.attribute(net, x, method="integrated_gradients", steps=4)
    res = hookscope.attribute(net.to(dtype), x.to(dtype), method="integrated_gradients", steps=4)
    assert res.maps.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert res.maps.isfinite().all() and res.target.tolist() == reference.target.tolist()
    if dtype == torch.float64:
        assert torch.allclose(res.maps.float(), reference.maps, atol=1e-6)


def test_a_target_function_and_the_predicted_class():
    net, x = _smooth(), torch.randn(2, 6)
    predicted = net(x).argmax(1)
    by_default = hookscope.attribute(net, x, method="gradient")
    assert by_default.target.tolist() == predicted.tolist()
    given = hookscope.attribute(net, x, method="gradient", target=lambda out: out[torch.arange(2), predicted])
    assert given.target is None and torch.allclose(given.maps, by_default.maps)


def test_the_result_speaks_the_protocol(images):
    res = hookscope.attribute(_tiny(), images, method="integrated_gradients", target=TARGETS, steps=2)
    text = res.table()
    assert str(res) == text and "integrated_gradients" in text and "delta" in text
    assert '"shape": [2, 3, 64, 64]' in res.to_json() and res.to_dict()["delta"] is res.delta


# --- refusals: one line, the model untouched ----------------------------------------------------------
BAD = [
    ({"target": 1000}, "out of range"),
    ({"method": "integrated_gradients", "baseline": torch.zeros(2, 3, 8, 8)}, "baseline of shape"),
    ({"method": "integrated_gradients", "memory": 10}, "memory=10"),
    ({"method": "saliency", "memory": 10**9}, "memory= is not a setting of saliency"),  # nothing to cut
    ({"method": "lrp", "memory": 10**9}, "memory= is not a setting of lrp"),
    ({"method": "smoothgrad", "layers": "layer1"}, "noise"),
    ({"method": "smoothgrad", "noise": float("inf")}, "noise=inf must be a finite number >= 0"),
    ({"method": "vargrad", "noise": float("nan")}, "noise=nan must be a finite number >= 0"),
    ({"method": "integrated_gradient"}, "Did you mean"),
    ({"method": "integrated_gradients", "rule": "simpson"}, "rule="),
    ({"layers": "layer9"}, "layer9"),
    ({"layers": "layer*"}, "takes one"),
]


@pytest.mark.parametrize("given, said", BAD, ids=[s for _, s in BAD])
def test_bad_requests_are_refused_in_one_line(frozen_in_training, given, said):
    net = frozen_in_training
    before = _state(net)
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(net, torch.rand(2, 3, 16, 16), **given)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert _same(before, _state(net)) and no_hooks(net)


def test_a_batch_norm_without_running_statistics_is_refused_unless_rows_cannot_mix():
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, track_running_stats=False), nn.Linear(3, 2))
    with pytest.raises(hookscope.HookscopeError, match="BatchNorm1d '1'.*pass one input"):
        hookscope.attribute(net, torch.rand(2, 4))
    with pytest.raises(hookscope.HookscopeError, match="batch_size=1"):
        hookscope.attribute(net, torch.rand(1, 4), method="integrated_gradients", steps=3)
    one = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))  # normalises each row: allowed
    assert hookscope.attribute(one, torch.rand(2, 4), method="integrated_gradients", steps=3).maps.shape == (2, 4)


@pytest.mark.parametrize("outer", [torch.no_grad, torch.inference_mode])
def test_it_works_under_no_grad_and_inference_mode(outer):
    net = _smooth()
    with outer():
        x = torch.randn(2, 6)
        res = hookscope.attribute(net, x, method="integrated_gradients", steps=3)
        noisy = hookscope.attribute(net, x, method="vargrad", samples=3)
    assert res.maps.shape == noisy.maps.shape == (2, 6) and no_hooks(net)


# --- targets of hookscope.targets -----------------------------------------------------------------------
def test_a_similarity_target_equals_captum_on_the_cosine():
    torch.manual_seed(6)
    net, x, ref = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4)).eval(), torch.randn(2, 6), torch.randn(4)
    ours = hookscope.attribute(net, x, method="integrated_gradients", target=hookscope.targets.Similarity(ref), steps=6)
    cosine = lambda v: nn.functional.cosine_similarity(net(v), ref[None], dim=1)  # noqa: E731
    theirs = captum_attr.IntegratedGradients(cosine).attribute(x, n_steps=6, method="riemann_trapezoid") * 6 / 5
    assert ours.target is None and rel(ours.maps, theirs) <= 1e-5


def test_a_region_predicted_on_the_inputs_stays_for_every_scaled_copy():
    torch.manual_seed(7)
    net, x = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.Tanh(), nn.Conv2d(3, 2, 1)).eval(), torch.randn(1, 1, 5, 5)
    region = net(x).argmax(1) == 1  # where class 1 is predicted on the inputs themselves
    ours = hookscope.attribute(net, x, method="integrated_gradients", target=hookscope.targets.Segmentation(1),
                               steps=5, rule="gausslegendre")
    summed = lambda v: (net(v)[:, 1] * region).flatten(1).sum(1)  # noqa: E731
    theirs = captum_attr.IntegratedGradients(summed).attribute(x, n_steps=5, method="gausslegendre")
    assert rel(ours.maps, theirs) <= 1e-5


def test_a_language_model_needs_a_target_function_and_says_so():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)
    torch.manual_seed(0)
    gpt2, ids = transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 40, (2, 5))
    with pytest.raises(hookscope.HookscopeError, match=r"got 2x5x40; pass target= a function"):
        hookscope.attribute(gpt2, ids, layers="transformer.wte")
    res = hookscope.attribute(gpt2, ids, method="integrated_gradients", layers="transformer.wte", steps=12,
                              rule="gausslegendre", target=lambda out: out.logits[:, -1, 7])
    assert res.maps.shape == (2, 5, 16) and float(res.delta.abs().max()) < 1e-4 and no_hooks(gpt2)


# --- guided backpropagation: the ReLU rule put on operations, wherever the ReLU is ------------------
@pytest.mark.parametrize("native", ["1", "0"], ids=["one-pass-kernel", "torch-ops"])
def test_guided_backprop_equals_captum(resnet, images, native, monkeypatch):
    monkeypatch.setenv("HOOKSCOPE_NATIVE", native)  # the CPU kernel and the torch fallback give the same maps
    ours = hookscope.attribute(resnet, images, method="guided_backprop", target=TARGETS)
    theirs = captum_attr.GuidedBackprop(resnet).attribute(images.clone(), target=TARGETS).detach()
    assert rel(ours.maps, theirs) <= 1e-5 and no_hooks(resnet)
    assert not [m for m in resnet.modules() if "forward" in vars(m)]


def test_deconvnet_equals_captum(resnet, images):
    ours = hookscope.attribute(resnet, images, method="deconvnet", target=TARGETS)
    theirs = captum_attr.Deconvolution(resnet).attribute(images.clone(), target=TARGETS).detach()
    assert rel(ours.maps, theirs) <= 1e-5 and no_hooks(resnet)


class _Relus(nn.Module):
    """ReLUs captum's module hooks miss or get wrong: one in-place module used twice, and F.relu."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.a(x))
        h = self.act(self.b(h) - 0.1)
        return self.c(nn.functional.relu(h * 2 - 0.2))


def _guided_by_hand(net: _Relus, x: torch.Tensor, target: int) -> torch.Tensor:
    """The rule worked out with explicit masks: back through each ReLU only relu(g) where x > 0."""
    z1 = net.a(x)
    h1 = z1.relu()
    z2 = net.b(h1) - 0.1
    h2 = z2.relu()
    z3 = h2 * 2 - 0.2
    g = net.c.weight[target].detach().expand(x.shape[0], -1)
    g = g.clamp(min=0) * (z3 > 0)
    g = (g * 2).clamp(min=0) * (z2 > 0)
    g = (g @ net.b.weight.detach()).clamp(min=0) * (z1 > 0)
    return g @ net.a.weight.detach()


def test_guided_backprop_reaches_an_in_place_relu_used_twice_and_f_relu():
    net = _Relus()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = _guided_by_hand(net, x, 1)
    got = hookscope.attribute(net, x, method="guided_backprop", target=1)
    assert torch.allclose(got.maps, want, atol=1e-6)
    plain = hookscope.attribute(net, x, method="gradient", target=1)
    assert not torch.allclose(plain.maps, want, atol=1e-4)  # the rule changed something
    assert not [m for m in net.modules() if "forward" in vars(m)] and no_hooks(net)


@pytest.mark.parametrize("wrap", [lambda m: torch.compile(m, backend="eager"), nn.DataParallel],
                         ids=["compiled", "data_parallel"])
def test_guided_backprop_through_wrappers_runs_the_model_inside(wrap):
    net = _Relus()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    want = hookscope.attribute(net, x, method="guided_backprop", target=1).maps
    assert torch.equal(hookscope.attribute(wrap(net), x, method="guided_backprop", target=1).maps, want)


# --- what the rules and settings cannot do, refused in one line ------------------------------------------
class _ClampAsRelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=0)


@pytest.mark.parametrize("act", [nn.ReLU6(), nn.LeakyReLU(0.1), nn.Hardtanh(0.0, 1.0), nn.GELU(), _ClampAsRelu()],
                         ids=["relu6", "leaky_relu", "hardtanh", "gelu", "clamp"])
@pytest.mark.parametrize("method", ["guided_backprop", "deconvnet"])
def test_a_model_with_no_relu_is_refused_by_the_relu_rules_instead_of_giving_the_plain_gradient(act, method):
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(4, 5), act, nn.Linear(5, 3)).eval(), torch.randn(3, 4)
    with pytest.raises(hookscope.HookscopeError, match="no ReLU ran") as e:
        hookscope.attribute(net, x, method=method, target=0)
    assert "\n" not in str(e.value) and no_hooks(net)
    assert not torch.overrides._get_current_function_mode_stack()
    # with one ReLU the others pass the ordinary gradient: the rule is on the ReLU alone (by hand)
    a, b, c = net[0], net[2], nn.Linear(3, 2)
    mixed = nn.Sequential(a, nn.ReLU(), b, act, c).eval()
    h = a(x)
    z = b(h.relu())
    g = torch.autograd.grad(c(act(z))[:, 0].sum(), z)[0]  # through `act` as autograd takes it
    g = (g @ b.weight).clamp(min=0) * ((h > 0) if method == "guided_backprop" else 1)
    res = hookscope.attribute(mixed, x, method=method, target=0)
    assert torch.allclose(res.maps, (g @ a.weight).detach(), atol=1e-6)


def test_an_in_place_write_autograd_cannot_undo_is_one_line_naming_the_fix():
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(self.a(x))
            h += 1  # sigmoid's backward reads its output
            return self.b(h)

    net, x = Writes().eval(), torch.randn(2, 4)
    for method in ("saliency", "integrated_gradients", "smoothgrad"):
        with pytest.raises(hookscope.HookscopeError, match="out of place") as e:
            hookscope.attribute(net, x, method=method, target=0, **few(method, steps=3))
        assert "\n" not in str(e.value) and "Sigmoid" in str(e.value) and no_hooks(net)


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "smoothgrad", "guided_backprop", "lrp"])
def test_a_baseline_for_a_method_that_has_none_is_refused(method):
    with pytest.raises(hookscope.HookscopeError, match="baseline= is not a setting of .* \\(integrated_gradients, occlusion, .* read it\\)"):
        hookscope.attribute(_smooth(), torch.randn(2, 6), method=method, baseline=torch.ones(2, 6))


@pytest.mark.parametrize("baseline", [float("nan"), float("inf"), torch.full((6,), float("nan"))],
                         ids=["nan", "inf", "nan_tensor"])
def test_a_baseline_that_is_not_finite_is_refused(baseline):
    with pytest.raises(hookscope.HookscopeError, match="not finite"):
        hookscope.attribute(_smooth(), torch.randn(2, 6), method="integrated_gradients", baseline=baseline)


def test_parameters_made_under_inference_mode_are_refused_naming_the_fix():
    with torch.inference_mode():
        net = _smooth()
    for method in ("saliency", "guided_backprop", "lrp"):
        with pytest.raises(hookscope.HookscopeError, match="'0.weight'.*inference_mode") as e:
            hookscope.attribute(net, torch.randn(2, 6), method=method)
        assert "\n" not in str(e.value) and no_hooks(net)


# --- threads: one model, two calls at once ----------------------------------------------------------------
class _Gate(nn.Module):
    """Holds the ``at``-th forward pass of the thread ``holder`` until ``go`` is set (``reached``: it is held)."""

    def __init__(self) -> None:
        super().__init__()
        self.holder: threading.Thread | None = None
        self.at = 1
        self.reached, self.go = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread() is self.holder and self.at > 1:
            self.at -= 1
        elif threading.current_thread() is self.holder:
            self.holder = None
            self.reached.set()
            assert self.go.wait(10)
        return x


HELD = [({"method": "lrp"}, 1), ({"method": "input_x_gradient", "layers": "2"}, 1),
        ({"method": "guided_gradcam"}, 2)]  # its second pass finds the last convolution by hooks


@pytest.mark.parametrize("held, at", HELD, ids=["lrp", "at_a_layer", "guided_gradcam"])
def test_a_call_held_in_another_thread_changes_neither_this_calls_maps_nor_its_own(held, at):
    torch.manual_seed(0)
    gate = _Gate()
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), gate,
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    asked = [{"method": "saliency"}, {"method": "lrp"}, {"method": "input_x_gradient", "layers": "2"}]
    alone = [hookscope.attribute(net, x, target=1, **a).maps for a in asked + [held]]
    got: list[torch.Tensor] = []
    other = threading.Thread(target=lambda: got.append(hookscope.attribute(net, x, target=1, **held).maps))
    gate.holder, gate.at = other, at
    other.start()
    try:
        assert gate.reached.wait(10)  # the other call is inside its forward pass, its hooks on the model
        for a, want in zip(asked, alone):
            assert torch.equal(hookscope.attribute(net, x, target=1, **a).maps, want), a
    finally:
        gate.go.set()
        other.join(10)
    assert len(got) == 1 and torch.equal(got[0], alone[-1]) and no_hooks(net)


# --- empty tensors ---------------------------------------------------------------------------------------
def test_guided_backprop_through_a_relu_of_no_elements_gives_no_elements():
    from hookscope.analysis.attribution._activations import guided_back  # the native kernel divided by zero here

    for shape in [(0, 4), (2, 0, 3)]:
        assert guided_back(torch.ones(shape), torch.ones(shape)).shape == shape

    class Empty(nn.Module):  # a ReLU on an empty slice, as a detector's head with no box would run it
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            return self.b(h) + torch.relu(h[:, :0]).sum(1, keepdim=True)

    net, x = Empty().eval(), torch.randn(2, 4)
    with torch.no_grad():
        h = net.a(x)
    want = (net.b.weight[1].detach().clamp(min=0) * (h > 0)) @ net.a.weight.detach()
    assert torch.allclose(hookscope.attribute(net, x, method="guided_backprop", target=1).maps, want, atol=1e-6)


@pytest.mark.parametrize("method", list(METHODS))
def test_an_empty_batch_is_refused_in_one_line(method):
    net = _tiny()
    with pytest.raises(hookscope.HookscopeError, match="no sample") as e:
        hookscope.attribute(net, torch.rand(0, 3, 16, 16), method=method)
    assert "\n" not in str(e.value) and no_hooks(net)


class _Counts(nn.Module):
    """A forward that writes into a buffer of its own in every mode (a call counter, a running maximum)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 3)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("peak", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        self.calls += 1
        torch.maximum(self.peak, h.detach().amax(0), out=self.peak)
        return self.b(torch.relu(h))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("method", [m for m in METHODS if m != "guided_gradcam"])  # that one needs a convolution
def test_buffers_a_forward_writes_in_any_mode_are_put_back(train, method):
    net = _Counts().train(train)
    net.peak.fill_(-1.0)
    hookscope.attribute(net, torch.randn(3, 4), method=method, target=1, **few(method, steps=3))
    assert float(net.calls) == 0.0 and torch.equal(net.peak, torch.full((5,), -1.0)) and net.training == train


@pytest.mark.parametrize("baseline", [0.5, 2.7, torch.tensor([1.5, 2.0, 3.0])], ids=["half", "number", "tensor"])
def test_a_fractional_baseline_for_token_ids_is_refused_not_rounded(baseline):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2)).eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(hookscope.HookscopeError, match="not token ids") as e:
        hookscope.attribute(net, ids, method="integrated_gradients", layers="0", baseline=baseline, target=0)
    assert "\n" not in str(e.value) and no_hooks(net)
    whole = hookscope.attribute(net, ids, method="integrated_gradients", layers="0", baseline=2.0, target=0, steps=4)
    by_id = hookscope.attribute(net, ids, method="integrated_gradients", layers="0", baseline=2, target=0, steps=4)
    assert torch.equal(whole.maps, by_id.maps)  # a whole number is an id


# --- inputs that are not numbers ----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("method", METHODS)
def test_a_non_finite_input_is_refused_in_one_line_by_every_method(method, bad):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    x = torch.randn(2, 3, 8, 8)
    x[1, 2, 3, 4] = bad
    kept = x.clone()
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(net, x, method=method, **few(method))
    said = str(e.value)
    assert f"inputs hold {bad}" in said and "sample 1" in said and "(1, 2, 3, 4)" in said and "nan_to_num" in said
    assert "\n" not in said and no_hooks(net) and torch.equal(x.nan_to_num(), kept.nan_to_num())
    x[1, 2, 3, 4] = 0.0  # the fix the message names: the same call then runs
    assert hookscope.attribute(net, x, method=method, **few(method)).maps.isfinite().all()


# --- methods that give maps at the inputs only say why ----------------------------------------------------
WHY = {"smoothgrad": "adds noise to the inputs", "smoothgrad_sq": "adds noise to the inputs",
       "vargrad": "adds noise to the inputs", "guided_backprop": "changes the backward pass of every ReLU",
       "deconvnet": "changes the backward pass of every ReLU", "lrp": "hands relevance back layer by layer"}


@pytest.mark.parametrize("method", sorted(WHY))
def test_a_method_of_the_inputs_only_says_why_it_takes_no_layer(method):
    from hookscope.analysis.attribution import LAYER_METHODS

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(net, x, method=method, layers="0")
    said = str(e.value)
    assert WHY[method] in said and "\n" not in said and no_hooks(net)
    assert ("noise" in said) == method.endswith(("grad", "grad_sq")) and "guided_gradcam" in said
    for other in LAYER_METHODS:  # every method the message offers takes layers=
        assert other in said
        if other == "feature_permutation":  # shuffles across the batch: one sample has nothing to shuffle with
            continue
        assert hookscope.attribute(net, x, method=other, layers="0", **few(other)).maps.shape[0] == 1
    assert hookscope.attribute(net, x, method=method, **few(method)).maps.shape == x.shape  # without layers= it runs


def test_a_tied_layer_that_never_runs_names_the_layers_using_its_weights():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)).eval()
    ids, kw = torch.tensor([[3, 4, 5]]), {"decoder_input_ids": torch.tensor([[0]])}
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(t5, ids, layers="shared", target=lambda out: out.logits[:, -1, 7], kwargs=kw)
    said = str(e.value)
    assert said.startswith("layer 'shared' did not run in the forward pass") and "\n" not in said
    assert "(its weights are used by 'encoder.embed_tokens', 'decoder.embed_tokens'" in said
    res = hookscope.attribute(t5, ids, layers="encoder.embed_tokens", target=lambda out: out.logits[:, -1, 7],
                              kwargs=kw)  # one of them, which runs once
    assert res.maps.shape == (1, 3, 16) and res.layer == "encoder.embed_tokens" and no_hooks(t5)
