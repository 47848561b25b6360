"""A monitored run read back from its JSON lines log: :func:`read_run` and the :class:`Run` result.

The numbers come from the same rows the writers had, grouped by step and named as
:func:`~hookscope.analysis.monitor.scalars` names them for TensorBoard and W&B, so the run a
picture shows is the one the dashboards show. Nothing is unpickled: the log is JSON text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from ...core.result import Result, missing
from ...core.text import num, table
from ...errors import HookscopeError, checked
from ._telemetry import FIELDS, Histogram, Telemetry, TelemetryRow, scalars

__all__ = ["LOG", "Run", "read_run"]

LOG = "monitor.jsonl"
"""The name of the JSON lines log in a run's folder (what ``log=FOLDER`` writes)."""

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_HISTOGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Histogram))
_SHOWN = ("grad_norm", "update_ratio", "dead")


def _value(v: Any) -> Any:
    return _NONFINITE.get(v, v) if isinstance(v, str) else v


def _row(obj: dict[str, Any]) -> TelemetryRow:
    return TelemetryRow(**{k: _value(obj[k]) if k != "note" else obj[k] for k in FIELDS if k in obj})


def _histogram(obj: dict[str, Any]) -> Histogram:
    return Histogram(**{k: _value(obj[k]) for k in _HISTOGRAM_FIELDS})


def _log_path(source: str | os.PathLike[str]) -> Path:
    path = Path(source)
    if path.is_dir():
        path = path / LOG
    if not path.is_file():
        where = f"{source} holds no {LOG}" if Path(source).is_dir() else f"no such run log: {source}"
        raise HookscopeError(f"{where}; give the folder a monitor wrote with log=FOLDER, or its {LOG}")
    return path


@checked
def read_run(source: str | os.PathLike[str]) -> Run:
    """The run a monitor logged: a folder (its ``monitor.jsonl``) or the JSON lines file itself.

    A run killed part way reads up to its last complete line (a line cut short by the kill is
    left out and said in :attr:`Run.notes`).

    Example:
        >>> import tempfile, torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> folder = tempfile.mkdtemp()
        >>> with hookscope.monitor(net, every=2, log=folder, optimizer=opt):
        ...     for _ in range(5):
        ...         opt.zero_grad(); net(torch.randn(8, 4)).sum().backward(); opt.step()
        >>> run = hookscope.read_run(folder)
        >>> run.steps, run.layers
        ([0, 2, 4], ['0', '1'])
        >>> run.matrix("grad_norm").shape
        torch.Size([2, 3])
    """
    path = _log_path(source)
    rows: list[TelemetryRow] = []
    histograms: list[Histogram] = []
    notes: list[str] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if number >= len(lines) - 1:  # the last line, cut short where the run was stopped
                notes.append(f"line {number} of {path.name} is incomplete (the run stopped while writing it); left out")
                continue
            raise HookscopeError(f"{path}: line {number} is not JSON; is this a log a monitor wrote?") from None
        if not isinstance(obj, dict) or "what" not in obj or "step" not in obj:
            raise HookscopeError(f"{path}: line {number} is not a row of a monitor's log (no 'what' and 'step')")
        try:
            if obj["what"] == "histogram":
                histograms.append(_histogram(obj))
            else:
                rows.append(_row(obj))
        except (KeyError, TypeError) as e:
            raise HookscopeError(f"{path}: line {number} misses a field of a monitor's row ({e})") from None
    return Run(path, rows, histograms, notes)


