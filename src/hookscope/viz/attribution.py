"""Pictures of attributions: heatmaps over images, and strips of tokens coloured by their scores.

Signs matter for ``gradient``, ``input_x_gradient``, ``integrated_gradients`` and ``smoothgrad``: their
maps are drawn with a diverging colormap centred at 0 (``bwr``: positive red, negative blue, zero
white), each map scaled by its own largest ``|value|``. The other methods (``saliency``,
``smoothgrad_sq``, ``vargrad``, ``guided_backprop`` and other guided maps) are drawn as magnitudes on a
sequential colormap (``inferno``: dark for 0, bright for the largest). Image maps are summed over
channels (magnitudes: the sum of ``|value|``).

Takes tensors and results only: nothing here registers a hook or runs a model. matplotlib comes from
the viz extra and is imported when a picture is drawn.

Example:
    >>> import torch
    >>> fig = plot_image_attribution(torch.tensor([[[1.0, -1.0]]]), method="gradient")
    >>> [ax.get_title() for ax in fig.axes][:1]
    ['gradient']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HookscopeError
from .plots import figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SIGNED", "is_signed", "plot_image_attribution", "plot_segment_attribution", "plot_token_attribution"]

SIGNED = ("gradient", "input_x_gradient", "integrated_gradients", "smoothgrad",  # drawn centred at 0
          "occlusion", "feature_ablation", "feature_permutation", "shapley_value_sampling", "kernel_shap", "lime")
_DIVERGING, _SEQUENTIAL = "bwr", "inferno"
_BLANK = (0.85, 0.85, 0.85, 1.0)  # cells with no score (after the token explained)


def is_signed(method: str | None) -> bool:
    """Whether a method's maps are drawn signed (diverging, centred at 0); ``None`` counts as signed.

    Example:
        >>> is_signed("integrated_gradients"), is_signed("saliency"), is_signed("guided_backprop")
        (True, False, False)
    """
    return method is None or method.lower().replace("-", "_") in SIGNED


def _maps_of(maps: Any, method: str | None) -> tuple[torch.Tensor, str | None]:
    """The maps as a ``B x H x W`` float tensor (channels summed; magnitudes for unsigned methods)."""
    method = method if method is not None else getattr(maps, "method", None)
    t = getattr(maps, "maps", maps)
    if not isinstance(t, torch.Tensor) or t.ndim not in (2, 3, 4) or t.numel() == 0:
        got = "x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
        raise HookscopeError(f"attribution maps of {got} are not images; pass B x C x H x W, B x H x W or H x W "
                             "maps, or the result of hookscope.attribute")
    t = t.detach().float().cpu()
    t = t[None] if t.ndim == 2 else t
    if t.ndim == 4:
        t = t.sum(1) if is_signed(method) else t.abs().sum(1)
    return (t if is_signed(method) else t.abs()), method


def _limits(m: torch.Tensor, signed: bool) -> tuple[float, float]:
    top = float(m.abs().max()) if m.numel() else 0.0
    top = top if top > 0 and math.isfinite(top) else 1.0
    return (-top, top) if signed else (0.0, top)


def plot_image_attribution(maps: Any, pictures: torch.Tensor | None = None, *, method: str | None = None,
                           titles: Sequence[str] | None = None) -> Figure:
    """One row per image: the picture (when given), then its attribution map as a heatmap with a colour bar.

    Args:
        maps: what :func:`hookscope.attribute` returned, or its maps (``B x C x H x W``, ``B x H x W``,
            ``H x W``); maps of a layer are drawn at the layer's size.
        pictures: ``B x 3 x H x W`` (or ``3 x H x W``) in [0, 1], shown beside the maps.
        method: the method, which decides signed or magnitude colours (default: the result's own;
            signed for a bare tensor).
        titles: one title per image, above its map.

    Example:
        >>> import torch
        >>> fig = plot_image_attribution(torch.randn(2, 3, 4, 4), torch.rand(2, 3, 4, 4), method="saliency")
        >>> len(fig.axes)    # per image: the picture, the map, its colour bar
        6
    """
    m, method = _maps_of(maps, method)
    signed = is_signed(method)
    pics = None if pictures is None else (pictures[None] if pictures.ndim == 3 else pictures).detach().float().cpu()
    if pics is not None and (pics.ndim != 4 or pics.shape[0] != m.shape[0]):
        raise HookscopeError(f"{m.shape[0]} maps but pictures of shape {tuple(pictures.shape)}; pass one "  # type: ignore[union-attr]
                             "3 x H x W picture per map")
    if titles is not None and len(titles) != m.shape[0]:
        raise HookscopeError(f"{len(titles)} titles for {m.shape[0]} maps; give one per map")
    cols = 2 if pics is not None else 1
    fig = figure(3.0 * cols + 1.2, 2.8 * m.shape[0])
    axes = fig.subplots(m.shape[0], cols, squeeze=False)
    for i in range(m.shape[0]):
        if pics is not None:
            axes[i][0].imshow(pics[i].clamp(0, 1).permute(1, 2, 0).numpy(), interpolation="nearest")
            axes[i][0].set_title("input", fontsize=9)
        ax = axes[i][cols - 1]
        lo, hi = _limits(m[i], signed)
        shown = ax.imshow(m[i].numpy(), cmap=_DIVERGING if signed else _SEQUENTIAL, vmin=lo, vmax=hi,
                          interpolation="nearest")
        fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
        ax.set_title(titles[i] if titles is not None else (method or "attribution"), fontsize=9)
    for row in axes:
        for ax in row:
            ax.set_axis_off()
    fig.subplots_adjust(left=0.03, right=0.88, wspace=0.25)
    return fig


def _strip(result: Any, sample: int) -> tuple[list[Any], list[str], list[str]]:
    """The rows of ``sample``, the tokens' texts, and each row's label (the token it explains)."""
    rows = [r for r in getattr(result, "rows", []) if r.sample == sample]
    tokens = getattr(result, "tokens", None)
    if not isinstance(tokens, list) or not 0 <= sample < len(tokens):
        raise HookscopeError(f"sample={sample} is not a sequence of the result ({len(tokens or [])}); pass a "
                             "result of hookscope.attribute_tokens and one of its samples")
    if not rows:
        raise HookscopeError(f"the result holds no row for sample {sample}; nothing to draw")
    texts = [result.token_text(sample, j) for j in range(len(tokens[sample]))]
    labels = [repr(r.text) if r.text is not None else (f"#{r.target}" if r.target is not None else "target")
              for r in rows]
    return rows, texts, labels


def plot_token_attribution(result: Any, *, sample: int = 0) -> Figure:
    """Tokens coloured by their scores, one row per token explained (the next token, or each token written).

    Cell ``(row, j)`` holds token ``j``'s text on its score for that row's token, scaled by the row's
    largest ``|score|``: red for positive, blue for negative (magnitudes for saliency: bright for
    large). Cells after the row's last token are grey; each row is labelled with the token it explains.

    Args:
        result: what :func:`hookscope.attribute_tokens` returned.
        sample: which sequence of the batch.

    Example:
        >>> import torch, hookscope
        >>> lm = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
        >>> res = hookscope.attribute_tokens(lm, torch.tensor([[1, 2, 3]]), generate=2, steps=4)
        >>> fig = plot_token_attribution(res)
        >>> fig.axes[0].get_images()[0].get_array().shape    # 2 rows of up to 4 tokens, as RGBA
        (2, 4, 4)
    """
    from matplotlib import colormaps

    rows, texts, labels = _strip(result, sample)
    signed = is_signed(getattr(result, "method", None))
    width = max(len(r.scores) for r in rows)
    cmap = colormaps[_DIVERGING if signed else _SEQUENTIAL]
    cells = torch.tensor(_BLANK).repeat(len(rows), width, 1)
    for i, r in enumerate(rows):
        lo, hi = _limits(r.scores.float(), signed)
        scaled = ((r.scores.float() - lo) / (hi - lo)).clamp(0, 1).numpy()
        cells[i, : len(r.scores)] = torch.as_tensor(cmap(scaled), dtype=torch.float32)
    margin = 0.3 + 0.075 * max(len(label) + 3 for label in labels)  # inches for the row labels
    fig = figure(min(margin + 0.3 + 0.75 * width, 60.0), 0.9 + 0.45 * len(rows))
    ax = fig.subplots()
    ax.imshow(cells.numpy(), aspect="auto", interpolation="nearest")
    _write_tokens(ax, rows, texts, cells)
    ax.set_yticks(range(len(rows)), [f"-> {label}" for label in labels], fontsize=8)
    ax.set_xticks([])
    ax.set_title(f"{getattr(result, 'method', 'attribution')}: sample {sample}", fontsize=9)
    fig.subplots_adjust(left=min(0.5, margin / fig.get_figwidth()), right=1 - 0.2 / fig.get_figwidth(),
                        top=1 - 0.35 / fig.get_figheight(), bottom=0.15 / fig.get_figheight())
    return fig


def _write_tokens(ax: Axes, rows: list[Any], texts: list[str], cells: torch.Tensor) -> None:
    """Each cell's token text, black on light cells and white on dark ones."""
    for i, r in enumerate(rows):
        for j in range(len(r.scores)):
            light = float(cells[i, j, :3] @ torch.tensor([0.299, 0.587, 0.114])) > 0.5
            text = texts[j] if len(texts[j]) <= 12 else texts[j][:11] + "."
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="black" if light else "white")


