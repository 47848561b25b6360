"""The automatic CAM layer and token / channel layouts (analysis/_layout.py), tried as a hostile user would: each case a model that read
wrong or was refused for a false reason before, now read right (the map worked out here from plain hooks) or
refused in one line naming the fix. Tiny configs built without downloads."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
import hookscope.zoo
from helpers import no_hooks
from hookscope import HookscopeError, cam, feature_maps

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")


def _hand_gradcam(model: nn.Module, x: torch.Tensor, layer: str, to_grid: Callable[[torch.Tensor], torch.Tensor],
                  target: int, output: Callable[[Any], torch.Tensor] = lambda o: o) -> torch.Tensor:
    """Grad-CAM of class ``target`` at ``layer`` from what a plain forward hook keeps (its first tensor)."""
    kept: list[torch.Tensor] = []
    handle = dict(model.named_modules())[layer].register_forward_hook(
        lambda m, a, o: kept.append(o if isinstance(o, torch.Tensor) else o[0]))
    try:
        logits = output(model(x))
    finally:
        handle.remove()
    (g,) = torch.autograd.grad(logits[:, target].sum(), kept[0])
    A, G = to_grid(kept[0].detach()), to_grid(g)
    return torch.relu((G.mean((2, 3))[:, :, None, None] * A).sum(1))


def _tokens(k: int, h: int, w: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t[:, k:].reshape(t.shape[0], h, w, t.shape[2]).permute(0, 3, 1, 2)


def _one_line_refusal(match: str, call: Callable[[], Any], *models: nn.Module) -> str:
    with pytest.raises(HookscopeError, match=match) as e:
        call()
    assert "\n" not in str(e.value) and all(no_hooks(m) for m in models)
    return str(e.value)


# 1. Hiera keeps its tokens unrolled (stages 0-2 are no raster grid); ViTMAE shuffles them (random masking)
def test_models_that_reorder_their_tokens_are_refused_unless_reshape_is_given():
    torch.manual_seed(0)
    hiera = timm.create_model("hiera_tiny_224", pretrained=False, num_classes=3, embed_dim=16, num_heads=1,
                              stages=(1, 1, 1, 1), img_size=(64, 64)).eval()
    x = torch.randn(1, 3, 64, 64)
    _one_line_refusal(r"layer 'blocks.0' gives \(1, 256, 16\).*'unroll' \(Unroll\).*re-orders.*reshape=",
                      lambda: feature_maps(hiera, x, layers="blocks.0"), hiera)
    _one_line_refusal(r"'unroll' \(Unroll\).*reshape=", lambda: cam(hiera, x, target=1), hiera)
    _one_line_refusal(r"'unroll' \(Unroll\)", lambda: cam(hiera, x, layers="blocks.1", target=1), hiera)
    got = cam(hiera, x, layers="blocks.0", target=1, reshape=hookscope.tokens_to_grid(0))  # the way out
    assert got.layouts["blocks.0"] == "reshape=" and got.raw["blocks.0"].shape == (1, 16, 16)
    t = transformers
    mae = t.ViTMAEModel(t.ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                       image_size=32, patch_size=4, mask_ratio=0.0)).eval()  # no patch dropped...
    pooled = lambda o: o.last_hidden_state[:, 0]  # noqa: E731
    _one_line_refusal(r"ViTMAEEmbeddings.*shuffles tokens.*ids_restore",  # ...but their order is random
                      lambda: cam(mae, torch.randn(2, 3, 32, 32), output=pooled, target=1), mae)


# 2. a patch embedding's grid of C channels seen, and N - k matches none of it: never the input-size reading
class Dropper(nn.Module):
    """A Conv2d patch embedding (8 x 8 grid of 16 channels), a class token, then only 16 of the 64 patches kept."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 16, 4, stride=4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.proj(x).flatten(2).transpose(1, 2)[:, ::4]  # 16 patches of 64: no 4 x 4 grid of the image
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], 1)
        return self.head(self.norm(t).mean(1))


def test_tokens_no_count_of_which_completes_the_patch_embeddings_grid_are_refused():
    model = Dropper().eval()
    x = torch.randn(2, 3, 32, 32)  # 17 tokens: 1 + 4x4 fits the input's size, but the Conv2d made 8 x 8
    for run in (lambda: cam(model, x, layers="norm", target=1), lambda: feature_maps(model, x, layers="norm")):
        _one_line_refusal(r"17 tokens of 16 channels, but a Conv2d made a 8x8 grid of 16 channels.*tokens_to_grid",
                          run, model)


