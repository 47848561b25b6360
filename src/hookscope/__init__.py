"""hookscope: see inside and steer any PyTorch model through hooks, correct by default.

Example:
    >>> import torch, hookscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with hookscope.capture(net, torch.nn.Linear) as rec:
    ...     _ = net(torch.randn(2, 4))
    >>> rec["0"].output.shape
    torch.Size([2, 8])
"""

import torch as _torch

# the oldest torch tested (scripts/test-oldest): pip enforces it at install, not on a torch already on the path
if tuple(int(p) for p in _torch.__version__.split(".")[:2]) < (2, 13):
    raise ImportError(f"hookscope needs torch >= 2.13, found {_torch.__version__}: pip install -U 'torch>=2.13'")

from . import metrics, targets
from . import viz  # noqa: F401 - its pictures show under results in notebooks (matplotlib stays optional)
from .analysis.attribution import Attributions, LRPRule, attribute
from .analysis.attribution import TokenAttributions, TokenRow, attribute_tokens
from .analysis.attribution import SegmentAttributions, attribute_segments
from .analysis.attribution import (
    LRP,
    AttributionMethod,
    Deconvnet,
    Gradient,
    GuidedBackprop,
    GuidedGradCam,
    InputXGradient,
    IntegratedGradients,
    Saliency,
    SmoothGrad,
    SmoothGradSq,
    VarGrad,
)
from .analysis.attribution import FeatureAblation, FeaturePermutation, KernelShap, Lime, Occlusion, ShapleyValueSampling
from .analysis.attention import AttentionPatterns, attention, attention_probabilities
from .analysis.circuits import (
    DlaRow, LensRow, LogitAttribution, LogitLens, PatchRow, Patching, TunedLens, TunedRow, activation_patching,
    attribution_patching, load_lens, logit_attribution, logit_lens, tune_lens,
)
from .analysis.cam import CamMaps, CamRow, cam, channels_first, channels_last, tokens_to_grid
from .analysis.features import (
    ComparisonRow,
    FeatureMaps,
    FeatureRow,
    ReferenceComparison,
    compare_references,
    feature_maps,
)
from .analysis.extract import extract
from .analysis.diff import Diff, DiffRow, Settings, Unmatched, diff, settings
from .analysis.gradflow import GradientFlow, gradient_flow
from .analysis.monitor import (
    CSVWriter, JSONLinesWriter, Monitor, Run, Telemetry, TelemetryRow, TensorBoardWriter, WandbWriter, Writer, monitor,
    read_run,
)
from .analysis.operations import OperationRow, Operations, operations
from .analysis.prune import (
    ChannelPruning,
    ModelComparison,
    ChannelGroups,
    ChannelImportance,
    HeadPruning,
    HeadRow,
    MlpRow,
    Sparsity,
    channel_groups,
    channel_importance,
    compact,
    compare_models,
    prune,
    prune_calibrated,
    prune_channels,
    prune_heads,
    prune_width,
    WidthPruning,
    WidthRow,
    sparsity,
)
from .analysis.prune import (
    LayerImportance, LayerRemoval, Recovery, layer_importance, recover, remove_layers, to_semi_structured,
)
from .analysis.prune import remove as remove_masks
from .analysis.trace import StatRow, StepStatRow, Trace, trace
from .analysis.steering import Direction, Steering, bake, direction, steer
from .analysis.summary import Summary, summary
from .analysis.step_memory import MemoryRow, MemoryTotals, StepMemory, step_memory
from .analysis.watch import Watch, watch
from .anatomy import Component, Components, component, components
from .capture import Capture, capture
from .edit import Edit, ablate, edit, scale
from .errors import (
    ForwardError,
    HookscopeError,
    MutationError,
    NonFiniteError,
    RecordError,
    SelectionError,
)
from .grads import GradRecord, TensorGrads, grads
from .integrations import LightningMonitor, TrainerMonitor
from .errors import LoadError, UntrustedPickleError
from .loading import class_names, load_model, load_weights
from .loading import ImageTransform, Images, Tokens, example_input, image_transform, load_images, load_tokenizer, tokenize
from .records import CallRecord, LayerRecord, Recording, Retention, load
from .selection import At, at, layers, names, unwrap
from .generation import StepRecord, StepRecords, StepRow, TokenPositions, tokens
from .store import LayerArray, Store, open_store

