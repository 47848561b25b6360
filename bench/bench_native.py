"""The CPU statistics, measured per way of taking them: the C kernel, the torch fallback, a
``torch.compile``d reduction and a one-sync torch formulation.

Run:  .venv/bin/python bench/bench_native.py [--rounds 21] [--threads 2]   (a few minutes on 2 cores)

Each figure is the median over interleaved rounds (every method once per round, the order
alternating, ``bench/_rounds.py``), with the 25th-75th percentile range beside it. The methods
compute the same thing, one tensor's :data:`~hookscope.analysis._reduce.STATS` row as
``tensor_stats`` does:

- ``kernel``: ``_native_stats.c`` (one pass; half precision copied into float32 first).
- ``torch``: hookscope's fallback without the kernel (four or five torch passes, ``_host_stats``).
- ``compiled``: one ``torch.compile(dynamic=True)`` function returning sum and sum of squares
  (float64), min, max and the zero count in one stacked tensor; inductor fuses them into one C++/
  OpenMP loop. Its compile time and first call are reported apart (a fresh inductor cache, then a
  second process on the warm cache).
- ``stacked``: eager torch, every reduction into one ``torch.stack`` read back once.

Three parts: tensors of 1e4 to 1e7 elements (float32 contiguous and channels-last, bfloat16,
float16) with each method's largest error against a float64 reference; the statistics of every
distinct tensor of one resnet50 batch-8 forward (``weights=None``, what ``trace`` reduces); guided
backpropagation's ReLU backward over the outputs of that forward's ReLUs (``hs_guided`` against
``threshold_backward`` + ``clamp_``, eager and compiled).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from _rounds import cpu_model, timings  # bench/_rounds.py: this folder is on sys.path when run as a script

F64 = torch.float64
STATS_OF = Callable[[torch.Tensor], list[float]]


def _sums(x: torch.Tensor) -> torch.Tensor:
    d = x.to(F64)
    return torch.stack([d.sum(), (d * d).sum(), d.amin(), d.amax(), (x == 0).sum().to(F64)])


def _guided_eager(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0).clamp_(min=0)


def _guided_fused(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0).clamp(min=0)


def methods(compiled: Callable[[torch.Tensor], torch.Tensor] | None) -> dict[str, STATS_OF]:
    """The ways of taking one CPU tensor's row, by name (``kernel`` only where it is built)."""
    from hookscope._memory import Scratch, dense_view
    from hookscope._native import stats_kernel
    from hookscope.analysis import _reduce as r

    scratch = Scratch()
    kernel = stats_kernel()
    found: dict[str, STATS_OF] = {}
    if kernel is not None:
        found["kernel"] = lambda x: r._kernel_stats(x, kernel, scratch)
    found["torch"] = lambda x: r._host_stats(r._dense_copy(x, scratch), scratch)

    def from_sums(x: torch.Tensor, s: float, q: float, lo: float, hi: float, z: float) -> list[float]:
        if not (math.isfinite(s) and math.isfinite(q)):
            return r._non_finite(r._dense_copy(x, scratch))
        row = r._from_sums(x.numel(), s, q, lo, hi, int(z))
        return row if row is not None else r._host_stats(r._dense_copy(x, scratch), scratch)

    if compiled is not None:
        def by_compiled(x: torch.Tensor) -> list[float]:
            v = dense_view(x)
            return from_sums(x, *compiled(v if v is not None else x.reshape(-1)).tolist())
        found["compiled"] = by_compiled

    def stacked(x: torch.Tensor) -> list[float]:
        v = r._dense_copy(x, scratch)
        lo, hi = torch.aminmax(v)
        zeros = v.numel() - torch.count_nonzero(v)
        s, q, lo_, hi_, z = torch.stack([v.sum().to(F64), torch.dot(v, v).to(F64), lo.to(F64), hi.to(F64),
                                         zeros.to(F64)]).tolist()
        return from_sums(x, s, q, lo_, hi_, z)
    found["stacked"] = stacked
    return found


def reference(x: torch.Tensor) -> list[float]:
    d = x.double()
    return [d.mean().item(), d.std(correction=0).item(), d.min().item(), d.max().item(), int((x == 0).sum())]


def error(row: list[float], ref: list[float]) -> tuple[float, bool]:
    """Largest error of mean and std, relative to the reference std; whether min, max, zeros are exact."""
    scale = ref[1] or 1.0
    err = max(abs(row[0] - ref[0]) / scale, abs(row[1] - ref[1]) / scale)
    return err, [row[2], row[3], row[5]] == [ref[2], ref[3], ref[4]]


