"""The cells of a patching sweep: which component of which block, at which position or head, and the
grid they make (rows: blocks; columns: positions, heads, or component kinds).

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import HookscopeError
from ._model import Decoder

__all__ = ["STREAM_KINDS", "HEAD_KINDS", "Cell", "Grid", "grid"]

STREAM_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_KINDS = ("attn.z", "attn.q", "attn.k", "attn.v", "attn.pattern")
PER = ("position", "head", "layer")


@dataclass(frozen=True)
class Cell:
    """One cell: row ``layer``, column ``column``, the component ``name`` patched, at one ``pos`` and/or
    one ``head`` (``None``: all of them)."""

    layer: int
    column: int
    name: str
    pos: int | None = None
    head: int | None = None


@dataclass(frozen=True)
class Grid:
    """The sweep's cells, its ``kind`` and ``per``, and its rows' and columns' labels."""

    kind: str
    per: str
    rows: list[str]
    columns: list[str]
    cells: list[Cell]


def _kinds(kind: str | Sequence[str]) -> list[str]:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    known = STREAM_KINDS + HEAD_KINDS
    for k in kinds:
        if k not in known:
            raise HookscopeError(f"component={k!r} is not a component kind patching sweeps over; give one of "
                                 f"{', '.join(known)}, or several of them (a layer x kind grid)")
    if not kinds:
        raise HookscopeError("component= names no component kind; give one of " + ", ".join(known))
    return kinds


def grid(d: Decoder, kind: str | Sequence[str], per: str | None, length: int) -> Grid:
    """The cells of ``kind`` (one component kind, or several: one column each, all positions at once)
    swept ``per`` position, head or layer, for prompts of ``length`` tokens."""
    kinds = _kinds(kind)
    if per is not None and per not in PER:
        raise HookscopeError(f"per={per!r} is not one of {', '.join(PER)}")
    for k in kinds:  # a name the family lacks: the family's own reason
        d[f"blocks.0.{k}"]
    rows = [f"blocks.{i}" for i in range(d.blocks)]
    label = kinds[0] if len(kinds) == 1 else ",".join(kinds)
    if len(kinds) > 1:
        if per not in (None, "layer"):
            raise HookscopeError(f"several kinds make a layer x kind grid, every position at once: per={per!r} "
                                 "goes with one kind")
        cells = [Cell(i, j, f"blocks.{i}.{k}") for i in range(d.blocks) for j, k in enumerate(kinds)]
        return Grid(label, "layer", rows, kinds, cells)
    k = kinds[0]
    per = per or ("head" if k in HEAD_KINDS else "position")
    if per == "head" and k not in HEAD_KINDS:
        raise HookscopeError(f"component={k!r} has no heads; sweep it per='position' or per='layer', or give one of "
                             f"{', '.join(HEAD_KINDS)}")
    if per == "position" and k == "attn.pattern":
        raise HookscopeError("component='attn.pattern' is swept per='head' (each head's whole pattern) or per='layer'")
    if per == "layer":
        return Grid(k, per, rows, [k], [Cell(i, 0, f"blocks.{i}.{k}") for i in range(d.blocks)])
    if per == "position":
        return Grid(k, per, rows, [str(p) for p in range(length)],
                    [Cell(i, p, f"blocks.{i}.{k}", pos=p) for i in range(d.blocks) for p in range(length)])
    heads = d[f"blocks.0.{'attn.z' if k == 'attn.pattern' else k}"].view.heads
    return Grid(k, per, rows, [str(h) for h in range(heads)],
                [Cell(i, h, f"blocks.{i}.{k}", head=h) for i in range(d.blocks) for h in range(heads)])
