"""Weight masks: forward pre-hooks that multiply a parameter by its mask (the layout of
``torch.nn.utils.prune``: ``_hooks``), the criteria that choose what a mask zeroes (``_methods``, one
table), and the public masking functions ``prune``, ``remove``, ``sparsity`` (``_weights``). The
bottom of pruning: must not import the rest of ``prune``, any other analysis module, ``cli``, ``viz``.
"""

from ._hooks import MaskHook, apply_mask, make_permanent, mask_of, masked
from ._weights import PruneRow, Sparsity, prune, remove, sparsity

__all__ = ["MaskHook", "apply_mask", "make_permanent", "mask_of", "masked", "PruneRow", "Sparsity", "prune",
           "remove", "sparsity"]
