"""The hidden width of a transformer as one channel group: ``_api`` (``prune_width``), ``_stream``
(the group: the norms, readers and writers of the residual stream), ``_norm`` (LayerNorms of a masked
width). Must not import: ``heads``, ``compact`` of ``prune``, any other analysis module, ``cli``, ``viz``.
"""

from ._api import WIDTH_IMPORTANCE, WidthPruning, WidthRow, prune_width
from ._stream import WidthGroup, fix_width, with_width

__all__ = ["WIDTH_IMPORTANCE", "WidthPruning", "WidthRow", "prune_width", "WidthGroup", "fix_width",
           "with_width"]
