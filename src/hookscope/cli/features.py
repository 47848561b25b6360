"""``hookscope features``: a layer's feature maps as a labelled grid PNG, or the in-place trap: what a
hook keeping references reads against what the layer produced."""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..analysis.features import BY, compare_references, feature_maps
from ..core.text import shape_text, table
from ..errors import HookscopeError
from ..loading.spec import HF_PREFIX, TIMM_PREFIX
from ..viz.features import REDUCTIONS, SCALES
from ._common import add_device_argument, add_layers_argument, check_device
from .inputs import add_image_arguments, example_input, load_images, model_input, ModelInput
from ._load import DEMO_SPEC, add_model_arguments, load_model, model_session
from ._outputs import check_outputs, input_paths

if TYPE_CHECKING:
    from ..analysis.features import FeatureMaps

_PRINTED = 16  # rows printed when every channel is drawn (--json prints them all)
_R = TypeVar("_R")
EXAMPLE = """\
Examples:
  hookscope features demo --layers layer1 --out layer1.png
      layer1's channels for one generated shape, the shape beside them
  python -c "import hookscope.synthetic as s, torchvision.utils as u; \\
      u.save_image(s.shapes(1).images, 'shape.png')"
      a picture to try them on: one of hookscope's generated shapes, as a PNG
  hookscope features demo --image shape.png --layers layer2 --top 16 \\
      --out layer2.png
      the 16 most active channels of layer2 for your picture
  hookscope features torchvision:alexnet --layers features.0 \\
      --compare-references --out trap.png
      the in-place trap: what a reference-keeping hook reads, and the truth
  hookscope features timm:vit_tiny_patch16_224 --layers blocks.11 \\
      --tokens 1 --reduce pca --out vit.png
      a vision transformer's tokens on their grid, the class token dropped"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "features",
        help="draw a layer's feature maps (its output channels) as a labelled grid PNG",
        description=textwrap.fill(
            "Runs MODEL on images (--image: files or folders) or a seeded random input (--input), keeps what "
            "the layer (--layers) produced (its true output, also where an in-place op rewrites it later), prints each "
            "channel's statistics and draws the channels as a grid of tiles labelled by channel, one row per "
            "image, the input beside it (--out; MODEL demo without --image draws one generated shape). "
            "--compare-references draws what a hook that keeps "
            "output.detach() reads beside what the layer produced, the channels that differ framed in red.",
            100),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    add_device_argument(p)
    p.epilog = EXAMPLE + "\n\n" + textwrap.fill(p.epilog or "", 100)
    add_image_arguments(p)
    add_layers_argument(p, "the layer whose output is drawn", one=True, required=True)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--top", metavar="K", type=int, default=None,
                       help="only the K channels with the largest --by over the images, largest first")
    which.add_argument("--channels", metavar="LIST", default=None, help="only these channels, e.g. 0,5,9")
    p.add_argument("--by", choices=BY, default="mean", help="what --top ranks channels by (default mean)")
    p.add_argument("--scale", choices=SCALES, default="shared",
                   help="shared (default): one colour scale over every tile, with a colour bar; channel: each "
                        "tile scaled to its own min and max")
    p.add_argument("--reduce", choices=REDUCTIONS, default=None,
                   help="one map instead of a tile per channel: the mean or max over the channels, or pca "
                        "(the first 3 principal components of the channels as red, green and blue)")
    p.add_argument("--overlay", metavar="ALPHA", type=float, default=None,
                   help="blend each tile over the input image with this weight (0: image only, 1: map only)")
    p.add_argument("--columns", metavar="N", type=int, default=None, help="tiles per row (default: a square grid)")
    p.add_argument("--colormap", metavar="NAME", default="viridis", help="a matplotlib colormap (default viridis)")
    p.add_argument("--compare-references", action="store_true",
                   help="draw what a hook keeping output.detach() reads beside what the layer produced (the "
                        "in-place trap: an in-place op after the layer rewrites what the reference points to)")
    p.add_argument("--tokens", metavar="SKIP", type=int, default=None,
                   help="the layer gives B x tokens x C (a vision transformer): drop the first SKIP tokens "
                        "(a class token: 1) and lay the rest on a square grid")
    p.add_argument("--layout", choices=("auto", "first", "last"), default="auto",
                   help="a 4-D output is B x C x h x w (first) or B x h x w x C (last, Swin stages); auto "
                        "(default): as it comes, refused where the layer acts on the last dimension")
    p.add_argument("--out", metavar="PNG", required=True,
                   help="where to save the picture (--compare-references on a batch of N: NAME_0.png ...); "
                        "an existing file is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the picture(s) --out names if they exist (checked before the model runs)")
    p.add_argument("--json", action="store_true",
                   help="print the rows as JSON instead of the table (the picture is still written)")


def _channels(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise HookscopeError(f"--channels {text!r} is not a list of channel indices; write it like 0,5,9")
    return [int(p) for p in parts]


def _check(args: argparse.Namespace) -> list[int] | None:
    """Every option's mistake, before the model is built; returns the channels asked for."""
    if args.image and args.input is not None:
        raise HookscopeError("give either --image PATH or --input SHAPE, not both")
    if args.top is not None and args.top < 1:
        raise HookscopeError(f"--top {args.top} must be at least 1 channel")
    if args.columns is not None and args.columns < 1:
        raise HookscopeError(f"--columns {args.columns} must be at least 1 tile per row")
    if args.overlay is not None and not 0.0 <= args.overlay <= 1.0:
        raise HookscopeError(f"--overlay {args.overlay:g} is not a weight; give a number from 0 to 1")
    if args.tokens is not None and args.tokens < 0:
        raise HookscopeError(f"--tokens {args.tokens} must be 0 or more tokens to drop")
    if args.tokens is not None and args.layout != "auto":
        raise HookscopeError("give either --tokens SKIP (a layer of tokens) or --layout (a 4-D layer), not both")
    if args.compare_references and (args.reduce is not None or args.overlay is not None):
        raise HookscopeError("--compare-references draws the channels side by side; drop --reduce and --overlay")
    folder = Path(args.out).parent
    if not folder.is_dir():
        raise HookscopeError(f"--out {args.out}: no such folder {str(folder)!r}; create it first")
    return _channels(args.channels)


