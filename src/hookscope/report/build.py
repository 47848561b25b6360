"""Build a report: run each analysis, draw its pictures, and write the folder in one step."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from ..analysis.cam import METHODS
from ..core.result import jsonable
from ..core.state import restored
from ..core.text import shape_text
from ..errors import HookscopeError
from ..selection import layers as select
from .checks import debug_sections, predictions, summary_section
from .folder import MARKER, staged_folder
from .html import Section, page
from .maps import DEFAULT_METHODS, cam_section, feature_section
from .subject import Subject, kept_grads

__all__ = ["build_report"]

FORMAT = 1  # the version of report.json's layout


def _version() -> str:
    try:
        return version("hookscope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _check(x: torch.Tensor, pictures: torch.Tensor | None, masks: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise HookscopeError("a report needs inputs as one B x C x H x W tensor; give images or an input shape")
    if pictures is not None and (pictures.shape[0] != x.shape[0] or pictures.dim() != 4 or pictures.shape[1] != 3):
        raise HookscopeError(f"pictures {shape_text(tuple(pictures.shape))} do not match the inputs "
                             f"{shape_text(tuple(x.shape))}; give one B x 3 x H x W picture per input")
    if masks is not None and (masks.dim() != 3 or masks.shape[0] != x.shape[0]):
        raise HookscopeError(f"masks {shape_text(tuple(masks.shape))} are not one H x W mask per input")


def _check_choices(model: nn.Module, layers: Sequence[str] | None, methods: Sequence[str]) -> None:
    """Unknown methods and layers fail before any work, not after the first sections."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise HookscopeError(f"unknown CAM method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    for name in layers or []:
        select(model, name)  # a name that matches nothing says so, with the closest names


def _sections(s: Subject, layers: Sequence[str] | None, methods: Sequence[str]) -> list[Section]:
    found = [predictions(s), summary_section(s), feature_section(s, layers)]
    if methods:
        found.append(cam_section(s, methods))
    return found + debug_sections(s)


def _write(s: Subject, title: str, subtitle: str, sections: list[Section]) -> None:
    (s.folder / "index.html").write_text(page(title, subtitle, sections), encoding="utf-8")
    doc = {"hookscope_report": FORMAT, "title": title, "about": subtitle, "hookscope": _version(),
           "torch": torch.__version__, "input_shape": list(s.x.shape),
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
    title: str | None = None,
    note: str = "",
    overwrite: bool = False,
    overwrite_flag: str = "overwrite=True",
) -> Path:
    """Write a self-contained report folder (``index.html``, ``img/``, ``report.json``) about ``model``.

    Sections: predictions, summary, feature maps of ``layers`` (default: up to four top-level layers
    with spatial outputs), CAMs by each of ``methods`` with deletion / insertion AUC (and the pointing
    game where ``masks`` are given), trace, the NaN/Inf check and gradient flow. The folder appears
    only when complete; an existing one is replaced only with ``overwrite`` and only if it is a report
    or empty. The model comes back as it was: modes, buffers, random state and ``.grad``.

    Args:
        model: the model, in the mode to report on (usually ``eval()``).
        inputs: ``B x C x H x W`` inputs.
        out: the folder to write.
        pictures: the inputs as images ``B x 3 x H x W`` in [0, 1], drawn under the maps.
        masks: ``B x H x W`` ground-truth object masks, for the pointing game.
        class_names: names of the model's classes, shown next to predictions.
        baselines: what deletion / insertion put in place of removed pixels (inputs without their
            objects, where known); default zeros for deletion and a blur for insertion.

    Example:
        >>> import tempfile, pathlib, shutil
        >>> from hookscope.zoo import TinyResNet
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> path = build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), root / "r", methods=["gradcam"])
        >>> sorted(p.name for p in path.iterdir())
        ['img', 'index.html', 'report.json']
        >>> shutil.rmtree(root)
    """
    _check(inputs, pictures, masks)
    _check_choices(model, layers, methods)
    title = title or f"hookscope report: {type(model).__name__}"
    subtitle = f"input {shape_text(tuple(inputs.shape))}" + (f"; {note}" if note else "")
    with staged_folder(out, overwrite=overwrite, flag=overwrite_flag) as folder:
        s = Subject(model, inputs, folder, pictures, masks, class_names, baselines)
        with restored(model), kept_grads(model):
            sections = _sections(s, layers, methods)
        _write(s, title, subtitle, sections)
    return Path(out)
