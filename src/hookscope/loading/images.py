"""Pictures for a model: image files read and made into the input its weights expect, by the model
library's own transform wherever the library has one.

:func:`image_transform` says how a picture becomes ``spec``'s input. With ``preset="auto"`` it is
torchvision's ``weights.transforms()`` for a torchvision weight name, timm's eval transform
(``resolve_data_config`` + ``create_transform`` of the model's ``pretrained_cfg``) for ``timm:NAME``,
transformers' ``AutoImageProcessor`` of the ``config`` folder's ``preprocessor_config.json`` for
``hf:``; else hookscope's own resize, centre crop and normalisation: ``imagenet`` (resize 256, crop
224, ImageNet's mean and std), ``demo`` (64 x 64 in [0, 1]) and ``none`` (the model's usual size, values
in [0, 1]). An explicit ``size`` is a plain resize to that size, with the library's mean and std.

torchvision's transforms get the picture as a float tensor in [0, 1] (their tensor input); timm's and
transformers' get it as a PIL RGB image (theirs). :func:`load_images` reads files and folders into a
batch. Must not import: ``cli``, ``viz``, ``report`` or any analysis.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..core.text import first_line
from ..errors import LoadError, checked, checked_init
from .extras import import_failed, import_timm, import_transformers, quiet_transformers
from .hf import check_no_remote_code, hf_config
from .inputs import check_fits
from .preprocessing import hf_preprocessing, timm_pretrained_cfg
from .spec import HF_PREFIX, TIMM_PREFIX, TORCHVISION_PREFIX, usual_shape
from .vision import torchvision_weights
from .voice import tell, terms

__all__ = ["IMAGE_SUFFIXES", "PRESETS", "ImageTransform", "Images", "image_files", "image_transform",
           "load_images", "read_image"]

PRESETS = ("auto", "imagenet", "demo", "none")
# What a folder of images is read for; anything else in it (notes, masks.npy...) is skipped.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm")
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")


class _Library:
    """A model library's own transform of one picture (a module-level class: a data loader's workers
    pickle it)."""

    def __init__(self, transform: Any, pil: bool, key: str | None = None) -> None:
        self.transform, self.pil, self.key = transform, pil, key

    def __call__(self, picture: torch.Tensor) -> torch.Tensor:
        picture = picture.expand(3, -1, -1) if picture.dim() == 3 and picture.shape[0] == 1 else picture
        given = _to_pil(picture) if self.pil else picture
        out = self.transform(given, return_tensors="pt")[self.key][0] if self.key else self.transform(given)
        return out.float() if isinstance(out, torch.Tensor) else torch.as_tensor(out, dtype=torch.float32)


@checked_init
@dataclass(frozen=True)
class ImageTransform:
    """How a 3 x H x W picture in [0, 1] becomes a model's input.

    Attributes:
        name: the weights' or library's name for it, or ``imagenet``, ``demo``, ``none``.
        size: the final ``(H, W)``, or None to keep each image's own size.
        resize: the shorter side is resized to this first, then the centre cropped to ``size``; None:
            resized straight to ``size``.
        mean: per-channel mean subtracted, or None for no normalisation.
        std: per-channel std divided by (with ``mean``).
        mode: how pictures are resized: ``bilinear`` or ``bicubic``.
        library: whose transform runs: ``torchvision``, ``timm``, ``transformers``, or None for
            hookscope's own resize, crop and normalisation (the fields above describe it either way).

    Example:
        >>> t = ImageTransform("none", (2, 2))
        >>> t(torch.ones(3, 4, 4)).shape, t.library
        (torch.Size([3, 2, 2]), None)
    """

    name: str
    size: tuple[int, int] | None = None
    resize: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    mode: str = "bilinear"
    library: str | None = None
    runs: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, compare=False, repr=False)

    def __call__(self, picture: torch.Tensor) -> torch.Tensor:
        """The model input (3 x H x W) made from one picture (3 x H x W in [0, 1]).

        Example:
            >>> ImageTransform("x", mean=(0.5,) * 3, std=(0.25,) * 3)(torch.ones(3, 1, 1)).flatten().tolist()
            [2.0, 2.0, 2.0]
        """
        if self.runs is not None:
            return self.runs(picture)
        return self.normalise(self.resized(picture)[None])[0]

    def resized(self, picture: torch.Tensor) -> torch.Tensor:
        """One 3 x H x W picture resized (and centre-cropped) to the size, as hookscope's own transform does.

        Bicubic resizing overshoots [0, 1] a little near edges; kept, as torchvision keeps it for tensors.

        Example:
            >>> ImageTransform("p", (4, 4), resize=5).resized(torch.rand(3, 10, 20)).shape
            torch.Size([3, 4, 4])
        """
        if self.size is None:
            return picture
        h, w = picture.shape[-2:]
        if self.resize is not None:  # torchvision's Resize(int): the shorter side becomes `resize`, rounded as it does
            long = int(self.resize * max(h, w) / min(h, w))
            target = (self.resize, long) if h <= w else (long, self.resize)
        else:
            target = self.size
        if (h, w) != target:
            picture = F.interpolate(picture[None], size=target, mode=self.mode, align_corners=False, antialias=True)[0]
        ch, cw = self.size
        if target[0] < ch or target[1] < cw:
            raise LoadError(f"preset {self.name}: resizing to {self.resize} leaves {target[0]}x{target[1]}, smaller "
                            f"than its crop {ch}x{cw}; give {_words()['size']}")
        top, left = int(round((target[0] - ch) / 2)), int(round((target[1] - cw) / 2))  # torchvision's center_crop
        return picture[:, top:top + ch, left:left + cw]

    def normalise(self, pictures: torch.Tensor) -> torch.Tensor:
        """``(pictures - mean) / std`` over B x 3 x H x W, or the pictures themselves without a mean.

        Example:
            >>> t = ImageTransform("x", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
            >>> t.normalise(torch.ones(1, 3, 1, 1)).flatten().tolist()
            [2.0, 2.0, 2.0]
        """
        if self.mean is None or self.std is None:
            return pictures
        mean = torch.tensor(self.mean, dtype=pictures.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=pictures.dtype).view(1, -1, 1, 1)
        return (pictures - mean) / std

    def pictures(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model inputs (B x 3 x H x W) back as pictures in [0, 1], for drawing: ``x * std + mean``.

        Example:
            >>> t = ImageTransform("x", mean=(0.5,) * 3, std=(0.25,) * 3)
            >>> t.pictures(torch.full((1, 3, 1, 1), 2.0)).flatten().tolist()
            [1.0, 1.0, 1.0]
        """
        if self.mean is None or self.std is None:
            return inputs.clamp(0, 1)
        mean = torch.tensor(self.mean, dtype=inputs.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=inputs.dtype).view(1, -1, 1, 1)
        return (inputs * std + mean).clamp(0, 1)


@checked_init
@dataclass
class Images:
    """A batch of pictures read from files, and the model input made from them.

    Attributes:
        x: B x 3 x H x W, the model input.
        pictures: B x 3 x H x W in [0, 1], the same pictures for drawing.
        names: each image's file name.
        paths: each image's path as found (a folder's images joined to the folder).
        transform: how ``x`` was made from the files.

    Example:
        >>> Images(torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2, 2), ["a.png"]).names
        ['a.png']
    """

    x: torch.Tensor
    pictures: torch.Tensor
    names: list[str]
    paths: list[str] = field(default_factory=list)
    transform: ImageTransform = field(default_factory=lambda: ImageTransform("none"))


def _words() -> dict[str, str]:
    """The caller's words for the options: the command line's or Python's."""
    if terms().cli:
        return {"size": "--size HxW", "image": "--image", "preset": "--preset", "config": "--config", "smaller": "--size"}
    return {"size": "size=(H, W)", "image": "paths", "preset": "preset=", "config": "config=", "smaller": "size="}


def _to_pil(picture: torch.Tensor) -> Any:
    """A 3 x H x W picture in [0, 1] as a PIL RGB image (8-bit files come back exactly)."""
    from PIL import Image

    array = (picture.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    return Image.fromarray(array, "RGB")


def _size_of(size: str | Sequence[int]) -> tuple[int, int]:
    parts = re.split(r"[x,\s]+", size.strip().lower()) if isinstance(size, str) else list(size)
    dims = tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in parts)
    if len(dims) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise LoadError(f"{'--size' if terms().cli else 'size='} {size!r} is not HxW; write it like "
                        f"{'224x224' if terms().cli else '(224, 224)'}")
    return int(dims[0]), int(dims[1])


def _usual_size(spec: str) -> tuple[int, int] | None:
    shape = usual_shape(spec)
    return (shape[-2], shape[-1]) if shape is not None and len(shape) == 4 else None


def _floats(value: Any) -> tuple[float, ...] | None:
    """A list of numbers (a mean or std) as floats; None for anything else."""
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float)) for v in value):
        return tuple(float(v) for v in value)
    return None


