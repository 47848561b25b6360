"""Per-layer statistics of inputs, outputs and gradients, in execution order (``hookscope.trace``).

Each hook reduces every tensor it sees to one small tensor of :data:`STATS` on that tensor's own
device and keeps it there; nothing reaches the host until the rows are read, and then the numbers
of each device come back in one transfer. Statistics are taken inside the hook, before any later
in-place op (``ReLU(inplace=True)``, ``out += identity``) can rewrite the tensor, so the in-place
trap of kept references does not apply to them.

``watch.py`` (first non-finite value) builds on :func:`tensor_stats` and :class:`Recorder` here.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import CodeType, TracebackType
from typing import Any, TypeVar

import torch
from torch import nn

from .._json import json_rows
from .._tree import tree_map
from ..capture import check_hookable
from ..core.compiled import HookRefresh, eager
from ..core.hooks import HookGroup
from ..errors import ForwardError, HookscopeError  # one ForwardError for every analysis
from ..selection import Selector, layers, unwrap
from ._reduce import STATS, Scratch, tensor_stats

__all__ = ["STATS", "ForwardError", "Recorder", "StatRow", "Trace", "gather", "param_targets", "refresh_for",
           "render", "select", "tensor_stats", "trace"]


@dataclass(frozen=True)
class StatRow:
    """Statistics of one tensor seen by one call of one module (a row of :attr:`Trace.rows`).

    ``phase`` is ``"forward"`` or ``"backward"``; ``which`` is ``"input"``, ``"output"``,
    ``"grad_output"`` (gradient arriving at an output), ``"grad_input"`` (gradient the module
    sent back to an input) or ``"grad_param"`` (the ``.grad`` of one of its parameters after a
    backward pass accumulated into it); ``path`` says where the tensor sits (``input[0]``,
    ``output.logits``, or the parameter's name such as ``weight``). ``call`` counts the module's
    calls from 0; for ``grad_param`` it counts the gradients that parameter received in the block.
    """

    index: int
    module: str
    call: int
    phase: str
    which: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    mean: float
    std: float
    min: float
    max: float
    absmax: float
    zero_frac: float
    nan: int
    inf: int

    @property
    def finite(self) -> bool:
        """No NaN and no Inf in the tensor."""
        return self.nan == 0 and self.inf == 0

    @property
    def norm(self) -> float:
        """The L2 norm, from the mean and the population std: ``sqrt(numel * (std**2 + mean**2))``.

        Example:
            >>> net = nn.Sequential(nn.Identity())
            >>> with trace(net) as t:
            ...     _ = net(torch.tensor([3.0, 4.0]))
            >>> t.rows[0].norm
            5.0
        """
        return math.sqrt(self.numel * (self.std**2 + self.mean**2))

    def describe(self) -> str:
        """One line: module, call, what, shape and the non-finite counts.

        Example:
            >>> net = nn.Sequential(nn.Identity())
            >>> with trace(net, inputs=False) as t:
            ...     _ = net(torch.tensor([1.0, float("inf")]))
            >>> t.rows[0].describe()
            "'0' call 0, forward output output 2: 0 NaN, 1 Inf of 2 values"
        """
        return (f"{self.module!r} call {self.call}, {self.phase} {self.which} {self.path} "
                f"{_shape(self.shape)}: {self.nan} NaN, {self.inf} Inf of {self.numel} values")


Pending = tuple[str, int, str, str, str, torch.Size, torch.dtype, torch.device, torch.Tensor]


def gather(pending: list[Pending], start: int = 0) -> list[StatRow]:
    """Turn hook events into rows, with one device-to-host copy per device.

    An event is ``(module, call, phase, which, path, shape, dtype, device, stats)``, ``stats`` the
    :func:`tensor_stats` of the tensor; rows are numbered from ``start``.

    Example:
        >>> x = torch.tensor([1.0, -1.0])
        >>> row = gather([("fc", 0, "forward", "output", "output", x.shape, x.dtype, x.device,
        ...                tensor_stats(x))], start=7)[0]
        >>> row.index, row.module, row.mean, row.std, row.shape
        (7, 'fc', 0.0, 1.0, (2,))
    """
    by_device: dict[torch.device, list[int]] = {}
    for i, event in enumerate(pending):
        by_device.setdefault(event[8].device, []).append(i)
    values: list[list[float]] = [[]] * len(pending)
    for idx in by_device.values():
        host = torch.stack([pending[i][8] for i in idx]).cpu().tolist()  # the one transfer
        for i, v in zip(idx, host):
            values[i] = v
    rows = []
    for i, ((name, call, phase, which, path, shape, dtype, device, _), v) in enumerate(zip(pending, values)):
        n = math.prod(shape)
        mean, std, lo, hi, absmax, zeros, nan, inf = v
        rows.append(StatRow(start + i, name, call, phase, which, path, tuple(shape),
                            str(dtype).replace("torch.", ""), str(device), n, mean, std, lo, hi, absmax,
                            zeros / n if n else math.nan, int(nan), int(inf)))
    return rows


def _paths(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` with its path, in the order ``_tree.tree_map`` visits them."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        for field, v in zip(getattr(type(obj), "_fields"), obj):
            yield from _paths(v, f"{prefix}.{field}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _paths(v, f"{prefix}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier() else f"{prefix}[{k!r}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _paths(getattr(obj, f.name), f"{prefix}.{f.name}")


def _input_paths(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    found = [(f"input[{i}]{p[5:]}", t) for i, a in enumerate(args) for p, t in _paths(a, "input")]
    return found + [(f"input.{k}{p[5:]}", t) for k, v in kwargs.items() for p, t in _paths(v, "input")]


class _Memo:
    """Statistics already taken of a tensor object at its current version (an input is usually the
    output just traced): a weak reference, so a freed tensor's id or memory is never mistaken."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}
        self._scratch = Scratch()

    def stats(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_inference():  # no version counter to tell a rewrite
            return tensor_stats(t, self._scratch)
        key, version = id(t), t._version
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is t and hit[1] == version:
            return hit[2]
        s = tensor_stats(t, self._scratch)

        def forget(ref: weakref.ref[torch.Tensor]) -> None:
            self._drop(key, ref)

        self._seen[key] = (weakref.ref(t, forget), version, s)
        return s

    def _drop(self, key: int, ref: Any) -> None:
        hit = self._seen.get(key)
        if hit is not None and hit[0] is ref:
            del self._seen[key]


def _raised_in(exc: BaseException, codes: set[CodeType]) -> bool:
    """Whether ``exc`` passed through one of these functions (a hook of ours, not the model)."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def param_targets(model: nn.Module, selected: list[tuple[str, nn.Module]], *,
                  every: bool) -> list[tuple[str, str, nn.Parameter]]:
    """``(owner module, parameter name, parameter)`` for the trainable parameters to watch.

    With ``every``, all of ``model``'s; otherwise those of the selected modules and their
    submodules. Each parameter once, named after the module that owns it (its first name).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 1, bias=False)))
        >>> [(m, p) for m, p, _ in param_targets(net, [("1", net[1])], every=False)]
        [('1.0', 'weight')]
    """
    wanted = None if every else {id(p) for _, m in selected for p in m.parameters()}
    found: dict[int, tuple[str, str, nn.Parameter]] = {}
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in found and (wanted is None or id(p) in wanted):
                found[id(p)] = (name, pname, p)
    return list(found.values())


class Recorder:
    """Registers the statistics hooks on selected modules and hands every event to ``sink``.

    Forward: a pre-hook takes the inputs' statistics, a post-hook (``always_call``, so a failing
    call is seen) the outputs'. Backward: tensor hooks on each output and on a per-call alias of
    each input; not ``register_full_backward_hook``, which fails when an in-place op follows the
    module (pytorch/pytorch#61519). With ``params``, a post-accumulate-grad hook on each of those
    parameters reads its ``.grad``. The ``root`` model's own forward is always followed (no rows),
    so that a failure in it, outside every selected module, is named too.

    Every module hook runs eagerly (:func:`~hookscope.core.compiled.eager`): under
    ``torch.compile`` the graph breaks around it instead of Dynamo tracing it. A hook that PyTorch
    still calls after :meth:`close` (another thread was between a module's hooks when the block
    ended) does nothing and keeps nothing.
    """

    def __init__(self, selected: list[tuple[str, nn.Module]], *, inputs: bool, grads: bool,
                 sink: Callable[[Pending], None], root: nn.Module | None = None,
                 params: Sequence[tuple[str, str, nn.Parameter]] = ()) -> None:
        self.selected, self.inputs, self.grads, self.sink = selected, inputs, grads, sink
        self.root = root
        self.params = list(params)
        self.group = HookGroup()
        self.enabled = True
        self.failure: tuple[BaseException, str] | None = None  # the innermost failed call
        self.last_done = ""
        self._memo = _Memo()
        self._open: dict[int, list[tuple[int, list[Any], list[Any]]]] = {}
        self._root_open: dict[int, list[list[tuple[str, torch.Size, torch.dtype]]]] = {}
        self._own_code: set[CodeType] = set()  # our forward hooks, to tell our errors from the model's

    def attach(self) -> None:
        """Register every hook (all of them or, if one registration fails, none).

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2))
            >>> rec = Recorder([("0", net[0])], inputs=False, grads=False, sink=print)
            >>> rec.attach(); len(rec.group)
            2
            >>> rec.group.remove(); len(net[0]._forward_hooks)
            0
        """
        try:
            targets = [(None, self.root)] if self.root is not None else []
            for name, module in [*targets, *self.selected]:
                kind = type(module).__name__
                pre, post = self._root_hooks(kind) if name is None else self._hooks(name, kind)
                self._own_code.update((pre.__code__, post.__code__))
                self.group.add(module.register_forward_pre_hook(eager(pre), with_kwargs=True))
                self.group.add(module.register_forward_hook(eager(post), always_call=True))
            for owner, pname, p in self.params:
                self.group.add(p.register_post_accumulate_grad_hook(self._param_hook(owner, pname)))
        except BaseException:
            self.group.remove()
            raise

    def close(self) -> None:
        """Remove every hook and forget the calls still open in any thread. Idempotent."""
        self.group.remove()  # closed first: a hook running now sees it and keeps nothing
        self._open.clear()
        self._root_open.clear()

    def _push(self, stacks: dict[int, list[Any]], entry: Any) -> bool:
        """Open a call on this thread's stack; False, keeping nothing, if the hooks are removed."""
        ident = threading.get_ident()
        stacks.setdefault(ident, []).append(entry)
        if self.group.closed:  # closed meanwhile by another thread: close() may have cleared already
            stacks.pop(ident, None)
            return False
        return True

    def _emit(self, name: str, call: int, phase: str, which: str, path: str, t: torch.Tensor) -> None:
        if self.enabled and not self.group.closed:
            self.sink((name, call, phase, which, path, t.shape, t.dtype, t.device, self._memo.stats(t)))

    def _grad_hook(self, name: str, call: int, which: str, path: str) -> Callable[[torch.Tensor], None]:
        return lambda g: self._emit(name, call, "backward", which, path, g)

    def _param_hook(self, owner: str, pname: str) -> Callable[[torch.Tensor], None]:
        counter = itertools.count()

        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if g is None:
                return
            if g.layout == torch.sparse_coo:  # nn.Embedding(sparse=True): the stored values
                g = g.coalesce().values()
            elif g.layout != torch.strided:
                g = g.to_dense()
            self._emit(owner, next(counter), "backward", "grad_param", pname, g)

        return hook

    def _failed(self, error: BaseException, who: str, seen: list[tuple[str, torch.Size, torch.dtype]]) -> None:
        if self.failure is None or self.failure[0] is not error:  # the innermost call saw it first
            got = ", ".join(f"{p} {_shape(s)} {str(d)[6:]}" for p, s, d in seen) or "no tensor"
            self.failure = (error, f"{who}, which received {got}, after "
                                   f"{self.last_done or 'no traced module'} had run")

    def _root_hooks(self, kind: str) -> tuple[Any, Any]:
        # PyTorch calls a with_kwargs pre-hook removed since its call began without kwargs
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            if kwargs is None or self.group.closed:
                return
            if not self._root_open.get(threading.get_ident()):
                self.last_done = ""  # a new forward pass: what ran in the one before is not "before"
            self._push(self._root_open, [(p, t.shape, t.dtype) for p, t in _input_paths(args, kwargs)])

        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            stack = self._root_open.get(threading.get_ident())
            seen = stack.pop() if stack else []
            if self.group.closed:
                return
            error = sys.exc_info()[1]
            if output is None and error is not None:  # always_call: the forward raised
                self._failed(error, f"{kind}'s own forward", seen)

        return pre, post

    def _hooks(self, name: str, kind: str) -> tuple[Any, Any]:
        counter = itertools.count()  # next() is atomic: DataParallel runs replicas in threads
        who = f"{name!r} ({kind})" if name else f"{kind}'s own forward"

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
            if kwargs is None or self.group.closed:  # removed since this call began (see _root_hooks)
                return None
            call = next(counter)
            aliases: list[tuple[str, torch.Tensor, int]] = []
            seen: list[tuple[str, torch.Size, torch.dtype]] = []  # metadata only: no tensor kept alive
            if not self._push(self._open, (call, aliases, seen)):
                return None
            found = _input_paths(args, kwargs) if self.enabled else []
            seen.extend((p, t.shape, t.dtype) for p, t in found)
            if self.inputs:
                for path, t in found:
                    self._emit(name, call, "forward", "input", path, t)
            new_args = args
            if self.grads and found and torch.is_grad_enabled():
                # a fresh alias per call: its gradient is what flowed back through this module only
                paths = iter([p for p, _ in found])  # positional tensors first, in tree_map's order

                def alias(t: torch.Tensor) -> torch.Tensor:
                    path = next(paths)
                    if not t.requires_grad:
                        return t
                    a = t.view_as(t)
                    aliases.append((path, a, a._version))
                    return a

                new_args = tree_map(alias, args)
            return None if new_args is args else (new_args, kwargs)

        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            stack = self._open.get(threading.get_ident())
            call, aliases, seen = stack.pop() if stack else (-1, [], [])
            if self.group.closed:
                return
            error = sys.exc_info()[1]
            if output is None and error is not None:  # always_call: the forward raised
                self._failed(error, who, seen)
                return
            self.last_done = repr(name)
            for path, t in _paths(output, "output"):
                self._emit(name, call, "forward", "output", path, t)
                if self.grads and self.enabled and t.requires_grad and torch.is_grad_enabled():
                    self.group.add(t.register_hook(self._grad_hook(name, call, "grad_output", path)))
            for path, a, version in aliases:
                if a._version == version:  # an in-place write detaches the alias's gradient (#61519)
                    self.group.add(a.register_hook(self._grad_hook(name, call, "grad_input", path)))

        return pre, post

    def failed_in(self, exc: BaseException | None) -> str | None:
        """Where ``exc`` was raised, if a traced forward raised it: the module and what reached it.

        ``None`` for anything else: an error raised outside every forward pass, one of hookscope's
        own errors, or one that passed through hookscope's hooks (a bug of ours, left as it is).
        """
        if (exc is None or self.failure is None or self.failure[0] is not exc
                or isinstance(exc, HookscopeError) or _raised_in(exc, self._own_code)):
            return None
        return self.failure[1]

    def reraise(self, exc: BaseException | None) -> None:
        """Name the module where a forward pass failed: a RuntimeError raised inside one becomes a
        one-line :class:`ForwardError`; any other exception gets a note saying where it was raised.
        """
        where = self.failed_in(exc)
        if where is None or exc is None:
            return
        if isinstance(exc, RuntimeError):
            raise ForwardError(f"the forward pass failed in {where}: {_first_line(exc)}; "
                               "check the example input's shape and dtype") from exc
        if hasattr(exc, "add_note"):
            exc.add_note(f"hookscope: raised in {where}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _num(v: float) -> str:
    return f"{v:.4g}"


def render(rows: list[StatRow], *, max_rows: int | None = None) -> str:
    """Rows as a text table: one line per tensor, numbers to 4 significant digits.

    Example:
        >>> net = nn.Sequential(nn.ReLU())
        >>> with trace(net) as t:
        ...     _ = net(torch.tensor([-1.0, 2.0]))
        >>> print(render(t.rows, max_rows=1))
        #  module  call  what   path      shape  dtype    mean  std  min  max  |max|  zeros  nan  inf
        ---------------------------------------------------------------------------------------------
        0  0          0  input  input[0]      2  float32   0.5  1.5   -1    2      2   0.0%    0    0
        ... 1 more rows (to_csv() or to_json() has them all)
    """
    shown = rows if max_rows is None else rows[:max_rows]
    head = ["#", "module", "call", "what", "path", "shape", "dtype", "mean", "std", "min", "max",
            "|max|", "zeros", "nan", "inf"]
    body = [[str(r.index), r.module or "(root)", str(r.call), r.which, r.path, _shape(r.shape),
             r.dtype, _num(r.mean), _num(r.std), _num(r.min), _num(r.max), _num(r.absmax),
             f"{r.zero_frac:.1%}", str(r.nan), str(r.inf)] for r in shown]
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    left = {1, 3, 4, 6}
    lines = ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                       for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in [head, *body]]
    lines.insert(1, "-" * len(lines[0]))
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more rows (to_csv() or to_json() has them all)")
    return "\n".join(lines)


