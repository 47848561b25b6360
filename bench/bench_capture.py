"""Capture every Conv2d output: hookscope's safe default against the plain forward and the peers.

Run:  .venv/bin/python bench/bench_capture.py            (about 4 minutes on 2 CPU cores)
      .venv/bin/python bench/bench_capture.py --quick    (fewer repeats)
      .venv/bin/python bench/bench_capture.py --against DIR   (also hookscope from another source tree,
          such as `git worktree add DIR <commit>`, as the method "before", in the same rounds)

Timing: the methods run interleaved, round after round, in one process (the order alternates), and
each figure is the median over rounds; ratios are to the plain forward's median of the same run.
Memory: each method runs once more under a dispatch mode that reads malloc's bytes in use
(glibc mallinfo2) after every aten op; the figure is the peak above the start of the call. The
resident set is not used: glibc returns and re-faults freed memory in ways that hide the tensors.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torchvision
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hookscope
from _rounds import ratios  # bench/_rounds.py: this folder is on sys.path when run as a script

METHODS = ["plain", "hookscope", "hand_clone", "hand_refs", "create_feature_extractor"]
CASES = [("resnet18", 1), ("resnet50", 8)]


def build(name: str, batch: int) -> tuple[nn.Module, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    return model, x, convs


def load_before(tree: str) -> Any:
    """hookscope from another source tree (``tree/src/hookscope``), imported as the package ``hookscope_before``."""
    root = Path(tree) / "src" / "hookscope"
    spec = importlib.util.spec_from_file_location("hookscope_before", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None, f"no hookscope package in {root}"
    module = importlib.util.module_from_spec(spec)
    sys.modules["hookscope_before"] = module
    spec.loader.exec_module(module)
    return module


def runner(method: str, model: nn.Module, x: torch.Tensor, convs: list[str]) -> Callable[[], Any]:
    """A function doing one forward that keeps every conv output by ``method``; returns what it kept."""
    if method == "plain":
        return lambda: model(x)
    if method in ("hookscope", "before"):
        lib = hookscope if method == "hookscope" else sys.modules["hookscope_before"]

        def run() -> Any:
            with lib.capture(model, nn.Conv2d) as rec:
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
    if type(kept).__name__ == "Recording":
        return sum(rec.output.numel() * rec.output.element_size() for _, rec in kept.items())
    if isinstance(kept, dict):
        return sum(t.numel() * t.element_size() for t in kept.values())
    return 0


def timing(name: str, batch: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per method, and the median over rounds of each method's time over plain's."""
    model, x, convs = build(name, batch)
    runs = {m: runner(m, model, x, convs) for m in METHODS}
    with torch.no_grad():
        return ratios(runs, rounds, base="plain", warmup=2)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _malloc_in_use() -> int:
    """Bytes malloc has handed out and not had back (heap + mmapped), whatever the RSS does."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class _PeakMemory(TorchDispatchMode):
    """Samples malloc's bytes in use after every aten op (measurement runs only)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, _malloc_in_use())
        return out


def memory(name: str, batch: int) -> dict[str, dict[str, float]]:
    """Peak bytes in use above the start, per method, and the bytes each method keeps."""
    model, x, convs = build(name, batch)
    out = {}
    with torch.no_grad():
        for m in METHODS:
            run = runner(m, model, x, convs)
            run()  # warm up (lazy initialisations)
            base = _malloc_in_use()
            probe = _PeakMemory()
            with probe:
                kept = run()
            out[m] = {"peak_mib": (probe.peak - base) / 2**20, "kept_mib": kept_bytes(kept) / 2**20}
            del kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--against", metavar="DIR", default=None,
                    help="also time hookscope from the source tree DIR (method 'before'), in the same rounds")
    a = ap.parse_args()
    if a.against:
        load_before(a.against)
        METHODS.insert(2, "before")
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    for name, batch in CASES:
        rounds = (30 if a.quick else 120) if batch == 1 else (6 if a.quick else 20)
        t, r = timing(name, batch, rounds)
        mem = memory(name, batch)
        base = mem["plain"]["peak_mib"]
        print(f"\n## {name}, batch {batch} ({rounds} rounds)")
        print("| method | median ms | ratio to plain (median of rounds) | peak MiB | kept MiB | peak / (plain peak + kept) |")
        print("|---|---|---|---|---|---|")
        for m in METHODS:
            peak, kept = mem[m]["peak_mib"], mem[m]["kept_mib"]
            frac = f"{peak / (base + kept):.3f}" if kept else "-"
            print(f"| {m} | {t[m] * 1e3:.1f} | {r[m]:.3f}x | {peak:.1f} | {kept:.1f} | {frac} |")


if __name__ == "__main__":
    main()
