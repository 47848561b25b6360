"""What several commands share: help with examples, --plot, --layers, --device, loading MODEL with its --weights
(on the --device), the backward pass the CLI differentiates, and which records a command keeps."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

import torch
from torch import nn

from ..analysis.trace import Trace
from ..analysis.watch import Watch
from ..core import first_tensor
from ..errors import HookscopeError
from ..viz.plots import save_figure
from ._load import load_model

LOSS_HELP = ("--backward differentiates loss = output.float().logsumexp(-1).sum() (the first tensor of "
             "the output; a 0-d output is used as it is)")


class ExampleHelp(argparse.HelpFormatter):
    r"""argparse's formatter with each line of the epilog wrapped on its own, so that example
    commands keep their lines (the description, one paragraph, is wrapped as before).

    Example:
        >>> p = argparse.ArgumentParser(prog="x", epilog="Examples:\n  x --a\n  x --b", formatter_class=ExampleHelp)
        >>> p.format_help().splitlines()[-2:]
        ['  x --a', '  x --b']
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            lead = line[: len(line) - len(line.lstrip())]
            lines.append(super()._fill_text(line, width, indent + lead) if line.strip() else "")
        return "\n".join(lines)


def add_examples(p: argparse.ArgumentParser, *examples: tuple[str, str]) -> None:
    """Append ``Examples:`` (command, then what it shows) to the epilog that is there already.

    Example:
        >>> p = argparse.ArgumentParser(prog="hookscope x", epilog="Security: ...")
        >>> add_examples(p, ("hookscope x tiny", "what it shows"))
        >>> print(p.epilog)
        Security: ...
        <BLANKLINE>
        Examples:
          hookscope x tiny
              what it shows
    """
    p.formatter_class = ExampleHelp
    lines = [f"  {command}\n      {what}" for command, what in examples]
    p.epilog = "\n".join([*([p.epilog, ""] if p.epilog else []), "Examples:", *lines])


def add_plot_argument(p: argparse.ArgumentParser, what: str) -> None:
    """The ``--plot FILE`` option: a PNG of ``what``.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_plot_argument(p, "the errors")
        >>> p.parse_args(["--plot", "d.png"]).plot
        'd.png'
    """
    p.add_argument("--plot", metavar="PNG", default=None,
                   help=f"also save a picture as a PNG: {what} (needs the viz extra)")


def check_plot(path: str | None) -> None:
    """Refuse a --plot that cannot be written, or drawn, before the model runs, not after.

    Example:
        >>> check_plot("/no/such/folder/plot.png")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: cannot write --plot /no/such/folder/plot.png: no folder /no/such/folder; create it first
    """
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise HookscopeError(f"cannot write --plot {path}: no folder {folder}; create it first")
    if os.path.isdir(path):
        raise HookscopeError(f"cannot write --plot {path}: it is a folder; give a file path such as "
                             f"{os.path.join(path, 'plot.png')}")
    if importlib.util.find_spec("matplotlib") is None:
        raise HookscopeError("--plot needs matplotlib, from the viz extra: pip install 'hookscope[viz]'")


def save_plot(path: str, figure: Any, *, quiet: bool) -> None:
    """Save the figure; say where on stdout, or on stderr when stdout holds JSON.

    Example:
        >>> import tempfile
        >>> from matplotlib.figure import Figure
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_plot(f"{folder}/p.png", Figure(figsize=(1, 1)), quiet=False)  # doctest: +ELLIPSIS
        wrote plot to .../p.png
    """
    saved = save_figure(figure, path)
    print(f"wrote plot to {saved}", file=sys.stderr if quiet else sys.stdout)


LAYER_FORMS = "LAYER is a name as `hookscope layers MODEL` lists it, a glob such as 'layer*.conv1' or 're:REGEX'"


