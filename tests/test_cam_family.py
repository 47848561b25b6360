"""The rest of the CAM family side by side with pytorch-grad-cam on torchvision models, and hand-worked cases.

Models: torchvision ``resnet18``, ``resnet50``, ``vgg11``, ``densenet121`` with ``weights=None`` under a
fixed seed, ``eval()``. pytorch-grad-cam's maps are taken at the layer's resolution (its resize skipped) and
both sides min-max normalised per image there (``minmax``: its own ``x / (max + 1e-7)`` is undone by it), then
compared within 1e-5 (1e-4 for the methods that divide by a small score or run a kernel PCA in float32).
Where pytorch-grad-cam departs from the published method, a tiny case worked by hand shows it.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import no_hooks
from torch import nn

from hookscope import HookscopeError
from hookscope.analysis.cam import cam
from hookscope.analysis.cam._fullgrad import bias_of

tv = pytest.importorskip("torchvision")
pgc = pytest.importorskip("pytorch_grad_cam")
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget  # noqa: E402

pytestmark = pytest.mark.slow


def minmax(m):
    m = torch.as_tensor(np.asarray(m), dtype=torch.float64)
    flat = m.flatten(1)
    lo, span = flat.amin(1), flat.amax(1) - flat.amin(1)
    shape = (-1, *([1] * (m.ndim - 1)))
    return (m - lo.view(shape)) / torch.where(span > 0, span, torch.ones_like(span)).view(shape)


def module(net, name):
    return dict(net.named_modules())[name]


def build(name, size, batch=2, seed=0):
    torch.manual_seed(seed)
    net = getattr(tv.models, name)(weights=None).eval()
    return net, torch.randn(batch, 3, size, size)


def peer(cls, net, layer, x, targets, **make):
    """pytorch-grad-cam's maps at the layer's resolution (its cv2 resize skipped), as its users call it."""
    with cls(model=net, target_layers=[module(net, layer)], **make) as c:
        c.get_target_width_height = lambda _x: None
        return c(input_tensor=x, targets=[ClassifierOutputTarget(int(t)) for t in targets])


CASES = [("resnet18", "layer4", 96), ("resnet18", "layer3", 64), ("resnet50", "layer4", 64),
         ("vgg11", "features.15", 64), ("densenet121", "features.denseblock3", 64)]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(map(str, c)) for c in CASES])
def case(request):
    name, layer, size = request.param
    net, x = build(name, size)
    targets = net(x).argmax(1).tolist()
    return net, layer, x, [targets[0], (targets[1] + 7) % 1000]  # the predicted class, and another


@pytest.mark.parametrize("method, cls", [("gradcamelementwise", "GradCAMElementWise"), ("fem", "FEM"),
                                         ("gradcam", "GradCAM"), ("hirescam", "HiResCAM")])
def test_method_equals_pytorch_grad_cam(case, method, cls):
    net, layer, x, targets = case
    ours = cam(net, x, layers=layer, method=method, target=targets)
    theirs = peer(getattr(pgc, cls), net, layer, x, targets)
    assert (minmax(ours.raw[layer]) - minmax(theirs)).abs().max() < 1e-5
    assert no_hooks(net)


def _either_sign(ours, projection_maps):
    """Max difference from relu(+P) or relu(-P), per image: an SVD's (and kernel PCA's) sign is arbitrary."""
    P = torch.as_tensor(np.asarray(projection_maps), dtype=torch.float64)
    o = minmax(ours)
    return max(min(float((o[b] - minmax(P[b:b + 1].clamp(min=0))[0]).abs().max()),
                   float((o[b] - minmax((-P[b:b + 1]).clamp(min=0))[0]).abs().max())) for b in range(len(o)))


def _projections(cls, net, layer, x, targets, **make):
    """pytorch-grad-cam's projections before its ReLU: the output of its get_cam_image, kept."""
    kept = []
    with cls(model=net, target_layers=[module(net, layer)], **make) as c:
        inner = c.get_cam_image
        c.get_cam_image = lambda *a, **k: kept.append(inner(*a, **k)) or kept[-1]
        c.get_target_width_height = lambda _x: None
        c(input_tensor=x, targets=[ClassifierOutputTarget(int(t)) for t in targets])
    return kept[0]


def test_eigengradcam_equals_pytorch_grad_cam_up_to_the_sign_it_fixes(case):
    net, layer, x, targets = case
    ours = cam(net, x, layers=layer, method="eigengradcam", target=targets)
    assert _either_sign(ours.raw[layer], _projections(pgc.EigenGradCAM, net, layer, x, targets)) < 1e-5


