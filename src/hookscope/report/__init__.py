"""Self-contained HTML reports of a model: what it predicts, its structure, layers, maps, statistics and
gradients, and how it differs from another model.

``build_report(model, inputs, "out_dir")`` writes ``index.html`` (HTML, CSS and a small inline script:
nothing fetched from the network; without JavaScript every view shows, one under another), the
pictures under ``img/`` and every number in ``report.json``. Needs the ``viz`` extra (matplotlib,
Pillow).

One module per part: ``build`` runs the sections and writes the folder (``folder``: all at once or not
at all); ``subject`` holds the model, inputs and where they came from; the sections are ``checks``
(predictions, trace, NaN/Inf check, gradient flow), ``summary``, ``structure``, ``features``, ``cams``,
``diffs``, ``runs`` and ``circuits`` (results of the circuit analyses, given ready); ``html``, ``widgets`` and ``assets`` make the page; ``progress`` draws the bar.
"""

from .build import build_report
from .folder import check_target, staged_folder

__all__ = ["build_report", "check_target", "staged_folder"]
