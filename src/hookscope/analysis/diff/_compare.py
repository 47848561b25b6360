"""Comparing run B's outputs with run A's records: outputs paired leaf by leaf, tensors reduced to
a few statistics on their device, and every row finished with one transfer per device."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from ..._memory import Scratch, TensorMemo, flat
from ..._tree import attributes
from ...core.guard import plain
from ...core.text import dtype_text
from ...errors import MutationError, RecordError
from ...records import CallRecord, Recording
from ._result import DIFFERS, MISSING_A, MISSING_B, OK, SHAPE, STRUCTURE, DiffRow
from ._tolerance import ATOL, RTOL, SENTINEL, Policy, Tol

__all__ = ["RTOL", "ATOL", "Streamed"]


_NSTATS = 11  # the length of what _stats returns
_NUMBERS = (bool, int, float, complex)
Pending = list[tuple[DiffRow, "torch.Tensor | None"]]  # rows, and their statistics still on a device
Pick = Callable[[torch.dtype, torch.dtype], Tol]  # the tolerance of a pair of tensors of these dtypes


# --- the statistics of one pair of tensors ----------------------------------------------------------
def _work_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    if a.device.type == "mps":
        return torch.float32  # MPS has no float64
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64  # float64 inputs, and integers (exact up to 2**53)
    return torch.float32  # float16 / bfloat16 / float32 are exact in float32


def _stats(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, scratch: Scratch | None = None,
           *, spread: float = 0.0) -> torch.Tensor:
    """``[max|a-b|, max|b|, |a|, |b|, |a-b|, elements within tolerance, NaN in both, same Inf in
    both, NaN in A only, NaN in B only, scale]`` in float64 on ``a``'s device (see :class:`DiffRow`).
    Within tolerance: ``|a - b| <= atol + rtol * |b| + spread * scale``; ``scale`` (see
    :func:`_scale`) is taken only where ``spread`` is not 0, else NaN.

    No host synchronisation, except on the CPU where there is nothing to wait for: there an equal
    pair (the usual case before the first divergence) is recognised in one early-exit pass, and
    finite floating-point pairs take a fast path; the rest (NaN, infinities, float32 overflow,
    integers, complex) is computed in float64.

    Example:
        >>> _stats(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), 0.0, 0.0)[:2].tolist()
        [0.5, 2.5]
    """
    x, y = a.detach(), b.detach().to(a.device)
    n = x.numel()
    if x.device.type == "cpu":
        if x.dtype == y.dtype and torch.equal(x, y):
            return torch.tensor([0.0] * 5 + [float(n)] + [0.0] * 4 + [math.nan], dtype=torch.float64)
        if x.is_floating_point() and y.is_floating_point():
            found = _host_stats(x, y, rtol, atol, scratch or Scratch(), spread=spread)
            if found is not None:
                return torch.tensor(found, dtype=torch.float64)
        return _device_stats(x, y, rtol, atol, work=torch.float64, spread=spread)
    return _device_stats(x, y, rtol, atol, spread=spread)


_SAMPLE = 4096  # elements the median of a large output is taken over (a fixed pseudo-random sample)


def _median(absb: torch.Tensor) -> torch.Tensor:
    """The median of the non-zero magnitudes ``absb`` (0-d; NaN when none is non-zero), over a
    fixed pseudo-random sample of :data:`_SAMPLE` of them when there are more (no stride that a
    periodic mask could line up with), so that it costs next to nothing on a large output.

    Example:
        >>> _median(torch.tensor([0.0, 1.0, 3.0, 2.0])).item(), _median(torch.zeros(3)).isnan().item()
        (2.0, True)
    """
    flat = absb.reshape(-1)
    if flat.numel() > _SAMPLE:
        g = torch.Generator(device=flat.device).manual_seed(0)
        flat = flat[torch.randint(flat.numel(), (_SAMPLE,), generator=g, device=flat.device)]
    return torch.nanmedian(torch.where(flat > 0, flat, torch.nan))


def _scale(absb: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The robust root mean square of ``|b|`` (0-d, float64, no synchronisation): over the finite
    elements (and ``valid`` ones), leaving out those above ``SENTINEL`` times the median of the
    non-zero ones (masked values such as ``-1e9``); 0 when nothing is left.

    Example:
        >>> _scale(torch.tensor([3.0, 4.0, 0.0, 1e9, float("inf")])).item()
        2.886751345948129
    """
    ok = torch.isfinite(absb) if valid is None else valid & torch.isfinite(absb)
    med = _median(torch.where(ok, absb, 0))  # NaN when none is non-zero
    keep = ok & (absb <= torch.nan_to_num(med * SENTINEL, nan=math.inf))
    acc = torch.float32 if absb.device.type == "mps" else torch.float64
    norm = torch.linalg.vector_norm(torch.where(keep, absb, 0), dtype=acc)
    scale: torch.Tensor = norm / keep.sum().clamp(min=1).to(acc).sqrt()
    return scale


