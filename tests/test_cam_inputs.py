"""CAM and its metrics "correct by default": hostile inputs give the true values or one line.

Models that write into their input, channels-last (Swin-style) activations, half-precision models,
train mode, batch norms on batch statistics, odd targets, empty batches, NaN maps, integer images.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import no_hooks
from torch import nn

from hookscope import HookscopeError
from hookscope.analysis.cam import cam, channels_first, channels_last
from hookscope.analysis.cam_metrics import (
    blur,
    box_mask,
    deletion,
    energy_pointing_game,
    insertion,
    pointing_game,
)
from hookscope.core.hooks import hook_count
from hookscope.zoo import TinyResNet


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# --- (6) the metrics never write the caller's images -----------------------------------------------
class ScaleInPlace(nn.Module):
    """Doubles its input in place, then logits = (sum, 5 * mean of channel 0, -sum)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        s = x.flatten(1).sum(1)
        return torch.stack([s, 5 * x[:, 0].flatten(1).mean(1), -s], 1)


class ZeroChannel(nn.Module):
    """Zeroes channel 0 of its input in place, then a linear layer on the rest."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0] = 0
        return self.fc(x.flatten(1))


def hand_curve(kind, model, x, maps, steps, base, target, score):
    """The curve worked out step by step, every model call on a fresh copy of the original images."""
    b, _, h, w = x.shape
    with torch.no_grad():
        if target is None:
            target = model(x.clone()).argmax(1)
        order = torch.argsort(maps.reshape(b, -1), dim=1, descending=True, stable=True)
        rows = []
        for i in range(steps + 1):
            chosen = torch.zeros(b, h * w, dtype=torch.bool)
            chosen.scatter_(1, order[:, : (i * h * w) // steps], True)
            chosen = chosen.view(b, 1, h, w)
            z = torch.where(chosen, base, x) if kind == "deletion" else torch.where(chosen, x, base)
            out = model(z.clone())
            if callable(target):
                rows.append(target(out))
            else:
                values = out.softmax(1) if score == "prob" else out
                rows.append(values[torch.arange(b), torch.as_tensor(target).expand(b)])
    return torch.stack(rows, 1)


@pytest.mark.parametrize("model_type", [ScaleInPlace, ZeroChannel])
@pytest.mark.parametrize("kind", ["deletion", "insertion"])
@pytest.mark.parametrize("target", [None, 1, lambda out: out[:, 1] - out[:, 0]])
def test_curves_leave_the_callers_images_bit_identical_and_score_fresh_copies(model_type, kind, target):
    model = model_type()
    torch.manual_seed(0)
    x = torch.rand(2, 3, 3, 3)
    saved = x.clone()
    maps = torch.rand(2, 3, 3)
    metric = deletion if kind == "deletion" else insertion
    curve = metric(model, x, maps, target=target, steps=4, baseline="mean", score="logit")
    assert torch.equal(x, saved)  # bit-identical: not one write reached the caller's tensor
    base = saved.mean((2, 3), keepdim=True).expand_as(saved)
    expected = hand_curve(kind, model, saved, maps, 4, base, target, "logit")
    assert torch.allclose(curve.scores, expected, atol=1e-5)
    if target is None:  # the class predicted on the images as given, not on images doubled by the model
        assert curve.targets.tolist() == model(saved.clone()).argmax(1).tolist()
    assert no_hooks(model)


def test_deletion_with_target_none_and_prob_scores_on_a_model_that_writes_its_input():
    model = ScaleInPlace()
    x = torch.tensor([[[[0.5, 0.1], [0.2, 0.4]]]])
    saved = x.clone()
    curve = deletion(model, x, x[:, 0], steps=4)
    assert torch.equal(x, saved)
    expected = hand_curve("deletion", model, saved, saved[:, 0], 4, torch.zeros_like(saved), None, "prob")
    assert torch.allclose(curve.scores, expected, atol=1e-6)


# --- (7) channels-last activations -----------------------------------------------------------------
class Permute(nn.Module):
    """As torchvision.ops.misc.Permute."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.permute(x, self.dims)