class RecorderSession:
    """The lifecycle shared by trace and watch: runs once, hooks removed on exit, errors re-raised."""

    _rec: Recorder
    _refresh: HookRefresh
    _used: bool
    _kind = "trace"

    def __enter__(self: _S) -> _S:
        if self._used:
            raise HookscopeError(f"this {self._kind} has already run; call hookscope.{self._kind}(...) again")
        self._used = True
        self._rec.attach()
        try:
            self._refresh.open()  # a compiled model that already ran must see the new hooks
        except BaseException:
            self._rec.close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.remove()
        self._rec.reraise(exc)

    def remove(self) -> None:
        """Remove every hook now (the context does this by itself on exit). Idempotent.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> t = trace(net).__enter__()
            >>> t.remove(); t.remove()
            >>> len(net[0]._forward_hooks)
            0
        """
        self._rec.close()
        self._refresh.close()  # after the hooks are gone: the graphs compiled without them are valid

    def failed_in(self, exc: BaseException) -> str | None:
        """Where a forward pass in the block raised ``exc``: the module (the innermost traced one,
        or the model's own forward), the tensors that reached it and what ran before.

        ``None`` if ``exc`` did not come from a forward pass in the block, is one of hookscope's
        errors or passed through hookscope's own hooks. A RuntimeError is already turned into a
        :class:`ForwardError` on exit; use this to report other exceptions in one line.

        Example:
            >>> class Pick(nn.Module):
            ...     def forward(self, x):
            ...         return x[5]
            >>> net = nn.Sequential(nn.Linear(2, 2), Pick())
            >>> t = trace(net)
            >>> try:
            ...     with t:
            ...         _ = net(torch.ones(1, 2))
            ... except IndexError as e:
            ...     print(t.failed_in(e))
            '1' (Pick), which received input[0] 1x2 float32, after '0' had run
        """
        return self._rec.failed_in(exc)


