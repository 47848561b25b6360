"""Name the first module whose output, or gradient, holds a NaN or an Inf (``hookscope.watch``).

Built on the statistics engine (``_recorder.py``, ``_rows.py``), as ``trace`` is: every output in the forward pass, and every gradient
in the backward pass (arriving at an output, sent back to an input, or accumulated into a
parameter's ``.grad``), is reduced on its device; the first non-finite one, in the order the calls
finished and the gradients arrived, is the culprit.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch  # noqa: F401 - the examples use it
from torch import nn

from ..core.ops import SEP
from ..core.result import Result
from ..errors import HookscopeError, NonFiniteError, checked  # NonFiniteError lives with every other error
from ..selection import Selector, unwrap
from ..capture import parse_keep
from ._recorder import Context, RecorderSession, param_targets, select
from ._rows import ByModule, Pending, StatRow, gather, render

__all__ = ["NonFiniteError", "OwnForward", "Watch", "watch"]

RESOLVE_EVERY = 4096
"""Without ``raise_on_nonfinite``, the statistics are read back once per this many records (one
host synchronisation each), to keep only the last few calls in memory during long runs."""

_CallKey = tuple[str, int, str]  # (module, call, phase): the records of one call, forward or backward


def _key(row: StatRow) -> _CallKey:
    return row.module, row.call, row.phase


@dataclasses.dataclass(frozen=True)
class OwnForward(StatRow):
    """A culprit made by a module's own forward code, between two of its children (or before the
    first): ``module`` and ``call`` are the parent's (``""`` the model), ``which`` is
    ``"own_forward"``, ``path`` names what the next child received (``"p.b input[0]"``), the
    statistics are of that tensor, and ``note`` says it in words.

    With selectors, a parent that has a child not watched cannot tell its own code from that
    child's: then ``which`` is ``"unwatched"``, ``module`` is the innermost watched module
    running (``""`` the model), which holds the maker without being named as it, and ``note``
    says "appeared outside the watched modules, between ... : in the forward of the model or of
    a module in it that is not watched (watch without selectors to name it)".

    Example:
        >>> class Parent(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b = nn.Identity(), nn.Identity()
        ...     def forward(self, x):
        ...         return self.b(self.a(x) / 0)
        >>> net = nn.Sequential(Parent())
        >>> with watch(net) as w:
        ...     _ = net(torch.ones(1, 2))
        >>> w.culprit.describe()
        "appeared in '0' (Parent)'s own forward, between '0.a' (finite output) and '0.b' (received Inf input): 0 NaN, 2 Inf of 2 values"
    """

    note: str = ""

    def describe(self) -> str:
        """The note, then the non-finite counts."""
        return f"{self.note}: {self.nan} NaN, {self.inf} Inf of {self.numel} values"


def _own(row: StatRow, context: Context, certain: bool) -> OwnForward:
    """The culprit when ``row`` (what a call received) was made by the running parent's own code;
    or, unless ``certain``, somewhere inside the parent: in its own code or in a module it holds
    that is not watched (which one cannot be told, and none is named)."""
    parent, call, kind, after, _ = context
    what = " and ".join(w for k, w in ((row.nan, "NaN"), (row.inf, "Inf")) if k)
    child = f"{row.module!r} (received {what} input)"
    when = f"between {after!r} (finite output) and {child}" if after is not None else f"before {child}"
    fields = {**dataclasses.asdict(row), "module": parent or "", "call": call, "path": f"{row.module} {row.path}"}
    if not certain:
        inside = "the model" if parent == "" else f"{parent!r} ({kind})"
        note = (f"appeared outside the watched modules, {when}: in the forward of {inside} or of a module "
                "in it that is not watched (watch without selectors to name it)")
        return OwnForward(**{**fields, "which": "unwatched"}, note=note)
    where = f"the model's own forward ({kind})" if parent == "" else f"{parent!r} ({kind})'s own forward"
    when = when if after is not None else f"before its first child {child}"
    return OwnForward(**{**fields, "which": "own_forward"}, note=f"appeared in {where}, {when}")


def _numbered(rows: list[StatRow], start: int) -> list[StatRow]:
    """Rows numbered from ``start`` leaving out the checks of what a call received (never shown:
    a check takes the number of the record after it)."""
    if all(r.which != "received" for r in rows):
        return rows
    out, i = [], start
    for r in rows:
        out.append(dataclasses.replace(r, index=i))
        i += r.which != "received"
    return out


class Watch(RecorderSession, ByModule, Result):  # the session's operations_ran, not ByModule's
    """A context that finds the first non-finite output or gradient; build it with :func:`watch`.

    After the block: ``culprit``, ``before``, ``finite``, ``rows``, ``table()`` (also ``str(w)``),
    ``to_dict()`` and ``to_json()``.
    """

    _kind = "watch"
    _result_fields = tuple(f.name for f in dataclasses.fields(StatRow))

    def __init__(self, selected: list[tuple[str, nn.Module]], *, raise_on_nonfinite: bool, last: int,
                 keep: frozenset[str], root: nn.Module | None = None,
                 params: Sequence[tuple[str, str, nn.Parameter]] = (), model: nn.Module | None = None) -> None:
        self.raise_on_nonfinite = raise_on_nonfinite
        self.last = last
        self.checked = 0  # records examined so far
        self._pending: list[Pending] = []
        # the records of the most recent calls, oldest call first: last + 1 of them, so that the
        # culprit's own call and ``last`` others are at hand whichever call the culprit is in
        self._recent: OrderedDict[_CallKey, list[StatRow]] = OrderedDict()
        self._culprit: StatRow | None = None
        self._before: list[StatRow] = []
        self._lock = threading.RLock()
        self._contexts: dict[tuple[str, int], Context] = {}  # where the inputs of pending calls came from
        # the forward passes whose model input was not finite: no module's code made what followed
        self._from_caller: set[int] = set()
        self._watched = {name for name, _ in selected}
        self._root = root
        super().__init__(selected, keep=keep, sink=self._take, root=root, params=params, model=model,
                         received=True, on_context=self._note)

    def _note(self, name: str, call: int, kind: str, context: Context) -> None:
        with self._lock:
            self._contexts[(name, call)] = context

    def _take(self, event: Pending) -> None:
        with self._lock:
            self._pending.append(event)
            # raising at the culprit needs its numbers now: one synchronisation per record
            if self.raise_on_nonfinite or len(self._pending) >= RESOLVE_EVERY:
                self._resolve()

    def _keep(self, row: StatRow) -> None:
        key = _key(row)
        if key in self._recent:
            self._recent.move_to_end(key)
            self._recent[key].append(row)
        else:
            self._recent[key] = [row]
            if len(self._recent) > self.last + 1:
                self._recent.popitem(last=False)

    def _calls_before(self, culprit: StatRow) -> list[StatRow]:
        """The culprit's own earlier records and those of the ``last`` calls before it."""
        own = _key(culprit)
        others = [k for k in self._recent if k != own]
        keep = others[max(len(others) - self.last, 0):] if self.last else []
        rows = [r for k in [*keep, own] for r in self._recent.get(k, [])]
        return sorted(rows, key=lambda r: r.index)

    def _blame(self, row: StatRow) -> StatRow | None:
        """The culprit for the first non-finite record ``row``; None if it is not one (the model's
        input, which the first module that outputs it is named for, as ever)."""
        if row.phase != "forward" or row.which not in ("input", "received"):
            return row
        context = self._contexts.get((row.module, row.call))
        if context is not None and context[0] is None and row.which == "received":
            self._from_caller.add(context[4])
        if context is None or context[0] is None or context[4] in self._from_caller:
            return row if row.which == "input" else None
        return _own(row, context, self._all_watched(context[0]))

    def _all_watched(self, parent: str) -> bool:
        """Whether every direct child of ``parent`` is watched: then code that ran inside it and
        outside its watched children is its own forward's."""
        if self._root is None or SEP in parent:  # a call inside an operation: no child of a module
            return False
        module = self._root.get_submodule(parent) if parent else self._root
        prefix = f"{parent}." if parent else ""
        return all(f"{prefix}{n}" in self._watched for n, _ in module.named_children())

    def _resolve(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending or self._culprit is not None:
                return
            rows = _numbered(gather(pending, start=self.checked), self.checked)
            try:
                for row in rows:
                    hidden = row.which == "received"  # a check, not a record to show
                    self.checked += not hidden
                    culprit = None if row.finite else self._blame(row)
                    if culprit is None:
                        if not hidden:
                            self._keep(row)
                        continue
                    self._culprit, self._before = culprit, self._calls_before(culprit)
                    self._recent.clear()
                    self._rec.enabled = False  # nothing after the culprit matters
                    if self.raise_on_nonfinite:
                        raise NonFiniteError(culprit, self._before)
                    return
            finally:
                for item in pending:
                    self._contexts.pop((item[0], item[1]), None)

    @property
    def culprit(self) -> StatRow | None:
        """The first record with a NaN or an Inf, or ``None`` if everything was finite.

        Example:
            >>> import torch
            >>> net = nn.Sequential(nn.Identity(), nn.Softplus(), nn.Identity())
            >>> with watch(net) as w:
            ...     _ = net(torch.tensor([1.0, float("-inf")]))
            >>> w.culprit.module, w.culprit.which, w.culprit.inf
            ('0', 'output', 1)
        """
        self._resolve()
        return self._culprit

    @property
    def before(self) -> list[StatRow]:
        """Every record (all finite) of the ``last`` module calls just before the culprit, and the
        culprit's own call's earlier records, oldest first. A call's backward records (gradients
        of that call, and the ``.grad`` of its module's parameters) count as a call of their own.

        Example:
            >>> import torch
            >>> big = nn.Linear(1, 1, bias=False)
            >>> _ = big.weight.data.fill_(1e30)
            >>> net = nn.Sequential(nn.Identity(), nn.Identity(), big)
            >>> with watch(net, last=1, keep="all") as w:  # 1e30 * 1e30 overflows in '2'
            ...     _ = net(torch.tensor([[1e30]]))
            >>> [(r.module, r.which) for r in w.before]
            [('1', 'input'), ('1', 'output'), ('2', 'input')]
        """
        self._resolve()
        return list(self._before)

    @property
    def finite(self) -> bool:
        """Every watched output and gradient was finite.

        Example:
            >>> import torch
            >>> net = nn.Sequential(nn.Linear(2, 1))
            >>> with watch(net) as w:
            ...     net(torch.ones(1, 2)).sum().backward()
            >>> w.finite
            True
        """
        return self.culprit is None

    @property
    def rows(self) -> list[StatRow]:
        """The records at hand, oldest first: those of :attr:`before` and the culprit; if all was
        finite, every record of the last ``last + 1`` calls watched.

        Example:
            >>> import torch
            >>> net = nn.Sequential(nn.Identity(), nn.Identity())
            >>> with watch(net, last=0) as w:
            ...     _ = net(torch.ones(1))
            >>> [(r.module, r.which) for r in w.rows]
            [('1', 'output')]
        """
        with self._lock:
            self._resolve()
            if self._culprit is not None:
                return [*self._before, self._culprit]
            return sorted((r for rows in self._recent.values() for r in rows), key=lambda r: r.index)

    def table(self) -> str:
        """What a person reads: the culprit and the records before it, or that all was finite
        (also ``str(w)``).

        Example:
            >>> import torch
            >>> net = nn.Sequential(nn.Identity(), nn.Identity())
            >>> with watch(net, last=1) as w:
            ...     _ = net(torch.tensor([float("nan")]))
            >>> print(w.table())
            first non-finite value: '0' call 0, forward output output 1: 1 NaN, 0 Inf of 1 values
            <BLANKLINE>
            the culprit:
            #  module  call  what    path    shape  dtype    mean  std  min  max  |max|  zeros  nan  inf
            --------------------------------------------------------------------------------------------
            0  0          0  output  output      1  float32   nan  nan  nan  nan    nan   0.0%    1    0
        """
        row = self.culprit
        if row is None:
            missed = "".join(f"; {line}" for line in self.never_ran())
            return f"all finite: {self.checked} outputs and gradients checked, no NaN and no Inf{missed}"
        lines = [f"first non-finite value: {row.describe()}"]
        if self._before:
            keys = {_key(r) for r in self._before}
            calls = len(keys - {_key(row)})
            own = " and the culprit's own call" if _key(row) in keys else ""
            lines += ["", f"the {len(self._before)} records before it (the last {calls} "
                          f"call{'s' * (calls != 1)}{own}, all finite):", render(self._before)]
        lines += ["", "the culprit:", render([row])]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``finite``, ``checked`` (records examined), ``culprit`` (a row as a dict, or
        ``None``) and ``rows`` (see :attr:`rows`).

        Example:
            >>> import torch, json
            >>> net = nn.Sequential(nn.Identity())
            >>> with watch(net) as w:
            ...     _ = net(torch.tensor([float("inf")]))
            >>> data = json.loads(w.to_json())
            >>> data["finite"], data["culprit"]["module"], data["culprit"]["max"]
            (False, '0', 'inf')
        """
        row = self.culprit
        return {"finite": row is None, "checked": self.checked,
                "culprit": None if row is None else dataclasses.asdict(row),
                "rows": [dataclasses.asdict(r) for r in self.rows]}

    def __repr__(self) -> str:
        return f"Watch(checked={self.checked}, culprit={self._culprit!r})"


@checked
def watch(model: nn.Module, *selectors: Selector, raise_on_nonfinite: bool = False, last: int = 5,
          keep: str | Iterable[str] = ("output", "grads"), param_grads: bool = True) -> Watch:
    """Find the first module whose forward output, or backward gradient, holds a NaN or an Inf.

    Order is execution order: forward records in the order calls finish (an inner module before
    the block that contains it), then backward records in the order gradients arrive; for a
    gradient, ``grad_input`` (what a module sent back to its input) names the module that made it
    non-finite, as ``sqrt`` at 0 does, and ``grad_param`` the module whose parameter's ``.grad``
    is non-finite (``path`` names the parameter). A value a module's own forward code makes
    between two of its children is that module's (an :class:`OwnForward` culprit: "appeared in
    'p' (Parent)'s own forward, between 'p.a' (finite output) and 'p.b' (received NaN input)"; the
    innermost running watched module, ``""`` for the model); to know it, each call's inputs that no
    watched call produced are checked (one ``sum`` on the CPU, nothing recorded when finite). With
    selectors, where that module has children not watched, no module is named as the maker
    (``which="unwatched"``: "appeared outside the watched modules, between ..."). A non-finite
    model input is not a module's doing: the first module that outputs it is named, in that
    forward pass (a later pass's own NaN is still its maker's).
    Without ``raise_on_nonfinite`` the statistics
    stay on the device until read (``culprit``, ``table()``, or every :data:`RESOLVE_EVERY`
    records).

    Args:
        model: any ``nn.Module``; names are the inner model's, through wrappers.
        *selectors: as for :func:`hookscope.layers`; none watches every module but the root (a model
            without children watches itself). An operation selector (``"norm::div"``, ``"::*"``
            for the model's own operations, ``"*::*"`` for every module's) watches each call of
            those operations, named by the operation that ran (``"norm::div"``, ``"h.0::add.1"``
            for the second ``add`` of one call), so that the culprit is the operation that made
            the value, not the module around it.
        raise_on_nonfinite: raise :class:`~hookscope.NonFiniteError` inside the hook that sees the
            first NaN or Inf, so the traceback points there. Costs one host synchronisation per record.
        last: how many module calls before the culprit to keep, with all their records (their
            statistics are in the report); a call's forward and its backward count as two calls.
        keep: what to check, in :func:`hookscope.capture`'s words: outputs and both gradients by
            default; ``"all"`` checks each module's inputs too (to tell a non-finite model input
            apart), ``"output"`` only the forward pass.
        param_grads: also check the ``.grad`` of every trainable parameter of the watched modules
            and their submodules (of the whole model without selectors) after each backward pass.

    Raises:
        ForwardError: a forward pass in the block raised an exception inside a watched module or
            the model's own forward (named, with the shapes that reached it; the model's exception
            is its ``__cause__``).
        NonFiniteError: with ``raise_on_nonfinite``, at the first NaN or Inf.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LogSigmoid(), torch.nn.Linear(2, 1))
        >>> with hookscope.watch(net) as w:
        ...     net(torch.full((1, 2), float("inf"))).sum().backward()
        >>> w.culprit.module, w.culprit.which
        ('0', 'output')
        >>> class Norm(torch.nn.Module):
        ...     def forward(self, x):
        ...         return (x - x.mean()) / x.std()
        >>> norm = Norm()
        >>> with hookscope.watch(norm, "::*") as w:  # the model's own operations
        ...     _ = norm(torch.ones(3))              # std 0: 0 / 0
        >>> w.culprit.describe()
        "'::div' call 0, forward output output 3: 3 NaN, 0 Inf of 3 values"
    """
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise HookscopeError(f"last={last!r} must be a whole number of module calls, 0 or more")
    fields = parse_keep(keep)
    selected = select(model, selectors)
    inner, _ = unwrap(model)
    params = param_targets(inner, selected, every=not selectors) if param_grads else []
    return Watch(selected, raise_on_nonfinite=raise_on_nonfinite, last=last, keep=fields, root=inner,
                 params=params, model=model)
