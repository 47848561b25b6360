"""``hookscope cam``: class activation maps of a model's predictions, saved as overlay PNGs, drawn side by
side for several methods (``--plot``), or printed as JSON."""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.text import shape_text
from ..errors import HookscopeError, did_you_mean
from ..loading.hf import is_hf_model
from .inputs import add_image_arguments, hf_logits, load_images, model_input
from ._common import add_device_argument, add_layers_argument, check_device
from ._load import (
    DEMO_SPEC,
    add_class_arguments,
    add_model_arguments,
    check_class_names,
    class_names,
    load_model,
    model_session,
    warn,
)
from ._outputs import check_outputs, input_paths

if TYPE_CHECKING:
    from ..analysis.cam import CamMaps

def _methods_help() -> str:
    from ..analysis.cam import METHODS  # the one table's names, as cam(method=) takes them

    names = ", ".join(f"{m} (default)" if m == "gradcam" else m for m in METHODS)
    return f"{names}; a comma list such as gradcam,layercam runs each on the same input"
EXAMPLE = """\
Examples:
  python -c "import hookscope.synthetic as s, torchvision.utils as u; \\
      u.save_image(s.shapes(1).images, 'shape.png')"
      a picture to try them on: one of hookscope's generated shapes, as a PNG
  hookscope cam demo --image shape.png --method gradcam,gradcam++,layercam \\
      --plot cams.png
      three methods side by side (without --image, demo draws a shape itself)
  hookscope cam torchvision:resnet18 --image shape.png --out shape_cam.png
      the map blended over the picture (--weights DEFAULT: trained weights,
      downloaded once)
  hookscope cam tiny --input 2x3x32x32 --json
      a seeded random input, the maps' numbers for programs"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cam",
        help="draw class activation maps (Grad-CAM and family) over the input, as PNGs",
        description=textwrap.fill(
            "Runs MODEL on images (--image: files or folders) or a seeded random input (--input; MODEL demo "
            "without either: one generated shape), computes "
            "a class activation map for the predicted class (or --target) with each --method, prints the "
            "class (and its name), its logit and the layer used, and saves the maps blended over the input "
            "(--out), the methods side by side (--plot), or prints JSON (--json).", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    add_device_argument(p)
    p.epilog = EXAMPLE + "\n\n" + textwrap.fill(p.epilog or "", 79)
    add_class_arguments(p)
    add_image_arguments(p)
    p.add_argument("--normalize", dest="preset", choices=("auto", "imagenet", "none"), default=argparse.SUPPRESS,
                   help="the older name of --preset")
    add_layers_argument(p, "the layers whose maps are drawn, several fused (default: the last Conv2d)")
    p.add_argument("--fuse", choices=("mean", "max"), default="mean", help="how several layers are fused")
    p.add_argument("--method", metavar="M[,M...]", default="gradcam", help=_methods_help())
    p.add_argument("--target", metavar="K", type=int, default=None,
                   help="class index (default: the predicted class of each input)")
    p.add_argument("--tokens", metavar="SKIP", type=int, default=None,
                   help="the layer gives B x tokens x C (a vision transformer): drop the first SKIP tokens "
                        "(a class token: 1) and lay the rest on a square grid (or --grid)")
    p.add_argument("--grid", metavar="HxW", default=None,
                   help="with --tokens: lay the tokens left on an H x W grid, for a non-square one (e.g. 14x18)")
    p.add_argument("--layout", choices=("auto", "first", "last"), default="auto",
                   help="a 4-D layer's output is B x C x h x w (first) or B x h x w x C (last, Swin stages); "
                        "auto (default): told by the modules around the layer, else an error")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the map in the overlay (default 0.5)")
    p.add_argument("--out", metavar="PNG", default=None,
                   help="save each map over its image here; a batch of N saves NAME_0.png ... NAME_{N-1}.png, "
                        "several methods NAME_METHOD.png; an existing file is refused unless --overwrite, an "
                        "input image always")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="save the input and every method's map side by side, titled with class and logit "
                        "(a batch: NAME_0.png ...)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files --out and --plot name if they exist (checked before the model runs)")
    p.add_argument("--json", action="store_true",
                   help="print the results as JSON (one object, a list for several methods), nothing else")


def _methods(text: str) -> list[str]:
    """``gradcam,layercam`` -> both, each checked before any runs."""
    from ..analysis.cam import METHODS

    methods = [m.strip().lower() for m in text.split(",") if m.strip()]
    if not methods:
        raise HookscopeError(f"--method {text!r} names no method; give one or more of {', '.join(METHODS)}")
    for m in methods:
        if m not in METHODS:
            raise HookscopeError(f"--method {m!r} is not a CAM method; give one or more of {', '.join(METHODS)}, "
                                 f"comma-separated.{did_you_mean(m, METHODS)}")
    return list(dict.fromkeys(methods))


def _check(args: argparse.Namespace) -> list[str]:
    """Every option's mistake, before the model is built; returns the methods."""
    if args.image and args.input is not None:
        raise HookscopeError("give either --image PATH or --input SHAPE, not both")
    if not 0.0 <= args.alpha <= 1.0:
        raise HookscopeError(f"--alpha {args.alpha:g} is not a weight; give a number from 0 to 1")
    if args.tokens is not None and args.tokens < 0:
        raise HookscopeError(f"--tokens {args.tokens} must be 0 or more tokens to drop")
    if args.tokens is not None and args.layout != "auto":
        raise HookscopeError("give either --tokens SKIP (a layer of tokens) or --layout (a 4-D layer), not both")
    if args.grid is not None and args.tokens is None:
        raise HookscopeError(f"--grid {args.grid} lays out a layer of tokens; give --tokens SKIP too "
                             "(a class token: 1)")
    if args.out is None and args.plot is None and not args.json:
        raise HookscopeError("say what to make: --out PNG (the maps over the images), --plot PNG (the methods "
                             "side by side) or --json")
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        folder = Path(path).parent if path is not None else Path(".")
        if not folder.is_dir():
            raise HookscopeError(f"{flag} {path}: no such folder {str(folder)!r}; create it first")
    return _methods(args.method)


