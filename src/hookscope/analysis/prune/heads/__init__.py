"""Attention heads as channel groups: ``_api`` (``prune_heads``), ``_groups`` (a head's channels in
the graph, checked and fixed after slicing), ``_mlp`` (the MLP units pruned beside them), ``_score``
with ``_score_taylor`` and ``_score_entropy`` (their importance). Where each kind of attention keeps
its heads is ``hookscope.anatomy``'s. Must not import: ``width``, ``compact`` of ``prune``, any other
analysis module, ``cli``, ``viz``.
"""

from ._api import HEAD_IMPORTANCE, HeadPruning, HeadRow, prune_heads
from ._groups import check_heads, fix_heads, with_heads
from ._mlp import MlpRow

__all__ = ["HEAD_IMPORTANCE", "HeadPruning", "HeadRow", "prune_heads", "check_heads", "fix_heads",
           "with_heads", "MlpRow"]
