"""The table of channel importance kinds: each a small reduction registered by name.

A kind reads one of three things: the weight rows of the module at the site (``"weight"``), the
site's output on each call (``"activation"``), or the output and the gradient of the loss with
respect to it (``"gradient"``). Data kinds reduce each call to per-channel sums and a count on the
device; the score is ``finish(sums / count)``. Low score = prune first, for every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ....errors import HookscopeError, did_you_mean

__all__ = ["KINDS", "Kind", "accumulator_dtype", "channels_first", "get_kind"]

Reduce = Callable[[torch.Tensor, "torch.Tensor | None"], "tuple[torch.Tensor, int]"]


@dataclass(frozen=True)
class Kind:
    """One importance kind of the table.

    Attributes:
        name: its name in ``importance=``.
        reads: ``"weight"``, ``"activation"`` or ``"gradient"``.
        reduce: for data kinds, ``(a, g) -> (per-channel sums, count)`` of one call, ``a`` (and the
            gradient ``g``, or ``None``) laid out ``B x C x positions``; for weight kinds,
            ``(rows, None) -> (scores, 1)`` with ``rows`` laid out ``C x values``.
        finish: turns the mean (sums / count) into the score.
        about: one line for the docs and the table.

    Example:
        >>> k = get_kind("activation")
        >>> sums, n = k.reduce(torch.tensor([[[1., -3.]]]), None)
        >>> sums.tolist(), n
        ([4.0], 2)
    """

    name: str
    reads: str
    reduce: Reduce
    about: str
    finish: Callable[[torch.Tensor], torch.Tensor] = lambda mean: mean


def _l1(rows: torch.Tensor, _: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    return rows.abs().sum(1), 1


def _l2(rows: torch.Tensor, _: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    return rows.square().sum(1).sqrt(), 1


def _activation(a: torch.Tensor, _: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    # summed in the accumulator dtype without a float64 copy of the whole output
    return a.abs().sum((0, 2), dtype=accumulator_dtype(a.device)), a.shape[0] * a.shape[2]


def _apoz(a: torch.Tensor, _: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    return (a == 0).sum((0, 2), dtype=accumulator_dtype(a.device)), a.shape[0] * a.shape[2]


def _taylor(a: torch.Tensor, g: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    assert g is not None
    # Molchanov et al. 2017: per sample, |mean over positions of a * dL/da|; then averaged over samples
    return (a * g).mean(2, dtype=accumulator_dtype(a.device)).abs().sum(0), a.shape[0]


KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("l1", "weight", _l1, "L1 norm of the site's weight rows (no data)"),
    Kind("l2", "weight", _l2, "L2 norm of the site's weight rows (no data)"),
    Kind("activation", "activation", _activation, "mean |activation| over samples and positions"),
    Kind("apoz", "activation", _apoz, "1 - average percentage of zeros (Hu et al. 2016), after a ReLU",
         finish=lambda mean: 1.0 - mean),
    Kind("taylor", "gradient", _taylor, "first-order Taylor |mean(a * dL/da)| per sample (Molchanov 2017)"),
]}


def get_kind(name: object) -> Kind:
    """The kind called ``name``, or one line naming the known kinds.

    Example:
        >>> get_kind("taylor").reads
        'gradient'
        >>> get_kind("activaton")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: importance='activaton' is not a channel importance. Did you mean 'activation'? Known: l1, l2, activation, apoz, taylor
    """
    if isinstance(name, str) and name in KINDS:
        return KINDS[name]
    hint = did_you_mean(name, KINDS) if isinstance(name, str) else ""
    raise HookscopeError(f"importance={name!r} is not a channel importance.{hint} Known: {', '.join(KINDS)}")


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (sums over many batches keep their digits), else float32.

    Example:
        >>> accumulator_dtype(torch.device("cpu"))
        torch.float64
    """
    return torch.float32 if device.type == "mps" else torch.float64


def channels_first(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as ``B x C x positions``, its channel dim ``dim`` moved to 1; half precision made float32
    (products and sums of float16 overflow), float32 and float64 kept as they are (no copy).

    Example:
        >>> channels_first(torch.zeros(2, 5, 5, 3, dtype=torch.float16), -1).shape
        torch.Size([2, 3, 25])
    """
    moved = t.detach().movedim(dim, 1)
    flat = moved.reshape(moved.shape[0], moved.shape[1], -1)
    return flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
