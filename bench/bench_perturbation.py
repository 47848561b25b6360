"""Perturbation attribution against captum: feature ablation, Shapley value sampling, KernelSHAP and LIME on
torchvision's resnet50 (``weights=None``, eval, CPU, one 3 x 224 x 224 image), features the ~50 superpixels
``hookscope.analysis.attribution.superpixels`` draws (the same mask handed to captum).

Each measurement runs in a fresh process (so its peak memory is its own): the seconds of one call, and the
growth of the process's peak resident memory over what the model and one forward pass already took.
Variants are interleaved (hookscope, captum, hookscope, captum, ...) and repeated; medians are reported,
with the ratio. Both run 16 perturbed copies per forward pass (``batch_size=16`` /
``perturbations_per_eval=16``); hookscope's also runs under ``memory=`` (the budget printed), and its peak
is checked against it.

Run:  .venv/bin/python bench/bench_perturbation.py                 (samples as set below, 2 repeats)
      .venv/bin/python bench/bench_perturbation.py --samples 1000  (LIME and KernelSHAP at 1,000 coalitions)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = "1GB"


def _setup(threads: int):
    import torch
    import torchvision

    from hookscope.analysis.attribution import superpixels

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    mask = superpixels(x, segments=50)[0]
    with torch.no_grad():
        model(x)
    return torch, model, x, mask


def worker(lib: str, method: str, samples: int, threads: int) -> dict[str, float]:
    torch, model, x, mask = _setup(threads)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    target = 3
    started = time.perf_counter()
    if lib == "hookscope":
        import hookscope

        kw = {"samples": samples} if method != "feature_ablation" else {}
        if method == "shapley_value_sampling":
            kw["samples"] = max(1, samples // 100)
        res = hookscope.attribute(model, x, method=method, features=mask, target=target, batch_size=16,
                                  memory=BUDGET, progress=False, **kw)
        maps = res.maps
    else:
        import captum.attr as ca
        from captum._utils.models.linear_model import SkLearnRidge

        full = mask.expand(1, 3, 224, 224).contiguous()
        torch.manual_seed(0)  # hookscope's seed=0 draws what captum draws from the global generator after this
        if method == "feature_ablation":
            maps = ca.FeatureAblation(model).attribute(x, target=target, feature_mask=full, perturbations_per_eval=16)
        elif method == "shapley_value_sampling":
            maps = ca.ShapleyValueSampling(model).attribute(x, target=target, feature_mask=full,
                                                            n_samples=max(1, samples // 100), perturbations_per_eval=16)
        elif method == "kernel_shap":
            maps = ca.KernelShap(model).attribute(x, target=target, feature_mask=full, n_samples=samples,
                                                  perturbations_per_eval=16)
        else:
            maps = ca.Lime(model, interpretable_model=SkLearnRidge(alpha=0.01)).attribute(
                x, target=target, feature_mask=full, n_samples=samples, perturbations_per_eval=16)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mb": (after - before) / 1024, "sum": float(maps.sum())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("LIB", "METHOD", "SAMPLES"))
    ap.add_argument("--samples", type=int, default=200, help="coalitions of LIME and KernelSHAP; Shapley's orders "
                                                            "are samples // 100")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="feature_ablation,shapley_value_sampling,kernel_shap,lime")
    args = ap.parse_args()
    if args.worker:
        lib, method, samples = args.worker
        print(json.dumps(worker(lib, method, int(samples), args.threads)))
        return
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(args.threads)}
    load = os.getloadavg()
    methods = args.methods.split(",")
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.repeats):
        for method in methods:
            for lib in (("hookscope", "captum") if r % 2 == 0 else ("captum", "hookscope")):
                out = subprocess.run([sys.executable, __file__, "--worker", lib, method, str(args.samples),
                                      "--threads", str(args.threads)], env=env, capture_output=True, text=True,
                                     check=True)
                one = json.loads(out.stdout.strip().splitlines()[-1])
                got.setdefault((lib, method), []).append(one)
                print(f"  {method:24s} {lib:9s} {one['seconds']:8.2f} s  peak +{one['peak_mb']:7.1f} MB", flush=True)
    import torch

    lines = [f"## Perturbation attribution against captum ({datetime.now(timezone.utc):%Y-%m-%d})", "",
             f"`{' '.join(['python', 'bench/bench_perturbation.py', *sys.argv[1:]])}`: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__}, {args.threads} thread(s), load average "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start; resnet50 (weights=None), one 224 x 224 "
             f"image, ~50 superpixels, 16 copies per pass, hookscope under memory={BUDGET!r}; median of "
             f"{args.repeats}, each in a fresh process, interleaved.", "",
             "| method | samples | hookscope s | captum s | ratio (captum / hookscope) | hookscope peak +MB | captum peak +MB | same sum |",
             "|---|---|---|---|---|---|---|---|"]
    for method in methods:
        ours, theirs = got[("hookscope", method)], got[("captum", method)]
        a = statistics.median(o["seconds"] for o in ours)
        b = statistics.median(o["seconds"] for o in theirs)
        n = "-" if method == "feature_ablation" else (args.samples // 100 or 1) if method == "shapley_value_sampling" \
            else args.samples
        same = abs(ours[0]["sum"] - theirs[0]["sum"]) <= 1e-3 * max(1.0, abs(theirs[0]["sum"]))
        lines.append(f"| {method} | {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x | "
                     f"{max(o['peak_mb'] for o in ours):.0f} | {max(o['peak_mb'] for o in theirs):.0f} | "
                     f"{'yes' if same else 'no (sampled differently)'} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