def _mode(value: object) -> str:
    """timm's interpolation name or a PIL resample code (2 bilinear, 3 bicubic) as a resize mode."""
    return "bicubic" if value in ("bicubic", 3) or str(value).lower().endswith("bicubic") else "bilinear"


def _torchvision(weights: Any) -> ImageTransform | None:
    """torchvision's ``weights.transforms()`` (classification weights; None for detection or video)."""
    settings = weights.transforms()
    crop, resize = getattr(settings, "crop_size", None), getattr(settings, "resize_size", None)
    mean, std = getattr(settings, "mean", None), getattr(settings, "std", None)
    if not crop or mean is None or std is None:
        return None
    mode = str(getattr(getattr(settings, "interpolation", None), "value", "bilinear"))
    return ImageTransform(str(weights), (int(crop[0]), int(crop[-1])), int(resize[0]) if resize else None,
                          _floats(list(mean)), _floats(list(std)), _mode(mode), "torchvision", _Library(settings, False))


def _timm(spec: str) -> ImageTransform | None:
    """timm's eval transform of ``timm:NAME``'s ``pretrained_cfg``: ``resolve_data_config`` + ``create_transform``."""
    cfg = timm_pretrained_cfg(spec)
    if cfg is None:
        return None
    data = import_timm().data
    config = data.resolve_data_config({}, pretrained_cfg=cfg)
    shape, crop = config.get("input_size"), float(config.get("crop_pct") or 0.875)
    h, w = int(shape[1]), int(shape[2])
    resize = math.floor(min(h, w) / crop) if config.get("crop_mode", "center") == "center" and h == w else None
    return ImageTransform(spec, (h, w), resize, _floats(config.get("mean")), _floats(config.get("std")),
                          _mode(config.get("interpolation")), "timm", _Library(data.create_transform(**config), True))


