"""``hookscope cam``: a class activation map of a model's prediction, saved as an overlay PNG."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from ..core.text import shape_text
from ..errors import HookscopeError
from ._load import add_model_arguments, example_input, load_model, parse_shape

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_METHODS_HELP = "cam, gradcam (default), gradcam++, xgradcam, hirescam, layercam, scorecam, eigencam"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cam",
        help="draw a class activation map (Grad-CAM and family) over the input, as a PNG",
        description="Runs MODEL on an image (--image) or a seeded random input (--input), computes a "
        "class activation map for the predicted class (or --target), prints the class, its score "
        "and the layer used, and saves the map blended over the input.",
    )
    add_model_arguments(p)
    p.add_argument("--image", metavar="PATH", default=None,
                   help="an image file (instead of --input); resized to the model's usual input size")
    p.add_argument("--size", metavar="HxW", default=None,
                   help="resize --image to this size (default: 32x32 for tiny, 224x224 for torchvision, "
                        "else the image's own size)")
    p.add_argument("--normalize", choices=("auto", "imagenet", "none"), default="auto",
                   help="normalise --image with ImageNet's mean and std (auto: for torchvision models)")
    p.add_argument("--layer", metavar="L", action="append", default=None,
                   help="layer name or glob; repeat to fuse several (default: the last Conv2d)")
    p.add_argument("--fuse", choices=("mean", "max"), default="mean", help="how several layers are fused")
    p.add_argument("--method", metavar="M", default="gradcam", help=_METHODS_HELP)
    p.add_argument("--target", metavar="K", type=int, default=None,
                   help="class index (default: the predicted class of each input)")
    p.add_argument("--tokens", metavar="SKIP", type=int, default=None,
                   help="the layer gives B x tokens x C (a vision transformer): drop the first SKIP tokens "
                        "(a class token: 1) and lay the rest on a square grid")
    p.add_argument("--layout", choices=("auto", "first", "last"), default="auto",
                   help="a 4-D layer's output is B x C x h x w (first) or B x h x w x C (last, Swin stages); "
                        "auto (default): told by the modules around the layer, else an error")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the map in the overlay (default 0.5)")
    p.add_argument("--out", metavar="PNG", required=True,
                   help="where to save the overlay; a batch of N saves NAME_0.png ... NAME_{N-1}.png")


def _load_image(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """(model input 1 x 3 x H x W, picture 3 x H x W in [0, 1])."""
    from ..viz.overlay import as_image

    size: tuple[int, ...] | None = None
    if args.size is not None:
        size = parse_shape(args.size)
        if len(size) != 2:
            raise HookscopeError(f"--size {args.size!r} is not HxW; write it like 224x224")
    picture = as_image(args.image)
    if size is None:
        try:
            size = tuple(example_input(args.model, None).shape[-2:])
        except HookscopeError:  # a model whose usual input size we do not know: keep the image's
            size = tuple(picture.shape[-2:])
    if tuple(picture.shape[-2:]) != size:
        picture = torch.nn.functional.interpolate(
            picture[None], size=size, mode="bilinear", align_corners=False, antialias=True
        )[0].clamp(0, 1)
    normalize = args.normalize
    if normalize == "auto":
        normalize = "imagenet" if args.model.startswith("torchvision:") else "none"
    x = picture[None]
    if normalize == "imagenet":
        mean = torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1)
        x = (x - mean) / torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1)
    return x, picture


def _picture(x: torch.Tensor) -> torch.Tensor:
    """A random input shown as a picture: min-max scaled, grey when it has no 3 channels."""
    img = x if x.shape[0] == 3 else x.mean(dim=0, keepdim=True)
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)


def _paths(out: str, n: int) -> list[Path]:
    path = Path(out)
    if n == 1:
        return [path]
    return [path.with_name(f"{path.stem}_{i}{path.suffix or '.png'}") for i in range(n)]


def run(args: argparse.Namespace) -> int:
    from ..analysis.cam import cam, channels_first, channels_last, tokens_to_grid
    from ..viz.overlay import save_overlay

    if args.image is not None and args.input is not None:
        raise HookscopeError("give either --image PATH or --input SHAPE, not both")
    if not 0.0 <= args.alpha <= 1.0:
        raise HookscopeError(f"--alpha {args.alpha:g} is not a weight; give a number from 0 to 1")
    if args.tokens is not None and args.tokens < 0:
        raise HookscopeError(f"--tokens {args.tokens} must be 0 or more tokens to drop")
    if args.tokens is not None and args.layout != "auto":
        raise HookscopeError("give either --tokens SKIP (a layer of tokens) or --layout (a 4-D layer), not both")
    folder = Path(args.out).parent
    if not folder.is_dir():
        raise HookscopeError(f"--out {args.out}: no such folder {str(folder)!r}; create it first")
    model = load_model(args.model, seed=args.seed)
    if args.image is not None:
        x, first = _load_image(args)
        pictures = [first]
    else:
        x = example_input(args.model, args.input, seed=args.seed)
        if x.dim() != 4:
            raise HookscopeError(f"--input {args.input!r} is not B x C x H x W; write it like 1x3x224x224")
        pictures = [_picture(x[i]) for i in range(x.shape[0])]
    chosen = args.layer if args.layer is None or len(args.layer) > 1 else args.layer[0]
    shapers = {"auto": None, "first": channels_first, "last": channels_last}
    reshape = tokens_to_grid(args.tokens) if args.tokens is not None else shapers[args.layout]
    result = cam(model, x, layers=chosen, method=args.method, target=args.target, fuse=args.fuse, reshape=reshape)
    print(f"{type(model).__name__}, input {shape_text(tuple(x.shape))}, method {result.method}, "
          f"layer{'s' if len(result.layers) > 1 else ''} {', '.join(result.layers)}")
    for name, layout in result.layouts.items():
        if layout == "BHWC" and args.layout == "auto":
            print(f"layer {name}: B x h x w x C (channels last), permuted to B x C x h x w")
    targets = result.targets.tolist() if result.targets is not None else [None] * x.shape[0]
    scores = result.scores.tolist() if result.scores is not None else None
    for i, path in enumerate(_paths(args.out, x.shape[0])):
        save_overlay(pictures[i], result.maps[i], path, alpha=args.alpha)
        said = f"class {targets[i]}, score {scores[i]:.4f}" if scores is not None else "no class scores"
        print(f"image {i}: {said} -> {path}")
    return 0
