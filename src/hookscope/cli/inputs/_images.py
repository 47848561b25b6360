"""Image inputs for every command that runs a model on pictures: ``--image`` files or folders, made
into the model's input by :func:`hookscope.load_images` (the model library's own transform: torchvision's
``weights.transforms()``, timm's ``pretrained_cfg``, the ``--config`` folder's image processor), with
``--size`` and ``--preset`` turned into its arguments.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

import torch

from ...errors import HookscopeError
from ...loading import ImageTransform, Images, image_transform
from ...loading import image_files as _library_image_files
from ...loading import load_images as _library_load_images
from ...loading import read_image as _library_read_image
from ...loading.images import IMAGE_SUFFIXES, PRESETS
from ...loading.spec import HF_PREFIX, TIMM_PREFIX
from .._load import cli_words

__all__ = ["IMAGE_SUFFIXES", "PRESETS", "ImageTransform", "Images", "add_image_arguments", "image_files",
           "load_images", "preset_for", "read_image", "size_hint"]


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    """``--image`` (repeatable, files or folders), ``--size HxW`` and ``--preset``.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_image_arguments(p)
        >>> p.parse_args(["--image", "a.png", "--image", "pics", "--preset", "demo"]).image
        ['a.png', 'pics']
    """
    p.add_argument("--image", metavar="PATH", action="append", default=None,
                   help="an image file, or a folder of them (read in name order); repeat for a batch")
    p.add_argument("--size", metavar="HxW", default=None,
                   help="resize every image to exactly this size (default: the preset's size, else the "
                        "model's usual input size, else the image's own)")
    p.add_argument("--preset", choices=PRESETS, default="auto",
                   help="how images become the input: imagenet (resize 256, crop 224, ImageNet mean/std), "
                        "demo (64x64, values in [0, 1]), none (values in [0, 1]); auto (default): the "
                        "--weights' own preset for a torchvision weight name, demo for the demo model, "
                        "imagenet for torchvision models, timm's pretrained_cfg for timm:NAME, the --config "
                        "folder's preprocessor_config.json (else its image size) for hf:, else none")


def _size_arg(text: str) -> tuple[int, int]:
    parts = [p for p in re.split(r"[x,\s]+", text.strip().lower()) if p]
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise HookscopeError(f"--size {text!r} is not HxW; write it like 224x224")
    return int(parts[0]), int(parts[1])


def preset_for(spec: str, choice: str = "auto", weights: str | None = None, size: str | None = None,
               config: str | None = None) -> ImageTransform:
    """The transform ``--preset choice`` means for MODEL ``spec`` with ``--weights``, ``--size`` and
    ``--config`` (:func:`hookscope.image_transform`).

    Example:
        >>> preset_for("demo").size, preset_for("demo").mean
        ((64, 64), None)
        >>> preset_for("tiny", "imagenet", size="32x32").mean
        (0.485, 0.456, 0.406)
    """
    with cli_words():
        return image_transform(spec, weights=weights, config=config, preset=choice,
                               size=_size_arg(size) if size is not None else None)


def image_files(paths: Sequence[str]) -> list[str]:
    """Each ``--image`` path that is a file, and the image files of each folder (sorted by name).

    Example:
        >>> import tempfile
        >>> image_files([tempfile.mkdtemp()])
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: --image ... holds no image file (.png, .jpg, .jpeg, ...); give a folder of images or an image file
    """
    with cli_words():
        return _library_image_files(paths)


def read_image(path: str) -> torch.Tensor:
    """The image file as 3 x H x W in [0, 1] (:func:`hookscope.loading.read_image`), in the command's words.

    Example:
        >>> read_image("/no/such.png")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: no such image file: /no/such.png
    """
    with cli_words():
        return _library_read_image(path)


def size_hint(args: argparse.Namespace) -> str | None:
    """For a forward pass that failed on ``--image``s: the size an ``hf:`` / ``timm:`` model states for
    itself, when ``--size`` asked for another; None otherwise.

    Example:
        >>> size_hint(argparse.Namespace(model="demo", image=["a.png"], size="32x32")) is None
        True
    """
    size, spec = getattr(args, "size", None), str(getattr(args, "model", ""))
    if not getattr(args, "image", None) or size is None or not spec.startswith((HF_PREFIX, TIMM_PREFIX)):
        return None
    try:
        own = preset_for(spec, "auto", getattr(args, "weights", None), None, getattr(args, "config", None)).size
    except HookscopeError:
        return None
    if own is None or own == _size_arg(size):
        return None
    return f"the model states {own[0]}x{own[1]} inputs: give --size {own[0]}x{own[1]}, or leave --size out"


def load_images(args: argparse.Namespace) -> Images:
    """``args.image`` (files and folders) as a batch by :func:`hookscope.load_images`.

    Reads ``args.image``, ``args.size``, ``args.preset``, ``args.model``, ``args.weights`` and ``args.config``.

    Example:
        >>> import os, tempfile
        >>> from PIL import Image
        >>> folder = tempfile.mkdtemp()
        >>> Image.new("RGB", (80, 60), (255, 0, 0)).save(os.path.join(folder, "red.png"))
        >>> ns = argparse.Namespace(image=[folder], size=None, preset="auto", model="demo", weights=None)
        >>> batch = load_images(ns)
        >>> tuple(batch.x.shape), batch.names, [round(v, 4) for v in batch.x[0, :, 0, 0].tolist()]
        ((1, 3, 64, 64), ['red.png'], [1.0, 0.0, 0.0])
    """
    given = args.image if isinstance(args.image, list) else [args.image]
    size = getattr(args, "size", None)
    with cli_words():
        return _library_load_images(args.model, [str(p) for p in given if p is not None],
                                    weights=getattr(args, "weights", None), config=getattr(args, "config", None),
                                    preset=getattr(args, "preset", "auto") or "auto",
                                    size=_size_arg(size) if size is not None else None)
