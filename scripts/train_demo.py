"""Train hookscope's demo model (``hookscope.zoo.DemoNet``) and write its shipped weights.

Run:  .venv/bin/python scripts/train_demo.py                (reproduces src/hookscope/weights/demo_net.pt)
      .venv/bin/python scripts/train_demo.py --epochs 2 --out /tmp/demo.pt

Every epoch trains on images never seen before, drawn by ``hookscope.synthetic.shapes`` with the seed
``TRAIN_SEED + epoch``; the accuracy is then measured on a split drawn with ``EVAL_SEED``, used
for nothing else. (The test suite and ``bench/bench_demo.py`` draw their own images with seeds of
their own.) CPU only, fixed seeds, deterministic algorithms and a fixed number of threads, so that
the same torch on the same kind of CPU writes the same bytes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hookscope.synthetic import shapes
from hookscope.zoo import DemoNet

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "hookscope" / "weights" / "demo_net.pt"
TRAIN_SEED, EVAL_SEED, INIT_SEED = 1_000, 7, 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: python scripts/train_demo.py --epochs 2 --out /tmp/demo.pt")
    ap.add_argument("--epochs", type=int, default=4, help="epochs, each on fresh images (default 4)")
    ap.add_argument("--per-epoch", type=int, default=8_000, help="training images per epoch (default 8000)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--lr", type=float, default=4e-3, help="peak learning rate of the one-cycle schedule")
    ap.add_argument("--eval", type=int, default=2_000, help="images in the held-out split (default 2000)")
    ap.add_argument("--threads", type=int, default=2,
                    help="CPU threads; the result's bytes can depend on it (default 2)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the state_dict (default {OUT})")
    return ap.parse_args(argv)


def accuracy(model: DemoNet, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([model(x).argmax(1) for x in images.split(500)])
    return (predicted == labels).float().mean().item()


def train(args: argparse.Namespace) -> DemoNet:
    model = DemoNet(seed=INIT_SEED)
    fit(model, args)
    return model


def fit(model: torch.nn.Module, args: argparse.Namespace, *, seed: int = TRAIN_SEED,
        log: bool = True) -> torch.nn.Module:
    """Train ``model`` as the shipped weights were trained (``train`` is this on a fresh DemoNet);
    ``bench/bench_prune.py`` fine-tunes pruned models with it (a masked layer keeps its zeros: its
    pre-hook recomputes ``weight = weight_orig * weight_mask`` before every call)."""
    steps = args.epochs * (args.per_epoch // args.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    held_out = shapes(args.eval, seed=EVAL_SEED)
    order = torch.Generator().manual_seed(seed)
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        data = shapes(args.per_epoch, seed=seed + epoch)
        perm = torch.randperm(args.per_epoch, generator=order)
        model.train()
        total = 0.0
        for i in range(args.per_epoch // args.batch):
            idx = perm[i * args.batch:(i + 1) * args.batch]
            loss = F.cross_entropy(model(data.images[idx]), data.labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            total += loss.item()
        if not log:
            continue
        acc = accuracy(model, held_out.images, held_out.labels)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {total / (args.per_epoch // args.batch):.4f}, "
              f"held-out accuracy {acc:.2%} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return model.eval()


def save(model: DemoNet, out: Path) -> int:
    """Write the state_dict atomically (temp file, then rename): a crash leaves no half file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a package file must be readable by all
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return out.stat().st_size


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    model = train(args)
    seconds = time.perf_counter() - t0
    size = save(model, args.out)
    params = sum(p.numel() for p in model.parameters())
    final = shapes(args.eval, seed=EVAL_SEED)
    print(f"trained in {seconds:.0f} s on {args.threads} threads; {params:,} parameters; "
          f"held-out accuracy (seed {EVAL_SEED}, {args.eval} images) "
          f"{accuracy(model, final.images, final.labels):.2%}; wrote {args.out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
