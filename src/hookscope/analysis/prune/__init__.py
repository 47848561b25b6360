"""Pruning through hooks: masks applied by forward pre-hooks (the layout of ``torch.nn.utils.prune``),
channel importance measured on data, and physical removal of pruned channels along the dependency
graph recorded in one forward pass.

Laid out by concern: ``_masks`` (the pre-hook mechanism), ``_methods`` (mask criteria, one table),
``_weights`` (the public masking functions), ``_importance`` (channel importance, one table),
``_graph*`` (the dependency tracer), ``_compact`` (physical removal), ``_channels`` (structured
channel pruning on the graph), ``_heads*`` (attention heads as channel groups: layouts, groups, scores, pruning), ``_width*`` (the hidden
width of RMSNorm transformers as one channel group), ``_compare``
(before / after), ``_resize`` (a model fitted to a
compacted state_dict), ``_pretrained`` (a compacted transformers folder loaded back). Must not import: any other analysis module, ``cli``, ``viz``.
"""

from ._channels import ChannelPruning, ChannelRow, prune_channels
from ._compact import compact, mask_channels
from ._compare import CompareRow, ModelComparison, compare_models
from ._heads import HeadPruning, HeadRow, prune_heads
from ._heads_mlp import MlpRow
from ._graph import BlockedGroup, Group, GroupMember, ChannelGroups, Site, channel_groups
from ._importance import ChannelImportance, ImportanceRow, channel_importance
from ...anatomy import fit_to, is_compacted, marked_compacted, shrinks
from ...loading.pretrained import load_pretrained
from ._width import WidthPruning, WidthRow, prune_width
from ._weights import Sparsity, PruneRow, prune, remove, sparsity

__all__ = ["prune", "remove", "sparsity", "Sparsity", "PruneRow",
           "prune_channels", "ChannelPruning", "ChannelRow",
           "channel_groups", "ChannelGroups", "Group", "GroupMember", "Site", "BlockedGroup",
           "mask_channels", "compact", "prune_heads", "HeadPruning", "HeadRow", "MlpRow",
           "prune_width", "WidthPruning", "WidthRow",
           "channel_importance", "ChannelImportance", "ImportanceRow",
           "compare_models", "ModelComparison", "CompareRow", "fit_to", "is_compacted", "marked_compacted", "shrinks",
           "load_pretrained"]
