"""Compare two runs layer by layer: two models with the same layer names, or one model twice.

Run A is recorded with :func:`hookscope.capture` (so in-place ops cannot rewrite what was kept);
run B keeps nothing: each of its outputs is compared with the same call of run A inside the hook,
as it is produced. Every module both models have is compared call by call and tensor by tensor on
the tensors' device, and the statistics reach the host in one transfer per device at the end.
Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ContextManager, NamedTuple, Union

import torch
from torch import nn

from .._tree import tensors, tree_map
from .._memory import Scratch, flat
from .._rng import RngDevices, kept_rng, rng_devices
from ..capture import _hand_back_plain, capture, check_hookable
from ..core.guard import Slot, plain, protect, release
from ..core.hooks import HookGroup
from ..errors import HookscopeError, SelectionError, did_you_mean
from ..records import NOT_KEPT, RAISED, Recording, Retention
from ..selection import Selector, unwrap
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
        device_type: autocast's device type; default: the device of the first input (or parameter).
        context: a zero-argument callable returning a context manager to run inside, for anything
            else (``lambda: torch.backends.cudnn.flags(enabled=False)``, ``sdpa_kernel(...)``).

    Example:
        >>> settings(train=True, autocast=torch.bfloat16).describe()
        'train, autocast bfloat16'
    """
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
    (as ``torch.isclose``: equal infinities agree, an infinity against a finite value does not; a
    NaN in either run is always a mismatch, also at the same place in both).
    ``status`` is ``"ok"``, ``"differs"`` (beyond tolerance), ``"shape"``, ``"structure"``
    (a different number of output tensors), ``"missing in A"`` or ``"missing in B"`` (a call that
    happened in one run only).
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
                r.status if r.status != _DIFFERS else f"DIFFERS ({r.mismatched}/{r.numel})",
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
        if self.first is None:
            out.append("no divergence: every compared output is within tolerance")
        else:
            f = self.first
            what = {
                _DIFFERS: f"{f.mismatched} of {f.numel} elements beyond tolerance, max abs {f.max_abs:.3e}",
                _SHAPE: f"shape {_shape(f.shape_a)} in A, {_shape(f.shape_b)} in B",
            }.get(f.status, f.status)
            out.append(f"first divergence: {_label(f, len(calls[f.name]) > 1, parts[(f.name, f.call)] > 1)}"
                       f" (call {f.call}): {what}")
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
def _fresh(t: torch.Tensor) -> torch.Tensor:
    c = t.detach().clone()
    return c.requires_grad_() if t.requires_grad else c


class _Run(NamedTuple):
    rec: Recording | None  # None for a run compared as it went (:class:`_Streamed`)
    done: list[str]  # names of the compared calls, in the order they finished


