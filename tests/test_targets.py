"""hookscope.targets: segmentation, detection, similarity and class targets for cam() and the metrics.

Every score is checked against the same quantity computed by hand; Grad-CAM with a target against
Grad-CAM computed by hand (``autograd.grad`` on the layer's output captured by a hook of the test's own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookscope
from hookscope import metrics
from hookscope.analysis._targets import for_rows, read_logits
from hookscope.targets import Class, Detection, Segmentation, Similarity
from helpers import FakeModelOutput, no_hooks


# --- tiny models --------------------------------------------------------------------------------------
class TinySeg(nn.Module):
    """B x 3 x H x W -> B x 4 classes x H x W logits, as a tensor, torchvision's dict or HF's .logits."""

    def __init__(self, kind: str = "tensor") -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(6, 4, 1)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        y = self.head(self.body(x))
        if self.kind == "dict":
            return {"out": y, "aux": y * 0}
        if self.kind == "hf":
            return FakeModelOutput(logits=y)
        return y


class TinyEmbed(nn.Module):
    """B x 3 x H x W -> B x 5 embedding (conv, ReLU, global average pool, linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def gradcam_by_hand(model: nn.Module, x: torch.Tensor, layer: str, score: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(Grad-CAM raw map, score) with the layer's output kept by a hook of our own."""
    kept: list[torch.Tensor] = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: kept.append(o))
    try:
        out = model(x.clone().requires_grad_())
    finally:
        handle.remove()
    A = kept[0] if isinstance(kept[0], torch.Tensor) else next(iter(kept[0].values()))
    s = score(out)
    (g,) = torch.autograd.grad(s.sum(), A)
    return (g.mean((2, 3), keepdim=True) * A).sum(1).clamp(min=0).detach(), s.detach()


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


# --- Segmentation -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["tensor", "dict", "hf"])
def test_segmentation_score_is_the_masked_sum(kind):
    net = TinySeg(kind).eval()
    x = torch.randn(2, 3, 6, 5)
    logits = TinySeg.forward(net, x)
    y = logits if kind == "tensor" else logits["out"] if kind == "dict" else logits.logits
    shared = torch.zeros(6, 5, dtype=torch.bool)
    shared[1:3, 2:5] = True
    per = torch.zeros(2, 6, 5)
    per[0, 0, 0] = per[1, 5, 4] = per[1, 2, 2] = 1
    assert torch.allclose(Segmentation(2, shared)(logits), y[:, 2, 1:3, 2:5].sum((1, 2)))
    assert torch.allclose(Segmentation(1, per)(logits), torch.stack([y[0, 1, 0, 0], y[1, 1, 5, 4] + y[1, 1, 2, 2]]))
    predicted = y.argmax(1) == 3
    assert predicted.flatten(1).any(1).all()  # the seed gives class 3 a region in both images
    assert torch.allclose(Segmentation(3)(logits), (y[:, 3] * predicted).sum((1, 2)))


def test_segmentation_gradcam_equals_gradcam_by_hand():
    net = TinySeg("dict").eval()
    x = torch.randn(2, 3, 8, 8)
    mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    mask[0, :4, :4] = mask[1, 4:, 2:] = True
    target = Segmentation(1, mask)
    res = hookscope.cam(net, x, layers="body", target=target)
    by_hand, score = gradcam_by_hand(net, x, "body", lambda o: (o["out"][:, 1] * mask).sum((1, 2)))
    assert torch.allclose(res.scores, score, atol=1e-6)
    assert torch.allclose(res.raw["body"], by_hand, atol=1e-6)
    assert res.raw["body"].flatten(1).amax(1).gt(0).all()
    assert no_hooks(net)


def _calibrated(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """Batch norms' running statistics set from ``x`` (a randomly built deep net's features otherwise
    shrink to ~1e-8 through its many eval-mode batch norms, so every score and map is flat)."""
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain average over the calibration batch
        m.train()
    with torch.no_grad():
        model(x)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name, layer", [("fcn_resnet50", "backbone.layer4"),
                                         ("deeplabv3_mobilenet_v3_large", "backbone.12")])
