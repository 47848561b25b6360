"""HTML pieces the sections put on the page: sets of views with tabs or a picker, a grid picture with
its channel labels, a channel viewer, a colour legend and a table of rows. Every text is escaped here.

A view set works without JavaScript: every view is on the page under its own heading and no control
shows (see :mod:`.assets`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Axis", "Sheet", "View", "colour_legend", "labelled_grid", "row_table", "tile_viewer", "view_set"]

e = html.escape  # every text from a model or a user goes through it


@dataclass
class Axis:
    """One control of a view set: ``tabs`` (a row of buttons) or ``select`` (a drop-down list).

    ``choices`` are (value, label) pairs; the first is shown at first.
    """

    name: str
    label: str
    choices: Sequence[tuple[str, str]]
    kind: str = "tabs"


@dataclass
class View:
    """One view: its value on each axis, the heading it has when views are stacked, its HTML."""

    keys: dict[str, str]
    title: str
    body: str


def _control(a: Axis) -> str:
    if a.kind == "select":
        options = "".join(f'<option value="{e(v)}">{e(t)}</option>' for v, t in a.choices)
        return f'<label>{e(a.label)} <select data-axis="{e(a.name)}">{options}</select></label>'
    buttons = "".join(f'<button type="button" role="tab" data-value="{e(v)}">{e(t)}</button>' for v, t in a.choices)
    return f'<div class="tabs" role="tablist" aria-label="{e(a.label)}" data-axis="{e(a.name)}">{buttons}</div>'


def view_set(key: str, axes: Sequence[Axis], views: Sequence[View]) -> str:
    """Views chosen by tabs and pickers, or, without JavaScript, all of them one under another.

    Example:
        >>> out = view_set("cams", [Axis("image", "Image", [("0", "image 0"), ("1", "image 1")])],
        ...                [View({"image": "0"}, "image 0", "<p>a</p>"), View({"image": "1"}, "image 1", "<p>b</p>")])
        >>> out.count('class="view"'), 'data-axis="image"' in out, '<h3 class="view-title">image 1</h3>' in out
        (2, True, True)
    """
    controls = "".join(_control(a) for a in axes if len(a.choices) > 1)
    parts = [f'<div class="viewset" id="{e(key)}">']
    if controls:
        parts.append(f'<div class="controls">{controls}</div>')
    for v in views:
        keys = "".join(f' data-{e(k)}="{e(val)}"' for k, val in v.keys.items())
        parts.append(f'<div class="view"{keys}><h3 class="view-title">{e(v.title)}</h3>{v.body}</div>')
    parts.append("</div>")
    return "\n".join(parts)


@dataclass(frozen=True)
class Sheet:
    """Where the tiles of a grid picture are: ``columns`` per row, each ``th x tw`` pixels, ``pad`` apart
    (and around), in a picture of ``h x w`` pixels (the tile geometry of :mod:`hookscope.viz.features`)."""

    path: str
    h: int
    w: int
    th: int
    tw: int
    pad: int
    columns: int

    def origin(self, j: int) -> tuple[int, int]:
        """Tile ``j``'s top-left pixel (y, x)."""
        row, column = divmod(j, self.columns)
        return self.pad + row * (self.th + self.pad), self.pad + column * (self.tw + self.pad)


def labelled_grid(sheet: Sheet, labels: Sequence[str], alt: str) -> str:
    """The grid picture with each tile's label in its top-left corner (placed in percent: it scales)."""
    spans = []
    for j, label in enumerate(labels):
        y, x = sheet.origin(j)
        spans.append(f'<span class="tl" style="left:{100 * x / sheet.w:.2f}%;top:{100 * y / sheet.h:.2f}%">'
                     f"{e(label)}</span>")
    return f'<div class="grid"><img src="{e(sheet.path)}" alt="{e(alt)}">{"".join(spans)}</div>'


def tile_viewer(sheet: Sheet, options: Sequence[str]) -> str:
    """A picker of one tile of ``sheet``, shown enlarged (JavaScript only; ``options`` label the tiles in order)."""
    opts = "".join(f'<option value="{j}">{e(t)}</option>' for j, t in enumerate(options))
    data = " ".join(f'data-{k}="{v}"' for k, v in (("h", sheet.h), ("w", sheet.w), ("th", sheet.th), ("tw", sheet.tw),
                                                   ("pad", sheet.pad), ("cols", sheet.columns)))
    return (f'<div class="zoom" data-sheet="{e(sheet.path)}" {data}><label>Channel <select>{opts}</select></label> '
            f'<span class="tile-note"></span><div class="tile" role="img" aria-label="the chosen channel"></div></div>')


def colour_legend(colours: Sequence[str], low: str, high: str, what: str) -> str:
    """A colour ramp from ``low`` to ``high`` (CSS colours in order), and what it measures."""
    ramp = ", ".join(colours)
    return (f'<div class="legend"><span>{e(what)}:</span><span>{e(low)}</span>'
            f'<span class="ramp" style="background:linear-gradient(to right, {e(ramp)})"></span>'
            f"<span>{e(high)}</span></div>")


def row_table(head: Sequence[str], rows: Sequence[Sequence[str]], bad: Sequence[bool] | None = None) -> str:
    """A table of rows (``bad`` rows tinted red).

    Example:
        >>> row_table(["layer", "max abs"], [["fc", "0.5"]], [True])
        '<table class="rows"><tr><th>layer</th><th>max abs</th></tr><tr class="bad"><td>fc</td><td>0.5</td></tr></table>'
    """
    marks = list(bad) if bad is not None else [False] * len(rows)
    body = "".join(('<tr class="bad">' if m else "<tr>") + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                   for r, m in zip(rows, marks))
    return f'<table class="rows"><tr>{"".join(f"<th>{e(h)}</th>" for h in head)}</tr>{body}</table>'
