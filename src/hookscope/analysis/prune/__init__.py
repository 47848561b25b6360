"""Pruning through hooks: masks applied by forward pre-hooks (the layout of ``torch.nn.utils.prune``),
channel importance measured on data, and physical removal of pruned channels along the dependency
graph recorded in one forward pass.

One folder a family, each with its face: ``masks`` (the pre-hooks, the criteria, ``prune`` /
``remove`` / ``sparsity``), ``calibrated`` (Wanda and SparseGPT masks calibrated block by block,
``prune_calibrated``, and ``prune`` itself, the one entry point of the masks calibrated or not),
``layers`` (whole blocks scored and removed, ``layer_importance``, ``remove_layers``), ``recover`` (what pruning lost restored from calibration activations, and measured, ``recover``),
``sparse`` (2:4 weights exported to semi-structured sparse tensors on CUDA, ``to_semi_structured``),
``importance`` (channel importance, one table of kinds), ``graph`` (the
dependency tracer), ``channels`` (masking channels group-wise, ``prune_channels``), ``heads``
(attention heads as channel groups, ``prune_heads``), ``width`` (the hidden width of a transformer
as one group, ``prune_width``), ``compact`` (physical removal, on top of them all), ``compare``
(before / after). What attention layouts, the hidden width and a compacted state_dict mean to a
model is ``hookscope.anatomy``'s (``fit_to``, ``is_compacted``, ``marked_compacted``, ``shrinks`` are
handed on from there); ``load_pretrained`` is ``hookscope.loading``'s, handed on here for the code
that imports it from this path. Must not import: any other analysis module, ``cli``, ``viz``.
"""

from ...anatomy import fit_to, is_compacted, marked_compacted, shrinks
from ...loading.pretrained import load_pretrained
from .channels import ChannelPruning, ChannelRow, mask_channels, prune_channels
from .compact import compact
from .compare import CompareRow, ModelComparison, compare_models
from .graph import BlockedGroup, ChannelGroups, Group, GroupMember, Site, channel_groups
from .heads import HeadPruning, HeadRow, MlpRow, prune_heads
from .importance import ChannelImportance, ImportanceRow, channel_importance
from .calibrated import prune, prune_calibrated
from .layers import LayerImportance, LayerRemoval, LayerRow, RemovedRow, layer_importance, lm_loss, remove_layers
from .sparse import semi_structured_layers, to_semi_structured
from .recover import Recovery, RecoveryRow, recover
from .masks import PruneRow, Sparsity, remove, sparsity
from .width import WidthPruning, WidthRow, prune_width

__all__ = ["prune", "remove", "sparsity", "Sparsity", "PruneRow", "prune_calibrated",
           "prune_channels", "ChannelPruning", "ChannelRow",
           "channel_groups", "ChannelGroups", "Group", "GroupMember", "Site", "BlockedGroup",
           "mask_channels", "compact", "prune_heads", "HeadPruning", "HeadRow", "MlpRow",
           "prune_width", "WidthPruning", "WidthRow",
           "channel_importance", "ChannelImportance", "ImportanceRow",
           "compare_models", "ModelComparison", "CompareRow", "fit_to", "is_compacted", "marked_compacted", "shrinks",
           "load_pretrained", "layer_importance", "LayerImportance", "LayerRow", "remove_layers", "LayerRemoval",
           "RemovedRow", "recover", "Recovery", "RecoveryRow",
           "to_semi_structured", "semi_structured_layers", "lm_loss"]
