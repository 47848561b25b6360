"""What :func:`parameter_randomisation` returns: :class:`Randomisation`, one :class:`RandomisationRow`
per randomised layer. Must not import any analysis.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...core.result import Result, jsonable, missing
from ...core.text import dtype_text, num, table

__all__ = ["Randomisation", "RandomisationRow"]


@dataclass(frozen=True)
class RandomisationRow:
    """One randomised layer of a :class:`Randomisation` (a row of ``res.rows``), means over the samples.

    Attributes:
        step: 1 for the first layer randomised (the top one), 2 for the next ...
        layer: the layer's qualified name (with cascading randomisation, it and every layer above it
            are random).
        spearman: the rank correlation of the maps with the original ones (1: unchanged), over the
            samples whose maps are not constant (NaN when none is left).
        spearman_abs: the same of their absolute values.
        ssim: the SSIM of the maps as pictures, ``None`` for maps that are not pictures.
    """

    step: int
    layer: str
    spearman: float
    spearman_abs: float
    ssim: float | None


def _mean(t: torch.Tensor) -> float:
    """The mean over the samples where the similarity is defined (a constant map has no ranks)."""
    t = t.double()
    return float(t.nanmean()) if bool((~t.isnan()).any()) else math.nan


@dataclass
class Randomisation(Result):
    """What :func:`parameter_randomisation` returns: how alike the maps stay as layers are randomised.

    Speaks hookscope's result protocol: ``rows`` (one :class:`RandomisationRow` per randomised layer),
    ``table()`` (also ``str(res)``), ``to_dict()``, ``to_json()`` (the maps written as their shape
    and dtype unless ``maps=True``), ``res["layer3.1"]`` (that layer's row; a name it does not hold
    raises :class:`~hookscope.RecordError` naming the closest ones).

    Attributes:
        mode: ``"cascading"`` (layers randomised one after another from the top, each step keeping
            the layers above it random) or ``"independent"`` (one layer at a time, the rest trained).
        layers: the layers in the order they were randomised, top first.
        spearman: ``L x B`` rank correlations with the original maps.
        spearman_abs: ``L x B`` rank correlations of the absolute values.
        ssim: ``L x B`` SSIMs, or ``None`` where the maps are not pictures.
        original: the maps of the trained model, as ``explain`` gave them.
        maps: ``L x ...`` the maps after each step.
        skipped: modules with parameters but no ``reset_parameters()``, left as trained.
        notes: what the numbers cannot say by themselves.
    """

    mode: str
    layers: tuple[str, ...]
    spearman: torch.Tensor
    spearman_abs: torch.Tensor
    ssim: torch.Tensor | None
    original: torch.Tensor
    maps: torch.Tensor
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def rows(self) -> list[RandomisationRow]:
        """One row per randomised layer, top first."""
        return [RandomisationRow(i + 1, name, _mean(self.spearman[i]), _mean(self.spearman_abs[i]),
                                 None if self.ssim is None else _mean(self.ssim[i]))
                for i, name in enumerate(self.layers)]

    def __getitem__(self, name: str) -> RandomisationRow:
        for row in self.rows:
            if row.layer == name:
                return row
        raise missing(name, "layer", self.layers)

    def __contains__(self, name: object) -> bool:
        return name in self.layers

    def table(self) -> str:
        """The layers as text, top first (also ``str(res)``).

        Example:
            >>> from torch import nn
            >>> from hookscope.metrics import parameter_randomisation
            >>> net = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
            >>> grad = lambda m, x: torch.func.vmap(torch.func.grad(lambda v: m(v).sum()))(x)
            >>> print(parameter_randomisation(net, torch.rand(8, 3), grad))  # doctest: +ELLIPSIS
            cascading randomisation of 2 layers, 8 samples: rank correlation of the maps with the ...
            step  layer  spearman  |spearman|  ssim
            ...
        """
        b = self.original.shape[0]
        body = [[str(r.step), r.layer, num(r.spearman), num(r.spearman_abs), "-" if r.ssim is None else num(r.ssim)]
                for r in self.rows]
        title = (f"{self.mode} randomisation of {len(self.layers)} layer{'s' if len(self.layers) != 1 else ''}, "
                 f"{b} sample{'s' if b != 1 else ''}: rank correlation of the maps with the original ones (near 1: "
                 "the explanation ignores those weights)")
        lines = [title, *table(["step", "layer", "spearman", "|spearman|", "ssim"], body)]
        if self.skipped:
            lines.append(f"left as trained (no reset_parameters()): {', '.join(self.skipped)}")
        return "\n".join([*lines, *(f"note: {n}" for n in self.notes)])

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, tensors as they are, and the rows."""
        return {"mode": self.mode, "layers": list(self.layers), "spearman": self.spearman,
                "spearman_abs": self.spearman_abs, "ssim": self.ssim, "original": self.original, "maps": self.maps,
                "skipped": list(self.skipped), "notes": list(self.notes), "rows": self.rows}

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON; ``original`` and ``maps`` as their shape and dtype unless ``maps=True``."""
        data = self.to_dict()
        if not maps:
            for key in ("original", "maps"):
                data[key] = {"shape": list(data[key].shape), "dtype": dtype_text(data[key].dtype)}
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)