def _device_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float,
                  work: torch.dtype | None = None, *, spread: float = 0.0) -> torch.Tensor:
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
    scale = _scale(limit, ~skip) if spread else torch.tensor(math.nan, dtype=torch.float64, device=x.device)
    # a finite limit, so that an infinity in B alone is beyond tolerance, as in torch.isclose
    limit.mul_(rtol).add_(atol)
    if spread:  # against the tensor's scale too: rounding makes an element near 0 as wrong as its terms
        limit.add_((spread * scale).to(work))
    limit.clamp_(max=torch.finfo(work).max)
    acc = torch.float32 if x.device.type == "mps" else torch.float64  # sums of squares overflow float32
    norms = [torch.linalg.vector_norm(t, dtype=acc) for t in (x, y, gap)]
    ok = ((gap <= limit) | agree) & ~nan_one
    nan_row = nan_both.any(dim=1)
    counts = [ok.all(dim=1), nan_row, agree.any(dim=1) & ~nan_row, nan_one.any(dim=1) & nan_x.any(dim=1),
              nan_one.any(dim=1) & nan_y.any(dim=1)]
    parts = [gap.max(), max_b, *norms, *(c.sum() for c in counts), scale]
    return torch.stack([p.to(torch.float64) for p in parts])


def _host_stats(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float, scratch: Scratch,
                *, spread: float = 0.0) -> list[float] | None:
    """:func:`_stats` of two CPU tensors that differ, in ~6 memory passes (more with ``spread``);
    None where a value is not finite (the general path handles NaN, infinities and overflow) or
    the tensors are empty."""
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
    scale = _host_scale(ys, max_b, norms[1]) if spread else math.nan
    floor = atol + (spread * scale if spread else 0.0)  # the part of the bound every element has
    if max_abs <= floor:  # nothing can be beyond the tolerance
        within = n
    else:  # beyond where |a - b| > atol + rtol |b| (+ spread * scale), as torch.isclose has it
        limit = torch.abs(ys, out=scratch.get(2 * n, work)[n:])
        torch.add(torch.tensor(floor, dtype=work), limit, alpha=rtol, out=limit)
        beyond = torch.gt(gap.abs_(), limit, out=scratch.get(n, torch.bool))
        within = n - int(torch.count_nonzero(beyond).item())
    return [max_abs, max_b, *norms, float(within), 0.0, 0.0, 0.0, 0.0, scale]


def _host_scale(ys: torch.Tensor, max_b: float, norm_b: float) -> float:
    """:func:`_scale` of finite CPU values whose largest magnitude and norm are known: the plain
    root mean square, already at hand, unless some value is large enough to be a masked one."""
    med = _median(ys.abs()).item()
    if math.isnan(med) or max_b <= SENTINEL * med:
        return norm_b / math.sqrt(ys.numel())
    return float(_scale(ys.abs()).item())


def _int_stats(a: int, b: int, rtol: float, atol: float) -> torch.Tensor:
    """:func:`_stats` of two Python ints, exactly (they may exceed int64 and float64's 2**53)."""
    gap, big = abs(a - b), float("inf")
    try:
        within = gap <= atol + rtol * abs(b)
        sizes = [float(gap), float(abs(b)), float(abs(a)), float(abs(b)), float(gap)]
    except OverflowError:  # beyond float64's range
        within, sizes = gap == 0, [big if abs(v) > 2**1000 else float(abs(v)) for v in (gap, b, a, b, gap)]
    return torch.tensor([*sizes, float(within), 0.0, 0.0, 0.0, 0.0, math.nan], dtype=torch.float64)


