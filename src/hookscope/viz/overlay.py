"""Blend a saliency map over its image and save it as a PNG.

Takes tensors and pictures only: nothing here registers a hook or imports an analysis module.
matplotlib (colormaps) and pillow (image files) are imported when first needed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any, Union

import torch
import torch.nn.functional as F

from ..errors import HookscopeError, did_you_mean

__all__ = ["as_image", "overlay", "save_overlay"]

ImageLike = Union[torch.Tensor, "os.PathLike[str]", str, Any]  # Any: a PIL.Image.Image


def _need(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise HookscopeError(
            f"drawing overlays needs {module.split('.')[0]}, from the viz extra: pip install 'hookscope[viz]'"
        ) from None


def as_image(image: ImageLike) -> torch.Tensor:
    """An image file, PIL image or tensor as a 3 x H x W float tensor in [0, 1] on the CPU.

    Grey images (1 x H x W or H x W) are repeated over 3 channels, ``uint8`` tensors divided by 255.
    16-bit pictures (PIL modes ``I;16`` and ``I``) are divided by 65535; float pictures (mode ``F``)
    are taken as they are and must lie in [0, 1].

    Example:
        >>> as_image(torch.full((1, 2, 2), 255, dtype=torch.uint8)).shape
        torch.Size([3, 2, 2])
    """
    if isinstance(image, (str, os.PathLike)):
        pil = _need("PIL.Image")
        if not os.path.isfile(image):
            raise HookscopeError(f"no such image file: {os.fspath(image)}")
        ops = _need("PIL.ImageOps")
        with pil.open(image) as im:  # a phone's photo is stored sideways with an EXIF note to turn it
            return _from_pil(ops.exif_transpose(im), f"image {os.fspath(image)}")
    if not isinstance(image, torch.Tensor):
        if not (hasattr(image, "convert") and hasattr(image, "size")):
            raise HookscopeError(
                f"image must be a 3 x H x W tensor in [0, 1], a PIL image or a file path, "
                f"not {type(image).__name__}"
            )
        return _from_pil(image, f"the PIL image (mode {getattr(image, 'mode', '?')})")
    t = image.detach().to("cpu")
    if t.dim() == 4 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 2:
        t = t[None]
    if t.dim() != 3 or t.shape[0] not in (1, 3):
        raise HookscopeError(
            f"image tensor of shape {tuple(image.shape)} is not 3 x H x W (or 1 x H x W); pass one image"
        )
    if t.dtype == torch.uint8:
        t = t.float() / 255.0
    t = t.float()
    if t.numel() and (t.min() < 0 or t.max() > 1):
        raise HookscopeError(
            f"image values span [{float(t.min()):.3g}, {float(t.max()):.3g}], not [0, 1]; undo the "
            "input normalisation first (x * std + mean)"
        )
    return t.expand(3, -1, -1)


# Pillow's modes whose values are not 8-bit: convert("RGB") would clip them to 255, not scale them
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _from_pil(im: Any, name: str) -> torch.Tensor:
    """A PIL image as 3 x H x W in [0, 1]: 8-bit modes through RGB, 16-bit scaled, float kept."""
    import numpy as np

    mode = str(im.mode)
    if mode in _SIXTEEN_BIT or mode == "F":
        values = np.asarray(im).astype(np.float64)
        if mode == "F":
            _check_float(values, name)
        else:
            _check_sixteen(values, name)
            values = values / 65535.0
        grey = torch.from_numpy(values.astype(np.float32))
        return grey[None].expand(3, -1, -1).contiguous()
    array = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _check_float(values: Any, name: str) -> None:
    import numpy as np

    if not np.isfinite(values).all():
        raise HookscopeError(f"{name} holds NaN or infinite values; save it with finite values in [0, 1]")
    if values.size and (values.min() < 0 or values.max() > 1):
        raise HookscopeError(f"{name} holds float values in [{values.min():.4g}, {values.max():.4g}], not [0, 1]; "
                             "save it scaled to [0, 1], or as an 8- or 16-bit image")


def _check_sixteen(values: Any, name: str) -> None:
    """Mode ``I`` holds 32-bit integers; only those a 16-bit picture holds are read as one."""
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise HookscopeError(f"{name} holds integer values in [{values.min():.0f}, {values.max():.0f}], beyond "
                             "16 bits (0 to 65535); save it as an 8- or 16-bit image")


def _map_tensor(cam_map: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The map as H x W in [0, 1] at ``size``: kept as is if already in [0, 1], else min-max scaled."""
    if not isinstance(cam_map, torch.Tensor):
        raise HookscopeError(f"cam_map must be an H x W tensor, not {type(cam_map).__name__}")
    m = cam_map.detach().to("cpu", torch.float32)
    while m.dim() > 2 and m.shape[0] == 1:
        m = m[0]
    if m.dim() != 2:
        raise HookscopeError(
            f"cam_map of shape {tuple(cam_map.shape)} is not one H x W map; pass result.maps[i]"
        )
    lo, hi = m.min(), m.max()
    if lo < 0 or hi > 1:
        m = (m - lo) / (hi - lo) if hi > lo else torch.zeros_like(m)
    if tuple(m.shape) != size:
        m = F.interpolate(m[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    return m.clamp(0, 1)


def overlay(image: ImageLike, cam_map: torch.Tensor, *, alpha: float = 0.5, colormap: str = "jet") -> torch.Tensor:
    """``(1 - alpha) * image + alpha * colormap(cam_map)``, as a 3 x H x W float tensor in [0, 1].

    The map is resized (bilinear) to the image; a map already in ``[0, 1]`` is used as it is,
    any other is min-max normalised first.

    Args:
        image: a 3 x H x W (or 1 x H x W) float tensor in [0, 1], a PIL image, or an image file path.
        cam_map: an H x W map (any size; ``result.maps[i]`` of :func:`hookscope.cam`).
        alpha: weight of the coloured map, from 0 (image only) to 1 (map only).
        colormap: a matplotlib colormap name.

    Example:
        >>> out = overlay(torch.zeros(3, 4, 4), torch.ones(2, 2), alpha=1.0)
        >>> [round(v, 2) for v in out[:, 0, 0].tolist()]   # jet's top colour: dark red
        [0.5, 0.0, 0.0]
    """
    if not 0 <= alpha <= 1:
        raise HookscopeError(f"alpha={alpha!r} must be between 0 (image only) and 1 (map only)")
    mpl = _need("matplotlib")
    names = list(mpl.colormaps)
    if colormap not in names:
        raise HookscopeError(f"colormap {colormap!r} is not a matplotlib colormap.{did_you_mean(colormap, names)}")
    img = as_image(image)
    heat_map = _map_tensor(cam_map, (img.shape[1], img.shape[2]))
    rgba = mpl.colormaps[colormap](heat_map.numpy())  # H x W x 4, floats in [0, 1]
    heat = torch.from_numpy(rgba[..., :3]).to(torch.float32).permute(2, 0, 1)
    return (1 - alpha) * img + alpha * heat


def save_overlay(
    image: ImageLike, cam_map: torch.Tensor, path: str | os.PathLike[str], *, alpha: float = 0.5, colormap: str = "jet"
) -> Path:
    """Save the map blended over the image as a PNG (see :func:`overlay`); returns the path.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "overlay.png")  # for a CAM: result.maps[0]
        >>> save_overlay(torch.rand(3, 8, 8), torch.rand(8, 8), path).name
        'overlay.png'
    """
    blended = overlay(image, cam_map, alpha=alpha, colormap=colormap)
    pil = _need("PIL.Image")
    array = (blended.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    out = Path(path)
    if out.parent and not out.parent.exists():
        raise HookscopeError(f"cannot write {out}: the folder {out.parent} does not exist")
    # written under a fresh name and renamed: a crash, or an output that is an input under another
    # name (a hard link), never leaves a half-written file in place of the old one
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            pil.fromarray(array).save(f, format="PNG")
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone already after a successful rename
    return out
