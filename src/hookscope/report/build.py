"""Build a report: run each analysis, draw its pictures, and write the folder in one step."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from ..analysis.attribution import METHODS as ATTRIBUTIONS
from ..analysis.cam import METHODS
from ..analysis.monitor import Run, read_run
from ..core.result import jsonable
from ..core.state import restored
from ..core.text import shape_text
from ..errors import HookscopeError
from ..loading import weights_origin
from ..selection import layers as select
from .attribution import DEFAULT_ATTRIBUTIONS, attribution_section
from .cams import DEFAULT_METHODS, cam_section
from .checks import debug_sections, predictions
from .circuits import CircuitResult, check_circuits, circuit_section
from .diffs import diff_section
from .features import feature_section, spatial_layers
from .folder import MARKER, staged_folder
from .html import Section, page
from .progress import Progress
from .runs import run_section
from .structure import structure_section
from .subject import Subject, kept_grads
from .summary import summary_section

__all__ = ["build_report"]

FORMAT = 1  # the version of report.json's layout


def _version() -> str:
    try:
        return version("hookscope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _check(x: torch.Tensor, pictures: torch.Tensor | None, masks: torch.Tensor | None,
           against: nn.Module | None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise HookscopeError("a report needs inputs as one B x C x H x W tensor; give images or an input shape")
    if pictures is not None and (pictures.shape[0] != x.shape[0] or pictures.dim() != 4 or pictures.shape[1] != 3):
        raise HookscopeError(f"pictures {shape_text(tuple(pictures.shape))} do not match the inputs "
                             f"{shape_text(tuple(x.shape))}; give one B x 3 x H x W picture per input")
    if masks is not None and (masks.dim() != 3 or masks.shape[0] != x.shape[0]):
        raise HookscopeError(f"masks {shape_text(tuple(masks.shape))} are not one H x W mask per input")
    if against is not None and not isinstance(against, nn.Module):
        raise HookscopeError(f"against= is a {type(against).__name__}, not a model; give the nn.Module to compare with")


def _check_choices(model: nn.Module, layers: Sequence[str] | None, methods: Sequence[str],
                   attributions: Sequence[str]) -> None:
    """Unknown methods and layers fail before any work, not after the first sections."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise HookscopeError(f"unknown CAM method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    unknown = [m for m in attributions if m not in ATTRIBUTIONS]
    if unknown:
        raise HookscopeError(f"unknown attribution method {unknown[0]!r}; choose from {', '.join(ATTRIBUTIONS)}")
    for name in layers or []:
        select(model, name)  # a name that matches nothing says so, with the closest names


def _sections(s: Subject, layers: Sequence[str] | None, methods: Sequence[str], attributions: Sequence[str],
              against: tuple[nn.Module, str] | None, run: Run | None,
              circuits: Sequence[CircuitResult] = ()) -> list[Section]:
    """Every section in page order; each long step tells the progress bar."""
    s.progress.start("predictions")
    found = [predictions(s)]
    s.progress.start("summary")
    found += [summary_section(s), structure_section(s)]
    chosen = list(layers) if layers is not None else spatial_layers(s.summary())
    s.progress.add(len(chosen) + 2 * len(methods) + bool(methods) + 2 * len(attributions) + bool(attributions)
                   + (against is not None) + bool(circuits))
    if against is not None:
        s.progress.start(f"comparison with {against[1]}")
        found.append(diff_section(s, *against))
    found.append(feature_section(s, chosen))
    if methods:
        found.append(cam_section(s, methods))
    if attributions:
        found.append(attribution_section(s, attributions))
    s.progress.start("trace, NaN/Inf check and gradient flow")
    found += debug_sections(s)
    found += [run_section(s, run)] if run is not None else []
    if circuits:
        s.progress.start("circuit pictures")
        found.append(circuit_section(s, circuits))
    return found


def _write(s: Subject, title: str, subtitle: str, sections: list[Section], source: str | None) -> None:
    s.progress.start("writing the folder")
    (s.folder / "index.html").write_text(page(title, subtitle, sections, banners=s.banners()), encoding="utf-8")
    doc = {"hookscope_report": FORMAT, "title": title, "about": subtitle, "hookscope": _version(),
           "torch": torch.__version__, "input_shape": list(s.x.shape),
           "origin": {"random_weights": s.random_weights, "weights": source, "generated_inputs": s.generated_inputs},
           "sections": {sec.key: sec.data for sec in sections}}
    (s.folder / MARKER).write_text(json.dumps(jsonable(doc), indent=1) + "\n", encoding="utf-8")


