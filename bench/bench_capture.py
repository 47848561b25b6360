"""Capture every Conv2d output: hookscope's safe default against the plain forward and the peers.

Run:  .venv/bin/python bench/bench_capture.py            (about 4 minutes on 2 CPU cores)
      .venv/bin/python bench/bench_capture.py --quick    (fewer repeats)

Timing: the methods run interleaved, round after round, in one process (the order alternates), and
each figure is the median over rounds; ratios are to the plain forward's median of the same run.
Memory: each method runs once more in a fresh subprocess; the figure is the peak resident set
during the forward (the kernel's VmHWM, reset just before) minus the resident set before it, and
"extra" is that minus the plain forward's, compared with the bytes the method keeps.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import torch
import torchvision
from torch import nn

import hookscope

METHODS = ["plain", "hookscope", "hand_clone", "hand_refs", "create_feature_extractor"]
CASES = [("resnet18", 1), ("resnet50", 8)]


def build(name: str, batch: int) -> tuple[nn.Module, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    return model, x, convs


def runner(method: str, model: nn.Module, x: torch.Tensor, convs: list[str]) -> Callable[[], Any]:
    """A function doing one forward that keeps every conv output by ``method``; returns what it kept."""
    if method == "plain":
        return lambda: model(x)
    if method == "hookscope":
        def run() -> Any:
            with hookscope.capture(model, nn.Conv2d) as rec:
                model(x)
            return rec
        return run
    if method in ("hand_clone", "hand_refs"):
        mods = dict(model.named_modules())

        def run() -> Any:
            kept: dict[str, torch.Tensor] = {}
            handles = []
            for n in convs:
                if method == "hand_clone":
                    hook = lambda m, i, o, n=n: kept.__setitem__(n, o.detach().clone())
                else:
                    hook = lambda m, i, o, n=n: kept.__setitem__(n, o.detach())
                handles.append(mods[n].register_forward_hook(hook))
            try:
                model(x)
            finally:
                for h in handles:
                    h.remove()
            return kept
        return run
    if method == "create_feature_extractor":
        from torchvision.models.feature_extraction import create_feature_extractor

        fx = create_feature_extractor(model, return_nodes=convs)
        return lambda: fx(x)
    raise ValueError(method)


def kept_bytes(kept: Any) -> int:
    if isinstance(kept, hookscope.Recording):
        return sum(rec.output.numel() * rec.output.element_size() for _, rec in kept.items())
    if isinstance(kept, dict):
        return sum(t.numel() * t.element_size() for t in kept.values())
    return 0


def timing(name: str, batch: int, rounds: int) -> dict[str, float]:
    model, x, convs = build(name, batch)
    runs = {m: runner(m, model, x, convs) for m in METHODS}
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    with torch.no_grad():
        for _ in range(2):
            for m in METHODS:
                runs[m]()
        for r in range(rounds):
            for m in METHODS if r % 2 == 0 else reversed(METHODS):
                t0 = time.perf_counter()
                runs[m]()
                times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def memory_child(name: str, batch: int, method: str) -> None:
    model, x, convs = build(name, batch)
    run = runner(method, model, x, convs)
    with torch.no_grad():
        run()  # warm up (lazy initialisations), then measure a second call
        before = _rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current resident set
        kept = run()
        peak = _rss_kib("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024, "kept_mib": kept_bytes(kept) / 2**20}))


def memory(name: str, batch: int) -> dict[str, dict[str, float]]:
    out = {}
    for m in METHODS:
        res = subprocess.run(
            [sys.executable, __file__, "--memory-child", name, str(batch), m],
            capture_output=True, text=True, check=True,
        )
        out[m] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", nargs=3)
    a = ap.parse_args()
    if a.memory_child:
        memory_child(a.memory_child[0], int(a.memory_child[1]), a.memory_child[2])
        return
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    for name, batch in CASES:
        rounds = (30 if a.quick else 120) if batch == 1 else (6 if a.quick else 20)
        t = timing(name, batch, rounds)
        mem = memory(name, batch)
        base = mem["plain"]["peak_mib"]
        print(f"\n## {name}, batch {batch} ({rounds} rounds)")
        print("| method | median ms | ratio to plain | peak extra MiB | kept MiB | extra / kept |")
        print("|---|---|---|---|---|---|")
        for m in METHODS:
            extra = mem[m]["peak_mib"] - base
            kept = mem[m]["kept_mib"]
            frac = f"{extra / kept:.2f}" if kept else "-"
            print(f"| {m} | {t[m] * 1e3:.1f} | {t[m] / t['plain']:.3f}x | {extra:.0f} | {kept:.0f} | {frac} |")


if __name__ == "__main__":
    main()