# 3. attention recognised by more names; a pooling head's attention after the encoder is not the one
def test_the_automatic_layer_finds_cait_convit_and_siglip_attention_and_refuses_post_norm_swin_v2():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    small = dict(pretrained=False, num_classes=5, depth=2, img_size=32, patch_size=8, embed_dim=32, num_heads=2)
    cases = [(timm.create_model("cait_xxs24_224", **small), "blocks_token_only.1.norm1", 1, "ClassAttn"),
             (timm.create_model("convit_tiny", local_up_to_layer=1, **small), "blocks.1.norm1", 1, "MHSA")]
    for model, layer, k, kind in cases:
        model.eval()
        assert type(dict(model.named_modules())[layer.replace("norm1", "attn")]).__name__ == kind
        res = cam(model, x, target=2)
        assert res.layers == [layer] and res.layouts[layer] == f"tokens(k={k}, 4x4)", res.chosen
        expected = _hand_gradcam(model, x, layer, _tokens(k, 4, 4), 2)
        torch.testing.assert_close(res.raw[layer], expected, rtol=1e-4, atol=1e-6)
        assert bool((expected.flatten(1).amax(1) > 0).all()) and no_hooks(model)
    t = transformers
    siglip = t.SiglipVisionModel(t.SiglipVisionConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=2)).eval()
    pooled = lambda o: o.pooler_output  # noqa: E731  (after the pooling head's nn.MultiheadAttention)
    res = cam(siglip, x, output=pooled, target=3)
    layer = "encoder.layers.1.layer_norm1"
    assert res.layers == [layer] and res.layouts[layer] == "tokens(k=0, 4x4)", res.chosen
    torch.testing.assert_close(res.raw[layer], _hand_gradcam(siglip, x, layer, _tokens(0, 4, 4), 3, pooled),
                               rtol=1e-4, atol=1e-6)
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    v2 = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4],
                         num_classes=5, block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2).eval()
    _one_line_refusal(r"last attention 'features.3.0.attn' has no norm before it.*post-norm.*layers=",
                      lambda: cam(v2, x, target=1), v2)


# 4. ConvNeXt with 1 x 1 conv MLPs: the block's output, not a conv inside its residual branch
def test_convnext_with_conv_mlps_takes_the_blocks_output_and_other_branches_keep_the_last_conv():
    torch.manual_seed(0)
    net = timm.create_model("convnext_atto", pretrained=False, num_classes=3).eval()
    nn.init.normal_(net.head.fc.weight)
    x = torch.randn(2, 3, 64, 64)
    res = cam(net, x, target=1)
    assert res.layers == ["stages.3.blocks.1"] and res.layouts["stages.3.blocks.1"] == "BCHW"
    assert ("'stages.3.blocks.1.mlp.fc2', is inside that block, in the residual branch of its depthwise Conv2d "
            "'stages.3.blocks.1.conv_dw'") in res.chosen
    torch.testing.assert_close(res.raw["stages.3.blocks.1"],
                               _hand_gradcam(net, x, "stages.3.blocks.1", lambda t: t, 1), rtol=1e-4, atol=1e-6)

    class TwoBranch(nn.Module):  # the last map is a pooling branch's: it does not hold the depthwise conv
        def __init__(self) -> None:
            super().__init__()
            self.dw, self.pool, self.fc = nn.Conv2d(3, 3, 3, padding=1, groups=3), nn.AvgPool2d(3, 1, 1), nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc((self.dw(x) + self.pool(x)).mean((2, 3)))

    pooled = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                           nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 4)).eval()
    for model, conv in ((TwoBranch().eval(), "dw"), (pooled, "2")):
        got = cam(model, torch.randn(2, 3, 4, 4), target=1)
        assert got.chosen == f"{conv} (the last Conv2d with a spatial output)" and no_hooks(model)


# 5. a Linear along the width of a B x C x H x W map does not make it channels last
class WidthMix(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.stem, self.wmix, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(width, width), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.stem(x))
        return self.head((f + self.wmix(f)).mean((2, 3)))


@pytest.mark.parametrize("size", [(16, 16), (16, 24)])
def test_a_linear_along_the_width_is_refused_when_the_channels_last_grid_is_no_grid_of_the_input(size):
    model = WidthMix(size[1]).eval()
    x = torch.randn(2, 3, *size)
    for run in (lambda: cam(model, x, layers="wmix", target=1), lambda: feature_maps(model, x, layers="wmix")):
        _one_line_refusal(rf"channels last to the Linear that makes it, but its 8 x {size[0]} grid is no grid of the "
                          rf"input's {size[0]} x {size[1]}.*channels_first", run, model)
    got = cam(model, x, layers="wmix", target=1, reshape=hookscope.channels_first)
    torch.testing.assert_close(got.raw["wmix"], _hand_gradcam(model, x, "wmix", lambda t: t, 1), rtol=1e-4, atol=1e-6)


