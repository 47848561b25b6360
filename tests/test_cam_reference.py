"""Every CAM method on torchvision's resnet18 (weights=None, seed 0) against a reference written here.

The references take layer4's output A and the gradient G of the target logits by plain hooks and
apply each paper's formula in float64 numpy, independently of hookscope's code; maps are compared
after min-max normalisation per image, at layer4's resolution, within 1e-4 (issue 4). The peers
(pytorch-grad-cam, captum, torchcam) are compared in ``bench/bench_cam.py --agreement``.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import no_hooks

from hookscope.analysis.cam import cam

tv = pytest.importorskip("torchvision")
pytestmark = pytest.mark.slow


def minmax(m):
    m = np.asarray(m, dtype=np.float64)
    flat = m.reshape(len(m), -1)
    lo, span = flat.min(1), np.ptp(flat, 1)
    return (m - lo[:, None, None]) / np.where(span > 0, span, 1)[:, None, None]


def weighted(w, A):  # relu(sum_k w_k A_k), per image
    return np.maximum(np.einsum("bk,bkhw->bhw", w, A), 0)


def gradcam(A, G):
    return weighted(G.mean((2, 3)), A)


def gradcampp(A, G):  # Chattopadhay et al. eq. 19; alpha = 0 where its denominator is 0
    g2, g3 = G**2, G**3
    den = 2 * g2 + A.sum((2, 3), keepdims=True) * g3
    alpha = np.divide(g2, den, out=np.zeros_like(g2), where=den != 0)
    return weighted((alpha * np.maximum(G, 0)).sum((2, 3)), A)


def xgradcam(A, G):
    s = A.sum((2, 3))
    return weighted(np.divide((A * G).sum((2, 3)), s, out=np.zeros_like(s), where=s != 0), A)


def hirescam(A, G):
    return np.maximum((A * G).sum(1), 0)


def layercam(A, G):
    return np.maximum((np.maximum(G, 0) * A).sum(1), 0)


def eigencam(A, G):
    maps = []
    for a in A:
        X = a.reshape(a.shape[0], -1).T
        X = X - X.mean(0)
        v = np.linalg.svd(X, full_matrices=False)[2][0]
        maps.append(np.maximum(X @ (-v if v.sum() < 0 else v), 0).reshape(a.shape[1:]))
    return np.stack(maps)


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    net = tv.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 224, 224)
    kept = []
    handle = net.layer4.register_forward_hook(lambda m, i, o: kept.append(o))
    logits = net(x)
    handle.remove()
    targets = logits.argmax(1)
    (G,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), kept[0])
    return net, x, targets, kept[0].detach().double().numpy(), G.double().numpy()


@pytest.mark.parametrize("method, reference", [
    ("gradcam", gradcam), ("gradcam++", gradcampp), ("xgradcam", xgradcam), ("hirescam", hirescam),
    ("layercam", layercam), ("eigencam", eigencam)])
def test_method_matches_its_formula_on_resnet18(resnet18, method, reference):
    net, x, targets, A, G = resnet18
    res = cam(net, x, layers="layer4", method=method)
    assert res.targets.tolist() == targets.tolist()
    assert np.abs(minmax(res.raw["layer4"].numpy()) - minmax(reference(A, G))).max() < 1e-4
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())


def test_cam_matches_the_head_rows_on_resnet18(resnet18):
    net, x, targets, A, _ = resnet18
    res = cam(net, x, method="cam")  # the layer the head pools is found by itself
    w = net.fc.weight.detach().double().numpy()[targets.numpy()]
    assert res.layers == ["layer4"]
    assert np.abs(minmax(res.raw["layer4"].numpy()) - minmax(np.einsum("bk,bkhw->bhw", w, A))).max() < 1e-4


def test_scorecam_matches_its_algorithm_on_resnet18():
    torch.manual_seed(0)
    net = tv.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 96, 96)  # layer4 is 3x3: 512 masked forwards stay fast
    res = cam(net, x, layers="layer4", method="scorecam")
    kept = []
    handle = net.layer4.register_forward_hook(lambda m, i, o: kept.append(o))
    with torch.no_grad():
        target = int(net(x).argmax())
        handle.remove()
        up = F.interpolate(kept[0], size=(96, 96), mode="bilinear", align_corners=True)[0]
        scores = []
        for k in range(up.shape[0]):  # Wang et al. 2020, Algorithm 1: one forward per channel
            span = up[k].max() - up[k].min()
            mask = (up[k] - up[k].min()) / span if span > 0 else torch.zeros_like(up[k])
            scores.append(net(x * mask)[0, target].item())
    w = np.exp(np.array(scores) - max(scores))
    want = weighted((w / w.sum())[None], kept[0].double().numpy())
    assert np.abs(minmax(res.raw["layer4"].numpy()) - minmax(want)).max() < 1e-4
    # the map's own pass, one per distinct mask (masks are affine in the activation, so channels equal
    # after min-max at 3x3 share one), one zero image for all the constant channels
    a = kept[0][0].flatten(1)
    lo, span = a.amin(1, keepdim=True), a.amax(1, keepdim=True) - a.amin(1, keepdim=True)
    live = span[:, 0] > 0
    distinct = len(torch.unique((a[live] - lo[live]) / span[live], dim=0))
    assert res.masked == distinct + int(not live.all())
    assert no_hooks(net)
