"""Interleaved timing rounds, shared by the benchmarks in this folder.

Every method runs once per round, in an order that alternates round by round (so neither slow
drift of the machine nor the cache one method leaves favours another); each figure is a median.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def medians(runs: dict[str, Callable[[], Any]], rounds: int, *, warmup: int = 1) -> dict[str, float]:
    """Median seconds per method over ``rounds`` interleaved rounds, after ``warmup`` untimed ones."""
    keys = list(runs)
    for _ in range(warmup):
        for k in keys:
            runs[k]()
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys if r % 2 == 0 else reversed(keys):
            t0 = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
