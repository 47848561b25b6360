"""Feature maps as pictures: a grid of channel tiles, channel reductions, and the in-place trap's comparison.

Takes :class:`~hookscope.analysis.features.FeatureMaps` (or a ``B x C x h x w`` tensor) and
:class:`~hookscope.analysis.features.ReferenceComparison`; nothing here registers a hook. A grid
is built as one array with tensor and numpy operations (no loop over pixels or channels) and
drawn with one ``imshow`` per image, so a 512-channel layer renders in a fraction of a second.
Figures are built on their own Agg canvas, without pyplot. matplotlib and Pillow come from the viz
extra and are imported when a picture is drawn or saved.

Tile geometry (every grid here): ``K`` tiles of ``h x w`` laid out row by row, ``columns`` per row
(default ``ceil(sqrt(K))``), with ``pad`` pixels of gap between tiles and around the grid; tile
``j`` has its top-left pixel at ``(pad + (j // columns) * (h + pad), pad + (j % columns) * (w + pad))``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..analysis.features import BY, FeatureMaps, ReferenceComparison
from ..errors import HookscopeError, did_you_mean

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["NON_FINITE", "REDUCTIONS", "SCALES", "comparison_grid", "feature_grid", "plot_feature_maps",
           "plot_reference_comparison", "save_feature_maps"]

SCALES = ("shared", "channel")
REDUCTIONS = ("mean", "max", "pca")
_WHITE = 255
_RED = np.array([255, 0, 0], dtype=np.uint8)
# Values no colour scale holds get fixed colours, none of them in viridis nor the frames' red: row k is
# the colour of kind k (0: finite, never used; 1: NaN; 2: +Inf; 3: -Inf).
_BAD = np.array([[0, 0, 0], [255, 0, 255], [0, 255, 255], [0, 0, 255]], dtype=np.uint8)
NON_FINITE = "NaN magenta, +Inf cyan, -Inf blue"  # what the figures' titles say of them
_OVERLAY_PIXELS = 2_000_000  # overlay tiles per image at most: 512 tiles of 224 x 224 would be 26M
_DPI = 100
_MAX_ROWS = 16  # images in one figure


def _need(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise HookscopeError(f"drawing feature maps needs {module.split('.')[0]}, from the viz extra: "
                             "pip install 'hookscope[viz]'") from None


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# --- choosing and scaling tiles ----------------------------------------------------------------------
def _spatial(layer: str, h: int, w: int) -> None:
    """Refuse maps of one pixel: a pooled layer's channels are numbers, not pictures."""
    if h * w == 1:
        raise HookscopeError(f"layer {layer!r} gives 1x1 maps: no spatial extent to draw (a pooled or flattened "
                             "layer); pick an earlier layer, whose maps are h x w with more than one pixel")


def _as_result(maps: FeatureMaps | torch.Tensor) -> FeatureMaps:
    if isinstance(maps, FeatureMaps):
        res = maps
    elif isinstance(maps, torch.Tensor) and maps.ndim in (3, 4) and maps.shape[-1] * maps.shape[-2] > 0:
        t = maps.detach().to("cpu", torch.float32)
        res = FeatureMaps(t if t.ndim == 4 else t[None], "maps")
    else:
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise HookscopeError(f"maps of shape {shape} are not feature maps; pass hookscope.analysis.features."
                             "feature_maps(...)'s result or a B x C x h x w (or C x h x w) tensor")
    _spatial(res.layer, res.maps.shape[2], res.maps.shape[3])
    return res


def _image_index(batch: int, image: int) -> int:
    if isinstance(image, bool) or not isinstance(image, int) or not -batch <= image < batch:
        raise HookscopeError(f"image={image!r} is out of range: the batch holds {batch} image(s), 0 to {batch - 1}")
    return image % batch


def _check_choice(value: str | None, name: str, allowed: tuple[str, ...], none_ok: bool = False) -> None:
    if (value is None and none_ok) or value in allowed:
        return
    hint = did_you_mean(value, allowed) if isinstance(value, str) else ""
    raise HookscopeError(f"{name}={value!r} is not one of {', '.join(allowed)}{' (or None)' if none_ok else ''}.{hint}")


def _channels(res: FeatureMaps, channels: Sequence[int] | None, top_k: int | None, by: str,
              image: int | None) -> list[int]:
    """The channels to show, in order: chosen, the top ``top_k`` (largest first), or all."""
    count = res.maps.shape[1]
    if channels is not None and top_k is not None:
        raise HookscopeError("give either channels= or top_k=, not both")
    if top_k is not None:
        return res.top(top_k, by=by, image=image)
    if channels is None:
        return list(range(count))
    chosen = [channels] if isinstance(channels, int) else list(channels)
    if not chosen:
        raise HookscopeError("channels= is empty; give at least one channel index")
    for c in chosen:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < count:
            raise HookscopeError(f"channel {c!r} is out of range: layer {res.layer!r} has {count} channels, "
                                 f"0 to {count - 1}")
    return [int(c) for c in chosen]


def _mean(tiles: torch.Tensor) -> tuple[torch.Tensor, str]:
    return tiles.mean(0, keepdim=True), f"mean of {_plural(tiles.shape[0], 'channel')}"


def _max(tiles: torch.Tensor) -> tuple[torch.Tensor, str]:
    return tiles.amax(0, keepdim=True), f"max of {_plural(tiles.shape[0], 'channel')}"


def _pca_tile(tiles: torch.Tensor) -> tuple[torch.Tensor, str]:
    rgb, ratios = _pca(tiles)
    what = f"PCA of {_plural(tiles.shape[0], 'channel')}: "
    if not ratios or max(ratios) == 0:
        return rgb[None], what + "no variance (every pixel alike)"
    n = len(ratios)
    colours = ", ".join("RGB"[:n])
    which = "component 1" if n == 1 else f"components 1-{n}"
    shares = ", ".join(f"{r:.0%}" for r in ratios)
    common = ", on component 1's range" if n > 1 else ""
    return rgb[None], f"{what}{colours} = {which} ({shares} of the variance{common})"


def _reduce(tiles: torch.Tensor, how: str | None) -> tuple[torch.Tensor, str]:
    """(``K' x h x w`` tiles, or ``1 x h x w x 3`` in [0, 1] for PCA; what the reduction shows)."""
    return _REDUCERS[how](tiles) if how is not None else (tiles, "")


