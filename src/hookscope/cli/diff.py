"""``hookscope diff A [B]``: run one input through two models (or one model under two settings) and
compare every layer's output; exit status 0 when they agree, 1 when they differ (as diff(1))."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from ..analysis.diff import ATOL, RTOL, Settings, diff, settings
from ..errors import HookscopeError
from ..viz.plots import plot_diff
from .inputs import model_input
from ._load import add_model_arguments, load_model
from ._common import add_device_argument, add_examples, add_layers_argument, check_device, add_plot_argument, check_plot, save_plot

_AUTOCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two runs layer by layer and name the first layer where they differ",
        description="Runs the same seeded input through model A and model B (B defaults to A itself, "
        "under the --b-* settings), compares every module both have, call by call (max abs error, "
        "relative error, cosine similarity), and names the first output beyond tolerance. "
        "Exit status: 0 same, 1 different (or names in one model only), 2 error.",
    )
    add_model_arguments(p)
    add_device_argument(p)
    p.add_argument("model_b", nargs="?", metavar="B", default=None,
                   help="second MODEL, same spellings as A (default: A itself)")
    p.add_argument("--b-seed", type=int, default=None,
                   help="build B with this seed instead of --seed (e.g. two differently initialised models)")
    add_layers_argument(p, "the modules to compare, or MODULE::OP operations (default: every module)")
    p.add_argument("--rtol", type=float, default=None,
                   help=f"relative tolerance (default: float32's {RTOL:g}, or the bfloat16 / float16 tolerance "
                        "for outputs a run computed in that dtype; giving --rtol or --atol sets both for every output)")
    p.add_argument("--atol", type=float, default=None, help=f"absolute tolerance (default {ATOL:g}; see --rtol)")
    for side in ("a", "b"):
        up = side.upper()
        p.add_argument(f"--{side}-train", action="store_true", help=f"run {up} in training mode")
        p.add_argument(f"--{side}-autocast", choices=sorted(_AUTOCAST), default=None,
                       help=f"run {up} under torch.autocast with this dtype")
    p.add_argument("--b-compile", action="store_true", help="run B through torch.compile")
    p.add_argument("--only-diverging", action="store_true", help="print only the rows beyond tolerance")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_plot_argument(p, "the error of every output along execution order, the tolerance and the first "
                         "divergence marked")
    add_examples(p, ("hookscope diff tiny --b-autocast bfloat16", "where bfloat16 autocast departs from float32"),
                 ("hookscope diff tiny --b-train --plot diff.png", "train mode against eval mode, drawn"),
                 ("hookscope diff tiny tiny --b-seed 1 --only-diverging", "two differently seeded models"),
                 ("hookscope diff demo --b-autocast float16 --layers 'layer*' --json",
                  "some layers under float16 autocast, for programs"))


def _setting(args: argparse.Namespace, side: str) -> Settings:
    dtype = getattr(args, f"{side}_autocast")
    return settings(train=True if getattr(args, f"{side}_train") else None,
                    autocast=_AUTOCAST[dtype] if dtype else None)


def _models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """A and B; B is A itself unless another MODEL or --b-seed is given. --weights are A's, and B's
    when B is the same MODEL."""
    weights = getattr(args, "weights", None)
    extra: dict[str, Any] = {} if weights is None else {"weights": weights}
    device = check_device(args.device)
    model_a = load_model(args.model, args.seed, **extra)
    model_a = model_a if device is None else model_a.to(device)
    if args.model_b is None and args.b_seed is None:
        return model_a, model_a
    spec_b = args.model_b or args.model
    seed_b = args.seed if args.b_seed is None else args.b_seed
    model_b = load_model(spec_b, seed_b, **(extra if spec_b == args.model else {}))
    return model_a, model_b if device is None else model_b.to(device)


def run(args: argparse.Namespace) -> int:
    check_plot(args.plot)
    model_a, model_b = _models(args)
    if args.b_compile:
        if not hasattr(torch, "compile"):
            raise HookscopeError("--b-compile needs torch.compile (PyTorch 2.0 or later)")
        model_b = torch.compile(model_b)  # type: ignore[assignment]
    given = model_input(args, model_a)
    result = diff(model_a, model_b, given.x, kwargs=given.kwargs, layers=args.layers, a=_setting(args, "a"), b=_setting(args, "b"),
                  rtol=args.rtol, atol=args.atol, seed=args.seed)
    print(result.to_json(indent=2) if args.json else result.table(only_diverging=args.only_diverging))
    if not result.rows:  # "no divergence" would claim what was never checked
        raise HookscopeError(
            "nothing was compared: no selected module returned a tensor or a number in either run; "
            "pick modules that run with --layers (default: every module)"
        )
    if args.plot:
        save_plot(args.plot, plot_diff(result), quiet=args.json)
    same = result.first is None and not (result.unmatched.a_only or result.unmatched.b_only)
    return 0 if same else 1
