"""``hookscope trace MODEL``: statistics of every layer's inputs, outputs and gradients, in order."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn

from .._tree import first_tensor
from ..analysis.gradflow import gradient_flow
from ..analysis._recorder import RecorderSession
from ..analysis.trace import trace
from ..errors import HookscopeError
from ._load import add_model_arguments, example_input, load_model

LOSS_HELP = ("--backward differentiates loss = output.float().logsumexp(-1).sum() (the first tensor of "
             "the output; a 0-d output is used as it is)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="per-layer statistics of inputs, outputs and gradients, in execution order",
        description="Runs MODEL on a seeded random input and prints, for every selected module and "
        "call, the shape, dtype, mean, std, min, max, max |x|, zero fraction and NaN / Inf counts of "
        "its inputs and outputs (and of its gradients with --backward). " + LOSS_HELP + ".",
    )
    add_model_arguments(p)
    p.add_argument("--layers", nargs="+", metavar="SEL", default=[],
                   help="layer names, globs or re:REGEX (default: every module)")
    p.add_argument("--backward", action="store_true", help="also run a backward pass and trace gradients")
    p.add_argument("--no-inputs", action="store_true", help="leave out the inputs of each call")
    p.add_argument("--grad-flow", action="store_true",
                   help="print per-layer gradient norms with vanishing / exploding flags instead (implies --backward)")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format (default table)")
    p.add_argument("--out", metavar="FILE", default=None, help="write to FILE instead of standard output")


def backward_loss(output: Any) -> torch.Tensor:
    """The scalar the CLI differentiates: ``logsumexp`` over the last dimension, summed."""
    t = first_tensor(output)
    if t is None or not (t.is_floating_point() or t.is_complex()):
        raise HookscopeError("the model's output holds no floating-point tensor, so there is nothing "
                             "to differentiate; drop --backward")
    if not t.requires_grad:
        raise HookscopeError("the model's output does not require grad (frozen parameters?); drop --backward")
    t = t.float()
    return t.logsumexp(-1).sum() if t.dim() else t


def run_model(session: RecorderSession, model: nn.Module, x: torch.Tensor, *, backward: bool) -> None:
    """One forward pass (and the backward of :func:`backward_loss`) inside ``session``: an exception
    the model raises in its forward leaves the block as a one-line ForwardError naming the module."""
    with session:
        with torch.set_grad_enabled(backward):
            out = model(x)
        if backward:
            backward_loss(out).backward()


def keep_for(*, inputs: bool, backward: bool) -> tuple[str, ...]:
    """The ``keep=`` of a command: outputs, with inputs and gradients as its flags ask.

    Example:
        >>> keep_for(inputs=True, backward=True)
        ('output', 'input', 'grads')
    """
    return ("output",) + ("input",) * inputs + ("grads",) * backward


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


def run(args: argparse.Namespace) -> int:
    if args.grad_flow and args.format == "csv":
        raise HookscopeError("--grad-flow prints a table or JSON; use --format table or --format json")
    _check_out(args.out)
    model = load_model(args.model, seed=args.seed)
    x = example_input(args.model, args.input, seed=args.seed)
    backward = args.backward or args.grad_flow
    t = trace(model, *args.layers, keep=keep_for(inputs=not args.no_inputs, backward=backward))
    run_model(t, model, x, backward=backward)
    if args.grad_flow:
        flow = gradient_flow(model, *args.layers, trace=t)
        text = flow.to_json(indent=1) if args.format == "json" else flow.table()
    else:
        text = {"table": t.table, "json": lambda: t.to_json(indent=1), "csv": t.to_csv}[args.format]()
    if args.out:
        write_out(args.out, text)
        print(f"wrote {args.format} to {args.out}")
    else:
        print(text.rstrip("\n"))
    return 0