def _pca(tiles: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """The first 3 principal components of the channels, pixels as samples: ``h x w x 3`` in [0, 1],
    and each one's share of the variance (one per component there is).

    All three are scaled by one range, the first component's min to max, clamped to [0, 1], so a
    component carrying little variance stays nearly flat; each one's sign makes its loadings sum to
    >= 0 (a PCA's sign is arbitrary: this one is reproducible). A component that does not exist (fewer
    than 3 channels or pixels) is 0. Pixels with a non-finite value in any channel are left out of
    the fit and are 0 here (the callers paint them).
    """
    k, h, w = tiles.shape
    x = tiles.double().flatten(1).T  # pixels x channels
    good = torch.isfinite(x).all(1)
    fit = x[good] - x[good].mean(0) if bool(good.any()) else x.new_zeros(0, k)
    _, s, vh = torch.linalg.svd(fit, full_matrices=False)
    n = min(3, s.numel())
    signs = torch.where(vh[:n].sum(1) < 0, -1.0, 1.0).to(x.dtype)
    comps = fit @ vh[:n].T * signs
    rgb = torch.zeros(h * w, 3, dtype=x.dtype)
    if n:
        lo, hi = comps[:, 0].amin(), comps[:, 0].amax()
        if hi - lo > 1e-12 * (1 + hi.abs()):  # below that, rounding noise: a flat picture says it
            rgb[good, :n] = ((comps - lo) / (hi - lo)).clamp(0, 1)
    energy = s.square()
    total = float(energy.sum())
    ratios = [float(e) / total if total > 0 else 0.0 for e in energy[:n].tolist()]
    return rgb.T.reshape(3, h, w).permute(1, 2, 0).float(), ratios


# each reduction: K x h x w tiles -> (its tile(s), what it shows); one entry per name in REDUCTIONS
_REDUCERS = {"mean": _mean, "max": _max, "pca": _pca_tile}


def _finite_range(t: torch.Tensor, dims: tuple[int, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of the finite values over ``dims`` (None: all), kept as broadcastable tensors."""
    finite = torch.isfinite(t)
    lo = torch.where(finite, t, torch.inf)
    hi = torch.where(finite, t, -torch.inf)
    if dims is None:
        return lo.amin(), hi.amax()
    return lo.amin(dims, keepdim=True), hi.amax(dims, keepdim=True)


def _normalised(t: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``(t - lo) / (hi - lo)`` clamped to [0, 1]; where ``hi <= lo`` (a constant tile), 0; +Inf 1,
    -Inf and NaN 0. In float64: ``hi - lo`` of float32 values near 3e38 overflows float32."""
    t, lo, hi = t.double(), lo.double(), hi.double()
    ok = hi > lo
    span = torch.where(ok, hi - lo, torch.ones_like(hi))
    out = torch.where(ok, (t - torch.where(torch.isfinite(lo), lo, 0.0)) / span, 0.0)
    out = torch.where(t == torch.inf, 1.0, out)
    return torch.nan_to_num(out, nan=0.0, posinf=1.0, neginf=0.0).clamp(0, 1)


def _kinds(t: torch.Tensor) -> np.ndarray:
    """Each value's kind as a row of ``_BAD``: 0 finite, 1 NaN, 2 +Inf, 3 -Inf (``uint8``, t's shape)."""
    kind = torch.zeros(t.shape, dtype=torch.uint8)
    kind[t == -torch.inf] = 3
    kind[t == torch.inf] = 2
    kind[t.isnan()] = 1
    out: np.ndarray = kind.numpy()
    return out


def _pixel_kinds(tiles: torch.Tensor) -> np.ndarray:
    """For a PCA of ``K x h x w`` tiles, each pixel's kind (``1 x h x w``): NaN if a channel is NaN,
    else +Inf if one is +Inf, else -Inf if one is -Inf."""
    kinds = _kinds(tiles)
    out = np.zeros((1, *kinds.shape[1:]), dtype=np.uint8)
    for code in (3, 2, 1):  # the last written wins: NaN over +Inf over -Inf
        out[0][(kinds == code).any(0)] = code
    return out


def _paint(rgb: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """``rgb`` (``... x 3`` uint8) with each non-finite value's pixel in its fixed colour."""
    bad = kinds > 0
    if bad.any():
        rgb = rgb.copy()
        rgb[bad] = _BAD[kinds[bad]]
    return rgb


def _coloured(tiles: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, lut: np.ndarray) -> np.ndarray:
    """Tiles normalised on (lo, hi) through the colormap, non-finite values in their fixed colours."""
    return _paint(lut[_to_uint8(_normalised(tiles, lo, hi))], _kinds(tiles))


def _non_finite(t: torch.Tensor) -> str:
    """What a figure's title says of the NaN/Inf values among ``t`` (nothing when there are none)."""
    n = int((~torch.isfinite(t)).sum())
    return f"; {n} NaN/Inf value{'s' if n != 1 else ''} ({NON_FINITE})" if n else ""


def _limits(tiles: list[torch.Tensor], scale: str, vrange: tuple[float, float] | None
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per panel of tiles, the (low, high) each tile is scaled by (see :func:`feature_grid`)."""
    if scale == "channel":
        return [_finite_range(t, (1, 2)) for t in tiles]
    if vrange is not None:
        lo, hi = (torch.tensor(float(v), dtype=torch.float64) for v in vrange)
        return [(lo, hi)] * len(tiles)
    ranges = [_finite_range(t, None) for t in tiles]
    lo = torch.stack([r[0] for r in ranges]).amin()
    hi = torch.stack([r[1] for r in ranges]).amax()
    return [(lo, hi)] * len(tiles)


def _to_uint8(v: torch.Tensor) -> np.ndarray:
    out: np.ndarray = (v * 255).round().to(torch.uint8).numpy()
    return out


# --- grids as arrays ------------------------------------------------------------------------------------
def _columns(k: int, columns: int | None) -> int:
    if columns is None:
        return max(1, math.ceil(math.sqrt(k)))
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise HookscopeError(f"columns={columns!r} must be a whole number of tiles per row, at least 1")
    return min(columns, k)


def _assemble(tiles: np.ndarray, columns: int, pad: int) -> np.ndarray:
    """``K x h x w x ch`` uint8 tiles -> one ``H x W x ch`` grid (see the module's tile geometry)."""
    k, h, w, ch = tiles.shape
    rows = math.ceil(k / columns)
    cells = np.full((rows * columns, h + pad, w + pad, ch), _WHITE, dtype=np.uint8)
    cells[:k, :h, :w] = tiles
    body = cells.reshape(rows, columns, h + pad, w + pad, ch).transpose(0, 2, 1, 3, 4)
    grid = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, ch), _WHITE, dtype=np.uint8)
    grid[pad:, pad:] = body.reshape(rows * (h + pad), columns * (w + pad), ch)
    return grid


def _origins(k: int, columns: int, h: int, w: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-left pixel (y, x) of each of ``k`` tiles."""
    r, c = np.divmod(np.arange(k), columns)
    return pad + r * (h + pad), pad + c * (w + pad)


def _frame(grid: np.ndarray, marked: np.ndarray, columns: int, h: int, w: int, pad: int) -> None:
    """Draw a 1-pixel red frame just outside each marked tile (in the gap: ``pad >= 2`` keeps frames
    of neighbouring tiles apart)."""
    ys, xs = _origins(len(marked), columns, h, w, pad)
    ys, xs = ys[marked], xs[marked]
    across, down = np.arange(-1, w + 1), np.arange(-1, h + 1)
    rows = np.concatenate([np.repeat(ys - 1, w + 2), np.repeat(ys + h, w + 2),
                           (ys[:, None] + down).ravel(), (ys[:, None] + down).ravel()])
    cols = np.concatenate([(xs[:, None] + across).ravel(), (xs[:, None] + across).ravel(),
                           np.repeat(xs - 1, h + 2), np.repeat(xs + w, h + 2)])
    grid[rows, cols] = _RED


def _lut(colormap: str) -> np.ndarray:
    """The colormap as a 256 x 3 uint8 table (grey level -> colour)."""
    mpl = _need("matplotlib")
    names = list(mpl.colormaps)
    if colormap not in names:
        raise HookscopeError(f"colormap {colormap!r} is not a matplotlib colormap.{did_you_mean(colormap, names)}")
    table: np.ndarray = (mpl.colormaps[colormap](np.arange(256))[:, :3] * 255).round().astype(np.uint8)
    return table


def _check_pad(pad: int, least: int = 0) -> None:
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < least:
        raise HookscopeError(f"pad={pad!r} must be a whole number of pixels, at least {least}")


def _check_vrange(vrange: tuple[float, float] | None, scale: str, reduce: str | None) -> None:
    if vrange is None:
        return
    if not (isinstance(vrange, (tuple, list)) and len(vrange) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vrange)):
        raise HookscopeError(f"vrange={vrange!r} is not (low, high): give two finite numbers")
    if not vrange[0] < vrange[1]:
        raise HookscopeError(f"vrange={tuple(vrange)!r} is empty or reversed: low must be below high, "
                             f"e.g. vrange=({min(vrange)!r}, {max(vrange)!r})")
    if scale != "shared":
        raise HookscopeError(f"vrange= sets the one range of scale='shared', but scale={scale!r} scales each "
                             "tile to its own; drop vrange= or pass scale='shared'")
    if reduce == "pca":
        raise HookscopeError("vrange= does not apply to reduce='pca' (its colours are principal components, "
                             "on the first one's range); drop vrange=")


def feature_grid(maps: FeatureMaps | torch.Tensor, *, image: int = 0, channels: Sequence[int] | None = None,
                 top_k: int | None = None, by: str = "mean", scale: str = "shared", reduce: str | None = None,
                 columns: int | None = None, pad: int = 1, vrange: tuple[float, float] | None = None,
                 colormap: str | None = None) -> np.ndarray:
    """One image's channels as one picture: a grid of tiles, as a numpy ``uint8`` array.

    Normalisation, exactly: each tile's value ``v`` becomes the grey level
    ``round(255 * (v - lo) / (hi - lo))`` (computed in float64), clamped to 0..255. With
    ``scale="shared"``, ``lo`` and ``hi`` are the smallest and largest finite values over every tile
    shown (``vrange=(lo, hi)`` sets them instead); with ``scale="channel"``, each tile's own. A tile
    with ``hi == lo`` (constant) is 0. The gaps between tiles are 255 (white).

    Non-finite values never count in ``lo`` and ``hi``. In the grey array, +Inf is 255 (above every
    finite value), -Inf and NaN are 0; with a ``colormap`` (and for ``reduce="pca"``) they get fixed
    colours instead: NaN magenta ``(255, 0, 255)``, +Inf cyan ``(0, 255, 255)``, -Inf blue
    ``(0, 0, 255)`` (a PCA pixel: NaN if any channel is NaN, else +Inf, else -Inf).

    Args:
        maps: a :class:`~hookscope.analysis.features.FeatureMaps`, or a ``B x C x h x w`` (or
            ``C x h x w``) tensor; maps of one pixel (``1 x 1``, a pooled layer) are refused.
        image: which image of the batch.
        channels: the channels to show, in this order (default: all, in order).
        top_k: instead, the ``k`` channels with the largest ``by`` in this image, largest first.
        by: ``"mean"``, ``"max"`` or ``"sum"``: what ``top_k`` ranks by.
        scale: ``"shared"`` or ``"channel"``, as above.
        reduce: ``None`` (a tile per channel), ``"mean"`` or ``"max"`` over the channels shown (one
            tile), or ``"pca"``: the first 3 principal components of the channels shown (pixels with
            a non-finite value left out), as one RGB tile (R = the first), all three scaled by the
            first component's min and max (clamped), so that a weak component looks weak; a
            component that does not exist (fewer than 3 channels) is 0.
        columns: tiles per row (default ``ceil(sqrt(K))``).
        pad: pixels between tiles and around the grid (tile geometry: see the module's docstring).
        vrange: ``(lo, hi)`` with ``lo < hi``, for ``scale="shared"`` only: compare pictures on one scale.
        colormap: a matplotlib colormap name: colour the grey levels (an ``H x W x 3`` array).

    Returns:
        ``H x W`` grey levels; ``H x W x 3`` for ``reduce="pca"`` or with a ``colormap``.

    Example:
        >>> g = feature_grid(torch.arange(8.).view(1, 2, 2, 2), scale="channel")
        >>> g.shape, g[1:3, 1:3].tolist(), g[1:3, 4:6].tolist()
        ((4, 7), [[0, 85], [170, 255]], [[0, 85], [170, 255]])
        >>> feature_grid(torch.tensor([[[[0., 1.], [float("nan"), float("inf")]]]]), pad=0).tolist()
        [[0, 255], [0, 255]]
        >>> feature_grid(torch.rand(1, 5, 4, 4), reduce="pca", pad=0).shape
        (4, 4, 3)
    """
    res = _as_result(maps)
    _check_choice(scale, "scale", SCALES)
    _check_choice(reduce, "reduce", REDUCTIONS, none_ok=True)
    _check_choice(by, "by", BY)
    _check_pad(pad)
    _check_vrange(vrange, scale, reduce)
    i = _image_index(res.maps.shape[0], image)
    raw = res.maps[i, _channels(res, channels, top_k, by, i)]
    tiles, _ = _reduce(raw, reduce)
    if reduce == "pca":
        return _assemble(_paint(_to_uint8(tiles), _pixel_kinds(raw)), 1, pad)
    (lo, hi), = _limits([tiles], scale, vrange)
    if colormap is not None:
        return _assemble(_coloured(tiles, lo, hi, _lut(colormap)), _columns(len(tiles), columns), pad)
    grey = _to_uint8(_normalised(tiles, lo, hi))
    return _assemble(grey[..., None], _columns(len(tiles), columns), pad)[..., 0]


# --- figures ------------------------------------------------------------------------------------------
def _figure(width: float, height: float) -> Figure:
    """An empty figure on its own Agg canvas (no pyplot state)."""
    _need("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _pictures(picture: torch.Tensor | None, shown: list[int], batch: int) -> list[torch.Tensor] | None:
    """One ``3 x H x W`` picture in [0, 1] per image shown (a single picture serves every row)."""
    if picture is None:
        return None
    if not isinstance(picture, torch.Tensor) or picture.ndim not in (3, 4):
        raise HookscopeError("picture= must be a 3 x H x W image in [0, 1], or B x 3 x H x W for a batch")
    p = picture.detach().to("cpu", torch.float32)
    if p.ndim == 4 and p.shape[0] != batch:
        raise HookscopeError(f"picture= holds {p.shape[0]} images but the maps {batch}; pass one per image")
    if p.shape[-3] not in (1, 3):
        raise HookscopeError(f"picture= of shape {tuple(p.shape)} is not 3 x H x W (or 1 x H x W)")
    if p.numel() and (p.min() < 0 or p.max() > 1):
        raise HookscopeError(f"picture= values span [{float(p.min()):.3g}, {float(p.max()):.3g}], not [0, 1]; "
                             "undo the input normalisation first (x * std + mean)")
    return [(p[i] if p.ndim == 4 else p).expand(3, -1, -1) for i in shown]


def _upsampled_kinds(kinds: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``K x h x w`` kinds of value enlarged to ``K x size`` (nearest: a kind does not blend)."""
    if not kinds.any():
        return np.zeros((kinds.shape[0], *size), dtype=np.uint8)
    up = F.interpolate(torch.from_numpy(kinds)[:, None].float(), size=size, mode="nearest")[:, 0]
    out: np.ndarray = up.to(torch.uint8).numpy()
    return out


def _blend(heat: np.ndarray, picture: torch.Tensor, alpha: float) -> np.ndarray:
    """``(1 - alpha) * picture + alpha * heat`` for ``K x H' x W' x 3`` uint8 heat, the picture resized to it."""
    size = heat.shape[1:3]
    under = F.interpolate(picture[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    blended = (1 - alpha) * under.permute(1, 2, 0)[None] + alpha * torch.from_numpy(heat).float() / 255
    return _to_uint8(blended.clamp(0, 1))


def _overlaid(tiles: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, lut: np.ndarray, picture: torch.Tensor,
              alpha: float) -> np.ndarray:
    """``K x h x w`` tiles normalised on (lo, hi), upsampled to the picture (scaled to a pixel budget)
    and blended: ``(1 - alpha) * picture + alpha * colour``, the colour the colormap's or, for a
    non-finite value, its fixed one; as ``K x H' x W' x 3`` uint8."""
    k, (height, width) = tiles.shape[0], picture.shape[-2:]
    shrink = min(1.0, math.sqrt(_OVERLAY_PIXELS / (k * height * width)))
    size = (max(tiles.shape[1], round(height * shrink)), max(tiles.shape[2], round(width * shrink)))
    values = _normalised(tiles, lo, hi).float()
    up = F.interpolate(values[:, None], size=size, mode="bilinear", align_corners=False)[:, 0].clamp(0, 1)
    return _blend(_paint(lut[_to_uint8(up)], _upsampled_kinds(_kinds(tiles), size)), picture, alpha)


def _rgb(rgb_tiles: torch.Tensor, kinds: np.ndarray, picture: torch.Tensor | None, alpha: float | None) -> np.ndarray:
    """PCA tiles (``1 x h x w x 3``), non-finite pixels in their fixed colours, blended over the picture
    when asked."""
    if picture is None or alpha is None:
        return _paint(_to_uint8(rgb_tiles), kinds)
    size = (int(picture.shape[-2]), int(picture.shape[-1]))
    up = F.interpolate(rgb_tiles.permute(0, 3, 1, 2), size=size, mode="bilinear", align_corners=False)
    return _blend(_paint(_to_uint8(up.clamp(0, 1).permute(0, 2, 3, 1)), _upsampled_kinds(kinds, size)), picture,
                  alpha)


@dataclass
class _Panel:
    """One grid drawn in one axes: the array, where its tiles are, which channels they show."""

    grid: np.ndarray
    channels: list[int]  # empty: one reduced tile, described by the title
    columns: int
    tile: tuple[int, int]  # tile height and width in the grid's pixels
    pad: int
    title: str = ""


_TEXT_LABELS = 64  # above this, a run of channels in order is labelled by row and column (text is slow)


def _by_row(channels: list[int]) -> bool:
    """Label by row and column: a long run of channels in order."""
    return len(channels) > _TEXT_LABELS and channels == list(range(channels[0], channels[0] + len(channels)))


def _label_tiles(ax: Axes, panel: _Panel, size: float, colors: Sequence[str] | None = None) -> None:
    """Each tile's channel index in its top-left corner, or, for a long run of channels in order,
    the first channel of each row and the offset of each column (one text per tile costs ~0.6 ms to
    draw: 0.3 s for 512 tiles)."""
    chans, (h, w), pad, cols = panel.channels, panel.tile, panel.pad, panel.columns
    if not chans:
        return
    ys, xs = _origins(len(chans), cols, h, w, pad)
    if _by_row(chans):
        ax.set_axis_on()
        ax.set_frame_on(False)
        ax.tick_params(length=0, labelsize=size, pad=1)
        ax.xaxis.tick_top()
        ax.set_xticks((xs[:cols] + (w - 1) / 2).tolist(), [f"+{c}" for c in range(cols)])
        ax.set_yticks((ys[::cols] + (h - 1) / 2).tolist(), [str(c) for c in chans[::cols]])
        ax.set_ylabel("channel = row + column", fontsize=size)
        return
    for j, (y, x, c) in enumerate(zip(ys.tolist(), xs.tolist(), chans)):
        back = colors[j] if colors else "black"
        ax.text(x - 0.5, y - 0.5, str(c), fontsize=size, color="white", va="top", ha="left",
                bbox={"boxstyle": "square,pad=0.05", "facecolor": back, "alpha": 0.5 if back == "black" else 0.85,
                      "linewidth": 0})


def _show(ax: Axes, panel: _Panel, size: float, colors: Sequence[str] | None = None) -> None:
    ax.imshow(panel.grid, interpolation="nearest")
    ax.set_axis_off()
    if panel.title:
        ax.set_title(panel.title, fontsize=9)
    _label_tiles(ax, panel, size, colors)


_TITLE_PT = 10  # the figure title's font size
_CHAR_EM = 0.6  # a title character's width in ems, on the wide side (DejaVu Sans averages ~0.55)


def _wrapped(title: str, width_in: float) -> list[str]:
    """The title's lines, each short enough to fit ``width_in`` inches (a narrow figure clips one long line)."""
    import textwrap

    chars = max(20, int((width_in - 0.2) * 72 / (_TITLE_PT * _CHAR_EM)))
    return [part for line in title.splitlines() or [""] for part in textwrap.wrap(line, chars) or [""]]


def _layout(rows: int, per_row: int, grid_hw: tuple[int, int], columns: int, picture: bool, bar: bool,
            title: str, ticks: bool = False) -> tuple[Figure, list[list[Axes]], list[Axes], Axes | None]:
    """A figure with ``rows`` rows of [picture] ``per_row`` grids, a colour bar on the right, and
    ``title`` on top, wrapped to the figure's width.

    Axes are placed by hand in inches (fast and exact: no layout engine over hundreds of labels).
    """
    gh, gw = grid_hw
    width = min(14.0 / per_row, max(4.0, columns * 1.2))  # about 1.2 inches per tile, within a page
    height = width * gh / gw
    tallest = min(10.0, 40.0 / rows)  # a row on a screen, the figure within 4000 pixels
    if height > tallest:
        width, height = width * tallest / height, tallest
    left = min(height, 4.0 if per_row == 1 else 3.0) if picture else 0.0  # the input, beside the grids
    gap = 0.5 if ticks else 0.15  # room for row labels
    fig_w = left + per_row * (width + gap) + (1.1 if bar else 0.15)
    lines = _wrapped(title, fig_w)
    top, row_h = 0.1 + 0.2 * len(lines) + 0.3, height + 0.35  # the title's lines, then the grids' own titles
    fig_h = rows * row_h + top
    fig = _figure(fig_w, fig_h)
    fig.suptitle("\n".join(lines), fontsize=_TITLE_PT, y=1 - 0.1 / fig_h, va="top")
    grids: list[list[Axes]] = []
    pics: list[Axes] = []
    for r in range(rows):
        y = (fig_h - top - (r + 1) * row_h + 0.05) / fig_h
        grids.append([fig.add_axes(((left + gap + k * (width + gap)) / fig_w, y, width / fig_w, height / fig_h))
                      for k in range(per_row)])
        if picture:
            pics.append(fig.add_axes((0.1 / fig_w, y, (left - 0.15) / fig_w, height / fig_h)))
    right = left + per_row * (width + gap) + 0.25
    cax = fig.add_axes((right / fig_w, 0.4 / fig_h, 0.2 / fig_w, max(0.1, fig_h - top - 0.8) / fig_h),
                       label="<colorbar>") if bar else None  # the label matplotlib gives its own colour bars
    return fig, grids, pics, cax


def _colour_bar(fig: Figure, cax: Axes, lo: float, hi: float, colormap: str) -> None:
    colors = _need("matplotlib.colors")
    cm = _need("matplotlib.cm")
    mappable = cm.ScalarMappable(norm=colors.Normalize(lo, hi if hi > lo else lo + 1), cmap=colormap)
    fig.colorbar(mappable, cax=cax)
    cax.set_title("value", fontsize=8)


def _font(width_px: float) -> float:
    """Label size in points for tiles ``width_px`` wide on the figure."""
    return float(min(10.0, max(5.0, width_px / 6)))


def _show_picture(ax: Axes, picture: torch.Tensor, label: str) -> None:
    ax.imshow(_to_uint8(picture.permute(1, 2, 0).clamp(0, 1)), interpolation="bilinear")
    ax.set_axis_off()
    ax.set_title(label, fontsize=9)


def _values(tiles: list[torch.Tensor], scale: str
            ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[float, float] | None]:
    """Each panel's (lo, hi) as :func:`feature_grid` documents, and the shared (lo, hi) if shared."""
    limits = _limits(tiles, scale, None)
    lo, hi = limits[0]
    return limits, (float(lo), float(hi)) if scale == "shared" and bool(torch.isfinite(lo)) else None


def _check_alpha(alpha: float | None, pictures: list[torch.Tensor] | None) -> None:
    if alpha is None:
        return
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise HookscopeError(f"overlay_alpha={alpha!r} must be between 0 (picture only) and 1 (maps only)")
    if pictures is None:
        raise HookscopeError("overlay_alpha= blends the maps over the input image: pass picture= too")


def _feature_panels(res: FeatureMaps, shown: list[int], chosen: list[int], reduce: str | None, scale: str,
                    colormap: str, pictures: list[torch.Tensor] | None, alpha: float | None,
                    columns: int | None) -> tuple[list[_Panel], tuple[float, float] | None, str]:
    """One panel per image shown, the colour bar's range when one scale holds for every tile, and
    what a reduction shows."""
    reduced = [_reduce(res.maps[i, chosen], reduce) for i in shown]
    what = reduced[0][1]
    under: list[torch.Tensor | None] = list(pictures) if pictures is not None and alpha is not None else [None] * len(shown)
    if reduce == "pca":
        arrays = [_rgb(t, _pixel_kinds(res.maps[i, chosen]), p, alpha) for i, (t, _), p in zip(shown, reduced, under)]
        bar = None
    else:
        lut = _lut(colormap)
        limits, bar = _values([t for t, _ in reduced], "shared" if reduce else scale)
        arrays = [_overlaid(t, lo, hi, lut, p, alpha if alpha is not None else 0.0) if p is not None
                  else _coloured(t, lo, hi, lut) for (t, _), (lo, hi), p in zip(reduced, limits, under)]
    cols = _columns(arrays[0].shape[0], columns)
    pad = 1 if arrays[0].shape[1] < 64 else 2
    several = len(shown) > 1 and pictures is None
    panels = [_Panel(_assemble(a, cols, pad), [] if reduce else chosen, cols, (a.shape[1], a.shape[2]), pad,
                     f"image {i}" if several else "") for i, a in zip(shown, arrays)]
    return panels, bar, what


def _headline(res: FeatureMaps, shown: list[int], chosen: list[int], top_k: int | None, by: str, scale: str,
              reduced: str, alpha: float | None) -> str:
    count, (h, w) = res.maps.shape[1], res.maps.shape[2:]
    which = f"top {len(chosen)} of {_plural(count, 'channel')} by {by}" if top_k is not None else \
        f"{len(chosen)} of {_plural(count, 'channel')}" if len(chosen) != count else _plural(count, "channel")
    how = f"; {reduced}" if reduced else "; one colour scale" if scale == "shared" else \
        "; each tile scaled to its own min-max"
    over = f"; over the image (alpha {alpha:g})" if alpha is not None else ""
    return f"{res.layer}: {which}, {h}x{w}{how}{over}{_non_finite(res.maps[shown][:, chosen])}"


def plot_feature_maps(result: FeatureMaps | torch.Tensor, *, picture: torch.Tensor | None = None,
                      overlay_alpha: float | None = None, images: Sequence[int] | None = None,
                      channels: Sequence[int] | None = None, top_k: int | None = None, by: str = "mean",
                      scale: str = "shared", reduce: str | None = None, columns: int | None = None,
                      colormap: str = "viridis", title: str | None = None) -> Figure:
    """A figure of a layer's feature maps: a row per image, each a grid of tiles labelled by channel.

    Each row's grid is one array drawn with one ``imshow``, its tiles scaled as in
    :func:`feature_grid`; ``scale="shared"`` uses one range over every tile of every row, shown by
    a colour bar. The input image, when given, is drawn at the left of its row. Non-finite values
    are drawn in fixed colours (NaN magenta, +Inf cyan, -Inf blue, as :func:`feature_grid` with a
    colormap), and the title says how many there are and which colour is which. The title is
    wrapped to the figure's width.

    Args:
        result: a :class:`~hookscope.analysis.features.FeatureMaps` (or ``B x C x h x w`` tensor);
            maps of one pixel (``1 x 1``: a pooled layer) are refused.
        picture: the input image, ``3 x H x W`` in [0, 1] (``B x 3 x H x W``: one per image).
        overlay_alpha: blend each tile, upsampled to the picture, over it:
            ``(1 - alpha) * picture + alpha * colormap(tile)`` (needs ``picture``).
        images: which images of the batch, one row each (default: all).
        channels, top_k, by, scale, reduce, columns: as in :func:`feature_grid`; ``top_k`` ranks
            channels over every image shown together, so that each row shows the same channels.
        colormap: a matplotlib colormap name.
        title: the figure's title (default: the layer, what is shown, how it is scaled, and the
            number of NaN/Inf values if any).

    Returns:
        A ``matplotlib.figure.Figure`` on its own Agg canvas (save it with :func:`save_feature_maps`).

    Example:
        >>> fig = plot_feature_maps(torch.rand(2, 8, 5, 5), top_k=4, picture=torch.rand(2, 3, 20, 20))
        >>> len(fig.axes), fig.axes[0].get_images()[0].get_array().shape
        (5, (13, 13, 3))
    """
    res = _as_result(result)
    for value, name, allowed, none_ok in ((scale, "scale", SCALES, False), (reduce, "reduce", REDUCTIONS, True),
                                           (by, "by", BY, False)):
        _check_choice(value, name, allowed, none_ok)
    batch = res.maps.shape[0]
    shown = [_image_index(batch, i) for i in (images if images is not None else range(batch))]
    if not shown or len(shown) > _MAX_ROWS:
        raise HookscopeError(f"images= gives {len(shown)} images; a figure draws 1 to {_MAX_ROWS} (a row each): "
                             f"pass images=[...] (CLI: fewer --image files or a smaller --input batch)")
    chosen = _channels(FeatureMaps(res.maps[shown], res.layer), channels, top_k, by, None)
    pictures = _pictures(picture, shown, batch)
    _check_alpha(overlay_alpha, pictures)
    panels, bar, what = _feature_panels(res, shown, chosen, reduce, scale, colormap, pictures, overlay_alpha,
                                        columns)
    first = panels[0]
    heading = title if title is not None else _headline(res, shown, chosen, top_k, by, scale, what, overlay_alpha)
    fig, grids, pics, cax = _layout(len(shown), 1, first.grid.shape[:2], first.columns, pictures is not None,
                                    bar is not None, heading, not reduce and _by_row(chosen))
    size = _font(grids[0][0].get_position().width * fig.get_figwidth() * _DPI / first.columns)
    for r, panel in enumerate(panels):
        _show(grids[r][0], panel, size)
        if pictures is not None:
            _show_picture(pics[r], pictures[r], f"image {shown[r]}")
    if bar is not None and cax is not None:
        _colour_bar(fig, cax, bar[0], bar[1], colormap)
    return fig


# --- the in-place trap: what a hook keeping references read, next to what the layer produced -------------------------
@dataclass
class _Comparison:
    image: int
    stored: np.ndarray
    true: np.ndarray
    chosen: list[int]
    marked: np.ndarray
    columns: int
    tile: tuple[int, int]
    pad: int
    bar: tuple[float, float] | None


def _check_comparison(comparison: ReferenceComparison, scale: str, by: str, pad: int, zoom: int) -> None:
    if not isinstance(comparison, ReferenceComparison):
        raise HookscopeError(f"comparison is a {type(comparison).__name__}, not what "
                             "hookscope.analysis.features.compare_references returns")
    _check_choice(scale, "scale", SCALES)
    _check_choice(by, "by", BY)
    _check_pad(pad, 2)
    if isinstance(zoom, bool) or not isinstance(zoom, int) or zoom < 1:
        raise HookscopeError(f"zoom={zoom!r} must be a whole factor, at least 1")
    _spatial(comparison.layer, comparison.true.shape[2], comparison.true.shape[3])


def _compared(comparison: ReferenceComparison, image: int, channels: Sequence[int] | None, top_k: int | None,
              by: str, scale: str, columns: int | None, colormap: str, pad: int, zoom: int) -> _Comparison:
    _check_comparison(comparison, scale, by, pad, zoom)
    i = _image_index(comparison.true.shape[0], image)
    chosen = _channels(FeatureMaps(comparison.true, comparison.layer), channels, top_k, by, i)
    stored, true = comparison.stored[i, chosen], comparison.true[i, chosen]
    both = torch.stack([stored, true], 1)  # K x 2 x h x w: a channel gets one range on both sides
    lo, hi = _finite_range(both, (1, 2, 3) if scale == "channel" else None)
    lo, hi = (lo[:, 0], hi[:, 0]) if scale == "channel" else (lo, hi)
    lut = _lut(colormap)
    cols = _columns(len(chosen), columns)
    marked = comparison.differs_by_image[i, chosen].numpy()  # this image's: another's would mislead
    h, w = stored.shape[1] * zoom, stored.shape[2] * zoom
    grids = []
    for side in (stored, true):
        tiles = _coloured(side, lo, hi, lut).repeat(zoom, axis=1).repeat(zoom, axis=2)
        grid = _assemble(tiles, cols, pad)
        _frame(grid, marked, cols, h, w, pad)
        grids.append(grid)
    bar = (float(lo), float(hi)) if scale == "shared" and bool(torch.isfinite(lo)) else None
    return _Comparison(i, grids[0], grids[1], chosen, marked, cols, (h, w), pad, bar)


def _zoom(h: int, w: int) -> int:
    """The whole factor that enlarges an ``h x w`` tile to at least 32 pixels a side (thin frames)."""
    return max(1, math.ceil(32 / max(1, min(h, w))))


def comparison_grid(comparison: ReferenceComparison, *, image: int = 0, channels: Sequence[int] | None = None,
                    top_k: int | None = None, by: str = "mean", scale: str = "shared", columns: int | None = None,
                    colormap: str = "viridis", pad: int = 2, gap: int = 8, zoom: int = 1) -> np.ndarray:
    """The in-place trap as one RGB array: what a hook keeping references read (left) and what the layer
    produced (right) for one image, the channels that differ in that image framed in red on both sides.

    Both sides are grids with the module's tile geometry, colored through ``colormap`` after the
    normalisation of :func:`feature_grid` (non-finite values in its fixed colours), on one range
    for both sides: with ``scale="shared"`` the finite min and max over every tile shown on either
    side, with ``scale="channel"`` each channel's over its two tiles. A channel is framed when it
    differs in image ``image`` (``comparison.differs_by_image[image]``; a channel rewritten only in
    another image is not): the 1-pixel ring just outside its tile, pure red ``(255, 0, 0)``, on both
    sides. The right side starts ``gap`` white columns after the left one ends.

    Args:
        comparison: what :func:`~hookscope.analysis.features.compare_references` returns (maps of
            one pixel, ``1 x 1``, are refused).
        image, channels, top_k, by, scale, columns: as in :func:`feature_grid` (``top_k`` ranks the
            true maps).
        colormap: a matplotlib colormap name (one without pure red keeps the frames apart).
        pad: pixels between tiles, at least 2 (frames live in the gaps).
        gap: white columns between the two sides.
        zoom: enlarge each tile this many times (nearest neighbour) before framing, so that the
            frame is thin next to a small tile: tiles are then ``zoom * h x zoom * w`` in the geometry.

    Returns:
        An ``H x W x 3`` uint8 array.

    Example:
        >>> import torch
        >>> from hookscope.analysis.features import compare_references
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True))
        >>> g = comparison_grid(compare_references(net, torch.randn(1, 3, 6, 6), "0"), gap=8)
        >>> g.shape, g[1, 1].tolist()   # 2 x 2 tiles of 4 x 4, pad 2; a red frame's corner
        ((14, 36, 3), [255, 0, 0])
    """
    c = _compared(comparison, image, channels, top_k, by, scale, columns, colormap, pad, zoom)
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise HookscopeError(f"gap={gap!r} must be a whole number of pixels, 0 or more")
    white = np.full((c.stored.shape[0], gap, 3), _WHITE, dtype=np.uint8)
    return np.concatenate([c.stored, white, c.true], axis=1)


def _frame_patches(ax: Axes, c: _Comparison, fig: Figure) -> None:
    """The red frames again, as one path drawn at the figure's resolution: where ``imshow`` shrinks a
    large grid (2048 tiles), its 1-pixel rings fall between the screen's pixels and vanish."""
    if not c.marked.any():
        return
    mpath = _need("matplotlib.path")
    patches = _need("matplotlib.patches")
    h, w = c.tile
    ys, xs = _origins(len(c.marked), c.columns, h, w, c.pad)
    y0, x0 = ys[c.marked] - 1.0, xs[c.marked] - 1.0  # through the centres of the ring's pixels
    corners = np.stack([np.stack([x0, y0], 1), np.stack([x0 + w + 1, y0], 1), np.stack([x0 + w + 1, y0 + h + 1], 1),
                        np.stack([x0, y0 + h + 1], 1), np.stack([x0, y0], 1)], 1)  # K x 5 x (x, y)
    codes = np.tile([mpath.Path.MOVETO, *[mpath.Path.LINETO] * 3, mpath.Path.CLOSEPOLY], len(x0))
    screen = ax.get_position().width * fig.get_figwidth() * _DPI / c.stored.shape[1]  # figure pixels per pixel
    # one path, added as an artist: add_patch would walk it for the data limits (0.2 s for 2048 frames),
    # and the frames lie inside the image. Never thinner than 1.5
    # figure pixels nor than the ring itself; no antialiasing: pure red, as in the array
    ax.add_artist(patches.PathPatch(mpath.Path(corners.reshape(-1, 2), codes), facecolor="none",
                                   edgecolor=(1.0, 0.0, 0.0), linewidth=max(1.5, screen) * 72 / _DPI,
                                   antialiased=False))


def _comparison_title(comparison: ReferenceComparison, c: _Comparison) -> str:
    total, batch = comparison.differs.numel(), comparison.true.shape[0]
    head = (f"{comparison.layer}: {int(comparison.differs.sum())} of {_plural(total, 'channel')} rewritten in "
            "place after the layer ran")
    if batch > 1:
        head += f" (in any of {batch} images); in image {c.image}: {int(comparison.differs_by_image[c.image].sum())}"
    n = int(c.marked.sum())
    framed = "none framed" if not n else "those framed in red" if len(c.chosen) == total else \
        f"{n} of the {len(c.chosen)} shown framed in red"
    seen = torch.cat([comparison.stored[c.image, c.chosen], comparison.true[c.image, c.chosen]])
    return f"{head} ({framed}){_non_finite(seen)}"


def plot_reference_comparison(comparison: ReferenceComparison, *, image: int = 0,
                              channels: Sequence[int] | None = None, top_k: int | None = None, by: str = "mean",
                              scale: str = "shared", columns: int | None = None, colormap: str = "viridis",
                              picture: torch.Tensor | None = None, title: str | None = None) -> Figure:
    """The in-place trap's picture: the maps a hook that keeps references read, beside what the layer produced.

    The two grids of :func:`comparison_grid` for one image side by side, tiles labelled by channel
    (on red, and framed in red, where the two differ in that image), one colour bar for both with
    ``scale="shared"``, and the input image on the left when given. Tiles under 32 pixels a side are
    enlarged by the smallest whole ``zoom`` that makes them 32 or more, so that the 1-pixel frames
    stay thin; the frames are also drawn as red rectangles at the figure's resolution (at least 1.5
    pixels wide), so that they survive when a large grid is shrunk to the figure. Non-finite values
    are in the fixed colours of :func:`feature_grid` (NaN magenta, +Inf cyan, -Inf blue).

    Args:
        comparison: what :func:`~hookscope.analysis.features.compare_references` returns.
        image, channels, top_k, by, scale, columns, colormap: as in :func:`comparison_grid`.
        picture: the input image, ``3 x H x W`` in [0, 1] (or the batch of them).
        title: the figure's title (default: how many channels differ, in the batch and in this
            image, and the number of NaN/Inf values if any).

    Returns:
        A ``matplotlib.figure.Figure`` on its own Agg canvas.

    Example:
        >>> import torch
        >>> from hookscope.analysis.features import compare_references
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True))
        >>> fig = plot_reference_comparison(compare_references(net, torch.randn(1, 3, 6, 6), "0"))
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['a hook keeping output.detach() read', 'the layer produced (hookscope.capture)']
    """
    zoom = _zoom(*comparison.true.shape[2:]) if isinstance(comparison, ReferenceComparison) else 1
    c = _compared(comparison, image, channels, top_k, by, scale, columns, colormap, 2, zoom)
    pictures = _pictures(picture, [c.image], comparison.true.shape[0])
    heading = title if title is not None else _comparison_title(comparison, c)
    fig, grids, pics, cax = _layout(1, 2, c.stored.shape[:2], c.columns, pictures is not None, c.bar is not None,
                                    heading, _by_row(c.chosen))
    size = _font(grids[0][0].get_position().width * fig.get_figwidth() * _DPI / c.columns)
    colors = ["red" if m else "black" for m in c.marked.tolist()]
    for ax, grid, what in zip(grids[0], (c.stored, c.true),
                              ("a hook keeping output.detach() read", "the layer produced (hookscope.capture)")):
        _show(ax, _Panel(grid, c.chosen, c.columns, c.tile, c.pad, what), size, colors)
        _frame_patches(ax, c, fig)
    if pictures is not None:
        _show_picture(pics[0], pictures[0], f"image {c.image}")
    if c.bar is not None and cax is not None:
        _colour_bar(fig, cax, c.bar[0], c.bar[1], colormap)
    return fig


def save_feature_maps(picture: Figure | np.ndarray, path: str | os.PathLike[str]) -> Path:
    """Write a figure or a grid array as a PNG, atomically (a temporary file, then a rename), readable
    by all (mode 0644), replacing a file already at ``path``.

    Args:
        picture: a figure from :func:`plot_feature_maps` / :func:`plot_reference_comparison`, or an
            array from :func:`feature_grid` / :func:`comparison_grid` (written pixel for pixel).
        path: the PNG file to write; its folder must exist.

    Returns:
        The path written.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "grid.png")
        >>> save_feature_maps(feature_grid(torch.rand(1, 4, 3, 3)), path).name
        'grid.png'
    """
    out = Path(path)
    folder = out.parent
    if not folder.is_dir():
        raise HookscopeError(f"cannot write {out}: the folder {folder} does not exist; create it first")
    if out.is_dir():
        raise HookscopeError(f"cannot write {out}: it is a folder; give a file path such as {out / 'maps.png'}")
    is_array = isinstance(picture, np.ndarray)
    if not is_array and not hasattr(picture, "savefig"):
        raise HookscopeError(f"cannot save a {type(picture).__name__}; pass a Figure or a uint8 array")
    image = _need("PIL.Image") if is_array else None
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if image is not None:
                image.fromarray(np.ascontiguousarray(picture)).save(f, format="PNG", compress_level=1)
            else:
                # zlib level 1: a third of level 6's time for a 1100 x 1100 figure, files ~30% larger
                picture.savefig(f, format="png", dpi=_DPI, pil_kwargs={"compress_level": 1})  # type: ignore[union-attr]
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: a picture is for sharing, as open() would make it
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out
