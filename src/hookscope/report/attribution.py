"""The input attribution section: a few methods' maps over each input drawn (a tab per image), signed maps
on a diverging colormap and absolute ones on a sequential one, and how faithful each method is (deletion
and insertion AUC, the pointing game where masks are known), scored as :mod:`hookscope.metrics` scores
the CAMs: the maps reduced over the input's channels by the sum of absolute values."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import torch

from ..analysis.attribution import Attributions, attribute
from ..analysis.cam_metrics import deletion, insertion, pointing_game
from ..core.text import first_line
from ..errors import HookscopeError
from .features import as_pictures, drawn
from .html import Section
from .subject import Subject
from .widgets import Axis, View, view_set

__all__ = ["DEFAULT_ATTRIBUTIONS", "attribution_section"]

DEFAULT_ATTRIBUTIONS = ("saliency", "integrated_gradients", "guided_gradcam")
SIGNED = {"gradient", "input_x_gradient", "integrated_gradients", "smoothgrad", "guided_backprop",
          "guided_gradcam", "deconvnet", "lrp"}  # drawn as the signed sum over channels, red and blue
_SETTINGS: dict[str, dict[str, Any]] = {  # fewer copies than the defaults: the report builds in seconds
    "integrated_gradients": {"steps": 16, "rule": "gausslegendre"},
    "smoothgrad": {"samples": 16}, "smoothgrad_sq": {"samples": 16}, "vargrad": {"samples": 16},
}
_STEPS = 25  # deletion and insertion steps: half the CAM section's, for the build time (the AUCs barely move)
_SAID = {"deletion_auc": "deletion AUC", "insertion_auc": "insertion AUC", "pointing_game": "pointing game"}


def _faithfulness(s: Subject, r: Attributions) -> dict[str, float]:
    """Deletion and insertion AUC (means over the images) and, with masks, the pointing-game hit rate."""
    given = s.baselines is not None
    cut = deletion(s.model, s.inputs(), r.maps, target=r.target, steps=_STEPS, baseline=s.baselines if given else "zeros")
    grow = insertion(s.model, s.inputs(), r.maps, target=r.target, steps=_STEPS, baseline=s.baselines if given else "blur")
    scores = {"deletion_auc": float(cut.auc.mean()), "insertion_auc": float(grow.auc.mean())}
    if s.masks is not None:
        scores["pointing_game"] = float(pointing_game(r.maps, s.masks).float().mean())
    return scores


def shown(r: Attributions) -> torch.Tensor:
    """``B x H x W``: the signed sum over channels for a signed method, the sum of absolute values otherwise.

    Example:
        >>> r = Attributions(maps=torch.tensor([[[[1.0]], [[-3.0]]]]), method="integrated_gradients",
        ...                  target=None, scores=torch.zeros(1))
        >>> shown(r).flatten().tolist(), shown(Attributions(r.maps, "saliency", None, r.scores)).flatten().tolist()
        ([-2.0], [4.0])
    """
    return r.maps.sum(1) if r.method in SIGNED else r.maps.abs().sum(1)


def _figure(picture: torch.Tensor, results: Sequence[Attributions], index: int) -> Any:
    """The input, then each method's map: signed ones on ``RdBu_r`` centred on 0, absolute ones on ``inferno``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HookscopeError("drawing the report needs matplotlib, from the viz extra: pip install 'hookscope[viz]'"
                             ) from None
    fig = Figure(figsize=(2.4 * (len(results) + 1), 2.9), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(results) + 1, squeeze=False)[0]
    axes[0].imshow(picture.detach().clamp(0, 1).permute(1, 2, 0).numpy(), interpolation="nearest")
    axes[0].set_title("input", fontsize=9)
    for ax, r in zip(axes[1:], results):
        m = shown(r)[index].float()
        top = float(m.abs().max()) or 1.0
        if r.method in SIGNED:
            ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-top, vmax=top, interpolation="nearest")
            ax.set_title(f"{r.method}\nsigned: red raises the score", fontsize=8)
        else:
            ax.imshow(m.numpy(), cmap="inferno", vmin=0, vmax=top, interpolation="nearest")
            ax.set_title(f"{r.method}\n|values|, summed over channels", fontsize=8)
    for ax in axes:
        ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.99, top=0.8, bottom=0.02, wspace=0.05)
    return fig


def _views(s: Subject, results: Sequence[Attributions]) -> str:
    """A tab per image drawn, each the image and every method's map."""
    from ..viz.plots import save_figure

    pictures = s.pictures if s.pictures is not None else as_pictures(s.x)
    views = []
    for i in range(drawn(s)):
        path = s.relative(save_figure(_figure(pictures[i], results, i), s.image(f"attribution_{i}")))
        target = results[0].target
        explained = f"; class {s.label(int(target[i]))}" if target is not None else ""
        caption = f"image {i}: {', '.join(r.method for r in results)}{explained}"
        body = (f'<figure><img src="{html.escape(path)}" alt="{html.escape(caption)}">'
                f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        views.append(View({"image": str(i)}, f"image {i}", body))
    return view_set("attribution-views", [Axis("image", "Image", [(v.keys["image"], v.title) for v in views])], views)


def _run(s: Subject, methods: Sequence[str]) -> tuple[list[Attributions], dict[str, str]]:
    """Each method's attributions of the predicted class; a method the model cannot take is left out, with why."""
    results, skipped = [], {}
    for m in methods:
        s.progress.start(f"attribution {m}")
        try:
            results.append(attribute(s.model, s.inputs(), method=m, **_SETTINGS.get(m, {})))
        except HookscopeError as e:
            skipped[m] = first_line(e)
    return results, skipped


def attribution_section(s: Subject, methods: Sequence[str] = DEFAULT_ATTRIBUTIONS) -> Section:
    """Each method's map over each input drawn, and a faithfulness table over all of them."""
    results, skipped = _run(s, methods)
    sec = Section("attribution", "Input attribution", data={"methods": {}, "skipped": skipped})
    removed = "the given baselines" if s.baselines is not None else "zeros (deletion) and a blur (insertion)"
    sec.paragraphs.append(
        "Which input pixels the predicted class's score depends on, by its gradient. Signed maps (integrated "
        "gradients, Guided Grad-CAM) are summed over the colour channels: red pixels raise the score, blue ones "
        "lower it; saliency, the gradient's size, is summed as absolute values. The scores reduce every map to "
        f"the sum of absolute values over channels. Deletion AUC (lower is better) and insertion AUC (higher is "
        f"better), in {_STEPS} steps, replace pixels with {removed}; pointing game: the map's peak on the object "
        f"(higher is better). Scores are means over all {s.x.shape[0]} images.")
    for m, why in skipped.items():
        sec.facts.append((m, f"not drawn: {why}"))
    for r in results:
        s.progress.start(f"deletion and insertion curves of {r.method}")
        scores = _faithfulness(s, r)
        sec.data["methods"][r.method] = {**scores, "settings": r.settings, "forwards": r.forwards}
        sec.facts.append((r.method, ", ".join(f"{_SAID[k]} {v:.3f}" for k, v in scores.items())))
    if results:
        s.progress.start("attribution pictures")
        sec.blocks.append(_views(s, results))
    return sec
