"""ROAD against pytorch-grad-cam's, side by side in one run: the time of the whole metric and the difference.

Run:  .venv/bin/python bench/bench_checks.py     (a minute or two on 2 shared CPU cores)

Cases: the trained demo model (``hookscope.zoo.demo_model()``) on 4 drawn shapes at 64 x 64 with
their Grad-CAM maps of ``layer3``, and torchvision's resnet18 (``weights=None``, eval) on one random
224 x 224 image with a tie-free random map. Both run ``ROADCombined`` at the percentiles 10, ..., 90
(18 imputations per image), softmax target of the true (demo) or class 0 (resnet18) class, the
same noise (``torch.manual_seed(0)`` before pytorch-grad-cam's, ``seed=0`` for hookscope's). The
two are interleaved, ``ROUNDS`` times each; the median seconds and the ratio are printed as a
markdown block for ``bench/RESULTS.md``, with the machine, the date and the load.

pytorch-grad-cam removes every pixel tied at a cut, and a ReLU'd Grad-CAM map is mostly zeros: at
low percentiles it removes every pixel and solves a singular system (scipy returns numbers all the
same), where hookscope cuts ties in row-major order. The last column counts its scores that came
back NaN.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import numpy as np
import torch
import torchvision
from pytorch_grad_cam.metrics.road import ROADCombined
from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

import hookscope
from hookscope import metrics
from hookscope.synthetic import shapes
from hookscope.zoo import demo_model

ROUNDS = 3


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def case(name: str, net: torch.nn.Module, x: torch.Tensor, maps: torch.Tensor, labels: torch.Tensor) -> list[str]:
    targets = [ClassifierOutputSoftmaxTarget(int(c)) for c in labels]

    def theirs() -> np.ndarray:
        torch.manual_seed(0)
        return ROADCombined()(x, maps.numpy(), targets, net)

    def ours() -> torch.Tensor:
        return metrics.road(net, x, maps, target=labels, seed=0).combined

    times: dict[str, list[float]] = {"hookscope": [], "pytorch-grad-cam": []}
    found: dict[str, object] = {}
    for _ in range(ROUNDS):
        for label, fn in (("hookscope", ours), ("pytorch-grad-cam", theirs)):
            seconds, found[label] = _timed(fn)
            times[label].append(seconds)
    a, b = statistics.median(times["hookscope"]), statistics.median(times["pytorch-grad-cam"])
    mine, other = np.asarray(found["hookscope"]), np.asarray(found["pytorch-grad-cam"])
    finite = np.isfinite(other)
    diff = float(np.abs(mine[finite] - other[finite]).max()) if finite.any() else float("nan")
    return [f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {diff:.1e} | {int((~finite).sum())} of {len(other)} |"]


def main() -> None:
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    net, data = demo_model(), shapes(4, seed=123)
    gradcam = hookscope.cam(net, data.images, layers="layer3", target=data.labels).maps
    rows = case("demo model, 4 x 64 x 64, Grad-CAM maps", net, data.images, gradcam, data.labels)
    resnet = torchvision.models.resnet18(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    image = torch.rand(1, 3, 224, 224, generator=g)
    tie_free = (torch.randperm(224 * 224, generator=g).view(1, 224, 224).float() / (224 * 224))
    rows += case("resnet18, 1 x 224 x 224, random map", resnet, image, tie_free, torch.tensor([0]))
    print(f"## ROAD against pytorch-grad-cam (`bench/bench_checks.py`)\n\n"
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one torch thread, torch "
          f"{torch.__version__}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load average {load:.2f} at the start. "
          f"Command: `nice -n 10 .venv/bin/python bench/bench_checks.py`. ROADCombined at 10, ..., 90, the same "
          f"noise, median of {ROUNDS} interleaved rounds.\n")
    print("| case | hookscope s | pytorch-grad-cam s | ratio | largest difference (finite scores) | NaN scores of "
          "pytorch-grad-cam |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
