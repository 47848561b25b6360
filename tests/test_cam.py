"""Class activation maps (hookscope.analysis.cam): hand-computed maps, batch = per image, no side effects."""

import doctest

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import FakeModelOutput, no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError
from hookscope.errors import ForwardError
from hookscope.analysis.cam import _api, _formulas, _result, _scorecam, _shape
from hookscope.analysis.cam import METHODS, cam
from hookscope.zoo import TinyResNet

GRADIENT = ("gradcam", "gradcam++", "xgradcam", "hirescam", "layercam")


class GapNet(nn.Module):
    """conv 1x1 (weights +1, -1) -> ReLU -> global average pool -> Linear(2, 3) with hand-set rows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1, bias=False)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2, 3, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
            self.fc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]]))

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.relu(self.conv(x))), 1))


class FlatNet(nn.Module):
    """conv 1x1 (A0 = x, A1 = 1 - x) -> flatten -> Linear(8, 1): the gradient varies over space."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 1)
        self.fc = nn.Linear(8, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.0, 1.0]))
            self.fc.weight.copy_(torch.tensor([[1.0, 0.0, 2.0, -1.0, 0.5, 1.0, -1.0, 0.0]]))

    def forward(self, x):
        return self.fc(torch.flatten(self.conv(x), 1))


