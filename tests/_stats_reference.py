"""The statistics of a tensor exactly as hookscope computed them before issue 13 (git ce7bc91,
``src/hookscope/analysis/_reduce.py``), frozen here as the reference the engine is held to, and an
independent reference trace that reduces every tensor afresh (no memo) with plain hooks of its own.

Only ``t.detach()`` replaces ``hookscope.core.guard.plain`` (the tests pass no guarded tensors), and
``flat``/``Scratch`` (then in ``hookscope._memory``) are inlined, so that nothing here moves when the
engine does.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["RefRow", "ReferenceTrace", "STATS", "reference_grads", "reference_rows", "reference_stats",
           "selected", "tensor_paths"]

STATS = ("mean", "std", "min", "max", "absmax", "zeros", "nan", "inf")
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_BITS = {4: torch.int32, 8: torch.int64}
_INF_BITS = {4: 0x7F800000, 8: 0x7FF0000000000000}
_CANCEL_RATIO = 3.0
_PIECE = 1 << 21

RefRow = tuple[str, int, str, str, tuple[int, ...], list[float]]
"""``(module, call, which, path, shape, stats)``: one row of the reference trace."""


class _Scratch:
    def __init__(self) -> None:
        self._buf: dict[torch.dtype, torch.Tensor] = {}

    def get(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buf.get(dtype)
        if buf is None or buf.numel() < n:
            buf = self._buf[dtype] = torch.empty(n, dtype=dtype)
        return buf[:n]


def _flat(x: torch.Tensor) -> torch.Tensor:
    if x.is_contiguous():
        return x.view(-1)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(-1)
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return x.permute(0, 2, 3, 4, 1).reshape(-1)
    return x.reshape(-1)


def reference_stats(t: torch.Tensor) -> list[float]:
    """The 8 statistics (mean, std, min, max, absmax, zeros, nan, inf) of ``t`` as the engine at
    git HEAD (ce7bc91) gave them: ``tensor_stats(t).tolist()``."""
    with torch.no_grad():
        x = t.detach().resolve_neg()
        if x.is_complex():
            x = x.abs()
        if not x.is_floating_point() or x.dtype in _LOW_PRECISION or x.element_size() == 1:
            x = x.float()
        if x.device.type == "cpu":
            return [float(v) for v in _host_stats(_flat(x), _Scratch())]
        return [float(v) for v in _device_stats(x).tolist()]


def _host_stats(v: torch.Tensor, scratch: _Scratch) -> list[float]:
    n = v.numel()
    if n == 0:
        return [math.nan] * 5 + [0.0, 0.0, 0.0]
    lo, hi, total, squares, zeros = math.inf, -math.inf, 0.0, 0.0, 0
    for start in range(0, n, _PIECE):
        part = _piece_stats(v[start:start + _PIECE])
        if part is None:
            return _non_finite(v)
        lo, hi = min(lo, part[0]), max(hi, part[1])
        total, squares, zeros = total + part[2], squares + part[3], zeros + part[4]
    if lo == hi:
        return [lo, 0.0, lo, hi, max(-lo, hi), zeros, 0, 0]
    mean = total / n
    var = squares / n - mean * mean
    if not (math.isfinite(var) and var > 0 and mean * mean <= _CANCEL_RATIO * var):
        wide = scratch.get(n, torch.float64).copy_(v)
        mean = wide.sum().item() / n
        wide.sub_(mean)
        var = torch.dot(wide, wide).item() / n
    return [mean, math.sqrt(var), lo, hi, max(-lo, hi), zeros, 0, 0]


def _piece_stats(v: torch.Tensor) -> tuple[float, float, float, float, int] | None:
    ends = _extremes(v)
    if ends is None:
        return None
    lo, hi, neg_zero = ends
    total = v.sum().item()
    if not math.isfinite(total):
        total = v.sum(dtype=torch.float64).item()
    n = v.numel()
    if lo > 0 or hi < 0:
        zeros = 0
    elif neg_zero:
        zeros = n - int(torch.count_nonzero(v).item())
    else:
        zeros = n - int(torch.count_nonzero(v.view(_BITS[v.element_size()])).item())
    return lo, hi, total, torch.dot(v, v).item(), zeros


def _extremes(v: torch.Tensor) -> tuple[float, float, bool] | None:
    size = v.element_size()
    kind, inf_bits = _BITS[size], _INF_BITS[size]
    low, high = torch.aminmax(v.view(kind))
    imin, imax = int(low.item()), int(high.item())
    smallest = torch.iinfo(kind).min
    if imin >= 0:
        return None if imax >= inf_bits else (_float(imin, size), _float(imax, size), False)
    if imax < 0:
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
    low, high = torch.aminmax(v)
    nan = int(torch.count_nonzero(torch.isnan(v)).item())
    inf = int(torch.count_nonzero(torch.isinf(v)).item())
    zeros = n - int(torch.count_nonzero(v).item())
    absmax = math.nan if nan else math.inf
    return [v.sum().item() / n, math.nan, low.item(), high.item(), absmax, zeros, nan, inf]


def _device_stats(x: torch.Tensor) -> torch.Tensor:
    acc = torch.float32 if x.device.type == "mps" else torch.float64
    n = x.numel()
    if n == 0:
        return torch.cat([x.new_full((5,), math.nan, dtype=acc), x.new_zeros((3,), dtype=acc)])
    low, high = torch.aminmax(x)
    mean = x.sum() / n
    centred = (x - mean).reshape(-1)
    std = (torch.dot(centred, centred) / n).sqrt()
    zeros = n - torch.count_nonzero(x)
    nan, inf = torch.count_nonzero(x != x), torch.count_nonzero(torch.isinf(x))
    absmax = torch.maximum(low.abs(), high.abs())
    floats = torch.stack([mean, std, low, high, absmax]).to(acc)
    return torch.cat([floats, torch.stack([zeros, nan, inf]).to(acc)])


# --- the reference trace -------------------------------------------------------------------------


def tensor_paths(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (tensors, tuples, lists, dicts) with hookscope's path spelling."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        for field, v in zip(type(obj)._fields, obj):
            yield from tensor_paths(v, f"{prefix}.{field}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensor_paths(v, f"{prefix}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensor_paths(v, f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier()
                                    else f"{prefix}[{k!r}]")


def selected(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules ``hookscope.trace(model)`` hooks: every module but the root (itself if it has no
    children), each once, under its first name."""
    children = [(n, m) for n, m in model.named_modules() if n]
    return children or [("", model)]


