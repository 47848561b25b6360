"""The shipped demo model on fresh synthetic images: its accuracy, and how faithful each CAM method is.

Run:  .venv/bin/python bench/bench_demo.py            (about 7 minutes on 2 shared CPU cores)
      .venv/bin/python bench/bench_demo.py --quick    (50 images, 10 steps: 2 to 4 minutes, most of it Score-CAM)

Data: ``hookscope.synthetic.shapes(200, seed=2026)``, a seed used neither in training (1000 + epoch,
held-out 7) nor in the tests (4242 and up). Model: ``hookscope.zoo.demo_model()``, eval, CPU.

Each method of ``hookscope.analysis.cam.METHODS`` runs on all the images at once on ``layer3``
(16 x 16 maps, upsampled to 64 x 64), target = the true class. The maps are scored against the
ground-truth masks of the shapes:

- pointing game (Zhang et al. 2018): the map's peak on the shape itself (tolerance 0), and within
  4 px (the paper's 15 px at 224 x 224, scaled to 64 x 64; one cell of layer3's 16 x 16 grid);
- energy inside the mask (Score-CAM's energy-based pointing game): the share of the map's mass on the
  shape, which covers about 13% of an image;
- deletion AUC (the most salient pixels first; lower is better) and insertion AUC (higher is
  better), softmax probability of the true class, ``--steps`` steps. The substrate is the image's
  own background without the shape (``ShapeSet.backgrounds``): deleting a pixel shows what the
  shape hid, so deleting the whole shape truly removes it and inserting it truly draws it. The last
  column is RISE's default substrate for deletion, zeros, for comparison: a shape painted black keeps
  its outline, and the demo model reads outlines, so there the ground-truth mask scores worst.

Two reference rows bound the table: a random map (what chance scores) and the ground-truth mask
itself used as the map (pixels inside the shape first, ties in row-major order).
Seconds: median wall time of the ``cam`` call for all the images (3 rounds; Score-CAM: 1).
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time
from typing import Any

import torch

import hookscope
from hookscope.analysis.cam import METHODS, cam
from hookscope.core import hook_count
from hookscope.metrics import deletion, energy_pointing_game, insertion, pointing_game
from hookscope.synthetic import ShapeSet, shapes
from hookscope.zoo import DemoNet, demo_model

SEED = 2026


def maps_of(model: DemoNet, data: ShapeSet) -> dict[str, tuple[torch.Tensor, float | None]]:
    """Per method, the B x H x W maps and the median seconds of one ``cam`` call; then the references."""
    found: dict[str, tuple[torch.Tensor, float | None]] = {}
    for method in METHODS:
        run = functools.partial(cam, model, data.images, layers="layer3", method=method, target=data.labels,
                                progress=False)
        slow = method == "scorecam"  # minutes, not milliseconds: timed once, no warm-up
        if not slow:
            run()
        times = []
        for _ in range(1 if slow else 3):
            t0 = time.perf_counter()
            maps = run().maps
            times.append(time.perf_counter() - t0)
        found[method] = (maps, statistics.median(times))
    g = torch.Generator().manual_seed(SEED)
    found["random map (chance)"] = (torch.rand(data.masks.shape, generator=g), None)
    found["ground-truth mask as the map"] = (data.masks.float(), None)
    return found


def score(model: DemoNet, data: ShapeSet, maps: torch.Tensor, steps: int) -> dict[str, float]:
    x, y, masks, under = data.images, data.labels, data.masks, data.backgrounds
    curve: dict[str, Any] = {"target": y, "steps": steps, "batch_size": 256}
    return {
        "on shape": pointing_game(maps, masks, tolerance=0).float().mean().item(),
        "within 4 px": pointing_game(maps, masks, tolerance=4).float().mean().item(),
        "energy": energy_pointing_game(maps, masks).mean().item(),
        "deletion": deletion(model, x, maps, baseline=under, **curve).auc.mean().item(),
        "insertion": insertion(model, x, maps, baseline=under, **curve).auc.mean().item(),
        "deletion, zeros": deletion(model, x, maps, baseline="zeros", **curve).auc.mean().item(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="the demo model's accuracy and its CAM methods' faithfulness")
    ap.add_argument("--quick", action="store_true", help="50 images and 10 steps")
    ap.add_argument("--images", type=int, default=200, help="how many fresh images (default 200)")
    ap.add_argument("--steps", type=int, default=20, help="deletion / insertion steps (default 20)")
    a = ap.parse_args()
    n, steps = (50, 10) if a.quick else (a.images, a.steps)
    t0 = time.perf_counter()
    model, data = demo_model(), shapes(n, seed=SEED)
    with torch.no_grad():
        accuracy = (model(data.images).argmax(1) == data.labels).float().mean().item()
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, hookscope {hookscope.__version__}")
    print(f"\n## Demo model on {n} fresh images (seed {SEED}): accuracy {accuracy:.1%}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"\nCAM on layer3 (16 x 16), target = true class; deletion / insertion: {steps} steps, "
          "softmax probability of the true class, substrate = the image without its shape.\n")
    print("| method | pointing game, peak on the shape | pointing game, within 4 px | energy inside the mask "
          "| deletion AUC (lower is better) | insertion AUC (higher is better) | seconds "
          "| deletion AUC, to zeros (RISE's default) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, (maps, seconds) in maps_of(model, data).items():
        s = score(model, data, maps, steps)
        took = "-" if seconds is None else f"{seconds:.2f}"
        print(f"| {method} | {s['on shape']:.1%} | {s['within 4 px']:.1%} | {s['energy']:.1%} "
              f"| {s['deletion']:.3f} | {s['insertion']:.3f} | {took} | {s['deletion, zeros']:.3f} |", flush=True)
    assert hook_count(model) == 0
    print(f"\n(whole run: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
