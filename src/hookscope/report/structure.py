"""A picture of the model's structure: its top-level modules in the order they ran, each with its output
shape and the modules inside it, drawn as inline SVG from the rows of :func:`hookscope.summary`.

No layout engine: boxes go down one column, joined by arrows; the modules inside a box are chips that
wrap from line to line, and a run of children of one type and one output shape is one chip
(``0-1 BasicBlock ×2``), so a resnet18 is a dozen boxes. Text is monospace, so widths are known.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..analysis.summary import Row, Summary
from .html import Section
from .subject import Subject
from .summary import count

__all__ = ["structure_section", "structure_svg"]

_CHAR = 7.3  # px per character of 12 px monospace (DejaVu Sans Mono: 7.22)
_WIDTH, _LEFT, _GAP, _HEAD, _LINE = 680, 16, 22, 24, 22
_MOST = 60  # boxes drawn; more are summed up in a last box


@dataclass
class _Box:
    """One top-level module call, and the chips of the modules it called directly."""

    row: Row
    children: list[Row] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the calls merged into this box: leaves alike, in a row


def _shape(row: Row) -> str:
    """The first output's shape without the batch dimension: ``64 × 56 × 56``."""
    if not row.output_shapes:
        return "no tensor output"
    first = row.output_shapes[0]
    text = " × ".join(str(d) for d in first[1:]) if len(first) > 1 else "scalar"
    more = len(row.output_shapes) - 1
    return text + (f" (+{more} more)" if more else "")


def _boxes(rows: Sequence[Row]) -> list[_Box]:
    """Top-level calls in call order with their direct children; runs of identical leaves merged."""
    called = [r for r in rows if r.called]
    top = [r for r in called if r.depth == 1]
    if not top:  # a model without children: itself
        return [_Box(r, names=[r.name]) for r in called if r.depth == 0][:1]
    boxes: list[_Box] = []
    for r in called:
        if r.depth == 1:
            last = boxes[-1] if boxes else None
            if (last is not None and not last.children and not r.children and last.row.type == r.type
                    and _shape(last.row) == _shape(r)):
                last.names.append(r.name)
                continue
            boxes.append(_Box(r, names=[r.name]))
        elif r.depth == 2 and boxes:
            boxes[-1].children.append(r)
    return boxes


