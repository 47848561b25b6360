"""The ``hookscope`` command: one module per subcommand, each a thin layer over the public API."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from ..core.text import first_line
from ..errors import ForwardError, HookscopeError

_FOLDER_OUT = ("report", "demo", "extract")
# Each name is a module of this package with add_parser(subparsers) and run(args) -> int.
COMMAND_NAMES = ("demo", "report", "layers", "features", "summary", "trace", "watch", "diff", "cam", "prune", "extract",
                 "attribute", "runs", "generate", "lens", "patch")


def _commands() -> dict[str, ModuleType]:
    found = {}
    for name in COMMAND_NAMES:
        try:
            found[name] = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # a real missing dependency, not a missing command
                raise
    return found


def _closest_command(word: str) -> str | None:
    """The command ``word`` was most likely meant to be: the same letters in another order (``cma``), else
    the closest spelling."""
    same = [c for c in COMMAND_NAMES if sorted(c) == sorted(word)]
    near = same or difflib.get_close_matches(word, COMMAND_NAMES, n=1, cutoff=0.6)
    return near[0] if near else None


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the mistake and where to read more, no usage block; a command's
    positionals may come before, between or after its options (``layers --ops MODEL --input S PATTERN``).

    Subcommand parsers are of the same class (``add_subparsers`` takes the parent's type).
    """

    _intermixing = False

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        # argparse fills every positional from the first run of them, so one after an option would be
        # "unrecognized"; intermixed parsing reads the options first, then the positionals. The top parser
        # (its COMMAND takes the rest) parses as argparse does.
        if self._intermixing or any(a.nargs in (argparse.PARSER, argparse.REMAINDER)
                                    for a in self._get_positional_actions()):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def error(self, message: str) -> NoReturn:
        bad = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if bad:  # argparse lists every command; name the one meant (Python < 3.14 does not)
            near = _closest_command(bad.group(1))
            hint = f" Did you mean {near!r}?" if near else f" Commands: {', '.join(COMMAND_NAMES)}."
            message = f"unknown command {bad.group(1)!r}.{hint}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


DESCRIPTION = """See inside and steer any PyTorch model through hooks.

What it does (a command below; capture, edit, grads, attention, inputs and
results are the Python library's, `import hookscope`):
  capture, edit, grads  any layer's inputs, outputs and gradients; patching and
                        ablation; any tensor's gradient, read or rewritten
  MODULE::OP            the operations between modules (layer1.0::add), selected
                        like layers; `layers --ops` lists them
  attention             the attention patterns of fused kernels
  summary, trace, watch the module tree; per-layer statistics; the first NaN/Inf
  gradient flow, diff   gradients layer by layer (trace --grad-flow); two runs
                        compared layer by layer
  cam                   the CAM family (Grad-CAM, Grad-CAM++, Score-CAM, ...)
  attribute             input attribution: gradient methods, LRP, tokens
  generate              a language model's continuation with and without a
                        steering direction (hookscope.steer, tokens.generated)
  lens, patch           which component wrote the answer: the logit lens; patching
                        sweeps and attribution patching (and logit_attribution)
  features              a layer's feature maps; the in-place trap made visible
  prune                 masks; channels, attention heads and widths removed;
                        the smaller model compacted; before and after
  extract               a dataset's activations in shards on disk
  monitor, runs         a training run watched every N steps (hookscope.monitor:
                        per-layer telemetry, the first NaN named with its step);
                        runs reads its log back and draws it
  step memory           what a training step holds per module (summary
                        --step-memory)
  report                an HTML report of it all
  demo                  the trained demo model on new images; the in-place trap
  layers                the names every --layers selects
  inputs                images, example inputs and tokens as the model reads
                        them (load_images, example_input, tokenize)
  results               tables and JSON; in notebooks and pandas"""
MODELS_NOTE = (
    "MODEL: tiny | demo | torchvision:NAME | hf:CLASS_OR_TASK --config PATH (a transformers class such as "
    "GPT2LMHeadModel, or a task such as causal-lm, built from a folder save_pretrained wrote or a config JSON) | "
    "timm:NAME | package.module:ATTR | file.py:ATTR | model.pt. Token models take --input-ids or --text."
)
SECURITY_NOTE = (
    "Security: MODEL as file.py:ATTR or package.module:ATTR imports and runs that Python code; a "
    "model file (.pt, .pth) is read with torch.load(weights_only=True), which runs no code, and a "
    "whole pickled model only with --trust-pickle, which runs any code the file holds. hf: reads local "
    "files only and never runs a model repository's own code (trust_remote_code stays off)."
)


