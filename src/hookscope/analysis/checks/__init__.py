"""Checks of an explanation: ROAD, infidelity and max-sensitivity, and the model-randomisation sanity checks."""

from ._road import PERCENTILES, RoadCurves, RoadRow, road

__all__ = ["PERCENTILES", "RoadCurves", "RoadRow", "road"]
from ._robust import NORMS, infidelity, max_sensitivity

__all__ += ["NORMS", "infidelity", "max_sensitivity"]