class Run(Result):
    """A monitored run: every logged step's rows (:class:`~hookscope.TelemetryRow`) and
    histograms, as they were logged. ``run[step]`` is that step's :class:`~hookscope.Telemetry`.

    :meth:`matrix` gives one statistic for every layer and sampled step, named as the
    dashboards name it (``"grad_norm"``, ``"update_ratio"``, ``"dead"``, ``"param_norm"``,
    ``"output_rms"``, ``"grad_output_max"``, ...), the picture :func:`hookscope.viz.plot_run` draws.

    Example:
        >>> run = Run(Path("m.jsonl"), [TelemetryRow(0, "fc", "param", "weight", norm=2.0, grad_norm=1.0)], [], [])
        >>> run.steps, run.matrix("grad_norm").tolist(), run[0]["fc"][0].norm
        ([0], [[1.0]], 2.0)
    """

    _result_fields = FIELDS
    _html_columns = ("step", "layer", "what", "path", "mean", "std", "min", "max", "zeros", "nan", "inf", "dead",
                     "norm", "grad_norm", "update_ratio", "loss", "lr", "note")

    def __init__(self, path: Path, rows: list[TelemetryRow], histograms: list[Histogram], notes: list[str]) -> None:
        self.path = path
        self.rows = rows
        self.histograms = histograms
        self.notes = notes
        described = [r for r in rows if r.what not in ("step", "nonfinite")]
        self.steps = sorted({r.step for r in described})
        self.layers = list(dict.fromkeys(r.layer for r in described))
        self.nonfinite = [r for r in rows if r.what == "nonfinite"]
        self._scalars: dict[int, dict[str, float]] | None = None

    def _logged(self) -> list[int]:
        return sorted({r.step for r in self.rows})

    def __getitem__(self, step: int) -> Telemetry:
        if not isinstance(step, int) or step not in self:
            raise missing(step, "logged step", [str(s) for s in self._logged()])
        return Telemetry(step, [r for r in self.rows if r.step == step],
                         [h for h in self.histograms if h.step == step])

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and any(r.step == step for r in self.rows)

    def scalars(self) -> dict[int, dict[str, float]]:
        """Each logged step's scalars (sampled steps, and steps logged for a NaN or an Inf), named
        as the TensorBoard and W&B writers name them."""
        if self._scalars is None:
            self._scalars = {s: scalars(self[s]) for s in self._logged()}
        return self._scalars

    def statistics(self) -> list[str]:
        """The names :meth:`matrix` takes for this run (those with a layer: ``grad_norm``, ...)."""
        names = {k.split("/", 1)[0] for per_step in self.scalars().values() for k in per_step if "/" in k}
        return sorted(names)

    def matrix(self, statistic: str) -> torch.Tensor:
        """``statistic`` for each layer (rows, as :attr:`layers`) and sampled step (columns, as
        :attr:`steps`), float64; NaN where a layer has no such value at a step."""
        known = self.statistics()
        if statistic not in known:
            raise missing(statistic, "statistic", known)
        out = torch.full((len(self.layers), len(self.steps)), math.nan, dtype=torch.float64)
        for j, step in enumerate(self.steps):
            per_step = self.scalars()[step]
            for i, layer in enumerate(self.layers):
                out[i, j] = per_step.get(f"{statistic}/{layer}", math.nan)
        return out

    def present(self, statistic: str) -> torch.Tensor:
        """Where :meth:`matrix` holds a logged value (which may itself be NaN or Inf), as booleans;
        a layer without parameters has no ``grad_norm``, a step not sampled no value at all."""
        out = torch.zeros(len(self.layers), len(self.steps), dtype=torch.bool)
        for j, step in enumerate(self.steps):
            per_step = self.scalars()[step]
            for i, layer in enumerate(self.layers):
                out[i, j] = f"{statistic}/{layer}" in per_step
        return out

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """A step's own number (``"loss"``, ``"lr"``): the steps that logged it, and its values."""
        found = [(s, v[name]) for s, v in self.scalars().items() if name in v]
        return [s for s, _ in found], [v for _, v in found]

    def nonfinite_steps(self) -> list[int]:
        """The steps where the sentinel found a NaN or an Inf, in order."""
        return sorted({r.step for r in self.nonfinite})

    def table(self) -> str:
        """Per layer, the last sampled step's gradient norm, update ratio and dead fraction, and
        their range over the run (also ``str(run)``)."""
        first, last = (self.steps[0], self.steps[-1]) if self.steps else (None, None)
        top = f"run {self.path}: {len(self.steps)} sampled step{'s' if len(self.steps) != 1 else ''}"
        top += f" ({first}..{last})" if self.steps else ""
        bad = self.nonfinite_steps()
        top += f"; NaN or Inf at step{'s' if len(bad) > 1 else ''} {_listed(bad)}" if bad else ""
        shown = [s for s in _SHOWN if s in self.statistics()]
        if not self.layers or not shown:
            return "\n".join([top, *self.notes])
        cols = {s: (self.matrix(s), self.present(s)) for s in shown}
        head = ["layer", *(f"{s} (last)" for s in shown), *(f"{s} (min..max)" for s in shown)]
        body = [[layer, *(_cell(*cols[s], i) for s in shown), *(_span(*cols[s], i) for s in shown)]
                for i, layer in enumerate(self.layers)]
        return "\n".join([top, *table(head, body, left={0}), *self.notes])

    def to_dict(self) -> dict[str, Any]:
        """The path, steps, layers, the flagged steps, every row and histogram, and the notes."""
        return {"path": str(self.path), "steps": self.steps, "layers": self.layers,
                "nonfinite_steps": self.nonfinite_steps(), "rows": [dataclasses.asdict(r) for r in self.rows],
                "histograms": [dataclasses.asdict(h) for h in self.histograms], "notes": self.notes}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, steps={len(self.steps)}, layers={len(self.layers)})"


def _listed(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:10]))
    return shown if len(steps) <= 10 else f"{shown}, ... ({len(steps)} steps)"


def _cell(values: torch.Tensor, present: torch.Tensor, i: int) -> str:
    if not present[i, -1]:
        return "-"
    v = values[i, -1].item()
    return "nan" if math.isnan(v) else num(v)


def _span(values: torch.Tensor, present: torch.Tensor, i: int) -> str:
    finite = values[i][present[i] & torch.isfinite(values[i])]
    if finite.numel() == 0:
        return "-"
    return f"{num(finite.min().item())}..{num(finite.max().item())}"