@pytest.mark.parametrize("kernel, gamma", [("sigmoid", None), ("rbf", None), ("poly", 1e-3), ("linear", None), ("cosine", None)])
def test_kpcacam_equals_pytorch_grad_cam_up_to_the_sign_it_fixes(kernel, gamma):
    net, x = build("resnet18", 96)
    targets = net(x).argmax(1).tolist()
    ours = cam(net, x, layers="layer4", method="kpcacam", kernel=kernel, gamma=gamma)
    theirs = _projections(pgc.KPCA_CAM, net, "layer4", x, targets, kernel=kernel, gamma=gamma)
    assert _either_sign(ours.raw["layer4"], theirs) < 1e-4  # scikit-learn's KernelPCA works in float32 here


def test_the_sign_of_eigen_and_kpca_maps_follows_the_channels_sum():
    # two channels equal up to scale: the first component is that pattern, whichever sign LAPACK returns
    A = torch.tensor([0.0, 1.0, 3.0]).view(1, 1, 1, 3) * torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    from hookscope.analysis.cam._formulas import kpca_map, projection
    # centred channel 0: [-4/3, -1/3, 5/3], channel 1 twice that; v = (1, 2)/sqrt(5); X v = sqrt(5) * [-4/3, -1/3, 5/3]
    want = 5 ** 0.5 * torch.tensor([-4 / 3, -1 / 3, 5 / 3])
    torch.testing.assert_close(projection(A)[0, 0], want)
    torch.testing.assert_close(projection(-A)[0, 0], want * -1 * -1 * -1)  # -A: its sum is the pattern's negative
    torch.testing.assert_close(kpca_map(A, "linear")[0, 0], want.clamp(min=0))


def test_shapleycam_equals_pytorch_grad_cam_where_the_hessian_is_not_zero(case):
    net, layer, x, targets = case
    # a softmax score: curved in the activations, so H A is not zero (on a logit of a ReLU net it is)
    ours = cam(net, x, layers=layer, method="shapleycam", target=lambda o: torch.softmax(o, 1)[:, targets[0]])
    plain = cam(net, x, layers=layer, method="gradcam", target=lambda o: torch.softmax(o, 1)[:, targets[0]])
    with pgc.ShapleyCAM(model=net, target_layers=[module(net, layer)]) as c:
        c.get_target_width_height = lambda _x: None
        theirs = c(input_tensor=x, targets=[lambda o: torch.softmax(o, -1)[targets[0]]] * 2)
    assert (minmax(ours.raw[layer]) - minmax(theirs)).abs().max() < 1e-4
    assert (minmax(ours.raw[layer]) - minmax(plain.raw[layer])).abs().max() > 1e-3  # not Grad-CAM's
    assert no_hooks(net)


def test_shapleycam_is_gradcam_on_the_logit_of_a_relu_network():
    net, x = build("resnet18", 64)
    a, b = (cam(net, x, layers="layer3", method=m, target=[1, 2]) for m in ("shapleycam", "gradcam"))
    assert (a.raw["layer3"] - b.raw["layer3"]).abs().max() < 1e-6


@pytest.mark.parametrize("comparison, alpha", [(None, 1.0), ([1], 0.6), ([2, 5], 1.0)])
def test_finercam_equals_pytorch_grad_cam(case, comparison, alpha):
    net, layer, x, _ = case
    ours = cam(net, x, layers=layer, method="finercam", comparison=comparison, alpha=alpha)
    with pgc.FinerCAM(model=net, target_layers=[module(net, layer)]) as c:
        c.base_cam.get_target_width_height = lambda _x: None
        theirs = c(input_tensor=x, alpha=alpha, comparison_categories=comparison)
    assert (minmax(ours.raw[layer]) - minmax(theirs)).abs().max() < 1e-4
    assert no_hooks(net)


def test_finercams_score_by_hand():
    from hookscope.analysis.cam._second import finer_score
    y = torch.tensor([[3.0, 2.5, 0.0, 2.0]])  # target 0; nearest: class 1 (0.5 away), class 3 (1.0), class 2
    p = torch.softmax(y, 1)[0]
    want = (p[1] * (3 - 0.5 * 2.5) + p[3] * (3 - 0.5 * 2.0)) / (p[1] + p[3])
    torch.testing.assert_close(finer_score(y, torch.tensor([0]), [1, 2], 0.5), want.view(1))


@pytest.mark.parametrize("name, layer, size", [("resnet18", "layer4", 64), ("vgg11", "features.20", 64)])
def test_ablationcam_equals_pytorch_grad_cam_on_layers_after_a_relu(name, layer, size):
    net, x = build(name, size)
    targets = net(x).argmax(1).tolist()
    ours = cam(net, x, layers=layer, method="ablationcam", target=targets)
    theirs = peer(pgc.AblationCAM, net, layer, x, targets)
    assert (minmax(ours.raw[layer]) - minmax(theirs)).abs().max() < 1e-4
    assert ours.masked == int((ours_live := (module_output(net, layer, x).flatten(2).abs().amax(2) > 0)).sum())
    assert no_hooks(net) and ours_live.any()


