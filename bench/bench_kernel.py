"""The CPU statistics kernel alone: GB/s of one pass, in cache and from memory (issue 13).

Run:  .venv/bin/python bench/bench_kernel.py            (about 5 s on 2 CPU cores)

For float32 tensors of 64 Ki to 16 Mi elements: ``stats`` (sum, sum of squares, min, max, zeros),
``stats_relu`` (the same, and the positive part's sums: what ReLU's output will give) and
``torch.sum`` for scale, each timed hot (the same tensor again, best of 3 batches) and cold (a
64 Mi-element tensor written in between, median of 8). The kernel takes two threads from 64 Ki
elements when it shares torch's OpenMP workers (the line ``threads`` says which), as inside trace.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from hookscope._native import stats_kernel

from _rounds import cpu_model  # bench/_rounds.py: this folder is on sys.path when run as a script

SIZES = [1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]


def hot(fn: Callable[[], Any], n: int) -> float:
    """Best seconds per call over 3 batches of calls on data left in cache."""
    fn()
    reps = max(3, (1 << 26) // n)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def cold(fn: Callable[[torch.Tensor], Any], xs: list[torch.Tensor], flush: torch.Tensor) -> float:
    """Median seconds per call, each on a tensor pushed out of the caches first."""
    times = []
    for x in xs:
        flush.add_(1.0)
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    kernel = stats_kernel()
    if kernel is None:
        sys.exit("no statistics kernel here (no C compiler, or HOOKSCOPE_NATIVE=0)")
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"Python {platform.python_version()}; kernel threads shared with torch: {kernel.parallel}")
    print(f"# {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"# {shlex.join([os.path.relpath(sys.executable), *sys.argv])}\n")
    print("| elements | MB | stats hot | stats_relu hot | torch.sum hot | stats cold | torch.sum cold |")
    print("|---|---|---|---|---|---|---|")
    flush = torch.randn(1 << 26)
    for n in SIZES:
        x = torch.randn(n)
        xs = [torch.randn(n) for _ in range(8)]
        rate = (lambda s: f"{n * 4 / s / 1e9:.1f} GB/s")  # noqa: E731
        print(f"| {n} | {n * 4 / 1e6:.1f} | {rate(hot(lambda: kernel.stats(x), n))} | "
              f"{rate(hot(lambda: kernel.stats_relu(x), n))} | {rate(hot(lambda: x.sum(), n))} | "
              f"{rate(cold(kernel.stats, xs, flush))} | {rate(cold(torch.sum, xs, flush))} |", flush=True)


if __name__ == "__main__":
    main()