class ConvInplace(nn.Module):
    """A target conv followed by ReLU(inplace=True), then GAP and a head."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(3, channels, 3, padding=1)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.fc = nn.Linear(channels, 4)

    def forward(self, x):
        return self.fc(self.act(self.conv(self.conv0(x))).mean((2, 3)))


X_HAND = torch.tensor([[[[1.0, -2.0], [3.0, 0.0]]]])


# --- maps worked out by hand ---------------------------------------------------------------------
def test_cam_and_gradcam_by_hand_on_a_gap_linear_model():
    net = GapNet().eval()
    # A0 = relu(x) = [[1, 0], [3, 0]], A1 = relu(-x) = [[0, 2], [0, 0]]; logits (1, 0.5, 1.5) -> class 2
    res = cam(net, X_HAND, layers="relu", method="cam")
    assert res.targets.tolist() == [2] and torch.allclose(res.scores, torch.tensor([1.5]))
    assert torch.allclose(res.raw["relu"], torch.tensor([[[2.0, -2.0], [6.0, 0.0]]]))  # 2 A0 - A1
    assert torch.allclose(res.maps, torch.tensor([[[0.5, 0.0], [1.0, 0.25]]]))  # (m + 2) / 8
    # d score / d A = W[2] / 4 = (0.5, -0.25) everywhere: relu(0.5 A0 - 0.25 A1)
    res = cam(net, X_HAND, layers="relu", method="gradcam")
    assert torch.allclose(res.raw["relu"], torch.tensor([[[0.5, 0.0], [1.5, 0.0]]]))
    assert torch.allclose(res.maps, torch.tensor([[[1 / 3, 0.0], [1.0, 0.0]]]))
    # class 1 reads channel 1 only
    res = cam(net, X_HAND, layers="relu", method="cam", target=1)
    assert torch.allclose(res.raw["relu"], torch.tensor([[[0.0, 2.0], [0.0, 0.0]]]))
    assert no_hooks(net)


@pytest.mark.parametrize("method, expected", [
    ("gradcam", [[0.5, 0.875], [0.125, 0.0]]),   # w = mean g = (0.5, 0.125)
    ("gradcam++", [[7 / 12, 9 / 12], [5 / 12, 3 / 12]]),  # w = (7/12, 5/12), worked out pixel by pixel
    ("xgradcam", [[1.0, 3.0], [0.0, 0.0]]),      # w = (2/2, -2/2): relu(A0 - A1)
    ("hirescam", [[1.0, 0.0], [0.0, 1.0]]),      # relu(sum g * A) = relu([[1, -1], [-1, 1]])
    ("layercam", [[1.0, 0.0], [0.0, 0.0]]),      # relu(sum relu(g) * A) = relu([[1, -1], [0, 0]])
])
def test_gradient_methods_by_hand(method, expected):
    net = FlatNet().eval()
    x = torch.tensor([[[[1.0, 2.0], [0.0, -1.0]]]])  # A0 = x, A1 = 1 - x; g = fc row viewed 2x2x2
    res = cam(net, x, layers="conv", method=method)
    assert torch.allclose(res.raw["conv"], torch.tensor([expected]), atol=1e-6)
    assert res.targets.tolist() == [0] and res.layers == ["conv"] and res.method == method
    assert no_hooks(net)


def test_eigencam_matches_an_independent_svd():
    torch.manual_seed(0)
    A = torch.rand(3, 5, 4, 3)
    got = _formulas.eigen_map(A)
    for b in range(3):
        X = A[b].reshape(5, -1).T.double().numpy()
        X = X - X.mean(0)
        v = np.linalg.svd(X)[2][0]
        v = -v if v.sum() < 0 else v
        want = np.maximum(X @ v, 0).reshape(4, 3)
        assert np.allclose(got[b].numpy(), want, atol=1e-5)
    net = TinyResNet().eval()
    res = cam(net, torch.randn(2, 3, 32, 32), layers="layer2", method="eigencam")
    assert res.maps.shape == (2, 32, 32) and float(res.maps.amax()) == 1.0
    assert no_hooks(net)


def test_normalisation_and_upsampling_of_maps():
    net = TinyResNet().eval()
    x = torch.randn(3, 3, 32, 32)
    res = cam(net, x, layers="layer2")
    up = F.interpolate(res.raw["layer2"][:, None], size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
    lo = up.flatten(1).min(1).values[:, None, None]
    hi = up.flatten(1).max(1).values[:, None, None]
    assert torch.allclose(res.maps, (up - lo) / (hi - lo), atol=1e-6)
    # several layers: each upsampled and normalised, fused by mean (or max), normalised again
    res2 = cam(net, x, layers=["layer1", "layer2"], fuse="max")
    parts = []
    for name in ("layer1", "layer2"):
        u = F.interpolate(res2.raw[name][:, None], size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
        parts.append((u - u.flatten(1).min(1).values[:, None, None])
                     / (u.flatten(1).max(1).values - u.flatten(1).min(1).values)[:, None, None])
    fused = torch.maximum(parts[0], parts[1])
    lo, hi = fused.flatten(1).min(1).values[:, None, None], fused.flatten(1).max(1).values[:, None, None]
    assert res2.layers == ["layer1", "layer2"] and torch.allclose(res2.maps, (fused - lo) / (hi - lo), atol=1e-6)
    # a constant map becomes all zeros
    flat = cam(GapNet().eval(), torch.zeros(1, 1, 2, 2), layers="relu", method="cam", target=0)
    assert torch.equal(flat.maps, torch.zeros(1, 2, 2))
    assert no_hooks(net)


def at(method, layer="layer2"):
    """layers= for a method that explains one layer; FullGrad takes every biased layer and refuses it."""
    return {} if method == "fullgrad" else {"layers": layer}


# --- batch = per image ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_batch_result_equals_per_image_results(method):
    net = TinyResNet().eval()
    torch.manual_seed(1)
    x = torch.randn(3, 3, 16, 16)
    targets = [1, 7, 3]
    batch = cam(net, x, method=method, target=targets, **at(method))
    for i in range(3):
        one = cam(net, x[i:i + 1], method=method, target=targets[i], **at(method))
        assert torch.allclose(batch.maps[i], one.maps[0], atol=1e-5), method
        for n in batch.raw:
            assert torch.allclose(batch.raw[n][i], one.raw[n][0], atol=1e-5, rtol=1e-4)
        assert torch.allclose(batch.scores[i], one.scores[0], atol=1e-5)
    assert batch.targets.tolist() == targets
    assert no_hooks(net)


# --- side-effect freedom -------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_no_grad_written_no_hook_left_modes_and_outputs_unchanged(method):
    net = TinyResNet().eval()
    net.fc.train()  # a mixed set of flags must come back exactly as it was
    flags = {n: m.training for n, m in net.named_modules()}
    x = torch.randn(2, 3, 16, 16)
    before = net(x).detach()
    res = cam(net, x, method=method, **at(method))
    assert all(p.grad is None for p in net.parameters())
    assert all(p.requires_grad for p in net.parameters())
    assert {n: m.training for n, m in net.named_modules()} == flags
    assert not x.requires_grad and x.grad is None
    assert torch.equal(net(x), before) and no_hooks(net)
    assert torch.equal(res.targets, before.argmax(1))
    assert torch.allclose(res.scores, before.gather(1, res.targets[:, None])[:, 0])
    assert not res.scores.requires_grad and not res.maps.requires_grad


def test_works_under_no_grad_inference_mode_and_on_a_frozen_model():
    net = TinyResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    ref = cam(net, x, layers="layer2.0.bn2", method="gradcam++")
    with torch.no_grad():
        assert torch.allclose(cam(net, x, layers="layer2.0.bn2", method="gradcam++").maps, ref.maps)
    with torch.inference_mode():
        xi = x.clone()
        got = cam(net, xi, layers="layer2.0.bn2", method="gradcam++")
    assert torch.allclose(got.maps, ref.maps)
    for p in net.parameters():
        p.requires_grad_(False)
    frozen = cam(net, x, layers="layer2.0.bn2", method="gradcam++")
    assert torch.allclose(frozen.maps, ref.maps) and torch.allclose(frozen.raw["layer2.0.bn2"], ref.raw["layer2.0.bn2"])
    assert all(p.grad is None and not p.requires_grad for p in net.parameters()) and no_hooks(net)


def _reference_gradcam(model, module, x, cls=None):
    """Grad-CAM computed independently: a hand-written hook that keeps the output and returns a clone."""
    kept = []

    def hook(m, i, o):
        kept.append(o)
        return o.clone()

    h = module.register_forward_hook(hook)
    try:
        logits = model(x)
    finally:
        h.remove()
    cls = logits.argmax(1) if cls is None else cls
    (g,) = torch.autograd.grad(logits.gather(1, cls[:, None]).sum(), kept[0])
    m = (g.mean((2, 3))[:, :, None, None] * kept[0]).sum(1).relu().detach()
    m = F.interpolate(m[:, None], size=x.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    lo, hi = m.flatten(1).min(1).values[:, None, None], m.flatten(1).max(1).values[:, None, None]
    return (m - lo) / (hi - lo)


def test_inplace_relu_after_the_target_layer():
    net = ConvInplace().eval()
    x = torch.randn(2, 3, 8, 8)
    res = cam(net, x, layers="conv")
    assert (cam(net, x, layers="conv", method="eigencam").raw["conv"] >= 0).all()
    assert torch.allclose(res.maps, _reference_gradcam(net, net.conv, x), atol=1e-5)
    # found automatically: the last conv is rewritten in place, so it is run again with a copy
    auto = cam(net, x)
    assert auto.layers == ["conv"] and auto.forwards == 2 and torch.allclose(auto.maps, res.maps, atol=1e-6)
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())


def test_auto_layer_is_the_last_conv_and_cam_finds_the_pooled_layer():
    net = TinyResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    auto = cam(net, x)
    assert auto.layers == ["layer2.0.conv2"] and auto.forwards == 1
    assert torch.allclose(auto.maps, cam(net, x, layers="layer2.0.conv2").maps, atol=1e-6)
    c = cam(net, x, method="cam")
    assert c.layers == ["layer2"]
    # for a GAP + linear head, CAM = (h w) x Grad-CAM before its ReLU, so after normalisation they agree
    g = cam(net, x, layers="layer2", method="hirescam")
    pos = c.raw["layer2"].clamp(min=0)
    assert torch.allclose(pos / pos.amax((1, 2), keepdim=True), g.raw["layer2"] / g.raw["layer2"].amax((1, 2), keepdim=True), atol=1e-5)
    assert no_hooks(net)


@pytest.mark.slow
def test_gradcam_matches_reference_on_resnet18_including_an_inplace_target():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = tv.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 224, 224)
    res = cam(net, x, layers="layer4")
    assert (res.maps - _reference_gradcam(net, net.layer4, x)).abs().max() < 1e-5
    # layer4.1.bn2 is followed by `out += identity` and an in-place ReLU
    x = torch.randn(2, 3, 64, 64)
    res = cam(net, x, layers="layer4.1.bn2")
    assert (res.maps - _reference_gradcam(net, net.layer4[1].bn2, x)).abs().max() < 1e-5
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())


# --- targets and outputs -------------------------------------------------------------------------
def test_callable_target_structured_output_and_reshape():
    net = TinyResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    by_index = cam(net, x, layers="layer2", target=3)
    by_fn = cam(net, x, layers="layer2", target=lambda logits: logits[:, 3])
    assert by_fn.targets is None and torch.allclose(by_fn.maps, by_index.maps)
    by_numpy = cam(net, x, layers="layer2", target=np.array([3, 3]))
    assert by_numpy.targets.tolist() == [3, 3] and torch.equal(by_numpy.maps, by_index.maps)

    class Dicty(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):
            return FakeModelOutput(logits=self.net(x), hidden=x)

    wrapped = Dicty().eval()
    by_default = cam(wrapped, x, layers="net.layer2", target=3)  # a ModelOutput's .logits, as HF users write
    got = cam(wrapped, x, layers="net.layer2", target=3, output=lambda o: o.logits)
    assert torch.allclose(got.maps, by_index.maps) and torch.equal(by_default.maps, got.maps) and no_hooks(wrapped)

    class Tokens(nn.Module):  # a ViT-like layer: B x tokens x channels
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, 8, 4, stride=4)
            self.block = nn.Linear(8, 8)
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            t = self.embed(x).flatten(2).transpose(1, 2)
            return self.head(self.block(t).relu().mean(1))

    vit = Tokens().eval()
    auto = cam(vit, x, layers="block")  # the Conv2d's 4 x 4 grid of 8 channels, flattened: certain, read by itself
    assert auto.layouts["block"] == "tokens(k=0, 4x4)" and no_hooks(vit)
    res = cam(vit, x, layers="block", reshape=lambda t: t.transpose(1, 2).reshape(t.shape[0], -1, 4, 4))
    assert torch.equal(auto.maps, res.maps)
    # reference: Grad-CAM on the same tokens laid out as a 4 x 4 grid
    kept = []
    h = vit.block.register_forward_hook(lambda m, i, o: kept.append(o))
    logits = vit(x)
    h.remove()
    (g,) = torch.autograd.grad(logits.gather(1, res.targets[:, None]).sum(), kept[0])
    A, G = (t.detach().transpose(1, 2).reshape(2, 8, 4, 4) for t in (kept[0], g))
    assert torch.allclose(res.raw["block"], (G.mean((2, 3))[:, :, None, None] * A).sum(1).relu(), atol=1e-6)


# --- Score-CAM -----------------------------------------------------------------------------------
class DeadChannels(nn.Module):
    """Channels 0-2 are dead after the ReLU (constant zero); channel 4 = 2 x channel 3."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8, 4)
        with torch.no_grad():
            self.conv.bias[:3] = -100.0
            self.conv.weight[4] = 2 * self.conv.weight[3]
            self.conv.bias[4] = 2 * self.conv.bias[3]

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).mean((2, 3)))


