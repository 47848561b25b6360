"""The caller's random number generators, put back after a forward pass that may draw from them.

Dropout in training mode draws from the generator of the device it runs on; an analysis that runs
the user's model must not move the user's random stream. Nothing here imports from hookscope.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

__all__ = ["rng_devices", "kept_rng"]

RngDevices = tuple[list[int], str | None]


def rng_devices(used: Iterable[torch.Tensor]) -> RngDevices:
    """The accelerator generators a pass over ``used`` tensors may draw from: (indices, device type).

    The devices of one accelerator type the tensors live on; for CUDA, every device once CUDA is
    initialised (reading a generator's state is cheap then, and it must not initialise CUDA itself).
    """
    accel = [t.device for t in used if t.device.type not in ("cpu", "meta") and t.device.index is not None]
    kind = accel[0].type if accel else None
    indices = {d.index for d in accel if d.type == kind and d.index is not None}
    if kind in (None, "cuda") and torch.cuda.is_initialized():
        kind = "cuda"
        indices |= set(range(torch.cuda.device_count()))
    return sorted(indices), kind


@contextlib.contextmanager
def kept_rng(devices: RngDevices, *, seed: int | None = None) -> Iterator[None]:
    """The CPU generator and those of ``devices`` restored on exit, started from ``seed`` if given."""
    indices, kind = devices
    with torch.random.fork_rng(devices=indices, device_type=kind or "cpu"):
        if seed is not None:
            torch.manual_seed(seed)
        yield
