"""Token layouts (``B x (k + h*w) x C``) read by themselves where certain, refused in one line where not; the
automatic CAM layer of transformers (the last block's first norm) and of ConvNeXt (the last block's output),
stated in the result; a blank map from a zero gradient said, not passed off as an answer.

Every expected map is Grad-CAM worked out here from the activation and gradient that plain hooks capture,
reshaped by hand. Models are built from configs or ``weights=None``, two blocks, width 32."""

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

SMALL = dict(pretrained=False, patch_size=8, depth=2, embed_dim=32, num_heads=2, num_classes=5)
HF = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
          intermediate_size=64, num_labels=5)


def _logits(o: Any) -> torch.Tensor:
    return o if isinstance(o, torch.Tensor) else o.logits


def _tv_vit() -> nn.Module:
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                            num_classes=5)
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero
    return vit


def _hf(kind: str) -> nn.Module:
    t = transformers
    if kind == "vit":
        return t.ViTForImageClassification(t.ViTConfig(**HF))
    if kind == "deit":
        return t.DeiTForImageClassificationWithTeacher(t.DeiTConfig(**HF))
    return t.SwinForImageClassification(t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                     num_heads=[2, 2], window_size=4, num_labels=5))


# (builder, input size, the layer the literature uses, k, h x w)
CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, int], str, int, tuple[int, int]]] = {
    "torchvision-vit": (_tv_vit, (32, 32), "encoder.layers.encoder_layer_1.ln_1", 1, (4, 4)),
    "timm-vit": (lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, **SMALL), (32, 32),
                 "blocks.1.norm1", 1, (4, 4)),
    "timm-vit-non-square": (lambda: timm.create_model("vit_tiny_patch16_224", img_size=(32, 48), **SMALL),
                            (32, 48), "blocks.1.norm1", 1, (4, 6)),
    "timm-deit-distilled": (lambda: timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, **SMALL),
                            (32, 32), "blocks.1.norm1", 2, (4, 4)),
    "timm-vit-registers": (lambda: timm.create_model("vit_small_patch14_reg4_dinov2", img_size=32, **SMALL),
                           (32, 32), "blocks.1.norm1", 5, (4, 4)),
    "hf-vit": (lambda: _hf("vit"), (32, 32), "vit.layers.1.layernorm_before", 1, (4, 4)),
    "hf-deit": (lambda: _hf("deit"), (32, 32), "deit.layers.1.layernorm_before", 2, (4, 4)),
    "hf-swin": (lambda: _hf("swin"), (32, 32), "swin.encoder.layers.1.blocks.0.layernorm_before", 0, (4, 4)),
}