def test_scorecam_sharing_masks_gives_the_map_of_one_forward_per_channel():
    net = DeadChannels().eval()
    x = torch.randn(2, 3, 8, 8)
    res = cam(net, x, layers="relu", method="scorecam", target=[1, 2], batch_size=3)
    # independently: one forward per (image, channel), masks upsampled then min-max normalised
    with torch.no_grad():
        A = net.relu(net.conv(x))
        for b, c in enumerate([1, 2]):
            scores = []
            for k in range(8):
                up = F.interpolate(A[b, k][None, None], size=(8, 8), mode="bilinear", align_corners=True)[0, 0]
                span = up.max() - up.min()
                mask = (up - up.min()) / span if span > 0 else torch.zeros_like(up)
                scores.append(net(x[b:b + 1] * mask)[0, c])
            w = torch.softmax(torch.stack(scores), 0)
            want = (w[:, None, None] * A[b]).sum(0).relu()
            assert torch.allclose(res.raw["relu"][b], want, atol=1e-5)
    # 4 distinct live masks per image + 1 zero image shared by the 6 dead channels; model calls:
    # 1 plain forward, 8 masked inputs in batches of 3, 1 zero image
    assert res.masked == 2 * 4 + 1 and res.forwards == 1 + 3 + 1
    assert no_hooks(net)


