"""A loop under ``torch.amp.GradScaler``: the monitor sees each ``scaler.update()`` (a step the scaler
skipped calls no optimizer hook), tells whether the scaler skipped the step, and gives the output
gradients, which come from the scaled loss, divided by the step's scale."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ._telemetry import TelemetryRow

__all__ = ["ScalerHook", "scaler_skipped", "unscaled"]


class ScalerHook:
    """``scaler.update`` replaced on the instance, so that the monitor sees each update before it
    happens; :meth:`remove` puts back what was there (a handle, as the optimizer's hooks have)."""

    def __init__(self, scaler: Any, before: Callable[[], None]) -> None:
        self.scaler = scaler
        self._had = "update" in vars(scaler)
        self._was = vars(scaler).get("update")
        original = scaler.update

        def update(*args: Any, **kwargs: Any) -> Any:
            before()
            return original(*args, **kwargs)

        # own hook: GradScaler has no hooks; a step it skips calls no optimizer hook either
        scaler.update = update

    def remove(self) -> None:
        if self._had:
            self.scaler.update = self._was
        else:
            vars(self.scaler).pop("update", None)


def scaler_skipped(scaler: Any, optimizer: Any) -> bool:
    """Whether ``scaler.step(optimizer)`` found Inf or NaN gradients (and so did not step)."""
    if not scaler.is_enabled():
        return False
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})  # torch.amp's own record
    found = state.get("found_inf_per_device", {})
    return bool(found) and sum(float(v.item()) for v in found.values()) > 0


def unscaled(rows: list[TelemetryRow], scaler: Any) -> list[TelemetryRow]:
    """The output gradients as the loss would give them unscaled: the backward pass ran on the
    loss times the scaler's scale (the scale of this step: ``update()`` has not changed it yet)."""
    if not scaler.is_enabled():
        return rows
    scale = float(scaler.get_scale())
    if scale in (0.0, 1.0) or not math.isfinite(scale):
        return rows
    return [dataclasses.replace(r, **{k: getattr(r, k) / scale for k in ("mean", "std", "min", "max", "rms")
                                      if getattr(r, k) is not None}) if r.what == "grad_output" else r for r in rows]
