"""Which explanation is right: every CAM method and every attribution method side by side on the demo data,
whose ground truth (the shape's mask) is known.

Run:  .venv/bin/python bench/bench_explanations.py           (100 images; 26 minutes measured on 2 cores
                                                             under a load of 6, most of it Score-CAM and the curves)
      .venv/bin/python bench/bench_explanations.py --quick   (40 images, 8 steps and samples, 10 curve steps)

Data: ``hookscope.synthetic.shapes(N, seed=2026)`` (a seed used neither in training nor in the tests), the
shipped ``hookscope.zoo.demo_model()``, eval, CPU. Target: the true class of each image.

- CAM: every method of ``hookscope.analysis.cam.METHODS`` on ``layer3`` (16 x 16 maps, upsampled to 64 x 64).
- Attribution: every method of ``hookscope.analysis.attribution.METHODS`` on the inputs (``3 x 64 x 64``),
  integrated gradients with ``--steps`` Gauss-Legendre points from a black image, the SmoothGrad family
  with ``--samples`` noisy copies (noise 0.1 of each image's range, seed 0); Guided Grad-CAM at ``layer3``.
  VarGrad is ``smoothgrad_sq - smoothgrad ** 2`` of those two runs (same seed, so the very same noisy
  copies: :func:`hookscope.attribute` with ``method="vargrad"`` returns the same numbers, one run more).
  Attribution maps are scored as ``hookscope.metrics`` reduces them by default: the sum of absolute values
  over the three colour channels (``reduce="abs_sum"``).

Scores, against the ground-truth masks:

- pointing game: the map's peak on the shape (tolerance 0) and within 4 px (the paper's 15 px at 224 x 224
  scaled to 64 x 64);
- energy inside the mask: the share of the (reduced, non-negative) map's mass on the shape, which covers
  about 13% of an image;
- deletion AUC (lower is better) and insertion AUC (higher is better): softmax probability of the true
  class, ``--curve-steps`` steps, the substrate being the image's own background without the shape
  (``ShapeSet.backgrounds``), as ``bench/bench_demo.py`` explains.

Two reference rows bound the table: a random map (chance) and the ground-truth mask used as the map.
Seconds: wall time of one call for all the images (no warm-up beyond the first CAM method).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

import hookscope
from hookscope.analysis.attribution import METHODS as ATTRIBUTIONS
from hookscope.analysis.cam import METHODS as CAMS
from hookscope.core import hook_count
from hookscope.metrics import deletion, energy_pointing_game, insertion, pointing_game
from hookscope.synthetic import ShapeSet, shapes
from hookscope.zoo import DemoNet, demo_model
from _rounds import cpu_model  # bench/_rounds.py: this folder is on sys.path when run as a script

SEED = 2026
SKIP = {"vargrad"}  # derived from smoothgrad and smoothgrad_sq below
ASKS = {"lrp": {"composite": "epsilon_plus_flat"}}  # methods that take settings of their own, once they exist


def timed(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    maps = fn()
    return maps, time.perf_counter() - t0


def cam_maps(model: DemoNet, data: ShapeSet) -> dict[str, tuple[torch.Tensor, float | None]]:
    found: dict[str, tuple[torch.Tensor, float | None]] = {}
    hookscope.cam(model, data.images[:2], layers="layer3")  # warm-up
    for m in CAMS:
        found[f"cam: {m}"] = timed(lambda: hookscope.cam(model, data.images, layers="layer3", method=m,
                                                         target=data.labels, progress=False).maps)
    return found


def attribution_maps(model: DemoNet, data: ShapeSet, steps: int, samples: int) -> dict[str, tuple[torch.Tensor, float | None]]:
    found: dict[str, tuple[torch.Tensor, float | None]] = {}
    settings = {"integrated_gradients": {"steps": steps, "rule": "gausslegendre"},
                "smoothgrad": {"samples": samples}, "smoothgrad_sq": {"samples": samples},
                "guided_gradcam": {"layers": "layer3"}, **ASKS}
    for m in ATTRIBUTIONS:
        if m in SKIP:
            continue
        extra = settings.get(m, {})
        try:
            found[m] = timed(lambda: hookscope.attribute(model, data.images, method=m, target=data.labels,
                                                         **extra).maps)  # type: ignore[arg-type]
        except (TypeError, hookscope.HookscopeError) as e:  # a method that needs settings this bench lacks
            print(f"# {m}: skipped ({e})")
    if "smoothgrad" in found and "smoothgrad_sq" in found:
        mean, square = found["smoothgrad"][0], found["smoothgrad_sq"][0]
        found["vargrad"] = (square - mean * mean, None)
    return found


def score(model: DemoNet, data: ShapeSet, maps: torch.Tensor, steps: int) -> dict[str, float]:
    x, y, masks, under = data.images, data.labels, data.masks, data.backgrounds
    curve = {"target": y, "steps": steps, "batch_size": 256, "baseline": under}
    return {
        "on shape": pointing_game(maps, masks, tolerance=0).float().mean().item(),
        "within 4 px": pointing_game(maps, masks, tolerance=4).float().mean().item(),
        "energy": energy_pointing_game(maps, masks).mean().item(),
        "deletion": deletion(model, x, maps, **curve).auc.mean().item(),  # type: ignore[arg-type]
        "insertion": insertion(model, x, maps, **curve).auc.mean().item(),  # type: ignore[arg-type]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="every CAM and attribution method on the demo data with ground truth")
    ap.add_argument("--quick", action="store_true", help="40 images, 8 steps and samples, 10 curve steps")
    ap.add_argument("--images", type=int, default=100, help="fresh images (default 100)")
    ap.add_argument("--steps", type=int, default=20, help="integrated gradients' Gauss-Legendre points (default 20)")
    ap.add_argument("--samples", type=int, default=20, help="SmoothGrad's noisy copies (default 20)")
    ap.add_argument("--curve-steps", type=int, default=20, help="deletion / insertion steps (default 20)")
    a = ap.parse_args()
    n, steps, samples, curve = (40, 8, 8, 10) if a.quick else (a.images, a.steps, a.samples, a.curve_steps)
    t0 = time.perf_counter()
    model, data = demo_model(), shapes(n, seed=SEED)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {n} images (seed {SEED}), integrated gradients {steps} steps, SmoothGrad {samples} samples, "
          f"curves {curve} steps\n")
    found = {**cam_maps(model, data), **attribution_maps(model, data, steps, samples)}
    g = torch.Generator().manual_seed(SEED)
    found["random map (chance)"] = (torch.rand(data.masks.shape, generator=g), None)
    found["ground-truth mask as the map"] = (data.masks.float(), None)
    print("| method | pointing game, peak on the shape | within 4 px | energy inside the mask "
          "| deletion AUC (lower is better) | insertion AUC (higher is better) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for method, (maps, seconds) in found.items():
        s = score(model, data, maps, curve)
        took = "-" if seconds is None else f"{seconds:.2f}"
        print(f"| {method} | {s['on shape']:.1%} | {s['within 4 px']:.1%} | {s['energy']:.1%} "
              f"| {s['deletion']:.3f} | {s['insertion']:.3f} | {took} |", flush=True)
    assert hook_count(model) == 0
    print(f"\n(whole run: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
