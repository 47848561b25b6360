"""The CAM section: each method's map over every input drawn (a tab per image), and how faithful each
method is (deletion and insertion AUC over every input, the pointing game where masks are known)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..analysis.cam import CamMaps, cam
from ..analysis.cam_metrics import deletion, insertion, pointing_game
from .features import as_pictures, drawn
from .html import Section
from .subject import Subject
from .widgets import Axis, View, view_set

__all__ = ["DEFAULT_METHODS", "cam_section"]

DEFAULT_METHODS = ("gradcam", "gradcam++", "layercam")
_STEPS = 50  # deletion and insertion steps
_SAID = {"deletion_auc": "deletion AUC", "insertion_auc": "insertion AUC", "pointing_game": "pointing game"}


def _faithfulness(s: Subject, r: CamMaps) -> dict[str, Any]:
    """Deletion and insertion AUC (means over the images) and, with masks, the pointing-game hit rate."""
    target, given = r.targets, s.baselines is not None
    cut = deletion(s.model, s.inputs(), r.maps, target=target, steps=_STEPS, baseline=s.baselines if given else "zeros")
    grow = insertion(s.model, s.inputs(), r.maps, target=target, steps=_STEPS, baseline=s.baselines if given else "blur")
    scores: dict[str, Any] = {"deletion_auc": float(cut.auc.mean()), "insertion_auc": float(grow.auc.mean())}
    if s.masks is not None:
        scores["pointing_game"] = float(pointing_game(r.maps, s.masks).float().mean())
    return scores


def _views(s: Subject, results: Sequence[CamMaps], methods: Sequence[str]) -> str:
    """A tab per image drawn, each the image and every method's map over it."""
    from ..viz.plots import plot_cams, save_figure

    pictures = s.pictures if s.pictures is not None else as_pictures(s.x)
    views = []
    for i in range(drawn(s)):
        path = s.relative(save_figure(plot_cams(pictures[i], results, index=i, class_names=s.class_names),
                                      s.image(f"cam_{i}")))
        targets = results[0].targets
        explained = f"; class {s.label(int(targets[i]))}" if targets is not None else ""
        caption = f"image {i}: {', '.join(methods)}{explained}"
        body = (f'<figure><img src="{html.escape(path)}" alt="{html.escape(caption)}">'
                f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        views.append(View({"image": str(i)}, f"image {i}", body))
    return view_set("cam-views", [Axis("image", "Image", [(v.keys["image"], v.title) for v in views])], views)


def cam_section(s: Subject, methods: Sequence[str] = DEFAULT_METHODS) -> Section:
    """Each method's map over each input drawn, and a faithfulness table over all of them."""
    results = []
    for m in methods:
        s.progress.start(f"CAM {m}")
        results.append(cam(s.model, s.inputs(), method=m))
    sec = Section("cam", "Class activation maps", data={"layers": results[0].layers, "methods": {}})
    removed = "the given baselines" if s.baselines is not None else "zeros (deletion) and a blur (insertion)"
    sec.paragraphs.append(f"Layer {', '.join(results[0].layers)}; target: the predicted class. Each picture states "
                          "the target class's logit (the model's output for it, before softmax; the predictions "
                          "above give its probability). Deletion AUC "
                          f"(lower is better) and insertion AUC (higher is better) replace pixels with {removed}; "
                          "pointing game: the map's peak on the object (higher is better). Scores are means over "
                          f"all {s.x.shape[0]} images.")
    for r in results:
        s.progress.start(f"deletion and insertion curves of {r.method}")
        scores = _faithfulness(s, r)
        sec.data["methods"][r.method] = {**scores, "targets": r.targets, "scores": r.scores,
                                        "scores_are": "the target class's logit"}
        sec.facts.append((r.method, ", ".join(f"{_SAID[k]} {v:.3f}" for k, v in scores.items())))
    s.progress.start("CAM pictures")
    sec.blocks.append(_views(s, results, methods))
    return sec
