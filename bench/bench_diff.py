"""Layer-by-layer diff of two runs of resnet50 against the two plain forwards it replaces.

Run:  .venv/bin/python bench/bench_diff.py            (about 6 minutes on 2 CPU cores)
      .venv/bin/python bench/bench_diff.py --quick    (fewer rounds)
      .venv/bin/python bench/bench_diff.py --count    (rows against tensor pairs compared, untimed)

torchvision resnet50 (and resnet18), weights=None, eval(), batch 8 (resnet18: 1), 3x224x224, CPU.
Cases: the same model twice (every output equal: the usual state before the first divergence),
two checkpoints (every weight moved by 1e-3 relative: every output differs), and float32 against
bfloat16 autocast (every output differs; bfloat16 is slow on this CPU). The floor of each case is
the two plain forwards the diff runs, measured in the same rounds. Methods run interleaved, the order alternating; figures are medians.
"""

from __future__ import annotations

import argparse
import copy
import platform
from typing import Any, Callable

import torch
import torchvision

import hookscope
from _rounds import medians  # bench/_rounds.py: this folder is on sys.path when run as a script


def cases(name: str, batch: int) -> dict[str, Callable[[], Any]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1 + 1e-3 * torch.randn_like(p))

    def floor(second: torch.nn.Module, autocast: bool) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                model(x)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    second(x)
        return run

    bf16 = hookscope.settings(autocast=torch.bfloat16)
    return {
        "floor: two plain forwards": floor(model, False),
        "diff, same model twice": lambda: hookscope.diff(model, model, x).rows,
        "floor: two checkpoints": floor(other, False),
        "diff, two checkpoints": lambda: hookscope.diff(model, other, x).rows,
        "floor: plain + bfloat16 autocast forward": floor(model, True),
        "diff, float32 vs bfloat16 autocast": lambda: hookscope.diff(model, model, x, b=bf16).rows,
    }


def count(name: str, batch: int) -> None:
    """One diff of two checkpoints, untimed: its rows against the tensor pairs actually compared
    (the calls of the private ``_stats``, wrapped here only: a pair of tensor versions seen again,
    such as a Sequential's output that is its last child's, is compared once)."""
    import hookscope.analysis.diff._compare as compare

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1 + 1e-3 * torch.randn_like(p))
    calls: list[int] = []
    original = compare._stats

    def counting(a: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(a.numel())
        return original(a, *args, **kwargs)

    compare._stats = counting
    try:
        d = hookscope.diff(model, other, torch.randn(batch, 3, 224, 224))
    finally:
        compare._stats = original
    tensors = sum(1 for r in d.rows if r.numel)
    print(f"{name} batch {batch}: {len(d.rows)} rows ({tensors} with tensors), {len(calls)} pairs compared")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--count", action="store_true", help="only count rows and pairs compared (untimed)")
    a = ap.parse_args()
    if a.count:
        for name, batch in (("resnet18", 1), ("resnet50", 8)):
            count(name, batch)
        return
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}")
    for name, batch, rounds in (("resnet18", 1, 15), ("resnet50", 8, 5)):
        rounds = max(3, rounds // 3) if a.quick else rounds
        runs = cases(name, batch)
        keys = list(runs)
        med = medians(runs, rounds)
        print(f"\n## {name}, batch {batch}, every module ({rounds} rounds)")
        print("| method | median ms | ratio to its floor |\n|---|---|---|")
        floors = {keys[1]: keys[0], keys[3]: keys[2], keys[5]: keys[4]}
        for k in keys:
            ratio = f"{med[k] / med[floors[k]]:.3f}x" if k in floors else ""
            print(f"| {k} | {med[k] * 1e3:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
