"""Which tolerance an output is compared with: the float32 one (or the user's ``rtol``/``atol``),
or, where a run computed in bfloat16 or float16, one that follows that dtype's precision.

A run in low precision rounds every operand to a few bits: an element near zero that is the sum of
large products of either sign carries an error of the size of those products, not of itself. So an
element-wise bound ``atol + rtol * |b|`` fails for a run that is as right as its dtype allows (5-15%
of the elements of a small convolutional net under bfloat16 autocast). The low-precision bound adds
a term against the tensor's scale::

    |a - b| <= atol + eps * |b| + spread * scale,   spread = SPREAD * eps * sqrt(depth)

``eps`` is the dtype's machine epsilon (bfloat16 2**-7, float16 2**-10), ``atol`` float32's
``1e-5``. ``scale`` is a robust root mean square of ``b``: over its finite elements, leaving out
those above ``SENTINEL`` times the median of the non-zero magnitudes (a masked logit of ``-1e9``
or ``finfo.min`` must not set the scale; each such element is still held to its own ``eps * |b|``).
Rounding errors add up through the layers; summed with random signs they grow as the square root
of their number (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM
J. Sci. Comput. 2019), so the bound grows with ``sqrt(depth)``, ``depth`` being how many leaf
modules of the model come up to and including this one in definition order (a module called
several times, as in a loop, counts once).

``SPREAD`` is measured, not assumed: under bfloat16 and float16 autocast, over 5-6 seeds, the
largest ``max|a - b| / (eps * sqrt(depth) * scale)`` of any output is 3.1 on TinyResNet, 2.65 on
torchvision's resnet18, 1.4 on 48 pre-norm residual blocks (LayerNorm, Linear, GELU, Linear) and
4.4 on a plain stack of 48 Linear + LayerNorm + GELU blocks. ``SPREAD = 6`` leaves a margin of 1.4
to 4.3 at the worst output: the bound is at most ~4 times the error seen where the error is
largest (the old bound, ``2 eps * sqrt(depth) * max|b|``, was 5 to 30 times it, and a masked
``-1e9`` made it blind). A model that amplifies rounding more (some random plain stacks of that
depth do, up to errors the size of the output) is reported beyond the dtype's tolerance, which is
true of its numerics. What the bound lets pass is stated: ``spread`` is the detection limit, the
size of a change, as a fraction of the output's scale, that cannot be told from rounding there
(34% at resnet18's ``fc``, depth 52, under bfloat16: a 10% change of its weights is not seen).

Must not import: anything that runs a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...selection import named_modules, unwrap

__all__ = ["RTOL", "ATOL", "SPREAD", "SENTINEL", "Tol", "Policy", "depths", "narrowest", "low_precision",
           "low_precision_tolerance", "spread"]

RTOL = 1.3e-6
"""Default relative tolerance: ``torch.testing.assert_close``'s for float32."""
ATOL = 1e-5
"""Default absolute tolerance: ``torch.testing.assert_close``'s for float32."""

SPREAD = 6.0
"""The scale term of the low-precision bound, in units of the dtype's eps, before ``sqrt(depth)``."""
SENTINEL = 1e4
"""Elements more than this many times the median non-zero magnitude are left out of the scale."""
_F32_EPS = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class Tol:
    """One output's tolerance: ``|a - b| <= atol + rtol * |b| + spread * scale`` element by element,
    ``scale`` being the output's robust root mean square (see the module); ``spread`` is 0 for the
    float32 default and the user's own numbers. ``precision`` names the low-precision dtype it
    follows (``""`` if none)."""

    rtol: float
    atol: float
    spread: float = 0.0
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


def low_precision_tolerance(dtype: torch.dtype | str) -> tuple[float, float, float]:
    """``(rtol, atol, spread)`` at depth 1 for a dtype coarser than float32 (or its name): its eps,
    float32's atol, and :data:`SPREAD` eps.

    Example:
        >>> low_precision_tolerance("bfloat16"), low_precision_tolerance(torch.float16)
        ((0.0078125, 1e-05, 0.046875), (0.0009765625, 1e-05, 0.005859375))
    """
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    eps = torch.finfo(dt).eps
    return eps, ATOL, SPREAD * eps


def spread(dtype: torch.dtype | str, depth: int) -> float:
    """The scale term of the bound for ``dtype`` at ``depth``: ``SPREAD * eps * sqrt(depth)``.

    Example:
        >>> spread("bfloat16", 16)
        0.1875
    """
    return low_precision_tolerance(dtype)[2] * math.sqrt(max(depth, 1))


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
        >>> p = Policy(None, None, {"fc": 16})
        >>> p("fc", torch.float32, torch.bfloat16, None, None)
        Tol(rtol=0.0078125, atol=1e-05, spread=0.1875, precision='bfloat16')
        >>> Policy(0.1, None, {})("fc", torch.float32, torch.bfloat16, None, None)
        Tol(rtol=0.1, atol=1e-05, spread=0.0, precision='')
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
        rtol, atol, _ = low_precision_tolerance(dtype)
        return Tol(rtol, atol, spread(dtype, self.depth.get(name, 1)), precision=str(dtype).removeprefix("torch."))
