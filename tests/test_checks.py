"""Checks of an explanation (``hookscope.analysis.checks``, at ``hookscope.metrics``): ROAD side by side
with pytorch-grad-cam, infidelity and max-sensitivity side by side with captum, and the
model-randomisation sanity check on the trained demo model (Adebayo et al. 2018's known result).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import hookscope
from hookscope import metrics
from hookscope.analysis import cam_metrics, checks
from hookscope.analysis.checks._impute import impute
from hookscope.analysis.checks._road import removed_pixels
from hookscope.analysis.checks._similarity import ranks, spearman, ssim
from hookscope.synthetic import shapes
from hookscope.zoo import demo_model

from helpers import no_hooks


@pytest.fixture(scope="module")
def demo():
    return demo_model(), shapes(3, seed=1)


def _tie_free(b: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Maps without ties whose ``1 - m`` is exact in float32 (pytorch-grad-cam ranks ``1 - m`` for least
    relevant first: its rounding would otherwise merge neighbouring values)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(h * w, generator=g).view(h, w) for _ in range(b)]).float() / (h * w)


def test_metrics_hands_on_every_name_of_both_modules():
    assert metrics.__all__ == cam_metrics.__all__ + checks.__all__
    assert all(getattr(metrics, n) is getattr(checks, n) for n in checks.__all__)


# --- ROAD -----------------------------------------------------------------------------------------------------
def test_imputation_is_the_weighted_mean_of_the_neighbours_worked_by_hand():
    x = torch.arange(9, dtype=torch.float32).view(1, 1, 3, 3)
    hole = torch.zeros(1, 3, 3, dtype=torch.bool)
    hole[0, 1, 1] = True
    # sides (1, 3, 5, 7) weigh 1/6, corners (0, 2, 6, 8) 1/12: (16 / 6 + 16 / 12) = 4
    assert impute(x, hole)[0, 0, 1, 1].item() == pytest.approx(4.0, abs=1e-6)
    corner = torch.zeros(1, 3, 3, dtype=torch.bool)
    corner[0, 0, 0] = True  # three neighbours inside: (1 / 6 * 1 + 1 / 6 * 3 + 1 / 12 * 4) / (5 / 12)
    assert impute(x, corner)[0, 0, 0, 0].item() == pytest.approx((1 / 6 + 3 / 6 + 4 / 12) / (5 / 12), abs=1e-6)
    assert torch.equal(impute(x, corner)[~corner.unsqueeze(1).expand_as(x)], x[~corner.unsqueeze(1).expand_as(x)])


def test_imputation_equals_pytorch_grad_cams_solver_on_a_large_hole():
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    x = torch.rand(3, 40, 40, generator=torch.Generator().manual_seed(0))
    hole = torch.zeros(40, 40, dtype=torch.bool)
    hole[4:36, 2:30] = True  # one blob of 896 pixels: the slowest case for conjugate gradients
    theirs = road.NoisyLinearImputer(noise=0.0)(x, (~hole).float())
    ours = impute(x[None], hole[None])[0]
    assert (ours - theirs).abs().max() < 1e-5


def test_removed_pixels_are_pytorch_grad_cams_on_maps_without_ties():
    maps = _tie_free(2, 9, 11, 3)
    for p in (10, 25, 50, 77.5, 90, 100):
        for order, m in (("most", maps), ("least", 1 - maps)):
            keep = torch.stack([torch.from_numpy(np.float32(v.numpy() < np.percentile(v.numpy(), p))) for v in m])
            assert torch.equal(removed_pixels(maps, p, order), keep == 0), (p, order)


def test_ties_are_cut_so_that_exactly_the_share_is_removed():
    maps = torch.zeros(1, 10, 10)
    maps[0, :3] = torch.linspace(0.1, 1, 30).view(3, 10)  # 70 zeros, as a ReLU'd CAM has
    for p, order in ((10, "most"), (50, "least"), (90, "least")):
        removed = removed_pixels(maps, p, order)
        assert int(removed.sum()) == 100 - math.ceil(p * 99 / 100)
    assert removed_pixels(maps, 80, "most")[0, 1:3].all()  # the top 20 % are the 20 largest values


@pytest.mark.parametrize("score, target_class", [("prob", "ClassifierOutputSoftmaxTarget"),
                                                 ("logit", "ClassifierOutputTarget")])
def test_road_equals_pytorch_grad_cam_per_percentile_with_the_noise_off(demo, score, target_class):
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    targets_module = pytest.importorskip("pytorch_grad_cam.utils.model_targets")
    net, data = demo
    maps = _tie_free(3, 64, 64, 4)
    percentiles = [10, 35, 50, 80, 95]
    ours = metrics.road(net, data.images, maps, target=data.labels, percentiles=percentiles, noise=0, score=score)
    targets = [getattr(targets_module, target_class)(int(c)) for c in data.labels]
    for i, p in enumerate(percentiles):
        for metric, mine in ((road.ROADMostRelevantFirst(p), ours.most), (road.ROADLeastRelevantFirst(p), ours.least)):
            metric.perturbation.imputer.noise = 0.0
            theirs = metric(data.images, maps.numpy(), targets, net)
            assert np.abs(theirs - mine[:, i].numpy()).max() < 2e-5, (p, type(metric).__name__)
    assert torch.allclose(ours.removed, torch.tensor([1 - math.ceil(p * 4095 / 100) / 4096 for p in percentiles])
                          .expand(3, -1))
    assert no_hooks(net)


def test_road_combined_equals_pytorch_grad_cam_with_the_same_noise(demo):
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    targets_module = pytest.importorskip("pytorch_grad_cam.utils.model_targets")
    net, data = demo
    maps = _tie_free(3, 64, 64, 5)
    targets = [targets_module.ClassifierOutputSoftmaxTarget(int(c)) for c in data.labels]
    state = torch.random.get_rng_state()
    ours = metrics.road(net, data.images, maps, target=data.labels, seed=11)
    assert torch.equal(state, torch.random.get_rng_state())  # the noise came from a generator of its own
    torch.manual_seed(11)  # pytorch-grad-cam draws from the global one
    theirs = road.ROADCombined()(data.images, maps.numpy(), targets, net)
    assert np.abs(theirs - ours.combined.numpy()).max() < 2e-5
    other = metrics.road(net, data.images, maps, target=data.labels, seed=12)
    assert not torch.equal(other.combined, ours.combined)  # the noise counts: the seed is what matched


def test_road_ranks_a_cam_above_a_random_map_and_never_writes_the_images(demo):
    net, data = demo
    images = data.images.clone()
    cam = hookscope.cam(net, images, layers="layer3", target=data.labels).maps
    faithful = metrics.road(net, images, cam, target=data.labels, percentiles=[30, 60, 90])
    noise = metrics.road(net, images, torch.rand(3, 64, 64), target=data.labels, percentiles=[30, 60, 90])
    assert torch.equal(images, data.images)
    assert float(faithful.combined.mean()) > 0.2 > float(noise.combined.mean())
    assert torch.isfinite(faithful.most).all() and torch.isfinite(faithful.least).all()  # ReLU zeros: no NaN
    assert faithful.rows[0].percentile == 30 and str(faithful).startswith("ROAD of 3 images")
    assert not net.training and no_hooks(net)


def test_road_refuses_bad_input_in_one_line(demo):
    net, data = demo
    x, maps = data.images, torch.rand(3, 64, 64)
    cases = [
        (dict(maps=torch.rand(2, 64, 64)), "do not fit 3 images"),
        (dict(maps=torch.rand(3, 64)), "do not fit 3 images"),
        (dict(percentiles=[50, 120]), "percentile 120.0 is outside [0, 100]"),
        (dict(percentiles=[-1]), "outside [0, 100]"),
        (dict(percentiles=[0]), "percentile 0 removes every pixel"),
        (dict(percentiles=[]), "percentiles is empty"),
        (dict(noise=-0.1), "noise=-0.1"),
        (dict(score="probability"), "Did you mean 'prob'"),
        (dict(target=9), "out of range"),
    ]
    with pytest.raises(hookscope.HookscopeError, match="NaN or infinite"):
        metrics.road(net, torch.full_like(x, float("nan")), maps)
    for kw, text in cases:
        args = {"maps": maps, **kw}
        with pytest.raises(hookscope.HookscopeError) as e:
            metrics.road(net, x, args.pop("maps"), **args)
        assert text in str(e.value) and "\n" not in str(e.value), kw
    assert no_hooks(net)


# --- infidelity and max-sensitivity ---------------------------------------------------------------------------
def _gaussian(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    noise = 0.1 * torch.randn_like(inputs)
    return noise, inputs - noise


@pytest.mark.parametrize("normalize", [False, True])
def test_infidelity_equals_captums_with_the_same_perturbation_and_seed(demo, normalize):
    captum_metrics = pytest.importorskip("captum.metrics")
    net, data = demo
    attr = hookscope.attribute(net, data.images, method="gradient", target=data.labels).maps
    for batch_size in (12, 64):  # 4 perturbations of each image a call (4, 4, 2), and all 10 at once
        ours = metrics.infidelity(net, data.images, attr, perturb=_gaussian, target=data.labels, normalize=normalize,
                                  seed=7, batch_size=batch_size)
        torch.manual_seed(7)
        theirs = captum_metrics.infidelity(net, _gaussian, data.images, attr, target=data.labels, normalize=normalize,
                                           max_examples_per_batch=batch_size)
        assert torch.allclose(ours, theirs, rtol=1e-4), batch_size
    default = metrics.infidelity(net, data.images, attr, target=data.labels, seed=7, normalize=normalize)
    torch.manual_seed(7)  # the default is Gaussian noise of 0.1, drawn as _gaussian draws it
    theirs = captum_metrics.infidelity(net, _gaussian, data.images, attr, target=data.labels, normalize=normalize,
                                       max_examples_per_batch=64)
    assert torch.allclose(default, theirs, rtol=1e-4)
    assert no_hooks(net)


def test_infidelity_of_a_linear_models_gradient_is_zero_and_normalize_ignores_scale():
    torch.manual_seed(0)
    net = nn.Linear(5, 3)
    x = torch.rand(4, 5)
    exact = net.weight[2].detach().expand(4, 5)  # f(x) - f(x - I) = w . I exactly
    assert metrics.infidelity(net, x, exact, target=2).max() < 1e-10
    assert metrics.infidelity(net, x, 3 * exact, target=2).min() > 1e-3  # three times too large: wrong
    wrong = torch.rand(4, 5)
    a = metrics.infidelity(net, x, wrong, target=2, normalize=True)
    b = metrics.infidelity(net, x, 5 * wrong, target=2, normalize=True)
    assert torch.allclose(a, b, rtol=1e-4)
    assert metrics.infidelity(net, x, 3 * exact, target=2, normalize=True).max() < 1e-10


def _saliency(target: torch.Tensor):
    return lambda m, x: hookscope.attribute(m, x, method="saliency", target=target).maps


def test_max_sensitivity_equals_captums_with_the_same_seed(demo):
    captum_metrics = pytest.importorskip("captum.metrics")
    captum_attr = pytest.importorskip("captum.attr")
    net, data = demo
    ours = metrics.max_sensitivity(net, data.images, _saliency(data.labels), seed=3, n_perturb_samples=4)
    torch.manual_seed(3)
    theirs = captum_metrics.sensitivity_max(captum_attr.Saliency(net).attribute, data.images, target=data.labels,
                                            n_perturb_samples=4)
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)

    def shift(x: torch.Tensor) -> torch.Tensor:
        return x + 0.05 * torch.rand_like(x)

    ours = metrics.max_sensitivity(net, data.images, _saliency(data.labels), perturb=shift, seed=4, n_perturb_samples=3,
                                   norm="inf")
    torch.manual_seed(4)
    theirs = captum_metrics.sensitivity_max(captum_attr.Saliency(net).attribute, data.images, perturb_func=shift,
                                            target=data.labels, n_perturb_samples=3, norm_ord=float("inf"))
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    assert no_hooks(net) and not net.training


def test_an_explanation_that_ignores_the_input_has_no_sensitivity():
    x = torch.rand(3, 4)
    assert metrics.max_sensitivity(nn.Identity(), x, lambda m, v: torch.ones(3, 2)).tolist() == [0.0] * 3
    assert metrics.max_sensitivity(nn.Identity(), x, lambda m, v: v, radius=0.0).tolist() == [0.0] * 3


def test_the_robustness_metrics_refuse_bad_input_in_one_line(demo):
    net, data = demo
    attr = torch.zeros_like(data.images)
    cases = [
        (lambda: metrics.infidelity(net, data.images, attr, n_perturb_samples=0), "n_perturb_samples=0"),
        (lambda: metrics.max_sensitivity(net, data.images, _saliency(data.labels), n_perturb_samples=0),
         "n_perturb_samples=0"),
        (lambda: metrics.infidelity(net, data.images, attr[:, 0]), "do not fit the inputs"),
        (lambda: metrics.infidelity(net, data.images, attr, perturb=lambda x: x), "must return (perturbations"),
        (lambda: metrics.max_sensitivity(net, data.images, lambda m, x: x[:1]), "one map per sample"),
        (lambda: metrics.max_sensitivity(net, data.images, _saliency(data.labels), norm="l3"), "norm='l3'"),
    ]
    for call, text in cases:
        with pytest.raises(hookscope.HookscopeError) as e:
            call()
        assert text in str(e.value) and "\n" not in str(e.value), text
    assert no_hooks(net)


# --- the randomisation sanity check ---------------------------------------------------------------------------
def test_rank_correlation_equals_scipys_with_ties():
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 6, (4, 200), generator=g).float(), torch.randint(0, 6, (4, 200), generator=g).float()
    want = [stats.spearmanr(a[i], b[i])[0] for i in range(4)]
    assert np.allclose(spearman(a, b).numpy(), want, atol=1e-6)
    assert ranks(torch.tensor([[2.0, 2.0, 2.0, 1.0]])).tolist() == [[3.0, 3.0, 3.0, 1.0]]
    assert math.isnan(float(spearman(torch.ones(1, 5), torch.rand(1, 5))[0]))  # a constant map has no ranks


def test_ssim_equals_wangs_formula_computed_with_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 30, 25, generator=g, dtype=torch.float64)
    b = (a + 0.3 * torch.rand(2, 30, 25, generator=g, dtype=torch.float64)).clamp(0, 1)

    def reference(x: np.ndarray, y: np.ndarray) -> float:  # scikit-image's algorithm, gaussian_weights=True
        f = lambda v: ndimage.gaussian_filter(v, sigma=1.5, truncate=3.5, mode="reflect")  # noqa: E731
        ux, uy = f(x), f(y)
        vx, vy, vxy = f(x * x) - ux * ux, f(y * y) - uy * uy, f(x * y) - ux * uy
        c1, c2 = 0.01**2, 0.03**2
        s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
        return float(s[5:-5, 5:-5].mean())

    want = [reference(a[i].numpy(), b[i].numpy()) for i in range(2)]
    assert np.allclose(ssim(a, b).numpy(), want, atol=1e-6)


def _cascade(net: nn.Module, images: torch.Tensor, labels: torch.Tensor, method: str) -> metrics.Randomisation:
    return metrics.parameter_randomisation(
        net, images, lambda m, x: hookscope.attribute(m, x, method=method, target=labels).maps)


def test_gradients_change_under_randomisation_and_guided_backprop_barely_does():
    """Adebayo et al. 2018 on the trained demo model: saliency maps lose their rank order as soon as
    the top layers are random; guided backpropagation's keep it until the low layers go."""
    net, data = demo_model(), shapes(4, seed=123)
    before = copy.deepcopy(net.state_dict())
    grad = _cascade(net, data.images, data.labels, "saliency")
    guided = _cascade(net, data.images, data.labels, "guided_backprop")
    assert grad.layers[:6] == ("fc", "layer3.4", "layer3.3", "layer3.1", "layer3.0", "layer2.4")
    top = grad.layers.index("layer3.0")  # fc and every layer of the last stage random
    assert grad["layer3.0"].spearman < 0.4 < 0.8 < guided["layer3.0"].spearman  # measured 0.30 and 0.83
    assert grad["layer3.0"].ssim < 0.4 < 0.9 < guided["layer3.0"].ssim  # measured 0.27 and 0.96
    assert grad.rows[-1].spearman < 0.25  # every layer random: 0.13
    assert all(g.spearman < b.spearman for g, b in zip(grad.rows[:top + 1], guided.rows[:top + 1]))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert no_hooks(net)


