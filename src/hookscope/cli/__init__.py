"""The ``hookscope`` command: one module per subcommand, each a thin layer over the public API."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from ..errors import HookscopeError

# Each name is a module of this package with add_parser(subparsers) and run(args) -> int.
COMMAND_NAMES = ("demo", "summary", "trace", "watch", "diff", "cam")


def _commands() -> dict[str, ModuleType]:
    found = {}
    for name in COMMAND_NAMES:
        try:
            found[name] = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # a real missing dependency, not a missing command
                raise
    return found


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the mistake and where to read more, no usage block.

    Subcommand parsers are of the same class (``add_subparsers`` takes the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookscope`` console script; returns the exit code."""
    from .. import __version__

    parser = _Parser(
        prog="hookscope", description="See inside and steer any PyTorch model through hooks."
    )
    parser.add_argument("--version", action="version", version=f"hookscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = _commands()
    for module in commands.values():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(commands[args.command].run(args) or 0)
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
