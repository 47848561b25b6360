"""Compare two runs layer by layer: two models with the same layer names, or one model twice.

Run A is recorded with :func:`hookscope.capture` (so in-place ops cannot rewrite what was kept);
run B keeps nothing: each of its outputs is compared with the same call of run A inside the hook,
as it is produced. Every module both models have is compared call by call and tensor by tensor on
the tensors' device, and the statistics reach the host in one transfer per device at the end.
Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from numbers import Integral, Real
from typing import Any, ContextManager, NamedTuple, Union

import torch
from torch import nn

from .._tree import tensors, tree_map
from .._memory import Scratch, flat
from .._rng import RngDevices, kept_rng, rng_devices
from ..capture import _hand_back_plain, boundary_modules, capture
from ..core.compiled import HookRefresh, eager, is_compiled
from ..core.guard import Slot, plain, protect, release, settle_inputs
from ..core.hooks import HookGroup
from ..errors import HookscopeError, SelectionError, did_you_mean
from ..records import NOT_KEPT, RAISED, Recording, Retention
from ..selection import Selector, check_hookable, unwrap
from ..selection import layers as select

try:  # private, but the only way to step outside the caller's dispatch modes
    from torch.utils._python_dispatch import _disable_current_modes as _no_modes
except ImportError:  # pragma: no cover
    _no_modes = contextlib.nullcontext  # type: ignore[assignment]

__all__ = ["diff", "Diff", "DiffRow", "Settings", "settings", "Unmatched", "RTOL", "ATOL"]

RTOL = 1.3e-6
"""Default relative tolerance: ``torch.testing.assert_close``'s for float32."""
ATOL = 1e-5
"""Default absolute tolerance: ``torch.testing.assert_close``'s for float32."""

_OK, _DIFFERS, _SHAPE, _STRUCTURE = "ok", "differs", "shape", "structure"
_MISSING_A, _MISSING_B = "missing in A", "missing in B"


# --- how a run is made --------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """How one run is made: training flag, autocast, any other context. Build it with :func:`settings`."""

    train: bool | None = None
    autocast: torch.dtype | None = None
    device_type: str | None = None
    context: Callable[[], ContextManager[Any]] | None = None

    def describe(self) -> str:
        """A short human description, e.g. ``"train, autocast bfloat16"``."""
        parts = []
        if self.train is not None:
            parts.append("train" if self.train else "eval")
        if self.autocast is not None:
            parts.append(f"autocast {str(self.autocast).replace('torch.', '')}")
        if self.context is not None:
            parts.append(getattr(self.context, "__name__", type(self.context).__name__))
        return ", ".join(parts)

    @contextlib.contextmanager
    def apply(self, model: nn.Module, device_type: str) -> Iterator[None]:
        """Enter these settings on ``model`` (its flags are restored by :func:`diff`, not here)."""
        with contextlib.ExitStack() as stack:
            if self.train is not None:
                model.train(self.train)
            if self.autocast is not None:
                stack.enter_context(torch.autocast(self.device_type or device_type, dtype=self.autocast))
            if self.context is not None:
                stack.enter_context(self.context())
            yield


def settings(
    *,
    train: bool | None = None,
    autocast: torch.dtype | None = None,
    device_type: str | None = None,
    context: Callable[[], ContextManager[Any]] | None = None,
) -> Settings:
    """Describe one run of :func:`diff`: the mode, an autocast dtype, and any other context.

    Args:
        train: ``True`` runs every module in training mode, ``False`` in eval mode, ``None`` (default)
            leaves the flags as they are. The flags are restored afterwards either way.
        autocast: run under ``torch.autocast`` with this dtype (``torch.bfloat16``, ``torch.float16``).
        device_type: autocast's device type; default: the device the run's inputs are on (after
            they were moved to the model's device, see :func:`diff`).
        context: a zero-argument callable returning a context manager to run inside, for anything
            else (``lambda: torch.backends.cudnn.flags(enabled=False)``, ``sdpa_kernel(...)``).

    Example:
        >>> settings(train=True, autocast=torch.bfloat16).describe()
        'train, autocast bfloat16'
    """
    if train is not None and not isinstance(train, bool):
        raise HookscopeError(f"train={train!r} is not True, False or None; pass train=True for training mode")
    if device_type is not None:
        try:
            device_type = torch.device(device_type).type
        except (RuntimeError, TypeError, ValueError):
            raise HookscopeError(
                f"device_type={device_type!r} is not a device type; pass 'cpu' or 'cuda', or leave it out"
            ) from None
    if autocast is not None and not (isinstance(autocast, torch.dtype) and autocast.is_floating_point):
        raise HookscopeError(
            f"autocast={autocast!r} is not a floating-point torch.dtype; use torch.bfloat16 or torch.float16"
        )
    if context is not None and not callable(context):
        raise HookscopeError(
            f"context={context!r} is not callable; pass a function that returns a context manager, "
            "e.g. context=lambda: torch.autocast('cpu')"
        )
    return Settings(train=train, autocast=autocast, device_type=device_type, context=context)


RunSetting = Union[Settings, Callable[[], ContextManager[Any]], None]


def _as_settings(value: RunSetting, side: str) -> Settings:
    if value is None:
        return Settings()
    if isinstance(value, Settings):
        return value
    if callable(value):
        return Settings(context=value)
    raise HookscopeError(
        f"{side}={value!r} is not a run setting; pass {side}=hookscope.settings(train=..., autocast=...) "
        "or a function that returns a context manager"
    )


# --- what is reported ---------------------------------------------------------------------------
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

    @property
    def diverges(self) -> bool:
        """True when this output is beyond tolerance, or could not be compared value by value."""
        return self.status != _OK