def plot_segment_attribution(result: Any) -> Figure:
    """A segment x token written heatmap of :func:`hookscope.attribute_segments`' result, with each segment's
    total beside it: red where a segment raises a token's log-probability, blue where it lowers it.

    Args:
        result: what :func:`hookscope.attribute_segments` returned.

    Example:
        >>> import torch, hookscope
        >>> lm = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6))
        >>> res = hookscope.attribute_segments(lm, torch.tensor([[1, 2, 3, 4]]), segments=[0, 0, 1, 1], generate=2)
        >>> fig = plot_segment_attribution(res)
        >>> fig.axes[0].get_images()[0].get_array().shape    # 2 segments, 2 tokens written and the total
        (2, 3)
    """
    values = torch.cat([result.matrix, result.scores.unsqueeze(1)], 1).float()
    top = float(values.abs().max()) or 1.0
    written = result.written_text or [f"#{t}" for t in result.written]
    fig = figure(min(2.0 + 0.8 * values.shape[1], 40.0), 0.9 + 0.4 * values.shape[0])
    ax = fig.subplots()
    ax.imshow(values.numpy(), cmap=_DIVERGING, vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(values.shape[1]), [repr(t) for t in written] + ["total"], fontsize=7, rotation=45)
    ax.set_yticks(range(values.shape[0]), [s if len(s) <= 24 else s[:23] + "." for s in result.segments], fontsize=7)
    ax.set_title(f"{result.method}: change of log p of each token written", fontsize=9)
    fig.tight_layout()
    return fig
