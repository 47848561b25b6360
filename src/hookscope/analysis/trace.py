"""Per-layer statistics of inputs, outputs and gradients, in execution order (``hookscope.trace``).

Built on the statistics engine (``_recorder.py`` for the hooks, ``_rows.py`` for the rows and their
text), as ``watch`` is; this module holds the result, :class:`Trace`, and its builder. With ``at=`` token
positions (``hookscope.tokens``) the rows are those of each selected position, once, keyed by decoding
step and absolute position (:class:`StepStatRow`), read through the generation module's positions.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from typing import Any

import torch  # noqa: F401 - the examples use it
from torch import nn

from .._native import describe
from ..capture import parse_keep
from ..core.result import Result, jsonable
from ..core.text import num, shape_text
from ..core.text import table as text_table
from ..errors import HookscopeError, checked
from ..generation import FollowedPositions, TokenPositions
from ..selection import At, Selector, as_at, unwrap
from ._recorder import RecorderSession, param_targets, select
from ._rows import ByModule, Pending, StatRow, event, gather, render

__all__ = ["GATHER_EVERY", "StatRow", "StepStatRow", "Trace", "trace"]

_STAT_FIELDS = tuple(f.name for f in dataclasses.fields(StatRow))

GATHER_EVERY = 4096
"""A streaming trace (``on_row=`` or ``last=``) gathers its events into rows as each forward pass
of the model begins, and also whenever this many are waiting (one host synchronisation each)."""


def cpu_statistics() -> str:
    """How this process computes the statistics of CPU tensors, in one line: hookscope's C kernel
    (which build, how many threads) or torch operations, and why (``Trace.notes`` and
    ``hookscope --version`` say it).

    Example:
        >>> cpu_statistics().startswith(("C kernel", "torch operations"))
        True
    """
    return describe()


@dataclasses.dataclass(frozen=True)
class StepStatRow(StatRow):
    """A :class:`StatRow` of one token position of a language model (``trace(at=tokens...)``): the
    statistics of the selected module's output at batch ``row``, absolute ``position`` (the row's own
    tokens counted from 0, left padding excluded), computed by the forward of decoding ``step`` (0: the
    forward over the prompt) of ``sequence`` (one per ``generate()`` call in the block). Each position
    is one row, whether generation used the KV cache or not.
    """

    sequence: int
    step: int
    row: int
    position: int


_STEP_HEAD = ["#", "module", "seq", "step", "row", "position", "shape", "dtype", "mean", "std", "min", "max",
              "|max|", "zeros", "nan", "inf"]


def _number(v: float) -> str:
    return "nan" if math.isnan(v) else num(v)  # as every trace table writes a NaN statistic


def _step_text(rows: Sequence[StatRow], max_rows: int | None) -> str:
    """The rows of token positions as text: the sequence, step, row and position where the plain table
    has the call and the path."""
    shown = rows if max_rows is None else rows[:max_rows]
    cells = [[str(r.index), r.module or "(root)", str(getattr(r, "sequence", "")), str(getattr(r, "step", "")),
              str(getattr(r, "row", "")), str(getattr(r, "position", "")), shape_text(r.shape), r.dtype,
              *map(_number, (r.mean, r.std, r.min, r.max, r.absmax)), f"{r.zero_frac:.1%}", str(r.nan), str(r.inf)]
             for r in shown]
    lines = text_table(_STEP_HEAD, cells, left={1, 7})
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more rows (to_csv() or to_json() has them all)")
    return "\n".join(lines)


class Trace(RecorderSession, ByModule, Result):  # the session's operations_ran, not ByModule's
    """A context that records :class:`StatRow` statistics; build it with :func:`trace`.

    After (or during) the block: ``rows``, ``t["layer1"]`` (the rows of one module, or of one
    operation: ``t["layer1::add"]``; ``in`` agrees),
    ``table()`` (also ``str(t)``), ``to_dict()``, ``to_json()``, ``to_csv()`` and ``to_pandas()``;
    in a notebook, the rows as a table and :func:`~hookscope.viz.plot_trace`'s picture.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> with trace(net, keep="output") as t:
        ...     _ = net(torch.ones(1, 2))
        >>> [r.which for r in t["1"]], "1" in t, "2" in t
        (['output'], True, False)
        >>> t["l"]
        Traceback (most recent call last):
        ...
        hookscope.errors.RecordError: no module 'l' in this result. It has: '0', '1'.
    """

    _kind = "trace"
    _result_fields = tuple(f.name for f in dataclasses.fields(StatRow))

    def __init__(self, selected: list[tuple[str, nn.Module]], *, keep: frozenset[str],
                 root: nn.Module | None = None, params: Sequence[tuple[str, str, nn.Parameter]] = (),
                 model: nn.Module | None = None, on_row: Callable[[StatRow], object] | None = None,
                 last: int | None = None, at: TokenPositions | None = None) -> None:
        self._pending: list[Pending] = []
        self._keys: list[tuple[int, int, int, int]] = []  # with at=: each waiting event's sequence, step, row, position
        self._at, self._root = at, root
        self._followed: FollowedPositions | None = None  # the positions bound to the model while the block is open
        self._calls: dict[str, int] = {}
        self._rows: MutableSequence[StatRow] = [] if last is None else deque(maxlen=last)
        self._made = 0  # rows made since the start (or the last clear()): the next row's index
        self._on_row = on_row
        self._lock = threading.RLock()  # on_row may read the trace
        self._cpu_stats = cpu_statistics()
        streaming = on_row is not None or last is not None
        super().__init__(selected, keep=frozenset() if at is not None else keep,  # at=: the positions' rows alone
                         sink=self._take if streaming else self._pending.append, root=root,
                         params=params, model=model, on_pass=self._gather if streaming else None)
        if at is not None:
            self._rec.on_output = self._positions

    def __enter__(self) -> Trace:
        super().__enter__()
        if self._at is not None:
            try:  # resolved at each forward from the model's own inputs, its hooks removed with the trace's
                self._followed = self._at.follow(self._root if self._root is not None else nn.Module(), self._rec.group)
            except BaseException:
                self.remove()
                raise
        return self

    def _positions(self, name: str, output: Any) -> None:
        """One event per selected position this call of ``name`` computes for the first time."""
        followed = self._followed
        if followed is None:
            return
        taken, where = followed.take_keyed(output, name)
        path = followed.main(output, name)[1]
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        events = [event(name, taken[k], call=call, path=path) for k in range(len(where.rows))]
        with self._lock:
            self._pending.extend(events)
            self._keys.extend((where.sequence, where.step, b, p) for b, p in zip(where.rows, where.positions))
            if (self._on_row is not None or isinstance(self._rows, deque)) and len(self._pending) >= GATHER_EVERY:
                self._gather()

    def _take(self, event: Pending) -> None:
        with self._lock:
            self._pending.append(event)
            if len(self._pending) >= GATHER_EVERY:
                self._gather()

    def _gather(self) -> None:
        """Turn the waiting events into rows: kept (the last ``last`` of them) and handed to ``on_row``."""
        with self._lock:
            if not self._pending:
                return
            pending, self._pending[:] = list(self._pending), []
            keys, self._keys[:] = list(self._keys), []
            rows = gather(pending, start=self._made)
            if keys:
                rows = [StepStatRow(**{f: getattr(r, f) for f in _STAT_FIELDS}, sequence=key[0], step=key[1],
                                    row=key[2], position=key[3]) for r, key in zip(rows, keys)]
            self._made += len(rows)
            if self._on_row is None:
                self._rows.extend(rows)
                return
            for i, row in enumerate(rows):  # kept first: on_row reading the trace finds its row there
                self._rows.append(row)
                try:
                    self._on_row(row)
                except BaseException:
                    self._rows.extend(rows[i + 1:])  # the rows stay whole: only on_row missed the rest
                    raise

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            if self._on_row is not None:
                self._gather()  # on_row has every row by the end of the block, the failing pass's too
            self._root = None  # nothing of the model outlives the block
        if exc is None and self._followed is not None:
            self._followed.check()  # a step or position that no forward reached

    @property
    def rows(self) -> list[StatRow]:
        """Every row so far, in execution order (gathers what the hooks kept, one copy per device);
        with ``last=N``, the last ``N`` of them.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net) as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> [(r.which, r.min, r.max) for r in t.rows]
            [('input', -1.0, 2.0), ('output', 0.0, 2.0)]
        """
        with self._lock:
            self._gather()
            return list(self._rows)

    @property
    def notes(self) -> list[str]:
        """What to know about how the rows were made, one line each: for rows of CPU tensors, how
        their statistics were computed (hookscope's C kernel or torch operations, and why; see
        the performance guide). Empty when no row is of a CPU tensor.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net) as t:
            ...     _ = net(torch.ones(2))
            >>> t.notes[0].startswith(("CPU statistics: C kernel", "CPU statistics: torch operations"))
            True
        """
        return [f"CPU statistics: {self._cpu_stats}"] if any(r.device == "cpu" for r in self.rows) else []

    def clear(self) -> None:
        """Forget every row (to reuse one trace over many steps without growing); the next row is
        numbered 0. With ``on_row``, the rows not yet handed to it are handed over first.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net) as t:
            ...     for step in range(3):
            ...         t.clear()
            ...         _ = net(torch.ones(2))
            >>> len(t.rows)
            2
        """
        with self._lock:
            if self._on_row is not None:
                self._gather()
            self._pending.clear()
            self._keys.clear()
            self._rows.clear()
            self._made = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[StatRow]:
        return iter(self.rows)

    def to_dict(self) -> dict[str, Any]:
        """The rows as plain data: ``{"rows": [one dict per row]}`` (field name -> value).

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, keep="output") as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> d = t.to_dict()["rows"][0]
            >>> d["module"], d["shape"], d["mean"], d["zero_frac"]
            ('0', (2,), 1.0, 0.5)
        """
        return {"rows": [dataclasses.asdict(r) for r in self.rows]}

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON, ``{"rows": [...]}``; NaN and infinities are written as the
        strings "nan", "inf", "-inf".

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, keep="output") as t:
            ...     _ = net(torch.tensor([float("nan"), 2.0]))
            >>> row = json.loads(t.to_json())["rows"][0]
            >>> row["shape"], row["mean"], row["nan"]
            ([2], 'nan', 1)
        """
        return json.dumps(jsonable(self.to_dict()), indent=indent, allow_nan=False)

    def to_csv(self, path: str | None = None) -> str:
        """The rows as CSV (shape written as ``8x64x56x56``); also written to ``path`` if given.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, keep="output") as t:
            ...     _ = net(torch.tensor([[-1.0, 2.0]]))
            >>> print(t.to_csv())
            index,module,call,phase,which,path,shape,dtype,device,numel,mean,std,min,max,absmax,zero_frac,nan,inf
            0,0,0,forward,output,output,1x2,float32,cpu,2,1.0,1.0,0.0,2.0,2.0,0.5,0,0
            <BLANKLINE>
        """
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        names = [f.name for f in dataclasses.fields(StepStatRow if self._at is not None else StatRow)]
        writer.writerow(names)
        for r in self.rows:
            d = dataclasses.asdict(r)
            d["shape"] = shape_text(r.shape)
            writer.writerow([d[n] for n in names])
        text = out.getvalue()
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def table(self, *, max_rows: int | None = None) -> str:
        """A text table for people, one row per tensor, in execution order (also ``str(t)``).

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, keep="output") as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> print(t.table())
            #  module  call  what    path    shape  dtype    mean  std  min  max  |max|  zeros  nan  inf
            --------------------------------------------------------------------------------------------
            0  0          0  output  output      2  float32     1    1    0    2      2  50.0%    0    0
        """
        if self._at is not None:
            return _step_text(self.rows, max_rows)
        return render(self.rows, max_rows=max_rows)

    def __repr__(self) -> str:
        return f"Trace({len(self._rec.selected)} modules, {len(self._rows) + len(self._pending)} rows)"