def build_report(
    model: nn.Module,
    inputs: torch.Tensor,
    out: str | os.PathLike[str],
    *,
    pictures: torch.Tensor | None = None,
    masks: torch.Tensor | None = None,
    class_names: Sequence[str] | None = None,
    baselines: torch.Tensor | None = None,
    layers: Sequence[str] | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    attributions: Sequence[str] = DEFAULT_ATTRIBUTIONS,
    title: str | None = None,
    note: str = "",
    overwrite: bool = False,
    overwrite_flag: str = "overwrite=True",
    random_weights: bool | None = None,
    generated_inputs: bool = False,
    against: nn.Module | None = None,
    against_name: str | None = None,
    progress: bool | None = None,
    run: str | os.PathLike[str] | Run | None = None,
    circuits: Sequence[CircuitResult] | CircuitResult = (),
) -> Path:
    """Write a self-contained report folder (``index.html``, ``img/``, ``report.json``) about ``model``.

    Sections: predictions, summary, structure (the top-level modules in call order, drawn), the
    comparison with ``against`` when given, feature maps of ``layers`` (default: up to four top-level
    layers with spatial outputs), CAMs by each of ``methods`` with deletion / insertion AUC (and the
    pointing game where ``masks`` are given), input attribution by each of ``attributions`` with the
    same scores, trace, the NaN/Inf check and gradient flow, the training run ``run`` when given, and
    the ``circuits`` results when given.
    Feature maps
    and CAMs are drawn for each input (up to 8), a tab each; the page works offline and, without
    JavaScript, shows every view one under another. The folder appears only when complete; an
    existing one is replaced only with ``overwrite`` and only if it is a report or empty. The model
    comes back as it was: modes, buffers, random state and ``.grad``.

    Args:
        model: the model, in the mode to report on (usually ``eval()``).
        inputs: ``B x C x H x W`` inputs.
        out: the folder to write.
        pictures: the inputs as images ``B x 3 x H x W`` in [0, 1], drawn under the maps.
        masks: ``B x H x W`` ground-truth object masks, for the pointing game.
        methods: the CAM methods (``hookscope.cam``); empty for no CAM section.
        attributions: the input attribution methods (``hookscope.attribute``), with fewer copies than
            their defaults (integrated gradients: 16 Gauss-Legendre points); empty for no section.
        class_names: names of the model's classes, shown next to predictions.
        baselines: what deletion / insertion put in place of removed pixels (inputs without their
            objects, where known); default zeros for deletion and a blur for insertion.
        random_weights: the model's weights are random (not trained): the page opens with a banner
            saying its maps and scores show the methods, not findings. ``None``: what
            :func:`~hookscope.load_model` recorded of the model (:func:`~hookscope.loading.weights_origin`),
            else False. ``report.json`` says where the weights came from as ``origin.weights``.
        generated_inputs: the inputs are generated, not real images: the page says so at the top.
        against: another model (same layer names, such as the same architecture with other weights)
            to compare with layer by layer on ``inputs`` (:func:`hookscope.diff`).
        against_name: how the page names ``against`` (default: its class name).
        progress: a progress bar on stderr; ``None``: when stderr is a terminal.
        run: a training run a monitor logged (its folder, ``hookscope.monitor(..., log=FOLDER)``, or the
            :class:`~hookscope.Run` :func:`~hookscope.read_run` gives), drawn as its own section: the loss
            and each layer's gradient norm, update ratio and dead fraction per sampled step.
        circuits: results of the circuit analyses, computed beforehand (of a language model, say, while
            ``model`` is the one the rest of the page is about): each :class:`~hookscope.Patching`
            (:func:`~hookscope.activation_patching`, :func:`~hookscope.attribution_patching`),
            :class:`~hookscope.LogitLens` and :class:`~hookscope.LogitAttribution`, drawn in that order
            in one section, as :mod:`hookscope.viz.circuits` draws it, with a table of its largest cells
            (the lens: each stream at the last position) and its full table; ``report.json`` holds each
            one's ``to_dict()``. One result alone is taken as a list of one.

    Example:
        >>> import tempfile, pathlib, shutil
        >>> from hookscope.zoo import TinyResNet
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> path = build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), root / "r", methods=["gradcam"],
        ...                     random_weights=True, generated_inputs=True)
        >>> sorted(p.name for p in path.iterdir())
        ['img', 'index.html', 'report.json']
        >>> "Random weights:" in (path / "index.html").read_text()
        True
        >>> shutil.rmtree(root)
    """
    _check(inputs, pictures, masks, against)
    _check_choices(model, layers, methods, attributions)
    logged = run if isinstance(run, Run) or run is None else read_run(run)  # a bad folder fails before any work
    given = check_circuits(circuits)
    title = title or f"hookscope report: {type(model).__name__}"
    subtitle = f"input {shape_text(tuple(inputs.shape))}" + (f"; {note}" if note else "")
    origin = weights_origin(model)
    if random_weights is None:
        random_weights = origin is not None and origin.random
    source = origin.source if origin is not None else None
    x = inputs.detach().clone()  # the report's own copy: the caller's tensor is never handed to the model
    bar = Progress(4, enabled=progress)
    pair = (against, against_name or type(against).__name__) if against is not None else None
    other = restored(against) if against is not None and against is not model else contextlib.nullcontext()
    try:
        with staged_folder(out, overwrite=overwrite, flag=overwrite_flag) as folder:
            s = Subject(model, x, folder, pictures, masks, class_names, baselines, random_weights,
                        generated_inputs, bar)
            with restored(model), kept_grads(model), other:
                sections = _sections(s, layers, methods, attributions, pair, logged, given)
            _write(s, title, subtitle, sections, source)
    except BaseException:
        bar.close(done=False)  # ends the bar's line, so that the error is said on a line of its own
        raise
    bar.close()
    return Path(out)