def spread(ts: list[float], per: int) -> str:
    q = statistics.quantiles(ts, n=4)
    k = 1e3 / per
    return f"{statistics.median(ts) * k:.3f} ({q[0] * k:.3f}-{q[2] * k:.3f})"


def cases(sizes: list[int]) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    found = []
    for n in sizes:
        v = torch.randn(n, generator=g) * 3 + 0.5
        v[torch.rand(n, generator=g) < 0.2] = 0.0
        v[::17] = -0.0
        c = max(1, round((n / 8) ** (1 / 3)))
        hw = max(1, round(math.sqrt(n / 8 / c)))
        cl = torch.randn(8, c, hw, hw, generator=g) * 3 + 0.5
        cl[torch.rand(cl.shape, generator=g) < 0.2] = 0.0
        cl = cl.to(memory_format=torch.channels_last)
        found += [(f"{n:.0e} float32", v), (f"{cl.numel():.0e} float32 channels-last", cl),
                  (f"{n:.0e} bfloat16", v.bfloat16()), (f"{n:.0e} float16", v.half())]
    return found


def part_sizes(runs: dict[str, STATS_OF], sizes: list[int], rounds: int) -> None:
    names = list(runs)
    print("| tensor | " + " | ".join(f"{k} ms (p25-p75)" for k in names) + " | "
          + " | ".join(f"{k} error" for k in names) + " |")
    print("|---|" + "---|" * (2 * len(names)))
    for label, x in cases(sizes):
        per = max(1, 200_000 // x.numel())  # each timed call at least ~0.1 ms of work
        ref = reference(x)
        errs = {}
        for k, fn in runs.items():
            err, exact = error(fn(x), ref)
            errs[k] = f"{err:.1e}" + ("" if exact else " (min/max/zeros differ)")
        calls = {k: (lambda fn=fn: [fn(x) for _ in range(per)]) for k, fn in runs.items()}
        ts = timings(calls, rounds)
        print(f"| {label} | " + " | ".join(spread(ts[k], per) for k in names) + " | "
              + " | ".join(errs[k] for k in names) + " |", flush=True)


def resnet_tensors() -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """Every distinct tensor version one resnet50 batch-8 forward shows to its modules' hooks (inputs
    and outputs, cloned as they were), the outputs of its ReLUs, and the plain forward's seconds."""
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(8, 3, 224, 224)
    seen: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
    alive: list[torch.Tensor] = []  # the originals, held so that no freed tensor's memory is taken for it
    relus: list[torch.Tensor] = []

    def keep(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            alive.append(t)
            seen.setdefault((t.data_ptr(), t._version, tuple(t.shape)), t.detach().clone(memory_format=torch.preserve_format))

    def pre(m: torch.nn.Module, args: Any) -> None:
        for a in args:
            keep(a)

    def post(m: torch.nn.Module, args: Any, out: Any) -> None:
        keep(out)
        if isinstance(m, torch.nn.ReLU):
            relus.append(out.detach().clone())

    hooks = [h for m in net.modules() for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    alive.clear()
    with torch.no_grad():
        net(x)
        t0 = time.perf_counter()
        net(x)
        plain = time.perf_counter() - t0
    return list(seen.values()), relus, plain


def part_resnet(runs: dict[str, STATS_OF], tensors: list[torch.Tensor], plain: float, rounds: int) -> None:
    gib = sum(t.numel() * t.element_size() for t in tensors) / 2**30
    ref = [reference(t) for t in tensors]
    print(f"\nresnet50 batch 8, one forward: {len(tensors)} distinct tensors, {gib:.2f} GiB; "
          f"one plain no_grad forward {plain * 1e3:.0f} ms (once, for scale)\n")
    print("| method | ms per forward's tensors, median (p25-p75) | vs kernel, median of per-round ratios | "
          "largest error / std | min, max, zeros exact |")
    print("|---|---|---|---|---|")
    calls = {k: (lambda fn=fn: [fn(t) for t in tensors]) for k, fn in runs.items()}
    ts = timings(calls, rounds)
    base = ts.get("kernel")
    for k, fn in runs.items():
        worst, exact = 0.0, True
        for t, want in zip(tensors, ref):
            e, ok = error(fn(t), want)
            worst, exact = max(worst, e), exact and ok
        ratio = "" if base is None else f"{statistics.median(a / b for a, b in zip(ts[k], base)):.2f}x"
        print(f"| {k} | {spread(ts[k], 1)} | {ratio} | {worst:.1e} | {exact} |", flush=True)


def part_guided(relus: list[torch.Tensor], compiled: Any, rounds: int) -> None:
    from hookscope._native import stats_kernel

    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(o.shape, generator=g) for o in relus]
    kernel = stats_kernel()
    runs: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]] = {}
    if kernel is not None:
        runs["kernel (hs_guided)"] = kernel.guided
    runs["threshold_backward + clamp_"] = _guided_eager
    if compiled is not None:
        runs["compiled (one fused loop)"] = compiled
    equal = {}
    for k, fn in runs.items():
        equal[k] = all(torch.equal(fn(gr, o), _guided_eager(gr, o)) for gr, o in zip(grads, relus))  # type: ignore[arg-type]
    mb = sum(o.numel() * 4 for o in relus) / 1e6
    print(f"\nguided backpropagation, the ReLU backward of resnet50 batch 8: {len(relus)} ReLU outputs, "
          f"{mb:.0f} MB (and as much gradient)\n")
    print("| method | ms per backward's ReLUs, median (p25-p75) | vs kernel | same values as torch |")
    print("|---|---|---|---|")
    ts = timings({k: (lambda fn=fn: [fn(gr, o) for gr, o in zip(grads, relus)]) for k, fn in runs.items()}, rounds)
    base = ts.get("kernel (hs_guided)")
    for k in runs:
        ratio = "" if base is None else f"{statistics.median(a / b for a, b in zip(ts[k], base)):.2f}x"
        print(f"| {k} | {spread(ts[k], 1)} | {ratio} | {equal[k]} |", flush=True)


