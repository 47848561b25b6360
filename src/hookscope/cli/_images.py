"""Image inputs for every command that runs a model on pictures: ``--image`` files or folders, resized
and normalised the way the model's weights expect (``--preset``).

A preset is what torchvision's ``weights.transforms()`` holds for a classifier: resize the shorter side,
crop the centre, subtract a mean and divide by a std. ``auto`` picks the weights' own preset for a
torchvision weight name, ``demo`` for the demo model, ``imagenet`` for other torchvision models, timm's
``pretrained_cfg`` (size, crop, mean, std) for ``timm:NAME``, the ``--config`` folder's
``preprocessor_config.json`` (else the config's image size, values in [0, 1], said once) for ``hf:``, and
``none`` (values in [0, 1], the model's usual size) for the rest.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..core.text import first_line
from ..errors import HookscopeError
from ..loading import usual_shape
from ..loading.hf import hf_config
from ..loading.preprocessing import hf_preprocessing, timm_pretrained_cfg
from ..loading.spec import HF_PREFIX, TIMM_PREFIX
from ..loading.vision import torchvision_weights
from ._load import DEMO_SPEC, warn
from ._shapes import check_fits, parse_shape

__all__ = ["IMAGE_SUFFIXES", "PRESETS", "Images", "Preset", "add_image_arguments", "image_files", "size_hint",
           "load_images", "preset_for", "read_image", "transform"]

PRESETS = ("auto", "imagenet", "demo", "none")
# What a folder given to --image is read for; anything else in it (notes, masks.npy...) is skipped.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm")
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preset:
    """How pictures in [0, 1] become the model's input.

    Attributes:
        name: ``imagenet``, ``demo``, ``none`` or the weights' name.
        size: the final ``(H, W)``, or None to keep each image's own size.
        resize: resize the shorter side to this first, then crop the centre to ``size``; None: resize
            straight to ``size``.
        mean: per-channel mean subtracted, or None for no normalisation.
        std: per-channel std divided by (with ``mean``).
        mode: how pictures are resized: ``bilinear`` or ``bicubic`` (antialiased, as torchvision does).

    Example:
        >>> Preset("none", (2, 2)).normalise(torch.ones(1, 3, 2, 2)).mean().item()
        1.0
    """

    name: str
    size: tuple[int, int] | None = None
    resize: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    mode: str = "bilinear"

    def normalise(self, pictures: torch.Tensor) -> torch.Tensor:
        """``(pictures - mean) / std`` over B x 3 x H x W, or the pictures themselves without a mean.

        Example:
            >>> p = Preset("x", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
            >>> p.normalise(torch.ones(1, 3, 1, 1)).flatten().tolist()
            [2.0, 2.0, 2.0]
        """
        if self.mean is None or self.std is None:
            return pictures
        mean = torch.tensor(self.mean, dtype=pictures.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=pictures.dtype).view(1, -1, 1, 1)
        return (pictures - mean) / std


@dataclass
class Images:
    """A batch of pictures read from files, and the model input made from them.

    Attributes:
        x: B x 3 x H x W, the normalised model input.
        pictures: B x 3 x H x W in [0, 1], the same pictures for drawing.
        names: each image's file name.
        paths: each image's path as found (a folder's images joined to the folder).
        preset: how ``x`` was made from ``pictures``.

    Example:
        >>> Images(torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2, 2), ["a.png"]).names
        ['a.png']
    """

    x: torch.Tensor
    pictures: torch.Tensor
    names: list[str]
    paths: list[str] = field(default_factory=list)
    preset: Preset = field(default_factory=lambda: Preset("none"))


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
    size = parse_shape(text) if text else ()
    if len(size) != 2:
        raise HookscopeError(f"--size {text!r} is not HxW; write it like 224x224")
    return size[0], size[1]


def _usual_size(spec: str) -> tuple[int, int] | None:
    """The H x W of the model's usual input, or None when hookscope does not know it."""
    shape = usual_shape(spec)
    return (shape[-2], shape[-1]) if shape is not None and len(shape) == 4 else None


def _from_weights(weights: object, name: str) -> Preset | None:
    """The preset a torchvision weight's ``transforms()`` describes (classification models)."""
    settings = weights.transforms()  # type: ignore[attr-defined]
    crop, resize = getattr(settings, "crop_size", None), getattr(settings, "resize_size", None)
    mean, std = getattr(settings, "mean", None), getattr(settings, "std", None)
    if not crop or mean is None or std is None:  # detection / video weights: no fixed-size preset
        return None
    mode = str(getattr(getattr(settings, "interpolation", None), "value", "bilinear"))
    return Preset(name, (int(crop[0]), int(crop[-1])), int(resize[0]) if resize else None,
                  tuple(float(v) for v in mean), tuple(float(v) for v in std),
                  mode if mode in ("bilinear", "bicubic") else "bilinear")


def _mode(value: object) -> str:
    """timm's interpolation name or a PIL resample code (2 bilinear, 3 bicubic) as a resize mode."""
    return "bicubic" if value in ("bicubic", 3) else "bilinear"


