"""Report sections that draw over the inputs: feature maps of chosen layers, and CAMs with their faithfulness."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..analysis.cam import CamMaps, cam
from ..analysis.cam_metrics import deletion, insertion, pointing_game
from ..analysis.features import feature_maps
from ..analysis.summary import summary
from .html import Figure, Section
from .subject import Subject

__all__ = ["DEFAULT_METHODS", "cam_section", "feature_section", "spatial_layers"]

DEFAULT_METHODS = ("gradcam", "gradcam++", "layercam")
_MAX_IMAGES = 4  # images drawn one by one; the scores cover them all
_TOP = 16  # channels drawn per layer, by mean activation


def spatial_layers(s: Subject, most: int = 4) -> list[str]:
    """Up to ``most`` top-level children with a B x C x h x w output (h, w > 1), spread over the model.

    Example:
        >>> import torch, tempfile, pathlib
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
        >>> spatial_layers(Subject(net, torch.zeros(1, 3, 8, 8), pathlib.Path(".")))
        ['0', '1']
    """
    rows = [r for r in summary(s.model, s.x).rows if r.depth == 1 and r.output_shapes]
    names = [r.name for r in rows if len(r.output_shapes[0]) == 4 and min(r.output_shapes[0][-2:]) > 1]
    names = list(dict.fromkeys(names))
    if len(names) <= most:
        return names
    step = (len(names) - 1) / (most - 1)
    return [names[round(i * step)] for i in range(most)]


def feature_section(s: Subject, layers: Sequence[str] | None) -> Section:
    """The most active channels of each chosen layer for the first input, beside the input."""
    from ..viz.features import plot_feature_maps
    from ..viz.plots import save_figure

    chosen = list(layers) if layers is not None else spatial_layers(s)
    sec = Section("features", "Feature maps", data={"layers": {}})
    sec.paragraphs.append(f"The {_TOP} channels with the largest mean activation of each layer, for image 0 "
                          "(one colour scale per layer).")
    picture = s.pictures[0] if s.pictures is not None else None
    for i, name in enumerate(chosen):
        fm = feature_maps(s.model, s.x[:1], layers=name)
        top = fm.top(min(_TOP, fm.maps.shape[1]))
        fig = plot_feature_maps(fm, picture=picture, channels=top)
        path = save_figure(fig, s.image(f"features_{i}"))
        sec.figures.append(Figure(s.relative(path), f"{name}: {tuple(fm.maps.shape[1:])}, channels {top}"))
        sec.data["layers"][name] = {"shape": list(fm.maps.shape), "channels": top}
    if not chosen:
        sec.paragraphs.append("No layer with a spatial (B x C x h x w) output was found.")
    return sec


def _faithfulness(s: Subject, r: CamMaps) -> dict[str, Any]:
    """Deletion and insertion AUC (means over the images) and, with masks, the pointing-game hit rate."""
    target, given = r.targets, s.baselines is not None
    cut = deletion(s.model, s.x, r.maps, target=target, steps=50, baseline=s.baselines if given else "zeros")
    grow = insertion(s.model, s.x, r.maps, target=target, steps=50, baseline=s.baselines if given else "blur")
    scores: dict[str, Any] = {"deletion_auc": float(cut.auc.mean()), "insertion_auc": float(grow.auc.mean())}
    if s.masks is not None:
        scores["pointing_game"] = float(pointing_game(r.maps, s.masks).float().mean())
    return scores


def cam_section(s: Subject, methods: Sequence[str] = DEFAULT_METHODS) -> Section:
    """Each method's map over each input (up to four drawn), and a faithfulness table for all of them."""
    from ..viz.plots import plot_cams, save_figure

    results = [cam(s.model, s.x, method=m) for m in methods]
    sec = Section("cam", "Class activation maps", data={"layers": results[0].layers, "methods": {}})
    removed = "the given baselines" if s.baselines is not None else "zeros (deletion) and a blur (insertion)"
    sec.paragraphs.append(f"Layer {', '.join(results[0].layers)}; target: the predicted class. Deletion AUC "
                          f"(lower is better) and insertion AUC (higher is better) replace pixels with {removed}; "
                          "pointing game: the map's peak on the object (higher is better).")
    for r in results:
        scores = _faithfulness(s, r)
        sec.data["methods"][r.method] = {**scores, "targets": r.targets, "scores": r.scores}
        sec.facts.append((r.method, ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in scores.items())))
    pictures = s.pictures if s.pictures is not None else _as_pictures(s.x)
    for i in range(min(_MAX_IMAGES, s.x.shape[0])):
        fig = plot_cams(pictures[i], results, index=i, class_names=s.class_names)
        path = save_figure(fig, s.image(f"cam_{i}"))
        sec.figures.append(Figure(s.relative(path), f"image {i}: {', '.join(methods)}"))
    return sec


def _as_pictures(x: torch.Tensor) -> torch.Tensor:
    """Inputs with no picture given, shown min-max scaled per image (grey when not 3 channels)."""
    img = x if x.shape[1] == 3 else x.mean(dim=1, keepdim=True).expand(-1, 3, -1, -1)
    flat = img.flatten(1)
    lo, hi = flat.min(1).values.view(-1, 1, 1, 1), flat.max(1).values.view(-1, 1, 1, 1)
    return ((img - lo) / (hi - lo).clamp_min(1e-12)).clamp(0, 1)