class Unmatched(NamedTuple):
    """Selected names found in one model only, in that model's ``named_modules()`` order."""

    a_only: tuple[str, ...]
    b_only: tuple[str, ...]


def _label(row: DiffRow, multi_call: bool, multi_part: bool) -> str:
    label = row.name or "(model)"
    if multi_call:
        label += f"#{row.call}"
    if multi_part:
        label += f"[{row.part}]"
    return label


def _shape(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "-"
    return "x".join(map(str, shape)) if shape else "scalar"


def _num(v: float) -> str:
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
    text = r.status if r.status != _DIFFERS else f"DIFFERS ({r.mismatched}/{r.numel})"
    return "; ".join([text, *notes, *([r.note] if r.note else [])])


def _what(f: DiffRow) -> str:
    """What is wrong with the first divergent row, in words."""
    if f.status == _DIFFERS:
        beyond = f.mismatched - f.nan_a_only - f.nan_b_only
        said = [f"{beyond} of {f.numel} elements beyond tolerance, max abs {f.max_abs:.3e}"] if beyond else []
        return ", ".join([*said, _nan_places(f)] if f.nan_a_only or f.nan_b_only else said) or f.status
    if f.status == _SHAPE:
        return f"shape {_shape(f.shape_a)} in A, {_shape(f.shape_b)} in B"
    if f.status == _STRUCTURE:
        return f"structure: {f.note}"
    return f.status


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN or Infinity
    return v


class Diff:
    """The result of :func:`diff`: one :class:`DiffRow` per compared output, in run A's order.

    Rows come in the order the calls of run A finished (a layer's output exists before its parent's),
    then calls made in run B only. ``first`` is the first row that diverges, or ``None``;
    ``unmatched`` lists the selected names only one model has.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        >>> d = diff(net, net, torch.ones(2, 4), b=settings(autocast=torch.bfloat16))
        >>> [r.name for r in d], d.first.name, d["0"][0].dtype_b
        (['0', '1', ''], '0', 'bfloat16')
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
    ) -> None:
        self.rows = tuple(rows)
        self.unmatched = unmatched
        self.rtol, self.atol = rtol, atol
        self.run_a, self.run_b = run_a, run_b
        self.first: DiffRow | None = next((r for r in self.rows if r.diverges), None)

    def __getitem__(self, name: str) -> list[DiffRow]:
        """Every row of one module (each call, each output tensor)."""
        found = [r for r in self.rows if r.name == name]
        if not found:
            names = list(dict.fromkeys(r.name for r in self.rows))
            raise HookscopeError(
                f"{name!r} was not compared in this diff.{did_you_mean(name, names)} "
                "Compared names are listed by [r.name for r in d.rows]"
            )
        return found

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[DiffRow]:
        return iter(self.rows)

    def table(self, *, only_diverging: bool = False) -> str:
        """The comparison as a text table, with the first divergence and the unmatched names below.

        Example:
            >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            >>> d = diff(net, net, torch.ones(2, 4), b=settings(autocast=torch.bfloat16))
            >>> print(d.table(only_diverging=True).splitlines()[-1])  # doctest: +ELLIPSIS
            first divergence: 0 (call 0): ... of 8 elements beyond tolerance, max abs ...
        """
        calls: dict[str, set[int]] = {}
        parts: dict[tuple[str, int], int] = {}
        for r in self.rows:
            calls.setdefault(r.name, set()).add(r.call)
            parts[(r.name, r.call)] = parts.get((r.name, r.call), 0) + 1
        shown = [r for r in self.rows if r.diverges or not only_diverging]
        cells = [
            (
                _label(r, len(calls[r.name]) > 1, parts[(r.name, r.call)] > 1),
                _shape(r.shape_a) if r.shape_a == r.shape_b or r.shape_b is None
                else f"{_shape(r.shape_a)} / {_shape(r.shape_b)}",
                r.dtype_a if r.dtype_a == r.dtype_b or r.dtype_b is None
                else f"{r.dtype_a or '-'} / {r.dtype_b}",
                _num(r.max_abs), _num(r.max_rel),
                f"{r.cosine:.6f}" if not math.isnan(r.cosine) else "-",
                _status(r),
            )
            for r in shown
        ]
        head = ("layer", "shape", "dtype", "max abs", "max rel", "cosine", "status")
        widths = [max(len(str(c[i])) for c in [head, *cells]) for i in range(len(head))]
        right = {3, 4, 5}

        def line(c: Sequence[Any]) -> str:
            cols = [str(v).rjust(w) if i in right else str(v or "-").ljust(w)
                    for i, (v, w) in enumerate(zip(c, widths))]
            return "  ".join(cols).rstrip()

        out = [
            f"run A: {self.run_a}",
            f"run B: {self.run_b}",
            f"{len(self.rows)} outputs compared; tolerance |a - b| <= {self.atol:g} + {self.rtol:g} * |b|",
            "",
            line(head),
            "  ".join("-" * w for w in widths),
            *(line(c) for c in cells),
            "",
        ]
        nan, inf = sum(r.nan for r in self.rows), sum(r.inf for r in self.rows)
        if nan or inf:
            out.append(f"non-finite values at the same places in both runs count as equal: {nan} NaN, "
                       f"{inf} Inf (left out of max abs, max rel and cosine)")
        if not self.rows:
            out.append("nothing compared: no selected module returned a tensor or a number in either run")
        elif self.first is None:
            out.append("no divergence: every compared output is within tolerance")
        else:
            f = self.first
            out.append(f"first divergence: {_label(f, len(calls[f.name]) > 1, parts[(f.name, f.call)] > 1)}"
                       f" (call {f.call}): {_what(f)}")
        for side, names in (("A", self.unmatched.a_only), ("B", self.unmatched.b_only)):
            if names:
                out.append(f"only in {side} ({len(names)}, not compared): {', '.join(names)}")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: settings, tolerance, rows, first divergence and unmatched names.

        Example:
            >>> net = nn.Linear(4, 4)
            >>> data = diff(net, net, torch.ones(2, 4)).to_dict()
            >>> data["first"], data["rows"][0]["status"], data["rows"][0]["shape_a"]
            (None, 'ok', [2, 4])
        """
        def row(r: DiffRow) -> dict[str, Any]:
            return {k: _finite(list(v) if isinstance(v, tuple) else v) for k, v in asdict(r).items()}

        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "rtol": self.rtol,
            "atol": self.atol,
            "first": None if self.first is None else row(self.first),
            "rows": [row(r) for r in self.rows],
            "unmatched": {"a_only": list(self.unmatched.a_only), "b_only": list(self.unmatched.b_only)},
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON (non-finite numbers as the strings ``"nan"``, ``"inf"``).

        Example:
            >>> net = nn.Linear(4, 4)
            >>> json.loads(diff(net, net, torch.ones(2, 4)).to_json())["rows"][0]["cosine"]
            1.0
        """
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        first = "none" if self.first is None else repr(self.first.name)
        return f"Diff({len(self.rows)} rows, first divergence: {first})"


# --- running ------------------------------------------------------------------------------------
def _home(model: nn.Module) -> torch.device | None:
    """The one device every parameter and buffer of ``model`` is on; None if none or several."""
    found = {t.device for t in (*model.parameters(), *model.buffers())}
    return found.pop() if len(found) == 1 else None


def _fresh_inputs(model: nn.Module, inputs: Any) -> tuple[Any, torch.device]:
    """A copy of the inputs for one run (an in-place op of run A cannot reach run B), moved to the
    model's device when they are all on another one (a CPU model against a CUDA one); and the
    device the run computes on, for autocast."""
    home = _home(model)
    found = {t.device for t in tensors(inputs)}
    to = home if home is not None and len(found) == 1 and home not in found else None

    def fresh(t: torch.Tensor) -> torch.Tensor:
        c = t.detach().to(to) if to is not None else t.detach().clone()  # .to(another device) copies
        return c.requires_grad_() if t.requires_grad else c

    first = next(iter(found), None)
    return tree_map(fresh, inputs), to or first or home or torch.device("cpu")


class _Run(NamedTuple):
    rec: Recording | None  # None for a run compared as it went (:class:`_Streamed`)
    done: list[str]  # names of the compared calls, in the order they finished


def _failure(label: str, running: list[tuple[str, str, list[tuple[Any, ...]]]], e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not running:
        where = "before any compared module ran"
    else:
        name, kind, shapes = running[-1]
        who = f"module {name!r} ({kind})" if name else f"the model itself ({kind})"
        where = f"in {who}, which received input shape(s) {', '.join(map(str, shapes)) or 'none'}"
    return (f"run {label} failed {where}: {type(e).__name__}: {msg}; check the example input's shape "
            "and dtype, and that the run's settings suit the model")


class _Tracker:
    """The hooks of one run: which compared module is running, which calls finished, and (run B)
    each output handed to the comparison as it is produced."""

    def __init__(self, label: str, device_type: str, on_output: Callable[[str, Any], None] | None,
                 like_a: Retention) -> None:
        self.label, self.device_type, self.on_output, self.like_a = label, device_type, on_output, like_a
        self.done: list[str] = []
        self.running: list[tuple[str, str, list[tuple[Any, ...]]]] = []
        self.failed: list[BaseException] = []  # errors of the comparison, not of the model
        self.marker = Slot(torch.empty(0), "copied", f"run {label}")

    def enter(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def pre(module: nn.Module, a: tuple[Any, ...]) -> None:
            shapes = [tuple(t.shape) if not t.is_nested else ("nested",) for t in tensors(a)]
            self.running.append((name, type(module).__name__, shapes))
        return pre

    def leave(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
        def post(module: nn.Module, a: tuple[Any, ...], out: Any) -> Any:
            if self.running:
                self.running.pop()
            self.done.append(name)
            if self.on_output is None:
                return None
            try:
                with _isolated(self.device_type):
                    self.on_output(name, tree_map(plain, out))  # now, before an in-place op rewrites it
            except BaseException as e:
                self.failed.append(e)
                raise
            new = tree_map(self.hand_on, out)
            return None if new is out else new
        return post

    def hand_on(self, t: torch.Tensor) -> torch.Tensor:
        # The compared run is handed the same kind of tensors the recorded run gets from capture():
        # guarded aliases of large outputs, registered (by a marker that keeps nothing) so that
        # their views stay guarded too; both runs then take the same PyTorch code paths.
        return protect(t, self.marker) if self.like_a.guards(t) else t

    def register(self, model: nn.Module, targets: list[tuple[str, nn.Module]], group: HookGroup) -> None:
        # Under torch.compile, hooks run eagerly between graph pieces instead of being traced.
        wrap: Callable[[Any], Any] = eager if is_compiled(model) else (lambda f: f)
        for name, module in targets:
            group.add(module.register_forward_pre_hook(wrap(self.enter(name))))
            group.add(module.register_forward_hook(wrap(self.leave(name))))
        if self.on_output is not None and self.like_a.guards_any():  # as capture() does for run A
            for module in boundary_modules(model):
                group.add(module.register_forward_pre_hook(settle_inputs, with_kwargs=True))
            group.add(model.register_forward_hook(_hand_back_plain))

    def run(self, model: nn.Module, args: Any, kw: dict[str, Any]) -> None:
        try:
            model(*args, **kw)
        except Exception as e:
            if any(e is f for f in self.failed):
                raise  # the comparison's own error, as it was raised
            raise HookscopeError(_failure(self.label, self.running, e)) from e

    def close(self) -> None:
        self.failed.clear()  # an exception holds frames, and they hold tensors
        release([self.marker])


def _record(
    model: nn.Module,
    targets: list[tuple[str, nn.Module]],
    inputs: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    setting: Settings,
    *,
    label: str,
    seed: int | None,
    rng_devices: RngDevices,
    no_grad: bool,
    copy: str | None,
    device: torch.device | str | None,
    on_output: Callable[[str, Any], None] | None = None,
) -> _Run:
    """One forward pass, recorded or, with ``on_output``, handed over output by output as it runs.

    Every flag and buffer of the model is as before afterwards; every hook is removed, and a
    compiled model runs its own compiled code again.
    """
    inner, _ = unwrap(model)
    compiled = is_compiled(model)
    if copy is None:
        # Inside torch.compile, the guarded alias that copy="auto" hands on fails in the compiled
        # matmul (TypeError: multiple dispatch failed for aten.addmm.out); copies work there.
        copy = "always" if compiled else "auto"
    flags = [(m, m.training) for m in inner.modules()]
    # BatchNorm in train mode updates its running statistics: put them back, so that run B (or the
    # user's next step) starts from the model as it was given.
    saved = [(b, b.detach().clone(), _version(b)) for b in inner.buffers()]
    (args, kw), dev = _fresh_inputs(model, (inputs, dict(kwargs)))
    like_a = Retention(copy="always" if compiled and copy == "auto" else copy, device=device)  # type: ignore[arg-type]
    track = _Tracker(label, dev.type, on_output, like_a)
    group = HookGroup()
    refresh = HookRefresh(model)  # a compiled model that already ran would not see new hooks
    wanted = {id(m) for _, m in targets}  # one predicate: O(modules), not O(modules x selectors)
    rec = capture(model, lambda n, m: id(m) in wanted, copy=copy, device=device) if on_output is None else None
    grad_mode = torch.no_grad() if no_grad else contextlib.nullcontext()
    try:
        with rec if rec is not None else contextlib.nullcontext():
            track.register(model, targets, group)
            refresh.open()
            # the same RNG stream for both runs (dropout masks match), the caller's put back after
            reseeded = kept_rng(rng_devices, seed=seed) if seed is not None else contextlib.nullcontext()
            with reseeded, grad_mode, setting.apply(inner, dev.type):
                track.run(model, args, kw)
            if rec is not None:
                _unshare_buffers(rec, inner)
    finally:
        track.close()
        group.remove()
        refresh.close()
        _restore(flags, saved)
    return _Run(rec, track.done)


def _restore(flags: list[tuple[nn.Module, bool]], saved: list[tuple[torch.Tensor, torch.Tensor, int | None]]) -> None:
    for m, flag in flags:
        m.training = flag
    with torch.no_grad():
        for b, value, version in saved:  # only what changed (BatchNorm's kernel updates its
            if b.shape == value.shape and (  # running statistics without a version bump)
                    version is None or _version(b) != version or not torch.equal(b, value)):
                b.copy_(value)


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version  # inference tensors have no version counter


def _unshare_buffers(rec: Recording, model: nn.Module) -> None:
    """Give run A's records that share memory with a buffer their own copy, before its capture
    closes: run B, or putting the buffers back, may write there (a KV cache returned as a view)."""
    storages = {b.untyped_storage().data_ptr() for b in model.buffers()}
    if not storages:
        return

    def unshare(slot: Slot) -> Slot:
        if slot.policy == "auto" and slot.value.untyped_storage().data_ptr() in storages:
            slot.before_write("")  # "auto" makes its own copy now
        return slot

    for call in rec.calls:
        if call._output is not RAISED and call._output is not NOT_KEPT:
            tree_map(unshare, call._output, leaf=Slot)


# --- comparing ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _isolated(device_type: str) -> Iterator[None]:
    """hookscope's own arithmetic, outside run B's context: no autograd, no autocast, and no
    torch-function or dispatch mode of the caller's (they would change or count it)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for kind in dict.fromkeys(("cpu", device_type)):
            stack.enter_context(torch.autocast(kind, enabled=False))
        stack.enter_context(torch._C.DisableTorchFunction())
        stack.enter_context(_no_modes())
        yield


def _work_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    if a.device.type == "mps":
        return torch.float32  # MPS has no float64
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64  # float64 inputs, and integers (exact up to 2**53)
    return torch.float32  # float16 / bfloat16 / float32 are exact in float32


_NSTATS = 10  # the length of what _stats returns


def _stats(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, scratch: Scratch | None = None) -> torch.Tensor:
    """``[max|a-b|, max|b|, |a|, |b|, |a-b|, elements within tolerance, NaN in both, same Inf in
    both, NaN in A only, NaN in B only]`` in float64 on ``a``'s device (see :class:`DiffRow`).

    No host synchronisation, except on the CPU where there is nothing to wait for: there an equal
    pair (the usual case before the first divergence) is recognised in one early-exit pass, and
    finite floating-point pairs take a fast path; the rest (NaN, infinities, float32 overflow,
    integers, complex) is computed in float64.
    """
    x, y = a.detach(), b.detach().to(a.device)
    n = x.numel()
    if x.device.type == "cpu":
        if x.dtype == y.dtype and torch.equal(x, y):
            return torch.tensor([0.0] * 5 + [float(n)] + [0.0] * 4, dtype=torch.float64)
        if x.is_floating_point() and y.is_floating_point():
            found = _host_stats(x, y, rtol, atol, scratch or Scratch())
            if found is not None:
                return torch.tensor(found, dtype=torch.float64)
        return _device_stats(x, y, rtol, atol, work=torch.float64)
    return _device_stats(x, y, rtol, atol)


def _device_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float,
                  work: torch.dtype | None = None) -> torch.Tensor:
    """:func:`_stats` anywhere, for any values (NaN, infinities, complex), with no synchronisation."""
    n = x.numel()
    if n == 0:
        return torch.zeros(_NSTATS, dtype=torch.float64, device=x.device)
    exact = not (x.is_floating_point() or x.is_complex() or y.is_floating_point() or y.is_complex())
    differ = (x != y).reshape(n, 1) if exact else None  # integers (and bools): exact inequality
    if x.is_complex() or y.is_complex():  # compared as (real, imaginary) pairs
        x, y = torch.view_as_real(x.to(torch.complex128)), torch.view_as_real(y.to(torch.complex128))
    work = work or _work_dtype(x, y)
    x, y = x.to(work).reshape(n, -1), y.to(work).reshape(n, -1)
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    nan_both = nan_x & nan_y
    agree = nan_both | (torch.isinf(x) & (x == y))  # the same non-finite value at the same place
    nan_one = nan_x ^ nan_y
    skip = agree | nan_one  # left out of the numbers: they are counted instead
    x, y = x.masked_fill(skip, 0), y.masked_fill(skip, 0)
    gap = torch.sub(x, y).abs_()
    if differ is not None:  # integers beyond 2**53 can round to equal floats: they still differ
        gap = torch.where(differ & (gap < 1), torch.ones_like(gap), gap)
    limit = y.abs()
    max_b = limit.max()
    # a finite limit, so that an infinity in B alone is beyond tolerance, as in torch.isclose
    limit.mul_(rtol).add_(atol).clamp_(max=torch.finfo(work).max)
    acc = torch.float32 if x.device.type == "mps" else torch.float64  # sums of squares overflow float32
    norms = [torch.linalg.vector_norm(t, dtype=acc) for t in (x, y, gap)]
    ok = ((gap <= limit) | agree) & ~nan_one
    nan_row = nan_both.any(dim=1)
    counts = [ok.all(dim=1), nan_row, agree.any(dim=1) & ~nan_row, nan_one.any(dim=1) & nan_x.any(dim=1),
              nan_one.any(dim=1) & nan_y.any(dim=1)]
    parts = [gap.max(), max_b, *norms, *(c.sum() for c in counts)]
    return torch.stack([p.to(torch.float64) for p in parts])