def _grid(text: str | None) -> tuple[int, int] | None:
    """``--grid 14x18`` -> ``(14, 18)``."""
    if text is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not found or int(found.group(1)) < 1 or int(found.group(2)) < 1:
        raise HookscopeError(f"--grid {text!r} is not HxW; write it like 14x14")
    return int(found.group(1)), int(found.group(2))


def _picture(x: torch.Tensor) -> torch.Tensor:
    """A random input shown as a picture: min-max scaled, grey when it has no 3 channels."""
    img = x if x.shape[0] == 3 else x.mean(dim=0, keepdim=True)
    lo, hi = img.min(), img.max()
    return ((img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)).cpu()


def _paths(out: str | None, n: int, tag: str = "") -> list[Path | None]:
    """Where image i's picture goes: ``out`` itself for one image, else ``NAME_i``; ``tag`` appended."""
    if out is None:
        return [None] * n
    path = Path(out)
    suffix, tag = path.suffix or ".png", f"_{tag}" if tag else ""
    if n == 1:
        return [path.with_name(f"{path.stem}{tag}{suffix}") if tag else path]
    return [path.with_name(f"{path.stem}_{i}{tag}{suffix}") for i in range(n)]


@dataclass
class _Inputs:
    x: torch.Tensor
    pictures: list[torch.Tensor]
    files: list[str] | None  # image paths, None for a random input
    generated: list[str] | None = None  # the class of each generated shape, for MODEL demo alone
    kwargs: dict[str, Any] = field(default_factory=dict)  # the model's keyword inputs
    output: Callable[[Any], Any] | None = None  # how to read the scores (a transformers output's .logits)


def _inputs(args: argparse.Namespace, model: torch.nn.Module) -> _Inputs:
    if args.image:
        found = load_images(args)
        return _Inputs(found.x, list(found.pictures), found.paths, output=hf_logits if is_hf_model(model) else None)
    if args.model == DEMO_SPEC and args.input is None:  # a shape the demo model knows says more than noise
        from ..synthetic import shapes

        data = shapes(1, seed=args.seed)
        classes = [data.classes[int(k)] for k in data.labels]
        return _Inputs(data.images, list(data.images), None, classes)
    given = model_input(args, model)
    x = given.x
    if not x.is_floating_point():
        raise HookscopeError(f"cam draws maps over images, but {type(model).__name__} takes token ids; look into a "
                             "token model with trace, watch or summary")
    if x.dim() != 4:
        raise HookscopeError(f"--input {args.input!r} is not B x C x H x W; write it like 1x3x224x224")
    return _Inputs(x, [_picture(x[i]) for i in range(x.shape[0])], None, kwargs=given.kwargs, output=given.output)


