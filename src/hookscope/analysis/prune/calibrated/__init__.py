"""Calibrated pruning of linear layers: Wanda and SparseGPT masks, measured through forward hooks on
the calibration data block by block (``_api`` ``prune_calibrated``, ``_stack`` the blocks and their
inputs, ``_stats`` what the hooks gather, ``_solvers`` the methods in one table; ``_route`` ``prune``, the one entry point of the element-wise
methods, calibrated or not). The masks are the
``masks`` family's. Must not import: the other pruning families but ``masks``, any other analysis
module, ``cli``, ``viz``.
"""

from ._api import calibration_batches, device_of, prune_calibrated
from ._route import prune
from ._stack import Stack, find_stack
from ._stats import InputStats

__all__ = ["prune_calibrated", "prune", "calibration_batches", "device_of", "Stack", "find_stack", "InputStats"]
