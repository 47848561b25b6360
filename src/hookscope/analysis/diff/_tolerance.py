"""Which tolerance an output is compared with: the float32 one (or the user's ``rtol``/``atol``),
or, where a run computed in bfloat16 or float16, one that follows that dtype's precision.

A run in low precision rounds every operand to a few bits: an element near zero that is the sum of
large products of either sign carries an error of the size of those products, not of itself. So an
element-wise bound ``atol + rtol * |b|`` fails for a run that is as right as its dtype allows (5-15%
of the elements of a small convolutional net under bfloat16 autocast). The low-precision bound is
taken against the tensor's scale instead, ``|a - b| <= atol + rtol * sqrt(depth) * max|b|``, with
``rtol`` and ``atol`` of ``torch.testing.assert_close`` for that dtype
(``torch/testing/_comparison.py``, ``_DTYPE_PRECISIONS``: bfloat16 1.6e-2 and 1e-5, i.e. 2 eps;
float16 1e-3 and 1e-5, i.e. 1 eps) and ``2 * torch.finfo(dtype).eps`` for a dtype it does not
list (float8). Rounding errors add up through the layers; summed with random signs they grow as
the square root of their number (Higham and Mary, "A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 2019), so the bound grows with ``sqrt(depth)``, ``depth`` being how
many leaf modules of the model come up to and including this one in definition order (a module
called several times, as in a loop, counts once: its later calls are judged more strictly than
their true depth).

Must not import: anything that runs a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...selection import named_modules, unwrap

__all__ = ["RTOL", "ATOL", "Tol", "Policy", "LOW_PRECISION", "depths", "narrowest", "low_precision", "low_precision_tolerance"]

RTOL = 1.3e-6
"""Default relative tolerance: ``torch.testing.assert_close``'s for float32."""
ATOL = 1e-5
"""Default absolute tolerance: ``torch.testing.assert_close``'s for float32."""

LOW_PRECISION = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}
"""``torch.testing.assert_close``'s ``(rtol, atol)`` for the dtypes narrower than float32."""
_F32_EPS = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class Tol:
    """One output's tolerance: ``|a - b| <= atol + rtol * |b|`` element by element, or with
    ``scaled``, ``<= atol + rtol * max|b|``; ``precision`` names the low-precision dtype it
    follows (``""`` for the float32 default or the user's own numbers)."""

    rtol: float
    atol: float
    scaled: bool = False
    precision: str = ""


def narrowest(*dtypes: torch.dtype | None) -> torch.dtype | None:
    """The floating dtype with the coarsest precision (largest eps) among ``dtypes``; None if none.

    Example:
        >>> narrowest(torch.float32, None, torch.bfloat16, torch.float16)
        torch.bfloat16
    """
    found = [d for d in dtypes if d is not None and d.is_floating_point]
    return max(found, key=lambda d: torch.finfo(d).eps, default=None)


def low_precision(dtype: torch.dtype | None) -> bool:
    """Whether ``dtype`` is a floating dtype coarser than float32.

    Example:
        >>> low_precision(torch.float16), low_precision(torch.float64), low_precision(torch.int8)
        (True, False, False)
    """
    return dtype is not None and dtype.is_floating_point and torch.finfo(dtype).eps > _F32_EPS


def low_precision_tolerance(dtype: torch.dtype | str) -> tuple[float, float]:
    """``(rtol, atol)`` at depth 1 for a dtype coarser than float32 (or its name).

    Example:
        >>> low_precision_tolerance("bfloat16"), low_precision_tolerance(torch.float8_e4m3fn)
        ((0.016, 1e-05), (0.25, 1e-05))
    """
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return LOW_PRECISION.get(dt, (2 * torch.finfo(dt).eps, ATOL))


def depths(model: nn.Module) -> dict[str, int]:
    """Each module's depth: how many leaf modules come up to and including its last leaf, in
    definition order (the model itself: all of them).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)), nn.Tanh())
        >>> depths(net)
        {'': 4, '0': 1, '1': 3, '1.0': 2, '1.1': 3, '2': 4}
    """
    found: dict[str, int] = {}
    leaves = [n for n, m in named_modules(unwrap(model)[0]) if next(m.children(), None) is None]
    for i, name in enumerate(leaves, start=1):
        parts = name.split(".") if name else []
        for k in range(len(parts) + 1):
            found[".".join(parts[:k])] = i  # a later leaf is deeper: it overwrites
    return found


class Policy:
    """Picks each output's :class:`Tol`: the user's ``rtol``/``atol`` when given, else the float32
    default, or the low-precision bound where a dtype compared or a run's autocast is narrower.

    Example:
        >>> p = Policy(None, None, {"fc": 4})
        >>> p("fc", torch.float32, torch.bfloat16, None, None)
        Tol(rtol=0.032, atol=1e-05, scaled=True, precision='bfloat16')
        >>> Policy(0.1, None, {})("fc", torch.float32, torch.bfloat16, None, None)
        Tol(rtol=0.1, atol=1e-05, scaled=False, precision='')
    """

    def __init__(self, rtol: float | None, atol: float | None, depth: dict[str, int]) -> None:
        self.explicit = rtol is not None or atol is not None
        self.base = Tol(RTOL if rtol is None else rtol, ATOL if atol is None else atol)
        self.depth = depth

    def __call__(self, name: str, dtype_a: torch.dtype, dtype_b: torch.dtype,
                 cast_a: torch.dtype | None, cast_b: torch.dtype | None) -> Tol:
        if self.explicit or not (dtype_a.is_floating_point or dtype_b.is_floating_point):
            return self.base  # integers stay exact; the user's numbers win
        dtype = narrowest(dtype_a, dtype_b, cast_a, cast_b)
        if dtype is None or not low_precision(dtype):
            return self.base
        rtol, atol = low_precision_tolerance(dtype)
        grow = math.sqrt(self.depth.get(name, 1))
        return Tol(rtol * grow, atol, scaled=True, precision=str(dtype).removeprefix("torch."))