def test_segmentation_on_torchvision_models(name, layer):
    import torchvision

    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5)
    x = torch.rand(1, 3, 64, 64)
    _calibrated(model, torch.rand(2, 3, 64, 64))
    with torch.no_grad():
        y = model(x)["out"]
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[10:40, 20:50] = True
    assert torch.allclose(Segmentation(2, mask)(model(x)), y[:, 2, 10:40, 20:50].sum((1, 2)), rtol=1e-5)
    res = hookscope.cam(model, x, layers=layer, target=Segmentation(2, mask))
    by_hand, score = gradcam_by_hand(model, x, layer, lambda o: (o["out"][:, 2] * mask).sum((1, 2)))
    assert torch.allclose(res.scores, score, rtol=1e-5)
    assert torch.allclose(res.raw[layer], by_hand, rtol=1e-4, atol=1e-6 * float(by_hand.abs().max()))
    assert float(by_hand.max()) > 0
    assert no_hooks(model)


def test_segmentation_deletion_keeps_the_region_predicted_on_the_inputs():
    net = TinySeg().eval()
    x = torch.randn(1, 3, 4, 4)
    saliency = torch.arange(16.0).reshape(1, 4, 4)
    with torch.no_grad():
        region = net(x).argmax(1) == 0
        expected = []
        for removed in (0, 8, 16):  # steps=2: the 0, 8 and 16 most salient pixels set to 0
            gone = torch.zeros(16, dtype=torch.bool)
            gone[torch.argsort(saliency.flatten(), descending=True, stable=True)[:removed]] = True
            xi = torch.where(gone.view(1, 1, 4, 4), torch.zeros(()), x)
            expected.append(float((net(xi)[:, 0] * region).sum()))
    curve = metrics.deletion(net, x, saliency, target=Segmentation(0), steps=2)
    assert torch.allclose(curve.scores[0], torch.tensor(expected), atol=1e-5)
    assert curve.targets is None and no_hooks(net)


def test_scorecam_with_a_shared_region_runs_and_take_picks_per_sample_masks():
    net = TinySeg().eval()
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[2:4, 2:4] = True
    res = hookscope.cam(net, torch.randn(2, 3, 6, 6), layers="body", method="scorecam", target=Segmentation(1, mask))
    assert res.maps.shape == (2, 6, 6) and no_hooks(net)
    per = torch.stack([mask, ~mask])
    picked = for_rows(Segmentation(1, per), torch.tensor([1, 1, 0]))
    assert torch.equal(picked.mask, torch.stack([~mask, ~mask, mask]))


# --- Detection ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def detector() -> tuple[nn.Module, torch.Tensor, Any]:
    from torchvision.models import detection

    torch.manual_seed(0)
    model = detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=3, box_score_thresh=0.0, min_size=96, max_size=96,
        rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20, box_detections_per_img=10,
        box_nms_thresh=0.95)  # keep overlapping detections, so that a box matches several
    _calibrated(model, torch.rand(4, 3, 96, 96))
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        out = model(x)
    return model, x, out


def _matched_by_hand(det: dict[str, torch.Tensor], box: torch.Tensor, label: int, iou: float) -> torch.Tensor:
    from torchvision.ops import box_iou

    hit = (box_iou(box[None], det["boxes"])[0] >= iou) & (det["labels"] == label)
    return det["scores"][hit].sum()


