"""What :func:`~hookscope.diff` reports: one :class:`DiffRow` per compared output, gathered in a
:class:`Diff` that renders itself as a table or JSON. Nothing here runs a model."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...core.result import Result, jsonable, missing
from ...core.text import shape_text, table
from ._tolerance import low_precision_tolerance

__all__ = ["DiffRow", "Unmatched", "Diff", "OK", "DIFFERS", "SHAPE", "STRUCTURE", "MISSING_A", "MISSING_B"]

OK, DIFFERS, SHAPE, STRUCTURE = "ok", "differs", "shape", "structure"
MISSING_A, MISSING_B = "missing in A", "missing in B"


@dataclass(frozen=True)
class DiffRow:
    """The comparison of one output tensor of one call of one module, run A against run B.

    ``max_rel`` is ``max|a - b| / max|b|`` (the error relative to B's largest magnitude): 0 when the
    tensors are equal, ``inf`` when B is all zeros and A is not. ``cosine`` is computed on the
    flattened tensors in float64; it is 1 for equal tensors (also all-zero ones) and 0 when exactly
    one of them is all zeros. ``mismatched`` counts the elements where ``|a - b| > atol + rtol*|b|``
    (as ``torch.isclose``: equal infinities agree, an infinity against a finite value does not).

    Non-finite values are matched by place: a NaN in both runs at the same place agrees (counted in
    ``nan``), and so does the same infinity (counted in ``inf``); these places are left out of
    ``max_abs``, ``max_rel`` and ``cosine``, which stay finite numbers. A NaN in one run only is a
    mismatch, counted in ``nan_a_only`` / ``nan_b_only`` and also left out of the three numbers.
    ``status`` is ``"ok"``, ``"differs"`` (beyond tolerance, or NaN in different places), ``"shape"``,
    ``"structure"`` (the outputs are not built alike: ``note`` says how), ``"missing in A"`` or
    ``"missing in B"`` (a call that happened in one run only). ``path`` locates the tensor inside a
    nested output (``"[0]"``, ``"['logits']"``, ``".hidden"``; ``""`` for a plain tensor); Python
    numbers in an output are compared as values too.

    ``rtol``, ``atol`` and ``spread`` are the tolerance this output was compared with: an element
    is beyond it where ``|a - b| > atol + rtol * |b| + spread * scale``. ``tolerance`` names the
    low-precision dtype it follows (``"bfloat16"``, ``"float16"``) where a run had computed in one
    up to this output and no ``rtol``/``atol`` was given: then ``rtol`` is the dtype's eps,
    ``scale`` the robust root mean square of B's output (masked values such as ``-1e9`` left out)
    and ``spread`` the detection limit, the fraction of that scale below which a change cannot be
    told from rounding (see :func:`~hookscope.diff`). ``""``, ``spread`` 0 and ``scale`` NaN for
    the element-wise float32 default or the user's own numbers.

    Example:
        >>> DiffRow("fc", 0, 0, "shape", (2, 4), (2, 5)).diverges
        True
    """

    name: str
    call: int
    part: int
    status: str
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs: float = math.nan
    max_rel: float = math.nan
    cosine: float = math.nan
    mismatched: int = 0
    numel: int = 0
    nan: int = 0
    inf: int = 0
    nan_a_only: int = 0
    nan_b_only: int = 0
    path: str = ""
    note: str = ""
    rtol: float = math.nan
    atol: float = math.nan
    tolerance: str = ""
    spread: float = 0.0
    scale: float = math.nan

    @property
    def diverges(self) -> bool:
        """True when this output is beyond tolerance, or could not be compared value by value."""
        return self.status != OK


class Unmatched(NamedTuple):
    """Selected names found in one model only, in that model's ``named_modules()`` order."""

    a_only: tuple[str, ...]
    b_only: tuple[str, ...]


# --- the words and numbers of one row --------------------------------------------------------------
def _sci(v: float) -> str:
    """Errors in a fixed scientific form, so that their magnitudes line up in a column."""
    return f"{v:.2e}" if not math.isnan(v) else "-"


def _nan_places(r: DiffRow) -> str:
    if not (r.nan_a_only or r.nan_b_only):
        return ""
    return f"NaN in different places ({r.nan_a_only} in A only, {r.nan_b_only} in B only)"


def _status(r: DiffRow) -> str:
    """The status cell: the verdict, then how non-finite values lined up."""
    notes = [_nan_places(r)] if r.nan_a_only or r.nan_b_only else []
    if r.nan or r.inf:
        same = " and ".join(f"{k} {what}" for k, what in ((r.nan, "NaN"), (r.inf, "Inf")) if k)
        notes.append(f"{same} at the same places")
    text = r.status if r.status != DIFFERS else f"DIFFERS ({r.mismatched}/{r.numel})"
    if r.tolerance and r.status in (OK, DIFFERS):
        text += f", {'within' if r.status == OK else 'beyond'} {r.tolerance} tolerance"
        text += f" (changes below {percent(r.spread)} of scale unseen)" if r.status == OK else ""
    return "; ".join([text, *notes, *([r.note] if r.note else [])])


def _what(f: DiffRow) -> str:
    """What is wrong with the first divergent row, in words."""
    if f.status == DIFFERS:
        beyond = f.mismatched - f.nan_a_only - f.nan_b_only
        which = (f"{f.tolerance} tolerance ({percent(f.spread)} of scale {f.scale:.3g} here)" if f.tolerance
                 else "tolerance")
        said = [f"{beyond} of {f.numel} elements beyond {which}, max abs {f.max_abs:.3e}"] if beyond else []
        return ", ".join([*said, _nan_places(f)] if f.nan_a_only or f.nan_b_only else said) or f.status
    if f.status == SHAPE:
        return f"shape {shape_text(f.shape_a)} in A, {shape_text(f.shape_b)} in B"
    if f.status == STRUCTURE:
        return f"structure: {f.note}"
    return f.status


def short(v: float) -> str:
    """A tolerance in a short scientific form: ``1.6e-2``, ``1e-5``.

    Example:
        >>> short(0.016), short(1e-05), short(0.0)
        ('1.6e-2', '1e-5', '0')
    """
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    mantissa, exponent = f"{v:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def percent(v: float) -> str:
    """A fraction as a percentage with two significant digits: ``10%``, ``3.9%``, ``0.49%``.

    Example:
        >>> percent(0.106), percent(0.039), percent(0.0049)
        ('11%', '3.9%', '0.49%')
    """
    return f"{v * 100:.2g}%" if v * 100 < 10 else f"{v * 100:.0f}%"


def _low(rows: Sequence[DiffRow]) -> dict[str, int]:
    """The low-precision tolerances followed, with how many outputs each."""
    found: dict[str, int] = {}
    for r in rows:
        if r.tolerance:
            found[r.tolerance] = found.get(r.tolerance, 0) + 1
    return found


def _pair(a: str | None, b: str | None) -> str:
    """One value when both runs agree (or B has none), else ``"a / b"``."""
    return a or "-" if a == b or b is None else f"{a or '-'} / {b}"


def _cells(r: DiffRow, label: str) -> list[str]:
    shapes = _pair(shape_text(r.shape_a), None if r.shape_b is None else shape_text(r.shape_b))
    cosine = f"{r.cosine:.6f}" if not math.isnan(r.cosine) else "-"
    return [label, shapes, _pair(r.dtype_a, r.dtype_b), _sci(r.max_abs), _sci(r.max_rel), cosine, _status(r)]


class Diff(Result):
    """The result of :func:`~hookscope.diff`: one :class:`DiffRow` per compared output, in run A's order.

    Rows come in the order the calls of run A finished (a layer's output exists before its parent's),
    then calls made in run B only. ``first`` is the first row that diverges, or ``None``;
    ``unmatched`` lists the selected names only one model has. ``d["name"]`` gives every row of one
    module (each call, each output tensor); ``"name" in d`` says whether it was compared.

    Example:
        >>> import torch
        >>> from hookscope import diff, settings
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> d = diff(net, net, torch.ones(2, 4), b=settings(autocast=torch.bfloat16))
        >>> [r.name for r in d], d.first, d["0"][0].dtype_b, d["0"][0].tolerance, "0" in d
        (['0', '1', ''], None, 'bfloat16', 'bfloat16', True)
    """

    def __init__(
        self,
        rows: Sequence[DiffRow],
        unmatched: Unmatched,
        *,
        rtol: float,
        atol: float,
        run_a: str,
        run_b: str,
        filled: str = "",
    ) -> None:
        self.rows = list(rows)
        self.filled = filled  # which of rtol/atol was filled in when the user gave only the other
        self.unmatched = unmatched
        self.rtol, self.atol = rtol, atol
        self.run_a, self.run_b = run_a, run_b
        self.first: DiffRow | None = next((r for r in self.rows if r.diverges), None)
        self._by_name: dict[str, list[DiffRow]] = {}
        for r in self.rows:
            self._by_name.setdefault(r.name, []).append(r)

    def __getitem__(self, name: str) -> list[DiffRow]:
        """Every row of one module (each call, each output tensor).

        Example:
            >>> import torch
            >>> from hookscope import diff
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
            >>> diff(net, net, torch.ones(1, 2))["O"]
            Traceback (most recent call last):
            ...
            hookscope.errors.RecordError: no layer 'O' in this result. It has: '0', ''.
        """
        found = self._by_name.get(name) if isinstance(name, str) else None
        if not found:
            raise missing(name, "layer", self._by_name)
        return list(found)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[DiffRow]:
        return iter(self.rows)

    def _labels(self) -> list[str]:
        """Each row's label: the name, ``#call`` for modules called more than once, ``[part]`` for
        outputs of several tensors."""
        calls: dict[str, set[int]] = {}
        parts: dict[tuple[str, int], int] = {}
        for r in self.rows:
            calls.setdefault(r.name, set()).add(r.call)
            parts[(r.name, r.call)] = parts.get((r.name, r.call), 0) + 1
        labels = []
        for r in self.rows:
            label = r.name or "(model)"
            label += f"#{r.call}" if len(calls[r.name]) > 1 else ""
            labels.append(label + (f"[{r.part}]" if parts[(r.name, r.call)] > 1 else ""))
        return labels

    def _verdict(self, labels: list[str]) -> list[str]:
        """The lines below the table: non-finite agreement, the first divergence, unmatched names."""
        out = []
        nan, inf = sum(r.nan for r in self.rows), sum(r.inf for r in self.rows)
        if nan or inf:
            out.append(f"non-finite values at the same places in both runs count as equal: {nan} NaN, "
                       f"{inf} Inf (left out of max abs, max rel and cosine)")
        if not self.rows:
            out.append("nothing compared: no selected module returned a tensor or a number in either run")
        elif self.first is None:
            low = ", ".join(f"{k} within {p} tolerance" for p, (k, *_) in self._bounds().items())
            out.append("no divergence: every compared output is within tolerance" + (f" ({low})" if low else ""))
        else:
            i, f = next((i, r) for i, r in enumerate(self.rows) if r is self.first)
            out.append(f"first divergence: {labels[i]} (call {f.call}): {_what(f)}")
        out += self._limits()
        for side, names in (("A", self.unmatched.a_only), ("B", self.unmatched.b_only)):
            if names:
                out.append(f"only in {side} ({len(names)}, not compared): {', '.join(names)}")
        return out

    def table(self, *, only_diverging: bool = False) -> str:
        """The comparison as a text table, with the first divergence and the unmatched names below.

        Example:
            >>> import torch
            >>> from hookscope import diff, settings
            >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            >>> d = diff(net, net, torch.ones(2, 4), b=settings(autocast=torch.bfloat16))
            >>> *_, verdict, limits = d.table().splitlines()
            >>> print(verdict)
            no divergence: every compared output is within tolerance (3 within bfloat16 tolerance)
            >>> print(limits)
            changes below 4.7% to 6.6% (at '1') of an output's scale cannot be told from bfloat16 rounding here
            >>> d = diff(net, net, torch.ones(2, 4), b=settings(autocast=torch.bfloat16), rtol=0, atol=0)
            >>> print(d.table(only_diverging=True).splitlines()[-1])  # doctest: +ELLIPSIS
            first divergence: 0 (call 0): ... of 8 elements beyond tolerance, max abs ...
        """
        labels = self._labels()
        body = [_cells(r, labels[i]) for i, r in enumerate(self.rows) if r.diverges or not only_diverging]
        head = ["layer", "shape", "dtype", "max abs", "max rel", "cosine", "status"]
        out = [
            f"run A: {self.run_a}",
            f"run B: {self.run_b}",
            f"{len(self.rows)} outputs compared; tolerance |a - b| <= {self.atol:g} + {self.rtol:g} * |b|"
            + (f" ({self.filled})" if self.filled else ""),
            *[f"{k} of them computed in {p} follow {p} tolerance: |a - b| <= atol + eps * |b| + spread * scale "
              f"(eps {short(eps)}, atol {short(atol)}, spread {short(spread)} x sqrt(depth), scale: the output's "
              "root mean square, masked values left out)" for p, (k, eps, atol, spread) in self._bounds().items()],
            "",
            *table(head, body, left={0, 1, 2, 6}, rule="columns"),
            "",
        ]
        return "\n".join(out + self._verdict(labels))

    def _limits(self) -> list[str]:
        """What the low-precision tolerances let pass unseen: the detection limits, in words."""
        out = []
        for p in self._bounds():
            rows = [(r.spread, -i) for i, r in enumerate(self.rows) if r.tolerance == p]
            (lo, _), (hi, i) = min(rows), max(rows)  # the first output with the largest limit
            i = -i
            label = self._labels()[i]
            label = label if label == "(model)" else repr(label)
            where = f"{percent(lo)} to {percent(hi)} (at {label})" if hi > lo else percent(hi)
            out.append(f"changes below {where} of an output's scale cannot be told from {p} rounding here")
        return out

    def _bounds(self) -> dict[str, tuple[int, float, float, float]]:
        """Each low-precision tolerance followed: how many outputs, its ``eps``, ``atol`` and
        ``spread`` at depth 1."""
        return {p: (k, *low_precision_tolerance(p)) for p, k in _low(self.rows).items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain data: settings, tolerance, rows, first divergence and unmatched names; shapes as
        lists and NaN or infinities as the strings ``"nan"``, ``"inf"`` (ready for JSON).

        Example:
            >>> import torch
            >>> from hookscope import diff
            >>> net = torch.nn.Linear(4, 4)
            >>> data = diff(net, net, torch.ones(2, 4)).to_dict()
            >>> data["first"], data["rows"][0]["status"], data["rows"][0]["shape_a"]
            (None, 'ok', [2, 4])
        """
        data: dict[str, Any] = jsonable({
            "run_a": self.run_a,
            "run_b": self.run_b,
            "rtol": self.rtol,
            "atol": self.atol,
            "first": self.first,
            "rows": self.rows,
            "unmatched": {"a_only": self.unmatched.a_only, "b_only": self.unmatched.b_only},
        })
        return data

    def __repr__(self) -> str:
        first = "none" if self.first is None else repr(self.first.name)
        return f"Diff({len(self.rows)} rows, first divergence: {first})"