def _host_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float, scratch: Scratch) -> list[float] | None:
    """:func:`_stats` of two CPU tensors that differ, in ~6 memory passes; None where a value is
    not finite (the general path handles NaN, infinities and overflow) or the tensors are empty."""
    work = _work_dtype(x, y)
    n = x.numel()
    if n == 0:
        return None
    x, y = x.to(work), y.to(work)
    # the same element order on both sides: memory order if the layouts agree, else logical order
    xs, ys = (flat(x), flat(y)) if x.stride() == y.stride() else (x.reshape(-1), y.reshape(-1))
    gap = torch.sub(xs, ys, out=scratch.get(n, work))
    lo, hi = (v.item() for v in torch.aminmax(gap))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    y_lo, y_hi = (v.item() for v in torch.aminmax(ys))
    max_abs, max_b = max(-lo, hi) + 0.0, max(-y_lo, y_hi) + 0.0  # + 0.0: never -0.0
    norms = [math.sqrt(torch.dot(v, v).item()) for v in (xs, ys, gap)]
    if not all(map(math.isfinite, norms)):  # a float32 sum of squares overflowed
        norms = [torch.linalg.vector_norm(v, dtype=torch.float64).item() for v in (xs, ys, gap)]
    if max_abs <= atol:  # nothing can be beyond the tolerance
        within = n
    else:  # beyond where |a - b| > atol + rtol |b|, as torch.isclose has it
        limit = torch.abs(ys, out=scratch.get(2 * n, work)[n:])
        torch.add(torch.tensor(atol, dtype=work), limit, alpha=rtol, out=limit)  # atol + rtol |b|
        beyond = torch.gt(gap.abs_(), limit, out=scratch.get(n, torch.bool))
        within = n - int(torch.count_nonzero(beyond).item())
    return [max_abs, max_b, *norms, float(within), 0.0, 0.0, 0.0, 0.0]