def module_output(net, layer, x):
    kept = []
    h = module(net, layer).register_forward_hook(lambda m, i, o: kept.append(o.detach().clone()))
    with torch.no_grad():
        net(x)
    h.remove()
    return kept[0]


class Negative(nn.Module):
    """conv (values of both signs, as a batch norm's output) -> pool -> Linear: linear after the layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))

    def forward(self, x):
        return self.head(self.conv(x))


def test_ablationcam_zeroes_a_channel_as_the_paper_and_its_weights_do_not_depend_on_the_batch_size():
    net, x = Negative().eval(), torch.randn(1, 1, 8, 8)
    # by hand: w_k = (y - y_k) / y with channel k of the conv's output set to zero
    with torch.no_grad():
        A = net.conv(x)
        y = net.head(A)[0, 2]
        w = []
        for k in range(6):
            Ak = A.clone()
            Ak[:, k] = 0
            w.append(float((y - net.head(Ak)[0, 2]) / y))
        want = F.relu((torch.tensor(w).view(1, 6, 1, 1) * A).sum(1))
    for bs in (1, 4, 32):
        got = cam(net, x, layers="conv", method="ablationcam", target=2, batch_size=bs)
        torch.testing.assert_close(got.raw["conv"], want, rtol=1e-5, atol=1e-6)
    # pytorch-grad-cam sets an ablated channel of a layer with negative values to min - 1e7, and lowers that
    # min with every row of a batch it has ablated already: its weights change with its batch size
    one, four = (peer(pgc.AblationCAM, net, "conv", x, [2], batch_size=bs) for bs in (1, 4))
    assert (minmax(one) - minmax(four)).abs().max() > 1e-3


def test_ablationcam_ratio_ablates_only_the_channels_it_chooses():
    net, x = build("resnet18", 64, batch=1)
    full = cam(net, x, layers="layer4", method="ablationcam", target=3)
    part = cam(net, x, layers="layer4", method="ablationcam", target=3, ratio=0.25)
    A = module_output(net, "layer4", x)[0]
    live = int((A.flatten(1).abs().amax(1) > 0).sum())  # a channel that is all zero is not run: nothing to ablate
    assert full.masked == live < 512 and part.masked == 128
    from hookscope.analysis.cam._ablation import chosen_channels
    chosen = chosen_channels(A, 0.25)
    assert len(chosen) == 128 and bool((A[chosen].flatten(1).abs().amax(1) > 0).all())
    assert no_hooks(net)


# --- FullGrad ------------------------------------------------------------------------------------------
def _fullgrad_reference(net, x, target):
    """The authors' code's formula, written here: psi = |.| min-max per image over channels and positions,
    bilinear upsampling with align_corners=True, the input term plus every conv / batch norm's bias term."""
    for m in net.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False  # outputs read by reference below
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)
              or (isinstance(m, nn.Conv2d) and m.bias is not None)]
    outs = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: outs.__setitem__(n, o)) for n, m in layers]
    xi = x.clone().requires_grad_()
    logits = net(xi)
    for h in hooks:
        h.remove()
    score = logits[torch.arange(len(x)), target]
    grads = torch.autograd.grad(score.sum(), [xi, *[outs[n] for n, _ in layers]])

    def psi(t):
        t = t.abs().double()
        flat = t.flatten(1)
        t = t - flat.amin(1).view(-1, 1, 1, 1)
        top = t.flatten(1).amax(1).view(-1, 1, 1, 1)
        return t / torch.where(top > 0, top, torch.ones_like(top))  # a term that is zero everywhere adds nothing

    total = psi(grads[0] * x).sum(1)
    parts = [(grads[0] * x).sum((1, 2, 3)).double()]
    for (n, m), g in zip(layers, grads[1:]):
        b = bias_of(n, m).view(1, -1, 1, 1)
        parts.append((g * b).sum((1, 2, 3)).double())
        up = F.interpolate(psi(g * b), size=x.shape[2:], mode="bilinear", align_corners=True)
        total = total + up.sum(1)
    return total, score.detach().double(), sum(parts)