@pytest.mark.slow
def test_detection_score_and_gradcam_on_fasterrcnn(detector):
    model, x, out = detector
    det = out[0]
    # the detection that most others (same label, IoU >= 0.5) overlap: its score is a real sum
    k = max(range(len(det["boxes"])),
            key=lambda i: float(_matched_by_hand(det, det["boxes"][i], int(det["labels"][i]), 0.5)))
    box, label = det["boxes"][k], int(det["labels"][k])
    target = Detection([label], box[None], iou=0.5)
    expected = _matched_by_hand(det, box, label, 0.5)
    assert expected > det["scores"][k] + 0.1
    assert torch.allclose(target(out), expected[None])
    res = hookscope.cam(model, x, layers="backbone.body.12", target=target)
    by_hand, score = gradcam_by_hand(model, x, "backbone.body.12", lambda o: torch.stack(
        [_matched_by_hand(o[0], box, label, 0.5)]))
    assert torch.allclose(res.scores, score, rtol=1e-5)
    assert float(by_hand.max()) > 0  # in eval the scores reach the backbone
    assert torch.allclose(res.raw["backbone.body.12"], by_hand, rtol=1e-4, atol=1e-6 * float(by_hand.max()))
    assert no_hooks(model)


@pytest.mark.slow
def test_detection_without_a_match_is_one_line_and_zero_once_anchored(detector):
    model, x, out = detector
    far = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    with pytest.raises(hookscope.HookscopeError, match="matches no detection") as e:
        hookscope.cam(model, x, layers="backbone.body.12", target=Detection([1], far))
    one_line(e)
    assert no_hooks(model)
    label = int(out[0]["labels"][0])
    with pytest.raises(hookscope.HookscopeError, match=r"box 1 .* of image 0 matches no detection") as e:
        Detection([label, label], torch.cat([out[0]["boxes"][:1], far]))(out)
    one_line(e)
    anchored = Detection([label], out[0]["boxes"][:1]).anchor(out)
    assert anchored([{"boxes": far, "labels": torch.tensor([label]), "scores": torch.tensor([0.9])}]).tolist() == [0.0]
    curve = metrics.deletion(model, x, torch.rand(1, 96, 96), target=Detection([label], out[0]["boxes"][:1]),
                             steps=1, batch_size=2)
    assert torch.allclose(curve.scores[0, 0], _matched_by_hand(out[0], out[0]["boxes"][0], label, 0.5))
    assert no_hooks(model)


@pytest.mark.slow
@pytest.mark.parametrize("name, options", [
    ("retinanet_resnet50_fpn", {"score_thresh": 0.0, "nms_thresh": 0.95, "detections_per_img": 10,
                                "topk_candidates": 50}),
    ("fasterrcnn_resnet50_fpn", {"box_score_thresh": 0.0, "box_nms_thresh": 0.95, "box_detections_per_img": 10,
                                 "rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 20}),
])
def test_detection_on_resnet50_detectors(name, options):
    from torchvision.models import detection

    model = getattr(detection, name)(weights=None, weights_backbone=None, num_classes=3, min_size=96, max_size=96,
                                     **options)
    _calibrated(model, torch.rand(2, 3, 96, 96))
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        det = model(x)[0]
    box, label = det["boxes"][0], int(det["labels"][0])
    layer = "backbone.body.layer4"
    res = hookscope.cam(model, x, layers=layer, target=Detection([label], box[None]))
    by_hand, score = gradcam_by_hand(model, x, layer, lambda o: torch.stack([_matched_by_hand(o[0], box, label, 0.5)]))
    assert torch.allclose(res.scores, score, rtol=1e-5) and float(score) >= float(det["scores"][0])
    assert float(by_hand.max()) > 0  # in eval the scores reach the backbone
    assert torch.allclose(res.raw[layer], by_hand, rtol=1e-4, atol=1e-6 * float(by_hand.max()))
    assert no_hooks(model)


def test_detection_scores_by_hand_on_hand_made_outputs():
    dets = [{"boxes": torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]]),
             "labels": torch.tensor([1, 1, 2, 1]), "scores": torch.tensor([0.5, 0.25, 0.125, 0.0625])},
            {"boxes": torch.tensor([[50.0, 50, 60, 60]]), "labels": torch.tensor([1]), "scores": torch.tensor([0.75])}]
    # image 0: box (label 1) matches detections 0 (IoU 1) and 1 (IoU 0.81); the label-2 one does not count
    shared = Detection([1], [[0, 0, 10, 10]], strict=False)
    assert shared(dets).tolist() == [0.75, 0.0]
    per_image = Detection([[1, 2], [1]], [torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10]]),
                                         torch.tensor([[50.0, 50, 60, 60]])])
    assert per_image(dets).tolist() == [0.875, 0.75]
    assert Detection([1], [[0, 0, 10, 10]], iou=0.9)(dets[:1]).tolist() == [0.5]
    assert per_image.take(torch.tensor([1, 1])).boxes[0].tolist() == [[50.0, 50, 60, 60]]
    assert repr(shared) == "Detection(labels=[1], boxes=1x4, iou=0.5)"