def reference_rows(model: nn.Module, x: Any, keep: str = "io") -> list[RefRow]:
    """Run ``model(x)`` under a :class:`ReferenceTrace` and return its rows."""
    with ReferenceTrace(model, keep=keep) as ref:
        model(x)
    return ref.rows


class ReferenceTrace:
    """A reference trace: ``with ReferenceTrace(model, keep="io") as ref: model(x)``, then ``ref.rows``
    (:data:`RefRow`, forward, in event order) and, with ``grads=True``, ``ref.grads``: a dict
    ``(module, call, which, path) -> stats`` of every ``grad_output`` (gradient arriving at an output)
    and ``grad_input`` (gradient flowing back through this call into an input: taken on an alias of
    the input, as hookscope does; none for an input the call rewrote in place).

    Plain ``register_forward_pre_hook``/``register_forward_hook`` (``with_kwargs=True``) on every
    module trace selects; every tensor is reduced by :func:`reference_stats` the moment the hook
    sees it, with no memo.
    """

    def __init__(self, model: nn.Module, keep: str = "io", grads: bool = False) -> None:
        assert keep in ("io", "output"), keep
        self.model, self.inputs, self.want_grads = model, keep == "io", grads
        self.rows: list[RefRow] = []
        self.grads: dict[tuple[str, int, str, str], list[float]] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> ReferenceTrace:
        for name, module in selected(self.model):
            pre, post = self._hooks(name)
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _grad_hook(self, key: tuple[str, int, str, str]) -> Any:
        def hook(g: torch.Tensor) -> None:
            assert key not in self.grads, f"two gradients for {key}"
            self.grads[key] = reference_stats(g)

        return hook

    def _hooks(self, name: str) -> tuple[Any, Any]:
        calls: list[int] = []
        stack: list[tuple[int, list[tuple[str, torch.Tensor, int]]]] = []

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            call = len(calls)
            calls.append(call)
            found = [(f"input[{i}]{p}", t) for i, a in enumerate(args) for p, t in tensor_paths(a, "")]
            found += [(f"input.{k}{p}", t) for k, v in kwargs.items() for p, t in tensor_paths(v, "")]
            if self.inputs:
                for path, t in found:
                    self.rows.append((name, call, "input", path, tuple(t.shape), reference_stats(t)))
            aliases: list[tuple[str, torch.Tensor, int]] = []
            stack.append((call, aliases))
            if not (self.want_grads and torch.is_grad_enabled() and found):
                return None
            names = iter([p for p, _ in found])

            def alias(obj: Any) -> Any:
                if isinstance(obj, torch.Tensor):
                    path = next(names)
                    if not obj.requires_grad:
                        return obj
                    a = obj.view_as(obj)
                    aliases.append((path, a, a._version))
                    return a
                if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
                    return type(obj)(*[alias(v) for v in obj])
                if isinstance(obj, (list, tuple)):
                    return type(obj)(alias(v) for v in obj)
                if isinstance(obj, dict):
                    return {k: alias(v) for k, v in obj.items()}
                return obj

            new_args = tuple(alias(a) for a in args)  # positional only, as hookscope aliases them
            return new_args, kwargs

        def post(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            call, aliases = stack.pop()
            if output is None:
                return
            for path, t in tensor_paths(output, "output"):
                self.rows.append((name, call, "output", path, tuple(t.shape), reference_stats(t)))
                if self.want_grads and torch.is_grad_enabled() and t.requires_grad:
                    t.register_hook(self._grad_hook((name, call, "grad_output", path)))
            for path, a, version in aliases:
                if a._version == version:
                    a.register_hook(self._grad_hook((name, call, "grad_input", path)))

        return pre, post


def reference_grads(model: nn.Module) -> dict[tuple[str, str], list[float]]:
    """``(owner module, parameter name) -> reference_stats(p.grad)`` for every trainable parameter
    with a gradient, each parameter under its first owner's name."""
    found: dict[tuple[str, str], list[float]] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and p.grad is not None and id(p) not in seen:
                seen.add(id(p))
                found[(name, pname)] = reference_stats(p.grad)
    return found
