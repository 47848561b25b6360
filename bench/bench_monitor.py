"""What the training monitor costs a training step, side by side in one run, and that its state stays flat.

Run:  .venv/bin/python bench/bench_monitor.py                  (about 8 minutes on 2 cores)
      .venv/bin/python bench/bench_monitor.py --quick          (a small model, to try the script)
      .venv/bin/python bench/bench_monitor.py --memory         (20,000 steps of a small model)

Speed: torchvision resnet18 (``weights=None``, train mode), batch 32 x 3 x 64 x 64, cross-entropy,
SGD with momentum; each configuration trains its own copy of the same weights. By default the
configurations take one step each in turn, the order alternating (``_rounds.timings``), for
``--steps`` x ``--rounds`` steps each after 5 untimed ones: each step is paired with the plain step
taken beside it, so the machine's slow phases (seconds long) cancel to a few tenths of a percent.
Two figures per configuration: the median over steps of its step's time over the paired plain
step's (with a 95% interval), and the amortised ratio, its total time over the plain loop's (what
``every=N`` costs, sampled steps included). ``--per-round`` times ``--steps`` steps a turn instead
(``_rounds.ratios``: the median over rounds of the ratio within a round), as earlier runs did.
- ``monitor every=100``: every statistic on one step in a hundred (the amortised cost);
- ``monitor every=100, nonfinite="off"``: the same with no sentinel (no step reads its gradients);
- ``monitor every step``: every statistic (inputs, outputs, output gradients, parameters, update
  ratios, dead fractions) on every step;
- ``monitor every step, stats=["output", "params", "update"]``: a cheaper choice, every step: the
  outputs (no inputs, no output gradients, no dead fractions) and the parameter side;
- ``sentinel only``: no step sampled, only the per-step non-finite check;
- ``the floor of a sentinel``: no monitor; the loop itself sums every gradient and reads whether the
  total is finite (the least any exact check over every gradient costs: one read of their memory);
- ``wandb.watch(log="all", log_freq=1)``: W&B's hooks on parameters and gradients, in offline mode,
  each step committed with ``run.log`` (skipped when wandb is not installed).

Memory: a 3-layer MLP trained for 20,000 steps with ``every=10`` and JSON lines written; the
process's resident memory and the bytes Python holds (``tracemalloc``) after 1,000, 10,000 and
20,000 steps.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import platform
import sys
import tempfile
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _rounds import cpu_model, median_interval, ratios, timings  # noqa: E402

import hookscope  # noqa: E402
from hookscope._native import describe  # noqa: E402


def _model(quick: bool) -> nn.Module:
    if quick:
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 10))
    import torchvision

    return torchvision.models.resnet18(weights=None, num_classes=10)


class Loop:
    """One configuration: its own copy of the model and optimizer, a step function, and the
    context (a monitor, W&B's run) kept open across rounds as a training run keeps it."""

    def __init__(self, base: nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
                 open_: Callable[[nn.Module, torch.optim.Optimizer], Any] | None) -> None:
        self.model = copy.deepcopy(base).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.x, self.y = batch
        self.stack = contextlib.ExitStack()
        self.mon = self.stack.enter_context(open_(self.model, self.opt)) if open_ is not None else None
        self.wandb_run: Any = None
        self.by_hand = False  # one sum over every gradient after backward: the least an exact check reads
        self.cpu: list[float] = []  # the process's CPU seconds of each call (the machine is shared)

    def steps(self, n: int) -> None:
        start = time.process_time()
        self._steps(n)
        self.cpu.append(time.process_time() - start)

    def _steps(self, n: int) -> None:
        for _ in range(n):
            self.opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(self.x), self.y)
            loss.backward()
            if self.by_hand:
                sums = [p.grad.sum() for p in self.model.parameters() if p.grad is not None]
                bool(torch.isfinite(torch.stack(sums).sum() + loss.detach()))
            if self.mon is not None and hasattr(self.mon, "note"):
                self.mon.note(loss=loss)
            self.opt.step()
            if self.wandb_run is not None:
                self.wandb_run.log({"loss": loss.item()})


def _wandb(loop: Loop, folder: str) -> bool:
    try:
        import wandb
    except ImportError:
        return False
    os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=folder, project="bench-monitor", reinit="finish_previous")
    run.watch(loop.model, log="all", log_freq=1)
    loop.wandb_run = run
    loop.stack.callback(run.finish)
    return True