def _hand_gradcam(model: nn.Module, x: torch.Tensor, layer: str, to_grid: Callable[[torch.Tensor], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Grad-CAM of the predicted class at ``layer``, from what a plain forward hook keeps, and the targets."""
    kept: list[torch.Tensor] = []
    handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        logits = _logits(model(x))
    finally:
        handle.remove()
    target = logits.argmax(1)
    (g,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), kept[0])
    A, G = to_grid(kept[0].detach()), to_grid(g)
    return torch.relu((G.mean((2, 3))[:, :, None, None] * A).sum(1)), target


def _by_hand(k: int, h: int, w: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def to_grid(t: torch.Tensor) -> torch.Tensor:  # drop k tokens, lay the rest out row by row, channels first
        B, _, C = t.shape
        return t[:, k:].reshape(B, h, w, C).permute(0, 3, 1, 2)

    return to_grid


@pytest.mark.parametrize("case", list(CASES))
def test_the_automatic_layer_is_the_last_blocks_first_norm_and_its_map_is_gradcam_by_hand(case):
    build, size, layer, k, (h, w) = CASES[case]
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(2, 3, *size)
    res = cam(model, x, output=_logits)
    assert res.layers == [layer] and res.layouts[layer] == f"tokens(k={k}, {h}x{w})"
    assert res.chosen is not None and res.chosen.startswith(f"{layer} (the last block's first norm")
    assert f"layer chosen automatically: {layer} (the last block's first norm" in res.table()
    assert res.to_dict()["chosen"] == res.chosen and res.notes == []
    expected, target = _hand_gradcam(model, x, layer, _by_hand(k, h, w))
    assert torch.equal(res.targets, target) and res.raw[layer].shape == (2, h, w)
    torch.testing.assert_close(res.raw[layer], expected, rtol=1e-4, atol=1e-6)
    assert (expected.flatten(1).amax(1) > 0).all()  # a real map, not two blank ones that agree
    assert no_hooks(model)


def test_a_token_layer_given_by_name_is_read_by_itself_and_feature_maps_read_it_the_same_way():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    given = cam(model, x, layers="blocks.0.norm2")
    assert given.chosen is None and given.layouts["blocks.0.norm2"] == "tokens(k=1, 4x4)"
    expected, _ = _hand_gradcam(model, x, "blocks.0.norm2", _by_hand(1, 4, 4))
    torch.testing.assert_close(given.raw["blocks.0.norm2"], expected, rtol=1e-4, atol=1e-6)
    with hookscope.capture(model, "blocks.0.norm2") as rec:
        model(x)
    fm = feature_maps(model, x, layers="blocks.0.norm2")
    assert fm.layout == "tokens(k=1, 4x4)" and torch.equal(fm.maps, _by_hand(1, 4, 4)(rec["blocks.0.norm2"].output))
    assert no_hooks(model)


def test_the_last_blocks_output_reaches_the_head_through_the_class_token_only_and_is_refused():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, **SMALL).eval()
    with pytest.raises(HookscopeError, match="gradient reaches only positions that reshape= drops") as e:
        cam(model, torch.randn(2, 3, 32, 32), layers="blocks.1")
    assert "\n" not in str(e.value) and no_hooks(model)


class LinearTokens(nn.Module):
    """Patches embedded by a Linear (no Conv2d grid), ``extra`` tokens concatenated under an unknown name: learned
    (a 1 x extra x C parameter, which counts them) or a buffer (nothing counts them)."""

    def __init__(self, extra: int, patch: int = 8, learned: bool = True) -> None:
        super().__init__()
        self.patch, self.embed = patch, nn.Linear(3 * patch * patch, 16)
        self.extra: torch.Tensor
        if learned:
            self.extra = nn.Parameter(torch.randn(1, extra, 16))
        else:
            self.register_buffer("extra", torch.randn(1, extra, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = nn.functional.unfold(x, self.patch, stride=self.patch).transpose(1, 2)  # B x (h*w) x 3*p*p
        t = torch.cat([self.extra.expand(x.shape[0], -1, -1), self.embed(p)], 1)
        return self.head(self.norm(t).mean(1))


def test_token_counts_nothing_decides_are_refused_in_one_line_and_one_strided_reading_is_taken():
    # 17 tokens of a 32 x 32 input: 1 + 4x4, 13 + 2x2 or 16 + 1x1, and nothing says which
    model = LinearTokens(extra=1, learned=False).eval()
    with pytest.raises(HookscopeError, match=r"17 tokens.*1 \+ 4x4 or 13 \+ 2x2.*tokens_to_grid\(skip=K\).*--tokens K") as e:
        cam(model, torch.randn(2, 3, 32, 32), layers="norm")
    assert "\n" not in str(e.value) and no_hooks(model)
    with pytest.raises(HookscopeError, match="tokens_to_grid") as e:
        feature_maps(model, torch.randn(2, 3, 32, 32), layers="norm")
    assert "\n" not in str(e.value) and no_hooks(model)
    # 24 x 40 through stride 8 is 3 x 5; strides 1, 2, 4 and 8 give 960, 240, 60 and 15 patches: 3 + 15 only
    model = LinearTokens(extra=3).eval()
    x = torch.randn(2, 3, 24, 40)
    res = cam(model, x, layers="norm")
    assert res.layouts["norm"] == "tokens(k=3, 3x5)"
    expected, _ = _hand_gradcam(model, x, "norm", _by_hand(3, 3, 5))
    torch.testing.assert_close(res.raw["norm"], expected, rtol=1e-4, atol=1e-6)
    assert no_hooks(model)


def test_the_users_token_count_decides_and_a_count_no_grid_fits_is_refused():
    model = LinearTokens(extra=1).eval()
    x = torch.randn(2, 3, 32, 32)
    model.num_prefix_tokens = 1  # as timm says it
    assert cam(model, x, layers="norm").layouts["norm"] == "tokens(k=1, 4x4)"
    model.num_prefix_tokens = 2  # wrong: 15 patches are no grid of 32 x 32
    with pytest.raises(HookscopeError, match=r"puts 2 tokens first and no grid fits.*--tokens K") as e:
        cam(model, x, layers="norm")
    assert "\n" not in str(e.value) and no_hooks(model)
    got = cam(model, x, layers="norm", reshape=hookscope.tokens_to_grid(skip=1))  # the way out it names
    assert got.layouts["norm"] == "reshape=" and got.raw["norm"].shape == (2, 4, 4)


def test_a_zero_initialised_head_warns_in_one_line_and_the_result_says_the_maps_are_blank():
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                            num_classes=5).eval()  # weights=None: the head is all zeros, so are the logits
    with pytest.warns(UserWarning, match=r"exactly zero for samples 0, 1.*all logits are equal") as caught:
        res = cam(vit, torch.randn(2, 3, 32, 32))
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert len(res.notes) == 1 and f"note: {res.notes[0]}" in res.table() and res.to_dict()["notes"] == res.notes
    assert bool((res.maps == 0).all()) and no_hooks(vit)
    nn.init.normal_(vit.heads.head.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a trained-looking head: no warning
        assert cam(vit, torch.randn(2, 3, 32, 32)).notes == []


def test_swin_and_convnext_from_torchvision():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    from torchvision.models.swin_transformer import SwinTransformer

    x = torch.randn(2, 3, 32, 32)
    swin = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4],
                           num_classes=5).eval()
    res = cam(swin, x)
    assert res.layers == ["features.3.0.norm1"] and res.layouts["features.3.0.norm1"] == "BHWC"
    expected, _ = _hand_gradcam(swin, x, "features.3.0.norm1", lambda t: t.permute(0, 3, 1, 2))
    torch.testing.assert_close(res.raw["features.3.0.norm1"], expected, rtol=1e-4, atol=1e-6)
    # ConvNeXt: the last conv is depthwise, mid-block; the block's output (after its in-place residual add)
    net = ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=5).eval()
    res = cam(net, x)
    assert res.layers == ["features.3.0"] and "'features.3.0.block.0', is depthwise" in res.table()
    expected, _ = _hand_gradcam(net, x, "features.3.0", lambda t: t)
    torch.testing.assert_close(res.raw["features.3.0"], expected, rtol=1e-4, atol=1e-6)
    assert no_hooks(swin) and no_hooks(net)


def test_a_cnn_keeps_its_last_convolution_and_says_so():
    net = hookscope.zoo.TinyResNet().eval()
    res = cam(net, torch.randn(2, 3, 32, 32))
    assert res.chosen == f"{res.layers[0]} (the last Conv2d with a spatial output)"
    assert cam(net, torch.randn(2, 3, 32, 32), layers=res.layers[0]).chosen is None


class TorchEncoder(nn.Module):
    """A ViT of plain torch parts: a Conv2d patch embedding, a class token, nn.TransformerEncoder."""

    def __init__(self, norm_first: bool) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 16, 8, stride=8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 16))
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patches(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], 1)
        return self.head(self.encoder(t)[:, 0])


def test_plain_torch_pre_norm_encoder_is_found_and_a_post_norm_one_is_refused_in_one_line():
    pre = TorchEncoder(norm_first=True).eval()
    x = torch.randn(2, 3, 24, 40)  # a 3 x 5 grid
    res = cam(pre, x)
    assert res.layers == ["encoder.layers.1.norm1"] and res.layouts["encoder.layers.1.norm1"] == "tokens(k=1, 3x5)"
    expected, _ = _hand_gradcam(pre, x, "encoder.layers.1.norm1", _by_hand(1, 3, 5))
    torch.testing.assert_close(res.raw["encoder.layers.1.norm1"], expected, rtol=1e-4, atol=1e-6)
    post = TorchEncoder(norm_first=False).eval()  # attention first, its norm after: no input of the mixing to pick
    with pytest.raises(HookscopeError, match=r"last attention 'encoder.layers.1.self_attn' has no norm before it.*layers=") as e:
        cam(post, x)
    assert "\n" not in str(e.value) and no_hooks(pre) and no_hooks(post)
