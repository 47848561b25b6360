"""A monitor under ``torch.distributed``: every rank takes the statistics of its own part of the
batch, and only rank 0 writes them (the ranks would otherwise write over one another's files)."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["rank", "writes_here"]


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
