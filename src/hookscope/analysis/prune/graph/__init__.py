"""The channel dependency graph, recorded in one forward pass: which parameters must lose the same
channels together (``_trace``: the tracer and its result; ``_state``, ``_shadow``, ``_call``: what it
carries; one rule table per kind of op: ``_ops``, ``_layers``, ``_pointwise``, ``_moves``). Must not
import: the rest of ``prune`` but ``masks``, any other analysis module, ``cli``, ``viz``.
"""

from ._trace import (BlockedGroup, ChannelGroups, Group, GroupMember, Site, assemble, channel_groups, deep_copy,
                     prepared, trace_channels, traced_mode)

__all__ = ["BlockedGroup", "ChannelGroups", "Group", "GroupMember", "Site", "assemble", "channel_groups",
           "deep_copy", "prepared", "trace_channels", "traced_mode"]
