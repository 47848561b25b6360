"""The summary as text for people: a title, the module tree as a table between rules, the totals.

Laid out by :func:`hookscope.core.text.table` like every result's table; the free-text Notes column
is left unpadded and the rules are ``=`` lines as wide as the header. Nothing here runs a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.text import shape_text, table
from ._rows import Row, Shape

if TYPE_CHECKING:
    from ._result import Summary

__all__ = ["render"]

_HEADERS = ("Layer (type)", "Output shape", "Params", "Total", "Trainable", "Buffers", "Mult-adds", "Mode", "Notes")
_LEFT = {0, 1, 7, 8}
_ZEROS = 3  # where the "Zeros" column goes when the model holds a mask or a zero weight: after Params


def _scaled(n: float, units: tuple[str, ...], base: int) -> str:
    for unit in units:
        n /= base
        if abs(n) < base or unit == units[-1]:
            break
    return f"{n:.2f} {unit}"


def _bytes(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n:,} B ({_scaled(n, ('KiB', 'MiB', 'GiB', 'TiB'), 1024)})"


def _count(n: int) -> str:
    return f"{n:,}" if n < 1000 else f"{n:,} ({_scaled(n, ('K', 'M', 'G', 'T'), 1000)})"


def _shapes(shapes: list[Shape]) -> str:
    shown = ", ".join(shape_text(s) for s in shapes[:4])
    return (shown + f", ... ({len(shapes)} tensors)") if len(shapes) > 4 else shown or "-"


def _macs_cell(macs: int, partial: bool) -> str:
    if partial:  # a lower bound: some product was not counted
        return f">= {macs:,}" if macs else "?"
    return f"{macs:,}" if macs else "-"


def _percent(zeros: int | None, total: int) -> str:
    if zeros is None:
        return "?"  # values that cannot be read (meta device)
    if not total:
        return "-"
    share = 100 * zeros / total
    return "<0.1%" if 0 < share < 0.1 else ">99.9%" if 99.9 < share < 100 else f"{share:.1f}%"


def _notes(r: Row) -> str:
    notes = []
    if r.calls > 1:
        notes.append(f"call {r.call + 1} of {r.calls}")
    if r.call == 0:  # what is true of the module is said once, on its first call
        notes += [f"{k} shared with {v}" for k, v in r.shared.items()]
        notes += [f"also named {a}" for a in r.aliases]
        notes += [f"{k} masked" for k in r.masked]
    if r.uncounted:
        notes.append(f"mult-adds not counted: {', '.join(r.uncounted)}")
    return "; ".join(notes)


def _cells(r: Row, zeros: bool) -> list[str]:
    label = "  " * r.depth + (f"{r.name} ({r.type})" if r.name else r.type)
    first = r.call == 0  # counts of the module on its first call; "--" on the others
    if r.params_total == 0:
        trainable = "-"
    else:
        trainable = "yes" if r.frozen_total == 0 else "no" if r.trainable_total == 0 else "partial"
    cells = [
        label,
        _shapes(r.output_shapes) if r.called else "(not called)",
        f"{r.params:,}" if first else "--",
        f"{r.params_total:,}" if first else "--",
        trainable if first else "--",
        f"{r.buffer_numel:,}" if first else "--",
        _macs_cell(r.macs, r.macs_partial),
        "train" if r.training else "eval",
        _notes(r),
    ]
    if zeros:
        cells.insert(_ZEROS, _percent(r.zeros, r.params) if first else "--")
    return cells


def _uncounted(s: Summary) -> str:
    where = [f"{', '.join(r.uncounted)} in {r.name or s.model}" for n in s.modules if n in s for r in s[n] if r.uncounted]
    where = list(dict.fromkeys(where))
    return "; ".join(where[:3]) + (f" and {len(where) - 3} more (Row.uncounted)" if len(where) > 3 else "")


def _zeros_line(s: Summary) -> list[str]:
    t = s.totals
    if not t.sparse:
        return []
    zeros = "?" if t.zeros is None else _count(t.zeros)
    n = len(t.masked)
    masks = (f"; {n} masked tensor{'s' if n > 1 else ''} ({', '.join(t.masked[:3])}{', ...' if n > 3 else ''}), "
             "each counted once as <name>_orig, its mask a buffer") if n else ""
    return [f"Zeros: {zeros} of {t.params:,} params ({_percent(t.zeros, t.params)}){masks}"]


def _footer(s: Summary) -> list[str]:
    t = s.totals
    return [
        f"Params: {_count(t.params)}; trainable {t.trainable:,}, frozen {t.frozen:,} "
        "(shared tensors counted once)",
        *_zeros_line(s),
        f"Param bytes: {_bytes(t.param_bytes)}",
        f"Buffers: {t.buffers} tensors, {t.buffer_numel:,} elements, {_bytes(t.buffer_bytes)}",
        f"Mult-adds: {_count(t.macs)}" + (f" at least; not counted: {_uncounted(s)}" if t.macs_partial else "")
        + (" (dense: a masked weight's zeros are multiplied too)" if t.masked else ""),
        f"Input bytes: {_bytes(t.input_bytes)}",
        f"Activation bytes (new outputs of innermost calls): {_bytes(t.activation_bytes)}",
        f"Module calls: {t.calls}; modules: {t.modules}, never called: {t.not_called}",
    ]


def render(s: Summary) -> str:
    """The text of :meth:`Summary.table`, ending with a newline.

    Example:
        >>> import torch
        >>> from hookscope import summary
        >>> print(render(summary(torch.nn.ReLU(), torch.zeros(2))).splitlines()[4])
        ReLU          2                0      0          -        0          -  train
    """
    zeros = s.totals.sparse
    headers = (*_HEADERS[:_ZEROS], "Zeros", *_HEADERS[_ZEROS:]) if zeros else _HEADERS
    left = {i + (zeros and i >= _ZEROS) for i in _LEFT}
    head, *body = table(headers, [_cells(r, zeros) for r in s.rows], left=left, rule=None, pad_last=False)
    rule = "=" * len(head)  # the header's last cell is never empty: it is as wide as the table
    got = ", ".join(f"{shape_text(shape)} {dtype}" for shape, dtype in s.inputs)
    depth = "" if s.depth is None else f", depth <= {s.depth}"
    out = [f"{s.model}: input {got}{depth}", rule, head, rule, *body, rule, *_footer(s), rule]
    return "\n".join(out) + "\n"
