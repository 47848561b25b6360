"""The ranks of an extract: one process, a ``torch.distributed`` program the user started, or torchrun's
environment (then the process group is made here, and removed at the end).

Every rank works out the same plan on its own (shard k belongs to rank ``k % world``), so ranks talk only
at the start (rank 0 prepares the folder), and at the end (each rank's outcome, then rank 0 writes the
manifest): no collective per batch, so ranks with different amounts of work never wait on each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import HookscopeError

__all__ = ["Ranks", "local_device", "ranks"]


@dataclass
class Ranks:
    """This process's place among the ranks.

    Example:
        >>> r = Ranks(0, 1)
        >>> r.mine(5), r.lead
        ([0, 1, 2, 3, 4], True)
    """

    rank: int
    world: int
    owned: bool = False  # the process group was made here, so it is destroyed here

    @property
    def lead(self) -> bool:
        """Whether this is rank 0, which prepares the folder and writes the manifest."""
        return self.rank == 0

    def mine(self, shards: int) -> list[int]:
        """The shards this rank writes: every ``world``-th one, from its rank."""
        return list(range(self.rank, shards, self.world))

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for in one process)."""
        if self.world > 1:
            torch.distributed.barrier()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (on every rank)."""
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, value)
        return out

    def share(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if self.world == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """Destroy the process group if it was made here."""
        if self.owned and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def ranks(device: torch.device) -> Ranks:
    """The ranks this process belongs to: an initialised process group, torchrun's environment, or one.

    Example:
        >>> ranks(torch.device("cpu")).world >= 1
        True
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Ranks(0, 1)
    if not dist.is_available():
        raise HookscopeError("WORLD_SIZE is set but this torch has no torch.distributed; run one process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend)
    except (RuntimeError, ValueError) as e:
        raise HookscopeError(f"cannot join the {world} ranks torchrun started ({e}); start the command with "
                             "torchrun --nproc_per_node N, or unset WORLD_SIZE for one process") from None
    return Ranks(dist.get_rank(), dist.get_world_size(), owned=True)


def local_device() -> torch.device | None:
    """The GPU of this rank under torchrun (``cuda:LOCAL_RANK``), if CUDA is here.

    Example:
        >>> local_device() is None or local_device().type == "cuda"
        True
    """
    if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return None
