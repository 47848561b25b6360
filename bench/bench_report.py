"""``hookscope report MODEL``: how long the command takes, and where the time goes.

Run:  .venv/bin/python bench/bench_report.py                       (torchvision:resnet18, 3 rounds)
      .venv/bin/python bench/bench_report.py --against DIR         (also the command from another source
          tree, such as `git worktree add DIR <commit>`, interleaved round by round with this one)
      .venv/bin/python bench/bench_report.py --steps               (this tree only, in one process: the
          seconds of each step the progress bar counts)
      --threads N sets OMP_NUM_THREADS (1: CPU time that a loaded machine disturbs least)

Timing: each run is a fresh process (imports included, as a user sees it); the figures are the median
wall time and the median CPU time (user + system of the process) over the rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"


def _run(tree: Path, model: str, threads: int | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `hookscope report MODEL` from the source tree ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as root:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hookscope", "report", model, "--out", str(Path(root) / "r")],
                       env=env, check=True, capture_output=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _steps(model: str) -> None:
    """One report in this process, each step the progress bar counts timed on its own."""
    import hookscope.report.progress as progress
    from hookscope.cli import main

    marks: list[tuple[str, float]] = []
    real = progress.Progress.start

    def start(self: progress.Progress, what: str) -> None:
        marks.append((what, time.perf_counter()))
        real(self, what)

    progress.Progress.start = start  # type: ignore[method-assign]
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        main(["report", model, "--out", str(Path(root) / "r")])
    end = time.perf_counter()
    print(f"before the first step (imports, loading the model): {marks[0][1] - begun:.1f} s")
    for (what, t), (_, t_next) in zip(marks, [*marks[1:], ("", end)]):
        print(f"{t_next - t:7.1f} s  {what}")
    print(f"{end - begun:7.1f} s  in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="torchvision:resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", metavar="DIR", default=None, help="another source tree (its src/ is used)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", action="store_true")
    a = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d')}, threads {a.threads or 'default'}")
    if a.steps:
        _steps(a.model)
        return
    trees = {"this": HERE} | ({"before": Path(a.against).resolve() / "src"} if a.against else {})
    found: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    for r in range(a.rounds):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            found[name].append(_run(trees[name], a.model, a.threads))
            print(f"round {r + 1} {name}: {found[name][-1][0]:.1f} s wall, {found[name][-1][1]:.1f} s CPU", flush=True)
    for name, runs in found.items():
        print(f"{name}: median {statistics.median(w for w, _ in runs):.1f} s wall, "
              f"{statistics.median(c for _, c in runs):.1f} s CPU over {len(runs)} rounds")


if __name__ == "__main__":
    main()