def _on(inputs: _Inputs, device: torch.device | None) -> _Inputs:
    """The model's inputs on ``device``; the pictures drawn stay on the CPU."""
    if device is None:
        return inputs
    inputs.x = inputs.x.to(device)
    inputs.kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.kwargs.items()}
    return inputs


def _check_names(model: torch.nn.Module, inputs: _Inputs, names: list[str] | None, args: argparse.Namespace) -> None:
    """Class names must be one per output; run after the CAM, so a bad input already said its one line."""
    if names is None:
        return
    with torch.no_grad():
        out = model(inputs.x[:1], **inputs.kwargs)
    out = inputs.output(out) if inputs.output is not None else out
    if isinstance(out, torch.Tensor) and out.dim() == 2:
        check_class_names(names, out.shape[-1], args)


def _label(k: int | None, score: float | None, names: list[str] | None) -> str:
    if k is None or score is None:
        return "no class scores"
    name = f" ({names[k]})" if names is not None and 0 <= k < len(names) else ""
    return f"class {k}{name}, logit {score:.4f}"


def _row_facts(results: list[CamMaps]) -> tuple[list[int | None], list[float | None]]:
    """Targets and scores per image, from the first method that has them (Eigen-CAM may not)."""
    n = results[0].maps.shape[0]
    for r in results:
        if r.targets is not None and r.scores is not None:
            return list(r.targets.tolist()), list(r.scores.float().tolist())
    return [None] * n, [None] * n


def _save(results: list[CamMaps], inputs: _Inputs, names: list[str] | None,
          args: argparse.Namespace) -> tuple[dict[str, list[Path | None]], list[Path | None]]:
    """The overlays (per method, per image) and the side-by-side plots (per image) written."""
    from ..viz.overlay import save_overlay

    n = len(inputs.pictures)
    overlays = {r.method: _paths(args.out, n, r.method if len(results) > 1 else "") for r in results}
    for r in results:
        for i, path in enumerate(overlays[r.method]):
            if path is not None:
                save_overlay(inputs.pictures[i], r.maps[i], path, alpha=args.alpha)
    plots = _paths(args.plot, n)
    if args.plot is not None:
        from ..viz.plots import plot_cams, save_figure

        for i, path in enumerate(plots):
            assert path is not None
            save_figure(plot_cams(inputs.pictures[i], results, index=i, class_names=names, alpha=args.alpha), path)
    return overlays, plots


def _report(model: torch.nn.Module, results: list[CamMaps], inputs: _Inputs, names: list[str] | None,
            written: tuple[dict[str, list[Path | None]], list[Path | None]], args: argparse.Namespace) -> None:
    first, (overlays, plots) = results[0], written
    methods = ", ".join(r.method for r in results)
    print(f"{type(model).__name__}, input {shape_text(tuple(inputs.x.shape))}, method{'s' if len(results) > 1 else ''} "
          f"{methods}, layer{'s' if len(first.layers) > 1 else ''} {', '.join(first.layers)}")
    if first.chosen is not None:
        print(f"layer chosen automatically: {first.chosen}")
    for name, layout in first.layouts.items():
        if layout == "BHWC" and args.layout == "auto":
            print(f"layer {name}: B x h x w x C (channels last), permuted to B x C x h x w")
        elif layout.startswith("tokens(") and args.tokens is None:
            print(f"layer {name}: B x tokens x C read as {layout}: the k prefix tokens dropped, the patches "
                  "put back on their h x w grid")
    targets, scores = _row_facts(results)
    for i in range(len(inputs.pictures)):
        paths = [str(p[i]) for p in (*overlays.values(), plots) if p[i] is not None]
        file = (f" ({Path(inputs.files[i]).name})" if inputs.files is not None
                else f" (generated {inputs.generated[i]})" if inputs.generated is not None else "")
        print(f"image {i}{file}: {_label(targets[i], scores[i], names)}" + (f" -> {', '.join(paths)}" if paths else ""))