def speed(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    base = _model(args.quick)
    size = 16 if args.quick else 64
    batch = (torch.randn(32, 3, size, size), torch.randint(0, 10, (32,)))
    folder = tempfile.mkdtemp(prefix="bench-monitor-")
    every = args.steps
    loops = {
        "plain": Loop(base, batch, None),
        f"monitor every={every}": Loop(base, batch, lambda m, o: hookscope.monitor(
            m, every=every, optimizer=o, log=os.path.join(folder, "every"))),
        f"monitor every={every}, nonfinite='off' (no sentinel)": Loop(base, batch, lambda m, o: hookscope.monitor(
            m, every=every, optimizer=o, nonfinite="off", log=os.path.join(folder, "off"))),
        "monitor every step": Loop(base, batch, lambda m, o: hookscope.monitor(
            m, every=1, optimizer=o, log=os.path.join(folder, "all"))),
        'monitor every step, stats=["output", "params", "update"]': Loop(base, batch, lambda m, o: hookscope.monitor(
            m, every=1, optimizer=o, stats=["output", "params", "update"], log=os.path.join(folder, "some"))),
        "sentinel only": Loop(base, batch, lambda m, o: hookscope.monitor(m, every=None, steps=[], optimizer=o)),
    }
    floor = Loop(base, batch, None)
    floor.by_hand = True
    loops["the floor of a sentinel: one sum of every gradient, by hand"] = floor
    watched = Loop(base, batch, None)
    if _wandb(watched, folder):
        loops['wandb.watch(log="all", log_freq=1)'] = watched
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    try:
        if args.per_round:
            times, ratio = ratios({k: (lambda loop=loop: loop.steps(args.steps)) for k, loop in loops.items()},
                                  args.rounds, base="plain")
        else:
            steps = timings({k: (lambda loop=loop: loop.steps(1)) for k, loop in loops.items()},
                            args.steps * args.rounds, warmup=5)
    finally:
        for loop in loops.values():
            loop.stack.close()
    what = "small conv net" if args.quick else "resnet18"
    turn = f"{args.steps} steps a round, {args.rounds} rounds" if args.per_round else \
        f"one step a turn, {args.steps * args.rounds} steps each"
    print(f"{what}, batch 32 x 3 x {size} x {size}, {turn}; "
          f"torch {torch.__version__}, {cpu_model()}, {os.cpu_count()} cores, {platform.system()}; "
          f"{describe()}; load average {load} at the start, {' '.join(f'{v:.2f}' for v in os.getloadavg())} at the end")
    if args.per_round:
        _per_round_table(loops, times, ratio, args.steps)
    else:
        _per_step_table(loops, steps)


def _per_step_table(loops: dict[str, Loop], steps: dict[str, list[float]]) -> None:
    plain = steps["plain"]
    print("| configuration | ms per step (median) | per-step ratio, median (95% interval) | amortised ratio | CPU ratio |")
    print("|---|---|---|---|---|")
    cpu_plain = sum(loops["plain"].cpu[5:])
    for k, loop in loops.items():
        paired = [a / b for a, b in zip(steps[k], plain)]
        lo, hi = median_interval(paired)
        print(f"| {k} | {1000 * statistics.median(steps[k]):.1f} | {statistics.median(paired):.3f}x "
              f"({lo:.3f}-{hi:.3f}) | {sum(steps[k]) / sum(plain):.3f}x | {sum(loop.cpu[5:]) / cpu_plain:.3f}x |")


def _per_round_table(loops: dict[str, Loop], times: dict[str, float], ratio: dict[str, float], n: int) -> None:
    # CPU time beside the wall clock: on a loaded machine the wall clock counts the waits for a core
    cpu = {k: statistics.median(loop.cpu[1:]) for k, loop in loops.items()}  # the first call is the warm-up
    print("| configuration | ms per step (median) | ratio to plain | CPU ms per step | CPU ratio |")
    print("|---|---|---|---|---|")
    for k in loops:
        print(f"| {k} | {1000 * times[k] / n:.1f} | {ratio[k]:.3f}x | {1000 * cpu[k] / n:.1f} "
              f"| {cpu[k] / cpu['plain']:.3f}x |")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    marks = {1_000, 10_000, args.long_steps}
    tracemalloc.start()
    print(f"3-layer MLP, Adam, every=10, JSON lines and CSV written, {args.long_steps} steps")
    print("| step | resident MiB | Python-held MiB (tracemalloc) |")
    print("|---|---|---|")
    with hookscope.monitor(net, every=10, optimizer=opt, log=tempfile.mkdtemp(prefix="bench-monitor-mem-")) as mon:
        for step in range(1, args.long_steps + 1):
            opt.zero_grad()
            loss = (net(x) - y).pow(2).mean()
            loss.backward()
            mon.note(loss=loss)
            opt.step()
            if step in marks:
                gc.collect()
                print(f"| {step} | {_rss() / 2**20:.1f} | {tracemalloc.get_traced_memory()[0] / 2**20:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model: to try the script")
    parser.add_argument("--steps", type=int, default=100, help="steps of each configuration a round (and every=)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", action="store_true",
                        help="time --steps steps a turn (the ratio within a round) instead of one step a turn")
    parser.add_argument("--memory", action="store_true", help="the long run's memory instead of speed")
    parser.add_argument("--long-steps", type=int, default=20_000)
    args = parser.parse_args()
    (memory if args.memory else speed)(args)


if __name__ == "__main__":
    main()
