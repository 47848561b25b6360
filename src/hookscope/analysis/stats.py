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
import json
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from .._json import json_rows
from .._tree import tree_map
from ..capture import check_hookable
from ..core.hooks import HookGroup
from ..errors import HookscopeError
from ..selection import Selector, layers, unwrap
from ._reduce import STATS, Scratch, tensor_stats

__all__ = ["STATS", "ForwardError", "Recorder", "StatRow", "Trace", "gather", "render", "select", "tensor_stats", "trace"]


class ForwardError(HookscopeError, RuntimeError):
    """The model's forward pass failed inside a traced module (wrong input shape or dtype...)."""


@dataclass(frozen=True)
class StatRow:
    """Statistics of one tensor seen by one call of one module (a row of :attr:`Trace.rows`).

    ``phase`` is ``"forward"`` or ``"backward"``; ``which`` is ``"input"``, ``"output"``,
    ``"grad_output"`` (gradient arriving at an output) or ``"grad_input"`` (gradient the module
    sent back to an input); ``path`` says where the tensor sits (``input[0]``, ``output.logits``).
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
        """The L2 norm, from the mean and the population std: ``sqrt(numel * (std**2 + mean**2))``."""
        return math.sqrt(self.numel * (self.std**2 + self.mean**2))

    def describe(self) -> str:
        """One line: module, call, what, shape and the non-finite counts."""
        return (f"{self.module!r} call {self.call}, {self.phase} {self.which} {self.path} "
                f"{_shape(self.shape)}: {self.nan} NaN, {self.inf} Inf of {self.numel} values")


Pending = tuple[str, int, str, str, str, torch.Size, torch.dtype, torch.device, torch.Tensor]


def gather(pending: list[Pending], start: int = 0) -> list[StatRow]:
    """Turn hook events into rows, with one device-to-host copy per device."""
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
        rows.append(StatRow(start + i, name, call, phase, which, path, tuple(shape),
                            str(dtype).replace("torch.", ""), str(device), n, *v[:5],
                            v[5] / n if n else math.nan, int(v[6]), int(v[7])))
    return rows


def _paths(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` with its path, in the order ``_tree.tree_map`` visits them."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        for field, v in zip(type(obj)._fields, obj):
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
        self._seen[key] = (weakref.ref(t, lambda ref, k=key: self._drop(k, ref)), version, s)
        return s

    def _drop(self, key: int, ref: Any) -> None:
        hit = self._seen.get(key)
        if hit is not None and hit[0] is ref:
            del self._seen[key]


class Recorder:
    """Registers the statistics hooks on selected modules and hands every event to ``sink``.

    Forward: a pre-hook takes the inputs' statistics, a post-hook (``always_call``, so a failing
    call is seen) the outputs'. Backward: tensor hooks on each output and on a per-call alias of
    each input; not ``register_full_backward_hook``, which fails when an in-place op follows the
    module (pytorch/pytorch#61519).
    """

    def __init__(self, selected: list[tuple[str, nn.Module]], *, inputs: bool, grads: bool,
                 sink: Callable[[Pending], None]) -> None:
        self.selected, self.inputs, self.grads, self.sink = selected, inputs, grads, sink
        self.group = HookGroup()
        self.enabled = True
        self.failure: tuple[BaseException, str] | None = None  # the innermost failed call
        self.last_done = ""
        self._memo = _Memo()
        self._open: dict[int, list[tuple[int, list[Any], list[Any]]]] = {}

    def attach(self) -> None:
        try:
            for name, module in self.selected:
                pre, post = self._hooks(name, type(module).__name__)
                self.group.add(module.register_forward_pre_hook(pre, with_kwargs=True))
                self.group.add(module.register_forward_hook(post, always_call=True))
        except BaseException:
            self.group.remove()
            raise

    def _emit(self, name: str, call: int, phase: str, which: str, path: str, t: torch.Tensor) -> None:
        if self.enabled:
            self.sink((name, call, phase, which, path, t.shape, t.dtype, t.device, self._memo.stats(t)))

    def _grad_hook(self, name: str, call: int, which: str, path: str) -> Callable[[torch.Tensor], None]:
        return lambda g: self._emit(name, call, "backward", which, path, g)

    def _hooks(self, name: str, kind: str) -> tuple[Any, Any]:
        counter = iter(range(sys.maxsize))  # next() is atomic: DataParallel runs replicas in threads

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            call = next(counter)
            aliases: list[tuple[str, torch.Tensor, int]] = []
            seen: list[tuple[str, torch.Size, torch.dtype]] = []  # metadata only: no tensor kept alive
            self._open.setdefault(threading.get_ident(), []).append((call, aliases, seen))
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
            error = sys.exc_info()[1]
            if output is None and error is not None:  # always_call: the forward raised
                if self.failure is None or self.failure[0] is not error:
                    got = ", ".join(f"{p} {_shape(s)} {str(d)[6:]}" for p, s, d in seen) or "no tensor"
                    self.failure = (error, f"{name!r} ({kind}), which received {got}, after "
                                           f"{self.last_done or 'no traced module'} had run")
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

    def reraise(self, exc: BaseException | None) -> None:
        """Name the module where a forward pass failed, for a RuntimeError raised inside one."""
        if self.failure is None or exc is None or self.failure[0] is not exc or isinstance(exc, HookscopeError):
            return
        if isinstance(exc, RuntimeError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ForwardError(f"the forward pass failed in {self.failure[1]}: {first}; "
                               "check the example input's shape and dtype") from exc
        if hasattr(exc, "add_note"):
            exc.add_note(f"hookscope: raised in {self.failure[1]}")


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _num(v: float) -> str:
    return f"{v:.4g}"


def render(rows: list[StatRow], *, max_rows: int | None = None) -> str:
    """Rows as a text table: one line per tensor, numbers to 4 significant digits."""
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
    _used: bool
    _kind = "trace"

    def __enter__(self: _S) -> _S:
        if self._used:
            raise HookscopeError(f"this {self._kind} has already run; call hookscope.{self._kind}(...) again")
        self._used = True
        self._rec.attach()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.remove()
        self._rec.reraise(exc)

    def remove(self) -> None:
        """Remove every hook now (the context does this by itself on exit). Idempotent."""
        self._rec.group.remove()


_S = TypeVar("_S", bound=RecorderSession)


class Trace(RecorderSession):
    """A context that records :class:`StatRow` statistics; build it with :func:`trace`."""

    def __init__(self, selected: list[tuple[str, nn.Module]], *, inputs: bool, grads: bool) -> None:
        self._pending: list[Pending] = []
        self._rows: list[StatRow] = []
        self._lock = threading.Lock()
        self._rec = Recorder(selected, inputs=inputs, grads=grads, sink=self._pending.append)
        self._used = False

    @property
    def rows(self) -> list[StatRow]:
        """Every row so far, in execution order (gathers what the hooks kept, one copy per device)."""
        with self._lock:
            if self._pending:
                pending, self._pending[:] = list(self._pending), []
                self._rows.extend(gather(pending, start=len(self._rows)))
            return list(self._rows)

    def clear(self) -> None:
        """Forget every row (to reuse one trace over many steps without growing)."""
        with self._lock:
            self._pending.clear()
            self._rows.clear()

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[StatRow]:
        return iter(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts (field name -> value)."""
        return [dataclasses.asdict(r) for r in self.rows]

    def to_json(self, *, indent: int | None = None) -> str:
        """The rows as a JSON list; NaN and infinities are written as the strings "nan", "inf", "-inf"."""
        return json.dumps(json_rows(self.rows), indent=indent, allow_nan=False)

    def to_csv(self, path: str | None = None) -> str:
        """The rows as CSV (shape written as ``8x64x56x56``); also written to ``path`` if given."""
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
        """A text table for people, one row per tensor, in execution order."""
        return render(self.rows, max_rows=max_rows)

    def __repr__(self) -> str:
        return f"Trace({len(self._rec.selected)} modules, {len(self._rows) + len(self._pending)} rows)"


def select(model: nn.Module, selectors: tuple[Selector, ...]) -> list[tuple[str, nn.Module]]:
    """Resolve and check selectors; with none, a model without children selects itself."""
    inner, _ = unwrap(model)
    chosen = layers(model, *selectors) if selectors or next(inner.children(), None) else [("", inner)]
    check_hookable(chosen)
    return chosen


def trace(model: nn.Module, *selectors: Selector, inputs: bool = True, grads: bool = False) -> Trace:
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

    Raises:
        ForwardError: a forward pass in the block raised a RuntimeError inside a selected module;
            the message names the innermost such module and the shapes it received.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with hookscope.trace(net, grads=True) as t:
        ...     net(torch.randn(4, 2)).sum().backward()
        >>> [(r.module, r.which) for r in t.rows][:3]
        [('0', 'input'), ('0', 'output'), ('1', 'input')]
    """
    return Trace(select(model, selectors), inputs=inputs, grads=grads)
