"""Input attribution by gradients: saliency, input x gradient, integrated gradients (at the inputs or
at one layer), SmoothGrad, SmoothGrad-squared and VarGrad, for any target of :mod:`hookscope.targets`;
and by modified backward passes: guided backpropagation, DeconvNet and layer-wise relevance
propagation (LRP) with zennit's rules and composites.

Gradients are taken with ``torch.autograd.grad`` at the inputs (or one layer's output) only: no
``.backward()``, no parameter ``.grad`` written, every flag and buffer of the model put back.

Collect (``_engine``: the forward passes and their gradients), compute (``_methods``: one table of
methods, each with its settings class of ``_settings``, ``_rules``: integrated gradients' quadrature; ``_guided``, ``_lrp``: the backward-pass rules,
with ``_activations``, ``_lrp_rules`` and ``_composites``), result (``_result``); ``_api`` holds
:func:`attribute` itself.

By perturbation, without gradients (``_perturb``: the runs of perturbed copies under a memory budget,
occlusion, feature ablation and permutation, Shapley value sampling; ``_surrogate``: KernelSHAP and
LIME, a linear model fitted to the scores; ``_features``: feature masks, superpixels, windows).

Language models: ``_tokens`` (:func:`attribute_tokens`: per-token scores at the token embedding, for
the next token and each token of a continuation), ``_writing`` (the continuation: the model's greedy
``generate()``, where each sequence ends, an encoder-decoder model's decoder; a continuation given as
``generate()``'s output, each token's log-probability as the target) and ``_tokens_result``
(``TokenAttributions``); ``_segments`` (:func:`attribute_segments`: words, sentences or named pieces of
a prompt scored by ablation or Shapley values for each token of a continuation).
"""

from ._api import METHODS, attribute
from ._composites import COMPOSITES
from ._features import feature_grid, superpixels
from ._lrp_rules import LRPRule
from ._methods import INPUTS_ONLY, LAYER_METHODS, readers, settings_of
from ._result import Attributions
from ._settings import (LRP, AttributionMethod, Deconvnet, FeatureAblation, FeaturePermutation, Gradient, GuidedBackprop,
                        GuidedGradCam, InputXGradient, IntegratedGradients, KernelShap, Lime, Occlusion, Saliency,
                        ShapleyValueSampling, SmoothGrad, SmoothGradSq, VarGrad)
from ._segments import SEGMENT_METHODS, SegmentAttributions, SegmentRow, attribute_segments
from ._tokens import TOKEN_METHODS, attribute_tokens
from ._tokens_result import TokenAttributions, TokenRow

__all__ = ["COMPOSITES", "INPUTS_ONLY", "LAYER_METHODS", "METHODS", "Attributions", "LRPRule", "attribute"]
__all__ += ["TOKEN_METHODS", "TokenAttributions", "TokenRow", "attribute_tokens"]
__all__ += ["SEGMENT_METHODS", "SegmentAttributions", "SegmentRow", "attribute_segments"]
__all__ += ["LRP", "AttributionMethod", "Deconvnet", "Gradient", "GuidedBackprop", "GuidedGradCam", "InputXGradient",
            "IntegratedGradients", "Saliency", "SmoothGrad", "SmoothGradSq", "VarGrad", "readers", "settings_of"]
__all__ += ["FeatureAblation", "FeaturePermutation", "KernelShap", "Lime", "Occlusion", "ShapleyValueSampling",
            "feature_grid", "superpixels"]