class ViewsItsInput(DeadChannels):
    """``.view()`` of the input: fails on the channels-last batches Score-CAM prefers on the CPU."""

    def forward(self, x):
        x = x.view(x.shape[0], -1).view(x.shape)
        return super().forward(x)


def test_scorecam_falls_back_to_contiguous_inputs_for_a_model_that_needs_them():
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(RuntimeError, match="view"):
        ViewsItsInput()(x.contiguous(memory_format=torch.channels_last))
    plain = cam(DeadChannels().eval(), x, layers="relu", method="scorecam", target=[1, 2], batch_size=3)
    viewing = cam(ViewsItsInput().eval(), x, layers="relu", method="scorecam", target=[1, 2], batch_size=3)
    assert torch.allclose(viewing.raw["relu"], plain.raw["relu"], atol=1e-6)
    # the same masked inputs; one more model call: the channels-last batch that failed
    assert viewing.masked == plain.masked and viewing.forwards == plain.forwards + 1


# --- bad input -----------------------------------------------------------------------------------
class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.const = Const()
        self.side = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        self.side(x)  # computed, never used
        return self.fc((self.conv(x) + self.const(x)).mean((2, 3)))


class Const(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.randn(1, 4, 6, 6))

    def forward(self, x):
        return self.p.expand(x.shape[0], -1, -1, -1)


@pytest.mark.parametrize("kwargs, match", [
    ({"layers": "conv", "target": 3}, r"target class 3 \(sample 0\) is out of range: the model has 3 classes \(0 to 2\)"),
    ({"layers": "conv", "target": [0, -1]}, r"target class -1 \(sample 1\) is out of range"),
    ({"layers": "conv", "target": [0]}, r"1 class indices for a batch of 2"),
    ({"layers": "conv", "target": "cat"}, r"target='cat' is not a class index"),
    ({"layers": "conv", "target": [0.5, 1.0]}, r"integer class indices, got dtype torch.float32"),
    ({"layers": "const"}, r"'const'.*does not depend on the input"),
    ({"layers": "side"}, r"'side'.*does not reach the target score"),
    ({"layers": "conv", "method": "gradcamm"}, r"'gradcamm' is not a CAM method\. Did you mean 'gradcam'"),
    ({"layers": "conv", "method": "cam"}, r"head 'fc' to read the global average of layer 'conv'"),
    ({"layers": "conv", "method": "cam", "target": lambda o: o[:, 0]}, r"needs class-index targets"),
    ({"layers": "convv"}, r"Did you mean 'conv'"),
    ({"layers": "conv", "fuse": "sum"}, r"fuse='sum'"),
    ({"layers": "conv", "target": lambda o: o}, r"one score per sample, shape \(2,\)"),
])
def test_bad_input_is_one_line_naming_it_and_leaves_no_hook(kwargs, match):
    net = Branchy().eval()
    with pytest.raises(HookscopeError, match=match) as e:
        cam(net, torch.randn(2, 3, 6, 6), **kwargs)
    assert "\n" not in str(e.value)
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())


