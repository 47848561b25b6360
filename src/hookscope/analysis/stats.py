"""Deprecated: the old home of ``trace`` and of the statistics engine; importing it warns.

``trace``/``Trace``/``StatRow`` now live in :mod:`hookscope.analysis.trace` (and at
``hookscope.trace``), the engine in the private ``_recorder``/``_rows``/``_reduce`` modules, and
``ForwardError`` in :mod:`hookscope.errors`. The old names stay here for one release.
"""

from __future__ import annotations

import importlib
import warnings

from ..errors import ForwardError
from ._recorder import Recorder, RecorderSession, param_targets, refresh_for, select
from ._reduce import STATS, tensor_stats
from ._rows import Pending, StatRow, gather, render

__all__ = ["STATS", "ForwardError", "Pending", "Recorder", "RecorderSession", "StatRow", "Trace", "gather",
           "param_targets", "refresh_for", "render", "select", "tensor_stats", "trace"]

warnings.warn("hookscope.analysis.stats is deprecated: import trace, Trace and StatRow from hookscope "
              "(or hookscope.analysis.trace) and ForwardError from hookscope.errors",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    # trace and Trace are forwarded on first use, not imported at the top: this shim is an alias of
    # the trace module, and a public analysis module never imports another (tests/test_structure.py)
    if name in ("trace", "Trace"):
        return getattr(importlib.import_module(".trace", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