def _unrecognized(extra: list[str], sub: Any, command: str | None) -> str:
    """argparse's "unrecognized arguments", with the closest option of the command for a misspelt one."""
    parser = sub.choices[command] if command else None
    known = sorted(set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", parser.format_usage()))) if parser else []
    for word in extra:
        if word.startswith("-"):
            near = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
            if near:
                return f"unrecognized argument {word!r}. Did you mean {near[0]}?"
    return f"unrecognized arguments: {' '.join(extra)}"


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text.strip())


def _os_error(e: OSError) -> str:
    """A file that cannot be read or written, in one line: the path and what the system said."""
    if type(e).__name__ == "UnidentifiedImageError":  # Pillow's "not an image" (an OSError)
        return f"{e}; give a PNG, JPEG or another image format Pillow reads"
    where = f"{e.filename}: " if e.filename is not None else ""
    return f"{where}{e.strerror or e}"


def _check_out(args: argparse.Namespace) -> None:
    """An --out or --plot that is an input, or an --out that is a folder, fails before the model runs, not
    after (every command)."""
    from ._outputs import check_not_inputs

    if args.command not in ("cam", "features"):  # they check every file they write (an --out there names several)
        check_not_inputs(args, folder_out=args.command in _FOLDER_OUT)
    out = getattr(args, "out", None)
    if args.command in _FOLDER_OUT:  # their --out is a folder, checked by the command
        return
    if isinstance(out, str) and os.path.isdir(out):
        raise HookscopeError(f"cannot write --out {out}: it is a folder; give a file path such as "
                             f"{os.path.join(out, 'out.png' if args.command in ('cam', 'features') else 'out.txt')}")


def _run(module: ModuleType, args: argparse.Namespace, debug: bool = False) -> int:
    """Run one command; every user mistake becomes one line on stderr and exit status 2 (``--debug``:
    the traceback first)."""
    from ._load import model_session

    def fail(message: str) -> int:
        if debug:
            traceback.print_exc()
        print(f"hookscope {args.command}: error: {_one_line(message)}", file=sys.stderr)
        return 2

    try:
        _check_out(args)
        with model_session(args):
            return int(module.run(args) or 0)
    except ForwardError as e:  # a forward pass that failed on --image: the size the model states, if another
        from .inputs import size_hint

        hint = size_hint(args)
        return fail(str(e) if hint is None else f"{_one_line(str(e))}; {hint}")
    except HookscopeError as e:
        return fail(str(e))
    except BrokenPipeError:  # `hookscope demo | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # a path that cannot be read or written: the environment, not a bug
        return fail(_os_error(e))
    except MemoryError as e:
        return fail(f"out of memory ({first_line(e)}); give a smaller --input or --batch")
    except KeyboardInterrupt:
        print("hookscope: interrupted", file=sys.stderr)
        return 130


class _Version(argparse.Action):
    """``--version``: the version, and the way this process takes the CPU statistics (the C kernel or
    torch operations), looked up only when asked."""

    def __init__(self, *args: Any, version: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from ..analysis.trace import cpu_statistics

        print(f"{self.version}\nCPU statistics: {cpu_statistics()}")
        parser.exit()


def _build() -> tuple[_Parser, Any, dict[str, ModuleType]]:
    """The ``hookscope`` parser, its subparsers action and the command modules."""
    from .. import __version__

    parser = _Parser(
        prog="hookscope", description=DESCRIPTION,
        epilog="\n\n".join(textwrap.fill(note, 79) for note in (MODELS_NOTE, SECURITY_NOTE)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, nargs=0, version=f"hookscope {__version__}",
                        help="show the version and how the CPU statistics are computed, and exit")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback with an error (also accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = _commands()
    for module in commands.values():
        module.add_parser(sub)
    return parser, sub, commands


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The ``hookscope`` parser (under ``""``) and each command's, by name: what every ``--help`` prints."""
    parser, sub, _ = _build()
    return {"": parser, **sub.choices}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookscope`` console script; returns the exit code."""
    parser, sub, commands = _build()
    given = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in given  # anywhere: `hookscope --debug trace ...` or `hookscope trace ... --debug`
    args, extra = parser.parse_known_args([a for a in given if a != "--debug"])
    if extra:
        (sub.choices[args.command] if args.command else parser).error(_unrecognized(extra, sub, args.command))
    if args.command is None:
        parser.print_help()
        return 2
    return _run(commands[args.command], args, debug)


if __name__ == "__main__":
    raise SystemExit(main())
