"""``hookscope trace MODEL``: statistics of every layer's inputs, outputs and gradients, in order."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..analysis.gradflow import gradient_flow
from ..analysis.trace import trace
from ..errors import HookscopeError
from ..viz.plots import plot_gradient_flow, plot_trace
from ._common import (add_device_argument, add_layers_argument, LOSS_HELP, add_examples, add_plot_argument, check_plot, keep_for, model_from, run_model,
                      save_plot)
from .inputs import model_input
from ._load import add_model_arguments


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="per-layer statistics of inputs, outputs and gradients, in execution order",
        description="Runs MODEL on a seeded random input and prints, for every selected module and "
        "call, the shape, dtype, mean, std, min, max, max |x|, zero fraction and NaN / Inf counts of "
        "its inputs and outputs (and of its gradients with --backward). " + LOSS_HELP + ".",
    )
    add_model_arguments(p)
    add_device_argument(p)
    add_layers_argument(p, "the modules to trace, or MODULE::OP operations (default: every module)", default=[])
    p.add_argument("--backward", action="store_true", help="also run a backward pass and trace gradients")
    p.add_argument("--no-inputs", action="store_true", help="leave out the inputs of each call")
    p.add_argument("--grad-flow", action="store_true",
                   help="print per-layer gradient norms with vanishing / exploding flags instead (implies --backward)")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format (default table)")
    p.add_argument("--json", action="store_true", help="print JSON for programs (the same as --format json)")
    p.add_argument("--out", metavar="FILE", default=None, help="write to FILE instead of standard output")
    add_plot_argument(p, "per-layer std and max |x| of the outputs (and gradients) along execution order; with "
                         "--grad-flow, the gradient norms with the vanishing and exploding bands")
    add_examples(p, ("hookscope trace tiny", "every layer's statistics as a table"),
                 ("hookscope trace torchvision:resnet18 --backward --plot trace.png", "forward and backward, drawn"),
                 ("hookscope trace tiny --grad-flow --plot flow.png", "gradient norms per layer, flagged"),
                 ("hookscope trace tiny --layers 'layer1.*' --json > trace.json",
                  "some layers' rows, for programs"))


# --- shared by the commands: examples in --help, --plot, the model with its weights ----------------
def _check_out(path: str | None) -> None:
    """Refuse an --out whose folder does not exist before the model runs, not after."""
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if path and not os.path.isdir(folder):
        raise HookscopeError(f"cannot write --out {path}: no folder {folder}")


def write_out(path: str, text: str) -> None:
    """Write ``text`` to ``path``; an OSError becomes one line."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError as e:
        raise HookscopeError(f"cannot write --out {path}: {e.strerror or e}") from e


def _format(args: argparse.Namespace) -> str:
    if args.json and args.format == "csv":
        raise HookscopeError("give --json or --format csv, not both")
    fmt = "json" if args.json else str(args.format)
    if args.grad_flow and fmt == "csv":
        raise HookscopeError("--grad-flow prints a table or JSON; use --format table or --format json")
    return fmt


def run(args: argparse.Namespace) -> int:
    fmt = _format(args)
    _check_out(args.out)
    check_plot(args.plot)
    model = model_from(args)
    given = model_input(args, model)
    backward = args.backward or args.grad_flow
    # the parameters' own gradients give the gradient-flow plot its largest |grad| per layer
    t = trace(model, *args.layers, keep=keep_for(inputs=not args.no_inputs, backward=backward),
              param_grads=args.grad_flow and args.plot is not None)
    run_model(t, model, given.x, backward=backward, kwargs=given.kwargs)
    missing = t.never_ran()
    if missing:  # a misspelt operation: never an empty table
        raise HookscopeError(f"{'; '.join(missing)}; list what ran with `hookscope layers --ops MODEL`")
    flow = gradient_flow(model, *args.layers, trace=t) if args.grad_flow else None
    if flow is not None:
        text = flow.to_json(indent=1) if fmt == "json" else flow.table()
    else:
        text = {"table": t.table, "json": lambda: t.to_json(indent=1), "csv": t.to_csv}[fmt]()
    if args.out:
        write_out(args.out, text)
        print(f"wrote {fmt} to {args.out}")
    else:
        print(text.rstrip("\n"))
    if args.plot:
        figure = plot_trace(t) if flow is None else plot_gradient_flow(flow, trace=t)
        save_plot(args.plot, figure, quiet=fmt == "json" and not args.out)
    return 0
