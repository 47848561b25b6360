"""CAM on signals (``N x C x L`` layers) and volumes (``N x C x D x H x W``): every method, hand references,
pytorch-grad-cam side by side where it runs, and models trained here whose maps find a pattern planted."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import no_hooks
from torch import nn

from hookscope import HookscopeError
from hookscope.analysis.cam import METHODS, cam


def minmax(m):
    m = torch.as_tensor(np.asarray(m), dtype=torch.float64)
    flat = m.flatten(1)
    lo, span = flat.amin(1), flat.amax(1) - flat.amin(1)
    shape = (-1, *([1] * (m.ndim - 1)))
    return (m - lo.view(shape)) / torch.where(span > 0, span, torch.ones_like(span)).view(shape)


def net_of(rank, classes=4, seed=0):
    torch.manual_seed(seed)
    conv, bn, pool = {1: (nn.Conv1d, nn.BatchNorm1d, nn.AdaptiveAvgPool1d),
                      3: (nn.Conv3d, nn.BatchNorm3d, nn.AdaptiveAvgPool3d)}[rank]
    net = nn.Sequential(conv(2, 4, 3, padding=1), bn(4), nn.ReLU(), conv(4, 6, 3, padding=1, stride=2), nn.Tanh(),
                        pool(1), nn.Flatten(), nn.Linear(6, classes))
    with torch.no_grad():  # running statistics that are not the identity
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


SHAPES = {1: (2, 2, 17), 3: (2, 2, 7, 9, 8)}  # odd sizes: the layer's grid is not a divisor of the input's


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_explains_signals_and_volumes(method, rank):
    net, x = net_of(rank), torch.randn(*SHAPES[rank])
    res = cam(net, x, method=method, **({} if method in ("cam", "fullgrad") else {"layers": "3"}))
    assert res.maps.shape == (2, *x.shape[2:]) and res.maps.min() >= 0 and res.maps.max() <= 1
    assert all(len(r.peak) == rank for r in res.rows) and ("peak (l)" if rank == 1 else "peak (d, y, x)") in str(res)
    assert set(res.layouts.values()) == {"BCL" if rank == 1 else "BCDHW"}
    assert no_hooks(net)


def _reference(net, x, target, rank):
    """Grad-CAM by plain hooks, upsampled (linear / trilinear, align_corners=False) and min-max normalised."""
    kept = []
    h = net[4].register_forward_hook(lambda m, i, o: kept.append(o))
    out = net(x)
    h.remove()
    (G,) = torch.autograd.grad(out[:, target].sum(), kept[0])
    dims = tuple(range(2, G.ndim))
    raw = F.relu((G.mean(dims, keepdim=True) * kept[0]).sum(1)).detach()
    mode = "linear" if rank == 1 else "trilinear"
    return raw, minmax(F.interpolate(raw.unsqueeze(1), size=x.shape[2:], mode=mode, align_corners=False).squeeze(1))


@pytest.mark.parametrize("rank", [1, 3])
def test_gradcam_of_a_signal_and_a_volume_equals_the_formula_by_hand(rank):
    net, x = net_of(rank), torch.randn(*SHAPES[rank])
    res = cam(net, x, layers="4", method="gradcam", target=2)
    raw, maps = _reference(net, x, 2, rank)
    torch.testing.assert_close(res.raw["4"], raw, rtol=1e-5, atol=1e-6)
    assert (res.maps.double() - maps).abs().max() < 1e-5
    assert res.layers == ["4"] and no_hooks(net)


def test_the_layer_found_in_a_signal_model_is_its_last_conv1d_and_in_a_volume_model_its_last_conv3d():
    for rank, kind in ((1, "Conv1d"), (3, "Conv3d")):
        res = cam(net_of(rank), torch.randn(*SHAPES[rank]))
        assert res.layers == ["3"] and res.chosen == f"3 (the last {kind} with a spatial output)"


def test_a_signal_or_volume_layer_given_an_image_reshape_is_one_line():
    net, x = net_of(1), torch.randn(*SHAPES[1])
    from hookscope.analysis.cam import channels_last
    with pytest.raises(HookscopeError) as e:
        cam(net, x, layers="3", reshape=channels_last)
    assert str(e.value).startswith("reshape= failed on layer '3'") and "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match=r"not signals, images or volumes; pass a B x C x L"):
        cam(net, torch.randn(1, 2, 3, 4, 5, 6), layers="3")
    assert no_hooks(net)


# --- pytorch-grad-cam on volumes ---------------------------------------------------------------------------
PGC_3D = [("gradcam", "GradCAM"), ("hirescam", "HiResCAM"), ("gradcamelementwise", "GradCAMElementWise"),
          ("xgradcam", "XGradCAM"), ("layercam", "LayerCAM"), ("fem", "FEM"), ("shapleycam", "ShapleyCAM")]


def _pgc(cls, net, x, target, **make):
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    with cls(model=net, target_layers=[net[3]], **make) as c:
        c.get_target_width_height = lambda _x: None
        return c(input_tensor=x, targets=[ClassifierOutputTarget(target)] * len(x))


@pytest.mark.parametrize("method, name", PGC_3D)
def test_volume_maps_equal_pytorch_grad_cam_where_it_runs(method, name):
    pgc = pytest.importorskip("pytorch_grad_cam")
    net, x = net_of(3), torch.randn(*SHAPES[3])
    ours = cam(net, x, layers="3", method=method, target=1)
    assert (minmax(ours.raw["3"]) - minmax(_pgc(getattr(pgc, name), net, x, 1))).abs().max() < 1e-5


def test_score_and_ablation_cam_on_volumes_where_pytorch_grad_cam_crashes():
    pgc = pytest.importorskip("pytorch_grad_cam")
    net, x = net_of(3), torch.randn(1, *SHAPES[3][1:])
    for cls in (pgc.ScoreCAM, pgc.AblationCAM):  # its 2-D upsampling; its 4-D ablation layer
        with pytest.raises((ValueError, RuntimeError, AttributeError)):
            _pgc(cls, net_of(3), x, 1)  # a fresh model: a failed AblationCAM leaves its layer swapped in
    kept = []
    h = net[3].register_forward_hook(lambda m, i, o: kept.append(o.detach()))
    with torch.no_grad():
        y = net(x)[0, 1]
    h.remove()
    A = kept[0]
    scores, drops = [], []
    with torch.no_grad():
        for k in range(A.shape[1]):  # Score-CAM: the input times each channel upsampled trilinearly, min-max
            up = F.interpolate(A[:, k:k + 1], size=x.shape[2:], mode="trilinear", align_corners=True)[0, 0]
            span = up.max() - up.min()
            scores.append(float(net(x * ((up - up.min()) / span if span > 0 else 0 * up))[0, 1]))
            Ak = A.clone()
            Ak[:, k] = 0  # Ablation-CAM: the rest of the model on the layer's output with channel k zeroed
            drops.append(float((y - net[4:](Ak)[0, 1]) / y))
    ws = torch.softmax(torch.tensor(scores), 0)
    for method, w in (("scorecam", ws), ("ablationcam", torch.tensor(drops))):
        got = cam(net, x, layers="3", method=method, target=1)
        want = F.relu((w.view(1, -1, 1, 1, 1) * A).sum(1))
        torch.testing.assert_close(got.raw["3"], want, rtol=1e-4, atol=1e-5)
    assert no_hooks(net)


# --- ground truth: a pattern planted, a model trained, the map on the pattern -------------------------------
def _train(net, make, steps):
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        x, y, _ = make(64)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def _signals(n, gen=None, L=64):
    """Noise; half the signals carry a bump (width 5) at a random place: class 1."""
    x = 0.3 * torch.randn(n, 1, L, generator=gen)
    y = torch.arange(n) % 2
    where = torch.randint(4, L - 4, (n,), generator=gen)
    mask = torch.zeros(n, L, dtype=torch.bool)
    for i in range(n):
        if y[i]:
            mask[i, where[i] - 2:where[i] + 3] = True
    x[:, 0] += 1.5 * mask
    return x, y, mask


def _volumes(n, gen=None, S=10):
    """Noise; half the volumes hold a bright 3 x 3 x 3 cube at a random place: class 1."""
    x = 0.3 * torch.randn(n, 1, S, S, S, generator=gen)
    y = torch.arange(n) % 2
    corner = torch.randint(0, S - 3, (n, 3), generator=gen)
    mask = torch.zeros(n, S, S, S, dtype=torch.bool)
    for i in range(n):
        if y[i]:
            d, h, w = corner[i].tolist()
            mask[i, d:d + 3, h:h + 3, w:w + 3] = True
    x[:, 0] += 1.5 * mask
    return x, y, mask


def _found(maps, mask, near):
    """Per sample with a pattern: its map's peak lies within ``near`` positions of the pattern."""
    hits = []
    for m, k in zip(maps, mask):
        peak = torch.tensor(np.unravel_index(int(m.argmax()), m.shape))
        inside = k.nonzero()
        hits.append(bool(((inside - peak).abs().amax(1) <= near).any()))
    return sum(hits) / len(hits)


