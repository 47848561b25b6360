"""``hookscope report MODEL --out DIR``: a self-contained HTML report of a model on some inputs."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..analysis.monitor import read_run
from ..errors import HookscopeError
from ._common import add_device_argument, add_layers_argument, check_device
from .inputs import add_image_arguments, load_images, model_input
from ._load import (DEMO_SPEC, add_class_arguments, add_model_arguments, check_class_names, class_names, load_model,
                    warn)

_MOST = 512  # generated images at once: every layer's output and gradient of each is kept for a while
EXAMPLE = """Examples:
  hookscope report demo --images 2 --methods gradcam --out demo-report
      two generated shapes, Grad-CAM only; their masks add the pointing game
      (--image PATH: your own pictures, files or folders)
  hookscope prune demo --amount 0.3 --repeats 3 --out pruned.pt
      other weights for demo to compare with: 30% of each layer's weights zeroed
  hookscope report demo --against pruned.pt --images 1 --methods none \\
      --out compared
      the demo model and its pruned weights compared layer by layer
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report (summary, feature maps, CAMs with faithfulness, trace, NaN/Inf check, "
             "gradient flow) to a folder",
        description="Runs MODEL on images (--image), on generated demo images (MODEL demo), or on a seeded "
        "random input (--input), and writes DIR/index.html with its pictures under DIR/img and every number "
        "in DIR/report.json. The page opens offline, shows a tab per image and a layer picker (everything "
        "one under another without JavaScript), and says at the top when the weights are random or the "
        "input is generated. The folder appears only when complete; an existing folder is replaced only "
        "with --overwrite, and only if it holds a report or nothing. A progress bar shows on stderr when "
        "it is a terminal.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    add_device_argument(p)
    add_image_arguments(p)
    add_class_arguments(p)
    p.epilog = EXAMPLE + "\n" + (p.epilog or "")
    p.add_argument("--images", metavar="N", type=int, default=4,
                   help=f"for MODEL demo without --image: how many generated images (default 4, at most {_MOST})")
    add_layers_argument(p, "the layers whose feature maps are drawn (default: up to four top-level layers)")
    p.add_argument("--methods", metavar="M,M", default="gradcam,gradcam++,layercam",
                   help="CAM methods, comma-separated, or 'none' (default gradcam,gradcam++,layercam); each method "
                        "runs the model about 100 more times per image for its deletion and insertion curves, "
                        "most of a report's time")
    p.add_argument("--against", metavar="B", default=None,
                   help="also compare MODEL layer by layer with B on the same inputs (a section on the first "
                        "divergence): a weights file for MODEL's architecture (a state_dict, as --weights takes), "
                        "or another MODEL in any form MODEL takes")
    p.add_argument("--run", metavar="LOG", default=None,
                   help="also draw a training run a monitor logged (the folder given to hookscope.monitor's "
                        "log=, or its monitor.jsonl): its loss and each layer's gradient norm, update ratio and "
                        "dead fraction per sampled step, the first NaN or Inf marked")
    p.add_argument("--out", metavar="DIR", required=True, help="the folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it holds an earlier report")
    p.add_argument("--json", action="store_true", help="print the report's paths as JSON")


Inputs = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def _inputs(args: argparse.Namespace, model: torch.nn.Module) -> Inputs:
    """(inputs, pictures, masks, baselines): images given, generated demo images, or a random input."""
    if args.image:
        if args.input is not None:
            raise HookscopeError("give either --image PATH or --input SHAPE, not both")
        found = load_images(args)
        return found.x, found.pictures, None, None
    if args.model == "demo" and args.input is None:
        from ..synthetic import shapes

        data = shapes(args.images, seed=args.seed)
        return data.images, data.images, data.masks, data.backgrounds
    given = model_input(args, model)
    if not given.is_image or given.kwargs:
        raise HookscopeError(f"report draws maps over images, but {type(model).__name__} takes "
                             f"{'token ids' if not given.x.is_floating_point() else 'other inputs'}; look into it "
                             "with summary, trace or watch")
    return given.x, None, None, None


def _methods(text: str) -> list[str]:
    from ..analysis.cam import METHODS

    if text.strip() == "none":
        return []
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise HookscopeError(f"--methods {text!r} names no method; give some, such as gradcam,layercam, or none")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise HookscopeError(f"--methods: unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}, or none")
    return methods


def _names(args: argparse.Namespace, model: torch.nn.Module, x: torch.Tensor) -> list[str] | None:
    """The class names, checked against the model's outputs (one forward of the first input)."""
    names = class_names(args)
    if names is not None:
        with torch.no_grad():
            out = model(x[:1].clone())  # a model that writes into its input changes only this copy
        if isinstance(out, torch.Tensor) and out.dim() == 2:
            check_class_names(names, out.shape[-1], args)
    return names


def _generated(args: argparse.Namespace) -> bool:
    """Inputs that are not images: a seeded random tensor (the demo's generated shapes are its own data)."""
    generated = not args.image and not (args.model == DEMO_SPEC and args.input is None)
    if generated:
        warn("the input is generated (random values, not images): its maps show no real object; give --image PATH")
    return generated


def _against(args: argparse.Namespace) -> tuple[torch.nn.Module, str] | None:
    """--against B: a weights file for MODEL's architecture, else another MODEL (a whole saved model too)."""
    spec = args.against
    if spec is None:
        return None
    if not os.path.isfile(spec):
        try:
            return load_model(spec, seed=args.seed).eval(), spec
        except HookscopeError as e:
            raise HookscopeError(f"--against {spec}: {e}") from None
    try:
        return load_model(args.model, seed=args.seed, weights=spec).eval(), f"{args.model} with the weights {spec}"
    except HookscopeError as e:
        said = str(e).replace(f"--weights {spec}", f"--against {spec}")
        try:  # a whole saved model (torch.save(model)) rather than a state_dict
            return load_model(spec, seed=args.seed).eval(), spec
        except HookscopeError:
            raise HookscopeError(said if f"--against {spec}" in said else f"--against {spec}: {said}") from None


def run(args: argparse.Namespace) -> int:
    from ..report import build_report, check_target

    methods = _methods(args.methods)
    if not 1 <= args.images <= _MOST:
        raise HookscopeError(f"--images {args.images} must be from 1 to {_MOST}")
    check_target(Path(args.out).absolute(), overwrite=args.overwrite, flag="--overwrite")
    device = check_device(args.device)
    run = read_run(args.run) if args.run is not None else None  # a bad log fails before the model loads
    model = load_model(args.model, seed=args.seed, weights=args.weights).eval()
    against = _against(args)
    x, pictures, masks, baselines = _inputs(args, model)
    if device is not None:  # the models and every tensor the analyses read there; the pictures drawn stay on the CPU
        pictures = pictures if pictures is None else pictures.cpu()
        model, x = model.to(device), x.to(device)
        masks, baselines = (t if t is None else t.to(device) for t in (masks, baselines))
        against = against if against is None else (against[0].to(device), against[1])
    path = build_report(model, x, args.out, pictures=pictures, masks=masks, class_names=_names(args, model, x),
                        baselines=baselines, layers=args.layers, methods=methods,
                        title=f"hookscope report: {args.model}", overwrite=args.overwrite,
                        overwrite_flag="--overwrite",
                        generated_inputs=_generated(args), against=against[0] if against else None,
                        against_name=against[1] if against else None, run=run)
    path = path.resolve()
    index = path / "index.html"
    if args.json:
        print(json.dumps({"report": str(path), "index": str(index), "json": str(path / "report.json")}))
    else:
        print(f"wrote the report to {index}")
    return 0