def _timm_preset(spec: str) -> Preset | None:
    """timm's eval transform for ``timm:NAME`` (its ``pretrained_cfg``): resize the shorter side to
    ``size / crop_pct``, crop the centre, the model's mean and std."""
    cfg = timm_pretrained_cfg(spec)
    shape = cfg.get("input_size") if cfg is not None else None
    if cfg is None or not isinstance(shape, (tuple, list)) or len(shape) != 3:
        return None
    h, w = int(shape[1]), int(shape[2])
    crop = cfg.get("crop_pct") or 0.875
    resize = math.floor(min(h, w) / float(crop)) if cfg.get("crop_mode", "center") == "center" and h == w else None
    mean, std = _floats(cfg.get("mean")), _floats(cfg.get("std"))
    return Preset(spec, (h, w), resize, mean if std else None, std if mean else None, _mode(cfg.get("interpolation")))


def _floats(value: Any) -> tuple[float, ...] | None:
    """A list of numbers (a mean or std) as floats; None for anything else."""
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float)) for v in value):
        return tuple(float(v) for v in value)
    return None


def _pair(value: Any) -> tuple[int, int] | None:
    """``224``, ``[224, 224]`` or ``{"height": 224, "width": 224}`` as ``(H, W)``; None otherwise."""
    if isinstance(value, dict):
        value = (value.get("height"), value.get("width")) if "height" in value else value.get("shortest_edge")
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    return None


def _hf_preset(spec: str, config: str | None) -> Preset | None:
    """A transformers image model's input: its config's ``image_size``, and the resize, mean and std
    of ``preprocessor_config.json`` in the folder (without one: values in [0, 1], said once)."""
    size = _pair(getattr(hf_config(config), "image_size", None))
    pre = hf_preprocessing(config)
    if pre is None:
        if size is not None:
            warn(f"{spec}: --config {config} holds no preprocessor_config.json, so images are resized to "
                 f"{size[0]}x{size[1]} and kept in [0, 1] (preset none, no mean/std); give --preset imagenet if "
                 "the model was trained on ImageNet's mean and std")
        return Preset("none", size) if size is not None else None
    crop = _pair(pre.get("crop_size")) if pre.get("do_center_crop") else None
    resized = _pair(pre.get("size"))
    size = size or crop or resized
    shortest = pre.get("size", {}).get("shortest_edge") if isinstance(pre.get("size"), dict) else None
    resize = shortest if crop is not None and isinstance(shortest, int) else None
    mean, std = _floats(pre.get("image_mean")), _floats(pre.get("image_std"))
    norm = bool(pre.get("do_normalize", True)) and mean is not None and std is not None
    return Preset("preprocessor_config.json", size, resize, mean if norm else None, std if norm else None,
                  _mode(pre.get("resample")))


def preset_for(spec: str, choice: str = "auto", weights: str | None = None, size: str | None = None,
               config: str | None = None) -> Preset:
    """The preset ``--preset choice`` means for MODEL ``spec`` with ``--weights``, ``--size`` and
    ``--config``: ``auto`` is timm's ``pretrained_cfg`` for ``timm:NAME`` and the folder's
    ``preprocessor_config.json`` (else the config's image size) for ``hf:``.

    Example:
        >>> preset_for("demo").size, preset_for("demo").mean
        ((64, 64), None)
        >>> preset_for("tiny", "imagenet", size="32x32").mean
        (0.485, 0.456, 0.406)
    """
    if choice not in PRESETS:
        raise HookscopeError(f"--preset {choice!r} is not one of {', '.join(PRESETS)}")
    chosen: Preset | None = None
    if choice == "auto":
        tv = torchvision_weights(spec, weights) if weights is not None else None
        chosen = _from_weights(tv, str(tv)) if tv is not None else None
        if spec.startswith(TIMM_PREFIX):
            chosen = _timm_preset(spec)
        elif spec.startswith(HF_PREFIX):
            chosen = _hf_preset(spec, config)
        choice = "demo" if spec == DEMO_SPEC else "imagenet" if spec.startswith("torchvision:") else "none"
    if chosen is None:
        chosen = {
            "imagenet": Preset("imagenet", (224, 224), 256, _IMAGENET_MEAN, _IMAGENET_STD),
            "demo": Preset("demo", (64, 64)),
            "none": Preset("none", _usual_size(spec)),
        }[choice]
    if size is not None:  # an explicit size wins, as a plain resize (no crop)
        chosen = Preset(chosen.name, _size_arg(size), None, chosen.mean, chosen.std, chosen.mode)
    return chosen


