"""Real torchvision models and the traps users meet with hooks on them: keeping a layer's input and output, the in-place trap, the wrapper trap.

Every model is built with ``weights=None`` (nothing is downloaded) and every test ends by checking
that no hook is left on the model.
"""

from __future__ import annotations

import fnmatch

import pytest
import torch
import torchvision
from helpers import no_hooks
from torch import nn

import hookscope
from hookscope import MutationError


# --- helpers: the same computations done by hand, without any hook --------------------------------
def resnet_stem(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m.maxpool(m.relu(m.bn1(m.conv1(x))))


def basic_block_before_add(b: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision BasicBlock up to ``bn2``: the tensor ``out += identity`` then writes into."""
    return b.bn2(b.conv2(b.relu(b.bn1(b.conv1(x)))))


def bottleneck_before_add(b: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision Bottleneck up to ``bn3``."""
    return b.bn3(b.conv3(b.relu(b.bn2(b.conv2(b.relu(b.bn1(b.conv1(x))))))))


def model(name: str, **kw: object) -> nn.Module:
    return getattr(torchvision.models, name)(weights=None, **kw).eval()


# --- story 3: every Conv2d of a ResNet-34, in call order -----------------------------------------
def test_story3_every_conv_of_resnet34_in_call_order():
    net = model("resnet34")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        with hookscope.capture(net, nn.Conv2d, keep=("input", "output")) as rec:
            net(x)
        first = net.conv1(x)

    expected = ["conv1"]
    for layer, blocks in zip(range(1, 5), (3, 4, 6, 3)):
        for b in range(blocks):
            expected += [f"layer{layer}.{b}.conv1", f"layer{layer}.{b}.conv2"]
            if b == 0 and layer > 1:
                expected.append(f"layer{layer}.{b}.downsample.0")  # runs after conv2 in forward
    assert len(expected) == 36
    assert len(rec.calls) == 36
    assert [c.name for c in rec.calls] == expected
    assert [c.index for c in rec.calls] == list(range(36))

    c0 = rec.calls[0]
    assert c0.name == "conv1"
    assert c0.output.shape == (1, 64, 112, 112)
    assert c0.input.shape == (1, 3, 224, 224)
    assert torch.equal(c0.input, x)
    assert torch.equal(c0.output, first)
    modules = dict(net.named_modules())
    for c in rec.calls:  # each record has the channels of its own convolution
        assert c.output.shape[1] == modules[c.name].out_channels
        assert c.input.shape[1] == modules[c.name].in_channels
    assert rec.calls[-1].output.shape == (1, 512, 7, 7)
    assert no_hooks(net)


# --- story 4: `out += identity` in torchvision's residual blocks ---------------------------------
@pytest.mark.parametrize(
    ("arch", "layer", "before_add"),
    [("resnet18", "layer1.0.bn2", basic_block_before_add), ("resnet50", "layer1.0.bn3", bottleneck_before_add)],
    ids=["BasicBlock", "Bottleneck"],
)
def test_residual_add_in_place_does_not_rewrite_the_record(arch, layer, before_add):
    net = model(arch)
    x = torch.randn(1, 3, 64, 64)
    with hookscope.capture(net, layer) as rec:
        net(x)  # grad mode on, as in ordinary use
    with torch.no_grad():
        ref = before_add(net.layer1[0], resnet_stem(net, x))
    got = rec[layer].output
    assert type(got) is torch.Tensor
    assert torch.equal(got, ref)
    assert got.min() < 0

    # the trap: a plain hook that keeps output.detach() by reference sees `+= identity` and the ReLU
    naive: list[torch.Tensor] = []
    handle = net.get_submodule(layer).register_forward_hook(lambda m, i, o: naive.append(o.detach()))
    try:
        net(x)
    finally:
        handle.remove()
    assert naive[0].min() == 0
    assert not torch.equal(naive[0], ref)
    assert no_hooks(net)


# --- story 4: in-place ReLU right after the recorded module --------------------------------------
def test_alexnet_first_conv_before_its_inplace_relu():
    net = model("alexnet")
    assert isinstance(net.features[1], nn.ReLU) and net.features[1].inplace
    x = torch.randn(1, 3, 64, 64)
    with hookscope.capture(net, "features.0") as rec:
        net(x)
    with torch.no_grad():
        ref = net.features[0](x)
    got = rec["features.0"].output
    assert torch.equal(got, ref)
    assert (got < 0).any()

    # and the user is told, not lied to, when asking for no copy at all
    with hookscope.capture(net, "features.0", copy="never") as rec_never:
        net(x)
    with pytest.raises(MutationError):
        rec_never["features.0"].output
    assert no_hooks(net)


def test_densenet_features_before_functional_inplace_relu():
    net = model("densenet121")
    x = torch.randn(1, 3, 64, 64)
    with hookscope.capture(net, "features") as rec:
        y = net(x)
    with torch.no_grad():
        ref = net.features(x)
        y_ref = net(x)
    got = rec["features"].output
    assert (got < 0).any()
    assert torch.equal(got, ref)
    assert torch.equal(y.detach(), y_ref)

    naive: list[torch.Tensor] = []
    handle = net.features.register_forward_hook(lambda m, i, o: naive.append(o.detach()))
    try:
        net(x)
    finally:
        handle.remove()
    assert naive[0].min() == 0  # F.relu(features, inplace=True) rewrote the plain hook's tensor
    assert no_hooks(net)


# --- capturing every module changes nothing the model computes -----------------------------------
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_resnet18_output_bit_identical_with_every_module_captured(mode):
    net = model("resnet18")
    x = torch.randn(2, 3, 64, 64)
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with ctx():
        y0 = net(x)
        with hookscope.capture(net) as rec:
            y1 = net(x)
        y2 = net(x)
    assert type(y1) is torch.Tensor
    assert torch.equal(y0, y1) and torch.equal(y1, y2)
    assert set(rec) == set(hookscope.names(net))
    with torch.no_grad():
        ref = basic_block_before_add(net.layer1[0], resnet_stem(net, x))
    bn2 = rec["layer1.0.bn2"].output
    assert type(bn2) is torch.Tensor
    assert torch.equal(bn2, ref) and bn2.min() < 0
    assert torch.equal(rec["fc"].output, y0)
    assert no_hooks(net)


# --- story 5: the wrapper trap -------------------------------------------------------------------
def test_dataparallel_names_are_those_of_the_model_inside():
    net = model("resnet18")
    dp = nn.DataParallel(net)  # on the CPU it only wraps
    assert "module.layer1.0.conv1" in dict(dp.named_modules())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = net.layer1[0].conv1(resnet_stem(net, x))
        y_ref = net(x)
    for spelling in ("layer1.0.conv1", "module.layer1.0.conv1"):
        with torch.no_grad():
            with hookscope.capture(dp, spelling) as rec:
                y = dp(x)
        assert type(y) is torch.Tensor and torch.equal(y, y_ref)
        assert rec.selected == ("layer1.0.conv1",)
        assert list(rec) == ["layer1.0.conv1"]
        assert rec["module.layer1.0.conv1"] is rec["layer1.0.conv1"]
        assert "module.layer1.0.conv1" in rec
        assert torch.equal(rec["layer1.0.conv1"].output, ref)
        assert no_hooks(dp) and no_hooks(net)

    names = [n for n, _ in hookscope.layers(dp, "layer1.*")]
    assert names == [n for n, _ in net.named_modules() if fnmatch.fnmatchcase(n, "layer1.*")]
    assert names and not any(n.startswith("module.") for n in names)
    assert [m for _, m in hookscope.layers(dp, "layer1.*")] == [m for _, m in hookscope.layers(net, "layer1.*")]
    assert hookscope.names(dp) == hookscope.names(net)
    assert no_hooks(dp)


def test_dataparallel_alexnet_features_story5():
    net = model("alexnet")
    dp = nn.DataParallel(net)
    x = torch.randn(1, 3, 64, 64)
    with hookscope.capture(dp, "module.features") as rec:
        dp(x)
    with torch.no_grad():
        ref = net.features(x)
    assert list(rec) == ["features"]
    assert torch.equal(rec["features"].output, ref)
    assert torch.equal(rec["module.features"].output, ref)
    assert no_hooks(dp)


def test_torch_compile_names_resolve_without_compiling():
    net = model("resnet18")
    compiled = torch.compile(net)  # lazy: nothing is compiled until it is called
    assert type(compiled).__name__ == "OptimizedModule"
    assert "_orig_mod.layer1.0.conv1" in dict(compiled.named_modules())
    target = net.layer1[0].conv1
    assert hookscope.layers(compiled, "layer1.0.conv1") == [("layer1.0.conv1", target)]
    assert hookscope.layers(compiled, "_orig_mod.layer1.0.conv1") == [("layer1.0.conv1", target)]
    assert hookscope.names(compiled) == hookscope.names(net)
    inner, prefix = hookscope.unwrap(compiled)
    assert inner is net and prefix == "_orig_mod."

    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = target(resnet_stem(net, x))
        with hookscope.capture(compiled, "_orig_mod.layer1.0.conv1") as rec:
            net(x)  # the eager model inside: hooks are on its modules, nothing is compiled
    assert list(rec) == ["layer1.0.conv1"]
    assert torch.equal(rec["_orig_mod.layer1.0.conv1"].output, ref)
    assert torch.equal(rec["layer1.0.conv1"].output, ref)
    assert no_hooks(compiled) and no_hooks(net)


@pytest.mark.slow
def test_torch_compile_called_inside_a_capture():
    # If this machine had no C compiler, inductor would raise here: that is a failure to report,
    # not something to skip.
    torch._dynamo.reset()
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1)
    ).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref0 = net[0](x)
        ref2 = net(x)
    compiled = torch.compile(net)
    try:
        with torch.no_grad():
            with hookscope.capture(compiled, "0", "_orig_mod.2") as rec:
                y = compiled(x)
        assert type(y) is torch.Tensor
        torch.testing.assert_close(y, ref2)  # inductor may reorder float ops: not bit-identical
        assert list(rec) == ["0", "2"]
        got = rec["_orig_mod.0"].output
        assert (got < 0).any()  # the in-place ReLU inside the compiled model did not rewrite it
        torch.testing.assert_close(got, ref0)
        torch.testing.assert_close(rec["2"].output, ref2)
        assert no_hooks(compiled)

        # a capture opened after the model was compiled still records (hooks are not guarded away)
        with torch.no_grad():
            with hookscope.capture(compiled, "0") as rec2:
                compiled(x)
        assert len(rec2.calls) == 1
        torch.testing.assert_close(rec2["0"].output, ref0)
        assert (rec2["0"].output < 0).any()
        assert no_hooks(compiled) and no_hooks(net)
    finally:
        torch._dynamo.reset()


