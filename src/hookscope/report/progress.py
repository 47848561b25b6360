"""A progress bar on stderr while a report is built: shown only when stderr is a terminal.

The bar counts the report's steps (a forward pass per layer drawn, a CAM and its faithfulness curves
per method...), says which step is under way and how long the report has taken so far. In a log or a
pipe it stays silent, so that only the command's own lines are written there.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24  # characters of the bar itself


class Progress:
    """Steps of one report: :meth:`start` each, :meth:`close` at the end (the line is then finished).

    Args:
        total: how many steps (``add`` more once they are known).
        enabled: draw the bar; ``None``: when ``out`` is a terminal.
        out: where to draw (default: ``sys.stderr``).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> p = Progress(2, enabled=True, out=out)
        >>> p.start("summary"); p.start("feature maps of layer1"); p.close()
        >>> lines = out.getvalue().split("\\r")
        >>> lines[1].split("  ")[0], lines[-1].split("  ")[0]
        ('report [------------------------] 0/2', 'report [########################] 2/2')
        >>> Progress(2, out=io.StringIO()).enabled  # not a terminal: silent
        False
    """

    def __init__(self, total: int, *, enabled: bool | None = None, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stderr
        self.enabled = bool(self.out.isatty()) if enabled is None else enabled
        self.total, self.done, self.what = max(0, total), -1, ""
        self.begun = time.perf_counter()

    def add(self, steps: int) -> None:
        """``steps`` more steps than first counted."""
        self.total += max(0, steps)

    def start(self, what: str) -> None:
        """The previous step is done; ``what`` is under way."""
        self.done += 1
        self.what = what
        self._draw()

    def close(self, *, done: bool = True) -> None:
        """End the bar's line: full when ``done``, else as far as it got (an error stopped the report)."""
        if self.done < 0:
            return
        if done:
            self.done, self.what = self.total, "done"
        else:
            self.what = f"stopped: {self.what}"
        self._draw()
        self.done = -1  # closed: a second close draws nothing
        if self.enabled:
            self.out.write("\n")
            self.out.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        total = max(self.total, self.done, 1)
        filled = round(_WIDTH * self.done / total)
        spent = int(time.perf_counter() - self.begun)
        line = (f"report [{'#' * filled}{'-' * (_WIDTH - filled)}] {self.done}/{total}  "
                f"{spent // 60}:{spent % 60:02d}  {self.what}")
        width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)  # a wrapped line would not redraw
        self.out.write("\r" + line[:width].ljust(width))
        self.out.flush()
