"""Which component wrote the answer: the logit lens (``_lens``) and the tuned lens (``_tuned``), direct logit attribution
(``_dla``), activation patching sweeps (``_patching``) and attribution patching (``_attribution``),
each over a decoder's component names (``_model``: ``anatomy.components`` read through ``capture``
and changed through ``edit``).
"""

from ._attribution import attribution_patching
from ._cells import HEAD_KINDS, STREAM_KINDS
from ._dla import DlaRow, LogitAttribution, logit_attribution
from ._metric import METRICS
from ._lens import LensRow, LogitLens, logit_lens
from ._patching import activation_patching
from ._tuned import TunedLens, TunedRow, load_lens, tune_lens
from ._result import PatchRow, Patching

__all__ = ["HEAD_KINDS", "METRICS", "STREAM_KINDS", "DlaRow", "LensRow", "LogitAttribution", "LogitLens", "PatchRow", "Patching", "TunedLens", "TunedRow", "activation_patching",
           "attribution_patching", "load_lens", "logit_attribution", "logit_lens", "tune_lens"]
