"""Two models side by side (``compare_models``): size, multiply-adds, latency, output gap and the
quality on data (``_quality``). Must not import: the rest of ``prune``, any other analysis module,
``cli``, ``viz``.
"""

from ._compare import CompareRow, ModelComparison, compare_models

__all__ = ["CompareRow", "ModelComparison", "compare_models"]