def _json(results: list[CamMaps], inputs: _Inputs, names: list[str] | None,
          written: tuple[dict[str, list[Path | None]], list[Path | None]], args: argparse.Namespace) -> str:
    """Each result's own JSON, plus the model, the image files, the class names and the files written."""
    overlays, plots = written
    objects = []
    for r in results:
        data = json.loads(r.to_json())
        for row in data["rows"]:
            i, k = row["image"], row["target"]
            row["class_name"] = names[k] if names is not None and isinstance(k, int) and 0 <= k < len(names) else None
            row["file"] = inputs.files[i] if inputs.files is not None else None
            row["generated"] = inputs.generated[i] if inputs.generated is not None else None
            row["out"] = str(overlays[r.method][i]) if overlays[r.method][i] is not None else None
            row["plot"] = str(plots[i]) if plots[i] is not None else None
        data.update(model=args.model, weights=args.weights, input=list(inputs.x.shape), class_names=names)
        objects.append(data)
    return json.dumps(objects[0] if len(objects) == 1 else objects, indent=2)


def _written(args: argparse.Namespace, n: int, methods: list[str]) -> list[tuple[str, Path]]:
    """Every file the command writes, with the option that names it (``--out NAME``): overlays, then plots."""
    tag = len(methods) > 1
    found = [(f"--out {args.out}", p) for m in methods for p in _paths(args.out, n, m if tag else "")]
    found += [(f"--plot {args.plot}", p) for p in _paths(args.plot, n)]
    return [(option, p) for option, p in found if p is not None]


def _check_outputs(args: argparse.Namespace, inputs: _Inputs, methods: list[str]) -> None:
    """Every file to write checked before the model runs (see :func:`._outputs.check_outputs`)."""
    check_outputs(_written(args, len(inputs.pictures), methods), args.image, overwrite=args.overwrite,
                  others=input_paths(args))


def _for_the_cli(e: HookscopeError) -> HookscopeError:
    """The analysis's grid error, with the CLI's options (--grid, --tokens) instead of Python's (grid=)."""
    found = re.search(r"reshape= failed on layer ('.*?')'s output .*: (\d+) tokens after skipping (\d+) do not "
                      r"fill a (\d+) x (\d+) grid", str(e))
    if found is None:
        return e
    layer = found.group(1)
    n, skip, h, w = (int(found.group(k)) for k in range(2, 6))
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0) if n > 0 else 1  # the squarest grid
    return HookscopeError(f"--tokens {skip}: layer {layer} leaves {n} tokens, which do not fill a {h}x{w} grid; "
                          f"pass --grid HxW with H x W = {n} (such as {a}x{max(n // a, 1)}), or another --tokens SKIP")


def run(args: argparse.Namespace) -> int:
    with model_session(args):  # the CLI may hold one already; if not, warnings are said from here
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..analysis.cam import cam, channels_first, channels_last, tokens_to_grid

    methods = _check(args)
    grid = _grid(args.grid)
    names = class_names(args)
    device = check_device(args.device)
    model = load_model(args.model, seed=args.seed, weights=args.weights)  # a bad MODEL is said first
    model = model if device is None else model.to(device)
    inputs = _on(_inputs(args, model), device)
    _check_outputs(args, inputs, methods)  # the batch says which files are written; checked before any runs
    chosen = args.layers if args.layers is None or len(args.layers) > 1 else args.layers[0]
    shapers = {"auto": None, "first": channels_first, "last": channels_last}
    reshape = tokens_to_grid(args.tokens, grid=grid) if args.tokens is not None else shapers[args.layout]
    try:
        with warnings.catch_warnings():  # said once, as the CLI says warnings, from the results' notes
            warnings.simplefilter("ignore", UserWarning)
            results = [cam(model, inputs.x, layers=chosen, method=m, target=args.target, fuse=args.fuse,
                           reshape=reshape, kwargs=inputs.kwargs, output=inputs.output) for m in methods]
    except HookscopeError as e:
        said = _for_the_cli(e)
        if said is e:
            raise  # as it was, its cause kept
        raise said from None
    for note in dict.fromkeys(n for r in results for n in r.notes):
        warn(note)
    _check_names(model, inputs, names, args)
    written = _save(results, inputs, names, args)
    if args.json:
        print(_json(results, inputs, names, written, args))
    else:
        _report(model, results, inputs, names, written, args)
    return 0