def _chips(box: _Box) -> list[tuple[str, str]]:
    """(text, tooltip) per run of children of one type and output shape."""
    runs: list[list[Row]] = []
    for r in box.children:
        if runs and runs[-1][0].type == r.type and _shape(runs[-1][0]) == _shape(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    prefix = box.row.name + "."
    found = []
    for run in runs:
        first, last = (r.name.removeprefix(prefix) for r in (run[0], run[-1]))
        name = first if first == last else f"{first}-{last}"
        text = f"{name} {run[0].type}" + (f" ×{len(run)}" if len(run) > 1 else "")
        found.append((text, f"{', '.join(dict.fromkeys(r.name for r in run))}: {run[0].type}, output {_shape(run[0])}"))
    return found


def _fit(text: str, width: float) -> str:
    most = max(4, int(width / _CHAR))
    return text if len(text) <= most else text[: most - 1] + "…"


def _chip_lines(chips: list[tuple[str, str]], width: float) -> list[list[tuple[str, str, float]]]:
    """Chips placed on lines: (text, tooltip, x offset) per chip."""
    lines: list[list[tuple[str, str, float]]] = [[]]
    x = 0.0
    for text, tip in chips:
        text = _fit(text, width - 12)
        w = len(text) * _CHAR + 12
        if lines[-1] and x + w > width:
            lines.append([])
            x = 0.0
        lines[-1].append((text, tip, x))
        x += w + 6
    return lines if lines[0] else []


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{klass} text-anchor="{anchor}">{html.escape(text)}</text>'


def _draw_box(box: _Box, y: float) -> tuple[list[str], float]:
    """The SVG of one box with its top edge at ``y``, and its height."""
    r, inner = box.row, _WIDTH - 2 * _LEFT - 20
    lines = _chip_lines(_chips(box), inner)
    height = _HEAD + 8 + len(lines) * _LINE
    n = len(box.names)
    name = (r.name or "(model)") if n < 2 else f"{box.names[0]}-{box.names[-1]} ×{n}"
    right = f"→ {_shape(r)}" + (f" · {count(r.params_total)} params{' each' if n > 1 else ''}" if r.params_total else "")
    left = _fit(f"{name}  {r.type}", inner - len(right) * _CHAR - 16)
    tip = f"{', '.join(box.names) or 'the model'}: {r.type}, output {_shape(r)}, {r.params_total:,} parameters"
    out = [f'<g class="box"><title>{html.escape(tip)}</title>',
           f'<rect x="{_LEFT}" y="{y:.1f}" width="{_WIDTH - 2 * _LEFT}" height="{height}" rx="6"/>',
           _text(_LEFT + 10, y + 17, left, "name"), _text(_WIDTH - _LEFT - 10, y + 17, right, "shape", "end"), "</g>"]
    for i, line in enumerate(lines):
        cy = y + _HEAD + 4 + i * _LINE
        for text, chip_tip, x in line:
            w = len(text) * _CHAR + 12
            out.append(f'<g class="chip"><title>{html.escape(chip_tip)}</title>'
                       f'<rect x="{_LEFT + 10 + x:.1f}" y="{cy:.1f}" width="{w:.1f}" height="{_LINE - 5}" rx="4"/>'
                       f'{_text(_LEFT + 16 + x, cy + 12, text)}</g>')
    return out, height


def _arrow(y: float) -> str:
    mid, end = _WIDTH / 2, y + _GAP - 3
    return f'<line class="arrow" x1="{mid}" y1="{y:.1f}" x2="{mid}" y2="{end:.1f}" marker-end="url(#hs-head)"/>'


def structure_svg(result: Summary) -> str:
    """The model's top-level modules in call order, with output shapes and the modules inside, as SVG.

    Example:
        >>> import torch
        >>> from hookscope import summary
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
        >>> svg = structure_svg(summary(net, torch.zeros(1, 3, 8, 8)))
        >>> svg.startswith("<svg") and "0  Conv2d" in svg and "→ 4 × 6 × 6" in svg and "2  Flatten" in svg
        True
    """
    root = next((r for r in result.rows if r.depth == 0), None)
    boxes = _boxes(result.rows)
    dropped = max(0, len(boxes) - _MOST)
    shape = " × ".join(str(d) for d in result.inputs[0][0][1:]) if result.inputs and result.inputs[0][0] else "-"
    parts = [_text(_WIDTH / 2, 18, f"input {shape}", "io", "middle"), _arrow(24)]
    y = 24.0 + _GAP
    for box in boxes[:_MOST]:
        drawn, height = _draw_box(box, y)
        parts += drawn + [_arrow(y + height)]
        y += height + _GAP
    if dropped:
        parts += [_text(_WIDTH / 2, y + 14, f"… {dropped} more top-level calls: see the summary's table", "io",
                        "middle"), _arrow(y + 20)]
        y += 20 + _GAP
    out = _shape(root) if root is not None else "-"
    parts.append(_text(_WIDTH / 2, y + 14, f"output {out}", "io", "middle"))
    height = y + 26
    label = f"{result.model}: {len(boxes)} top-level module calls in order, with their output shapes"
    return (f'<svg class="structure" viewBox="0 0 {_WIDTH} {height:.0f}" '
            f'width="{_WIDTH}" height="{height:.0f}" role="img" aria-label="{html.escape(label)}">'
            '<defs><marker id="hs-head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>'
            + "".join(parts) + "</svg>")


def structure_section(s: Subject) -> Section:
    """The structure picture, from the summary's rows."""
    svg = structure_svg(s.summary())
    sec = Section("structure", "Structure", blocks=[f'<div class="svgbox">{svg}</div>'])
    sec.paragraphs.append("The model's top-level modules in the order they ran, each with its output shape (batch "
                          "dimension left out) and its parameter count; inside each box, the modules it called, "
                          "runs of one type and output shape merged (×n). Point at a box for details.")
    sec.data = {"modules": [{"name": b.row.name, "type": b.row.type, "output_shapes": b.row.output_shapes,
                             "calls": len(b.names), "children": [c.name for c in b.children]}
                            for b in _boxes(s.summary().rows)]}
    return sec