def _pair(value: Any) -> tuple[int, int] | None:
    """``224``, ``[224, 224]`` or ``{"height": 224, "width": 224}`` as ``(H, W)``; None otherwise."""
    if isinstance(value, dict):
        value = (value.get("height"), value.get("width")) if "height" in value else value.get("shortest_edge")
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    return None


def _height_width(value: Any) -> tuple[int, int] | None:
    """``{"height": H, "width": W}`` (a dict, or transformers' ``SizeDict``) as ``(H, W)``; None otherwise."""
    h, w = (value.get("height"), value.get("width")) if isinstance(value, dict) else \
        (getattr(value, "height", None), getattr(value, "width", None))
    return (h, w) if isinstance(h, int) and isinstance(w, int) else None


def _processor_size(processor: Any) -> tuple[int, int] | None:
    """The H x W the processor's output has: its crop, else its fixed resize; None when it follows the image."""
    crop = _height_width(getattr(processor, "crop_size", None)) if getattr(processor, "do_center_crop", False) else None
    fixed = _height_width(getattr(processor, "size", None)) if getattr(processor, "do_resize", True) else None
    return crop or fixed


def _image_processor(folder: str) -> Any:
    """transformers' ``AutoImageProcessor`` of ``folder``: local files, no repository's own code."""
    check_no_remote_code(folder)
    transformers = import_transformers()
    try:
        with quiet_transformers(transformers):
            return transformers.AutoImageProcessor.from_pretrained(folder, local_files_only=True,
                                                                   trust_remote_code=False)
    except ImportError as e:
        raise import_failed(e, f"the image processor in {_words()['config']} {folder}") from None
    except Exception as e:  # a broken preprocessor_config.json fails in many ways
        raise LoadError(f"transformers cannot read the image processor in {_words()['config']} {folder} "
                        f"({type(e).__name__}: {first_line(e)}); write it again with "
                        "image_processor.save_pretrained(folder), or remove preprocessor_config.json") from None


