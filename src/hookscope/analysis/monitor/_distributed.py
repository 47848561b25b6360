"""A monitor under ``torch.distributed``: every rank takes the statistics of its own part of the
batch, and only rank 0 writes them (the ranks would otherwise write over one another's files);
parameters sharded by FSDP2 are summarised as the whole tensors they make."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["rank", "whole", "writes_here"]


def rank() -> int:
    """This process's rank in the default process group; 0 outside one.

    Example:
        >>> rank()
        0
    """
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def writes_here() -> bool:
    """Whether this process writes the logs: rank 0 only (every process outside a process group)."""
    return rank() == 0


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one whole tensor: a ``DTensor`` (a parameter or gradient sharded by FSDP2's
    ``fully_shard``) gathered from every rank with ``full_tensor()``, a collective that every rank
    reaches in the same order (the monitor's sampled steps are the same on every rank); any other
    tensor as it is.

    Example:
        >>> whole(torch.ones(2)).tolist()
        [1.0, 1.0]
    """
    full = getattr(t, "full_tensor", None)
    return full() if isinstance(t, DTensor) and callable(full) else t
