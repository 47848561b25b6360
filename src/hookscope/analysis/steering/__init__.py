"""Steering directions: computed from recorded activations (:func:`direction`), added, scaled,
ablated or clamped at chosen layers and positions while the model runs or generates (:func:`steer`,
on :func:`~hookscope.edit`), and written into the weights where weights can express the edit
(:func:`bake`, checked against the hooked model).

Must not import: another analysis, viz, report, cli.
"""

from ._bake import bake
from ._direction import Direction, direction
from ._steer import OPS, Steering, steer

__all__ = ["Direction", "direction", "Steering", "steer", "OPS", "bake"]
