"""``hookscope runs DIR``: a monitored training run, read back from its log, as a table and a picture."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn

from ..analysis.monitor import monitor, read_run
from ..errors import HookscopeError, did_you_mean
from ..viz.runs import RUN_STATISTICS, plot_run
from ._common import add_examples, add_plot_argument, check_plot, save_plot


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "runs",
        help="a monitored training run read back: per layer gradient norms, update ratios, dead units",
        description="Reads the log a training monitor wrote (hookscope.monitor(..., log=DIR): DIR/monitor.jsonl) "
        "and prints, per layer, the last sampled step's gradient norm, update ratio and dead fraction with their "
        "range over the run, and the steps where a NaN or an Inf appeared. --plot draws the loss and a layer x "
        "step heatmap per statistic, the non-finite steps marked. Exit status 1 when the run logged a NaN or an Inf.",
    )
    p.add_argument("run", metavar="DIR", help="the folder given to log= (or the monitor.jsonl file itself)")
    p.add_argument("--example", action="store_true",
                   help="first write an example run to DIR (a new folder): a small model trained for 60 steps, "
                   "sampled every 4, its learning rate raised 1000-fold at step 40, so a NaN appears")
    p.add_argument("--stats", nargs="+", metavar="NAME", default=list(RUN_STATISTICS),
                   help="what the heatmaps show (default: grad_norm update_ratio dead; also param_norm, "
                   "output_rms, grad_output_max, ...: any statistic the run logged)")
    add_plot_argument(p, "the loss, and a layer x step heatmap of each of --stats")
    p.add_argument("--json", action="store_true",
                   help="print JSON for programs (steps, layers, nonfinite_steps, every row) instead of the table")
    add_examples(p, ("hookscope runs runs/exp1 --example", "an example run written, then read back: the NaN named"),
                 ("hookscope runs runs/exp1", "per layer: the last gradient norm, update ratio, dead fraction"),
                 ("hookscope runs runs/exp1 --plot run.png", "the run drawn: loss and heatmaps, NaN steps marked"),
                 ("hookscope runs runs/exp1 --stats output_rms grad_output_max --plot run.png",
                  "other statistics the run logged"))


def _example(folder: str) -> None:
    """A short monitored run of a small model, written through the library as a user's loop would."""
    if os.path.exists(folder):
        raise HookscopeError(f"--example writes a new run to {folder}, which exists; give a new folder")
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.02)
    with monitor(net, every=4, log=folder, optimizer=opt, nonfinite="log") as mon:
        for step in range(60):
            if step == 40:
                opt.param_groups[0]["lr"] = 20.0
            x = torch.randn(64, 16, generator=gen)
            opt.zero_grad()
            loss = (net(x) - x[:, :4].sum(1, keepdim=True).sin()).pow(2).mean()
            loss.backward()
            mon.note(loss=loss)
            opt.step()


def run(args: argparse.Namespace) -> int:
    check_plot(args.plot)
    if args.example:
        _example(args.run)
    found = read_run(args.run)
    known = found.statistics()
    for name in args.stats:
        if name not in known:
            hint = did_you_mean(name, known) or f" It logged: {', '.join(known)}."
            raise HookscopeError(f"--stats {name}: the run logged no such statistic.{hint}")
    print(found.to_json(indent=2) if args.json else found.table())
    if args.plot is not None:
        save_plot(args.plot, plot_run(found, args.stats), quiet=args.json)
    return 1 if found.nonfinite_steps() else 0
