"""Everything an extract is asked to do, checked before any sample is read: layers and their reductions,
the data, the device, batch and shard sizes."""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...core.text import dtype_text
from ...errors import HookscopeError
from ...selection import exact_ops, Selector, aliases_of, check_hookable, layers, unwrap
from ._reduce import Reducer, Reduction, reducers_for
from ._source import Source, source_of

__all__ = ["Plan", "array_specs", "plan", "range_limits", "samples_per_shard", "shard_bytes", "stored_dtype"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def shard_bytes(size: int | str) -> int:
    """``shard_size=`` in bytes: an int, or text such as ``"256MB"``, ``"1GiB"``.

    Example:
        >>> shard_bytes("256MB"), shard_bytes("1KiB"), shard_bytes(100)
        (256000000, 1024, 100)
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise HookscopeError(f"shard_size={size!r} is not a size; give bytes (an int) or text such as '256MB'")
    if isinstance(size, int):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
        if not m or m.group(2).lower() not in _UNITS:
            raise HookscopeError(f"shard_size={size!r} is not a size; write e.g. '256MB', '64MiB', '1GB' or bytes")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 1:
        raise HookscopeError(f"shard_size={size!r} is not positive; give e.g. '256MB'")
    return n


def stored_dtype(found: torch.dtype, cast: torch.dtype | None) -> torch.dtype:
    """The dtype a layer is stored in: ``cast`` for floating-point values, else their own.

    Example:
        >>> stored_dtype(torch.float32, torch.float16), stored_dtype(torch.int64, torch.float16)
        (torch.float16, torch.int64)
    """
    return cast if cast is not None and found.is_floating_point else found


def range_limits(found: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                 cast: torch.dtype | None) -> dict[str, tuple[float, torch.dtype]]:
    """For each layer stored in a dtype of a smaller range than its own: the magnitude from which a value
    rounds to inf (or NaN) in it (the largest finite value plus half a unit in the last place), and that dtype.

    Example:
        >>> range_limits({"a": ((4,), torch.float32), "b": ((4,), torch.int64)}, torch.float16)
        {'a': (65520.0, torch.float16)}
        >>> range_limits({"a": ((4,), torch.float32)}, torch.bfloat16)["a"][0] > torch.finfo(torch.bfloat16).max
        True
    """
    limits = {}
    for name, (_, dtype) in found.items():
        kept = stored_dtype(dtype, cast)
        if kept != dtype and dtype.is_floating_point and torch.finfo(kept).max < torch.finfo(dtype).max:
            info = torch.finfo(kept)
            _, exponent = math.frexp(info.max)
            limits[name] = (info.max + 2.0 ** (exponent - 1) * info.eps / 2, kept)
    return limits


@dataclass
class Plan:
    """A checked extract request.

    Example:
        >>> p = plan(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.zeros(3, 2), ("0",), out="s")
        >>> p.names, p.batch_size
        (['0'], 32)
    """

    model: nn.Module
    selected: list[tuple[str, nn.Module]]
    reducers: dict[str, Reducer]
    keep: str
    dtype: torch.dtype | None
    batch_size: int
    shard_bytes: int
    device: torch.device
    workers: int
    on_error: str
    out: Path
    source: Source
    describe: dict[str, Any]

    @property
    def names(self) -> list[str]:
        """The selected layers, in model order."""
        return [n for n, _ in self.selected]


def _selection(model: nn.Module, selectors: Sequence[Any]) -> tuple[list[Selector], dict[str, Reduction]]:
    flat: list[Selector] = []
    chosen: dict[str, Reduction] = {}
    for sel in selectors:
        if isinstance(sel, Mapping):
            for key, how in sel.items():
                for name, _ in layers(model, key):
                    if name in chosen and chosen[name] is not how and chosen[name] != how:
                        raise HookscopeError(f"{name!r} is given two reductions ({chosen[name]!r} and {how!r}); a layer "
                                             "is stored once: give it one reduction")
                    chosen[name] = how
                flat.append(key)
        else:
            flat.append(sel)
    if not flat:
        raise HookscopeError("extract needs layers: name them, e.g. extract(model, data, layers=['layer2', 'layer4'], "
                             "out=...) or extract(model, data, layers={'layer4': 'mean'}, out=...)")
    return flat, chosen


def _device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    own = next((p.device for p in model.parameters()), None) or next((b.device for b in model.buffers()), None)
    if device is None:
        return own or torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise HookscopeError(f"device={device!r} is not a device; use 'cpu', 'cuda' or 'cuda:0'") from None
    if dev.type == "meta":
        raise HookscopeError("device='meta' holds no values to store; give 'cpu' or 'cuda'")
    if own is not None and own.type != dev.type:
        raise HookscopeError(f"the model is on {own} but device={device!r}; move it first with model.to({str(dev)!r})")
    return dev


def _checked(batch_size: int | None, workers: int, on_error: str, keep: str, dtype: Any) -> int:
    if keep not in ("output", "input"):
        raise HookscopeError(f"keep={keep!r}: extract stores each layer's 'output' or its 'input'; pick one")
    if on_error not in ("stop", "skip"):
        raise HookscopeError(f"on_error={on_error!r}; use 'stop' (the first unreadable sample stops the run) or 'skip'")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise HookscopeError(f"dtype={dtype!r} is not a floating-point torch dtype; use torch.float16 or torch.bfloat16")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise HookscopeError(f"workers={workers!r}; give 0 (read in this process) or more loader processes")
    size = 32 if batch_size is None else batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise HookscopeError(f"batch_size={batch_size!r}; give a positive int")
    return size


def plan(model: nn.Module, data: Any, selectors: Sequence[Any], *, out: str | os.PathLike[str], keep: str = "output",
         reduce: Reduction = None, dtype: torch.dtype | None = None, batch_size: int | None = None,
         shard_size: int | str = "256MB", device: str | torch.device | None = None, workers: int = 0,
         on_error: str = "stop", ids: Sequence[str] | None = None,
         describe: Mapping[str, Any] | None = None) -> Plan:
    """Check an extract request and resolve it (no sample is read)."""
    size = _checked(batch_size, workers, on_error, keep, dtype)
    inner, _ = unwrap(model)
    flat, chosen = _selection(inner, selectors)
    selected = exact_ops(layers(inner, *flat), "extract")
    check_hookable(selected)
    if any(n == "" for n, _ in selected):
        raise HookscopeError("the model itself (name '') has no layer name to store it under; select its last "
                             "layer, or wrap the model in a module (nn.Sequential(model)) and select '0'")
    shared = aliases_of(inner, selected)
    if shared:
        other, name = next(iter(shared.items()))
        raise HookscopeError(f"{name!r} is also registered as {other!r} (a shared module), so it may run more than "
                             "once per forward and has no single value per sample; select a module used once, or "
                             "use hookscope.capture")
    source = source_of(data, ids)
    if batch_size is None and source.batch_size:
        size = source.batch_size
    if any(m.training for m in inner.modules()):
        warnings.warn("the model is in train mode: dropout and batch statistics make stored values depend on the "
                      "batch and the run; call model.eval() first", stacklevel=4)
    return Plan(inner, selected, reducers_for([n for n, _ in selected], chosen, reduce), keep, dtype, size,
                shard_bytes(shard_size), _device(inner, device), workers, on_error, Path(out), source,
                dict(describe or {}))


def samples_per_shard(found: Mapping[str, tuple[tuple[int, ...], torch.dtype]], cast: torch.dtype | None,
                      size: int) -> int:
    """How many samples fit in ``size`` bytes (at least one).

    Example:
        >>> samples_per_shard({"a": ((4,), torch.float32)}, None, 100)
        4
    """
    per = 8 + sum(math.prod(s) * stored_dtype(d, cast).itemsize for s, d in found.values())
    return max(1, size // per)


def array_specs(found: Mapping[str, tuple[tuple[int, ...], torch.dtype]], cast: torch.dtype | None,
                reducers: Mapping[str, Reducer], keep: str) -> list[dict[str, Any]]:
    """The manifest's ``arrays`` entries, in selection order.

    Example:
        >>> from hookscope.analysis.extract._reduce import reducer
        >>> array_specs({"a": ((4,), torch.float32)}, torch.float16, {"a": reducer("mean")}, "output")
        [{'name': 'a', 'shape': [4], 'dtype': 'float16', 'field': 'output', 'reduction': 'mean'}]
    """
    return [{"name": n, "shape": list(s), "dtype": dtype_text(stored_dtype(d, cast)), "field": keep,
             "reduction": reducers[n].text, **({"code_sha256": reducers[n].code} if reducers[n].code else {})}
            for n, (s, d) in found.items()]
