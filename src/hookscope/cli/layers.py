"""``hookscope layers MODEL [PATTERN]``: the names every selector and "did you mean" refers to.

Lists each module's qualified name (as ``named_modules()`` gives it on the unwrapped model), its
type, and, from one forward pass on the example input, the shape of what it returned (a component
name, ``blocks.0.attn.z``: the shape of the component as its view reads it, from one more pass). With
``--no-run`` nothing runs: names and types only, for a model whose input is not known yet.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from typing import Any

import torch

from ..analysis.operations import Operations, operations
from ..capture import capture
from ..core.inputs import model_args
from ..named import ComponentSite
from ..analysis.summary import summary
from ..core.ops import SEP, nearest
from ..errors import HookscopeError
from ..core.text import shape_text, table
from ..selection import layers
from .inputs import model_input
from ._load import add_model_arguments
from ._common import add_device_argument, add_examples, model_from


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "layers",
        help="list the model's layer names (what selectors match), types and output shapes",
        description="Lists every module's qualified name, type and output shape (from one forward pass "
        "on a seeded random input), or only those PATTERN selects (a name, a glob such as "
        "'layer*.conv1', or 're:REGEX').",
    )
    add_model_arguments(p)
    p.add_argument("pattern", nargs="?", default=None, metavar="PATTERN",
                   help="only the layers this selector matches (default: every layer)")
    p.add_argument("--no-run", action="store_true",
                   help="list names and types without running the model (no output shapes)")
    p.add_argument("--ops", action="store_true",
                   help="list the operations (torch functions, Tensor methods, operators) each module's own "
                   "forward runs in one pass, named MODULE::OP as --layers selects them, with their shapes")
    p.add_argument("--json", action="store_true", help="print JSON for programs instead of the table")
    add_device_argument(p)
    add_examples(p, ("hookscope layers torchvision:resnet18 'layer1.*'", "the names a glob selects, with shapes"),
                 ("hookscope layers --ops torchvision:resnet18 'layer1.0'",
                  "the operations of one block: layer1.0::add is its residual add"),
                 ("hookscope layers tiny 're:.*conv\\d$' --json", "a regular expression, for programs"),
                 ("hookscope layers hookscope.zoo:DemoNet --no-run",
                  "a model class of your own code (package.module:ATTR or file.py:ATTR),\n"
                  "      names and types without running it"))


def _shapes(model: Any, args: argparse.Namespace) -> dict[str, str]:
    """Each module's output shape(s) from one forward pass, by name (calls after the first: '...')."""
    if args.no_run:
        return {}
    given = model_input(args, model)
    s = summary(model, given.x, kwargs=given.kwargs)
    shown: dict[str, str] = {}
    for r in s.rows:
        text = ", ".join(shape_text(o) for o in r.output_shapes) or "-"
        shown[r.name] = text if r.name not in shown else f"{shown[r.name]}; {text}"
    return shown


def _component_shapes(model: Any, chosen: list[tuple[str, Any]], args: argparse.Namespace) -> dict[str, str]:
    """The shape of each component name selected, as its view reads it, from one pass (one more for
    the attention's weights, which only eager attention returns)."""
    sites = [(n, m) for n, m in chosen if isinstance(m, ComponentSite)]
    if args.no_run or not sites:
        return {}
    given = model_input(args, model)
    shown: dict[str, str] = {}
    for names in ([n for n, m in sites if not m.component.is_pattern], [n for n, m in sites if m.component.is_pattern]):
        if not names:
            continue
        try:
            with torch.no_grad(), capture(model, *names) as rec:
                model(*model_args(given.x), **(given.kwargs or {}))
        except HookscopeError:  # SDPA attention returns no weights: the rest of the listing stands
            shown.update({n: "none (eager attention only)" for n in names})
            continue
        shown.update({n: "; ".join(shape_text(tuple(c.output.shape)) for c in rec[n].calls) for n in names
                      if len(rec[n])})
    return shown


def _run_ops(model: Any, args: argparse.Namespace) -> int:
    """``--ops``: one pass, every operation of the modules PATTERN selects (or of every module)."""
    if args.no_run:
        raise HookscopeError("--ops lists what one forward pass runs, so it cannot go with --no-run; drop --no-run")
    pattern = args.pattern or "*"
    module_part, _, op_part = pattern.partition(SEP)
    given = model_input(args, model)
    found = operations(model, given.x, layers=module_part, kwargs=given.kwargs)
    rows = [r for r in found.rows if not op_part or fnmatch.fnmatchcase(r.name.split(SEP, 1)[1], op_part)]
    if op_part and not rows:
        near = nearest(pattern, list(found))
        hint = f" Did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        raise HookscopeError(f"{pattern!r} matches no operation of one forward pass.{hint} Drop the part after "
                             f"'::' to list every operation of {module_part or 'the model'!r}")
    if args.json:
        print(json.dumps([{"name": r.name, "call": r.call, "function": r.function, "in_place": r.in_place,
                           "inputs": r.inputs, "output": r.output} for r in rows], indent=2))
        return 0
    print(Operations(rows).table())
    print(f"{len(rows)} operation call(s); select them by these names (MODULE::OP) in every hookscope command")
    return 0


def run(args: argparse.Namespace) -> int:
    model = model_from(args)
    if args.ops:
        return _run_ops(model, args)
    chosen = layers(model, args.pattern) if args.pattern is not None else layers(model)
    shapes = {**_shapes(model, args), **_component_shapes(model, chosen, args)}
    rows = [{"name": n, "type": type(m).__name__, **({} if args.no_run else {"output": shapes.get(n, "not called")})}
            for n, m in chosen]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = ["layer", "type"] + ([] if args.no_run else ["output"])
    print("\n".join(table(head, [list(r.values()) for r in rows], left={0, 1, 2})))
    print(f"{len(rows)} layer(s); select them by these names in every hookscope command and call")
    return 0
