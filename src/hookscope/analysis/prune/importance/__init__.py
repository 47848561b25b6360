"""Channel importance measured on data: ``_api`` (``channel_importance``), ``_kinds`` (one table of
kinds), ``_sites`` (where a layer's channels are read), ``_run`` (the passes: batches, losses, the
hooks). Must not import: the rest of ``prune``, any other analysis module, ``cli``, ``viz``.
"""

from ._api import ChannelImportance, ImportanceRow, channel_importance
from ._kinds import accumulator_dtype
from ._run import (Batch, Loss, batch_to, batches_of, check_kind, check_share, loss_of, plain_passes, split_batch)

__all__ = ["ChannelImportance", "ImportanceRow", "channel_importance", "accumulator_dtype", "Batch", "Loss",
           "batch_to", "batches_of", "check_kind", "check_share", "loss_of", "plain_passes", "split_batch"]