def test_cam_refuses_models_without_a_gap_head_and_torchscript():
    flat = FlatNet().eval()
    with pytest.raises(HookscopeError, match="not the spatial mean of any layer"):
        cam(flat, torch.randn(1, 1, 2, 2), method="cam")
    assert no_hooks(flat)
    with pytest.raises(HookscopeError, match="TorchScript"):
        cam(torch.jit.script(GapNet().eval()), X_HAND)


class Noisy(TinyResNet):
    """TinyResNet with dropout before its head and an instance norm that tracks running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.inorm = nn.InstanceNorm2d(32, track_running_stats=True)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = self.inorm(self.layer2(self.down(self.layer1(self.stem(x)))))
        return self.fc(self.drop(torch.flatten(self.pool(x), 1)))


@pytest.mark.parametrize("method", ["gradcam", "scorecam", "eigencam"])
def test_a_model_in_training_mode_is_explained_in_eval_mode_and_left_as_it_was(method):
    torch.manual_seed(0)
    net = Noisy()  # training mode: batch norm and instance norm would update their statistics, dropout draw
    x = torch.randn(2, 3, 16, 16)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    got = cam(net, x, layers="layer2", method=method)
    again = cam(net, x[:1], layers="layer2", method=method)
    assert net.training and all(m.training for m in net.modules())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())  # running stats untouched
    want = cam(net.eval(), x, layers="layer2", method=method)
    assert torch.allclose(got.maps, want.maps, atol=1e-6)
    assert torch.allclose(again.maps[0], got.maps[0], atol=1e-5)  # deterministic, samples independent
    assert no_hooks(net)


def test_docstring_examples_run():
    for module in (_api, _formulas, _result, _scorecam, _shape):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted > 0


def test_wrapped_model_keeps_inner_names():
    net = TinyResNet().eval()
    x = torch.randn(1, 3, 16, 16)
    res = cam(nn.DataParallel(net), x, layers="module.layer2")
    assert res.layers == ["layer2"] and torch.allclose(res.maps, cam(net, x, layers="layer2").maps)
    assert no_hooks(net) and hookscope.names(net)


def test_errors_inside_the_forward_pass_leave_no_hook():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            self.conv(x)
            raise RuntimeError("boom")

    net = Boom().eval()
    # issue 10: a failing forward is a ForwardError (a HookscopeError) in the shared wording
    with pytest.raises(ForwardError, match=r"^the forward pass failed in Boom's own forward, which received "
                                           r"input\[0\] 1x3x8x8 float32: RuntimeError: "
                                           r"boom; check the example input's shape and dtype$") as e:
        cam(net, torch.randn(1, 3, 8, 8), layers="conv")
    assert isinstance(e.value.__cause__, RuntimeError)  # the model's own error stays chained
    assert no_hooks(net)
    gap = GapNet().eval()
    with pytest.raises(HookscopeError, match=r"output= failed on the model's Tensor output \(IndexError"):
        cam(gap, X_HAND, layers="relu", output=lambda o: o[5])
    assert no_hooks(gap)


# --- review fixes: automatic layer, tokens, every method's layer checks, user functions ------------
class SqueezeExcite(nn.Module):
    """conv -> squeeze-excitation whose last conv gives B x C x 1 x 1 -> GAP head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc1 = nn.Conv2d(4, 2, 1)
        self.fc2 = nn.Conv2d(2, 4, 1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        a = self.conv(x).relu()
        gate = self.fc2(self.fc1(a.mean((2, 3), keepdim=True)).relu()).sigmoid()
        return self.head((a * gate).mean((2, 3)))


class SharedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.conv(self.conv(x)).mean((2, 3)))


def test_automatic_layer_skips_1x1_outputs_and_refuses_a_conv_that_runs_twice():
    net = SqueezeExcite().eval()
    res = cam(net, torch.randn(2, 3, 6, 6))
    assert res.layers == ["conv"] and (res.raw["conv"].flatten(1).amax(1) > 0).all()
    with pytest.raises(HookscopeError, match=r"last convolution 'conv' ran 2 times.*pass layers="):
        cam(SharedConv().eval(), torch.randn(1, 3, 6, 6))


def _tiny_vit():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                            mlp_dim=32, num_classes=5).eval()
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: no gradient at all
    return vit


