"""LRP, guided backprop and DeconvNet: hookscope against zennit 0.5.1, side by side in one run.

Run:  .venv/bin/python bench/bench_lrp.py            (resnet18 / resnet50 batch 8 and vgg16 batch 2, 224x224)
      .venv/bin/python bench/bench_lrp.py --quick    (batch 2 / 1 at 64x64, fewer rounds: a minute or two)
      options: --rounds N, --threads N, --models resnet18,vgg16, --device cuda
Peer (test/bench only):  .venv/bin/pip install zennit

Models: torchvision resnet18 / resnet50 / vgg16, ``weights=None``, ``eval()``, seed 0, inputs ``rand``,
float32; target class 3 for every sample (given to both tools).

- ``fwd+bwd``: one plain forward and ``torch.autograd.grad`` of the summed target scores to the inputs,
  the floor of any gradient method.
- ``hookscope lrp``: ``hookscope.attribute(model, x, method="lrp", composite="epsilon_plus_flat", target=3)``
  (batch norms merged into the layer before them, residual sums split by the norm rule).
- ``zennit lrp``: zennit's ``Gradient`` attributor with ``EpsilonPlusFlat`` and ``SequentialMergeBatchNorm``
  (``ResNetCanonizer``, which contains it, for the ResNets), the relevance at the output the target's
  score (``one_hot * output``), as hookscope has it; the composite registered and removed in every call.
- ``hookscope guided`` / ``hookscope deconvnet``: ``method="guided_backprop"`` / ``"deconvnet"``.

Every method runs once per round, the order alternating round by round, so that both tools see the
same load; each time is a median over the rounds, and ``x fwd+bwd`` is the median over rounds of the
method's time divided by the floor's time in the same round. ``max rel diff`` is how far hookscope's
relevances are from zennit's (relative to zennit's largest), float32: on the ResNets about 1e-3,
which is zennit's merged batch norms computing ``x / sqrt(1 + eps)`` (``eps=1e-5``) where the model's
value is ``x``; with ``eps=0`` in float64 the two agree exactly (resnet18, 2x3x224x224: 0.0).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import datetime
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import cpu_model, ratios  # noqa: E402

import hookscope  # noqa: E402

TARGET = 3
SIZES = {False: {"resnet18": (8, 224), "resnet50": (8, 224), "vgg16": (2, 224)},
         True: {"resnet18": (2, 64), "resnet50": (2, 64), "vgg16": (1, 64)}}


def _model(name: str, device: str) -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval().to(device)


def _zennit(model: nn.Module, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    from zennit.attribution import Gradient
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer

    def run(x: torch.Tensor) -> torch.Tensor:
        canonizer = ResNetCanonizer() if name.startswith("resnet") else SequentialMergeBatchNorm()
        with Gradient(model, EpsilonPlusFlat(canonizers=[canonizer])) as attributor:
            _, r = attributor(x, lambda out: F.one_hot(torch.full((x.shape[0],), TARGET, device=x.device),
                                                       out.shape[1]) * out)
        return r

    return run


def _floor(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        leaf = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(model(leaf)[:, TARGET].sum(), leaf)
        return g

    return run


def _ours(model: nn.Module, method: str) -> Callable[[torch.Tensor], torch.Tensor]:
    extra: dict[str, Any] = {"composite": "epsilon_plus_flat"} if method == "lrp" else {}
    return lambda x: hookscope.attribute(model, x, method=method, target=TARGET, **extra).maps


def _sync(device: str, f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        f(x)
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def bench(name: str, batch: int, size: int, rounds: int, device: str) -> list[str]:
    model = _model(name, device)
    x = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    fns = {"fwd+bwd": _floor(model), "hookscope lrp": _ours(model, "lrp"), "zennit lrp": _zennit(model, name),
           "hookscope guided": _ours(model, "guided_backprop"), "hookscope deconvnet": _ours(model, "deconvnet")}
    ours, theirs = fns["hookscope lrp"](x), fns["zennit lrp"](x)
    diff = float((ours - theirs).abs().max() / theirs.abs().max())
    med, ratio = ratios({k: _sync(device, f, x) for k, f in fns.items()}, rounds, base="fwd+bwd")
    shape = f"{batch}x3x{size}x{size}"
    rows = [f"| {name} | {shape} | {k} | {med[k]:.3f} | {ratio[k]:.2f} | "
            + (f"{diff:.1e} |" if k == "hookscope lrp" else " |") for k in fns]
    rows.append(f"| {name} | {shape} | **hookscope / zennit** | | "
                f"**{ratio['hookscope lrp'] / ratio['zennit lrp']:.2f}** | |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small inputs and 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5, --quick 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--models", default="resnet18,resnet50,vgg16")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    rounds = args.rounds or (3 if args.quick else 5)
    load = os.getloadavg()
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"Machine: {cpu_model()} ({os.cpu_count()} cores{gpu}), {platform.system()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"torch {torch.__version__}, zennit {importlib.metadata.version('zennit')}, "
          f"{torch.get_num_threads()} threads, {rounds} interleaved rounds (median), device {args.device}")
    print(f"Load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| model | input | method | median s | x fwd+bwd | max rel diff vs zennit |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        batch, size = SIZES[args.quick][name]
        for row in bench(name, batch, size, rounds, args.device):
            print(row, flush=True)
    end = os.getloadavg()
    print(f"\nLoad average at end: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")


if __name__ == "__main__":
    main()