class _OneLayer(argparse.Action):
    """``--layers`` of a command that takes one layer: a second one is refused, not taken in place of the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        held = getattr(namespace, self.dest, None)
        if held is not None and held != values:
            parser.error(f"{option_string} {values}: this command takes one layer and {held!r} is given already; "
                         "give --layers once")
        setattr(namespace, self.dest, values)


def add_layers_argument(p: argparse.ArgumentParser, what: str, *, one: bool = False, required: bool = False,
                        default: list[str] | None = None) -> None:
    """The ``--layers LAYER`` option (``--layer`` is the same option) of every command that chooses layers.

    Several layers come after one ``--layers`` or with ``--layers`` repeated, the two adding up; spaces
    separate them, never commas, which belong to the layer (``re:`` patterns, extract's ``NAME:at[:, -1]``).
    ``one=True``: a command that takes a single layer, where a second ``--layers`` is an error.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_layers_argument(p, "the layers to trace", default=[])
        >>> p.parse_args(["--layers", "a", "b", "--layer", "c"]).layers, p.parse_args([]).layers
        (['a', 'b', 'c'], [])
    """
    if one:
        p.add_argument("--layers", "--layer", metavar="LAYER", action=_OneLayer, required=required, default=default,
                       help=f"{what}; {LAYER_FORMS}; one layer")
        return
    p.add_argument("--layers", "--layer", metavar="LAYER", nargs="+", action="extend", required=required,
                   default=default, help=f"{what}; {LAYER_FORMS}; several go after one --layers or with "
                   "--layers repeated (spaces separate them, not commas)")


DEVICE_HELP = ("where the model, its inputs and the analysis run: cpu, cuda, cuda:1, mps (default: cpu); "
               "what is printed and drawn is the same")


def add_device_argument(p: argparse.ArgumentParser, more: str = "") -> None:
    """The ``--device DEVICE`` option of every command that runs a model.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_device_argument(p)
        >>> p.parse_args(["--device", "cpu"]).device
        'cpu'
    """
    p.add_argument("--device", metavar="DEVICE", default=None, help=DEVICE_HELP + more)


def check_device(text: str | None) -> torch.device | None:
    """``--device``'s device, or a one-line error naming the fix; None when it was not given.

    Example:
        >>> check_device("cpu"), check_device(None)
        (device(type='cpu'), None)
        >>> check_device("meta")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --device meta holds no values, so nothing can be computed there; give cpu or cuda
    """
    if text is None:
        return None
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise HookscopeError(f"--device {text!r} is not a device; give cpu, cuda or cuda:0") from None
    if device.type == "meta":
        raise HookscopeError(f"--device {text} holds no values, so nothing can be computed there; give cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HookscopeError(f"--device {text}: CUDA is not available here; give --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise HookscopeError(f"--device {text}: this machine has {torch.cuda.device_count()} GPU(s); "
                             "give cuda:0 or another index below that")
    mps = getattr(torch.backends, "mps", None)
    if device.type == "mps" and not (mps is not None and mps.is_available()):
        raise HookscopeError(f"--device {text}: MPS (Apple's GPU) is not available here; give --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise HookscopeError(f"--device {text}: hookscope's commands run on cpu, cuda or mps; give one of them")
    return device


def model_from(args: argparse.Namespace) -> nn.Module:
    """The model MODEL names, with the --weights the command was given (where it has the option), on
    its --device (where it has that option).

    Example:
        >>> type(model_from(argparse.Namespace(model="tiny", seed=0))).__name__
        'TinyResNet'
    """
    device = check_device(getattr(args, "device", None))  # a bad --device is said before the model loads
    weights = getattr(args, "weights", None)
    extra: dict[str, Any] = {} if weights is None else {"weights": weights}
    model = load_model(args.model, seed=args.seed, **extra)
    return model if device is None else model.to(device)


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


def run_model(session: Trace | Watch, model: nn.Module, x: torch.Tensor, *, backward: bool,
              kwargs: dict[str, Any] | None = None) -> None:
    """One forward pass ``model(x, **kwargs)`` (and the backward of :func:`backward_loss`) inside
    ``session``: an exception the model raises in its forward leaves the block as a one-line
    ForwardError naming the module."""
    with session:
        with torch.set_grad_enabled(backward):
            out = model(x, **(kwargs or {}))
        if backward:
            backward_loss(out).backward()


def keep_for(*, inputs: bool, backward: bool) -> tuple[str, ...]:
    """The ``keep=`` of a command: outputs, with inputs and gradients as its flags ask.

    Example:
        >>> keep_for(inputs=True, backward=True)
        ('output', 'input', 'grads')
    """
    return ("output",) + ("input",) * inputs + ("grads",) * backward
