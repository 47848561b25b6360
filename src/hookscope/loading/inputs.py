"""An example input for a model: its shape (given, or the one the model is known by), refused in one
line when it cannot fit in this machine's memory, and a seeded random tensor of it.

The shape a model is known by: the bundled models' and torchvision's usual input, timm's
``pretrained_cfg`` ``input_size`` for ``timm:NAME``. Must not import: ``cli``, ``viz``, ``report`` or
any analysis.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Sequence

import torch

from ..core.text import first_line, shape_text
from ..errors import LoadError, checked
from .model import check_seed
from .preprocessing import timm_pretrained_cfg
from .spec import TIMM_PREFIX, usual_shape
from .voice import terms

__all__ = ["check_fits", "example_input", "model_shape", "parse_shape", "random_input"]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` (or ``1,3,224,224``) -> ``(1, 3, 224, 224)``.

    Example:
        >>> parse_shape("1x3x8x8")
        (1, 3, 8, 8)
    """
    parts = re.split(r"[x,\s]+", text.strip().lower())
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise LoadError(f"{_flag()} {text!r} is not a shape; write it like {_like()}")
    return tuple(int(p) for p in parts)


def _flag() -> str:
    return "--input" if terms().cli else "shape="


def _like() -> str:
    return "1x3x224x224" if terms().cli else "(1, 3, 224, 224)"


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
        hookscope.errors.LoadError: --size 2**40 squared is 1,208,925,819,614,629,174,706,176 values (...)...; give a smaller --size
        >>> check_fits((2**20, 2**20), "--input 1048576x1048576", dtype=torch.long)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: --input 1048576x1048576 is 1,099,511,627,776 values (8.8 TB of int64), ...
    """
    numel = math.prod(dims)
    nbytes = dtype.itemsize * numel
    memory = _memory_bytes()
    if numel >= 2**63 or (memory is not None and nbytes > memory):
        room = f"more than this machine's {_size(memory)} of memory" if memory else "too large"
        kind = str(dtype).removeprefix("torch.")
        raise LoadError(f"{what} is {numel:,} values ({_size(nbytes)} of {kind}), {room}; {fix}")


def random_input(dims: Sequence[int], what: str, generator: torch.Generator | None = None, *,
                 fix: str = "give a smaller shape") -> torch.Tensor:
    """``torch.randn(*dims)``, refused in one line if it cannot fit in this machine's memory.

    Example:
        >>> random_input((2, 3), "an input").shape
        torch.Size([2, 3])
    """
    check_fits(dims, what, fix=fix)
    try:
        return torch.randn(*dims, generator=generator)
    except (RuntimeError, MemoryError) as e:
        numel = math.prod(dims)
        raise LoadError(f"{what} ({numel:,} values, {_size(4 * numel)} of float32) cannot be "
                        f"created: {first_line(e) or type(e).__name__}; {fix}") from e


def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    """A sequence of positive whole numbers (Python's, NumPy's, 0-d tensors) as a shape; one line otherwise."""
    try:
        dims = tuple(operator.index(d) for d in shape if not isinstance(d, bool))
    except TypeError:
        dims = ()
    if not dims or len(dims) != len(shape) or not all(d > 0 for d in dims):
        raise LoadError(f"{_flag()} {shape!r} is not a shape; write it like {_like()}")
    return dims


def model_shape(spec: str) -> tuple[int, ...] | None:
    """The shape of one input the model ``spec`` names is known by (batch of 1), or None: the bundled
    models' and torchvision's usual one, timm's ``pretrained_cfg`` ``input_size`` for ``timm:NAME``.

    Example:
        >>> model_shape("demo"), model_shape("net.py:build")
        ((1, 3, 64, 64), None)
    """
    if spec.startswith(TIMM_PREFIX):
        cfg = timm_pretrained_cfg(spec)
        size = cfg.get("input_size") if cfg is not None else None
        if isinstance(size, (tuple, list)) and len(size) == 3:
            return (1, *(int(d) for d in size))
    return usual_shape(spec)


@checked
def example_input(spec: str, shape: str | Sequence[int] | None = None, *, seed: int = 0) -> torch.Tensor:
    """A seeded random (standard normal) input for the model ``spec`` names: of ``shape``, else of the
    shape the model is known by (:func:`model_shape`).

    Args:
        spec: the model, as :func:`~hookscope.load_model` names it.
        shape: the input's shape, such as ``(1, 3, 224, 224)`` or ``"1x3x224x224"``.
        seed: the random generator's seed: the same seed, the same input.

    Example:
        >>> import hookscope
        >>> x = hookscope.example_input("demo")
        >>> x.shape, torch.equal(x, hookscope.example_input("demo"))
        (torch.Size([1, 3, 64, 64]), True)
    """
    if isinstance(shape, str):
        dims: tuple[int, ...] | None = parse_shape(shape)
    elif shape is not None:
        dims = _dims(shape)
    else:
        dims = model_shape(spec)
    if dims is None:
        raise LoadError(f"give the example input's shape for {spec!r}, e.g. {_flag()}"
                        f"{' ' if terms().cli else ''}{_like()}")
    gen = torch.Generator().manual_seed(check_seed(seed))
    return random_input(dims, f"{'--input' if terms().cli else 'an input of'} {shape_text(dims)}", gen)