def _picture(x: torch.Tensor) -> torch.Tensor:
    """A random input shown as a picture: min-max scaled, grey when it has no 3 channels."""
    img = x if x.shape[0] == 3 else x.mean(dim=0, keepdim=True)
    lo, hi = img.min(), img.max()
    return ((img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)).expand(3, -1, -1).cpu()


def _inputs(args: argparse.Namespace, model: torch.nn.Module | None
            ) -> tuple[torch.Tensor, torch.Tensor | None, list[str] | None, dict[str, Any]]:
    """(model input, pictures B x 3 x H x W in [0, 1] or None, image file names or None, keyword inputs);
    ``model`` is needed for a model whose input its own config says (hf:, timm:, token ids)."""
    if args.image:
        found = load_images(args)
        return found.x, found.pictures, found.names, {}
    if args.model == DEMO_SPEC and args.input is None:  # a picture the demo model knows says more than noise
        from ..synthetic import shapes

        data = shapes(1, seed=args.seed)
        return data.images, data.images, [f"a generated {data.classes[int(data.labels[0])]} (seed {args.seed})"], {}
    given = (model_input(args, model) if model is not None
             else ModelInput(example_input(args.model, args.input, seed=args.seed)))
    x = given.x
    pictures = torch.stack([_picture(x[i]) for i in range(x.shape[0])]) if given.is_image else None
    return x, pictures, None, given.kwargs


def _reshape(args: argparse.Namespace) -> Any:
    from ..analysis.cam import channels_first, channels_last, tokens_to_grid

    if args.tokens is not None:
        return tokens_to_grid(args.tokens)
    return {"auto": None, "first": channels_first, "last": channels_last}[args.layout]


