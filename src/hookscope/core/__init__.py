"""The hook lifecycle: handle groups and copy-on-write protection of recorded tensors."""

from .guard import Guarded, Slot, plain, protect, release
from .hooks import HookGroup, ThreadScope, hook_count

__all__ = ["Guarded", "HookGroup", "ThreadScope", "Slot", "hook_count", "plain", "protect", "release"]