def _fingerprint(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A 'map' that is each parameter's sum: which weights an explanation saw."""
    sums = torch.stack([p.detach().sum() for p in m.parameters()])
    return sums.expand(x.shape[0], -1).clone()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    with torch.no_grad():  # "trained": a reset batch norm (weight 1, bias 0) must differ from it
        net[3].weight.uniform_(2, 3)
        net[3].bias.uniform_(1, 2)
    return net


def test_cascading_keeps_the_layers_above_random_and_independent_one_layer_at_a_time():
    net = _mlp()
    trained = _fingerprint(net, torch.zeros(1, 3))[0]
    owner = [0, 0, 2, 2, 3, 3, 4, 4]  # the module each parameter belongs to
    x = torch.rand(2, 3)
    cascade = metrics.parameter_randomisation(net, x, _fingerprint)
    alone = metrics.parameter_randomisation(net, x, _fingerprint, mode="independent")
    assert cascade.layers == alone.layers == ("4", "3", "2", "0")
    for step, layer in enumerate(cascade.layers):
        done = {int(n) for n in cascade.layers[:step + 1]}
        changed = cascade.maps[step, 0] != trained
        assert changed.tolist() == [o in done for o in owner], layer
        one = alone.maps[step, 0] != trained
        assert one.tolist() == [o == int(layer) for o in owner], layer
        mine = [i for i, o in enumerate(owner) if o == int(layer)]
        assert torch.equal(alone.maps[step, 0, mine], cascade.maps[step, 0, mine])  # one seed per layer: the same


def test_layers_chooses_blocks_and_the_model_is_left_bit_identical_even_when_explain_fails():
    net, data = demo_model(), shapes(2, seed=3)
    before = copy.deepcopy(net.state_dict())
    rng = torch.random.get_rng_state()
    res = metrics.parameter_randomisation(net, data.images, _fingerprint, layers=["layer3", "fc"])
    assert res.layers == ("fc", "layer3") and res.maps.shape[0] == 2
    calls = []

    def failing(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("explain broke")
        return _saliency(data.labels)(m, x)

    with pytest.raises(RuntimeError, match="explain broke"):
        metrics.parameter_randomisation(net, data.images, failing)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state()) and not net.training and no_hooks(net)


def test_an_explain_that_ignores_the_model_it_is_handed_is_told():
    net, data = demo_model(), shapes(2, seed=3)
    res = metrics.parameter_randomisation(net, data.images, lambda m, x: _saliency(data.labels)(net, x),
                                          layers=["fc", "layer3"])
    assert res.spearman.min() == 1 and any("ignores the model it is handed" in n for n in res.notes)
    assert "note:" in res.table()


def test_cam_and_attribute_plug_in_with_one_line_each():
    net, data = demo_model(), shapes(2, seed=3)
    for explain in (lambda m, x: hookscope.cam(m, x, layers="layer3", target=data.labels).maps,
                    lambda m, x: hookscope.attribute(m, x, method="integrated_gradients", target=data.labels,
                                                     steps=4).maps):
        res = metrics.parameter_randomisation(net, data.images, explain, layers=["fc", "layer3", "stem"])
        assert res.rows[1].spearman < 0.5 and res.ssim is not None
    assert no_hooks(net)


def test_randomisation_refuses_bad_input_in_one_line():
    net = _mlp()
    x = torch.rand(2, 3)
    cases = [
        (dict(layers="layer9"), hookscope.SelectionError, "matches no module"),
        (dict(layers="1"), hookscope.HookscopeError, "has no parameters to randomise"),
        (dict(mode="cascade"), hookscope.HookscopeError, "mode='cascade'"),
    ]
    for kw, kind, text in cases:
        with pytest.raises(kind) as e:
            metrics.parameter_randomisation(net, x, _fingerprint, **kw)
        assert text in str(e.value) and "\n" not in str(e.value), kw

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s = nn.Parameter(torch.ones(3))

        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return v * self.s

    odd = nn.Sequential(Scale(), nn.Linear(3, 1))
    with pytest.raises(hookscope.HookscopeError, match="no reset_parameters"):
        metrics.parameter_randomisation(odd, x, _fingerprint, layers="0")
    assert metrics.parameter_randomisation(odd, x, _fingerprint).skipped == ("0",)
    with pytest.raises(hookscope.HookscopeError, match="one map per sample"):
        metrics.parameter_randomisation(net, x, lambda m, v: v[0])


def test_the_randomisation_picture_shows_the_maps_and_the_curves(demo):
    pytest.importorskip("matplotlib")
    from hookscope.viz import plot_randomisation, plot_road

    net, data = demo
    res = metrics.parameter_randomisation(net, data.images, _saliency(data.labels), layers=["fc", "layer3", "layer2"])
    fig = plot_randomisation(res, sample=1)
    assert [ax.get_title() for ax in fig.axes][:2] == ["trained", "1: fc"] and len(fig.axes) == 5
    assert "<img" in res._repr_html_()
    with pytest.raises(hookscope.HookscopeError, match="sample=5 is out of range"):
        plot_randomisation(res, sample=5)
    curves = metrics.road(net, data.images, torch.rand(3, 64, 64), target=0, percentiles=[50])
    assert plot_road(curves).axes[0].get_ylabel() == "change of the prob" and "<img" in curves._repr_html_()


def test_randomising_a_layer_whose_weight_is_tied_to_another_says_so():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    torch.manual_seed(0)
    net = Tied()
    seen = []

    def explain(m, x):
        seen.append(m.a.weight.detach().clone())
        return torch.func.vmap(torch.func.grad(lambda v: m(v)[0]))(x)

    res = metrics.parameter_randomisation(net, torch.rand(8, 4), explain, mode="independent")
    assert res.layers == ("c", "b", "a")
    assert not torch.equal(seen[0], seen[2])  # randomising 'b' alone rewrote a's weight: the tie is real
    tied = [n for n in res.notes if "tied weights" in n]
    assert tied == ["randomising 'b' also rewrites 'a.weight', the same parameter as 'b.weight' (tied weights), "
                    "so that step does not randomise its layer alone",
                    "randomising 'a' also rewrites 'b.weight', the same parameter as 'a.weight' (tied weights), "
                    "so that step does not randomise its layer alone"]
    plain = metrics.parameter_randomisation(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)),
                                            torch.rand(8, 4), explain=lambda m, x: m[0].weight.sum() * x)
    assert not [n for n in plain.notes if "tied" in n]
    assert no_hooks(net)