def image_files(paths: Sequence[str]) -> list[str]:
    """Each path that is a file, and the image files of each folder (sorted by name), in order.

    Hidden files in a folder (``.x.png``, macOS's ``._x.png`` resource forks) are skipped.

    Example:
        >>> import tempfile
        >>> image_files([tempfile.mkdtemp()])
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --image ... holds no image file (.png, .jpg, .jpeg, ...); give a folder of images or an image file
    """
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            inside = sorted(f for f in os.listdir(path) if f.lower().endswith(IMAGE_SUFFIXES)
                            and not f.startswith(".") and os.path.isfile(os.path.join(path, f)))
            if not inside:
                raise HookscopeError(f"--image {path} holds no image file ({', '.join(IMAGE_SUFFIXES[:3])}, ...); "
                                     "give a folder of images or an image file")
            found += [os.path.join(path, f) for f in inside]
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise HookscopeError(f"no such image file: {path}")
    return found


def read_image(path: str) -> torch.Tensor:
    """The image file as 3 x H x W in [0, 1]; a file Pillow cannot decode is one line naming it.

    Example:
        >>> import os, tempfile
        >>> bad = os.path.join(tempfile.mkdtemp(), "bad.png")
        >>> _ = open(bad, "w").write("not an image")
        >>> read_image(bad)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: cannot read image .../bad.png: cannot identify image file '.../bad.png'; give a PNG, JPEG or another image format Pillow reads
    """
    from ..viz.overlay import as_image

    try:
        return as_image(path)
    except HookscopeError:
        raise
    except OSError as e:
        if e.strerror:  # the file system's refusal (permissions...), not the picture's content
            raise HookscopeError(f"cannot read image {path}: {e.strerror}") from e
        raise _undecodable(path, e) from e
    except Exception as e:  # Pillow fails in many ways on a broken file (SyntaxError, ValueError...)
        raise _undecodable(path, e) from e


def _undecodable(path: str, e: Exception) -> HookscopeError:
    said = first_line(e) or type(e).__name__
    return HookscopeError(f"cannot read image {path}: {said}; give a PNG, JPEG or another image format Pillow reads")


def transform(picture: torch.Tensor, preset: Preset) -> torch.Tensor:
    """One 3 x H x W picture resized (and centre-cropped) to the preset's size.

    Bicubic resizing overshoots [0, 1] a little near edges; kept, as torchvision keeps it for tensors.

    Example:
        >>> transform(torch.rand(3, 10, 20), Preset("p", (4, 4), resize=5)).shape
        torch.Size([3, 4, 4])
    """
    if preset.size is None:
        return picture
    h, w = picture.shape[-2:]
    if preset.resize is not None:  # torchvision's Resize(int): the shorter side becomes `resize`, rounded as it does
        long = int(preset.resize * max(h, w) / min(h, w))
        target = (preset.resize, long) if h <= w else (long, preset.resize)
    else:
        target = preset.size
    if (h, w) != target:
        picture = F.interpolate(picture[None], size=target, mode=preset.mode, align_corners=False, antialias=True)[0]
    ch, cw = preset.size
    top, left = int(round((target[0] - ch) / 2)), int(round((target[1] - cw) / 2))  # torchvision's center_crop
    if target[0] < ch or target[1] < cw:
        raise HookscopeError(f"preset {preset.name}: resizing to {preset.resize} leaves {target[0]}x{target[1]}, "
                             f"smaller than its crop {ch}x{cw}; give --size HxW")
    return picture[:, top:top + ch, left:left + cw]


def _same_size(pictures: list[torch.Tensor], paths: list[str]) -> None:
    first = pictures[0].shape[-2:]
    for picture, path in zip(pictures, paths):
        if picture.shape[-2:] != first:
            raise HookscopeError(
                f"the images differ in size ({paths[0]} is {first[0]}x{first[1]}, {path} is "
                f"{picture.shape[-2]}x{picture.shape[-1]}) and the model's input size is unknown; give --size HxW"
            )


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
    """Read ``args.image`` (files and folders) into a batch, resized and normalised by the preset.

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
    preset = preset_for(args.model, getattr(args, "preset", "auto") or "auto", getattr(args, "weights", None),
                        getattr(args, "size", None), getattr(args, "config", None))
    given = args.image if isinstance(args.image, list) else [args.image]
    paths = image_files([str(p) for p in given if p is not None])
    if not paths:
        raise HookscopeError("give an image with --image PATH (a file or a folder of images)")
    size = f"{preset.size[0]}x{preset.size[1]}" if preset.size is not None else "their own size"
    if preset.size is not None:  # a huge --size fails in one line here, not deep in the resizing
        check_fits((len(paths), 3, *preset.size), f"{len(paths)} image{'s' if len(paths) > 1 else ''} at {size}",
                   fix="give a smaller --size")
    try:
        pictures = [transform(read_image(path), preset) for path in paths]
        _same_size(pictures, paths)
        batch = torch.stack(pictures)
    except HookscopeError:
        raise
    except (RuntimeError, MemoryError) as e:  # fits in memory on paper, but the allocation failed
        raise HookscopeError(f"{len(paths)} image{'s' if len(paths) > 1 else ''} at {size} cannot be held in memory "
                             f"({first_line(e) or type(e).__name__}); give a smaller --size") from e
    return Images(preset.normalise(batch), batch.clamp(0, 1), [os.path.basename(p) for p in paths], paths, preset)
