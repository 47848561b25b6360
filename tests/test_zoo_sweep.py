"""The model-zoo sweep on a representative subset (CI); ``bench/bench_zoo.py`` runs every model.

One model of each family users bring: a plain CNN, in-place-heavy and branchy CNNs, depthwise and
squeeze-excite nets, vision transformers (class token; Swin's channels-last windows), a
segmentation and a detection model, and BERT / GPT-2 / T5 / ViT from transformers and timm's
ViT and ConvNeXt, all with random weights (nothing downloaded).
"""

from __future__ import annotations

import pytest
import zoo_sweep

SUBSET = {
    "torchvision:resnet18", "torchvision:mobilenet_v3_small", "torchvision:densenet121",
    "torchvision:squeezenet1_1", "torchvision:efficientnet_b0", "torchvision:vit_b_32",
    "torchvision:swin_t", "torchvision:convnext_tiny", "torchvision:lraspp_mobilenet_v3_large",
    "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
    "hf:BertModel", "hf:GPT2LMHeadModel", "hf:T5ForConditionalGeneration", "hf:ViTForImageClassification",
    "timm:vit_tiny_patch16_224", "timm:convnext_atto",
}
ENTRIES = [e for e in zoo_sweep.all_entries() if e.name in SUBSET]


def test_the_subset_names_real_entries() -> None:
    assert {e.name for e in ENTRIES} == SUBSET


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_zoo_model(entry: zoo_sweep.Entry) -> None:
    outcome = zoo_sweep.check(entry)
    assert outcome.passed, outcome.failure