@pytest.mark.parametrize("name", ["resnet18", "vgg11"])
def test_fullgrad_equals_the_papers_formula_and_its_terms_add_up_to_the_score(name):
    net, x = build(name, 64)
    targets = net(x).argmax(1)
    ours = cam(net, x, method="fullgrad")
    want, score, parts = _fullgrad_reference(net, x, targets)
    assert (ours.maps.double() - minmax(want)).abs().max() < 1e-5
    # completeness (the paper's eq. 2): input term + every bias term + the head's bias = the logit
    head = net.fc if name == "resnet18" else net.classifier[-1]
    torch.testing.assert_close(parts + head.bias.detach()[targets].double(), score, rtol=1e-4, atol=1e-4)
    assert "<input>" in ours.raw and len(ours.layers) == len(ours.raw) - 1
    assert no_hooks(net)


class Biased(nn.Module):
    """conv 1 x 1 (weights 1 and -5, biases 1 and 10) -> ReLU -> Linear of ones: FullGrad worked by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.head = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(6, 1, bias=False))
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, -5.0]).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor([1.0, 10.0]))
            self.head[2].weight.fill_(1.0)

    def forward(self, x):
        return self.head(self.conv(x))


def test_fullgrad_by_hand_and_where_pytorch_grad_cam_normalises_per_channel():
    # x = [-2, 1, 3]: pre-activations [-1, 2, 4] and [20, 5, -5], so dS/dA = [0, 1, 1] and [1, 1, 0];
    # |b * G| = [0, 1, 1] and [10, 10, 0]; the paper rescales the layer as a whole: /10 -> [0, .1, .1], [1, 1, 0],
    # summed [1, 1.1, .1]; dS/dx = [0,1,1] - 5 [1,1,0] = [-5, -4, 1], |x dS/dx| = [10, 4, 3] -> [1, 1/7, 0].
    net, x = Biased().eval(), torch.tensor([-2.0, 1.0, 3.0]).view(1, 1, 1, 3)
    ours = cam(net, x, method="fullgrad", target=0)
    torch.testing.assert_close(ours.raw["conv"][0, 0], torch.tensor([1.0, 1.1, 0.1]))
    torch.testing.assert_close(ours.raw["<input>"][0, 0], torch.tensor([1.0, 1 / 7, 0.0]))
    total = torch.tensor([2.0, 1.1 + 1 / 7, 0.1])
    torch.testing.assert_close(ours.maps[0, 0], (total - 0.1) / 1.9)
    # pytorch-grad-cam rescales each channel on its own: [0, 1, 1] + [1, 1, 0], so the channel whose bias adds
    # ten times as much counts no more than the other; its map peaks at the middle pixel, the paper's at the first
    with pgc.FullGrad(model=net, target_layers=[]) as c:
        theirs = c(input_tensor=x, targets=[ClassifierOutputTarget(0)])
    np.testing.assert_allclose(theirs[0, 0], [0.875, 1.0, 0.0], atol=1e-5)
    assert no_hooks(net)


def test_randomcam_is_the_seeded_weights_on_the_channels():
    net, x = build("resnet18", 64)
    got = cam(net, x, layers="layer4", method="randomcam", seed=5)
    w = torch.rand(512, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2 - 1
    A = module_output(net, "layer4", x).double()
    torch.testing.assert_close(got.raw["layer4"].double(), (w.view(1, -1, 1, 1) * A).sum(1).clamp(min=0),
                               rtol=1e-5, atol=1e-5)
    assert not torch.equal(got.raw["layer4"], cam(net, x, layers="layer4", method="randomcam", seed=6).raw["layer4"])


# --- bad input: one line each ------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"method": "kpcacam", "kernel": "gaussian"}, "kernel='gaussian' is not a kernel of kpcacam."),
    ({"method": "finercam", "comparison": []}, "comparison=[] names no class to compare the target with"),
    ({"method": "finercam", "comparison": [0]}, "comparison=[0] must be ranks of the classes nearest the target"),
    ({"method": "finercam", "comparison": [9]}, "comparison=[9] asks for the class ranked 9 nearest the target"),
    ({"method": "ablationcam", "ratio": 0}, "ratio=0 is outside (0, 1]"),
    ({"method": "ablationcam", "ratio": 1.5}, "ratio=1.5 is outside (0, 1]"),
    ({"method": "kpcacam", "degree": 0}, "degree=0 must be a positive int"),
    ({"method": "fullgrad", "layers": "conv"}, "layers= is not a setting of fullgrad"),
    ({"method": "finercam", "target": lambda o: o[:, 0]}, "finercam compares the target class"),
])
def test_bad_settings_are_one_line(kw, message):
    net, x = Negative().eval(), torch.randn(1, 1, 8, 8)
    kw = {"layers": "conv", **kw} if kw["method"] != "fullgrad" else kw
    with pytest.raises(HookscopeError) as e:
        cam(net, x, **kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert no_hooks(net)