class SwinBlock(nn.Module):
    """On B x h x w x C: a shift that mixes the grid, then a LayerNorm + MLP, with residuals."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 2 * c)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * c, c)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        u = t + torch.roll(t, 1, dims=2)
        return u + self.fc2(self.act(self.fc1(self.norm(u))))


class TinySwin(nn.Module):
    """Patch embedding (4 x 4 conv, then channels last, LayerNorm), a block, LayerNorm, permute, GAP, head.

    A 16 x 16 input gives B x 4 x 4 x 32 activations.
    """

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Sequential(nn.Conv2d(3, c, 4, 4), Permute([0, 2, 3, 1]), nn.LayerNorm(c))
        self.stage = SwinBlock(c)
        self.norm = nn.LayerNorm(c)
        self.permute = Permute([0, 3, 1, 2])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.norm(self.stage(self.embed(x)))
        return self.head(self.pool(self.permute(t)).flatten(1))


class Scale(nn.Module):
    """A custom module (no layout of its own): doubles and shifts along the grid."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return 2 * t + torch.roll(t, 1, dims=1)


class FunctionalSwin(nn.Module):
    """Channels last by a functional permute; the layer ``mix`` is read only by functional code."""

    def __init__(self, c: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.mix = Scale()
        self.head = nn.Linear(c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.embed(x).permute(0, 2, 3, 1)).mean((1, 2)))


