"""The perturbation methods of hookscope.attribute (occlusion, feature ablation and permutation, Shapley value
sampling, KernelSHAP, LIME): captum's values for the same settings and seeds, exact Shapley values on
models whose answer is known in closed form, the layer versions against the same edit made by hand,
the demo shapes' masks as ground truth, the memory budget, and one-line refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.attribution import feature_grid, superpixels

from helpers import no_hooks, one_thread_only, rel

one_thread = pytest.fixture(autouse=True, scope="module")(one_thread_only)


def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 5)).double().eval()


@pytest.fixture(scope="module")
def net() -> nn.Module:
    return _conv()


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _mask() -> torch.Tensor:
    return feature_grid(torch.zeros(1, 3, 8, 8), 4)[0]  # 4 cells of 4 x 4: 8 x 8 labels 0..3


# --- against captum -------------------------------------------------------------------------------
captum_attr = pytest.importorskip("captum.attr")


@pytest.mark.parametrize("window, stride, baseline", [((3, 4, 4), 2, 0.0), ((2, 3, 3), (1, 2, 2), 0.5),
                                                      ((3, 8, 8), 1, None), ((1, 3, 5), (1, 3, 3), 0.25)])
def test_occlusion_equals_captum(net, x, window, stride, baseline):
    ours = hookscope.attribute(net, x, method="occlusion", window=window, stride=stride, baseline=baseline,
                               target=[1, 3])
    theirs = captum_attr.Occlusion(net).attribute(x, sliding_window_shapes=window, strides=stride,
                                                  baselines=0.0 if baseline is None else baseline, target=[1, 3])
    assert rel(ours.maps, theirs) <= 1e-6  # captum sums in float32 and no_hooks(net)


def test_occlusion_by_default_covers_every_channel_and_an_eighth_of_each_side_at_half_steps(net, x):
    default = hookscope.attribute(net, x, method="occlusion", target=2)
    explicit = hookscope.attribute(net, x, method="occlusion", window=(3, 1, 1), stride=1, target=2)
    assert torch.equal(default.maps, explicit.maps)  # 8 / 8 = 1: one position at a time, every channel


def test_occlusion_window_of_the_last_dims_covers_every_channel(net, x):
    short = hookscope.attribute(net, x, method=hookscope.Occlusion(window=(4, 4), stride=4), target=2)
    full = hookscope.attribute(net, x, method="occlusion", window=(3, 4, 4), stride=4, target=2)
    assert torch.equal(short.maps, full.maps)


@pytest.mark.parametrize("features", [None, "mask", "channels"])
def test_feature_ablation_equals_captum(net, x, features):
    mask = {None: None, "mask": _mask(), "channels": torch.arange(3).view(3, 1, 1)}[features]
    ours = hookscope.attribute(net, x, method="feature_ablation", features=mask, baseline=0.2, target=[0, 4])
    theirs = captum_attr.FeatureAblation(net).attribute(
        x, baselines=0.2, target=[0, 4], feature_mask=None if mask is None else mask.expand(1, 3, 8, 8))
    assert rel(ours.maps, theirs) <= 1e-6  # captum sums in float32


def test_feature_permutation_equals_captum_with_the_same_seed(net):
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = hookscope.attribute(net, x, method="feature_permutation", features=_mask(), seed=5, target=1)
    torch.manual_seed(5)
    theirs = captum_attr.FeaturePermutation(net).attribute(x, target=1, feature_mask=_mask().expand(1, 3, 8, 8))
    assert rel(ours.maps, theirs) <= 1e-6  # captum sums in float32


def test_shapley_value_sampling_equals_captum_with_the_same_seed(net, x):
    ours = hookscope.attribute(net, x, method="shapley_value_sampling", features=_mask(), samples=6, seed=3,
                               target=[2, 2], baseline=0.1)
    torch.manual_seed(3)
    theirs = captum_attr.ShapleyValueSampling(net).attribute(x, baselines=0.1, target=[2, 2], n_samples=6,
                                                             feature_mask=_mask().expand(1, 3, 8, 8).contiguous())
    assert rel(ours.maps, theirs) <= 1e-6  # captum sums in float32


def test_kernel_shap_draws_captums_coalitions_and_fits_them_held_to_efficiency(net, x):
    cells = feature_grid(torch.zeros(1, 3, 8, 8), 2)[0]  # 16 features: 60 coalitions are drawn, not enumerated
    ours = hookscope.attribute(net, x[:1], method="kernel_shap", features=cells, samples=60, seed=4, target=1)
    torch.manual_seed(4)
    theirs = captum_attr.KernelShap(net).attribute(x[:1], target=1, n_samples=60,
                                                   feature_mask=cells.expand(1, 3, 8, 8))
    # captum holds the two ends by a weight of 1e6 where ours holds them exactly: the same fit within that
    assert rel(ours.maps, theirs) <= 1e-3
    assert float(ours.delta.abs().max()) <= 1e-10  # sum = f(x) - f(baseline), exactly


def test_lime_equals_captum_with_a_ridge_model_and_the_same_seed(net, x):
    pytest.importorskip("sklearn")
    from captum._utils.models.linear_model import SkLearnRidge

    ours = hookscope.attribute(net, x[:1], method="lime", features=_mask(), samples=40, seed=7, alpha=0.5,
                               kernel_width=0.75, target=3)
    torch.manual_seed(7)
    lime = captum_attr.Lime(net, interpretable_model=SkLearnRidge(alpha=0.5),
                            similarity_func=captum_attr._core.lime.get_exp_kernel_similarity_function(
                                "cosine", kernel_width=0.75))
    theirs = lime.attribute(x[:1], target=3, n_samples=40, feature_mask=_mask().expand(1, 3, 8, 8))
    assert rel(ours.maps, theirs) <= 1e-5


# --- exact Shapley values, in closed form ---------------------------------------------------------
class Game(nn.Module):
    """``f(x) = w . x + c x0 x1 + d x2 x3 x4``: each Shapley value is known (the interactions shared equally)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5, -1.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w + 2.0 * x[:, 0] * x[:, 1] + 3.0 * x[:, 2] * x[:, 3] * x[:, 4]
        return torch.stack([y, -y], 1)


