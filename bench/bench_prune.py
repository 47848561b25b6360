"""Pruning benchmarks (issue 15): what removing channels buys, and what it costs in accuracy.

    .venv/bin/python bench/bench_prune.py latency   # resnet50, batch 8, CPU: 0/30/50/70% channels removed
    .venv/bin/python bench/bench_prune.py demo      # the demo model's accuracy against sparsity

``latency``: torchvision resnet50 (weights=None, eval), every removable channel group masked by the
L2 norm of its producers' weight rows (``hookscope.prune_channels(amount=s)``, the same share of
every group), then compacted (``hookscope.compact``); parameters, multiply-adds and the median CPU
latency at batch 8 x 3 x 224 x 224, every sparsity timed in the same interleaved rounds (bench/_rounds.py),
and the compacted model's largest output difference from the masked one.

``demo``: the shipped demo model, 1,000 freshly drawn images (seed 2026) for accuracy, 256 others
(seed 2027) to calibrate the measured kinds; for each importance (l2 magnitude, mean |activation|,
APoZ, first-order Taylor) and sparsity 0-90%: accuracy after compaction without fine-tuning, and after
fine-tuning the compacted model with scripts/train_demo.py's ``fit`` (EPOCHS epochs of PER_EPOCH
freshly drawn images).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

import hookscope
from hookscope.synthetic import shapes
from hookscope.zoo import demo_model

sys.path.insert(0, str(Path(__file__).parent))
from _rounds import medians  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EPOCHS, PER_EPOCH = 2, 2_000


def _params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _macs(m: torch.nn.Module, x: torch.Tensor) -> int:
    return int(hookscope.summary(m, x).totals.macs)


def latency(rounds: int) -> None:
    import torchvision

    torch.manual_seed(0)
    x, probe = torch.randn(8, 3, 224, 224), torch.randn(1, 3, 224, 224)
    models: dict[str, torch.nn.Module] = {}
    rows = []
    for share in (0.0, 0.3, 0.5, 0.7):
        model = torchvision.models.resnet50(weights=None).eval()
        t0 = time.perf_counter()
        res = hookscope.prune_channels(model, probe, amount=share) if share else None
        small = hookscope.compact(model, probe) if share else model
        took = time.perf_counter() - t0
        with torch.no_grad():
            gap = float((small(probe) - model(probe)).abs().max())
        models[f"{share:.0%}"] = small
        rows.append((f"{share:.0%}", res.removed if res else 0, res.channels if res else 0, _params(small),
                     _macs(small, probe), gap, took))
    with torch.no_grad():
        times = medians({k: (lambda m=m: m(x)) for k, m in models.items()}, rounds)
    base = times["0%"]
    print(f"resnet50, batch 8, 224x224, CPU ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}), {rounds} interleaved rounds")
    print("| channels removed | groups' channels masked | parameters | multiply-adds | latency (median) | speed-up | "
          "max abs diff vs masked | prune + compact |")
    print("|---|---|---|---|---|---|---|---|")
    for (k, removed, total, params, macs, gap, took) in rows:
        print(f"| {k} | {removed:,} of {total:,} | {params / 1e6:.2f} M | {macs / 1e9:.2f} G | {times[k] * 1e3:.0f} ms | "
              f"{base / times[k]:.2f}x | {gap:.1e} | {took:.1f} s |")


def _fit() -> Any:
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "scripts" / "train_demo.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fit


def _accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(images).argmax(1) == labels).float().mean())


def demo() -> None:
    fit = _fit()
    test, calib = shapes(1_000, seed=2026), shapes(256, seed=2027)
    batches = [(calib.images[i:i + 64], calib.labels[i:i + 64]) for i in range(0, 256, 64)]
    probe = test.images[:1]
    args = argparse.Namespace(epochs=EPOCHS, per_epoch=PER_EPOCH, batch=64, lr=1e-3, eval=200)
    torch.set_num_threads(2)
    print(f"demo model, 1,000 test images (seed 2026); fine-tuning: {EPOCHS} epochs x {PER_EPOCH} images, lr 1e-3")
    print("| importance | sparsity | parameters | accuracy | after fine-tuning |")
    print("|---|---|---|---|---|")
    for kind in ("l2", "activation", "apoz", "taylor"):
        for share in [i / 10 for i in range(10)]:
            model = demo_model()
            if share:
                hookscope.prune_channels(model, probe, amount=share, importance=kind,
                                         data=None if kind == "l2" else batches)
            small = hookscope.compact(model, probe) if share else copy.deepcopy(model)
            before = _accuracy(small, test.images, test.labels)
            tuned = fit(small, args, seed=50_000, log=False)
            after = _accuracy(tuned, test.images, test.labels)
            print(f"| {kind} | {share:.0%} | {_params(small):,} | {before:.1%} | {after:.1%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("latency", "demo"))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(time.strftime("%Y-%m-%d"), platform.node())
    latency(a.rounds) if a.part == "latency" else demo()


if __name__ == "__main__":
    main()
