"""The least that statistics of every module's output can cost here, against trace and watch (issue 13).

Run:  .venv/bin/python bench/bench_floor.py                 (about 3 minutes on 2 CPU cores)
      .venv/bin/python bench/bench_floor.py --rounds 4      (a smoke run)
      MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483648 .venv/bin/python bench/bench_floor.py
                                                            (no page faults: the work, not malloc's history)

resnet50, weights=None, eval(), batch 8, 3x224x224, CPU, under ``torch.no_grad()``. In one process,
interleaved round after round (``bench/_rounds.py``):

- ``plain``: the forward alone;
- ``no-op hooks``: a forward pre-hook and a forward hook (``with_kwargs``, ``always_call``, as the
  engine registers them) on every module, doing nothing;
- ``no-op hooks, eager``: the same hooks, each wrapped as the engine wraps its own
  (``hookscope.core.compiled.eager``: ``torch.compiler.disable``, so that Dynamo never traces it);
- ``reads only``: a forward hook on every module that hands each output tensor it has not seen at
  this version to the C kernel (one pass: sums, extremes, zeros) and keeps the numbers as a tuple.
  No names, no rows, no call stack, no input checks: the reading watch cannot do without (its rows
  are the statistics of every output), and nothing else;
- ``watch``, ``trace output``, ``trace io``: hookscope, result read back each round;
- ``watch, unwrapped``: watch with its hooks registered without that wrapper (the engine's private
  ``eager`` replaced by the identity for the round: unsafe under ``torch.compile``, measured only).

Each ratio is the median over rounds of the method's time over the plain time of the same round;
``faults`` is the median count of minor page faults per forward (``getrusage``): glibc's malloc gives
the 25.7 MB activations fresh pages (6,270 faults each) more or less often depending on its history,
which is what spreads the figures between processes. ``kernel ms`` is the time ``reads only`` spent
in the kernel per forward.
"""

from __future__ import annotations

import argparse
import datetime
import resource
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torchvision
from torch import nn

from hookscope._native import Kernel, stats_kernel
from hookscope.core.compiled import eager

from _rounds import cpu_model  # bench/_rounds.py and bench_trace.py: this folder is on sys.path when run as a script
from bench_trace import forward_runs


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def hooked(model: nn.Module, x: torch.Tensor, register: Callable[[nn.Module], list[Any]]) -> Callable[[], Any]:
    """A forward with the hooks ``register`` puts on each module, removed after it."""
    modules = [m for name, m in model.named_modules() if name]

    def run() -> Any:
        handles = [h for m in modules for h in register(m)]
        try:
            return model(x)
        finally:
            for h in handles:
                h.remove()

    return run


def noop(module: nn.Module, wrap: Callable[[Any], Any] = lambda f: f) -> list[Any]:
    def pre(m: nn.Module, args: Any, kwargs: Any = None) -> None:
        return None

    def post(m: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        return None

    return [module.register_forward_pre_hook(wrap(pre), with_kwargs=True),
            module.register_forward_hook(wrap(post), with_kwargs=True, always_call=True)]


class Reader:
    """Forward hooks that read each output tensor once per version, and nothing else."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.seen: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.kept: list[tuple[float, float, float, float, int]] = []
        self.seconds = 0.0

    def reset(self) -> None:
        self.seen.clear()
        self.kept.clear()
        self.seconds = 0.0

    def register(self, module: nn.Module) -> list[Any]:
        def post(m: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if type(output) is torch.Tensor and output.dtype == torch.float32 and output.is_contiguous():
                ref = self.seen.get(id(output))
                if ref is not None and ref[0]() is output and ref[1] == output._version:
                    return
                self.seen[id(output)] = (weakref.ref(output), output._version)
                t0 = time.perf_counter()
                self.kept.append(self.kernel.stats(output.view(-1)))
                self.seconds += time.perf_counter() - t0

        return [module.register_forward_hook(post, with_kwargs=True, always_call=True)]


def methods(model: nn.Module, x: torch.Tensor, reader: Reader) -> dict[str, Callable[[], Any]]:
    """Each method of the table, one forward per call."""
    import hookscope.analysis._recorder as engine

    def reads() -> Any:
        reader.reset()
        return hooked(model, x, reader.register)()

    hookscope_runs = forward_runs(model, x)  # plain, trace io, trace output, watch (bench_trace.py)

    def unwrapped() -> Any:
        wrapped = getattr(engine, "eager")
        setattr(engine, "eager", lambda f: f)  # measured only: unsafe under torch.compile
        try:
            return hookscope_runs["watch"]()
        finally:
            setattr(engine, "eager", wrapped)

    return {"plain": hookscope_runs["plain"], "no-op hooks": hooked(model, x, noop),
            "no-op hooks, eager": hooked(model, x, lambda m: noop(m, eager)), "reads only": reads,
            "watch": hookscope_runs["watch"], "watch, unwrapped": unwrapped,
            "trace output": hookscope_runs["trace output"], "trace io": hookscope_runs["trace io"]}


def timed(runs: dict[str, Callable[[], Any]], rounds: int,
          reader: Reader) -> tuple[dict[str, list[float]], dict[str, list[int]], list[float]]:
    """Seconds and page faults per method and round (interleaved, order alternating), and the
    kernel's milliseconds in each ``reads only`` round."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, list[int]] = {k: [] for k in runs}
    kernel_ms: list[float] = []
    keys = list(runs)
    for k in keys:  # warm-up
        runs[k]()
    for r in range(rounds):
        for k in keys if r % 2 == 0 else reversed(keys):
            f0, t0 = faults(), time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t0)
            counts[k].append(faults() - f0)
            if k == "reads only":
                kernel_ms.append(reader.seconds * 1e3)
    return times, counts, kernel_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    kernel = stats_kernel()
    if kernel is None:
        raise SystemExit("no statistics kernel here (no C compiler, or HOOKSCOPE_NATIVE=0)")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(8, 3, 224, 224)
    reader = Reader(kernel)
    runs = methods(model, x, reader)
    with torch.no_grad():
        times, counts, kernel_ms = timed(runs, a.rounds, reader)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, {a.rounds} rounds")
    print(f"# reads only: {len(reader.kept)} tensors per forward, kernel {statistics.median(kernel_ms):.1f} ms")
    print("| method | median ms | ratio (per round) | faults |")
    print("|---|---|---|---|")
    for k in runs:
        ratio = statistics.median(t / b for t, b in zip(times[k], times["plain"]))
        print(f"| {k} | {statistics.median(times[k]) * 1e3:.1f} | {ratio:.3f}x | {statistics.median(counts[k]):.0f} |")


if __name__ == "__main__":
    main()
