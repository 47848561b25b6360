"""The ``hookscope`` command: one module per subcommand, each a thin layer over the public API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import HookscopeError
from . import demo

COMMANDS = {"demo": demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookscope`` console script; returns the exit code."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="hookscope", description="See inside and steer any PyTorch model through hooks."
    )
    parser.add_argument("--version", action="version", version=f"hookscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(COMMANDS[args.command].run(args) or 0)
    except HookscopeError as e:
        print(f"hookscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hookscope demo | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("hookscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
