"""trace and watch against the plain model, forward and forward+backward, on torchvision models (CPU).

Run:  .venv/bin/python bench/bench_trace.py                    (several minutes on 2 CPU cores)
      .venv/bin/python bench/bench_trace.py --quick            (fewer rounds)
      .venv/bin/python bench/bench_trace.py --native off       (the torch-ops fallback, no C kernel)
      .venv/bin/python bench/bench_trace.py --models resnet18 --rounds 1   (a smoke run)

torchvision models, weights=None, eval(), 3x224x224 inputs, CPU. Two tables:

1. forward, under ``torch.no_grad()``: resnet50 batch 8, resnet18 batch 1, vit_b_16 batch 4. The plain
   forward in ms; trace ``keep="io"`` (the default), trace ``keep="output"`` and ``watch(model)`` as
   ratios to it; the rows of trace io, the tensors the engine actually reduced for them, and the GiB
   the rows describe against the GiB reduced (each distinct tensor version is reduced once).
2. forward+backward, grad enabled (``model(x).sum().backward()``, the model still in eval mode):
   resnet50 batch 8 and resnet18 batch 1. The plain pass in ms; trace ``keep="all"`` and
   ``watch(model, keep="all")`` as ratios; rows and tensors reduced of the trace.

Per model, the methods run interleaved, round after round, in one process (the order alternates,
``bench/_rounds.py``). Each ratio is the median over rounds of the method's time divided by the plain
time of the same round (the machine's slow phases last longer than a round, so they cancel); in
brackets, the ratio of the two medians over the run. The plain figure is the median in ms. Each traced round includes reading the result back (``t.rows``, ``w.finite``: the one
device-to-host gather), so it is the full cost. Every forward+backward round (plain included) starts
with ``model.zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torchvision
from torch import nn

from _rounds import cpu_model, ratios  # bench/_rounds.py: this folder is on sys.path when run as a script

FORWARD = {"resnet50": 8, "resnet18": 1, "vit_b_16": 4}  # model -> batch
BACKWARD = {"resnet50": 8, "resnet18": 1}


@dataclass
class Size:
    """What one traced pass holds: rows, tensors reduced, GiB the rows describe, GiB reduced."""

    rows: int
    reduced: int
    gib_rows: float
    gib_reduced: float


def measure(run: Callable[[], list[Any]]) -> Size:
    """One untimed traced pass, counting the calls of the engine's reductions (its private
    ``tensor_stats`` and ``stats_and_relu``, wrapped here only); ``run`` returns the rows."""
    import hookscope.analysis._recorder as engine

    seen: list[int] = []
    originals = {"tensor_stats": engine.tensor_stats, "stats_and_relu": engine.stats_and_relu}

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def count(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            seen.append(t.numel() * t.element_size())
            return original(t, *args, **kwargs)
        return count

    for name, original in originals.items():
        setattr(engine, name, counting(original))
    try:
        rows = run()
    finally:
        for name, original in originals.items():
            setattr(engine, name, original)
    described = sum(r.numel * torch.empty((), dtype=getattr(torch, r.dtype)).element_size() for r in rows)
    return Size(len(rows), len(seen), described / 2**30, sum(seen) / 2**30)


def forward_runs(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    import hookscope

    def traced(keep: str) -> Callable[[], Any]:
        def run() -> Any:
            with hookscope.trace(model, keep=keep) as t:
                model(x)
            return t.rows
        return run

    def watched() -> Any:
        with hookscope.watch(model) as w:
            model(x)
        return w.finite

    return {"plain": lambda: model(x), "trace io": traced("io"), "trace output": traced("output"),
            "watch": watched}


def backward_runs(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    import hookscope

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    def traced() -> Any:
        model.zero_grad(set_to_none=True)
        with hookscope.trace(model, keep="all") as t:
            model(x).sum().backward()
        return t.rows

    def watched() -> Any:
        model.zero_grad(set_to_none=True)
        with hookscope.watch(model, keep="all") as w:
            model(x).sum().backward()
        return w.finite

    return {"plain": plain, "trace all": traced, "watch all": watched}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    model: nn.Module = getattr(torchvision.models, name)(weights=None)
    return model.eval()


def _ratio(med: dict[str, float], rel: dict[str, float], key: str) -> str:
    """The median of the per-round ratios, and in brackets the ratio of the medians."""
    return f"{rel[key]:.3f}x ({med[key] / med['plain']:.3f}x)"


def _row(name: str, batch: int, make: Callable[[nn.Module, torch.Tensor], dict[str, Callable[[], Any]]],
         rounds: int, counted: str, shown: list[str], *, no_grad: bool) -> None:
    """One table row: plain ms, the ratios of ``shown``, and what ``counted`` reduced."""
    model, x = build(name), torch.randn(batch, 3, 224, 224)
    runs = make(model, x)
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        size = measure(runs[counted])
        med, rel = ratios(runs, rounds, base="plain")
    cells = [name, str(batch), f"{med['plain'] * 1e3:.1f}", *(_ratio(med, rel, k) for k in shown), str(size.rows),
             str(size.reduced), f"{size.gib_rows:.2f} / {size.gib_reduced:.2f}"]
    print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--rounds", type=int, help="timed rounds per table (default 15 / 8 for backward; quick 6 / 4)")
    ap.add_argument("--models", default="", help="comma-separated filter, e.g. resnet18 (default: all)")
    ap.add_argument("--tables", choices=("both", "forward", "backward"), default="both",
                    help="which of the two tables to measure")
    ap.add_argument("--native", choices=("on", "off"), default="on",
                    help="off: HOOKSCOPE_NATIVE=0 before hookscope is imported (the torch-ops fallback)")
    a = ap.parse_args()
    if a.native == "off":
        os.environ["HOOKSCOPE_NATIVE"] = "0"
    import hookscope  # noqa: F401 - after HOOKSCOPE_NATIVE is set

    try:
        from hookscope._native import stats_kernel
        native = "C kernel" if stats_kernel() is not None else "torch-ops fallback"
    except ImportError:
        native = "no hookscope._native (torch ops)"
    wanted = {m.strip() for m in a.models.split(",") if m.strip()}
    unknown = wanted - set(FORWARD) - set(BACKWARD)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; known: {sorted(FORWARD)}")
    forward = {m: b for m, b in FORWARD.items() if (not wanted or m in wanted) and a.tables != "backward"}
    backward = {m: b for m, b in BACKWARD.items() if (not wanted or m in wanted) and a.tables != "forward"}
    rounds_fwd = a.rounds or (6 if a.quick else 15)
    rounds_bwd = a.rounds or (4 if a.quick else 8)

    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}, Python {platform.python_version()}")
    print(f"# {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; CPU reductions: {native}")
    print(f"# {shlex.join([os.path.relpath(sys.executable), *sys.argv])}")

    if forward:
        print(f"\n## forward, torch.no_grad(), {rounds_fwd} rounds (median of per-round ratios; ratio of medians)\n")
        print("trace io / output and watch as ratios to the plain forward; rows, tensors reduced and "
              "GiB are trace io's.\n")
        print("| model | batch | plain ms | trace io | trace output | watch | rows | reduced | "
              "GiB described / reduced |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, batch in forward.items():
            _row(name, batch, forward_runs, rounds_fwd, "trace io", ["trace io", "trace output", "watch"],
                 no_grad=True)

    if backward:
        print(f"\n## forward+backward, grad enabled, model.eval(), {rounds_bwd} rounds (median of per-round ratios; ratio of medians)\n")
        print("trace keep=\"all\" and watch keep=\"all\" as ratios to the plain forward+backward; rows, "
              "tensors reduced and GiB are the trace's.\n")
        print("| model | batch | plain ms | trace all | watch all | rows | reduced | GiB described / reduced |")
        print("|---|---|---|---|---|---|---|---|")
        for name, batch in backward.items():
            _row(name, batch, backward_runs, rounds_bwd, "trace all", ["trace all", "watch all"], no_grad=False)

if __name__ == "__main__":
    main()