def _failure(label: str, running: list[tuple[str, str, list[tuple[int, ...]]]], e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not running:
        where = "before any compared module ran"
    else:
        name, kind, shapes = running[-1]
        who = f"module {name!r} ({kind})" if name else f"the model itself ({kind})"
        where = f"in {who}, which received input shape(s) {', '.join(map(str, shapes)) or 'none'}"
    return (f"run {label} failed {where}: {type(e).__name__}: {msg}; check the example input's shape "
            "and dtype, and that the run's settings suit the model")


def _record(
    model: nn.Module,
    targets: list[tuple[str, nn.Module]],
    inputs: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    setting: Settings,
    *,
    label: str,
    device_type: str,
    seed: int | None,
    rng_devices: RngDevices,
    no_grad: bool,
    copy: str | None,
    device: torch.device | str | None,
    on_output: Callable[[str, Any], None] | None = None,
) -> _Run:
    """One forward pass, recorded or, with ``on_output``, handed over output by output as it runs.

    Every flag and buffer of the model is as before afterwards.
    """
    inner, prefix = unwrap(model)
    if copy is None:
        # Inside torch.compile, the guarded alias that copy="auto" hands on fails in the compiled
        # matmul (TypeError: multiple dispatch failed for aten.addmm.out); copies work there.
        copy = "always" if "_orig_mod." in prefix else "auto"
    flags = [(m, m.training) for m in inner.modules()]
    # BatchNorm in train mode updates its running statistics: put them back, so that run B (or the
    # user's next step) starts from the model as it was given.
    saved = [(b, b.detach().clone(), _version(b)) for b in inner.buffers()]
    args = tree_map(_fresh, inputs)  # fresh per run: an in-place op of run A cannot reach run B
    kw = tree_map(_fresh, dict(kwargs))
    done: list[str] = []
    running: list[tuple[str, str, list[tuple[int, ...]]]] = []
    group = HookGroup()

    def enter(name: str) -> Any:
        def pre(module: nn.Module, a: tuple[Any, ...]) -> None:
            running.append((name, type(module).__name__, [tuple(t.shape) for t in tensors(a)]))
        return pre

    # Under torch.compile, hooks run eagerly between graph pieces instead of being traced.
    compiled = "_orig_mod." in prefix
    eager = torch.compiler.disable if compiled else (lambda f: f)
    # The compared run is handed the same kind of tensors the recorded run gets from capture():
    # guarded aliases of large outputs, registered (by a marker that keeps nothing) so that their
    # views stay guarded too; both runs then take the same PyTorch code paths.
    like_a = Retention(copy="always" if compiled and copy == "auto" else copy, device=device)  # type: ignore[arg-type]
    marker = Slot(torch.empty(0), "copied", f"run {label}")
    failed: list[BaseException] = []  # errors of the comparison, not of the model

    def hand_on(t: torch.Tensor) -> torch.Tensor:
        return protect(t, marker) if like_a.guards(t) else t

    def leave(name: str) -> Any:
        def post(module: nn.Module, a: tuple[Any, ...], out: Any) -> Any:
            if running:
                running.pop()
            done.append(name)
            if on_output is None:
                return None
            try:
                with _isolated(device_type):
                    on_output(name, tree_map(plain, out))  # now, before an in-place op rewrites it
            except BaseException as e:
                failed.append(e)
                raise
            new = tree_map(hand_on, out)
            return None if new is out else new
        return post

    wanted = {id(m) for _, m in targets}  # one predicate: O(modules), not O(modules x selectors)
    rec = capture(model, lambda n, m: id(m) in wanted, copy=copy, device=device) if on_output is None else None
    grad_mode = torch.no_grad() if no_grad else contextlib.nullcontext()
    try:
        with rec if rec is not None else contextlib.nullcontext():
            for name, module in targets:
                group.add(module.register_forward_pre_hook(eager(enter(name))))
                group.add(module.register_forward_hook(eager(leave(name))))
            if on_output is not None and like_a.copy != "always":
                group.add(model.register_forward_hook(_hand_back_plain))
            # the same RNG stream for both runs (dropout masks match), the caller's put back after
            reseeded = kept_rng(rng_devices, seed=seed) if seed is not None else contextlib.nullcontext()
            with reseeded, grad_mode, setting.apply(inner, device_type):
                try:
                    model(*args, **kw)
                except Exception as e:
                    if any(e is f for f in failed):
                        raise  # the comparison's own error, as it was raised
                    raise HookscopeError(_failure(label, running, e)) from e
            if rec is not None:
                _unshare_buffers(rec, inner)
    finally:
        failed.clear()  # an exception holds frames, and they hold tensors
        release([marker])
        group.remove()
        for m, flag in flags:
            m.training = flag
        with torch.no_grad():
            for b, value, version in saved:  # only what changed (BatchNorm's kernel updates its
                if b.shape == value.shape and (  # running statistics without a version bump)
                        version is None or _version(b) != version or not torch.equal(b, value)):
                    b.copy_(value)
    return _Run(rec, done)


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


def _stats(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, scratch: Scratch | None = None) -> torch.Tensor:
    """``[max|a-b|, max|b|, |a|, |b|, |a-b|, elements within tolerance]`` in float64 on ``a``'s device.

    No host synchronisation, except on the CPU where there is nothing to wait for: there an equal
    pair (the usual case before the first divergence) is recognised in one early-exit pass.
    """
    x, y = a.detach(), b.detach().to(a.device)
    n = x.numel()
    if x.device.type == "cpu" and not (x.is_complex() or y.is_complex()):
        if x.dtype == y.dtype and torch.equal(x, y):
            return torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, float(n)], dtype=torch.float64)
        found = _host_stats(x, y, rtol, atol, scratch or Scratch())
        if found is not None:
            return torch.tensor(found, dtype=torch.float64)
    return _device_stats(x, y, rtol, atol)