def _closed_form(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Shapley values of :class:`Game` from baseline ``b``, worked by hand."""
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5, -1.0], dtype=torch.float64)
    phi = w * (x - b)
    pair = 2.0 * (x[:, 0] * x[:, 1] - b[:, 0] * b[:, 1])
    phi[:, 0] += pair / 2  # a product's gain is shared equally where the baseline is 0 (the tests' own)
    phi[:, 1] += pair / 2
    triple = 3.0 * (x[:, 2] * x[:, 3] * x[:, 4] - b[:, 2] * b[:, 3] * b[:, 4])
    phi[:, 2:5] += (triple / 3).unsqueeze(1)
    return phi


def _exact(model: nn.Module, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Shapley values by their definition, every coalition of the features enumerated."""
    K = x.shape[1]
    phi = torch.zeros_like(x)
    for i in range(K):
        others = [j for j in range(K) if j != i]
        for r in range(K):
            for S in itertools.combinations(others, r):
                weight = math.factorial(r) * math.factorial(K - r - 1) / math.factorial(K)
                keep = torch.zeros(K, dtype=torch.bool)
                keep[list(S)] = True
                without = torch.where(keep, x, b)
                keep[i] = True
                with_i = torch.where(keep, x, b)
                phi[:, i] += weight * (model(with_i)[:, 0] - model(without)[:, 0]).detach()
    return phi


@pytest.fixture(scope="module")
def game() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    x = torch.tensor([[1.0, 2.0, -1.0, 0.5, 2.0, 1.0], [0.3, -1.0, 2.0, 1.0, -0.5, 4.0]], dtype=torch.float64)
    return Game().eval(), x, torch.zeros_like(x)


def test_the_exact_values_are_the_closed_form(game):
    model, x, b = game
    assert torch.allclose(_exact(model, x, b), _closed_form(x, b), atol=1e-12)


def test_kernel_shap_with_every_coalition_is_exact(game):
    model, x, b = game
    res = hookscope.attribute(model, x, method="kernel_shap", samples=2 ** 6, target=0)
    assert torch.allclose(res.maps, _closed_form(x, b), atol=1e-10)
    assert float(res.delta.abs().max()) <= 1e-10


@pytest.mark.parametrize("method, samples, error", [("shapley_value_sampling", 400, 0.1), ("kernel_shap", 60, 0.25)])
def test_sampled_shapley_values_are_within_their_sampling_error(game, method, samples, error):
    model, x, b = game
    res = hookscope.attribute(model, x, method=method, samples=samples, seed=1, target=0)
    truth = _closed_form(x, b)
    # efficiency holds exactly for every draw (each order's gains telescope; KernelSHAP is held to it)
    assert torch.allclose(res.maps.sum(1), (model(x) - model(b))[:, 0], atol=1e-10)
    assert float((res.maps - truth).abs().max()) <= error * float(truth.abs().max())


def test_shapley_sampling_error_shrinks_as_one_over_root_samples(game):
    model, x, b = game
    truth = _closed_form(x, b)
    errors = []
    for n in (16, 256):
        runs = [hookscope.attribute(model, x, method="shapley_value_sampling", samples=n, seed=s, target=0).maps
                for s in range(6)]
        errors.append(float(torch.stack([(r - truth).pow(2).mean() for r in runs]).mean().sqrt()))
    assert errors[1] < errors[0] / 2.5  # sqrt(16) = 4 in theory; 2.5 leaves room for six seeds' noise


def test_symmetric_features_get_equal_values():
    w = torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 1, bias=False).double()).eval()
    with torch.no_grad():
        model[0].weight.copy_(w.view(1, 3))
    sym = lambda t: (model(t) + (t[:, 0] * t[:, 1]).unsqueeze(1))  # noqa: E731 - symmetric in features 0, 1
    x = torch.tensor([[1.5, 1.5, 0.7]], dtype=torch.float64)
    exact = hookscope.attribute(_Wrap(sym), x, method="kernel_shap", samples=8, target=0)  # every coalition
    assert abs(float(exact.maps[0, 0] - exact.maps[0, 1])) <= 1e-12
    assert torch.allclose(exact.maps, torch.tensor([[3.0 + 1.125, 3.0 + 1.125, -0.7]], dtype=torch.float64))
    sampled = hookscope.attribute(_Wrap(sym), x, method="shapley_value_sampling", samples=400, target=0)
    assert abs(float(sampled.maps[0, 0] - sampled.maps[0, 1])) <= 0.1 * float(sampled.maps.abs().max())


