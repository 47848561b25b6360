"""``hookscope prune``'s checks of the shares --heads, --mlp and --width, before the model is built:
each mistake refused in one line naming the fix."""

from __future__ import annotations

import argparse

from ...errors import HookscopeError

__all__ = ["check_heads", "check_mlp", "check_width"]


def _alone(args: argparse.Namespace, flag: str, what: str, ranks: str) -> None:
    """``flag`` alone prunes ``what`` only: --amount / --count / --importance / --data need --channels."""
    if not args.channels and (args.amount is not None or args.count is not None):
        raise HookscopeError(f"{flag} alone removes {what} only; add --channels to prune channels by "
                             "--amount too, or drop --amount / --count")
    if not args.channels and (args.importance is not None or args.data is not None):
        other = "--importance" if args.importance is not None else "--data"
        raise HookscopeError(f"{other} ranks channels; {flag} ranks {ranks} on the example input; "
                             f"add --channels or drop {other}")


def check_heads(args: argparse.Namespace) -> None:
    """--heads: a share in [0, 1), alone or with --channels (which --amount, --importance, --data need).

    Example:
        >>> check_heads(argparse.Namespace(heads=0.5, channels=False, amount=None, count=None, importance=None,
        ...                                data=None))
    """
    if not 0.0 <= args.heads < 1.0:  # NaN fails too
        raise HookscopeError(f"--heads {args.heads:g} is not a share of heads in [0, 1); give e.g. --heads 0.5 "
                             "(every layer keeps a head)")
    _alone(args, "--heads", "attention heads", "heads by their output norm")


def check_mlp(args: argparse.Namespace) -> None:
    """--mlp: a share in [0, 1), only with --heads (the MLP units are scored in the heads' pass).

    Example:
        >>> check_mlp(argparse.Namespace(heads=None, mlp=0.5))
        Traceback (most recent call last):
        hookscope.errors.HookscopeError: --mlp 0.5 scores the MLP hidden units in the pass that scores the heads; ...
    """
    if args.heads is None:
        raise HookscopeError(f"--mlp {args.mlp:g} scores the MLP hidden units in the pass that scores the heads; add "
                             "--heads FRACTION (--heads 0 keeps every head), or prune MLPs with --channels --amount")
    if not 0.0 <= args.mlp < 1.0:  # NaN fails too
        raise HookscopeError(f"--mlp {args.mlp:g} is not a share of MLP hidden units in [0, 1); give e.g. --mlp 0.25 "
                             "(every MLP keeps a unit)")


def check_width(args: argparse.Namespace) -> None:
    """--width: a share in [0, 1), alone or with --channels (which --amount, --importance, --data need).

    Example:
        >>> check_width(argparse.Namespace(width=0.25, channels=False, amount=None, count=None, importance=None,
        ...                                data=None))
    """
    if not 0.0 <= args.width < 1.0:  # NaN fails too
        raise HookscopeError(f"--width {args.width:g} is not a share of the hidden width in [0, 1); give e.g. "
                             "--width 0.25")
    _alone(args, "--width", "hidden channels", "hidden channels by their mean |value|")
