"""``hookscope watch MODEL``: name the first module whose output or gradient holds a NaN or an Inf."""

from __future__ import annotations

import argparse
from typing import Any

from ..analysis.watch import watch
from .inputs import model_input
from ._load import add_model_arguments
from ._common import add_device_argument, add_layers_argument, LOSS_HELP, add_examples, keep_for, model_from, run_model


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "watch",
        help="name the first module whose output (or gradient) holds a NaN or an Inf",
        description="Runs MODEL on a seeded random input (and a backward pass with --backward) and "
        "prints the first module, in execution order, whose output or gradient (one it sends back, or "
        "the .grad of one of its parameters) is not finite, with the statistics of the calls "
        "before it; or 'all finite'. Exit status 1 when one is "
        "found. " + LOSS_HELP + ".",
    )
    add_model_arguments(p)
    add_device_argument(p)
    add_layers_argument(p, "the modules to watch, or MODULE::OP operations (default: every module)", default=[])
    p.add_argument("--backward", action="store_true", help="also run a backward pass and check gradients")
    p.add_argument("--last", type=int, default=5, metavar="N",
                   help="module calls shown before the culprit, with all their records (default 5)")
    p.add_argument("--inputs", action="store_true", help="check each module's inputs too")
    p.add_argument("--json", action="store_true",
                   help="print JSON for programs (finite, checked, culprit, rows) instead of the report")
    add_examples(p, ("hookscope watch tiny --backward", "the first NaN or Inf, forward or backward"),
                 ("hookscope watch hookscope.zoo:TinyResNet --input 8x3x64x64 --inputs",
                  "a model of your own code, each module's inputs checked too"),
                 ("hookscope watch tiny --backward --json",
                  "the culprit and the calls before it, for programs"))


def run(args: argparse.Namespace) -> int:
    model = model_from(args)
    given = model_input(args, model)
    # gradients are checked whenever there are any: the library's default, with --backward or not
    w = watch(model, *args.layers, last=args.last, keep=keep_for(inputs=args.inputs, backward=True))
    run_model(w, model, given.x, backward=args.backward, kwargs=given.kwargs)
    print(w.to_json(indent=2) if args.json else w.table())
    return 0 if w.finite else 1
