"""Trace every module of resnet50 (forward statistics) against the plain forward.

Run:  .venv/bin/python bench/bench_trace.py            (about 2 minutes on 2 CPU cores)
      .venv/bin/python bench/bench_trace.py --quick    (fewer rounds)

torchvision resnet50, weights=None, eval(), torch.no_grad(), batch 8, 3x224x224, CPU. The methods
run interleaved, round after round, in one process (the order alternates), and each figure is the
median over rounds; ratios are to the plain forward's median of the same run. Each traced round
includes reading the rows back (the one device-to-host gather), so it is the full cost of a trace.
"""

from __future__ import annotations

import argparse
import platform
from typing import Any, Callable

import torch
import torchvision
from torch import nn

from hookscope.analysis.trace import trace
from _rounds import medians  # bench/_rounds.py: this folder is on sys.path when run as a script


def runners(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    def traced(inputs: bool) -> Callable[[], Any]:
        def run() -> Any:
            with trace(model, keep="io" if inputs else "output") as t:
                model(x)
            return t.rows
        return run

    return {
        "plain forward": lambda: model(x),
        "trace, outputs only": traced(False),
        "trace, inputs and outputs (default)": traced(True),
    }


def reduced(run: Callable[[], Any]) -> tuple[int, int, float, float]:
    """One untimed traced pass: (rows, tensors actually reduced, GiB the rows describe, GiB reduced).

    Counts the calls of the engine's reduction (its private ``tensor_stats``, wrapped here only).
    """
    import hookscope.analysis._recorder as engine

    seen: list[int] = []
    original = engine.tensor_stats

    def counting(t: torch.Tensor, *args: Any) -> Any:
        seen.append(t.numel() * t.element_size())
        return original(t, *args)

    engine.tensor_stats = counting
    try:
        rows = run()
    finally:
        engine.tensor_stats = original
    described = sum(r.numel * torch.empty((), dtype=getattr(torch, r.dtype)).element_size() for r in rows)
    return len(rows), len(seen), described / 2**30, sum(seen) / 2**30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(a.batch, 3, 224, 224)
    runs = runners(model, x)
    names = list(runs)
    rounds = 6 if a.quick else 15
    with torch.no_grad():
        rows, n_reduced, gib_rows, gib_reduced = reduced(runs[names[-1]])  # the size of a trace
        med = medians(runs, rounds)
    modules = sum(1 for _ in model.modules()) - 1
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    print(f"\n## resnet50, batch {a.batch}, every module ({modules} modules, {rows} rows with inputs), "
          f"{rounds} rounds")
    print(f"Rows describe {gib_rows:.2f} GiB of tensors; {n_reduced} tensors ({gib_reduced:.2f} GiB) were "
          "actually reduced (each distinct tensor version once).\n")
    print("| method | median ms | ratio to plain |")
    print("|---|---|---|")
    for n in names:
        print(f"| {n} | {med[n] * 1e3:.1f} | {med[n] / med[names[0]]:.3f}x |")


if __name__ == "__main__":
    main()