_S = TypeVar("_S", bound=RecorderSession)


class Trace(RecorderSession):
    """A context that records :class:`StatRow` statistics; build it with :func:`trace`."""

    def __init__(self, selected: list[tuple[str, nn.Module]], *, inputs: bool, grads: bool,
                 root: nn.Module | None = None, params: Sequence[tuple[str, str, nn.Parameter]] = (),
                 model: nn.Module | None = None) -> None:
        self._pending: list[Pending] = []
        self._rows: list[StatRow] = []
        self._lock = threading.Lock()
        self._rec = Recorder(selected, inputs=inputs, grads=grads, sink=self._pending.append,
                             root=root, params=params)
        self._refresh = refresh_for(model, root, selected)
        self._used = False

    @property
    def rows(self) -> list[StatRow]:
        """Every row so far, in execution order (gathers what the hooks kept, one copy per device).

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net) as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> [(r.which, r.min, r.max) for r in t.rows]
            [('input', -1.0, 2.0), ('output', 0.0, 2.0)]
        """
        with self._lock:
            if self._pending:
                pending, self._pending[:] = list(self._pending), []
                self._rows.extend(gather(pending, start=len(self._rows)))
            return list(self._rows)

    def clear(self) -> None:
        """Forget every row (to reuse one trace over many steps without growing).

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
            self._pending.clear()
            self._rows.clear()

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[StatRow]:
        return iter(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts (field name -> value).

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, inputs=False) as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> d = t.to_dicts()[0]
            >>> d["module"], d["shape"], d["mean"], d["zero_frac"]
            ('0', (2,), 1.0, 0.5)
        """
        return [dataclasses.asdict(r) for r in self.rows]

    def to_json(self, *, indent: int | None = None) -> str:
        """The rows as a JSON list; NaN and infinities are written as the strings "nan", "inf", "-inf".

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, inputs=False) as t:
            ...     _ = net(torch.tensor([float("nan"), 2.0]))
            >>> row = json.loads(t.to_json())[0]
            >>> row["shape"], row["mean"], row["nan"]
            ([2], 'nan', 1)
        """
        return json.dumps(json_rows(self.rows), indent=indent, allow_nan=False)

    def to_csv(self, path: str | None = None) -> str:
        """The rows as CSV (shape written as ``8x64x56x56``); also written to ``path`` if given.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, inputs=False) as t:
            ...     _ = net(torch.tensor([[-1.0, 2.0]]))
            >>> print(t.to_csv())
            index,module,call,phase,which,path,shape,dtype,device,numel,mean,std,min,max,absmax,zero_frac,nan,inf
            0,0,0,forward,output,output,1x2,float32,cpu,2,1.0,1.0,0.0,2.0,2.0,0.5,0,0
            <BLANKLINE>
        """
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        names = [f.name for f in dataclasses.fields(StatRow)]
        writer.writerow(names)
        for d in self.to_dicts():
            d["shape"] = _shape(d["shape"])
            writer.writerow([d[n] for n in names])
        text = out.getvalue()
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def table(self, *, max_rows: int | None = None) -> str:
        """A text table for people, one row per tensor, in execution order (see :func:`render`).

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> with trace(net, inputs=False) as t:
            ...     _ = net(torch.tensor([-1.0, 2.0]))
            >>> print(t.table())
            #  module  call  what    path    shape  dtype    mean  std  min  max  |max|  zeros  nan  inf
            --------------------------------------------------------------------------------------------
            0  0          0  output  output      2  float32     1    1    0    2      2  50.0%    0    0
        """
        return render(self.rows, max_rows=max_rows)

    def __repr__(self) -> str:
        return f"Trace({len(self._rec.selected)} modules, {len(self._rows) + len(self._pending)} rows)"