def _device_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """:func:`_stats` anywhere, for any values (NaN, infinities, complex), with no synchronisation."""
    n = x.numel()
    pairs = x.is_complex() or y.is_complex()  # compared as (real, imaginary) pairs
    if pairs:
        x, y = torch.view_as_real(x.to(torch.complex128)), torch.view_as_real(y.to(torch.complex128))
    work = _work_dtype(x, y)
    if n == 0:
        return torch.zeros(6, dtype=torch.float64, device=x.device)
    x, y = x.to(work).reshape(n, -1), y.to(work).reshape(n, -1)
    gap = torch.sub(x, y).abs_().masked_fill_(x == y, 0)  # equal infinities agree; NaN never does
    limit = y.abs()
    max_b = limit.max()
    # a finite limit, so that an infinity in B alone is beyond tolerance, as in torch.isclose
    limit.mul_(rtol).add_(atol).clamp_(max=torch.finfo(work).max)
    norms = [torch.linalg.vector_norm(t) for t in (x, y, gap)]
    ok = gap <= limit
    parts = [gap.max(), max_b, *norms, (ok.all(dim=1) if pairs else ok).sum()]
    return torch.stack([p.to(torch.float64) for p in parts])


def _host_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float, scratch: Scratch) -> list[float] | None:
    """:func:`_stats` of two CPU tensors that differ, in ~6 memory passes; None where a value is
    not finite (the general path handles NaN and infinities) or the tensors are empty."""
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
    max_abs, max_b = max(-lo, hi), max(-y_lo, y_hi)
    norms = [math.sqrt(torch.dot(v, v).item()) for v in (xs, ys, gap)]
    if max_abs <= atol:  # nothing can be beyond the tolerance
        within = n
    else:  # beyond where |a - b| > atol + rtol |b|, as torch.isclose has it
        limit = torch.abs(ys, out=scratch.get(2 * n, work)[n:])
        torch.add(torch.tensor(atol, dtype=work), limit, alpha=rtol, out=limit)  # atol + rtol |b|
        beyond = torch.gt(gap.abs_(), limit, out=scratch.get(n, torch.bool))
        within = n - int(torch.count_nonzero(beyond).item())
    return [max_abs, max_b, *norms, float(within)]


def _finish(row: DiffRow, s: list[float]) -> DiffRow:
    max_abs, max_b, na, nb, nd, within = s
    if max_abs == 0:
        rel, cos = 0.0, 1.0
    elif math.isnan(max_abs):
        rel = cos = math.nan
    else:
        rel = max_abs / max_b if max_b > 0 and math.isfinite(max_abs) else math.inf
        if na > 0 and nb > 0:
            # 1 - cos = (|a-b|^2 - (|a|-|b|)^2) / (2|a||b|): accurate near 1 with float32 sums
            cos = 1.0 - (nd - (na - nb)) * (nd + (na - nb)) / (2.0 * na * nb)
            cos = max(-1.0, min(1.0, cos)) if not math.isnan(cos) else cos
        else:
            cos = 1.0 if na == nb else 0.0
    mismatched = row.numel - int(within)
    status = _DIFFERS if mismatched > 0 or math.isnan(max_abs) else _OK
    return DiffRow(**{**asdict(row), "max_abs": max_abs, "max_rel": rel, "cosine": cos,
                      "mismatched": mismatched, "status": status})


