"""The surfaces a change touched, before and after in one run: this tree against another source tree.

Run:  git worktree add /tmp/before REV
      .venv/bin/python bench/bench_surfaces.py --against /tmp/before            (about 3 minutes on 2 cores)
      .venv/bin/python bench/bench_surfaces.py --against /tmp/before --quick    (fewer rounds)

The other tree is imported as a second package, ``hookscope_before``, so both run in one process on
the same models and inputs, interleaved round by round with the plain forward (``_rounds.ratios``).
Rows (ratio: the median over rounds of each row's time over the plain forward's in the same round):
- resnet50 (``weights=None``, eval), batch 8 x 3 x 224 x 224, ``no_grad``: every Conv2d captured with
  the safe default; every operation captured by reference (``"*::*"``, ``copy="never"``);
- GPT-2 small (``GPT2Config()``, SDPA, random weights), 1 x 128 tokens, ``no_grad``: every operation
  captured by reference; an identity edit of every block's residual add (``"h.*::add"``);
  ``attention()`` of every layer;
- resnet18 (``weights=None``), batch 1, forward and backward: ``attribute(method="saliency")``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _rounds import cpu_model, ratios  # noqa: E402
from bench_capture import load_before  # noqa: E402  (the other tree as the package hookscope_before)

import hookscope  # noqa: E402


def _capture(lib: ModuleType, model: nn.Module, x: torch.Tensor, *sel: Any, **kw: Any) -> Callable[[], Any]:
    def run() -> Any:
        with lib.capture(model, *sel, **kw) as rec:
            model(x)
        return rec
    return run


def _edit(lib: ModuleType, model: nn.Module, x: torch.Tensor, sel: str) -> Callable[[], Any]:
    def run() -> Any:
        with lib.edit(model, sel, output=lambda t: t):
            return model(x)
    return run


def _resnet50(libs: dict[str, ModuleType]) -> tuple[str, dict[str, Callable[[], Any]]]:
    import torchvision

    torch.manual_seed(0)
    model, x = torchvision.models.resnet50(weights=None).eval(), torch.randn(8, 3, 224, 224)
    runs: dict[str, Callable[[], Any]] = {"plain forward": lambda: model(x)}
    for tag, lib in libs.items():
        runs[f"Conv2d capture, {tag}"] = _capture(lib, model, x, nn.Conv2d)
        runs[f"every op by reference, {tag}"] = _capture(lib, model, x, "*::*", copy="never")
    return "resnet50, batch 8, no_grad", runs


def _gpt2(libs: dict[str, ModuleType]) -> tuple[str, dict[str, Callable[[], Any]]]:
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(attn_implementation="sdpa")).eval()
    ids = torch.randint(0, 50257, (1, 128))
    runs: dict[str, Callable[[], Any]] = {"plain forward": lambda: model(ids)}
    for tag, lib in libs.items():
        runs[f"every op by reference, {tag}"] = _capture(lib, model, ids, "*::*", copy="never")
        runs[f"edit h.*::add, {tag}"] = _edit(lib, model, ids, "h.*::add")
        runs[f"attention(), {tag}"] = (lambda lib=lib: lib.attention(model, ids))
    return "GPT-2 small, 1 x 128 tokens, no_grad", runs


def _saliency(libs: dict[str, ModuleType]) -> tuple[str, dict[str, Callable[[], Any]]]:
    import torchvision

    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 224, 224)

    def plain() -> Any:
        xi = x.clone().requires_grad_(True)
        return torch.autograd.grad(model(xi).max(1).values.sum(), xi)

    runs: dict[str, Callable[[], Any]] = {"plain forward": plain}
    for tag, lib in libs.items():
        runs[f"attribute saliency, {tag}"] = (lambda lib=lib: lib.attribute(model, x, method="saliency"))
    return "resnet18, batch 1, forward + backward (the plain row is one autograd.grad to the input)", runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", metavar="DIR", required=True, help="the other source tree (a git worktree)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    libs = {"now": hookscope, "before": load_before(args.against)}
    print(f"{platform.node()} {cpu_model()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for make, rounds in ((_resnet50, 9), (_gpt2, 21), (_saliency, 21)):
        rounds = max(3, rounds // 3) if args.quick else rounds
        title, runs = make(libs)
        with torch.no_grad() if make is not _saliency else torch.enable_grad():
            secs, ratio = ratios(runs, rounds, base="plain forward")
        print(f"\n{title} ({rounds} rounds)")
        for k in runs:
            print(f"  {k:34s} {secs[k] * 1000:9.1f} ms   {ratio[k]:6.3f}x")


if __name__ == "__main__":
    main()
