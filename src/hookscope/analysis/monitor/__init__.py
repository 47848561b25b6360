"""The training monitor (``hookscope.monitor``): per-layer telemetry of sampled steps and a
non-finite sentinel on every step, written to JSON lines, CSV, TensorBoard or W&B.

``_schedule`` (which steps) -> ``_probe`` (a sampled step's hooks, on the statistics engine) and
``_params`` (norms, gradients, updates; the sentinel's check) -> ``_telemetry`` (rows, the result,
the scalars' names) -> ``_writers`` / ``_extras`` (where they go); ``_sentinel`` names the module
of a non-finite step by replaying it; ``_monitor`` holds the step's life and ``monitor()`` itself.
"""

from ._extras import TensorBoardWriter, WandbWriter
from ._histogram import histogram
from ._monitor import NONFINITE, STATS, Monitor, monitor
from ._runs import Run, read_run
from ._schedule import Schedule
from ._sentinel import NonFinite
from ._telemetry import FIELDS, Histogram, Telemetry, TelemetryRow, scalars
from ._writers import CSVWriter, JSONLinesWriter, Writer

__all__ = ["CSVWriter", "FIELDS", "Histogram", "JSONLinesWriter", "Monitor", "NONFINITE", "NonFinite", "Run", "STATS",
           "Schedule", "Telemetry", "TelemetryRow", "TensorBoardWriter", "WandbWriter", "Writer", "histogram",
           "monitor", "read_run", "scalars"]
