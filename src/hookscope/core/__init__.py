"""The bottom floor every tool stands on: the hook lifecycle and the plumbing analyses share.

``hooks`` (handle groups, thread scope), ``guard`` (copy-on-write protection of recorded tensors),
``compiled`` (hooks on ``torch.compile``'d models), ``state`` (run a model and put it back),
``failure`` (the one-line ForwardError), ``inputs`` (the model's ``kwargs=``), ``calls`` (per-thread call stacks), ``text`` (tables),
``result`` (the protocol every result speaks), and ``first_tensor`` of the tree helper (the tensor a
model's output leads with). Nothing here imports from above ``core``.
"""

from .._tree import first_tensor
from .guard import Guarded, Slot, plain, protect, release
from .hooks import HookGroup, ThreadScope, hook_count

__all__ = ["Guarded", "HookGroup", "ThreadScope", "Slot", "first_tensor", "hook_count", "plain", "protect", "release"]
