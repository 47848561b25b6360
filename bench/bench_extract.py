"""hookscope.extract against plain inference over the same data (issue 12).

Run:  .venv/bin/python bench/bench_extract.py throughput [--n 2000] [--rounds 2]
      .venv/bin/python bench/bench_extract.py rss --rounds 3   (peak RSS of 500 against 2000 images, fresh processes)
      .venv/bin/python bench/bench_extract.py ranks [--n 2000] [--rounds 3]  (torchrun 2 ranks against 1 process)

Data: ``n`` generated 3x224x224 images (each made from its index's seed in the dataset's __getitem__, so
nothing is held in memory), batches of 32 read by a DataLoader in this process. Model: torchvision
resnet18, ``weights=None``, eval. Throughput: plain inference (a forward of every batch under no_grad)
and the extracts run interleaved, round after round, in one process; each figure is the median over
rounds, and the ratio is plain time / extract time (throughput relative to plain).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import torchvision

import hookscope
from _rounds import medians  # bench/_rounds.py: this folder is on sys.path when run as a script

REDUCED = {"layer2": "mean", "layer4": "mean"}
WITH_FULL = {"layer2": "mean", "layer3": None, "layer4": "mean"}


class Generated(torch.utils.data.Dataset[torch.Tensor]):
    """``n`` images of 3x224x224, each from its own seed."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randn(3, 224, 224, generator=torch.Generator().manual_seed(i))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def plain(net: torch.nn.Module, data: Generated) -> None:
    with torch.no_grad():
        for x in torch.utils.data.DataLoader(data, batch_size=32):
            net(x)


def run_extract(net: torch.nn.Module, data: Generated, layers: dict[str, Any], out: str, shard: str = "64MB") -> None:
    hookscope.extract(net, data, layers=layers, out=out, batch_size=32, shard_size=shard, overwrite=True, progress=False)


def throughput(n: int, rounds: int) -> None:
    net, data = model(), Generated(n)
    tmp = tempfile.mkdtemp(prefix="bench-extract-")
    try:
        t = medians({"plain": lambda: plain(net, data),
                     "reduced": lambda: run_extract(net, data, REDUCED, os.path.join(tmp, "a")),
                     "with layer3": lambda: run_extract(net, data, WITH_FULL, os.path.join(tmp, "b"))},
                    rounds, warmup=0)
    finally:
        shutil.rmtree(tmp)
    print(f"| images | plain | extract layer2+layer4 mean | + full layer3 |")
    print(f"| {n} | {n / t['plain']:.1f} img/s ({t['plain']:.1f} s) | {n / t['reduced']:.1f} img/s, "
          f"**{t['plain'] / t['reduced']:.3f}x** | {n / t['with layer3']:.1f} img/s, **{t['plain'] / t['with layer3']:.3f}x** |")


def _child_rss(n: int, out: str, what: str) -> tuple[float, float]:
    run = (f"b.run_extract(b.model(), b.Generated({n}), b.WITH_FULL, {out!r}, '32MB')" if what == "extract"
           else f"b.plain(b.model(), b.Generated({n}))")
    code = (f"import sys, resource, time; sys.path.insert(0, {os.path.dirname(__file__)!r}); import bench_extract as b; "
            f"t = time.perf_counter(); {run}; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss_kb, seconds = done.stdout.split()
    return int(rss_kb) / 1024, float(seconds)


def rss(rounds: int) -> None:
    """Peak RSS of extract and of plain inference for 500 and 2,000 images, each run a fresh process."""
    tmp = tempfile.mkdtemp(prefix="bench-extract-")
    runs: dict[tuple[str, int], list[float]] = {(w, n): [] for w in ("plain", "extract") for n in (500, 2000)}
    try:
        for r in range(rounds):  # the four kinds alternating in order, round by round
            for key in list(runs) if r % 2 == 0 else list(reversed(runs)):
                runs[key].append(_child_rss(key[1], os.path.join(tmp, f"{key[1]}-{r}"), key[0])[0])
    finally:
        shutil.rmtree(tmp)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("| run | 500 images (each run, MiB) | 2,000 images | growth of the medians |")
    for w in ("plain", "extract"):
        grow = 100 * (med[(w, 2000)] - med[(w, 500)]) / med[(w, 500)]
        print(f"| {w} | {', '.join(f'{m:.0f}' for m in runs[(w, 500)])} (median {med[(w, 500)]:.0f}) | "
              f"{', '.join(f'{m:.0f}' for m in runs[(w, 2000)])} (median {med[(w, 2000)]:.0f}) | **{grow:+.1f}%** |")
    print("extract: layer2+layer4 mean and the full layer3, 32MB shards")


def ranks(n: int, rounds: int) -> None:
    tmp = tempfile.mkdtemp(prefix="bench-extract-")
    script = os.path.join(tmp, "job.py")
    with open(script, "w") as f:
        f.write(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import bench_extract as b\n"
                f"b.run_extract(b.model(), b.Generated({n}), b.WITH_FULL, sys.argv[1])\n")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    runs = {"1 process (2 threads)": [sys.executable, script, os.path.join(tmp, "one")],
            "torchrun, 2 ranks (1 thread each)": [torchrun, "--standalone", "--nproc_per_node", "2", script,
                                                   os.path.join(tmp, "two")]}
    try:
        t = medians({k: lambda cmd=cmd: subprocess.run(cmd, check=True, capture_output=True) for k, cmd in runs.items()},
                    rounds, warmup=0)
        for label, seconds in t.items():
            print(f"| {label} | {seconds:.1f} s, {n / seconds:.1f} img/s (whole command, median of {rounds}) |")
        one, two = (hookscope.open_store(os.path.join(tmp, k)) for k in ("one", "two"))
        print(f"2 ranks / 1 process time: **{t[list(t)[1]] / t[list(t)[0]]:.3f}x**; stores equal: "
              f"{all(torch.equal(one[k][:], two[k][:]) for k in one.layers)}")
    finally:
        shutil.rmtree(tmp)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["throughput", "rss", "ranks"])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    {"throughput": lambda: throughput(args.n, args.rounds), "rss": lambda: rss(args.rounds), "ranks": lambda: ranks(args.n, args.rounds)}[args.what]()


if __name__ == "__main__":
    main()