class _Wrap(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


# --- layer versions -------------------------------------------------------------------------------
METHODS = [("occlusion", {"window": (2, 2, 2), "stride": 2}), ("feature_ablation", {"features": "channels"}),
           ("feature_permutation", {"features": "pixels"}), ("shapley_value_sampling", {"samples": 2, "features": "channels"}),
           ("kernel_shap", {"samples": 10, "features": "channels"}), ("lime", {"samples": 10, "features": "pixels"})]


@pytest.mark.parametrize("method, settings", METHODS, ids=[m for m, _ in METHODS])
def test_a_layer_version_equals_the_method_on_the_rest_of_the_model(net, x, method, settings):
    at_layer = hookscope.attribute(net, x, method=method, layers="1", target=[0, 2], **settings)
    with torch.no_grad():
        h = net[:2](x)
    by_hand = hookscope.attribute(net[2:], h, method=method, target=[0, 2], **settings)
    assert at_layer.layer == "1" and at_layer.maps.shape == h.shape
    assert rel(at_layer.maps, by_hand.maps) <= 1e-12 and no_hooks(net)


class Branchy(nn.Module):
    """Not a chain of Sequentials: the layer's output is replaced in the whole model's run."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = _conv()[:4], nn.Linear(4, 3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.head(h.mean((2, 3))) + x.flatten(1).mean(1, keepdim=True)  # the inputs reach past the layer


@pytest.mark.parametrize("method, settings", METHODS, ids=[m for m, _ in METHODS])
def test_a_layer_of_any_model_equals_the_same_edit_made_by_hand(x, method, settings):
    model = Branchy().eval()
    at_layer = hookscope.attribute(model, x, method=method, layers="body", target=1, **settings)
    rest = _Rest(model)
    with torch.no_grad():
        h = model.body(x)
    by_hand = hookscope.attribute(rest, h, method=method, target=1, **settings)
    assert rel(at_layer.maps, by_hand.maps) <= 1e-12 and no_hooks(model)


class _Rest(nn.Module):
    """Branchy after its body, the body's output given; the inputs' own term is left out, since it is the same
    for every copy of a sample and so cancels from every attribution."""

    def __init__(self, model: Branchy) -> None:
        super().__init__()
        self.model = model

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.head(h.mean((2, 3)))


# --- ground truth: the demo shapes ----------------------------------------------------------------
@pytest.fixture(scope="module")
def demo():
    from hookscope.synthetic import shapes
    from hookscope.zoo import demo_model

    data = shapes(4, seed=11)
    return demo_model(), data


def _inside(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """The share of each map's positive mass on the shape."""
    pos = maps.clamp(min=0).sum(1)
    return (pos * masks).flatten(1).sum(1) / pos.flatten(1).sum(1)


def test_occlusion_and_shapley_put_their_mass_on_the_shape(demo):
    model, data = demo
    x, target, masks = data.images, data.labels, data.masks.float()
    area = masks.flatten(1).mean(1)
    occ = hookscope.attribute(model, x, method="occlusion", window=(8, 8), stride=4, target=target,
                              baseline=data.backgrounds)
    shap = hookscope.attribute(model, x, method="shapley_value_sampling", features="grid:8", samples=2,
                               target=target, baseline=data.backgrounds)
    for res in (occ, shap):
        share = _inside(res.maps, masks)
        assert bool((share > 0.5).all()) and bool((share > 2 * area).all()), (res.method, share, area)
    assert no_hooks(model)


# --- feature masks ------------------------------------------------------------------------------
def test_feature_masks_made_for_you():
    x = torch.zeros(2, 3, 8, 8)
    x[1, :, :, 4:] = 1.0
    lab = superpixels(x, segments=4)
    assert lab.shape == (2, 8, 8) and int(lab.min()) == 0
    assert set(lab[1, :, :4].unique().tolist()).isdisjoint(lab[1, :, 4:].unique().tolist())  # the edge is kept
    assert torch.equal(feature_grid(x, 4)[0], torch.tensor([[0] * 4 + [1] * 4] * 4 + [[2] * 4 + [3] * 4] * 4))


def test_per_sample_masks_and_token_spans():
    emb = nn.Embedding(10, 4)
    model = nn.Sequential(emb, nn.Flatten(), nn.Linear(20, 2)).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    spans = torch.tensor([0, 0, 1, 1, 2]).view(5, 1)  # three spans of the tokens, every hidden value with its token
    res = hookscope.attribute(model, ids, method="feature_ablation", layers="0", features=spans, target=1)
    with torch.no_grad():
        h = emb(ids)
        full = model[1:](h)[0, 1]
        for span in range(3):
            cut = h.clone()
            cut[0, (spans.view(-1) == span)] = 0
            assert torch.allclose(res.maps[0, spans.view(-1) == span], (full - model[1:](cut)[0, 1]).expand(1, 1))
    # at the inputs, token ids ablated to a pad id
    pad = hookscope.attribute(model, ids, method="feature_ablation", baseline=0, target=1)
    assert pad.maps.shape == ids.shape and no_hooks(model)


# --- memory and progress --------------------------------------------------------------------------
def test_a_memory_budget_cuts_the_passes_and_changes_nothing(net, x):
    whole = hookscope.attribute(net, x, method="feature_ablation", features=_mask(), target=1)
    with pytest.raises(hookscope.HookscopeError, match="memory >= ") as e:
        hookscope.attribute(net, x, method="feature_ablation", features=_mask(), target=1, memory=100)
    need = int(str(e.value).split("memory >= ")[1].split(",")[0])
    cut = hookscope.attribute(net, x, method="feature_ablation", features=_mask(), target=1, memory=need + 1)
    assert whole.forwards == 1 + 1 and cut.forwards == 1 + 2 + 8  # two passes measure; then one copy a pass
    assert torch.equal(cut.maps, whole.maps)
    assert hookscope.FeatureAblation(memory="2GB").memory == 2 * 10 ** 9


def test_the_budget_measures_what_a_pass_holds():
    big = nn.Sequential(nn.Linear(100, 10_000), nn.ReLU(), nn.Linear(10_000, 1)).eval()
    x = torch.randn(1, 100)
    with pytest.raises(hookscope.HookscopeError, match="memory >= ") as e:
        hookscope.attribute(big, x, method="feature_ablation", target=0, memory=1000)
    need = int(str(e.value).split("memory >= ")[1].split(",")[0])
    assert 2 * 10_000 * 4 <= need <= 5 * 10_000 * 4  # the hidden layer and its ReLU, and little else


def test_progress_bar_on_request(net, x, capsys):
    hookscope.attribute(net, x, method="occlusion", window=(3, 4, 4), stride=4, target=1, batch_size=1,
                        progress=True)
    assert "occlusion" in capsys.readouterr().err


# --- settings and refusals ------------------------------------------------------------------------
def test_objects_and_names_give_the_same_maps(net, x):
    obj = hookscope.ShapleyValueSampling(samples=3, seed=2, features="channels")
    by_obj = hookscope.attribute(net, x, method=obj, target=1)
    by_name = hookscope.attribute(net, x, method="shapley_value_sampling", samples=3, seed=2, features="channels",
                                  target=1)
    assert torch.equal(by_obj.maps, by_name.maps)
    assert by_obj.settings == {"samples": 3, "seed": 2}


@pytest.mark.parametrize("call, match", [
    (dict(method="saliency", window=(2, 2)), r"window= is not a setting of saliency \(occlusion reads it\)"),
    (dict(method="occlusion", steps=3), r"steps= is not a setting of occlusion"),
    (dict(method="feature_ablation", features=torch.zeros(5, 5, dtype=torch.long)), r"features of shape 5x5 do not fit"),
    (dict(method="feature_ablation", features=torch.tensor([[0, 2], [2, 0]]).repeat(4, 4)), r"skip 1 .*renumber"),
    (dict(method="feature_ablation", features=torch.full((8, 8), 0.5)), r"features= is a tensor of float32"),
    (dict(method="feature_ablation", features="superpixel:9"), r"features='superpixel:9' is not a feature mask"),
    (dict(method="occlusion", window=(9, 9)), r"window 3x9x9 is larger than one sample \(3x8x8\)"),
    (dict(method="occlusion", window=(2, 2), stride=3), r"stride 3 is larger than the window"),
    (dict(method="feature_ablation", baseline=torch.zeros(3, 4, 4)), r"baseline of shape 3x4x4 does not fit"),
    (dict(method="shapley_value_sampling", samples=0), r"samples=0 must be a positive int"),
    (dict(method="lime", memory="lots"), r"memory='lots' is not a size"),
])
def test_bad_input_is_one_line(net, x, call, match):
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        hookscope.attribute(net, x, target=1, **call)
    assert "\n" not in str(e.value) and no_hooks(net)


def test_permutation_needs_two_samples(net, x):
    with pytest.raises(hookscope.HookscopeError, match="a batch of 1 has nothing to shuffle"):
        hookscope.attribute(net, x[:1], method="feature_permutation", target=1)


def test_a_model_without_gradients_is_explained():
    class Counting(nn.Module):  # argmax and rounding: no gradient anywhere
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.stack([(t > 0.5).float().sum(1), t.round().sum(1)], 1)

    x = torch.tensor([[0.9, 0.1, 0.7, 0.2]])
    res = hookscope.attribute(Counting(), x, method="feature_ablation", target=0)
    assert res.maps.tolist() == [[1.0, 0.0, 1.0, 0.0]]