def _ranges(channels: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for c in channels:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


def _shown(res: FeatureMaps, args: argparse.Namespace, channels: list[int] | None) -> list[int]:
    """The channels the picture shows, in its order (top-k: over every image, as the figure ranks them)."""
    if args.top is not None:
        return res.top(args.top, by=args.by)
    return channels if channels is not None else list(range(res.maps.shape[1]))


def _print_features(res: FeatureMaps, shown: list[int], model: torch.nn.Module, x: torch.Tensor,
                    names: list[str] | None, out: Path, args: argparse.Namespace) -> None:
    b, c, h, w = res.maps.shape
    how = "" if res.layout == "BCHW" else f" (from {shape_text(res.output_shape)} through --tokens/--layout)"
    print(f"{type(model).__name__}, input {shape_text(tuple(x.shape))}, layer {res.layer}: {c} channels of "
          f"{h}x{w}{how}")
    for i, name in enumerate(names or []):
        print(f"image {i}: {name}")
    printed = shown
    if args.top is None and args.channels is None and len(shown) > _PRINTED:
        printed = res.top(_PRINTED, by="mean")
        print(f"the {_PRINTED} channels of largest mean (every channel is drawn; --json prints every row):")
    rows = res.rows
    body = [[str(k), f"{rows[k].mean:.4g}", f"{rows[k].min:.4g}", f"{rows[k].max:.4g}", f"{rows[k].std:.4g}",
             f"{rows[k].zeros:.0%}"] for k in printed]
    print("\n".join(table(["channel", "mean", "min", "max", "std", "zeros"], body)))
    what = f"{args.reduce} of {len(shown)} channels" if args.reduce else f"{len(shown)} channel tiles"
    print(f"{what} -> {out}")


def _collect(analysis: Callable[..., _R], model: torch.nn.Module, x: torch.Tensor, args: argparse.Namespace,
             kwargs: dict[str, Any]) -> _R:
    return analysis(model, x, layers=args.layers, reshape=_reshape(args), kwargs=kwargs)


def _drawable(layer: str, maps: torch.Tensor) -> None:
    """Refuse maps of one pixel (a pooled layer, ``--layers pool``) before anything is printed or drawn."""
    _, c, h, w = maps.shape
    if h * w == 1:
        raise HookscopeError(f"layer {layer!r} gives {c} channels of 1x1: no spatial extent to draw (a pooled "
                             "layer); pick an earlier layer with maps larger than 1x1 (`hookscope layers MODEL` "
                             "shows each layer's output)")


def _features(model: torch.nn.Module, x: torch.Tensor, pictures: torch.Tensor | None, names: list[str] | None,
              channels: list[int] | None, args: argparse.Namespace, kwargs: dict[str, Any]) -> None:
    from ..viz.features import plot_feature_maps, save_feature_maps

    res = _collect(feature_maps, model, x, args, kwargs)
    _drawable(res.layer, res.maps)
    shown = _shown(res, args, channels)
    fig = plot_feature_maps(res, picture=pictures, overlay_alpha=args.overlay, channels=channels, top_k=args.top,
                            by=args.by, scale=args.scale, reduce=args.reduce, columns=args.columns,
                            colormap=args.colormap)
    out = save_feature_maps(fig, args.out)
    if args.json:
        data = json.loads(res.to_json())
        data.update(model=args.model, weights=args.weights, input=list(x.shape), files=names, shown=shown,
                    out=str(out))
        print(json.dumps(data, indent=2))
    else:
        _print_features(res, shown, model, x, names, out, args)


def _paths(out: str, n: int) -> list[Path]:
    path = Path(out)
    return [path] if n == 1 else [path.with_name(f"{path.stem}_{i}{path.suffix or '.png'}") for i in range(n)]


def _check_outputs(args: argparse.Namespace, batch: int) -> None:
    """Every picture to write checked before the model is loaded (see :func:`._outputs.check_outputs`)."""
    paths = _paths(args.out, batch if args.compare_references else 1)
    check_outputs([(f"--out {args.out}", p) for p in paths], args.image, overwrite=args.overwrite,
                  others=input_paths(args))


def _comparison(model: torch.nn.Module, x: torch.Tensor, pictures: torch.Tensor | None, names: list[str] | None,
                channels: list[int] | None, args: argparse.Namespace, kwargs: dict[str, Any]) -> None:
    from ..viz.features import plot_reference_comparison, save_feature_maps

    comp = _collect(compare_references, model, x, args, kwargs)
    _drawable(comp.layer, comp.true)
    paths = [save_feature_maps(plot_reference_comparison(
        comp, image=i, channels=channels, top_k=args.top, by=args.by, scale=args.scale, columns=args.columns,
        colormap=args.colormap, picture=pictures), path) for i, path in enumerate(_paths(args.out, x.shape[0]))]
    if args.json:
        data = json.loads(comp.to_json())
        data.update(model=args.model, weights=args.weights, input=list(x.shape), files=names,
                    out=[str(p) for p in paths])
        print(json.dumps(data, indent=2))
        return
    print(f"{type(model).__name__}, input {shape_text(tuple(x.shape))}, layer {comp.layer}: "
          f"{comp.true.shape[1]} channels of {comp.true.shape[2]}x{comp.true.shape[3]}")
    print(comp.table().splitlines()[0])
    if comp.changed:
        print(f"channels rewritten after the layer ran: {_ranges(comp.changed)}; hookscope.capture kept the true "
              "values (the right-hand grid)")
    for i, path in enumerate(paths):
        print(f"image {i}{f' ({names[i]})' if names else ''} -> {path}")


def run(args: argparse.Namespace) -> int:
    with model_session(args):  # the CLI may hold one already; if not, warnings are said from here
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    channels = _check(args)
    device = check_device(args.device)
    # the input comes before the model (the batch says which files --out makes), unless the model says it
    early = None
    if not args.image and (str(args.model).startswith((HF_PREFIX, TIMM_PREFIX)) or args.input_ids is not None
                           or args.text is not None):
        early = load_model(args.model, seed=args.seed, weights=args.weights)
    x, pictures, names, kwargs = _inputs(args, early)
    _check_outputs(args, x.shape[0])
    model = early if early is not None else load_model(args.model, seed=args.seed, weights=args.weights)
    if device is not None:  # the model, its inputs and the analysis there; the pictures drawn stay on the CPU
        model, x = model.to(device), x.to(device)
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if args.compare_references:
        _comparison(model, x, pictures, names, channels, args, kwargs)
    else:
        _features(model, x, pictures, names, channels, args, kwargs)
    return 0
