"""Guided Grad-CAM (``hookscope.attribute(method="guided_gradcam")``): a map worked out by hand, captum's
``GuidedGradCam`` (bilinear) on resnet18 and on a model whose ReLUs rewrite the layer's output in place,
the layer found as cam finds it, and one-line refusals of layers with no map to upsample."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.attribution._gradcam import grad_cam

from helpers import no_hooks, one_thread_only, rel

captum_attr = pytest.importorskip("captum.attr")
torchvision = pytest.importorskip("torchvision")


one_thread = pytest.fixture(autouse=True, scope="module")(one_thread_only)


def captum_ggc(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: list[int]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # captum says it sets requires_grad and hooks ReLUs
        return captum_attr.GuidedGradCam(model, layer).attribute(x.clone(), target=target, interpolate_mode="bilinear")


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(3))  # layer4: 3 x 3


# --- worked out by hand ---------------------------------------------------------------------------
def test_a_one_by_one_convolution_worked_out_by_hand():
    """conv (weight 2) -> ReLU -> mean -> linear (weight 1) on 2 x 2 pixels, one negative: A = 2x and
    dS/dA = 1/4 where A > 0 (0 at the negative pixel). Guided backprop: 2 * 1/4 = 1/2 on the positive pixels,
    0 on the other; the layer's grid is the input's, so nothing is interpolated."""
    net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        net[0].weight.fill_(2.0)
        net[4].weight.fill_(1.0)
    x = torch.tensor([[[[1.0, 2.0], [-1.0, 4.0]]]])
    res = hookscope.attribute(net, x, method="guided_gradcam", layers="0", target=0)
    # weights = mean of dS/dA over the 4 pixels = 3/16; Grad-CAM = relu(3/16 * 2x) = 3x/8 where x > 0
    expected = torch.tensor([[[[1.0, 2.0], [0.0, 4.0]]]]) * (3 / 8) * 0.5
    assert torch.allclose(res.maps, expected) and res.method == "guided_gradcam"
    assert res.layer == "0" and res.forwards == 2 and no_hooks(net)


def test_grad_cam_weights_each_channel_by_its_mean_gradient_and_cuts_below_zero():
    act = torch.stack([torch.ones(2, 2), torch.arange(4.0).view(2, 2)])[None]
    g = torch.stack([torch.full((2, 2), -1.0), torch.tensor([[0.0, 1.0], [1.0, 2.0]])])[None]  # means -1, 1
    assert grad_cam(act, g).flatten().tolist() == [0.0, 0.0, 1.0, 2.0]  # relu(-1 * 1 + 1 * act[1])


# --- against captum -------------------------------------------------------------------------------
def test_equals_captum_on_resnet18_at_layer4(resnet, images):
    ours = hookscope.attribute(resnet, images, method="guided_gradcam", layers="layer4", target=[3, 5])
    theirs = captum_ggc(resnet, resnet.layer4, images, [3, 5])
    assert ours.maps.shape == images.shape and rel(ours.maps, theirs) <= 1e-5
    assert ours.maps.abs().max() > 0 and no_hooks(resnet)


def test_with_no_layer_the_last_convolution_is_taken_as_cam_takes_it(resnet, images):
    ours = hookscope.attribute(resnet, images, method="guided_gradcam", target=[3, 5])
    assert hookscope.cam(resnet, images[:1], method="gradcam").layers == ["layer4.1.conv2"]
    theirs = captum_ggc(resnet, resnet.layer4[1].conv2, images, [3, 5])
    assert rel(ours.maps, theirs) <= 1e-5 and ours.forwards == 4 and ours.layer is None  # 1 + find + layer + guided
    assert no_hooks(resnet)


def _inplace_net(inplace: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=inplace), nn.Conv2d(8, 8, 3, padding=1),
                         nn.ReLU(inplace=inplace), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


def test_an_in_place_relu_after_the_layer_does_not_change_the_map():
    """The ReLU after conv ``2`` rewrites its output in place: Grad-CAM must still read the convolution's own
    output (negative values included) and its gradient, as captum does on the same model without in-place ops."""
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    net, plain = _inplace_net(True), _inplace_net(False)
    ours = hookscope.attribute(net, x, method="guided_gradcam", layers="2", target=[1, 2])
    theirs = captum_ggc(plain, plain[2], x, [1, 2])
    assert rel(ours.maps, theirs) <= 1e-5 and no_hooks(net)
    assert torch.equal(hookscope.attribute(net, x, method="guided_gradcam", target=[1, 2]).maps, ours.maps)


@pytest.mark.parametrize("wrap", [nn.DataParallel, lambda m: torch.compile(m, backend="eager")],
                         ids=["DataParallel", "compiled"])
def test_wrappers_give_the_wrapped_models_map(wrap):
    net, x = _inplace_net(True), torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    plain = hookscope.attribute(net, x, method="guided_gradcam", target=1)
    for layers in (None, "2"):
        wrapped = hookscope.attribute(wrap(net), x, method="guided_gradcam", target=1, layers=layers)
        assert torch.allclose(wrapped.maps, plain.maps, atol=1e-6) and no_hooks(net)


def test_the_model_is_left_as_it_was(resnet, images):
    net = copy.deepcopy(resnet).train()
    net.fc.weight.grad = torch.full_like(net.fc.weight, 7.0)
    for p in net.conv1.parameters():
        p.requires_grad_(False)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    hookscope.attribute(net, images[:1], method="guided_gradcam", target=1)
    assert net.training and all(m.training for m in net.modules())
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert torch.equal(net.fc.weight.grad, torch.full_like(net.fc.weight, 7.0)) and net.conv1.weight.grad is None
    assert not net.conv1.weight.requires_grad and net.layer1[0].conv1.weight.requires_grad and no_hooks(net)


# --- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer, shape", [("fc", "2x1000"), ("avgpool", "2x512x1x1")])
def test_a_layer_with_no_map_is_refused_naming_a_convolution(resnet, images, layer, shape):
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(resnet, images, method="guided_gradcam", layers=layer)
    said = str(e.value)
    assert "\n" not in said and layer in said and shape in said and "layers='layer4.1.conv2'" in said
    assert no_hooks(resnet)


def test_a_model_with_no_convolution_is_refused():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(hookscope.HookscopeError, match="no nn.Conv2d with a spatial output.*pass layers=") as e:
        hookscope.attribute(net, torch.rand(1, 3, 2, 2), method="guided_gradcam")
    assert "\n" not in str(e.value) and no_hooks(net)
    with pytest.raises(hookscope.HookscopeError, match="pass layers= a layer whose output is B x C x h x w$"):
        hookscope.attribute(net, torch.rand(1, 3, 2, 2), method="guided_gradcam", layers="1")


def test_a_depthwise_last_convolution_asks_for_its_block():
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU()),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2)).eval()
    with pytest.raises(hookscope.HookscopeError, match="'1.0' is depthwise.*pass layers=") as e:
        hookscope.attribute(net, torch.rand(1, 3, 6, 6), method="guided_gradcam")
    assert "\n" not in str(e.value) and no_hooks(net)
    assert hookscope.attribute(net, torch.rand(1, 3, 6, 6), method="guided_gradcam", layers="1").maps.shape == (1, 3, 6, 6)


def test_token_ids_are_refused():
    emb = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    with pytest.raises(hookscope.HookscopeError, match="float inputs") as e:
        hookscope.attribute(emb, torch.tensor([[1, 2, 3]]), method="guided_gradcam", layers="0")
    assert "\n" not in str(e.value) and no_hooks(emb)