def refresh_for(model: nn.Module | None, root: nn.Module | None,
                selected: list[tuple[str, nn.Module]]) -> HookRefresh:
    """The :class:`~hookscope.core.compiled.HookRefresh` of the model as the user passed it (with its
    ``torch.compile`` wrapper), so that hooks added to an already compiled model take effect."""
    if model is None:
        model = root if root is not None else nn.ModuleList([m for _, m in selected])
    return HookRefresh(model)


def select(model: nn.Module, selectors: tuple[Selector, ...]) -> list[tuple[str, nn.Module]]:
    """Resolve and check selectors; with none, a model without children selects itself.

    Example:
        >>> [name for name, _ in select(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ())]
        ['0', '1']
        >>> select(nn.ReLU(), ())
        [('', ReLU())]
    """
    inner, _ = unwrap(model)
    if selectors or next(inner.children(), None) is not None:
        chosen = layers(model, *selectors)
    else:
        chosen = [("", inner)]
    check_hookable(chosen)
    return chosen


def trace(model: nn.Module, *selectors: Selector, inputs: bool = True, grads: bool = False,
          param_grads: bool = False) -> Trace:
    """Statistics of what every selected module receives and produces, forward and backward.

    For each call, in execution order, one :class:`StatRow` per tensor (nested outputs included):
    shape, dtype, device, mean, std, min, max, max |x|, fraction of zeros, NaN and Inf counts.
    They are reduced on the tensor's device inside the hooks and gathered once, when ``rows``,
    ``table()``, ``to_json()`` or ``to_csv()`` is first read.

    Args:
        model: any ``nn.Module`` (wrappers are seen through; rows use the inner model's names).
        *selectors: as for :func:`hookscope.layers`; none selects every module but the root (a
            model without children selects itself).
        inputs: also record the inputs of each call (an input that is the output just traced is
            not reduced twice).
        grads: also record, during backward passes in the block, the gradient arriving at each
            output (``grad_output``) and the one sent back to each input (``grad_input``).
        param_grads: also record, after each backward pass in the block, the ``.grad`` of every
            trainable parameter of the selected modules and their submodules (of the whole model
            without selectors): ``which="grad_param"``, ``module`` the module that owns it,
            ``path`` its name. A sparse gradient is summarised by its stored values.

    Raises:
        ForwardError: a forward pass in the block raised a RuntimeError inside a selected module,
            or in the model's own forward; the message names the innermost such module and the
            shapes it received. Other exceptions from a forward pass pass through with a note
            saying where (see :meth:`Trace.failed_in`).

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with hookscope.trace(net, grads=True, param_grads=True) as t:
        ...     net(torch.randn(4, 2)).sum().backward()
        >>> [(r.module, r.which) for r in t.rows][:3]
        [('0', 'input'), ('0', 'output'), ('1', 'input')]
        >>> sorted(r.path for r in t.rows if r.which == "grad_param")
        ['bias', 'weight']
    """
    selected = select(model, selectors)
    inner, _ = unwrap(model)
    params = param_targets(inner, selected, every=not selectors) if param_grads else []
    return Trace(selected, inputs=inputs, grads=grads, root=inner, params=params, model=model)
