"""hookscope: see inside and steer any PyTorch model through hooks, correct by default.

Example:
    >>> import torch, hookscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with hookscope.capture(net, torch.nn.Linear) as rec:
    ...     _ = net(torch.randn(2, 4))
    >>> rec["0"].output.shape
    torch.Size([2, 8])
"""

from . import metrics, targets
from .analysis.cam import CamResult, CamRow, cam, channels_first, channels_last, tokens_to_grid
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
from .analysis.prune import (
    ChannelPruning,
    Comparison,
    Groups,
    Importance,
    PruneResult,
    channel_groups,
    channel_importance,
    compact,
    compare_models,
    prune,
    prune_channels,
    sparsity,
)
from .analysis.prune import remove as remove_masks
from .analysis.trace import StatRow, Trace, trace
from .analysis.summary import Summary, summary
from .analysis.watch import Watch, watch
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
from .errors import LoadError, UntrustedPickleError
from .loading import class_names, load_model, load_weights
from .records import CallRecord, LayerRecord, Recording, Retention, load
from .selection import At, at, layers, names, unwrap
from .store import LayerArray, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "CamResult",
    "CamRow",
    "cam",
    "channels_first",
    "channels_last",
    "metrics",
    "targets",
    "tokens_to_grid",
    "FeatureMaps",
    "ReferenceComparison",
    "feature_maps",
    "compare_references",
    "Diff",
    "extract",
    "LayerArray",
    "Store",
    "open_store",
    "load",
    "DiffRow",
    "Settings",
    "Unmatched",
    "diff",
    "settings",
    "GradientFlow",
    "gradient_flow",
    "ChannelPruning",
    "Comparison",
    "Groups",
    "Importance",
    "PruneResult",
    "channel_groups",
    "channel_importance",
    "compact",
    "compare_models",
    "prune",
    "prune_channels",
    "remove_masks",
    "sparsity",
    "ForwardError",
    "StatRow",
    "Trace",
    "trace",
    "Summary",
    "summary",
    "NonFiniteError",
    "Watch",
    "watch",
    "CallRecord",
    "Capture",
    "Edit",
    "GradRecord",
    "TensorGrads",
    "HookscopeError",
    "LayerRecord",
    "MutationError",
    "RecordError",
    "Recording",
    "Retention",
    "SelectionError",
    "ablate",
    "capture",
    "edit",
    "grads",
    "At",
    "at",
    "layers",
    "names",
    "scale",
    "unwrap",
    "load_model",
    "load_weights",
    "class_names",
    "LoadError",
    "UntrustedPickleError",
]


def __getattr__(name: str) -> object:
    if name == "GradWatch":  # the old name, one release
        import warnings

        warnings.warn("hookscope.GradWatch is now hookscope.TensorGrads", DeprecationWarning, stacklevel=2)
        return TensorGrads
    raise AttributeError(f"module 'hookscope' has no attribute {name!r}")
