"""Recovery after pruning, measured: ``_fit`` (closed-form refits of the projections whose inputs were
pruned, or bias compensation, from calibration activations gathered through hooks on both models),
``_distill`` (a few Adam steps towards the dense model's outputs), ``_api`` (``recover`` and its
``Recovery``: the metric before pruning, after, and after recovery). Must not import: the other pruning
families but ``calibrated`` and ``layers``, any other analysis module, ``cli``, ``viz``.
"""

from ._api import RECOVERY, Recovery, RecoveryRow, recover

__all__ = ["recover", "Recovery", "RecoveryRow", "RECOVERY"]
