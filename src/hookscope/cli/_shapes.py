"""The example input ``--input`` describes: its shape, refused in one line when it cannot fit in this
machine's memory, and a seeded random tensor of it (the model's usual shape when none is given)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import torch

from ..core.text import first_line, shape_text
from ..errors import HookscopeError
from ..loading import check_seed, usual_shape

__all__ = ["check_fits", "example_input", "parse_shape", "random_input"]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` (or ``1,3,224,224``) -> ``(1, 3, 224, 224)``."""
    parts = re.split(r"[x,\s]+", text.strip().lower())
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise HookscopeError(f"--input {text!r} is not a shape; write it like 1x3x224x224")
    return tuple(int(p) for p in parts)


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_fits(dims: Sequence[int], what: str, *, fix: str = "give a smaller shape",
               dtype: torch.dtype = torch.float32) -> None:
    """Refuse, in one line, a tensor of shape ``dims`` and ``dtype`` (float32 unless said) that cannot fit
    in this machine's memory.

    Example:
        >>> check_fits((1, 3, 64, 64), "--input 1x3x64x64")
        >>> check_fits((2**40, 2**40), "--size 2**40 squared", fix="give a smaller --size")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --size 2**40 squared is 1,208,925,819,614,629,174,706,176 values (...)...; give a smaller --size
        >>> check_fits((2**20, 2**20), "--input 1048576x1048576", dtype=torch.long)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --input 1048576x1048576 is 1,099,511,627,776 values (8.8 TB of int64), ...
    """
    numel = math.prod(dims)
    nbytes = dtype.itemsize * numel
    memory = _memory_bytes()
    if numel >= 2**63 or (memory is not None and nbytes > memory):
        room = f"more than this machine's {_size(memory)} of memory" if memory else "too large"
        kind = str(dtype).removeprefix("torch.")
        raise HookscopeError(f"{what} is {numel:,} values ({_size(nbytes)} of {kind}), {room}; {fix}")


def random_input(dims: Sequence[int], what: str, generator: torch.Generator | None = None, *,
                 fix: str = "give a smaller shape") -> torch.Tensor:
    """``torch.randn(*dims)``, refused in one line if it cannot fit in this machine's memory."""
    check_fits(dims, what, fix=fix)
    try:
        return torch.randn(*dims, generator=generator)
    except (RuntimeError, MemoryError) as e:
        numel = math.prod(dims)
        raise HookscopeError(f"{what} ({numel:,} values, {_size(4 * numel)} of float32) cannot be "
                             f"created: {first_line(e) or type(e).__name__}; {fix}") from e


def example_input(spec: str, shape: str | None, seed: int = 0) -> torch.Tensor:
    """A seeded random input of ``shape`` (or the model's usual one)."""
    dims = parse_shape(shape) if shape is not None else usual_shape(spec)
    if dims is None:
        raise HookscopeError(f"give the example input's shape for {spec!r}, e.g. --input 1x3x224x224")
    gen = torch.Generator().manual_seed(check_seed(seed))
    return random_input(dims, f"--input {shape_text(dims)}", gen)