def _describe(t: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(t.shape), str(t.dtype).replace("torch.", "")


def _pair(name: str, call: int, out_a: Any, out_b: Any, rtol: float, atol: float,
          pending: list[tuple[DiffRow, torch.Tensor | None]], scratch: Scratch | None = None) -> None:
    ta, tb = list(tensors(out_a)), list(tensors(out_b))
    if not ta and not tb:
        return  # nothing to compare (an output of None, strings, ...)
    if len(ta) != len(tb):
        pending.append((DiffRow(name, call, 0, _STRUCTURE, numel=len(ta)), None))
        return
    for part, (a, b) in enumerate(zip(ta, tb)):
        (sa, da), (sb, db) = _describe(a), _describe(b)
        row = DiffRow(name, call, part, _OK, sa, sb, da, db, numel=a.numel())
        if sa != sb:
            pending.append((DiffRow(**{**asdict(row), "status": _SHAPE}), None))
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
                numel = sum(t.numel() for t in tensors(self._returned(name)[k].output))
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


def _first_device(model: nn.Module, inputs: Any) -> torch.device:
    t = next(tensors(inputs), None)
    if t is None:
        t = next(iter(model.parameters()), None)
    return t.device if t is not None else torch.device("cpu")


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
    with the same call of the other run, and every tensor of a nested output (tuple, dict,
    dataclass...) on its own. Names that only one model has are listed in ``Diff.unmatched``.

    Both runs get their own copy of the inputs, run under ``torch.no_grad()`` (unless
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
            reference); defaults: ``torch.testing``'s float32 tolerances.
        seed: the seed both runs start from; ``None`` leaves the RNG alone.
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
    for side, m in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(m, nn.Module):
            raise HookscopeError(
                f"{side} is a {type(m).__name__}, not an nn.Module; call diff(model_a, model_b, *inputs), "
                "or diff(model, model, *inputs, b=hookscope.settings(...)) for one model under two settings"
            )
    if not inputs and not kwargs:
        raise HookscopeError("diff needs the inputs both runs share: diff(model_a, model_b, x)")
    if not (rtol >= 0 and atol >= 0):
        raise HookscopeError(f"rtol={rtol} and atol={atol} must both be >= 0")
    set_a, set_b = _as_settings(a, "a"), _as_settings(b, "b")
    targets_a, targets_b, unmatched = _names(model_a, model_b, layers)
    check_hookable(targets_a)
    check_hookable(targets_b)
    kwargs = dict(kwargs or {})
    dev = _first_device(unwrap(model_a)[0], inputs)
    rngs = rng_devices([*model_a.parameters(), *model_b.parameters(), *tensors((inputs, kwargs))])
    common = dict(kwargs=kwargs, device_type=dev.type, seed=seed, rng_devices=rngs,
                  no_grad=no_grad, copy=copy, device=device)
    run_a = _record(model_a, targets_a, inputs, setting=set_a, label="A", **common)  # type: ignore[arg-type]
    assert run_a.rec is not None
    streamed = _Streamed(run_a.rec, rtol, atol)
    run_b = _record(model_b, targets_b, inputs, setting=set_b, label="B", on_output=streamed, **common)  # type: ignore[arg-type]
    rows = streamed.rows(run_a.done, run_b.done)

    def describe(m: nn.Module, s: Settings) -> str:
        inner = unwrap(m)[0]
        wrapped = " (compiled)" if type(m).__name__ == "OptimizedModule" else ""
        extra = s.describe()
        return f"{type(inner).__name__}{wrapped}" + (f", {extra}" if extra else ", as given")

    return Diff(rows, unmatched, rtol=rtol, atol=atol,
                run_a=describe(model_a, set_a), run_b=describe(model_b, set_b))
