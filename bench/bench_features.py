"""Time to draw the feature maps of a 512-channel layer to a PNG, with and without collecting them.

Run:  .venv/bin/python bench/bench_features.py            (about a minute on 2 CPU cores)
      .venv/bin/python bench/bench_features.py --quick    (fewer rounds)
      .venv/bin/python bench/bench_features.py --threads 1 (torch on one thread: steadier on a busy machine)

torchvision models, weights=None, eval(), input 1x3x224x224, CPU: resnet18's ``layer4``
(1 x 512 x 7 x 7) and resnet50's ``layer2`` (1 x 512 x 28 x 28). Per layer, interleaved rounds
(the order alternates), each figure the median:

- render: ``plot_feature_maps`` of every channel (512 tiles, one colour scale, colour bar, the
  input beside the grid) and ``save_feature_maps`` to a PNG; the maps already collected.
- collect + render: ``feature_maps`` (one forward pass with the layer captured) first.
- the plain forward pass under ``torch.no_grad()``, for scale.
- story 6: ``compare_references`` + ``plot_reference_comparison`` to PNG (both sides, 512 tiles each).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from typing import Any, Callable

import torch
import torchvision
from torch import nn

from hookscope.analysis.features import FeatureMaps, compare_references, feature_maps
from hookscope.viz.features import plot_feature_maps, plot_reference_comparison, save_feature_maps
from _rounds import medians  # bench/_rounds.py: this folder is on sys.path when run as a script


def runners(model: nn.Module, x: torch.Tensor, layer: str, folder: str) -> dict[str, Callable[[], Any]]:
    picture = (x[0] - x[0].min()) / (x[0].max() - x[0].min())
    res = feature_maps(model, x, layers=layer)
    png = os.path.join(folder, f"{layer}.png")

    def render(r: FeatureMaps) -> Any:
        return save_feature_maps(plot_feature_maps(r, picture=picture), png)

    def plain() -> Any:
        with torch.no_grad():
            return model(x)

    def compare() -> Any:
        comp = compare_references(model, x, layers=layer)
        return save_feature_maps(plot_reference_comparison(comp, picture=picture), png)

    return {
        "plain forward": plain,
        "render (maps collected)": lambda: render(res),
        "collect + render": lambda: render(feature_maps(model, x, layers=layer)),
        "compare_references + render": compare,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    a = ap.parse_args()
    if a.threads is not None:  # on a shared machine, 1 thread keeps torch from spinning against others
        torch.set_num_threads(a.threads)
    rounds = 3 if a.quick else 9
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}, torchvision {torchvision.__version__}, {rounds} rounds")
    print("\n| model, layer (maps) | plain forward | render (maps collected) | collect + render | "
          "compare_references + render |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, layer in (("resnet18", "layer4"), ("resnet50", "layer2")):
            model = getattr(torchvision.models, name)(weights=None).eval()
            runs = runners(model, x, layer, folder)
            shape = "x".join(map(str, feature_maps(model, x, layers=layer).maps.shape))
            med = medians(runs, rounds)
            cells = " | ".join(f"{med[k] * 1e3:.0f} ms" for k in runs)
            print(f"| {name} {layer} ({shape}) | {cells} |")


if __name__ == "__main__":
    main()
