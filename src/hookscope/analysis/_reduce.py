"""One tensor reduced to its statistics (:data:`STATS`), as cheaply as the device allows.

On accelerators every statistic is reduced on the device with no host synchronisation. On the
CPU the host *is* the device, so reading a scalar waits for nothing. There, one pass of a small C
kernel (:mod:`hookscope._native`) gives sum, sum of squares, min, max and the zero count of a
dense float32/float64 tensor at once, reading the memory where it lies; other tensors (strided
slices, half precision, integers) are copied piece by piece into one reused buffer of at most
:data:`_PIECE` elements first, so no allocation of the tensor's size is made. A one-pass variance
is used unless it would cancel (then an exact centred pass); NaN and Inf are counted only when the
sums are not finite. Without the kernel, torch operations do the same in four or five passes
(:func:`_host_stats`), which branch to skip passes: each float32 pass over a 25.7 MB tensor costs
0.5-1 ms here; an allocation of that size costs ~15 ms of page faults.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator

import numpy as np
import torch

from .._memory import Scratch, dense_view, flat, is_dense
from .._native import Kernel, stats_kernel
from ..core.guard import plain

__all__ = ["HOST_TYPES", "STATS", "Scratch", "flat", "on_host", "relu_told", "stats_and_relu", "tensor_stats"]

HOST_TYPES = frozenset({"cpu"})
"""Device types whose tensors are reduced on the host, branching on scalars read back at once; every
other device takes the path that never synchronises (:func:`_device_stats`)."""

STATS = ("mean", "std", "min", "max", "absmax", "zeros", "nan", "inf")
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_BITS = {4: torch.int32, 8: torch.int64}
_INF_BITS = {4: 0x7F800000, 8: 0x7FF0000000000000}  # +inf; larger bits with the sign clear are NaN
# The one-pass variance E[x^2] - mean^2 loses ~(1 + mean^2/var) times the sums' rounding error;
# beyond this ratio the exact centred pass is taken instead.
_CANCEL_RATIO = 3.0
_PIECE = 1 << 21  # elements reduced together while in cache (8 MB of float32)


def tensor_stats(t: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """The :data:`STATS` of ``t`` as one 8-element tensor on ``t``'s device; no host synchronisation.

    Mean, std (population, ``correction=0``), min, max and max |x| are taken over every value as
    torch gives them, so one NaN makes them NaN: the ``nan`` and ``inf`` counts say how many there
    are. ``zeros`` is a count too (``-0.0`` included). Integer and bool tensors are cast to float32,
    half precision is reduced in float32, complex tensors by magnitude. The result is float64
    (float32 on MPS).

    Example:
        >>> tensor_stats(torch.tensor([0.0, 2.0, float("nan")])).tolist()[5:]
        [1.0, 1.0, 0.0]
    """
    x = plain(t).detach().resolve_neg()  # a lazily negated tensor cannot be viewed as its bits
    if x.is_complex():
        x = x.abs()
    if x.device.type == "cpu" and "cpu" in HOST_TYPES:
        kernel = stats_kernel()
        if kernel is not None and x.numel() > 0:
            return _host_tensor(_kernel_stats(x, kernel, scratch or Scratch()))
    if x.device.type in HOST_TYPES:
        scratch = scratch or Scratch()
        return _host_tensor(_host_stats(_dense_copy(x, scratch), scratch))
    return _device_stats(x.float() if _needs_cast(x) else x)


def _dense_copy(x: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """``x`` as a 1-D contiguous float32/float64 tensor: its own memory if it is dense, else a copy
    in a reused buffer (BLAS sums a strided vector serially, in float32: 4.5e-4 off)."""
    dense = dense_view(x)
    if dense is not None and not _needs_cast(x):
        return dense
    return scratch.get(x.numel(), torch.float32 if _needs_cast(x) else x.dtype).view(x.shape).copy_(x).view(-1)


def _host_tensor(values: list[float]) -> torch.Tensor:
    """The numbers as a float64 CPU tensor (through numpy: a third of ``torch.tensor``'s cost)."""
    return torch.from_numpy(np.array(values, dtype=np.float64))


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t`` is reduced on the host, where reading a scalar waits for nothing (see
    :data:`HOST_TYPES`).

    Example:
        >>> on_host(torch.zeros(1))
        True
    """
    return t.device.type == "cpu" and "cpu" in HOST_TYPES


def _needs_cast(x: torch.Tensor) -> bool:
    """Integers, bool, half precision and 8-bit floats are reduced as float32."""
    return not x.is_floating_point() or x.dtype in _LOW_PRECISION or x.element_size() == 1


def _pieces(x: torch.Tensor, scratch: Scratch) -> Iterator[torch.Tensor]:
    """``x``'s elements as 1-D contiguous float32/float64 tensors: the memory itself for a dense
    float32/float64 tensor, else consecutive blocks of at most :data:`_PIECE` elements copied (and
    cast) into one reused buffer."""
    dense = dense_view(x)
    if dense is not None and not _needs_cast(x):
        yield dense
        return
    work = torch.float32 if _needs_cast(x) else x.dtype
    for block in _blocks(dense if dense is not None else x):
        buf = scratch.get(block.numel(), work)
        buf.view(block.shape).copy_(block)
        yield buf


def _blocks(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """Views that cover ``x`` in order, each of at most :data:`_PIECE` elements (or one row of the
    innermost dimension, if that alone is longer)."""
    if x.numel() <= _PIECE or x.dim() == 0:
        yield x
        return
    if x.dim() == 1:
        for start in range(0, x.numel(), _PIECE):
            yield x[start:start + _PIECE]
        return
    step = max(1, _PIECE // max(1, x[0].numel()))
    for start in range(0, x.shape[0], step):
        part = x[start:start + step]
        if part.numel() <= _PIECE:
            yield part
        else:
            yield from _blocks(part[0])


def _kernel_stats(x: torch.Tensor, kernel: Kernel, scratch: Scratch) -> list[float]:
    """:data:`STATS` of a non-empty CPU tensor, from the kernel's one pass over each piece."""
    n = x.numel()
    total, squares, lo, hi, zeros = 0.0, 0.0, math.inf, -math.inf, 0
    for piece in _pieces(x, scratch):
        s, q, low, high, z = kernel.stats(piece)
        total, squares, lo, hi, zeros = total + s, squares + q, min(lo, low), max(hi, high), zeros + z
    if not (math.isfinite(total) and math.isfinite(squares)):  # NaN, Inf, or a sum that overflowed
        return _host_stats(_dense_copy(x, scratch), scratch)
    return _from_sums(n, total, squares, lo, hi, zeros) or _centred(x, kernel, scratch, total / n, lo, hi, zeros)


def _from_sums(n: int, total: float, squares: float, lo: float, hi: float, zeros: int) -> list[float] | None:
    """:data:`STATS` of ``n`` finite values from their sums, extremes and zero count; ``None`` if
    the one-pass variance would cancel (then an exact centred pass is needed)."""
    if lo == hi:  # constant: exact, and no rounding noise from the sums
        return [lo, 0.0, lo, hi, max(-lo, hi), zeros, 0, 0]
    mean = total / n
    var = squares / n - mean * mean
    if not (var > 0 and mean * mean <= _CANCEL_RATIO * var):
        return None
    return [mean, math.sqrt(var), lo, hi, max(-lo, hi), zeros, 0, 0]


def _centred(x: torch.Tensor, kernel: Kernel, scratch: Scratch, mean: float, lo: float, hi: float,
             zeros: int) -> list[float]:
    """:data:`STATS` from an exact pass centred on the one-pass ``mean``."""
    n = x.numel()
    shift, centred = 0.0, 0.0
    for piece in _pieces(x, scratch):
        d, q = kernel.centred(piece, mean)
        shift, centred = shift + d, centred + q
    mean, var = mean + shift / n, max(centred / n - (shift / n) ** 2, 0.0)
    return [mean, math.sqrt(var), lo, hi, max(-lo, hi), zeros, 0, 0]


def stats_and_relu(t: torch.Tensor, scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`tensor_stats` of ``t``, and the statistics ``t.relu()`` will have, exactly as
    :func:`tensor_stats` would give them, from the same pass over ``t``'s memory (``None`` where
    that pass cannot tell them exactly: then ReLU's output is read after all).

    Told only for a dense float32/float64 CPU tensor reduced by the kernel, with finite values, no
    zeros where it has negative values (ReLU keeps -0.0 and makes +0.0 of a negative value: which
    one a minimum finds depends on their order), and a variance of ReLU's output that needs no
    centred pass.

    Example:
        >>> stats, after = stats_and_relu(torch.tensor([-1.0, 2.0, 3.0]))
        >>> torch.equal(after, tensor_stats(torch.tensor([0.0, 2.0, 3.0])))
        True
    """
    x = plain(t).detach()
    kernel = stats_kernel() if relu_told(x) else None
    dense = dense_view(x)
    if kernel is None or dense is None:
        return tensor_stats(x, scratch), None
    (s, q, lo, hi, zeros), (ps, pq, negative) = kernel.stats_relu(dense)
    if not (math.isfinite(s) and math.isfinite(q)):  # non-finite: the usual path, from the start
        return tensor_stats(x, scratch), None
    n = x.numel()
    stats = _from_sums(n, s, q, lo, hi, zeros) or _centred(dense, kernel, scratch or Scratch(), s / n, lo, hi, zeros)
    if negative == 0:  # ReLU changes nothing
        result = _host_tensor(stats)
        return result, result
    after = _from_sums(n, ps, pq, 0.0, max(hi, 0.0), negative) if zeros == 0 else None
    return _host_tensor(stats), None if after is None else _host_tensor(after)


def relu_told(t: torch.Tensor) -> bool:
    """Whether :func:`stats_and_relu` reads ``t`` with the kernel, in one pass that can tell ReLU's
    statistics: a non-empty dense float32/float64 CPU tensor, the kernel built.

    Example:
        >>> relu_told(torch.ones(2, 3).t()), relu_told(torch.ones(2, 3)[:, :2]), relu_told(torch.ones(2).half())
        (True, False, False)
    """
    return (t.dtype in (torch.float32, torch.float64) and on_host(t) and t.numel() > 0 and not t.is_neg()
            and is_dense(t) and stats_kernel() is not None)


def _host_stats(v: torch.Tensor, scratch: Scratch) -> list[float]:
    n = v.numel()
    if n == 0:
        return [math.nan] * 5 + [0.0, 0.0, 0.0]
    lo, hi, total, squares, zeros = math.inf, -math.inf, 0.0, 0.0, 0
    # Every pass over one piece while it is still in cache: ~15% faster than pass after pass
    # over a tensor larger than the cache.
    for start in range(0, n, _PIECE):
        part = _piece_stats(v[start:start + _PIECE])
        if part is None:
            return _non_finite(v)
        lo, hi = min(lo, part[0]), max(hi, part[1])
        total, squares, zeros = total + part[2], squares + part[3], zeros + part[4]
    if lo == hi:  # constant: exact, and no rounding noise from the sums
        return [lo, 0.0, lo, hi, max(-lo, hi), zeros, 0, 0]
    mean = total / n
    var = squares / n - mean * mean
    if not (math.isfinite(var) and var > 0 and mean * mean <= _CANCEL_RATIO * var):
        wide = scratch.get(n, torch.float64).copy_(v)  # two passes in float64: exact, no overflow
        mean = wide.sum().item() / n
        wide.sub_(mean)
        var = torch.dot(wide, wide).item() / n
    return [mean, math.sqrt(var), lo, hi, max(-lo, hi), zeros, 0, 0]


def _piece_stats(v: torch.Tensor) -> tuple[float, float, float, float, int] | None:
    """(min, max, sum, sum of squares, zeros) of a finite piece, None if it is not finite."""
    ends = _extremes(v)
    if ends is None:
        return None
    lo, hi, neg_zero = ends
    total = v.sum().item()
    if not math.isfinite(total):  # finite values whose float32 sum overflows
        total = v.sum(dtype=torch.float64).item()
    n = v.numel()
    if lo > 0 or hi < 0:
        zeros = 0
    elif neg_zero:  # the bit count below would miss -0.0; the float count branches but is exact
        zeros = n - int(torch.count_nonzero(v).item())
    else:  # count_nonzero on floats branches per element: 16 ms on a half-zero ReLU output, 1 on bits
        zeros = n - int(torch.count_nonzero(v.view(_BITS[v.element_size()])).item())
    return lo, hi, total, torch.dot(v, v).item(), zeros


def _extremes(v: torch.Tensor) -> tuple[float, float, bool] | None:
    """(min, max, whether -0.0 occurs) of ``v``, mostly from its bits; None if not all finite.

    Read as integers, floats whose sign bit is clear sort as their values do, and -0.0 (the sign
    bit alone) is the smallest integer. So one integer min/max pass gives min and max of a tensor
    without negative values (ReLU outputs: no float min/max pass, no -0.0 pass), the largest value
    of a mixed one (a float min pass adds the smallest), and always whether -0.0 is present.
    """
    size = v.element_size()
    kind, inf_bits = _BITS[size], _INF_BITS[size]
    low, high = torch.aminmax(v.view(kind))
    imin, imax = int(low.item()), int(high.item())
    smallest = torch.iinfo(kind).min
    if imin >= 0:  # no sign bit set: the values sort as their bits
        return None if imax >= inf_bits else (_float(imin, size), _float(imax, size), False)
    if imax < 0:  # every sign bit set: the largest magnitude has the largest bits
        if imax >= smallest + inf_bits:
            return None
        return _float(imax, size), _float(imin, size), imin == smallest
    if imax >= inf_bits:
        return None
    lo = v.amin().item()
    return (lo, _float(imax, size), imin == smallest) if math.isfinite(lo) else None


def _float(bits: int, size: int) -> float:
    as_int, as_float = ("=i", "=f") if size == 4 else ("=q", "=d")
    return float(struct.unpack(as_float, struct.pack(as_int, bits))[0])


def _non_finite(v: torch.Tensor) -> list[float]:
    n = v.numel()
    low, high = torch.aminmax(v)  # NaN propagates into both, Inf shows in one
    nan = int(torch.count_nonzero(torch.isnan(v)).item())
    inf = int(torch.count_nonzero(torch.isinf(v)).item())
    zeros = n - int(torch.count_nonzero(v).item())
    absmax = math.nan if nan else math.inf
    return [v.sum().item() / n, math.nan, low.item(), high.item(), absmax, zeros, nan, inf]


def _device_stats(x: torch.Tensor) -> torch.Tensor:
    """:data:`STATS` on ``x``'s device with no host synchronisation, piece by piece (views of at
    most :data:`_PIECE` elements): the temporaries (a cast, the centred values, NaN/Inf masks) are
    one piece in size, never the tensor's. Sums and squares are taken in float64 (float32 on MPS),
    so float32 values near its range neither overflow nor underflow; the variance is two-pass
    (centred on the mean, still on the device)."""
    acc = torch.float32 if x.device.type == "mps" else torch.float64
    n = x.numel()
    if n == 0:
        return torch.cat([x.new_full((5,), math.nan, dtype=acc), x.new_zeros((3,), dtype=acc)])
    pieces = [p.float() if _needs_cast(p) else p for p in _blocks(x)]
    ends = torch.stack([torch.stack(torch.aminmax(p)).to(acc) for p in pieces])
    low, high = ends[:, 0].min(), ends[:, 1].max()  # NaN propagates
    total = torch.stack([p.sum(dtype=acc) for p in pieces]).sum()
    mean = total / n
    squares = torch.stack([_centred_squares(p, mean, acc) for p in pieces]).sum()
    counts = torch.stack([torch.stack([torch.count_nonzero(p), torch.count_nonzero(torch.isnan(p)),
                                       torch.count_nonzero(torch.isinf(p))]) for p in pieces]).sum(0)
    zeros, nan, inf = n - counts[0], counts[1], counts[2]
    std = (squares / n).sqrt()
    absmax = torch.maximum(low.abs(), high.abs())
    floats = torch.stack([mean, std, low, high, absmax])
    return torch.cat([floats, torch.stack([zeros, nan, inf]).to(acc)])


def _centred_squares(p: torch.Tensor, mean: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    d = p.to(acc).reshape(-1) - mean
    return torch.dot(d, d)
