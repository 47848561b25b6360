"""How faithful a saliency map is, at a short path: ``hookscope.metrics.deletion(...)``.

The functions of :mod:`hookscope.analysis.cam_metrics` (where they live and are documented):
deletion and insertion curves (RISE) with their area, the pointing game and its energy-based
variant, boxes turned into masks. They score any ``B x H x W`` saliency maps, not only
:func:`hookscope.cam`'s, and ``B x C x H x W`` attribution maps reduced over their channels
(``reduce=``, by default the sum of absolute values), and take the same ``target=`` / ``output=`` / ``kwargs=`` as it does.

And the checks of an explanation of :mod:`hookscope.analysis.checks`: ROAD (``road``), infidelity
and max-sensitivity, and the model-randomisation sanity check (``parameter_randomisation``), which
take the maps, or the explanation as a function ``explain(model, inputs) -> maps``.

Example:
    >>> import torch
    >>> from hookscope import metrics
    >>> m = torch.zeros(1, 4, 4); m[0, 1, 2] = 1
    >>> metrics.pointing_game(m, metrics.box_mask([[2, 0, 4, 2]], 4, 4), tolerance=0).tolist()
    [True]
    >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    >>> curve = metrics.deletion(net, torch.rand(1, 1, 4, 4), m, steps=4)
    >>> isinstance(curve, metrics.Curve), [r.step for r in curve.rows]
    (True, [0, 1, 2, 3, 4])
"""

from .analysis.cam_metrics import (
    BASELINES,
    REDUCTIONS,
    SCORES,
    Curve,
    CurveRow,
    blur,
    box_mask,
    deletion,
    energy_pointing_game,
    insertion,
    pointing_game,
)
from .analysis.checks import (
    MODES,
    NORMS,
    PERCENTILES,
    Randomisation,
    RandomisationRow,
    RoadCurves,
    RoadRow,
    infidelity,
    max_sensitivity,
    parameter_randomisation,
    road,
)

# cam_metrics' names, then checks' (tests/test_checks.py holds the two equal); written out, as mypy
# reads only a literal list as what is exported
__all__ = [
    "Curve", "CurveRow", "deletion", "insertion", "pointing_game", "energy_pointing_game", "box_mask", "blur",
    "BASELINES", "REDUCTIONS", "SCORES",
    "road", "RoadCurves", "RoadRow", "PERCENTILES", "infidelity", "max_sensitivity", "NORMS",
    "parameter_randomisation", "Randomisation", "RandomisationRow", "MODES",
]