class TinyDetector(nn.Module):
    """Two fixed boxes per image, label 1, scored by the sigmoid of the mean red value inside each."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            self.conv.bias.zero_()

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        y = self.conv(x)
        boxes = torch.tensor([[0.0, 0, 4, 4], [4, 4, 8, 8]])
        return [{"boxes": boxes, "labels": torch.tensor([1, 1]),
                 "scores": torch.stack([y[i, 0, :4, :4].mean(), y[i, 0, 4:, 4:].mean()]).sigmoid()}
                for i in range(x.shape[0])]


def test_curves_cut_a_list_of_per_image_detections_by_image():
    # two detections per image and two copies of one image per model call: the detections' tensors have
    # as many rows as the batch, and must not be mistaken for batch rows
    net = TinyDetector().eval()
    x = torch.rand(1, 3, 8, 8)
    curve = metrics.deletion(net, x, torch.rand(1, 8, 8), target=Detection([1], [[0, 0, 4, 4]]), steps=1, batch_size=2)
    assert torch.allclose(curve.scores[0], torch.stack([x[0, 0, :4, :4].mean().sigmoid(), torch.tensor(0.5)]))
    res = hookscope.cam(net, x, layers="conv", method="hirescam", target=Detection([1], [[0, 0, 4, 4]]))
    s = x[0, 0, :4, :4].mean().sigmoid()
    by_hand = torch.zeros(8, 8)
    by_hand[:4, :4] = s * (1 - s) / 16 * x[0, 0, :4, :4]  # d score / d red pixel, times the red pixel
    assert torch.allclose(res.raw["conv"][0], by_hand, atol=1e-7) and no_hooks(net)


def test_similarity_reads_what_output_picks():
    net = TinyEmbed().eval()

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> Any:
            e = self.net(x)
            return FakeModelOutput(last_hidden_state=torch.stack([e, -e], 1), pooler_output=e)

    x, ref = torch.randn(2, 3, 5, 5), torch.randn(5)
    direct = hookscope.cam(net, x, layers="conv", target=Similarity(ref))
    picked = hookscope.cam(Pooled().eval(), x, layers="net.conv", target=Similarity(ref),
                           output=lambda o: o.last_hidden_state[:, 0])
    assert torch.allclose(direct.maps, picked.maps) and torch.allclose(direct.scores, picked.scores)
    with pytest.raises(hookscope.HookscopeError, match="pooler_output") as e:
        hookscope.cam(Pooled().eval(), x, layers="net.conv", target=Similarity(ref))
    one_line(e)


# --- Similarity and Class -----------------------------------------------------------------------------
def test_similarity_is_cosine_similarity():
    net = TinyEmbed().eval()
    x = torch.randn(3, 3, 5, 5)
    with torch.no_grad():
        e = net(x)
    ref = torch.randn(5)
    refs = torch.randn(3, 5)
    assert torch.allclose(Similarity(ref)(e), F.cosine_similarity(e, ref[None].expand(3, 5), dim=1))
    assert torch.allclose(Similarity(refs)(e), F.cosine_similarity(e, refs, dim=1))
    assert torch.allclose(Similarity(ref, dim=1)(e[:, :, None, None]), F.cosine_similarity(e, ref[None], dim=1))
    res = hookscope.cam(net, x, layers="conv", target=Similarity(refs))
    by_hand, score = gradcam_by_hand(net, x, "conv", lambda o: F.cosine_similarity(o, refs, dim=1))
    assert torch.allclose(res.scores, score, atol=1e-6)
    assert torch.allclose(res.raw["conv"], by_hand, atol=1e-6)
    assert no_hooks(net)


def test_class_target_and_hf_logits_without_output():
    net = TinyEmbed().eval()
    x = torch.randn(2, 3, 5, 5)
    plain = hookscope.cam(net, x, layers="conv", target=[3, 1])
    assert torch.equal(hookscope.cam(net, x, layers="conv", target=Class([3, 1])).maps, plain.maps)

    class HF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> Any:
            return FakeModelOutput(logits=self.net(x))

    hf = HF().eval()
    assert torch.equal(hookscope.cam(hf, x, layers="net.conv", target=[3, 1]).maps, plain.maps)
    assert torch.allclose(Class(4)(hf(x)), net(x)[:, 4])
    assert torch.allclose(read_logits(None, {"logits": net(x)}, 2), net(x))
    saliency = torch.rand(2, 5, 5)
    a = metrics.deletion(hf, x, saliency, target=1, steps=3)
    assert torch.allclose(a.scores, metrics.deletion(net, x, saliency, target=1, steps=3).scores)
    assert repr(Class([3, 1])) == "Class([3, 1])" and repr(Class(2)) == "Class(2)"


# --- bad input: one line each ---------------------------------------------------------------------------
def _logits() -> torch.Tensor:
    return torch.randn(2, 4, 6, 5)


BAD = [
    ("mask of H x W = 6 x 6 does not fit", lambda: Segmentation(1, torch.ones(6, 6))(_logits())),
    ("is not H x W", lambda: Segmentation(1, torch.ones(1, 1, 6, 5))),
    ("bool or 0/1", lambda: Segmentation(1, torch.full((6, 5), 0.5))),
    ("the mask is empty", lambda: Segmentation(1, torch.zeros(6, 5))),
    ("mask of sample 1 is empty", lambda: Segmentation(1, torch.stack([torch.ones(6, 5), torch.zeros(6, 5)]))),
    ("out of range", lambda: Segmentation(4)(_logits())),
    ("is predicted at no pixel of sample 0",
     lambda: Segmentation(0)(torch.zeros(2, 4, 6, 5).index_fill(1, torch.tensor([1]), 1.0))),
    ("holds 3 masks", lambda: Segmentation(1, torch.ones(3, 6, 5))(_logits())),
    ("B x classes x H x W", lambda: Segmentation(1)(torch.zeros(2, 4))),
    ("category=-1", lambda: Segmentation(-1)),
    ("not K x 4", lambda: Detection([1], [[0, 0, 4]])),
    ("not K x 4", lambda: Detection([1], torch.zeros(0, 4))),
    ("is empty or not finite", lambda: Detection([1], [[4, 0, 2, 4]])),
    ("2 labels for 1 boxes", lambda: Detection([1, 2], [[0, 0, 4, 4]])),
    ("iou=0", lambda: Detection([1], [[0, 0, 4, 4]], iou=0)),
    ("list of dicts", lambda: Detection([1], [[0, 0, 4, 4]])(torch.zeros(1, 3))),
    ("all zeros", lambda: Similarity(torch.zeros(4))),
    ("does not give one similarity per sample", lambda: Similarity(torch.ones(4))(torch.ones(2, 5))),
    ("does not give one similarity per sample", lambda: Similarity(torch.ones(4))(torch.ones(2, 7, 4))),
    ("dimension 0 is the batch", lambda: Similarity(torch.ones(4), dim=0)(torch.ones(2, 4))),
    ("pooler_output", lambda: Similarity(torch.ones(4))({"last_hidden_state": torch.ones(2, 3, 4)})),
    ("out of range", lambda: Class(7)(torch.zeros(2, 4))),
]


@pytest.mark.parametrize("match, call", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(match, call):
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        call()
    one_line(e)


def test_a_failing_target_inside_cam_leaves_no_hook():
    net = TinySeg().eval()
    with pytest.raises(hookscope.HookscopeError, match="does not fit") as e:
        hookscope.cam(net, torch.randn(1, 3, 6, 6), layers="body", target=Segmentation(1, torch.ones(5, 5)))
    one_line(e)
    assert no_hooks(net)
    assert repr(Segmentation(1, torch.ones(5, 5))) == "Segmentation(1, mask=5x5)"
    assert repr(Similarity(torch.ones(3, 4))) == "Similarity(reference=3x4, dim=-1)"


# --- review F2: one row for all in take(), detection parsing, Class as a class index ------------------
ONE_FOR_ALL = [
    ("segmentation", lambda: TinySeg().eval(), "body",
     lambda m: Segmentation(2, mask=m[:1]), lambda m: Segmentation(2, mask=m[:1].expand(3, 8, 10))),
    ("class", lambda: nn.Sequential(TinyEmbed(), nn.Identity()).eval(), "0.conv", lambda m: Class([3]),
     lambda m: Class([3, 3, 3])),
    ("similarity", lambda: nn.Sequential(TinyEmbed(), nn.Identity()).eval(), "0.conv",
     lambda m: Similarity(torch.linspace(-1, 1, 5)[None]),
     lambda m: Similarity(torch.linspace(-1, 1, 5)[None].expand(3, 5))),
]


@pytest.mark.parametrize("name, make, layer, one, every", ONE_FOR_ALL, ids=[c[0] for c in ONE_FOR_ALL])
def test_scorecam_with_one_row_for_all_samples_equals_that_row_given_per_sample(name, make, layer, one, every):
    torch.manual_seed(1)
    net = make()
    x = torch.randn(3, 3, 8, 10)
    mask = torch.rand(1, 8, 10) > 0.5
    a = hookscope.cam(net, x, layers=layer, method="scorecam", target=one(mask))
    b = hookscope.cam(net, x, layers=layer, method="scorecam", target=every(mask))
    assert torch.allclose(a.raw[layer], b.raw[layer]) and torch.allclose(a.scores, b.scores)
    assert a.raw[layer].flatten(1).amax(1).gt(0).all() and no_hooks(net)
    picked = one(mask).take(torch.tensor([2, 0]))
    assert picked(net(x[[2, 0]])).tolist() == every(mask).take(torch.tensor([2, 0]))(net(x[[2, 0]])).tolist()


def test_take_of_too_few_rows_is_one_line():
    with pytest.raises(hookscope.HookscopeError, match="holds 2 class indices .* sample 2") as e:
        Class([3, 1]).take(torch.tensor([0, 2]))
    one_line(e)
    assert Class([3, 1]).take(torch.tensor([1, 1, 0])).class_index == [1, 1, 3]
    with pytest.raises(hookscope.HookscopeError, match="boxes for 2 images but the batch has image 2") as e:
        Detection([[1], [1]], [[[0, 0, 4, 4]], [[0, 0, 2, 2]]]).take(torch.tensor([2]))
    one_line(e)


def test_detection_parses_single_boxes_and_numpy():
    dets = [{"boxes": torch.tensor([[0.0, 0, 4, 4], [2, 2, 8, 8], [4, 0, 10, 6]]), "labels": torch.tensor([1, 2, 1]),
             "scores": torch.tensor([0.5, 0.25, 0.125])}] * 2
    # image 0: one 1-D box (label 1 at detection 0); image 1: two boxes (label 2 at 1, label 1 at 2)
    mixed = Detection([[1], [2, 1]], [torch.tensor([0.0, 0, 4, 4]), torch.tensor([[2.0, 2, 8, 8], [4, 0, 10, 6]])])
    assert mixed(dets).tolist() == [0.5, 0.375]
    assert [b.shape for b in mixed.boxes] == [(1, 4), (2, 4)] and not mixed.shared
    # labels per image make a list of single boxes one box per image; flat labels make them K boxes for all
    assert Detection([[1], [2]], [[0, 0, 4, 4], [2, 2, 8, 8]])(dets).tolist() == [0.5, 0.25]
    k_for_all = Detection([1, 2], [torch.tensor([0.0, 0, 4, 4]), torch.tensor([2.0, 2, 8, 8])])
    assert k_for_all.shared and k_for_all(dets).tolist() == [0.75, 0.75]
    assert Detection(np.int64(1), [[0, 0, 4, 4]])(dets).tolist() == [0.5, 0.5]
    assert Detection(np.array([1]), np.array([[0, 0, 4, 4]]))(dets).tolist() == [0.5, 0.5]
    assert Detection(np.array([[1], [2]]), np.array([[[0, 0, 4, 4]], [[2, 2, 8, 8]]]))(dets).tolist() == [0.5, 0.25]
    assert Detection(torch.tensor(2), np.array([2, 2, 8, 8]))(dets[:1]).tolist() == [0.25]


BAD_DETECTION = [
    ("boxes of image 1 of shape \\(3,\\) are not K x 4 .* B x K x 4",
     lambda: Detection([[1], [2]], [[[0, 0, 4, 4]], [0, 0, 4]])),
    ("boxes .* are not numbers of shape K x 4",
     lambda: Detection([1, 2], [torch.tensor([0.0, 0, 4, 4]), torch.tensor([1.0])])),
    ("labels of image 0 1.5 are not class indices", lambda: Detection([1.5, 2], [[[0, 0, 4, 4]], [[2, 2, 8, 8]]])),
    ("labels of shape \\(1, 1\\)", lambda: Detection(np.array([[1]]), np.array([[0, 0, 4, 4]]))),
    ("labels=1 is not", lambda: Detection(1, torch.ones(2, 1, 4).cumsum(2))),
    ("label -1 is negative", lambda: Detection([-1], [[0, 0, 4, 4]])),
    ("2 labels for 1 boxes of image 0", lambda: Detection([[1, 2]], [[[0, 0, 4, 4]]])),
]


@pytest.mark.parametrize("match, call", BAD_DETECTION, ids=[b[0][:30] for b in BAD_DETECTION])
def test_bad_detection_is_one_line(match, call):
    with pytest.raises(hookscope.HookscopeError, match=match) as e:
        call()
    one_line(e)


@pytest.mark.parametrize("score", ["prob", "logit"])
@pytest.mark.parametrize("kind", ["deletion", "insertion"])
def test_curves_treat_class_as_its_class_index(kind, score):
    torch.manual_seed(2)
    net = TinyEmbed().eval()
    x, saliency = torch.randn(2, 3, 5, 5), torch.rand(2, 5, 5)
    curve = getattr(metrics, kind)
    for obj, plain in [(Class(3), 3), (Class([3, 1]), [3, 1]), (Class(torch.tensor(4)), 4)]:
        a = curve(net, x, saliency, target=obj, steps=3, score=score, baseline="zeros")
        b = curve(net, x, saliency, target=plain, steps=3, score=score, baseline="zeros")
        assert torch.equal(a.scores, b.scores) and torch.equal(a.targets, b.targets)
    with torch.no_grad():
        first = net(x).softmax(1)[:, 3] if score == "prob" else net(x)[:, 3]
    step = 0 if kind == "deletion" else -1  # the images themselves
    assert torch.allclose(curve(net, x, saliency, target=Class(3), steps=3, score=score).scores[:, step], first)
    assert Class(np.int64(2)).class_index == 2 and Class(np.array([1, 0])).class_index == [1, 0]
