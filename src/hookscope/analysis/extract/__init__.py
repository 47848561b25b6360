"""Extract the activations of chosen layers for a whole dataset into a store on disk: reduced on the device,
written by a background thread in crash-safe shards, resumable, and split between ``torch.distributed`` ranks.
"""

from ._reduce import Reduction, reducer
from ._run import extract

__all__ = ["Reduction", "extract", "reducer"]