@pytest.mark.parametrize("rank", [1, 3])
def test_maps_of_a_model_trained_here_lie_on_the_pattern_it_was_trained_to_find(rank):
    torch.manual_seed(0)
    conv, pool = (nn.Conv1d, nn.AdaptiveMaxPool1d) if rank == 1 else (nn.Conv3d, nn.AdaptiveMaxPool3d)
    net = nn.Sequential(conv(1, 8, 3, padding=1), nn.ReLU(), conv(8, 8, 3, padding=1), nn.ReLU(), pool(1),
                        nn.Flatten(), nn.Linear(8, 2))
    make = _signals if rank == 1 else _volumes
    net = _train(net, make, 150 if rank == 1 else 60)
    x, y, mask = make(40 if rank == 1 else 20, torch.Generator().manual_seed(1))
    assert (net(x).argmax(1) == y).float().mean() > 0.9  # it learnt the pattern
    x, mask = x[y == 1], mask[y == 1]
    margin = lambda o: o[:, 1] - o[:, 0]  # noqa: E731 - positive where class 1 wins: Ablation-CAM divides by it
    for method in ("gradcam", "layercam", "ablationcam", "scorecam"):
        res = cam(net, x, layers="2", method=method, target=margin)
        assert _found(res.maps, mask, near=1) >= 0.9, method
        assert float((res.maps * mask).sum() / res.maps.sum()) > 2 * float(mask.float().mean()), method
    assert no_hooks(net)