def _finish(row: DiffRow, s: list[float]) -> DiffRow:
    max_abs, max_b, na, nb, nd, within, nan, inf, nan_a, nan_b = s
    if max_abs == 0:
        rel, cos = 0.0, 1.0
    else:
        rel = max_abs / max_b if max_b > 0 and math.isfinite(max_abs) else math.inf
        if na > 0 and nb > 0:
            # 1 - cos = (|a-b|^2 - (|a|-|b|)^2) / (2|a||b|): accurate near 1 with float32 sums
            cos = 1.0 - (nd - (na - nb)) * (nd + (na - nb)) / (2.0 * na * nb)
            cos = max(-1.0, min(1.0, cos)) if not math.isnan(cos) else cos
        else:
            cos = 1.0 if na == nb else 0.0
    mismatched = row.numel - int(within)
    status = _DIFFERS if mismatched > 0 else _OK
    return dataclasses.replace(row, max_abs=max_abs, max_rel=rel, cosine=cos, mismatched=mismatched,
                               status=status, nan=int(nan), inf=int(inf), nan_a_only=int(nan_a),
                               nan_b_only=int(nan_b))


def _describe(t: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(t.shape), str(t.dtype).replace("torch.", "")


_NUMBERS = (bool, int, float, complex)


def _leaves(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every tensor, Python number and ``None`` in ``obj`` with its path, depth first.

    Example:
        >>> [p for p, _ in _leaves({"y": torch.ones(1), "aux": (None, 2)})]
        ["['y']", "['aux'][0]", "['aux'][1]"]
    """
    if isinstance(obj, torch.Tensor) and obj.is_nested:  # compared component by component
        return [leaf for i, t in enumerate(obj.unbind()) for leaf in _leaves(t, f"{path}[{i}]")]
    if obj is None or isinstance(obj, (torch.Tensor, *_NUMBERS)):
        return [(path, obj)]
    if isinstance(obj, (list, tuple)):
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, f"{path}[{i}]")]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{path}[{k!r}]")]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in _leaves(getattr(obj, f.name), f"{path}.{f.name}")]
    return []  # strings and other objects are not compared


def _value(v: Any) -> tuple[torch.Tensor, str]:
    """A leaf as a strided tensor, and its dtype as reported (a Python number's type name)."""
    if isinstance(v, torch.Tensor):
        kind = str(v.dtype).replace("torch.", "")
        v = v.dequantize() if v.is_quantized else v  # compared by the values they stand for
        return (v.to_dense() if v.layout != torch.strided else v), kind  # sparse: as dense
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        return torch.tensor(float(v), dtype=torch.float64), "int"
    dtype = {float: torch.float64, complex: torch.complex128}.get(type(v))
    return torch.tensor(v, dtype=dtype), type(v).__name__


def _int_stats(a: int, b: int, rtol: float, atol: float) -> torch.Tensor:
    """:func:`_stats` of two Python ints, exactly (they may exceed int64 and float64's 2**53)."""
    gap, big = abs(a - b), float("inf")
    try:
        within = gap <= atol + rtol * abs(b)
        sizes = [float(gap), float(abs(b)), float(abs(a)), float(abs(b)), float(gap)]
    except OverflowError:  # beyond float64's range
        within, sizes = gap == 0, [big if abs(v) > 2**1000 else float(abs(v)) for v in (gap, b, a, b, gap)]
    return torch.tensor([*sizes, float(within), 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def _numel(out: Any) -> int:
    return sum(v.numel() for _, v in _leaves(out) if isinstance(v, torch.Tensor))


def _kind(v: Any) -> str:
    return "None" if v is None else "a tensor" if isinstance(v, torch.Tensor) else f"a {type(v).__name__}"


def _structure(a: dict[str, Any], b: dict[str, Any]) -> str:
    """How two outputs' structures differ, in words (for a ``"structure"`` row)."""
    for p in dict.fromkeys([*a, *b]):
        if p not in b or p not in a or (a[p] is None) != (b[p] is None):
            where = f"output{p}" if p else "the output"
            return (f"{where} is {_kind(a[p]) if p in a else 'missing'} in A, "
                    f"{_kind(b[p]) if p in b else 'missing'} in B")
    return "the outputs are built differently"


def _pair(name: str, call: int, out_a: Any, out_b: Any, rtol: float, atol: float,
          pending: list[tuple[DiffRow, torch.Tensor | None]], scratch: Scratch | None = None) -> None:
    la, lb = dict(_leaves(out_a)), dict(_leaves(out_b))
    values_a = [p for p, v in la.items() if v is not None]
    if not values_a and not any(v is not None for v in lb.values()):
        return  # nothing to compare (an output of None, strings, ...)
    if la.keys() != lb.keys() or any((la[p] is None) != (lb[p] is None) for p in la):
        numel = _numel(out_a)
        pending.append((DiffRow(name, call, 0, _STRUCTURE, numel=numel, note=_structure(la, lb)), None))
        return
    for part, p in enumerate(values_a):  # paired by path: a dict's key order does not matter
        (a, da), (b, db) = _value(la[p]), _value(lb[p])
        row = DiffRow(name, call, part, _OK, tuple(a.shape), tuple(b.shape), da, db, numel=a.numel(), path=p)
        if row.shape_a != row.shape_b:
            pending.append((dataclasses.replace(row, status=_SHAPE), None))
        elif da == db == "int":
            pending.append((row, _int_stats(la[p], lb[p], rtol, atol)))
        else:
            pending.append((row, _stats(a, b, rtol, atol, scratch)))


class _Streamed:
    """Compares each output of run B with the same call of run A as B produces it.

    Run B keeps nothing: half the memory of recording both runs, and each comparison reads B's
    output while it is still in cache.
    """

    def __init__(self, rec_a: Recording, rtol: float, atol: float) -> None:
        self.rec_a, self.rtol, self.atol = rec_a, rtol, atol
        self.calls: dict[str, int] = {}
        self.returned: dict[str, list[Any]] = {}  # run A's calls of a name that returned (not raised)
        self.scratch = Scratch()
        self.pending: dict[tuple[str, int], list[tuple[DiffRow, torch.Tensor | None]]] = {}

    def __call__(self, name: str, out_b: Any) -> None:
        k = self.calls.get(name, 0)
        self.calls[name] = k + 1
        calls_a = self._returned(name)
        if k < len(calls_a):
            rows: list[tuple[DiffRow, torch.Tensor | None]] = []
            _pair(name, k, calls_a[k].output, out_b, self.rtol, self.atol, rows, self.scratch)
            self.pending[(name, k)] = rows

    def _returned(self, name: str) -> list[Any]:
        if name not in self.returned:
            calls = self.rec_a[name].calls if name in self.rec_a else []
            self.returned[name] = [c for c in calls if c._output is not RAISED]
        return self.returned[name]

    def rows(self, done_a: list[str], done_b: list[str]) -> list[DiffRow]:
        """Rows in run A's order of calls, then the calls only run B made."""
        pending: list[tuple[DiffRow, torch.Tensor | None]] = []
        seen: dict[str, int] = {}
        for name in done_a:
            k = seen.get(name, 0)
            seen[name] = k + 1
            compared = self.pending.get((name, k))
            if compared is None:
                numel = _numel(self._returned(name)[k].output)
                pending.append((DiffRow(name, k, 0, _MISSING_B, numel=numel), None))
            else:
                pending.extend(compared)
        extra: dict[str, int] = {}
        for name in done_b:
            k = extra.get(name, 0)
            extra[name] = k + 1
            if k >= seen.get(name, 0):
                pending.append((DiffRow(name, k, 0, _MISSING_A), None))
        return _gather(pending)


def _gather(pending: list[tuple[DiffRow, torch.Tensor | None]]) -> list[DiffRow]:
    """Finish every row, with one device-to-host transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, s) in enumerate(pending):
        if s is not None:
            by_device.setdefault(s.device, []).append(i)
    host: dict[int, list[float]] = {}
    for idx in by_device.values():
        stacked = torch.stack([s for i in idx if (s := pending[i][1]) is not None])
        host.update(zip(idx, stacked.to(torch.float64).cpu().tolist()))
    return [_finish(row, host[i]) if i in host else row for i, (row, _) in enumerate(pending)]


# --- choosing what to compare -------------------------------------------------------------------
def _few(names: Sequence[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" (and {len(names) - n} more)" if len(names) > n else "")


def _selected(model_a: nn.Module, model_b: nn.Module, selectors: Any) -> tuple[list[str], list[str]]:
    """Names the selectors pick in each model; each selector must match in at least one of them."""
    items = list(selectors) if isinstance(selectors, (list, set, frozenset)) else [selectors]
    picked_a: list[str] = []
    picked_b: list[str] = []
    for sel in items:
        hits: list[SelectionError] = []
        for model, picked in ((model_a, picked_a), (model_b, picked_b)):
            try:
                found = [n for n, _ in select(model, sel)]
            except SelectionError as e:
                hits.append(e)
                continue
            picked += found
        if len(hits) == 2:
            raise hits[0]
    return picked_a, picked_b


def _names(
    model_a: nn.Module, model_b: nn.Module, selectors: Any
) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]], Unmatched]:
    inner_a, inner_b = unwrap(model_a)[0], unwrap(model_b)[0]
    mods_a, mods_b = dict(inner_a.named_modules()), dict(inner_b.named_modules())
    if selectors is None:
        sel_a, sel_b = list(mods_a), list(mods_b)
    else:
        picked_a, picked_b = _selected(model_a, model_b, selectors)
        sel_a = list(dict.fromkeys(picked_a + [n for n in picked_b if n in mods_a]))
        sel_b = list(dict.fromkeys(picked_b + [n for n in picked_a if n in mods_b]))
    set_b = set(sel_b)
    common = [n for n in sel_a if n in set_b]
    real_a, real_b = [n for n in sel_a if n], [n for n in sel_b if n]
    if not [n for n in common if n] and (real_a and real_b or not common):
        raise HookscopeError(
            f"{type(inner_a).__name__} (A) and {type(inner_b).__name__} (B) share no layer name to "
            f"compare: A has {_few(real_a) or 'none'}, B has {_few(real_b) or 'none'}; diff matches "
            "modules by qualified name, so give two models of one architecture, or one model twice "
            "with b=hookscope.settings(...)"
        )
    order_b = {n: i for i, n in enumerate(mods_b)}
    unmatched = Unmatched(
        tuple(n for n in sel_a if n not in set_b),
        tuple(sorted((n for n in sel_b if n not in set(sel_a)), key=order_b.__getitem__)),
    )
    return [(n, mods_a[n]) for n in common], [(n, mods_b[n]) for n in common], unmatched


# --- arguments, all checked before any hook is registered --------------------------------------
def _check_models(model_a: Any, model_b: Any) -> None:
    for side, m in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(m, nn.Module):
            raise HookscopeError(
                f"{side} is a {type(m).__name__}, not an nn.Module; call diff(model_a, model_b, *inputs), "
                "or diff(model, model, *inputs, b=hookscope.settings(...)) for one model under two settings"
            )
        if any(t.is_meta for t in (*m.parameters(), *m.buffers())):
            raise HookscopeError(
                f"{side} has tensors on the meta device, which hold no values to compare; load its "
                "weights first (model.to_empty(device='cpu') then model.load_state_dict(...))"
            )


def _tolerance(name: str, value: Any) -> float:
    """``value`` as a float, if it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise HookscopeError(
            f"{name}={value!r} is not a number; pass a float >= 0 such as {name}={RTOL if name == 'rtol' else ATOL:g}"
        )
    if not (math.isfinite(float(value)) and float(value) >= 0):
        raise HookscopeError(
            f"{name}={value!r} is not a finite number >= 0; pass for example {name}=0 for exact "
            f"equality or {name}={RTOL if name == 'rtol' else ATOL:g} (the default)"
        )
    return float(value)


def _check_run_args(kwargs: Any, seed: Any, no_grad: Any, copy: Any, device: Any) -> None:
    if kwargs is not None and not (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        raise HookscopeError(
            f"kwargs={kwargs!r} is not a mapping of argument names; pass kwargs={{'mask': m}}, or "
            "positional inputs after the models"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise HookscopeError(f"seed={seed!r} is not an int; pass seed=0 (the default), another int, or None")
    if not isinstance(no_grad, bool):
        raise HookscopeError(f"no_grad={no_grad!r} is not True or False; pass no_grad=False to run with autograd")
    if copy is not None and copy not in ("auto", "always", "never"):
        raise HookscopeError(f"copy={copy!r} is not a copy policy; use 'auto', 'always' or 'never'")
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise HookscopeError(
                f"device={device!r} is not a torch device; pass device='cpu', 'cuda' or None"
            ) from None


def diff(
    model_a: nn.Module,
    model_b: nn.Module,
    *inputs: Any,
    kwargs: Mapping[str, Any] | None = None,
    layers: Selector | Sequence[Selector] | None = None,
    a: RunSetting = None,
    b: RunSetting = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    seed: int | None = 0,
    no_grad: bool = True,
    copy: str | None = None,
    device: torch.device | str | None = None,
) -> Diff:
    """Run the same inputs through two models (or one model twice) and compare every layer's output.

    Modules are matched by qualified name (of the unwrapped models: DataParallel, DDP and
    ``torch.compile`` are seen through); each call of a module called several times is compared
    with the same call of the other run, and every tensor (and Python number) of a nested output
    (tuple, dict, dataclass...) with the one at the same place in the other run (dict keys by name;
    ``None`` in different places is a ``"structure"`` row). Names that only one model has are
    listed in ``Diff.unmatched``. NaN and infinities agree where both runs have the same one at the
    same place (counted in ``DiffRow.nan`` / ``.inf``, left out of the error numbers); a NaN in one
    run only is a divergence. A compiled model (``torch.compile(model)``, ``model.compile()`` or a
    compiled submodule) is re-traced with the comparison's hooks, even if it already ran, and runs
    its own compiled code again afterwards. Every argument is checked before anything runs.

    Both runs get their own copy of the inputs (moved to a model's device when the model is on one
    device and the inputs all on another), run under ``torch.no_grad()`` (unless
    ``no_grad=False``) and start from the same RNG state (``torch.manual_seed(seed)``, so dropout
    draws the same masks if both runs draw random numbers in the same order); the caller's RNG
    state, every module's train/eval flag and every buffer (BatchNorm's running statistics) are
    restored afterwards.

    Args:
        model_a, model_b: the two models; pass the same model twice to compare two settings, or
            ``torch.compile(model)`` as ``model_b`` to compare eager with compiled.
        *inputs: positional inputs of the forward pass, shared by both runs.
        kwargs: keyword inputs of the forward pass.
        layers: selectors (see :func:`hookscope.layers`) of the modules to compare; default: every
            module and the model itself (its output is the row named ``""``).
        a, b: how each run is made: :func:`settings` (``train=``, ``autocast=``, ``context=``) or a
            function that returns a context manager.
        rtol, atol: an output diverges where ``|a - b| > atol + rtol * |b|`` anywhere (B is the
            reference); finite numbers >= 0; defaults: ``torch.testing``'s float32 tolerances.
        seed: the seed both runs start from (an int); ``None`` leaves the RNG alone.
        no_grad: run without autograd (default); ``False`` to compare a grad-mode forward pass.
        copy, device: how run A's outputs are kept (see :func:`hookscope.capture`; run B's are
            compared as they are produced and not kept). ``copy`` defaults to ``"auto"``, and to
            ``"always"`` for a ``torch.compile``'d model; ``device="cpu"`` moves every recorded
            output off the accelerator as it is produced.

    Returns:
        A :class:`Diff`: ``.rows``, ``.first`` (first divergent output or ``None``),
        ``.unmatched``, ``.table()``, ``.to_json()``.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval()
        >>> d = diff(net, net, torch.randn(2, 4), b=settings(train=True))
        >>> d.first.name, d["0"][0].max_abs
        ('1', 0.0)
    """
    _check_models(model_a, model_b)
    if not inputs and not kwargs:
        raise HookscopeError("diff needs the inputs both runs share: diff(model_a, model_b, x)")
    rtol, atol = _tolerance("rtol", rtol), _tolerance("atol", atol)
    _check_run_args(kwargs, seed, no_grad, copy, device)
    set_a, set_b = _as_settings(a, "a"), _as_settings(b, "b")
    targets_a, targets_b, unmatched = _names(model_a, model_b, layers)
    check_hookable(targets_a)
    check_hookable(targets_b)
    kwargs = dict(kwargs or {})
    rngs = rng_devices([*model_a.parameters(), *model_b.parameters(), *tensors((inputs, kwargs))])
    common = dict(kwargs=kwargs, seed=seed, rng_devices=rngs, no_grad=no_grad, copy=copy, device=device)
    run_a = _record(model_a, targets_a, inputs, setting=set_a, label="A", **common)  # type: ignore[arg-type]
    assert run_a.rec is not None
    streamed = _Streamed(run_a.rec, rtol, atol)
    run_b = _record(model_b, targets_b, inputs, setting=set_b, label="B", on_output=streamed, **common)  # type: ignore[arg-type]
    rows = streamed.rows(run_a.done, run_b.done)

    def describe(m: nn.Module, s: Settings) -> str:
        inner = unwrap(m)[0]
        wrapped = " (compiled)" if is_compiled(m) else ""
        extra = s.describe()
        return f"{type(inner).__name__}{wrapped}" + (f", {extra}" if extra else ", as given")

    return Diff(rows, unmatched, rtol=rtol, atol=atol,
                run_a=describe(model_a, set_a), run_b=describe(model_b, set_b))