def _hf(spec: str, config: str | None) -> ImageTransform | None:
    """A transformers image model's processor (the folder's ``preprocessor_config.json``); without one its
    config's ``image_size`` and values in [0, 1], said once."""
    size = _pair(getattr(hf_config(config), "image_size", None))
    pre = hf_preprocessing(config)
    if pre is None or config is None:
        if size is not None:
            tell("warning", f"{spec}: {_words()['config']} {config} holds no preprocessor_config.json, so images are "
                            f"resized to {size[0]}x{size[1]} and kept in [0, 1] (preset none, no mean/std); give "
                            f"{_words()['preset']} imagenet if the model was trained on ImageNet's mean and std")
        return ImageTransform("none", size) if size is not None else None
    processor = _image_processor(config)
    crop = _height_width(getattr(processor, "crop_size", None)) if getattr(processor, "do_center_crop", False) else None
    size = _processor_size(processor) or size
    shortest = pre.get("size", {}).get("shortest_edge") if isinstance(pre.get("size"), dict) else None
    norm = bool(getattr(processor, "do_normalize", True))
    mean = _floats(list(getattr(processor, "image_mean", None) or [])) if norm else None
    std = _floats(list(getattr(processor, "image_std", None) or [])) if norm else None
    return ImageTransform("preprocessor_config.json", size, shortest if crop is not None else None, mean, std,
                          _mode(pre.get("resample")), "transformers", _Library(processor, True, "pixel_values"))


@checked
def image_transform(spec: str, *, weights: str | None = None, config: str | None = None, preset: str = "auto",
                    size: str | Sequence[int] | None = None) -> ImageTransform:
    """How pictures become the input of the model ``spec`` names (see the module's text).

    Args:
        spec: the model, as :func:`~hookscope.load_model` names it.
        weights: a torchvision weight name (``DEFAULT``, ``IMAGENET1K_V1``): its ``transforms()``.
        config: an ``hf:`` model's folder: its ``preprocessor_config.json``.
        preset: ``auto`` (the library's own), ``imagenet``, ``demo`` or ``none``.
        size: ``(H, W)`` (or ``"HxW"``): a plain resize to it, with the chosen mean and std.

    Example:
        >>> t = image_transform("torchvision:resnet18", weights="DEFAULT")
        >>> t.library, t.size, t.resize
        ('torchvision', (224, 224), 256)
        >>> image_transform("demo").size, image_transform("demo").mean
        ((64, 64), None)
    """
    if preset not in PRESETS:
        raise LoadError(f"{_words()['preset']} {preset!r} is not one of {', '.join(PRESETS)}")
    chosen: ImageTransform | None = None
    if preset == "auto":
        tv = torchvision_weights(spec, weights) if weights is not None else None
        chosen = _torchvision(tv) if tv is not None else None
        if spec.startswith(TIMM_PREFIX):
            chosen = _timm(spec)
        elif spec.startswith(HF_PREFIX):
            chosen = _hf(spec, config)
        preset = "demo" if spec == "demo" else "imagenet" if spec.startswith(TORCHVISION_PREFIX) else "none"
    if chosen is None:
        chosen = {
            "imagenet": ImageTransform("imagenet", (224, 224), 256, _IMAGENET_MEAN, _IMAGENET_STD),
            "demo": ImageTransform("demo", (64, 64)),
            "none": ImageTransform("none", _usual_size(spec)),
        }[preset]
    if size is not None:  # an explicit size wins, as a plain resize (no crop) by hookscope
        chosen = ImageTransform(chosen.name, _size_of(size), None, chosen.mean, chosen.std, chosen.mode)
    return chosen


