"""Checks of an explanation: can this map be trusted?

ROAD (``road``: remove the most or the least relevant pixels, impute them, read the score), infidelity
and max-sensitivity (``infidelity``, ``max_sensitivity``), and the model-randomisation sanity check
(``parameter_randomisation``: cascading or independent re-initialisation from the top). Also at the
short path :mod:`hookscope.metrics`. They take maps already computed, or the explanation as a
function ``explain(model, inputs) -> maps`` (no analysis imports another: ``hookscope.cam`` and
``hookscope.attribute`` come in through that function). Nothing here registers a hook; the model
is run in eval mode with every flag restored, and the randomisation works on a deep copy of it.

Inside: ``_maps`` (maps checked against their images), ``_scoring`` (a target's score on perturbed
copies), ``_impute`` (ROAD's linear imputation), ``_road``, ``_robust`` (infidelity,
max-sensitivity), ``_similarity`` (rank correlation, SSIM), ``_randomise`` and its result
``_randomised``.
"""

from ._randomise import MODES, parameter_randomisation
from ._randomised import Randomisation, RandomisationRow
from ._road import PERCENTILES, RoadCurves, RoadRow, road
from ._robust import NORMS, infidelity, max_sensitivity

__all__ = ["road", "RoadCurves", "RoadRow", "PERCENTILES", "infidelity", "max_sensitivity", "NORMS",
           "parameter_randomisation", "Randomisation", "RandomisationRow", "MODES"]
