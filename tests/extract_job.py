"""A deterministic extract run in its own process, for the tests that kill it (SIGKILL) or start it under
torchrun: ``python tests/extract_job.py OUT [--resume] [--delay S] [--ddp] [--stream]``.

The model and the data are built from fixed seeds, so every process (every rank, every rerun) sees the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from torch import nn


class Samples(torch.utils.data.Dataset[torch.Tensor]):
    """``n`` images made from their index; ``delay`` seconds per sample (a slow disk, for kill windows)."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(3, 16, 16, generator=g)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(16, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
    ).eval()


LAYERS: dict[str, Any] = {"2": "mean", "3": None, "5": "max"}
SIZE = 57  # samples: 5 shards of 12 and a last one of 9 with the shard size below
SHARD = 12 * (8 * 4 + 16 * 8 * 8 * 4 + 16 * 4 + 8)  # bytes of 12 samples' rows (and their index)


def main(argv: list[str]) -> int:
    import hookscope

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--stream", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = build()
    if args.ddp:
        torch.distributed.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    data: Any = Samples(SIZE, args.delay)
    if args.stream:
        loader = torch.utils.data.DataLoader(data, batch_size=5)
        data = (b for b in loader)
    hookscope.extract(model, data, layers=LAYERS, out=args.out, batch_size=5, shard_size=SHARD, resume=args.resume,
                      progress=False)
    if args.ddp:
        torch.distributed.destroy_process_group()
    print("done", os.environ.get("RANK", "0"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
