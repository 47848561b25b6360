"""The comparison section: the report's model against another (``--against``), layer by layer, with
:func:`hookscope.diff`: the first layer where they part, a row per compared output, and the errors drawn."""

from __future__ import annotations

import math

from torch import nn

from ..analysis.diff import Diff, DiffRow, diff
from ..core.text import num, shape_text
from .html import Figure, Section
from .subject import Subject
from .widgets import row_table

__all__ = ["diff_section"]

_ROWS = 400  # rows in the page's table; report.json has them all


def _labels(result: Diff) -> list[str]:
    """Each row's name, with its call where a module ran several times and its place in a nested output."""
    calls: dict[str, set[int]] = {}
    for r in result.rows:
        calls.setdefault(r.name, set()).add(r.call)
    return [(r.name or "(model)") + (f" call {r.call}" if len(calls[r.name]) > 1 else "")
            + (f" {r.path}" if r.path else "") for r in result.rows]


def _what(r: DiffRow) -> str:
    """How a diverging row differs, in words."""
    if r.status == "shape":
        return f"shapes differ: {shape_text(r.shape_a)} against {shape_text(r.shape_b)}"
    if r.status in ("structure", "missing in A", "missing in B"):
        return r.note or r.status
    nan = r.nan_a_only + r.nan_b_only
    return (f"{r.mismatched:,} of {r.numel:,} values beyond tolerance, max abs {num(r.max_abs)}, "
            f"cosine {num(r.cosine)}" + (f", NaN in one run only at {nan:,} places" if nan else ""))


def _verdict(result: Diff, labels: list[str]) -> list[str]:
    if not result.rows:
        return ["Nothing was compared: no module of one model has a namesake in the other that returned a tensor."]
    first = result.first
    out = [f"{len(result.rows)} outputs compared, tolerance |a - b| ≤ {result.atol:g} + {result.rtol:g} × |b|."]
    if first is None:
        out.append("No divergence: every compared output is within tolerance.")
    else:
        at = next(i for i, r in enumerate(result.rows) if r is first)
        out.append(f"First divergence: {labels[at]}: {_what(first)}.")
    for side, names in (("A", result.unmatched.a_only), ("B", result.unmatched.b_only)):
        if names:
            out.append(f"Only in {side} ({len(names)}, not compared): {', '.join(names[:20])}"
                       + (f" and {len(names) - 20} more." if len(names) > 20 else "."))
    return out


def _cell(v: float) -> str:
    return "-" if math.isnan(v) else num(v)


def diff_section(s: Subject, against: nn.Module, name: str) -> Section:
    """``hookscope.diff`` of the report's model (A) against ``against`` (B) on the report's inputs."""
    from ..viz.plots import plot_diff, save_figure

    result = diff(s.model, against, s.inputs())
    labels = _labels(result)
    sec = Section("diff", f"Against {name}", data=result.to_dict(), warning=None)
    sec.paragraphs.append(f"A is this report's model, B is {name}; both ran on the same inputs, and every module "
                          "they both have is compared output by output.")
    verdict = _verdict(result, labels)
    if result.first is not None:
        sec.warning = verdict.pop(1)
    sec.paragraphs += verdict
    if result.rows:
        drawn = save_figure(plot_diff(result), s.image("diff"))
        sec.figures.append(Figure(s.relative(drawn), "the error of every compared output, in the order they ran"))
        body = [[labels[i], shape_text(r.shape_a), _cell(r.max_abs), _cell(r.max_rel), _cell(r.cosine), r.status]
                for i, r in enumerate(result.rows[:_ROWS])]
        table = row_table(["layer", "shape", "max abs", "max rel", "cosine", "status"], body,
                          [r.diverges for r in result.rows[:_ROWS]])
        more = f" (the first {_ROWS}; report.json has all {len(result.rows)})" if len(result.rows) > _ROWS else ""
        sec.blocks.append(f"<details open><summary>every compared output{more}</summary>{table}</details>")
    return sec