def image_files(paths: str | Sequence[str]) -> list[str]:
    """Each path that is a file, and the image files of each folder (sorted by name), in order.

    Hidden files in a folder (``.x.png``, macOS's ``._x.png`` resource forks) are skipped.

    Example:
        >>> import tempfile
        >>> image_files([tempfile.mkdtemp()])
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: paths ... holds no image file (.png, .jpg, .jpeg, ...); give a folder of images or an image file
    """
    found: list[str] = []
    flag = _words()["image"]
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            inside = sorted(f for f in os.listdir(path) if f.lower().endswith(IMAGE_SUFFIXES)
                            and not f.startswith(".") and os.path.isfile(os.path.join(path, f)))
            if not inside:
                raise LoadError(f"{flag} {path} holds no image file ({', '.join(IMAGE_SUFFIXES[:3])}, ...); "
                                "give a folder of images or an image file")
            found += [os.path.join(path, f) for f in inside]
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise LoadError(f"no such image file: {path}")
    return found


def _from_pil(im: Any, path: str) -> torch.Tensor:
    """A PIL image as 3 x H x W in [0, 1]: 8-bit modes through RGB, 16-bit scaled, float kept."""
    import numpy as np

    mode = str(im.mode)
    if mode in _SIXTEEN_BIT or mode == "F":
        values = np.asarray(im).astype(np.float64)
        if mode == "F" and not np.isfinite(values).all():
            raise LoadError(f"image {path} holds NaN or infinite values; save it with finite values in [0, 1]")
        if mode == "F" and values.size and (values.min() < 0 or values.max() > 1):
            raise LoadError(f"image {path} holds float values in [{values.min():.4g}, {values.max():.4g}], not "
                            "[0, 1]; save it scaled to [0, 1], or as an 8- or 16-bit image")
        if mode != "F" and values.size and (values.min() < 0 or values.max() > 65535):
            raise LoadError(f"image {path} holds integer values in [{values.min():.0f}, {values.max():.0f}], "
                            "beyond 16 bits (0 to 65535); save it as an 8- or 16-bit image")
        grey = torch.from_numpy((values if mode == "F" else values / 65535.0).astype(np.float32))
        return grey[None].expand(3, -1, -1).contiguous()
    array = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def read_image(path: str | os.PathLike[str]) -> torch.Tensor:
    """The image file as 3 x H x W in [0, 1] (turned as its EXIF note says); one line naming a file
    Pillow cannot decode.

    Example:
        >>> import os, tempfile
        >>> bad = os.path.join(tempfile.mkdtemp(), "bad.png")
        >>> _ = open(bad, "w").write("not an image")
        >>> read_image(bad)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: cannot read image .../bad.png: cannot identify image file '.../bad.png'; give a PNG, JPEG or another image format Pillow reads
    """
    path = os.fspath(path)
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise LoadError("reading images needs Pillow: pip install pillow (or hookscope[viz])") from None
    if not os.path.isfile(path):
        raise LoadError(f"no such image file: {path}")
    try:
        with Image.open(path) as im:  # a phone's photo is stored sideways with an EXIF note to turn it
            return _from_pil(ImageOps.exif_transpose(im), path)
    except LoadError:
        raise
    except OSError as e:
        if e.strerror:  # the file system's refusal (permissions...), not the picture's content
            raise LoadError(f"cannot read image {path}: {e.strerror}") from e
        raise _undecodable(path, e) from e
    except Exception as e:  # Pillow fails in many ways on a broken file (SyntaxError, ValueError...)
        raise _undecodable(path, e) from e


