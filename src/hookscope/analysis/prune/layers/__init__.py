"""Whole blocks of a stack: scored on data (``_score``: ``layer_importance``, block influence or the
perplexity change) and removed from a transformers decoder with its config, ``layer_idx`` and cache kept
consistent (``_remove``: ``remove_layers``). Must not import: the other pruning families but
``calibrated``, any other analysis module, ``cli``, ``viz``.
"""

from ._remove import LayerRemoval, RemovedRow, remove_layers
from ._score import LayerImportance, LayerRow, layer_importance, lm_loss

__all__ = ["layer_importance", "LayerImportance", "LayerRow", "remove_layers", "LayerRemoval", "RemovedRow",
           "lm_loss"]