def hand_gradcam(net, x, module, last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Grad-CAM from a plain hook: the activation (permuted by hand when channels last) and its gradient."""
    kept = []
    handle = module.register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        logits = net(x)
    finally:
        handle.remove()
    A = kept[0]
    targets = logits.argmax(1)
    (G,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), A)
    if last:
        A, G = A.permute(0, 3, 1, 2), G.permute(0, 3, 1, 2)
    return (G.mean((2, 3))[:, :, None, None] * A).sum(1).relu().detach(), targets


@pytest.mark.parametrize("layer", ["embed", "embed.2", "stage", "stage.fc2", "norm"])
def test_a_channels_last_layer_gives_the_map_of_its_activation_permuted_by_hand(layer):
    net = TinySwin().eval()
    x = torch.rand(2, 3, 16, 16)
    res = cam(net, x, layers=layer)
    assert res.layouts == {layer: "BHWC"}
    assert res.raw[layer].shape == (2, 4, 4)  # the 4 x 4 grid, not 4 x 32
    expected, targets = hand_gradcam(net, x, net.get_submodule(layer), last=True)
    assert torch.equal(res.targets, targets)
    assert torch.allclose(res.raw[layer], expected, atol=1e-6)
    by_hand = cam(net, x, layers=layer, reshape=lambda t: t.permute(0, 3, 1, 2))
    assert by_hand.layouts == {layer: "reshape="}
    assert torch.allclose(res.maps, by_hand.maps, atol=1e-6)
    assert torch.allclose(res.maps, cam(net, x, layers=layer, reshape=channels_last).maps, atol=1e-6)
    assert hook_count(net) == 0


def test_channels_first_layers_of_a_swin_like_model_stay_as_they_are():
    net = TinySwin().eval()
    x = torch.rand(2, 3, 16, 16)
    for layer in ("embed.0", "permute"):  # the conv, and the permute back to B x C x h x w
        res = cam(net, x, layers=layer)
        assert res.layouts == {layer: "BCHW"} and res.raw[layer].shape == (2, 4, 4)
        expected, _ = hand_gradcam(net, x, net.get_submodule(layer), last=False)
        assert torch.allclose(res.raw[layer], expected, atol=1e-6)
    res = cam(net, x, layers=["embed", "permute"], method="layercam")
    assert res.layouts == {"embed": "BHWC", "permute": "BCHW"}
    assert hook_count(net) == 0


@pytest.mark.parametrize("method", ["gradcam++", "xgradcam", "hirescam", "scorecam", "eigencam", "cam"])
def test_every_method_reads_a_channels_last_layer_as_its_permutation(method):
    net = TinySwin().eval()
    x = torch.rand(2, 3, 16, 16)
    layer = "norm"
    quiet = {"progress": False} if method == "scorecam" else {}
    res = cam(net, x, layers=layer, method=method, **quiet)
    ref = cam(net, x, layers=layer, method=method, reshape=channels_last, **quiet)
    assert res.layouts == {layer: "BHWC"} and res.raw[layer].shape == (2, 4, 4)
    assert torch.allclose(res.raw[layer], ref.raw[layer], atol=1e-6)
    assert hook_count(net) == 0


def test_a_functional_permute_is_told_by_the_grid_that_fits_the_input():
    net = FunctionalSwin(c=32).eval()
    x = torch.rand(2, 3, 16, 20)  # a 4 x 5 grid: B x 4 x 5 x 32 only reads one way
    res = cam(net, x, layers="mix")
    assert res.layouts == {"mix": "BHWC"} and res.raw["mix"].shape == (2, 4, 5)
    expected, _ = hand_gradcam(net, x, net.mix, last=True)
    assert torch.allclose(res.raw["mix"], expected, atol=1e-6)
    assert hook_count(net) == 0


def test_a_layer_that_reads_both_ways_is_refused_in_one_line_naming_it_and_the_fix():
    net = FunctionalSwin(c=4).eval()  # B x 4 x 4 x 4: channels first and last both fit a 16 x 16 input
    x = torch.rand(2, 3, 16, 16)
    with pytest.raises(HookscopeError) as e:
        cam(net, x, layers="mix")
    text = one_line(e)
    assert "layer 'mix'" in text and "(2, 4, 4, 4)" in text
    assert "reshape=hookscope.channels_last" in text and "channels_first" in text
    assert hook_count(net) == 0
    res = cam(net, x, layers="mix", reshape=channels_last)  # the fix the line names
    expected, _ = hand_gradcam(net, x, net.mix, last=True)
    assert res.layouts == {"mix": "reshape="} and torch.allclose(res.raw["mix"], expected, atol=1e-6)
    res = cam(net, x, layers="mix", reshape=channels_first)
    expected, _ = hand_gradcam(net, x, net.mix, last=False)
    assert torch.allclose(res.raw["mix"], expected, atol=1e-6)


class Disagree(nn.Module):
    """A conv's 4 x 4 x 4 output permuted functionally, then read by a LayerNorm(4)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Conv2d(3, 4, 4, 4))
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.block(x)
        return self.head(self.norm(t).mean((1, 2)))


def test_modules_that_disagree_about_the_layout_are_refused():
    net = Disagree().eval()
    with pytest.raises(HookscopeError, match=r"channels first to the Conv2d that makes it but channels last "
                                             r"to the LayerNorm that reads it") as e:
        cam(net, torch.rand(1, 3, 16, 16), layers="block")
    assert "layer 'block'" in one_line(e) and hook_count(net) == 0


def test_cnn_layers_keep_their_layout_even_when_channels_equal_the_grid():
    class Square(nn.Module):  # 8 channels on an 8 x 8 grid, read by functional code only
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.relu = nn.ReLU()
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(self.relu(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    net = Square().eval()
    x = torch.rand(2, 3, 8, 8)
    for layer in ("conv", "relu"):  # the ReLU's input is the Conv2d's output: channels first
        res = cam(net, x, layers=layer)
        assert res.layouts == {layer: "BCHW"}
        expected, _ = hand_gradcam(net, x, net.get_submodule(layer), last=False)
        assert torch.allclose(res.raw[layer], expected, atol=1e-6)
    assert cam(net, x, layers=["conv", "relu"]).layouts == {"conv": "BCHW", "relu": "BCHW"}  # both kept
    assert hook_count(net) == 0
    res = cam(TinyResNet().eval(), torch.rand(1, 3, 32, 32), layers=["layer1", "layer2"])
    assert res.layouts == {"layer1": "BCHW", "layer2": "BCHW"}


def test_channels_last_helpers():
    t = torch.arange(24.0).view(1, 2, 3, 4)
    assert torch.equal(channels_last(t), t.permute(0, 3, 1, 2)) and channels_first(t) is t
    with pytest.raises(ValueError, match="B x h x w x C"):
        channels_last(torch.zeros(2, 3))


@pytest.mark.slow
def test_torchvision_swin_t_stages_are_read_channels_last():
    tv = pytest.importorskip("torchvision")
    net = tv.models.swin_t(weights=None).eval()
    x = torch.rand(1, 3, 64, 64)  # swin_t takes any size divisible by 32: stages of 16, 8, 4, 2
    for layer, grid in (("features.1", 16), ("features.5", 4), ("norm", 2)):
        res = cam(net, x, layers=layer)
        assert res.layouts == {layer: "BHWC"} and res.raw[layer].shape == (1, grid, grid)
        ref = cam(net, x, layers=layer, reshape=lambda t: t.permute(0, 3, 1, 2))
        assert torch.allclose(res.maps, ref.maps, atol=1e-6)
        expected, _ = hand_gradcam(net, x, net.get_submodule(layer), last=True)
        assert torch.allclose(res.raw[layer], expected, rtol=1e-4, atol=1e-6 * float(expected.max()))
    assert cam(net, x, layers="permute").layouts == {"permute": "BCHW"}
    assert hook_count(net) == 0


@pytest.mark.slow
def test_torchvision_convnext_blocks_channels_first_outside_last_inside():
    tv = pytest.importorskip("torchvision")
    net = tv.models.convnext_tiny(weights=None).eval()
    x = torch.rand(1, 3, 32, 32)
    res = cam(net, x, layers=["features.1.0", "features.1.0.block.3"])
    assert res.layouts == {"features.1.0": "BCHW", "features.1.0.block.3": "BHWC"}
    assert res.raw["features.1.0"].shape == res.raw["features.1.0.block.3"].shape == (1, 8, 8)
    inner = net.get_submodule("features.1.0.block.3")
    expected, _ = hand_gradcam(net, x, inner, last=True)
    assert torch.allclose(res.raw["features.1.0.block.3"], expected, rtol=1e-4, atol=1e-6 * float(expected.max()))
    assert hook_count(net) == 0


@pytest.mark.slow
def test_cli_says_when_it_read_a_layer_channels_last(tmp_path, capsys):
    pytest.importorskip("torchvision")
    from hookscope.cli import main

    out = tmp_path / "o.png"
    assert main(["cam", "torchvision:swin_t", "--input", "1x3x64x64", "--layer", "features.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "layer features.5: B x h x w x C (channels last), permuted to B x C x h x w"
    assert out.exists()


def test_cli_refuses_tokens_and_layout_together(tmp_path, capsys):
    from hookscope.cli import main

    assert main(["cam", "tiny", "--tokens", "1", "--layout", "last", "--out", str(tmp_path / "o.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "either --tokens SKIP" in err[0]


# --- half precision, train mode, samples that interact ---------------------------------------------
def plain_grads(net, x, module):
    kept = []
    handle = module.register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        logits = net(x)
    finally:
        handle.remove()
    targets = logits.argmax(1)
    (G,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), kept[0])
    return kept[0].detach().double(), G.double()


def formula(method, A, G):
    if method == "gradcam":
        w = G.mean((2, 3))
    elif method == "gradcam++":
        g2, g3 = G**2, G**3
        den = 2 * g2 + A.sum((2, 3), keepdim=True) * g3
        alpha = torch.where(den != 0, g2 / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(den))
        w = (alpha * G.clamp(min=0)).sum((2, 3))
    else:  # layercam
        return (G.clamp(min=0) * A).sum(1).clamp(min=0)
    return torch.einsum("bk,bkhw->bhw", w, A).clamp(min=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "layercam"])
def test_half_precision_models_get_their_formulas_in_float32(dtype, method):
    net = TinyResNet().eval().to(dtype)
    x = torch.rand(2, 3, 32, 32).to(dtype)
    res = cam(net, x, layers="layer2", method=method)
    assert res.raw["layer2"].dtype == torch.float32 and res.maps.dtype == torch.float32
    A, G = plain_grads(net, x, net.layer2)  # the half model's own activation and gradient
    expected = formula(method, A, G)
    scale = expected.flatten(1).amax(1).view(-1, 1, 1)
    assert torch.allclose(res.raw["layer2"].double() / scale, expected / scale, atol=1e-5)
    assert hook_count(net) == 0


def test_cam_on_a_half_model_with_a_gap_head():
    net = TinyResNet().eval().to(torch.float16)
    x = torch.rand(2, 3, 32, 32).to(torch.float16)
    res = cam(net, x, layers="layer2", method="cam")  # the head's input: the half model's own pooling
    A, _ = plain_grads(net, x, net.layer2)
    rows = net.fc.weight.double()[res.targets]
    assert torch.allclose(res.raw["layer2"].double(), torch.einsum("bk,bkhw->bhw", rows, A), atol=1e-4)


def test_a_model_in_train_mode_gets_eval_maps_and_curves_and_keeps_its_buffers():
    net = TinyResNet().train()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    ref = TinyResNet().eval()
    x = torch.rand(3, 3, 32, 32)
    res = cam(net, x, layers="layer2")
    expected = cam(ref, x, layers="layer2")
    assert torch.allclose(res.raw["layer2"], expected.raw["layer2"], atol=1e-6)
    curve = deletion(net, x, res.maps, steps=4)
    assert torch.allclose(curve.scores, deletion(ref, x, res.maps, steps=4).scores, atol=1e-6)
    assert all(m.training for m in net.modules())
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())  # running stats untouched


class BatchStats(nn.Module):
    """conv -> ReLU -> BatchNorm2d without running statistics (batch statistics even in eval) -> GAP -> head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.relu(self.conv(x))).mean((2, 3)))


def test_samples_that_interact_get_each_their_own_gradient():
    net = BatchStats().eval()
    x = torch.rand(3, 3, 6, 6)
    res = cam(net, x, layers="relu", method="gradcam")
    kept = []
    handle = net.relu.register_forward_hook(lambda m, a, o: kept.append(o))
    logits = net(x)
    handle.remove()
    A, t = kept[0], logits.argmax(1)
    own = torch.stack([torch.autograd.grad(logits[b, t[b]], A, retain_graph=True)[0][b] for b in range(3)])
    expected = (own.mean((2, 3))[:, :, None, None] * A).sum(1).relu().detach()
    assert torch.allclose(res.raw["relu"], expected, atol=1e-6)
    (summed,) = torch.autograd.grad(logits.gather(1, t[:, None]).sum(), A)
    naive = (summed.mean((2, 3))[:, :, None, None] * A).sum(1).relu().detach()
    assert not torch.allclose(naive, expected, atol=1e-3)  # what one gradient of the sum would have given
    assert hook_count(net) == 0


def test_samples_that_interact_refuse_batched_scorecam_and_curves():
    net = BatchStats().eval()
    x = torch.rand(2, 3, 6, 6)
    with pytest.raises(HookscopeError, match=r"BatchNorm2d 'bn' normalises with each batch's own statistics"):
        cam(net, x, layers="relu", method="scorecam")
    with pytest.raises(HookscopeError, match=r"pass one image with batch_size=1"):
        deletion(net, x, torch.rand(2, 6, 6), steps=2)
    res = cam(net, x[:1], layers="relu", method="scorecam", batch_size=1, progress=False)
    assert res.raw["relu"].shape == (1, 6, 6)
    curve = deletion(net, x[:1], res.maps, steps=2, batch_size=1)
    assert curve.scores.shape == (1, 3) and hook_count(net) == 0


# --- targets, empty batches, small images ----------------------------------------------------------
@pytest.mark.parametrize("target", [torch.tensor([3, 1], dtype=torch.int32), np.array([3, 1]), (3, 1),
                                    [np.int64(3), np.int64(1)]])
def test_per_image_targets_in_any_integer_container_agree(target):
    net = TinyResNet().eval()
    x = torch.rand(2, 3, 32, 32)
    res, ref = cam(net, x, layers="layer2", target=target), cam(net, x, layers="layer2", target=[3, 1])
    assert res.targets.tolist() == [3, 1] and torch.equal(res.maps, ref.maps)
    curve = deletion(net, x, res.maps, target=target, steps=2)
    assert torch.equal(curve.scores, deletion(net, x, res.maps, target=[3, 1], steps=2).scores)


@pytest.mark.parametrize("target, match", [
    ([0, 10], r"target class 10 \(sample 1\) is out of range: the model has 10 classes"),
    (-1, r"target class -1 \(sample 0\) is out of range"),
    (torch.tensor([[1], [2]]), r"target of shape \(2, 1\) is not one class index per sample"),
])
def test_bad_targets_are_one_line_in_cam_and_curves(target, match):
    net = TinyResNet().eval()
    x = torch.rand(2, 3, 32, 32)
    with pytest.raises(HookscopeError, match=match):
        cam(net, x, layers="layer2", target=target)
    with pytest.raises(HookscopeError, match=match):
        deletion(net, x, torch.rand(2, 32, 32), target=target, steps=2)
    assert hook_count(net) == 0


class Counting(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


def test_an_empty_batch_gives_empty_maps_and_curves():
    net = TinyResNet().eval()
    res = cam(net, torch.rand(0, 3, 32, 32), layers="layer2")
    assert res.maps.shape == (0, 32, 32) and res.raw["layer2"].shape == (0, 16, 16) and res.targets.numel() == 0
    model = Counting(net)
    curve = insertion(model, torch.rand(0, 3, 32, 32), torch.rand(0, 32, 32), steps=4)
    assert curve.scores.shape == (0, 5) and curve.auc.shape == (0,) and curve.targets.tolist() == []
    assert curve.fractions.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0] and model.calls == 0
    assert deletion(model, torch.rand(0, 3, 4, 4), torch.rand(0, 4, 4), target=lambda o: o[:, 0]).targets is None


def test_a_layer_grid_larger_than_the_image_is_downsampled_to_it():
    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.up = nn.Upsample(scale_factor=4)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(self.conv(self.up(x)).mean((2, 3)))

    net = Up().eval()
    x = torch.rand(2, 3, 5, 3)
    res = cam(net, x, layers="conv")
    expected, _ = hand_gradcam(net, x, net.conv, last=False)
    assert res.raw["conv"].shape == (2, 20, 12)
    small = F.interpolate(expected[:, None], size=(5, 3), mode="bilinear", align_corners=False)[:, 0]
    lo = small.flatten(1).amin(1).view(-1, 1, 1)
    hi = small.flatten(1).amax(1).view(-1, 1, 1)
    assert torch.allclose(res.maps, (small - lo) / (hi - lo), atol=1e-5)


# --- metrics: values no one should trust -----------------------------------------------------------
class PixelSum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.float().flatten(1).sum(dim=1)
        return torch.stack([s, torch.zeros_like(s)], dim=1)


def test_nan_maps_are_refused_not_ranked():
    x = torch.rand(2, 1, 2, 2)
    maps = torch.rand(2, 2, 2)
    maps[1, 0, 0] = float("nan")
    with pytest.raises(HookscopeError, match=r"maps hold NaN \(image 1\)"):
        deletion(PixelSum(), x, maps, steps=2)
    with pytest.raises(HookscopeError, match=r"pointing_game: maps hold NaN \(image 1\)"):
        pointing_game(maps, box_mask([[0, 0, 1, 1]] * 2, 2, 2))
    with pytest.raises(HookscopeError, match=r"energy_pointing_game: maps hold NaN"):
        energy_pointing_game(maps, box_mask([[0, 0, 1, 1]] * 2, 2, 2))


def test_prob_scores_of_a_one_logit_model_are_refused():
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 1))
    x = torch.rand(1, 1, 2, 2)
    with pytest.raises(HookscopeError, match=r"always 1 for a model with one logit; use score='logit'"):
        deletion(net, x, x[:, 0], steps=2)
    curve = deletion(net, x, x[:, 0], steps=2, score="logit")
    assert curve.scores[0, 0].item() == pytest.approx(net(x).item())


def test_integer_images_get_rounded_baselines():
    x = torch.tensor([[[[10, 20], [30, 41]]]], dtype=torch.uint8)
    maps = x[:, 0].float()  # 41 first, then 30, 20, 10
    curve = deletion(PixelSum(), x, maps, steps=4, baseline=0.6, score="logit")  # 0.6 -> 1, not 0
    assert curve.scores.tolist() == [[101.0, 61.0, 32.0, 13.0, 4.0]]
    mean = round(101 / 4)  # 25.25 -> 25
    curve = deletion(PixelSum(), x, maps, steps=4, baseline="mean", score="logit")
    assert curve.scores[0].tolist() == [101.0, 60 + mean, 30 + 2 * mean, 10 + 3 * mean, 4 * mean]
    assert torch.equal(blur(x), blur(x.float()).round().to(torch.uint8))
    assert blur(x).dtype == torch.uint8 and blur(x).sum() > 0  # not the zero image of uint8 weights


def test_boxes_that_cover_nothing_and_empty_masks_are_refused():
    with pytest.raises(HookscopeError, match=r"box 1 .* is empty .* not \(x, y, width, height\)"):
        box_mask([[0, 0, 2, 2], [3, 3, 2, 2]], 4, 4)
    with pytest.raises(HookscopeError, match=r"box 0 .* covers no pixel of the 4 x 4 image"):
        box_mask([[5, 5, 9, 9]], 4, 4)
    maps, empty = torch.rand(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool)
    empty[0, 1, 1] = True
    with pytest.raises(HookscopeError, match=r"pointing_game: mask 1 is empty"):
        pointing_game(maps, empty)
    with pytest.raises(HookscopeError, match=r"energy_pointing_game: mask 1 is empty"):
        energy_pointing_game(maps, empty)


@pytest.mark.parametrize("tolerance", [float("nan"), -1, "15", True])
def test_pointing_game_tolerance_must_be_a_distance(tolerance):
    with pytest.raises(HookscopeError, match=r"tolerance=.* must be 0 or a positive number of pixels"):
        pointing_game(torch.rand(1, 4, 4), box_mask([[0, 0, 2, 2]], 4, 4), tolerance=tolerance)