def _finish(row: DiffRow, s: list[float]) -> DiffRow:
    """``row`` with the numbers of its statistics ``s`` (from :func:`_stats`, on the host)."""
    max_abs, max_b, na, nb, nd, within, nan, inf, nan_a, nan_b, scale = s
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
    status = DIFFERS if mismatched > 0 else OK
    return dataclasses.replace(row, max_abs=max_abs, max_rel=rel, cosine=cos, mismatched=mismatched,
                               status=status, nan=int(nan), inf=int(inf), nan_a_only=int(nan_a),
                               nan_b_only=int(nan_b), scale=scale)


def _gather(pending: Pending) -> list[DiffRow]:
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


# --- pairing two outputs ------------------------------------------------------------------------------
def _leaves(obj: Any, path: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    """Every tensor, Python number and ``None`` in ``obj`` with its path, depth first.

    Example:
        >>> [p for p, _ in _leaves({"y": torch.ones(1), "aux": (None, 2)})]
        ["['y']", "['aux'][0]", "['aux'][1]"]
    """
    if isinstance(obj, torch.Tensor) and obj.is_nested:  # compared component by component
        return [leaf for i, t in enumerate(obj.unbind()) for leaf in _leaves(t, f"{path}[{i}]")]
    if obj is None or isinstance(obj, (torch.Tensor, *_NUMBERS)):
        return [(path, obj)]
    if isinstance(obj, (list, tuple, collections.deque)):
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, f"{path}[{i}]", depth)]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{path}[{k!r}]", depth)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj)
                for leaf in _leaves(getattr(obj, f.name), f"{path}.{f.name}", depth)]
    attrs = attributes(obj, depth)  # plain objects, as capture records them
    if attrs is not None:
        return [leaf for k, v in attrs.items() for leaf in _leaves(v, f"{path}.{k}", depth + 1)]
    return []  # strings and other objects are not compared


def _value(v: Any) -> tuple[torch.Tensor, str]:
    """A leaf as a strided tensor, and its dtype as reported (a Python number's type name)."""
    if isinstance(v, torch.Tensor):
        kind = dtype_text(v.dtype)
        v = v.dequantize() if v.is_quantized else v  # compared by the values they stand for
        return (v.to_dense() if v.layout != torch.strided else v), kind  # sparse: as dense
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        return torch.tensor(float(v), dtype=torch.float64), "int"
    dtype = {float: torch.float64, complex: torch.complex128}.get(type(v))
    return torch.tensor(v, dtype=dtype), type(v).__name__


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


class _Compared:
    """The statistics of pairs already compared: a pair of the same elements at the same versions
    (a ``Sequential``'s output is its last child's, in both runs) is compared once.

    Example:
        >>> a, b, tol = torch.ones(3), torch.zeros(3), Tol(0.0, 0.0)
        >>> seen = _Compared()
        >>> seen.stats(a, b, tol) is seen.stats(a.view(3), b, tol)
        True
    """

    def __init__(self) -> None:
        self._by_b: TensorMemo[TensorMemo[dict[Tol, torch.Tensor]]] = TensorMemo()

    def stats(self, a: torch.Tensor, b: torch.Tensor, tol: Tol, scratch: Scratch | None = None) -> torch.Tensor:
        """:func:`_stats` of ``a`` and ``b`` with ``tol``, taken once per pair of tensor versions."""
        a, b = plain(a), plain(b)
        by_a = self._by_b.get(b)
        if by_a is None:
            by_a = TensorMemo()
            self._by_b.put(b, by_a)
        done = by_a.get(a)
        if done is None:
            done = {}
            by_a.put(a, done)
        if tol not in done:
            done[tol] = _stats(a, b, tol.rtol, tol.atol, scratch, spread=tol.spread)
        return done[tol]


