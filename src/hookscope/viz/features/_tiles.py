"""Which tiles a feature-map picture shows and how their values become colours: channel choice,
channel reductions (mean, max, PCA), normalisation, and the fixed colours of non-finite values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...analysis.features import FeatureMaps
from ...errors import HookscopeError, did_you_mean

__all__ = ["NON_FINITE", "REDUCTIONS", "SCALES", "as_result", "check_choice", "check_spatial", "colormap_table",
           "coloured", "finite_range", "image_index", "kinds_of", "need", "non_finite_note", "normalised", "paint",
           "pick_channels", "pixel_kinds", "plural", "reduce_tiles", "tile_limits", "to_uint8"]

SCALES = ("shared", "channel")
REDUCTIONS = ("mean", "max", "pca")

# Values no colour scale holds get fixed colours, none of them in viridis nor the frames' red: row k is
# the colour of kind k (0: finite, never used; 1: NaN; 2: +Inf; 3: -Inf).
_BAD = np.array([[0, 0, 0], [255, 0, 255], [0, 255, 255], [0, 0, 255]], dtype=np.uint8)
NON_FINITE = "NaN magenta, +Inf cyan, -Inf blue"  # what the figures' titles say of them


def need(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise HookscopeError(f"drawing feature maps needs {module.split('.')[0]}, from the viz extra: "
                             "pip install 'hookscope[viz]'") from None


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# --- choosing and scaling tiles ----------------------------------------------------------------------
def check_spatial(layer: str, h: int, w: int) -> None:
    """Refuse maps of one pixel: a pooled layer's channels are numbers, not pictures."""
    if h * w == 1:
        raise HookscopeError(f"layer {layer!r} gives 1x1 maps: no spatial extent to draw (a pooled or flattened "
                             "layer); pick an earlier layer, whose maps are h x w with more than one pixel")


def as_result(maps: FeatureMaps | torch.Tensor) -> FeatureMaps:
    if isinstance(maps, FeatureMaps):
        res = maps
    elif isinstance(maps, torch.Tensor) and maps.ndim in (3, 4) and maps.shape[-1] * maps.shape[-2] > 0:
        t = maps.detach().to("cpu", torch.float32)
        res = FeatureMaps(t if t.ndim == 4 else t[None], "maps")
    else:
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise HookscopeError(f"maps of shape {shape} are not feature maps; pass hookscope.analysis.features."
                             "feature_maps(...)'s result or a B x C x h x w (or C x h x w) tensor")
    check_spatial(res.layer, res.maps.shape[2], res.maps.shape[3])
    return res


def image_index(batch: int, image: int) -> int:
    if isinstance(image, bool) or not isinstance(image, int) or not -batch <= image < batch:
        raise HookscopeError(f"image={image!r} is out of range: the batch holds {batch} image(s), 0 to {batch - 1}")
    return image % batch


def check_choice(value: str | None, name: str, allowed: tuple[str, ...], none_ok: bool = False) -> None:
    if (value is None and none_ok) or value in allowed:
        return
    hint = did_you_mean(value, allowed) if isinstance(value, str) else ""
    raise HookscopeError(f"{name}={value!r} is not one of {', '.join(allowed)}{' (or None)' if none_ok else ''}.{hint}")


