"""Text output shared by every result: tables, shapes, dtypes, numbers, an exception's first line.

Nothing here imports from hookscope; every ``table()`` of every result is laid out by :func:`table`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["table", "html_table", "cell_text", "shape_text", "dtype_text", "num", "first_line"]

CELL_CHARS = 120  # a cell of a notebook table past this many characters keeps its head and "..."


def table(
    head: Sequence[str],
    body: Sequence[Sequence[str]],
    *,
    left: Container[int] = (),
    rule: str | None = "line",
    pad_last: bool = True,
) -> list[str]:
    """Lines of a text table: the header, a rule, then one line per row; columns two spaces apart.

    Args:
        head, body: the header and the rows, as strings.
        left: indices of the columns aligned left (the others are aligned right).
        rule: ``"line"``: one dashed line as long as the header; ``"columns"``: dashes under each
            column; ``None``: no rule (the caller draws its own).
        pad_last: ``False`` leaves the last column as it is (a free-text column).

    Example:
        >>> print("\\n".join(table(["name", "n"], [["a", "1"], ["bb", "10"]], left={0})))
        name   n
        --------
        a      1
        bb    10
    """
    sized = len(head) if pad_last else len(head) - 1
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(sized)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        parts += list(cells[sized:])
        return "  ".join(parts).rstrip()

    lines = [line(head), *(line(r) for r in body)]
    if rule == "line":
        lines.insert(1, "-" * len(lines[0]))
    elif rule == "columns":
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def shape_text(shape: Sequence[int] | None) -> str:
    """``(1, 3, 224, 224)`` -> ``"1x3x224x224"``; ``()`` -> ``"scalar"``; ``None`` -> ``"-"``.

    Example:
        >>> shape_text((1, 3, 224, 224)), shape_text(()), shape_text(None)
        ('1x3x224x224', 'scalar', '-')
    """
    if shape is None:
        return "-"
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def dtype_text(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: a dtype as every table and message writes it.

    Example:
        >>> import torch
        >>> dtype_text(torch.float32), dtype_text(torch.bool)
        ('float32', 'bool')
    """
    return str(dtype).removeprefix("torch.")


def num(v: float | None, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; ``None`` and NaN as ``"-"``.

    Example:
        >>> num(3.14159), num(None), num(float("nan")), num(float("inf"))
        ('3.142', '-', '-', 'inf')
    """
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}g}"


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name when the message is empty); past
    ``limit`` characters, cut at a word and ended with "...".

    Example:
        >>> first_line(ValueError("bad shape\\n  more detail"))
        'bad shape'
        >>> first_line(KeyError())
        'KeyError'
        >>> first_line(ValueError("one two three"), limit=9)
        'one two...'
    """
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines and lines[0].strip() else type(exc).__name__
    if len(line) <= limit:
        return line
    head = line[:limit]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;:.") + "..."


def cell_text(v: Any) -> str:
    """A value as one cell of a notebook table: numbers to 4 significant digits (NaN as ``"nan"``),
    ``None`` as nothing, a tensor of more than 8 values as its shape and dtype, anything longer than
    :data:`CELL_CHARS` cut with "...". Integers get thousands separators, a sequence of names is
    the names joined, a list of shapes the shapes as ``1x3x32x32``.

    Example:
        >>> import torch
        >>> [cell_text(v) for v in (3.14159, float("nan"), None, (2, 3), torch.zeros(2, 5), "a<b")]
        ['3.142', 'nan', '', '(2, 3)', 'tensor 2x5 float32', 'a<b']
        >>> [cell_text(v) for v in (33338, ("layer3.3",), ["conv", "fc"], [(1, 3, 32, 32), (1, 10)], True)]
        ['33,338', 'layer3.3', 'conv, fc', '1x3x32x32, 1x10', 'True']
    """
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
        v = ", ".join(v)
    elif isinstance(v, list) and v and all(isinstance(x, tuple) and all(type(n) is int for n in x) for x in v):
        v = ", ".join(shape_text(x) for x in v)
    if hasattr(v, "dtype") and hasattr(v, "shape") and getattr(v, "numel", lambda: 0)() > 8:
        return f"tensor {shape_text(tuple(v.shape))} {dtype_text(v.dtype)}"
    if hasattr(v, "tolist") and hasattr(v, "dtype"):
        v = v.tolist()
    text = str(v) if not isinstance(v, Mapping) else str(dict(v))
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 3] + "..."


def html_table(head: Sequence[str], body: Sequence[Sequence[str]], *, caption: str = "",
               left: Container[int] = ()) -> str:
    """An HTML ``<table>`` of text cells, every cell and the caption escaped; ``left`` as for :func:`table`.

    Example:
        >>> print(html_table(["name", "n"], [["<a>", "1"]], caption="1 row", left={0}))
        <table class="hookscope">
        <caption>1 row</caption>
        <thead><tr><th style="text-align:left">name</th><th style="text-align:right">n</th></tr></thead>
        <tbody>
        <tr><td style="text-align:left">&lt;a&gt;</td><td style="text-align:right">1</td></tr>
        </tbody>
        </table>
    """
    def align(i: int) -> str:
        return ' style="text-align:left"' if i in left else ' style="text-align:right"'

    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(f"<{tag}{align(i)}>{html.escape(c)}</{tag}>" for i, c in enumerate(row))

    lines = ['<table class="hookscope">']
    if caption:
        lines.append(f"<caption>{html.escape(caption)}</caption>")
    lines += [f"<thead><tr>{cells('th', head)}</tr></thead>", "<tbody>"]
    lines += [f"<tr>{cells('td', row)}</tr>" for row in body]
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)
