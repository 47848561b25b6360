"""``hookscope runs DIR``: a monitored training run, read back from its log, as a table and a picture."""

from __future__ import annotations

import argparse
from typing import Any

from ..analysis.monitor import read_run
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
    p.add_argument("--stats", nargs="+", metavar="NAME", default=list(RUN_STATISTICS),
                   help="what the heatmaps show (default: grad_norm update_ratio dead; also param_norm, "
                   "output_rms, grad_output_max, ...: any statistic the run logged)")
    add_plot_argument(p, "the loss, and a layer x step heatmap of each of --stats")
    p.add_argument("--json", action="store_true",
                   help="print JSON for programs (steps, layers, nonfinite_steps, every row) instead of the table")
    add_examples(p, ("hookscope runs runs/exp1", "per layer: the last gradient norm, update ratio, dead fraction"),
                 ("hookscope runs runs/exp1 --plot run.png", "the run drawn: loss and heatmaps, NaN steps marked"),
                 ("hookscope runs runs/exp1 --stats output_rms grad_output_max --plot run.png",
                  "other statistics the run logged"))


def run(args: argparse.Namespace) -> int:
    check_plot(args.plot)
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