# 6. without evidence for k, only k = 0 or the tokens of the model's 1 x n x C parameters
class Extra(nn.Module):
    """Linear patch embedding (no Conv2d grid) after ``extra`` tokens: a learned parameter, or a buffer."""

    def __init__(self, extra: int, learned: bool) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Linear(3 * 64, 16), nn.LayerNorm(16), nn.Linear(16, 5)
        self.pos = nn.Parameter(torch.zeros(1, 2, 16))  # a "pos" parameter is no token count
        self.extra: torch.Tensor
        if learned:
            self.extra = nn.Parameter(torch.randn(1, extra, 16))
        else:
            self.register_buffer("extra", torch.randn(1, extra, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(nn.functional.unfold(x, 8, stride=8).transpose(1, 2))
        t = torch.cat([self.extra.expand(x.shape[0], -1, -1), t], 1)
        return self.head(self.norm(t).mean(1))


def test_prefix_tokens_nothing_counts_are_refused_and_the_token_parameters_count_them():
    x = torch.randn(2, 3, 24, 40)  # a 3 x 5 grid: 10 + 3x5 was the one strided reading taken before
    text = _one_line_refusal(r"25 tokens.*nothing tells how many prefix tokens", lambda: cam(
        Extra(10, learned=False).eval(), x, layers="norm", target=1))
    assert "grid=(h, w)" in text and "--grid HxW" in text  # a 3 x 5 grid is not square: tokens_to_grid needs grid=
    for extra in (0, 1, 10):
        model = Extra(extra, learned=True).eval()
        res = cam(model, x, layers="norm", target=1)
        assert res.layouts["norm"] == f"tokens(k={extra}, 3x5)"
        expected = _hand_gradcam(model, x, "norm", _tokens(extra, 3, 5), 1)
        torch.testing.assert_close(res.raw["norm"], expected, rtol=1e-4, atol=1e-6)


# 7. Score-CAM on an untrained zero head: every masked input scores the same
def test_scorecam_says_when_every_masked_input_scores_the_same():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
                            num_classes=5).eval()  # weights=None: a zero head, all logits equal
    with pytest.warns(UserWarning, match=r"every masked input of samples 0, 1 scores the same.*untrained") as caught:
        res = cam(vit, torch.randn(2, 3, 32, 32), method="scorecam", target=1)
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and len(res.notes) == 1
    assert f"note: {res.notes[0]}" in res.table()
    nn.init.normal_(vit.heads.head.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cam(vit, torch.randn(2, 3, 32, 32), method="scorecam", target=1).notes == []
    assert no_hooks(vit)


# 9. an HF Swin stage returns a tuple: feature maps read its first tensor, as cam does
def test_feature_maps_of_a_layer_returning_a_tuple_read_its_first_tensor_as_cam_does():
    t = transformers
    torch.manual_seed(0)
    swin = t.SwinModel(t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                                    window_size=4)).eval()
    x = torch.randn(2, 3, 32, 48)
    with hookscope.capture(swin, "encoder.layers.0") as rec:
        swin(x)
    first = rec["encoder.layers.0"].output[0]  # B x (4*6) x 32: merged patches
    fm = feature_maps(swin, x, layers="encoder.layers.0")
    assert fm.layout == "tokens(k=0, 4x6)"
    torch.testing.assert_close(fm.maps, _tokens(0, 4, 6)(first), rtol=1e-5, atol=1e-6)  # another pass: rounding
    res = cam(swin, x, layers="encoder.layers.0", output=lambda o: o.pooler_output, target=1)
    assert res.layouts["encoder.layers.0"] == fm.layout and no_hooks(swin)


# 10. a compiled model: hooks run eagerly between graph pieces, and the maps are the eager model's
@pytest.mark.slow
def test_cam_on_a_compiled_model_gives_the_eager_models_maps():
    torch.manual_seed(0)
    net = hookscope.zoo.TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(net)
    for kw in ({"layers": "layer2"}, {}):
        eager, got = cam(net, x, target=1, **kw), cam(compiled, x, target=1, **kw)
        assert got.layers == eager.layers and got.chosen == eager.chosen
        torch.testing.assert_close(got.maps, eager.maps, rtol=1e-4, atol=1e-5)
    assert no_hooks(net)


# 11. a target object that carries its class (hookscope.targets.Class) is read as that index
def test_a_target_with_a_class_index_is_that_index():
    class Kind:
        def __init__(self, index: int | list[int]) -> None:
            self.class_index = index

        def __call__(self, out: torch.Tensor) -> torch.Tensor:  # a function too: the index must win
            raise AssertionError("called")

    net = hookscope.zoo.TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    for index in (3, [1, 4]):
        for method in ("gradcam", "cam"):
            got, plain = cam(net, x, layers="layer2", target=Kind(index), method=method), \
                cam(net, x, layers="layer2", target=index, method=method)
            assert got.targets is not None and got.targets.tolist() == plain.targets.tolist()
            assert torch.equal(got.maps, plain.maps)
    assert cam(net, x, layers="layer2", target=Kind([4])).targets.tolist() == [4, 4]  # one row for every sample