def _pair(name: str, call: int, out_a: Any, out_b: Any, pick: Pick, pending: Pending,
          scratch: Scratch | None = None, compared: _Compared | None = None) -> None:
    """The rows of one call, their statistics still pending: tensor by tensor, paired by path, each
    pair compared with the tolerance ``pick`` gives for its two dtypes (once per pair of tensor
    versions, given ``compared``)."""
    compared = compared or _Compared()
    la, lb = dict(_leaves(out_a)), dict(_leaves(out_b))
    values_a = [p for p, v in la.items() if v is not None]
    if not values_a and not any(v is not None for v in lb.values()):
        return  # nothing to compare (an output of None, strings, ...)
    if la.keys() != lb.keys() or any((la[p] is None) != (lb[p] is None) for p in la):
        numel = _numel(out_a)
        pending.append((DiffRow(name, call, 0, STRUCTURE, numel=numel, note=_structure(la, lb)), None))
        return
    for part, p in enumerate(values_a):  # paired by path: a dict's key order does not matter
        (a, da), (b, db) = _value(la[p]), _value(lb[p])
        tol = pick(a.dtype, b.dtype)
        row = DiffRow(name, call, part, OK, tuple(a.shape), tuple(b.shape), da, db, numel=a.numel(), path=p,
                      rtol=tol.rtol, atol=tol.atol, spread=tol.spread, tolerance=tol.precision)
        if row.shape_a != row.shape_b:
            pending.append((dataclasses.replace(row, status=SHAPE), None))
        elif da == db == "int":
            pending.append((row, _int_stats(la[p], lb[p], tol.rtol, tol.atol)))
        else:
            pending.append((row, compared.stats(a, b, tol, scratch)))


def _returned(call: CallRecord) -> bool:
    """Whether a call of run A returned (a model may catch a submodule's error and go on)."""
    try:
        call.output
    except RecordError:  # it raised before returning
        return False
    except MutationError:  # it returned; comparing it will say that its values are gone
        return True
    return True


class Streamed:
    """Compares each output of run B with the same call of run A as B produces it.

    Run B keeps nothing: half the memory of recording both runs, and each comparison reads B's
    output while it is still in cache. ``casts_a`` gives, for each call of run A, the low precision
    that run had computed in up to it (``None``: none); B's comes with each output (see
    :class:`~._tolerance.Policy`).

    Example:
        >>> import hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> with hookscope.capture(net) as rec:
        ...     out = net(torch.ones(1, 2))
        >>> compare = Streamed(rec, Policy(None, None, {}))
        >>> compare("0", out + 1)
        >>> [(r.name, r.status, r.max_abs) for r in compare.rows(["0"], ["0"])]
        [('0', 'differs', 1.0)]
    """

    def __init__(self, rec_a: Recording, policy: Policy,
                 casts_a: dict[tuple[str, int], torch.dtype | None] | None = None) -> None:
        self.rec_a, self.policy, self.casts_a = rec_a, policy, casts_a or {}
        self.calls: dict[str, int] = {}
        self.returned: dict[str, list[CallRecord]] = {}  # run A's calls of a name that returned
        self.scratch = Scratch()
        self.compared = _Compared()
        self.pending: dict[tuple[str, int], Pending] = {}

    def __call__(self, name: str, out_b: Any, cast_b: torch.dtype | None = None) -> None:
        k = self.calls.get(name, 0)
        self.calls[name] = k + 1
        calls_a = self._returned(name)
        if k < len(calls_a):
            rows: Pending = []

            def pick(da: torch.dtype, db: torch.dtype) -> Tol:
                return self.policy(name, da, db, cast_a, cast_b)

            cast_a = self.casts_a.get((name, k))  # run A's k-th call of name that returned

            _pair(name, k, calls_a[k].output, out_b, pick, rows, self.scratch, self.compared)
            self.pending[(name, k)] = rows

    def _returned(self, name: str) -> list[CallRecord]:
        if name not in self.returned:
            calls = self.rec_a[name].calls if name in self.rec_a else []
            self.returned[name] = [c for c in calls if _returned(c)]
        return self.returned[name]

    def rows(self, done_a: list[str], done_b: list[str]) -> list[DiffRow]:
        """Rows in run A's order of calls, then the calls only run B made."""
        pending: Pending = []
        seen: dict[str, int] = {}
        for name in done_a:
            k = seen.get(name, 0)
            seen[name] = k + 1
            compared = self.pending.get((name, k))
            if compared is None:
                numel = _numel(self._returned(name)[k].output)
                pending.append((DiffRow(name, k, 0, MISSING_B, numel=numel), None))
            else:
                pending.extend(compared)
        extra: dict[str, int] = {}
        for name in done_b:
            k = extra.get(name, 0)
            extra[name] = k + 1
            if k >= seen.get(name, 0):
                pending.append((DiffRow(name, k, 0, MISSING_A), None))
        return _gather(pending)