def _undecodable(path: str, e: Exception) -> LoadError:
    said = first_line(e) or type(e).__name__
    return LoadError(f"cannot read image {path}: {said}; give a PNG, JPEG or another image format Pillow reads")


def _same_size(inputs: list[torch.Tensor], paths: list[str]) -> None:
    first = inputs[0].shape[-2:]
    for x, path in zip(inputs, paths):
        if x.shape[-2:] != first:
            raise LoadError(f"the images differ in size ({paths[0]} is {first[0]}x{first[1]}, {path} is "
                            f"{x.shape[-2]}x{x.shape[-1]}) and the model's input size is unknown; give "
                            f"{_words()['size']}")


@checked
def load_images(spec: str, paths: str | Sequence[str], *, weights: str | None = None, config: str | None = None,
                preset: str = "auto", size: str | Sequence[int] | None = None) -> Images:
    """Image files and folders (read in name order) as a batch for the model ``spec`` names, made by
    :func:`image_transform` (the model library's own transform wherever it has one).

    Args:
        spec: the model, as :func:`~hookscope.load_model` names it.
        paths: image files and folders of them.
        weights: a torchvision weight name whose ``transforms()`` make the input.
        config: an ``hf:`` model's folder, whose ``preprocessor_config.json`` makes the input.
        preset: ``auto``, ``imagenet``, ``demo`` or ``none`` (see :func:`image_transform`).
        size: ``(H, W)``: resize every image to exactly this size.

    Example:
        >>> import os, tempfile
        >>> from PIL import Image
        >>> folder = tempfile.mkdtemp()
        >>> Image.new("RGB", (80, 60), (255, 0, 0)).save(os.path.join(folder, "red.png"))
        >>> batch = load_images("demo", folder)
        >>> tuple(batch.x.shape), batch.names, [round(v, 4) for v in batch.x[0, :, 0, 0].tolist()]
        ((1, 3, 64, 64), ['red.png'], [1.0, 0.0, 0.0])
    """
    transform = image_transform(spec, weights=weights, config=config, preset=preset, size=size)
    found = image_files(paths)
    if not found:
        raise LoadError(f"give an image with {_words()['image']} (a file or a folder of images)")
    n = f"{len(found)} image{'s' if len(found) > 1 else ''}"
    at = f"{transform.size[0]}x{transform.size[1]}" if transform.size is not None else "their own size"
    if transform.size is not None:  # a huge size fails in one line here, not deep in the resizing
        check_fits((len(found), 3, *transform.size), f"{n} at {at}", fix=f"give a smaller {_words()['smaller']}")
    own = transform.runs is None  # hookscope's resize: the pictures are kept as resized, before normalising
    try:
        made = [transform.resized(read_image(p)) if own else transform(read_image(p)) for p in found]
        _same_size(made, found)
        batch = torch.stack(made)
    except LoadError:
        raise
    except (RuntimeError, MemoryError) as e:  # fits in memory on paper, but the allocation failed
        raise LoadError(f"{n} at {at} cannot be held in memory ({first_line(e) or type(e).__name__}); give a "
                        f"smaller {_words()['smaller']}") from e
    x, pictures = (transform.normalise(batch), batch.clamp(0, 1)) if own else (batch, transform.pictures(batch))
    return Images(x, pictures, [os.path.basename(p) for p in found], found, transform)