def pick_channels(res: FeatureMaps, channels: Sequence[int] | None, top_k: int | None, by: str,
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
    return tiles.mean(0, keepdim=True), f"mean of {plural(tiles.shape[0], 'channel')}"


def _max(tiles: torch.Tensor) -> tuple[torch.Tensor, str]:
    return tiles.amax(0, keepdim=True), f"max of {plural(tiles.shape[0], 'channel')}"


def _pca_tile(tiles: torch.Tensor) -> tuple[torch.Tensor, str]:
    rgb, ratios = _pca(tiles)
    what = f"PCA of {plural(tiles.shape[0], 'channel')}: "
    if not ratios or max(ratios) == 0:
        return rgb[None], what + "no variance (every pixel alike)"
    n = len(ratios)
    colours = ", ".join("RGB"[:n])
    which = "component 1" if n == 1 else f"components 1-{n}"
    shares = ", ".join(f"{r:.0%}" for r in ratios)
    common = ", on component 1's range" if n > 1 else ""
    return rgb[None], f"{what}{colours} = {which} ({shares} of the variance{common})"


def reduce_tiles(tiles: torch.Tensor, how: str | None) -> tuple[torch.Tensor, str]:
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


def finite_range(t: torch.Tensor, dims: tuple[int, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of the finite values over ``dims`` (None: all), kept as broadcastable tensors."""
    finite = torch.isfinite(t)
    lo = torch.where(finite, t, torch.inf)
    hi = torch.where(finite, t, -torch.inf)
    if dims is None:
        return lo.amin(), hi.amax()
    return lo.amin(dims, keepdim=True), hi.amax(dims, keepdim=True)


def normalised(t: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``(t - lo) / (hi - lo)`` clamped to [0, 1]; where ``hi <= lo`` (a constant tile), 0; +Inf 1,
    -Inf and NaN 0. In float64: ``hi - lo`` of float32 values near 3e38 overflows float32."""
    t, lo, hi = t.double(), lo.double(), hi.double()
    ok = hi > lo
    span = torch.where(ok, hi - lo, torch.ones_like(hi))
    out = torch.where(ok, (t - torch.where(torch.isfinite(lo), lo, 0.0)) / span, 0.0)
    out = torch.where(t == torch.inf, 1.0, out)
    return torch.nan_to_num(out, nan=0.0, posinf=1.0, neginf=0.0).clamp(0, 1)


def kinds_of(t: torch.Tensor) -> np.ndarray:
    """Each value's kind as a row of ``_BAD``: 0 finite, 1 NaN, 2 +Inf, 3 -Inf (``uint8``, t's shape)."""
    kind = torch.zeros(t.shape, dtype=torch.uint8)
    kind[t == -torch.inf] = 3
    kind[t == torch.inf] = 2
    kind[t.isnan()] = 1
    out: np.ndarray = kind.numpy()
    return out


def pixel_kinds(tiles: torch.Tensor) -> np.ndarray:
    """For a PCA of ``K x h x w`` tiles, each pixel's kind (``1 x h x w``): NaN if a channel is NaN,
    else +Inf if one is +Inf, else -Inf if one is -Inf."""
    kinds = kinds_of(tiles)
    out = np.zeros((1, *kinds.shape[1:]), dtype=np.uint8)
    for code in (3, 2, 1):  # the last written wins: NaN over +Inf over -Inf
        out[0][(kinds == code).any(0)] = code
    return out


def paint(rgb: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """``rgb`` (``... x 3`` uint8) with each non-finite value's pixel in its fixed colour."""
    bad = kinds > 0
    if bad.any():
        rgb = rgb.copy()
        rgb[bad] = _BAD[kinds[bad]]
    return rgb


def coloured(tiles: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, lut: np.ndarray) -> np.ndarray:
    """Tiles normalised on (lo, hi) through the colormap, non-finite values in their fixed colours."""
    return paint(lut[to_uint8(normalised(tiles, lo, hi))], kinds_of(tiles))


def non_finite_note(t: torch.Tensor) -> str:
    """What a figure's title says of the NaN/Inf values among ``t`` (nothing when there are none)."""
    n = int((~torch.isfinite(t)).sum())
    return f"; {n} NaN/Inf value{'s' if n != 1 else ''} ({NON_FINITE})" if n else ""


def tile_limits(tiles: list[torch.Tensor], scale: str, vrange: tuple[float, float] | None
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per panel of tiles, the (low, high) each tile is scaled by (see :func:`feature_grid`)."""
    if scale == "channel":
        return [finite_range(t, (1, 2)) for t in tiles]
    if vrange is not None:
        lo, hi = (torch.tensor(float(v), dtype=torch.float64) for v in vrange)
        return [(lo, hi)] * len(tiles)
    ranges = [finite_range(t, None) for t in tiles]
    lo = torch.stack([r[0] for r in ranges]).amin()
    hi = torch.stack([r[1] for r in ranges]).amax()
    return [(lo, hi)] * len(tiles)


def to_uint8(v: torch.Tensor) -> np.ndarray:
    out: np.ndarray = (v * 255).round().to(torch.uint8).numpy()
    return out


def colormap_table(colormap: str) -> np.ndarray:
    """The colormap as a 256 x 3 uint8 table (grey level -> colour)."""
    mpl = need("matplotlib")
    names = list(mpl.colormaps)
    if colormap not in names:
        raise HookscopeError(f"colormap {colormap!r} is not a matplotlib colormap.{did_you_mean(colormap, names)}")
    table: np.ndarray = (mpl.colormaps[colormap](np.arange(256))[:, :3] * 255).round().astype(np.uint8)
    return table