def test_vision_transformer_tokens_to_grid_and_the_class_token_trap():
    vit = _tiny_vit()
    x = torch.randn(3, 3, 32, 32)
    norm = "encoder.layers.encoder_layer_1.ln_1"
    got = cam(vit, x, layers=norm, reshape=hookscope.tokens_to_grid(skip=1))
    assert got.raw[norm].shape == (3, 4, 4) and (got.maps.flatten(1).amax(1) == 1).all()
    one = cam(vit, x[1:2], layers=norm, reshape=hookscope.tokens_to_grid(skip=1))
    assert torch.allclose(one.maps[0], got.maps[1], atol=1e-5)
    # the last block's output reaches the head through the class token only: refused, not all zero
    with pytest.raises(HookscopeError, match=r"gradient reaches only positions that reshape= drops"):
        cam(vit, x, layers="encoder.layers.encoder_layer_1", reshape=hookscope.tokens_to_grid(skip=1))
    # the token layout is certain (a class token, the patch embedding's 4 x 4 grid): read by itself
    auto = cam(vit, x, layers=norm)
    assert auto.layouts[norm] == "tokens(k=1, 4x4)" and torch.equal(auto.maps, got.maps)
    with pytest.raises(HookscopeError, match=r"17 tokens after skipping 0 do not fill a 4 x 4 grid"):
        cam(vit, x, layers=norm, reshape=hookscope.tokens_to_grid(skip=0))
    assert no_hooks(vit)


@pytest.mark.parametrize("method", ["scorecam", "eigencam", "cam"])
def test_layer_checks_hold_for_methods_without_gradients(method):
    net = Branchy().eval()
    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(HookscopeError, match=r"'const'.*does not depend on the input"):
        cam(net, x, layers="const", method=method)
    with pytest.raises(HookscopeError, match=r"'side'.*does not reach"):
        cam(net, x, layers="side", method=method)
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())


class DictHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = TinyResNet()

    def forward(self, x):
        return {"logits": self.net(x), "features": x}


def test_eigencam_needs_no_logits_and_scorecam_takes_a_target_function():
    net = DictHead().eval()
    x = torch.randn(2, 3, 16, 16)
    eig = cam(net, x, layers="net.layer2", method="eigencam")  # targets read from the dict's "logits"
    assert eig.targets.tolist() == net(x)["logits"].argmax(1).tolist() and eig.maps.shape == (2, 16, 16)
    by_class = cam(net, x, layers="net.layer2", method="scorecam", target=3, output=lambda o: o["logits"])
    by_fn = cam(net, x, layers="net.layer2", method="scorecam", target=lambda o: o["logits"][:, 3])
    assert by_fn.targets is None and torch.allclose(by_fn.maps, by_class.maps, atol=1e-6)
    assert torch.allclose(by_fn.scores, by_class.scores)


class WritesItsInput(TinyResNet):
    def forward(self, x):
        x.mul_(2)
        return super().forward(x)


@pytest.mark.parametrize("method", METHODS)
def test_the_callers_input_is_never_written(method):
    x = torch.randn(2, 3, 16, 16)
    before = x.clone()
    got = cam(WritesItsInput().eval(), x, method=method, **at(method))
    assert torch.equal(x, before)
    # and Score-CAM masks the input it was given, not one the model doubled
    want = cam(TinyResNet().eval(), 2 * x, layers="layer2", method=method) if method == "scorecam" else got
    assert torch.allclose(got.maps, want.maps, atol=1e-5)


def test_mistakes_in_the_users_functions_are_one_line():
    net = TinyResNet().eval()
    x = torch.randn(2, 3, 16, 16)
    with pytest.raises(HookscopeError, match=r"^target= failed on the model's Tensor output \(IndexError"):
        cam(net, x, target=lambda o: o["logits"])
    with pytest.raises(HookscopeError, match=r"^output= failed on the model's Tensor output \(AttributeError"):
        cam(net, x, output=lambda o: o.logits)
    assert no_hooks(net)


