"""Grids as arrays: tiles laid out with the package's tile geometry, red frames around tiles, and tiles
blended over the input picture. numpy and torch only: nothing here draws a figure."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import HookscopeError
from ._tiles import kinds_of, normalised, paint, to_uint8

__all__ = ["RED", "WHITE", "assemble", "blend", "check_pad", "columns_for", "frame_tiles", "origins", "overlaid",
           "pca_rgb", "upsampled_kinds"]

WHITE = 255
RED = np.array([255, 0, 0], dtype=np.uint8)

_OVERLAY_PIXELS = 2_000_000  # overlay tiles per image at most: 512 tiles of 224 x 224 would be 26M


# --- grids as arrays ------------------------------------------------------------------------------------
def columns_for(k: int, columns: int | None) -> int:
    if columns is None:
        return max(1, math.ceil(math.sqrt(k)))
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise HookscopeError(f"columns={columns!r} must be a whole number of tiles per row, at least 1")
    return min(columns, k)


def assemble(tiles: np.ndarray, columns: int, pad: int) -> np.ndarray:
    """``K x h x w x ch`` uint8 tiles -> one ``H x W x ch`` grid (see the module's tile geometry)."""
    k, h, w, ch = tiles.shape
    rows = math.ceil(k / columns)
    cells = np.full((rows * columns, h + pad, w + pad, ch), WHITE, dtype=np.uint8)
    cells[:k, :h, :w] = tiles
    body = cells.reshape(rows, columns, h + pad, w + pad, ch).transpose(0, 2, 1, 3, 4)
    grid = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, ch), WHITE, dtype=np.uint8)
    grid[pad:, pad:] = body.reshape(rows * (h + pad), columns * (w + pad), ch)
    return grid


def origins(k: int, columns: int, h: int, w: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-left pixel (y, x) of each of ``k`` tiles."""
    r, c = np.divmod(np.arange(k), columns)
    return pad + r * (h + pad), pad + c * (w + pad)


def frame_tiles(grid: np.ndarray, marked: np.ndarray, columns: int, h: int, w: int, pad: int) -> None:
    """Draw a 1-pixel red frame just outside each marked tile (in the gap: ``pad >= 2`` keeps frames
    of neighbouring tiles apart)."""
    ys, xs = origins(len(marked), columns, h, w, pad)
    ys, xs = ys[marked], xs[marked]
    across, down = np.arange(-1, w + 1), np.arange(-1, h + 1)
    rows = np.concatenate([np.repeat(ys - 1, w + 2), np.repeat(ys + h, w + 2),
                           (ys[:, None] + down).ravel(), (ys[:, None] + down).ravel()])
    cols = np.concatenate([(xs[:, None] + across).ravel(), (xs[:, None] + across).ravel(),
                           np.repeat(xs - 1, h + 2), np.repeat(xs + w, h + 2)])
    grid[rows, cols] = RED


def check_pad(pad: int, least: int = 0) -> None:
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < least:
        raise HookscopeError(f"pad={pad!r} must be a whole number of pixels, at least {least}")


def upsampled_kinds(kinds: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``K x h x w`` kinds of value enlarged to ``K x size`` (nearest: a kind does not blend)."""
    if not kinds.any():
        return np.zeros((kinds.shape[0], *size), dtype=np.uint8)
    up = F.interpolate(torch.from_numpy(kinds)[:, None].float(), size=size, mode="nearest")[:, 0]
    out: np.ndarray = up.to(torch.uint8).numpy()
    return out


def blend(heat: np.ndarray, picture: torch.Tensor, alpha: float) -> np.ndarray:
    """``(1 - alpha) * picture + alpha * heat`` for ``K x H' x W' x 3`` uint8 heat, the picture resized to it."""
    size = heat.shape[1:3]
    under = F.interpolate(picture[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    blended = (1 - alpha) * under.permute(1, 2, 0)[None] + alpha * torch.from_numpy(heat).float() / 255
    return to_uint8(blended.clamp(0, 1))


def overlaid(tiles: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, lut: np.ndarray, picture: torch.Tensor,
              alpha: float) -> np.ndarray:
    """``K x h x w`` tiles normalised on (lo, hi), upsampled to the picture (scaled to a pixel budget)
    and blended: ``(1 - alpha) * picture + alpha * colour``, the colour the colormap's or, for a
    non-finite value, its fixed one; as ``K x H' x W' x 3`` uint8."""
    k, (height, width) = tiles.shape[0], picture.shape[-2:]
    shrink = min(1.0, math.sqrt(_OVERLAY_PIXELS / (k * height * width)))
    size = (max(tiles.shape[1], round(height * shrink)), max(tiles.shape[2], round(width * shrink)))
    values = normalised(tiles, lo, hi).float()
    up = F.interpolate(values[:, None], size=size, mode="bilinear", align_corners=False)[:, 0].clamp(0, 1)
    return blend(paint(lut[to_uint8(up)], upsampled_kinds(kinds_of(tiles), size)), picture, alpha)


def pca_rgb(rgb_tiles: torch.Tensor, kinds: np.ndarray, picture: torch.Tensor | None, alpha: float | None) -> np.ndarray:
    """PCA tiles (``1 x h x w x 3``), non-finite pixels in their fixed colours, blended over the picture
    when asked."""
    if picture is None or alpha is None:
        return paint(to_uint8(rgb_tiles), kinds)
    size = (int(picture.shape[-2]), int(picture.shape[-1]))
    up = F.interpolate(rgb_tiles.permute(0, 3, 1, 2), size=size, mode="bilinear", align_corners=False)
    return blend(paint(to_uint8(up.clamp(0, 1).permute(0, 2, 3, 1)), upsampled_kinds(kinds, size)), picture,
                  alpha)

