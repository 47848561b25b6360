"""Self-contained HTML reports of a model: what it predicts, its layers, maps, statistics and gradients.

``build_report(model, inputs, "out_dir")`` writes ``index.html`` (plain HTML and CSS: no JavaScript,
nothing fetched from the network), the pictures under ``img/`` and every number in ``report.json``.
Needs the ``viz`` extra (matplotlib, Pillow).
"""

from .build import build_report
from .folder import check_target, staged_folder

__all__ = ["build_report", "check_target", "staged_folder"]
