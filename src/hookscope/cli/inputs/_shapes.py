"""The example input ``--input`` describes: its shape, refused in one line when it cannot fit in this
machine's memory, and a seeded random tensor of it (the model's usual shape when none is given), by
:func:`hookscope.example_input` speaking the command line's options."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...loading import example_input as _library_example_input
from ...loading.inputs import check_fits as _library_check_fits
from ...loading.inputs import parse_shape as _library_parse_shape
from ...loading.inputs import random_input as _library_random_input
from .._load import cli_words

__all__ = ["check_fits", "example_input", "parse_shape", "random_input"]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` (or ``1,3,224,224``) -> ``(1, 3, 224, 224)``.

    Example:
        >>> parse_shape("1x3")
        (1, 3)
    """
    with cli_words():
        return _library_parse_shape(text)


def check_fits(dims: Sequence[int], what: str, *, fix: str = "give a smaller shape",
               dtype: torch.dtype = torch.float32) -> None:
    """Refuse, in one line, a tensor of shape ``dims`` that cannot fit in this machine's memory
    (:func:`hookscope.loading.inputs.check_fits`).

    Example:
        >>> check_fits((1, 3, 64, 64), "--input 1x3x64x64")
    """
    _library_check_fits(dims, what, fix=fix, dtype=dtype)


def random_input(dims: Sequence[int], what: str, generator: torch.Generator | None = None, *,
                 fix: str = "give a smaller shape") -> torch.Tensor:
    """``torch.randn(*dims)``, refused in one line if it cannot fit in this machine's memory.

    Example:
        >>> random_input((1, 2), "--input 1x2").shape
        torch.Size([1, 2])
    """
    return _library_random_input(dims, what, generator, fix=fix)


def example_input(spec: str, shape: str | None, seed: int = 0) -> torch.Tensor:
    """A seeded random input of ``--input shape`` (or the model's usual one).

    Example:
        >>> example_input("demo", None).shape
        torch.Size([1, 3, 64, 64])
    """
    with cli_words():
        return _library_example_input(spec, shape, seed=seed)