@checked
def trace(model: nn.Module, *selectors: Selector, keep: str | Iterable[str] = "io",
          param_grads: bool = False, on_row: Callable[[StatRow], object] | None = None,
          last: int | None = None, at: At | Any = None) -> Trace:
    """Statistics of what every selected module receives and produces, forward and backward.

    For each call, in execution order, one :class:`StatRow` per tensor (nested outputs included):
    shape, dtype, device, mean, std, min, max, max |x|, fraction of zeros, NaN and Inf counts.
    They are reduced on the tensor's device inside the hooks and gathered once, when ``rows``,
    ``table()``, ``to_json()`` or ``to_csv()`` is first read.

    Args:
        model: any ``nn.Module`` (wrappers are seen through; rows use the inner model's names).
        *selectors: as for :func:`hookscope.layers`; none selects every module but the root (a
            model without children selects itself). An operation selector (``"norm::div"``,
            ``"h.*::soft*"``, ``"*::*"`` for every operation of every module) gives rows for each
            call of each operation it names, under that operation's own name (``"h.0::softmax"``,
            ``"h.0::add.1"`` for the second ``add`` of one call), among the modules' rows in the
            order they ran; an operation run under ``torch.no_grad()`` has no gradient row.
        keep: what to record, in :func:`hookscope.capture`'s words: ``"io"`` (default: inputs and
            outputs; an input that is the output just traced is not reduced twice), ``"output"``,
            ``"input"``, ``"all"`` (also, during backward passes in the block, the gradient arriving
            at each output, ``grad_output``, and the one sent back to each input, ``grad_input``),
            ``"grads"``, ``"grad_input"``, ``"grad_output"``, or several of them.
        param_grads: also record, after each backward pass in the block, the ``.grad`` of every
            trainable parameter of the selected modules and their submodules (of the whole model
            without selectors): ``which="grad_param"``, ``module`` the module that owns it,
            ``path`` its name. A sparse gradient is summarised by its stored values.
        on_row: a function handed each row, in order, once it is made: as the model's next forward
            pass begins (the rows of the pass before, and of its backward pass), when ``rows`` is
            read, when :data:`GATHER_EVERY` events are waiting, and by the end of the block; an
            exception it raises comes out where that happened (the model's call, or the block).
            The rows are kept as well, unless ``last`` says otherwise.
        last: keep only the last ``last`` rows (``0``: none, for ``on_row`` alone); ``None``
            (default) keeps every row. Either of ``on_row`` and ``last`` makes the trace stream: it
            gathers at each forward pass instead of once, so that a trace around a loop of many
            steps holds at most ``last`` rows and one pass's events. Rows keep their number
            (``index``) from the start of the block.
        at: token positions of a language model (``hookscope.tokens.generated``, ``tokens.prompt``,
            ``tokens.step(k)``, ``tokens.position(p)``), for a trace around ``generate()``: one
            :class:`StepStatRow` per selected position of each selected module's output (its main
            tensor), keyed by ``sequence``, ``step``, ``row`` and absolute ``position``, each position
            once, at the step whose forward first computes it, so that the rows are the same whether
            generation used the KV cache or not. Works with ``keep="output"``; refused where the
            positions cannot be followed (beam search, assisted decoding, a static cache, an
            encoder-decoder model, a forward from another thread), and a step or position no forward
            reached is refused when the block ends.

    Raises:
        ForwardError: a forward pass in the block raised an exception inside a selected module,
            or in the model's own forward; the message names the innermost such module, the
            shapes it received and what ran before; the model's exception is its ``__cause__``.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with hookscope.trace(net, keep="all", param_grads=True) as t:
        ...     net(torch.randn(4, 2)).sum().backward()
        >>> [(r.module, r.which) for r in t.rows][:3]
        [('0', 'input'), ('0', 'output'), ('1', 'input')]
        >>> sorted(r.path for r in t.rows if r.which == "grad_param")
        ['bias', 'weight']
        >>> with hookscope.trace(net, "0", "0::*", keep="output") as t:  # Linear's own operation too
        ...     _ = net(torch.ones(1, 2))
        >>> [r.module for r in t.rows]
        ['0::linear', '0']
        >>> means = []
        >>> with hookscope.trace(net, "1", keep="output", on_row=lambda r: means.append(r.mean), last=2) as t:
        ...     for step in range(100):  # holds two rows, however many steps
        ...         _ = net(torch.full((1, 2), float(step)))
        >>> len(means), [r.index for r in t.rows]
        (100, [98, 99])
        >>> import transformers
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)).eval()
        >>> with hookscope.trace(lm, "transformer.h.0", keep="output", at=hookscope.tokens.generated) as t:
        ...     _ = lm.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
        >>> [(r.step, r.position, r.shape) for r in t.rows]
        [(0, 2, (8,)), (1, 3, (8,)), (2, 4, (8,))]
    """
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
        raise HookscopeError(f"last={last!r} must be a whole number of rows, 0 or more (None keeps every row)")
    if on_row is not None and not callable(on_row):
        raise HookscopeError(f"on_row={on_row!r} must be a function taking each row (a StatRow), or None")
    fields = parse_keep(keep)
    positions = _token_positions(at, fields, param_grads)
    selected = select(model, selectors)
    inner, _ = unwrap(model)
    params = param_targets(inner, selected, every=not selectors) if param_grads else []
    return Trace(selected, keep=fields, root=inner, params=params, model=model, on_row=on_row, last=last,
                 at=positions)


def _token_positions(at: Any, fields: frozenset[str], param_grads: bool) -> TokenPositions | None:
    """``at=`` checked: token positions, with the outputs alone kept."""
    positions = as_at(at)
    if positions is None:
        return None
    if not isinstance(positions, TokenPositions):
        raise HookscopeError(f"trace(at={positions!r}) takes token positions (hookscope.tokens.generated, "
                             "tokens.prompt, tokens.step(k), tokens.position(p)); for a fixed slice, capture with "
                             "at= and reduce the records")
    if fields != {"output"} or param_grads:
        got = sorted(fields) + (["param_grads"] if param_grads else [])
        raise HookscopeError(f"trace(at={positions!r}) reads positions of each output's main tensor, so it works "
                             f"with keep='output' alone (got {got}); pass keep='output'")
    return positions