def test_road_refuses_infinite_maps_that_upsampling_or_the_channel_sum_would_turn_into_nan(demo):
    net, data = demo
    x = data.images
    small = torch.rand(3, 16, 16)
    small[1, 1, 1] = float("inf")  # beside the border, a bilinear weight of 0 times inf: NaN, ranked silently
    both = torch.rand(3, 3, 64, 64)
    both[2, 0, 5, 5], both[2, 1, 5, 5] = float("inf"), -float("inf")
    for maps, reduce, image in ((small, "abs_sum", 1), (both, "sum", 2)):
        with pytest.raises(hookscope.HookscopeError) as e:
            metrics.road(net, x, maps, reduce=reduce, percentiles=[50])
        assert str(e.value).startswith(f"road: maps hold infinite values (image {image})") and "\n" not in str(e.value)
    full = torch.rand(3, 64, 64)
    full[0, 3, 3] = float("inf")  # at the images' size an infinite value still has a rank: the most relevant
    res = metrics.road(net, x, full, percentiles=[50], noise=0)
    assert torch.isfinite(res.most).all()
    lowres = metrics.road(net, x, small.clamp(max=1), percentiles=[50], noise=0)  # upsampled, as documented
    import torch.nn.functional as F
    up = F.interpolate(small.clamp(max=1)[:, None], size=(64, 64), mode="bilinear", align_corners=False)[:, 0]
    assert torch.equal(lowres.most, metrics.road(net, x, up, percentiles=[50], noise=0).most)
    assert no_hooks(net)
