"""Every operation captured: hookscope against torchlens, and module-only capture unchanged.

Run:  .venv/bin/python bench/bench_ops.py            (about 6 minutes on 2 cores)
      .venv/bin/python bench/bench_ops.py --quick    (fewer rounds)
Peer (bench only):  .venv/bin/pip install -c constraints.txt torchlens

Models: torchvision resnet50 (``weights=None``, ``eval()``, seed 0), batch 8 x 3 x 224 x 224; GPT-2
small (transformers ``GPT2Config()``: 12 layers, 768 wide, 12 heads, SDPA attention, random weights),
batch 1 x 128 tokens. CPU, ``torch.no_grad()``.

Rows, each timed interleaved with the plain forward round after round (the order alternates), the
ratio the median over rounds of its time over the plain forward's in the same round:
- ``hookscope every op``: ``capture(model, "*::*", copy="never")``, every operation of every module
  kept by reference (one record per call), the block opened and closed each time;
- ``hookscope modules``: ``capture(model, copy="never")``, every module output by reference;
- ``torchlens full log``: ``torchlens.trace(model, x, save_mode="reference")``: every operation, its
  output kept by reference, with torchlens's graph metadata.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any, Callable

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _rounds import ratios  # noqa: E402

import hookscope  # noqa: E402


def _models() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    import torchvision
    import transformers

    torch.manual_seed(0)
    resnet = torchvision.models.resnet50(weights=None).eval()
    gpt2 = transformers.GPT2Model(transformers.GPT2Config()).eval()
    return {"resnet50 b8": (resnet, torch.randn(8, 3, 224, 224)),
            "gpt2-small 1x128": (gpt2, torch.randint(0, 50257, (1, 128)))}


def _runs(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    def plain() -> Any:
        return model(x)

    def every_op() -> Any:
        with hookscope.capture(model, "*::*", copy="never") as rec:
            model(x)
        return len(rec.calls)

    def modules() -> Any:
        with hookscope.capture(model, copy="never") as rec:
            model(x)
        return len(rec.calls)

    runs = {"plain forward": plain, "hookscope every op": every_op, "hookscope modules": modules}
    try:
        import torchlens

        runs["torchlens full log"] = lambda: torchlens.trace(model, x, save_mode="reference")
    except ImportError:
        print("torchlens is not installed: its row is left out")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    print(f"{platform.node()} torch {torch.__version__} threads {torch.get_num_threads()} rounds {rounds}")
    with torch.no_grad():
        for name, (model, x) in _models().items():
            runs = _runs(model, x)
            with hookscope.capture(model, "*::*", copy="never") as rec:
                model(x)
            print(f"\n{name}: {len(rec.calls)} operation calls in one pass")
            secs, ratio = ratios(runs, rounds, base="plain forward")
            for k in runs:
                print(f"  {k:22s} {secs[k] * 1000:9.1f} ms   {ratio[k]:6.2f}x plain")


if __name__ == "__main__":
    main()