def test_signals_are_drawn_as_curves_and_volumes_as_slices_and_the_wrong_kind_is_one_line():
    pytest.importorskip("matplotlib")
    from hookscope.viz import plot_cam_curves, plot_cam_slices

    net1, x1 = net_of(1), torch.randn(*SHAPES[1])
    r1 = cam(net1, x1, layers="3", target=1)
    fig = plot_cam_curves(x1[1], [r1], index=1)
    assert [ax.get_ylabel() for ax in fig.axes] == ["signal", "gradcam"]
    assert fig.axes[1].images[0].get_array().shape == (1, 17)  # the map at the signal's length
    net3, x3 = net_of(3), torch.randn(*SHAPES[3])
    r3 = cam(net3, x3, layers="3", target=1)
    fig = plot_cam_slices(x3[0], [r3, r3])
    assert len(fig.axes) == 2 * 6 and fig.axes[0].get_title() == "gradcam, class 1\nd=0"
    for call, message in ((lambda: plot_cam_slices(x3[0], [r3], slices=[7]), "slices=[7] must be depths from 0 to 6"),
                          (lambda: plot_cam_curves(x3[0], [r3]), "the gradcam result holds maps of 3 dimensions"),
                          (lambda: plot_cam_curves(None, [r1], index=2), "index=2 is out of range")):
        with pytest.raises(HookscopeError) as e:
            call()
        assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert r3._repr_html_().count("<img") == 1  # a notebook shows the slices under the table


def test_plot_cams_hands_signals_to_curves_and_volumes_to_slices():
    pytest.importorskip("matplotlib")
    from hookscope.viz import plot_cams

    net1, x1 = net_of(1), torch.randn(*SHAPES[1])
    r1 = cam(net1, x1, layers="3", target=1)
    fig = plot_cams(x1[1], [r1], index=1)
    assert [ax.get_ylabel() for ax in fig.axes] == ["signal", "gradcam"]
    assert fig.axes[1].images[0].get_array().shape == (1, 17)
    net3, x3 = net_of(3), torch.randn(*SHAPES[3])
    r3 = cam(net3, x3, layers="3", target=1)
    fig = plot_cams(x3[0], [r3, r3])
    assert len(fig.axes) == 2 * 6 and fig.axes[0].get_title() == "gradcam, class 1\nd=0"
    for results, message in (([r1, r3], "the gradcam result holds maps of 3 dimensions"),
                             ([r3, r1], "the gradcam result holds maps of 1 dimensions")):
        with pytest.raises(HookscopeError) as e:
            plot_cams(x1[0], results)
        assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert no_hooks(net1) and no_hooks(net3)
