"""Where a monitor writes each sampled step: the :class:`Writer` protocol, and the writers that need
no extra: JSON lines and CSV, each flushed at every sampled step so that a run killed part way
leaves logs readable up to its last sampled step."""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import operator
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Union

from ...core.result import jsonable
from ...errors import HookscopeError, checked_init
from ._distributed import writes_here
from ._telemetry import FIELDS, Telemetry

_VALUES = operator.attrgetter(*FIELDS)  # a row's fields in order, in one call

__all__ = ["CSVWriter", "JSONLinesWriter", "Log", "Writer", "checked_folder", "fresh_file", "writers_of"]


class Writer:
    """What a monitor hands each sampled step to. A writer of one's own subclasses this and gives
    :meth:`write` (and :meth:`close` if it holds anything open).

    Example:
        >>> class Printer(Writer):
        ...     def write(self, telemetry):
        ...         print(telemetry.step, len(telemetry.rows))
        >>> Printer().write(Telemetry(5, [], []))
        5 0
    """

    def write(self, telemetry: Telemetry) -> None:
        """Take one sampled step's :class:`~hookscope.Telemetry` (also a step the sentinel flagged)."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close; called once as the monitor's block ends."""


def checked_folder(folder: str | os.PathLike[str], what: str) -> Path:
    """``folder`` made if missing; a one-line error if it is a file.

    Example:
        >>> import tempfile
        >>> checked_folder(tempfile.mkdtemp(), "log").is_dir()
        True
    """
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise HookscopeError(f"{what}={str(folder)!r} is a file, not a folder; give a folder path for the logs")
    path.mkdir(parents=True, exist_ok=True)
    return path


def fresh_file(path: str | os.PathLike[str], writer: str, append: bool) -> IO[str]:
    """``path`` opened for writing; an existing non-empty file only with ``append``."""
    file = Path(path)
    if file.is_dir():
        raise HookscopeError(f"{writer}({str(path)!r}) is a folder; give the path of a file")
    if file.exists() and file.stat().st_size and not append:
        raise HookscopeError(f"{str(path)!r} already holds a log; log to a new folder, or pass "
                             f"{writer}(..., append=True) to add to it")
    file.parent.mkdir(parents=True, exist_ok=True)
    return open(file, "a" if append else "w", encoding="utf-8", newline="")


@checked_init
class JSONLinesWriter(Writer):
    """One JSON object per line: each :class:`~hookscope.TelemetryRow` as its fields (NaN and
    infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"``), then each histogram with
    ``"what": "histogram"`` and the fields of :class:`~hookscope.analysis.monitor.Histogram`.
    Flushed after every step.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
        >>> w = JSONLinesWriter(path)
        >>> from hookscope.analysis.monitor import TelemetryRow
        >>> w.write(Telemetry(3, [TelemetryRow(3, "", "step", "", loss=0.5)], [])); w.close()
        >>> json.loads(open(path).readline())["loss"]
        0.5
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self._file = fresh_file(path, "JSONLinesWriter", append)

    def write(self, telemetry: Telemetry) -> None:
        # a row's fields are numbers, text or None: read directly (``dataclasses.asdict`` deep-copies each
        # value, a tenth of an every-step monitor's own time on resnet18)
        lines = [_json_line(r) for r in telemetry.rows]
        lines += [json.dumps(jsonable({"what": "histogram", **dataclasses.asdict(h)}), allow_nan=False)
                  for h in telemetry.histograms]
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@checked_init
class CSVWriter(Writer):
    """The rows as CSV, one column per field of :class:`~hookscope.TelemetryRow` (``FIELDS``, in
    order; an empty cell where a field does not apply; NaN as ``nan``); histograms are not written
    here (JSON lines, TensorBoard and W&B hold them). Flushed after every step.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.csv")
        >>> w = CSVWriter(path); w.close()
        >>> open(path).readline().split(",")[:4]
        ['step', 'layer', 'what', 'path']
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        had = self.path.exists() and self.path.stat().st_size > 0
        self._file = fresh_file(path, "CSVWriter", append)
        self._csv = csv.writer(self._file)
        if not had:
            self._csv.writerow(FIELDS)
            self._file.flush()

    def write(self, telemetry: Telemetry) -> None:
        # csv writes None as an empty cell and a float as its repr: NaN and infinities as nan, inf, -inf
        self._csv.writerows(map(_VALUES, telemetry.rows))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _json_line(row: Any) -> str:
    """One row as a JSON object; NaN and infinities (not JSON) as text, taken apart only where one occurs."""
    try:
        return json.dumps(dict(zip(FIELDS, _VALUES(row))), allow_nan=False)
    except ValueError:
        return json.dumps({f: _plain(v) for f, v in zip(FIELDS, _VALUES(row))}, allow_nan=False)


def _plain(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)  # NaN and infinities as text


Log = Union[str, "os.PathLike[str]", Writer, Sequence[Union[str, "os.PathLike[str]", Writer]], None]
"""``log=``: a folder, a writer, or a list of them; ``None``."""


def _given(writer: Writer) -> Writer:
    return writer


def writers_of(log: Log) -> list[Callable[[], Writer]]:
    """``log=`` checked now (a folder that is a file is refused before the run); the writers are
    made as the block begins."""
    if log is None:
        return []
    items = list(log) if isinstance(log, (list, tuple)) else [log]
    makers: list[Callable[[], Writer]] = []
    for item in items:
        if isinstance(item, Writer):
            makers.append(functools.partial(_given, item))
        elif isinstance(item, (str, os.PathLike)):
            folder = checked_folder(item, "log")
            for name in ("monitor.jsonl", "monitor.csv"):
                if writes_here() and (folder / name).is_file() and (folder / name).stat().st_size:  # rank 0's log
                    raise HookscopeError(f"{str(folder / name)!r} already holds a log; log to a new folder, or pass "
                                         f"log=[hookscope.JSONLinesWriter(path, append=True), ...] to add to it")
            makers += [functools.partial(JSONLinesWriter, folder / "monitor.jsonl"),
                       functools.partial(CSVWriter, folder / "monitor.csv")]
        else:
            raise HookscopeError(f"log= takes a folder or writers (hookscope.TensorBoardWriter(...), ...); "
                                 f"got {type(item).__name__}")
    return makers