__version__ = "0.1.0"

# What a user needs, by job; each function next to the result it returns. Frozen for 1.0: names are
# added, never renamed or removed (tests/test_protocol.py checks the order and that results are reachable).
__all__ = [
    # read and steer activations and gradients
    "capture", "Capture", "Recording", "LayerRecord", "CallRecord", "Retention", "load",
    "edit", "Edit", "scale", "ablate",
    "direction", "Direction", "steer", "Steering", "bake",
    "grads", "TensorGrads", "GradRecord",
    # choose layers
    "layers", "names", "unwrap", "at", "At",
    "tokens", "TokenPositions", "StepRecords", "StepRecord", "StepRow",
    "operations", "Operations", "OperationRow",
    "components", "Components", "Component", "component",
    # know and debug a model
    "summary", "Summary",
    "step_memory", "StepMemory", "MemoryRow", "MemoryTotals",
    "trace", "Trace", "StatRow", "StepStatRow",
    "watch", "Watch",
    "gradient_flow", "GradientFlow",
    "diff", "Diff", "DiffRow", "Unmatched", "settings", "Settings",
    # watch a training run
    "monitor", "Monitor", "Telemetry", "TelemetryRow", "read_run", "Run",
    "Writer", "JSONLinesWriter", "CSVWriter", "TensorBoardWriter", "WandbWriter",
    "LightningMonitor", "TrainerMonitor",
    # see what a layer sees, and why the model decided
    "feature_maps", "FeatureMaps", "compare_references", "ReferenceComparison",
    "attention", "AttentionPatterns", "attention_probabilities",
    "cam", "CamMaps", "CamRow", "channels_first", "channels_last", "tokens_to_grid", "targets", "metrics",
    "attribute", "Attributions", "LRPRule",
    "AttributionMethod", "Saliency", "Gradient", "InputXGradient", "IntegratedGradients", "SmoothGrad", "SmoothGradSq",
    "VarGrad", "GuidedBackprop", "Deconvnet", "GuidedGradCam", "LRP",
    "Occlusion", "FeatureAblation", "FeaturePermutation", "ShapleyValueSampling", "KernelShap", "Lime",
    "attribute_tokens", "TokenAttributions", "TokenRow", "attribute_segments", "SegmentAttributions",
    # which component wrote the answer: the logit lens (plain or tuned), direct logit attribution, patching sweeps
    "logit_lens", "LogitLens", "LensRow", "tune_lens", "TunedLens", "TunedRow", "load_lens", "logit_attribution", "LogitAttribution", "DlaRow",
    "activation_patching", "attribution_patching", "Patching", "PatchRow",
    # prune
    "prune", "prune_calibrated", "sparsity", "Sparsity", "remove_masks",
    "channel_importance", "ChannelImportance", "channel_groups", "ChannelGroups",
    "prune_channels", "ChannelPruning", "prune_heads", "HeadPruning", "HeadRow", "MlpRow",
    "prune_width", "WidthPruning", "WidthRow", "compact", "compare_models", "ModelComparison",
    "layer_importance", "LayerImportance", "remove_layers", "LayerRemoval", "recover", "Recovery",
    "to_semi_structured",
    # extract at scale
    "extract", "open_store", "Store", "LayerArray",
    # load models and weights as the command line does
    "load_model", "load_weights", "class_names",
    # inputs for a model, made by its library's own transforms: images, an example input, tokens of a text
    "load_images", "Images", "image_transform", "ImageTransform", "example_input",
    "tokenize", "Tokens", "load_tokenizer",
    # errors
    "HookscopeError", "SelectionError", "RecordError", "MutationError", "ForwardError", "NonFiniteError",
    "LoadError", "UntrustedPickleError",
]