# --- gradients with an in-place op right after the module (pytorch/pytorch#61519) ----------------
def test_grad_output_of_bn2_before_residual_add_and_inplace_relu():
    net = model("resnet18")
    layer = "layer1.0.bn2"
    bn2 = net.get_submodule(layer)
    x = torch.randn(1, 3, 64, 64).requires_grad_(True)

    with hookscope.capture(net, layer, keep="grad_output") as rec:
        net(x).sum().backward()
    got = rec[layer].grad_output
    assert got is not None and got.shape == (1, 64, 16, 16)

    # reference 1: a plain hook keeps the output with its graph and lets the model go on with a
    # clone, so `out += identity` and the ReLU cannot rebase the stored tensor
    store: dict[str, torch.Tensor] = {}

    def keep_and_clone(m, i, o):
        store["o"] = o
        return o.clone()

    handle = bn2.register_forward_hook(keep_and_clone)
    try:
        y = net(x)
    finally:
        handle.remove()
    (ref,) = torch.autograd.grad(y.sum(), store["o"])
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    assert (got == 0).any()  # the block's ReLU masks part of it

    # reference 2: a plain hook that returns nothing and stores `o`: after `out += identity` and
    # `relu_`, `o` *is* the block's output, so autograd.grad gives the gradient of the block output,
    # which is not bn2's grad_output; masked by the ReLU it is.
    store.clear()
    handle = bn2.register_forward_hook(lambda m, i, o: store.__setitem__("o", o))
    try:
        y = net(x)
    finally:
        handle.remove()
    (g_block,) = torch.autograd.grad(y.sum(), store["o"])
    assert not torch.allclose(g_block, got, atol=1e-6)
    torch.testing.assert_close(got, g_block * (store["o"] > 0), atol=1e-6, rtol=0)

    # the trap hookscope avoids: register_full_backward_hook raises on this very layer
    handle = bn2.register_full_backward_hook(lambda m, gi, go: None)
    try:
        with pytest.raises(RuntimeError, match="modified inplace"):
            net(x).sum().backward()
    finally:
        handle.remove()
    assert no_hooks(net)


def test_grad_output_of_bn2_in_train_mode():
    net = model("resnet18").train()
    layer = "layer1.0.bn2"
    x = torch.randn(2, 3, 64, 64).requires_grad_(True)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    with hookscope.capture(net, layer, keep=("output", "grad_output")) as rec:
        net(x).sum().backward()
    got = rec[layer].grad_output
    assert rec[layer].output.min() < 0

    net.load_state_dict(state)  # same running stats for the reference pass
    store: dict[str, torch.Tensor] = {}

    def keep_and_clone(m, i, o):
        store["o"] = o
        return o.clone()

    handle = net.get_submodule(layer).register_forward_hook(keep_and_clone)
    try:
        y = net(x)
    finally:
        handle.remove()
    (ref,) = torch.autograd.grad(y.sum(), store["o"])
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    assert torch.equal(rec[layer].output, store["o"].detach())
    assert no_hooks(net)