def test_scorecam_progress_bar_on_request_only(capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    net, x = DeadChannels().eval(), torch.randn(1, 3, 8, 8)
    cam(net, x, layers="relu", method="scorecam", batch_size=1)  # quick: no bar
    assert capsys.readouterr().err == ""
    cam(net, x, layers="relu", method="scorecam", batch_size=1, progress=True)
    err = capsys.readouterr().err
    assert err == "".join(f"\rscorecam: {i}/4 batches" for i in range(1, 5)) + "\n"


def test_scorecam_shows_no_bar_in_a_log_however_long_the_run(capsys, monkeypatch):
    monkeypatch.setattr(_scorecam, "_SHOW_AFTER", 0.0)  # every run "long"
    net, x = DeadChannels().eval(), torch.randn(1, 3, 8, 8)
    cam(net, x, layers="relu", method="scorecam", batch_size=1)  # stderr captured: not a terminal
    assert capsys.readouterr().err == ""


# --- the result protocol, layers=, kwargs=, ForwardError --------------------------------
def test_cam_result_speaks_the_result_protocol():
    import json

    from hookscope.errors import RecordError

    net = TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    res = cam(net, x, layers=["layer1", "layer2"], method="layercam")
    rows = res.rows
    assert [r.image for r in rows] == [0, 1] and [r.target for r in rows] == res.targets.tolist()
    assert [r.score for r in rows] == pytest.approx(res.scores.tolist())
    assert all(r.layers == ("layer1", "layer2") for r in rows)
    for r in rows:  # the peak is the map's maximum, as (y, x)
        assert res.maps[r.image][r.peak] == res.maps[r.image].max()
    text = str(res)
    assert text == res.table() and len(text.splitlines()) == 1 + 2 + len(rows)
    assert text.splitlines()[0] == "layercam on layer1, layer2: 2 maps of 32x32, 1 forward pass"
    d = res.to_dict()
    assert d["maps"] is res.maps and d["raw"]["layer1"] is res.raw["layer1"] and d["targets"] is res.targets
    assert d["rows"][1]["peak"] == rows[1].peak and d["method"] == "layercam" and d["forwards"] == 1
    short = json.loads(res.to_json())
    assert short["maps"] == {"shape": [2, 32, 32], "dtype": "float32"}
    assert short["raw"]["layer2"] == {"shape": [2, 16, 16], "dtype": "float32"}
    assert short["targets"] == res.targets.tolist() and short["layouts"] == {"layer1": "BCHW", "layer2": "BCHW"}
    full = json.loads(res.to_json(indent=2, maps=True))
    assert np.allclose(full["maps"], res.maps.numpy()) and np.allclose(full["raw"]["layer1"], res.raw["layer1"].numpy())
    assert "\n  " in res.to_json(indent=2)
    # lookups by name: one RecordError (a KeyError) naming the closest layers; `in` agrees
    for mapping in (res.raw, res.layouts):
        with pytest.raises(RecordError, match=r"^no layer 'layer3' in this result\. Did you mean 'layer2', 'layer1'\?$"):
            mapping["layer3"]
        assert "layer1" in mapping and "layer3" not in mapping
    with pytest.raises(KeyError):
        res.raw["fc"]


def test_rows_without_class_targets_and_scorecam_counts():
    import json

    net, x = DeadChannels().eval(), torch.randn(2, 3, 8, 8)
    res = cam(net, x, layers="relu", method="gradcam", target=lambda o: o[:, 0])
    assert [r.target for r in res.rows] == [None, None] and res.rows[0].score == pytest.approx(float(res.scores[0]))
    assert res.table().splitlines()[3].split()[1] == "-"
    assert json.loads(res.to_json())["rows"][0]["target"] is None
    sc = cam(net, x[:1], layers="relu", method="scorecam")
    assert f"{sc.forwards} forward passes ({sc.masked} masked inputs)" in sc.table().splitlines()[0]


def test_layers_is_the_one_name_of_the_layer_argument():
    net = TinyResNet().eval()
    x = torch.randn(1, 3, 32, 32)
    for wrong in ("layer", "layr"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{wrong}'"):
            cam(net, x, **{wrong: "layer2"})
    assert no_hooks(net)


class Scaled(nn.Module):
    """conv 1x1 (channels x, -x and a constant 0) -> ReLU -> mean -> Linear, times a per-sample ``scale=``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(3, 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([1.0, -1.0, 0.0]).view(3, 1, 1, 1))
            self.conv.bias.zero_()

    def forward(self, x, scale, shift=0.0):
        return self.fc(self.relu(self.conv(x - 0.5)).mean((2, 3))) * scale.view(-1, 1) + shift


@pytest.mark.parametrize("method", ["gradcam", "scorecam", "eigencam"])
def test_keyword_inputs_go_with_their_samples(method):
    net = Scaled().eval()
    x = torch.rand(3, 1, 6, 6)
    scale = torch.tensor([1.0, -2.0, 0.5])
    got = cam(net, x, layers="relu", method=method, target=0, kwargs={"scale": scale, "shift": 0.25})
    for i in range(3):  # each sample with its own row of scale=, the zero image of Score-CAM too
        one = cam(net, x[i:i + 1], layers="relu", method=method, target=0,
                  kwargs={"scale": scale[i:i + 1], "shift": 0.25})
        assert torch.allclose(got.maps[i], one.maps[0], atol=1e-5)
    if method == "scorecam":  # a negative scale flips the scores: the map is not that of scale 1
        plain = cam(net, x, layers="relu", method=method, target=0, kwargs={"scale": torch.ones(3)})
        assert not torch.allclose(got.maps[1], plain.maps[1], atol=1e-3)
    with pytest.raises(HookscopeError, match=r"kwargs=\['scale'\] is not a mapping of argument names"):
        cam(net, x, kwargs=["scale"])
    assert no_hooks(net)


def test_a_failing_forward_is_a_forward_error_in_every_pass():
    class OneAtATime(TinyResNet):
        def forward(self, x):
            if x.shape[0] > 1:
                raise ValueError("one image at a time")
            return super().forward(x)

    net = OneAtATime().eval()
    with pytest.raises(ForwardError, match=r"^the forward pass failed in OneAtATime's own forward, which received "
                                           r"input\[0\] 2x3x32x32 float32: ValueError: one image at a time;"):
        cam(net, torch.randn(2, 3, 32, 32), layers="layer2")
    with pytest.raises(ForwardError, match=r"received input\[0\] 16x3x32x32 float32") as e:  # a masked batch
        cam(net, torch.randn(1, 3, 32, 32), layers="layer2", method="scorecam")
    assert isinstance(e.value, HookscopeError) and isinstance(e.value.__cause__, ValueError)
    seq = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(5, 2))
    with pytest.raises(ForwardError, match=r"^the forward pass failed in '3' \(Linear\), which received input\[0\] "
                                           r"1x144 float32: RuntimeError: mat1 and mat2"):
        cam(seq, torch.randn(1, 3, 8, 8), layers="0")
    assert no_hooks(net) and no_hooks(seq)


def test_the_random_stream_is_left_as_it_was():
    class Jitter(TinyResNet):
        def forward(self, x):
            return super().forward(x + 0.01 * torch.rand_like(x))

    net, x = Jitter().eval(), torch.randn(1, 3, 32, 32)
    before = torch.random.get_rng_state()
    cam(net, x, layers="layer2")
    assert torch.equal(before, torch.random.get_rng_state())


# --- the caller's tensors: every forward pass gets its own copy ---------------------------------------------
class _Pure(nn.Module):
    """What ``helpers.Writer`` computes from its inputs as given, without writing into them."""

    def __init__(self, writer):
        super().__init__()
        self.conv, self.fc = writer.conv, writer.fc

    def forward(self, x, scale=None):
        x = x / 2
        if scale is not None:
            x = x * (scale * 2)
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "layercam", "scorecam", "eigencam"])
def test_a_model_that_writes_into_its_inputs_gets_the_maps_of_the_inputs_as_given(method):
    from helpers import Writer

    model = Writer().eval()
    x, scale = torch.randn(2, 3, 8, 8), torch.full((1,), 3.0)
    kept_x, kept_scale = x.clone(), scale.clone()
    got = cam(model, x, layers="conv", method=method, kwargs={"scale": scale})
    assert torch.equal(x, kept_x) and torch.equal(scale, kept_scale)
    want = cam(_Pure(model).eval(), kept_x, layers="conv", method=method, kwargs={"scale": kept_scale})
    torch.testing.assert_close(got.maps, want.maps)
    assert torch.equal(got.targets, want.targets) and no_hooks(model)


# --- each method's own settings: Score-CAM's batches and progress bar are refused elsewhere -----------------
from hookscope.analysis.cam import readers as cam_readers  # noqa: E402

CAM_SETTINGS = {"batch_size": 3, "progress": False, "ratio": 0.5, "kernel": "rbf", "gamma": 0.5, "degree": 2,
                "coef0": 0.5, "comparison": [1], "alpha": 0.5, "sigmas": 1.0, "seed": 3}  # not their defaults
CAM_NOT_READ = [(m, s) for m in METHODS for s in CAM_SETTINGS if m not in cam_readers(s)]


def test_the_settings_of_cam_are_the_ones_some_method_reads():
    assert {s for m in METHODS for s in CAM_SETTINGS if m in cam_readers(s)} == set(CAM_SETTINGS)
    assert cam_readers("batch_size") == ("scorecam", "ablationcam") and cam_readers("progress") == ("scorecam",)
    assert cam_readers("kernel") == cam_readers("gamma") == cam_readers("degree") == ("kpcacam",)
    assert cam_readers("comparison") == cam_readers("alpha") == ("finercam",)
    assert cam_readers("ratio") == ("ablationcam",) and cam_readers("seed") == ("randomcam",)


@pytest.mark.parametrize(("method", "setting"), CAM_NOT_READ, ids=[f"{m}-{s}" for m, s in CAM_NOT_READ])
def test_a_cam_setting_the_method_does_not_read_is_refused_in_one_line(method, setting):
    net, x = DeadChannels().eval(), torch.randn(1, 3, 8, 8)
    with pytest.raises(hookscope.errors.SettingError) as e:
        cam(net, x, method=method, **{setting: CAM_SETTINGS[setting]}, **at(method, "relu"))
    reading = cam_readers(setting)
    assert str(e.value) == (f'{setting}= is not a setting of {method} ({", ".join(reading)} read'
                            f'{"s" if len(reading) == 1 else ""} it); drop it or use method="{reading[0]}"')
    assert no_hooks(net)


def test_scorecam_reads_its_batch_size_and_the_default_is_its_own():
    net, x = DeadChannels().eval(), torch.randn(2, 3, 8, 8)
    by_three = cam(net, x, layers="relu", method="scorecam", target=[1, 2], batch_size=3, progress=False)
    by_default = cam(net, x, layers="relu", method="scorecam", target=[1, 2])
    assert torch.allclose(by_three.maps, by_default.maps, atol=1e-6) and by_three.masked == by_default.masked
    assert by_three.forwards > by_default.forwards  # batches of 3 masked inputs, not 16: the setting was read
    with pytest.raises(HookscopeError, match="batch_size=0 must be a positive int"):
        cam(net, x, layers="relu", method="scorecam", batch_size=0)
