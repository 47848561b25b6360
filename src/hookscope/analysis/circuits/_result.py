"""The result of a patching sweep, real or estimated: the metric in each cell of a layer x position,
layer x head or layer x kind grid, beside the clean and corrupted runs' metrics.

Must not import another analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.result import Result, missing
from ...core.text import table
from ...errors import HookscopeError

__all__ = ["PatchRow", "Patching"]


@dataclass(frozen=True)
class PatchRow:
    """One cell: its ``layer`` (``blocks.1``) and ``column`` (a position, a head or a component kind), the
    metric ``value`` with that cell patched, and ``normalised``, ``(value - corrupted) / (clean - corrupted)``
    (1: the clean run's metric, 0: the corrupted run's)."""

    layer: str
    column: str
    value: float
    normalised: float


class Patching(Result):
    """A patching sweep: ``values`` (``[layers, columns]``, the metric with each cell patched), ``layers``
    and ``columns`` (their labels), ``clean`` and ``corrupted`` (the metric on the two runs unpatched),
    ``kind`` and ``per`` (what was swept), ``direction`` (``"denoise"``: clean activations into the
    corrupted run; ``"noise"``: corrupted into the clean run) and ``method`` (``"activation"``: each cell
    run; ``"attribution"``: the first-order estimate; ``"eap-ig"``: integrated gradients along the path,
    ``steps`` points). ``patching["blocks.1"]`` is that layer's row of values."""

    def __init__(self, model: str, kind: str, per: str, direction: str, method: str, metric: str, layers: list[str],
                 columns: list[str], values: torch.Tensor, clean: float, corrupted: float, steps: int = 0) -> None:
        self.model, self.kind, self.per, self.direction, self.method = model, kind, per, direction, method
        self.metric, self.layers, self.columns, self.steps = metric, layers, columns, steps
        self.values, self.clean, self.corrupted = values.double(), clean, corrupted
        gap = clean - corrupted
        self.normalised = (self.values - corrupted) / gap if gap else torch.full_like(self.values, float("nan"))
        self.rows = [PatchRow(layer, col, float(self.values[i, j]), float(self.normalised[i, j]))
                     for i, layer in enumerate(layers) for j, col in enumerate(columns)]

    @property
    def base(self) -> float:
        """The metric of the run patched into (corrupted when denoising, clean when noising)."""
        return self.corrupted if self.direction == "denoise" else self.clean

    @property
    def effects(self) -> torch.Tensor:
        """Each cell's change of the metric from the run it patched into, ``[layers, columns]``."""
        return self.values - self.base

    def __getitem__(self, layer: str) -> torch.Tensor:
        if layer not in self.layers:
            raise missing(layer, "layer", self.layers)
        return self.values[self.layers.index(layer)]

    def __contains__(self, layer: object) -> bool:
        return layer in self.layers

    def top(self, k: int = 5) -> list[tuple[str, str, float]]:
        """The ``k`` cells that move the metric most (by ``|effect|``): ``(layer, column, effect)``."""
        flat = self.effects.flatten()
        order = flat.abs().argsort(descending=True)[:k]
        n = len(self.columns)
        return [(self.layers[int(i) // n], self.columns[int(i) % n], float(flat[i])) for i in order]

    def correlation(self, other: Patching) -> float:
        """Pearson's correlation of this sweep's cells with ``other``'s, of the same grid (an estimate
        beside the real sweep).

        Example:
            >>> a = Patching("m", "resid_pre", "position", "denoise", "activation", "logit_diff", ["blocks.0"],
            ...              ["0", "1"], torch.tensor([[1.0, 3.0]]), 3.0, 1.0)
            >>> round(a.correlation(a), 6)
            1.0
        """
        if other.values.shape != self.values.shape or other.columns != self.columns:
            raise HookscopeError(f"the sweeps have different grids ({list(self.values.shape)} of {self.kind}, "
                                 f"{list(other.values.shape)} of {other.kind}): compare the same kind, per and prompts")
        a, b = self.values.flatten(), other.values.flatten()
        a, b = a - a.mean(), b - b.mean()
        den = float(a.norm() * b.norm())
        return float(a @ b) / den if den else float("nan")

    def table(self) -> str:
        """The grid: one row per layer, one column per position, head or kind, then the clean and
        corrupted metrics."""
        how = {"activation": "activation patching", "attribution": "attribution patching",
               "eap-ig": f"attribution patching with integrated gradients ({self.steps} steps)"}[self.method]
        title = (f"{how} of {self.kind} per {self.per}, {self.direction} ({self.metric}: clean {self.clean:.4f}, "
                 f"corrupted {self.corrupted:.4f})")
        body = [[layer, *(f"{float(v):.3f}" for v in self.values[i])] for i, layer in enumerate(self.layers)]
        return "\n".join([title, *table(["layer", *self.columns], body, left={0})])

    def to_dict(self) -> dict[str, Any]:
        """``{model, kind, per, direction, method, steps, metric, clean, corrupted, layers, columns, values}``."""
        return {"model": self.model, "kind": self.kind, "per": self.per, "direction": self.direction,
                "method": self.method, "steps": self.steps, "metric": self.metric, "clean": self.clean,
                "corrupted": self.corrupted, "layers": self.layers, "columns": self.columns,
                "values": self.values.tolist(), "rows": self.rows}
