"""Interleaved timing rounds, shared by the benchmarks in this folder.

Every method runs once per round, in an order that alternates round by round (so neither slow
drift of the machine nor the cache one method leaves favours another); each figure is a median.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from typing import Any, Callable


def medians(runs: dict[str, Callable[[], Any]], rounds: int, *, warmup: int = 1) -> dict[str, float]:
    """Median seconds per method over ``rounds`` interleaved rounds, after ``warmup`` untimed ones."""
    return {k: statistics.median(v) for k, v in timings(runs, rounds, warmup=warmup).items()}


def ratios(runs: dict[str, Callable[[], Any]], rounds: int, *, base: str,
           warmup: int = 1) -> tuple[dict[str, float], dict[str, float]]:
    """``(medians, ratios)``: the median seconds per method, and per method the median over rounds
    of its time divided by ``base``'s time in the same round. A round takes seconds, the machine's
    slow phases last longer: a ratio within a round cancels them, a ratio of medians does not."""
    times = timings(runs, rounds, warmup=warmup)
    per_round = {k: statistics.median(t / b for t, b in zip(v, times[base])) for k, v in times.items()}
    return {k: statistics.median(v) for k, v in times.items()}, per_round


def timings(runs: dict[str, Callable[[], Any]], rounds: int, *, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per method and round over ``rounds`` interleaved rounds, after ``warmup`` untimed ones."""
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
    return times


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval that holds the true median with probability at least ``level``:
    the k-th smallest and k-th largest values, k the largest rank for which the binomial(n, 1/2)
    tails outside it weigh at most ``1 - level``. ``(min, max)`` when too few values for the level."""
    v, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while k < n // 2:
        tail += 2 * math.comb(n, k) / 2**n  # P(fewer than k + 1 below the median) on both sides
        if tail > 1 - level:
            break
        k += 1
    k = max(k, 1)
    return v[k - 1], v[n - k]


def cpu_model() -> str:
    """The CPU's model name, for the header of a result."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