FIRST_CALL = """
import time, torch, sys
sys.path.insert(0, {here!r})
from bench_native import _sums
t0 = time.perf_counter()
f = torch.compile(_sums, dynamic=True, fullgraph=True)
f(torch.randn(100_003))
print(time.perf_counter() - t0)
"""


def part_compile(compiled: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """First calls: compile (a fresh inductor cache) per dtype, a new size, a second process."""
    print("\n| first call of the compiled reduction | seconds |")
    print("|---|---|")
    for label, x in (("float32, 100,003 elements (compiles)", torch.randn(100_003)),
                     ("float32, 54,321 elements (a new size: no recompile expected)", torch.randn(54_321)),
                     ("float32, 10,000,000 elements", torch.randn(10_000_000)),
                     ("bfloat16 (compiles for the dtype)", torch.randn(100_003).bfloat16()),
                     ("float16 (compiles for the dtype)", torch.randn(100_003).half()),
                     ("float32, 2-D view made 1-D", torch.randn(300, 301).view(-1))):
        t0 = time.perf_counter()
        compiled(x)
        print(f"| {label} | {time.perf_counter() - t0:.3f} |", flush=True)
    t0 = time.perf_counter()
    compiled(torch.randn(77_777))
    print(f"| float32, after all the above | {time.perf_counter() - t0:.4f} |")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", FIRST_CALL.format(here=here)], capture_output=True, text=True,
                          env=os.environ, timeout=600)
    warm = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else done.stderr[-300:]
    print(f"| a new process, the same (now warm) inductor cache: compile + first call | {warm} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds per figure (default 21)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--sizes", type=int, nargs="*", default=[10**4, 10**5, 10**6, 10**7])
    p.add_argument("--only", choices=["sizes", "resnet", "guided", "compile"], action="append",
                   help="run only these parts (repeatable)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile method")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    parts = set(a.only or ["sizes", "resnet", "guided", "compile"])
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # a cold cache: the compile time is the first-ever one
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-native-inductor-")

    from hookscope._native import stats_kernel

    kernel = stats_kernel()
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"Python {platform.python_version()}; kernel: {kernel is not None}"
          f"{'' if kernel is None else f', shares torch OpenMP workers: {kernel.parallel}'}")
    print(f"# {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# {shlex.join([os.path.relpath(sys.executable), *sys.argv])}\n")
    compiled = guided = None
    if not a.no_compile:
        compiled = torch.compile(_sums, dynamic=True, fullgraph=True)
        guided = torch.compile(_guided_fused, dynamic=True, fullgraph=True)
        if "compile" in parts:
            part_compile(compiled)
            print()
        else:
            compiled(torch.randn(1000))
        for dt in (torch.bfloat16, torch.float16):
            compiled(torch.randn(1000).to(dt))
        guided(torch.randn(1000), torch.randn(1000))
        guided(torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last), torch.randn(2, 3, 8, 8))
    runs = methods(compiled)
    if "sizes" in parts:
        part_sizes(runs, a.sizes, a.rounds)
    if parts & {"resnet", "guided"}:
        tensors, relus, plain = resnet_tensors()
        if "resnet" in parts:
            part_resnet(runs, tensors, plain, a.rounds)
        del tensors
        if "guided" in parts:
            part_guided(relus, guided, a.rounds)
    print(f"\n# done {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
