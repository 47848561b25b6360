"""Channels masked group-wise along the graph (``_masking``: what every structured pruning writes and
``compact`` removes), and structured channel pruning (``_prune``: ``prune_channels``). Must not import:
``heads``, ``width``, ``compact`` of ``prune``, any other analysis module, ``cli``, ``viz``.
"""

from ._masking import dropped_channels, mask_channels, tensor_of
from ._prune import ChannelPruning, ChannelRow, prune_channels

__all__ = ["dropped_channels", "mask_channels", "tensor_of", "ChannelPruning", "ChannelRow", "prune_channels"]
