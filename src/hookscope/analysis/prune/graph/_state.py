"""The state of one channel trace: channel ids in a union-find, blocked ids with their reason, the
shadow of every tracked tensor, and the parameter positions (members) each id lives in.

An id is one channel of one producer call (a conv's output channel). Ids that meet at the same
position of a pointwise op, or that one weight position reads, are the same channel (union). A
blocked class can never be removed; its reason says which layer and why. Must not import: the op
handlers, any analysis module.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["Tracer", "Member"]

Member = tuple[str, str, int]  # (module qualname, parameter or buffer name, dim)
_RANK = {"consumer": 0, "follower": 1, "producer": 2}


class Tracer:
    """Union-find over channel ids plus the shadows and members recorded during one forward pass.

    Example:
        >>> tr = Tracer({})
        >>> a, b = tr.fresh(2).long().tolist()
        >>> tr.union(a, b); tr.find(a) == tr.find(b)
        True
        >>> tr.block([a], "for the example"); tr.reason_of(b)
        'for the example'
    """

    def __init__(self, params: dict[int, tuple[str, str, bool]]) -> None:
        self.parent: list[int] = [0]
        self.reasons: dict[int, str] = {}
        self.shadows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.members: dict[Member, dict[int, int]] = {}
        self.roles: dict[Member, str] = {}
        self.params = params  # id(tensor) -> (module qualname, name, is_buffer)
        self.stack: list[str] = []
        self.sites: list[tuple[str, int, torch.Tensor]] = []
        self.ran: set[str] = set()
        self.used: set[int] = set()  # id() of the parameters and buffers some traced op read
        self.keys_of: dict[int, list[Member]] = {}  # filled when groups are assembled
        self.group_classes: dict[int, list[int]] = {}

    # --- union-find ------------------------------------------------------------------------------
    def fresh(self, n: int) -> torch.Tensor:
        """``n`` new ids, as a float64 tensor."""
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return torch.arange(start, start + n, dtype=torch.float64)

    def find(self, i: int) -> int:
        """The root of id ``i``."""
        parent = self.parent
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:
            parent[i], i = root, parent[i]
        return root

    def union(self, i: int, j: int) -> None:
        """Ids ``i`` and ``j`` are one channel; a reason of either is kept."""
        a, b = self.find(i), self.find(j)
        if a == b:
            return
        if a < b:
            a, b = b, a
        self.parent[a] = b
        if a in self.reasons:
            self.reasons.setdefault(b, self.reasons.pop(a))

    def union_pairs(self, pairs: torch.Tensor) -> None:
        """Union every (id, id) row of ``pairs``."""
        for i, j in pairs.long().tolist():
            self.union(i, j)

    def block(self, ids: Iterable[int] | torch.Tensor, reason: str) -> None:
        """Mark ids as never removable, saying why (the first reason of a class is kept)."""
        if isinstance(ids, torch.Tensor):
            ids = torch.unique(ids.abs()).long().tolist()
        for i in ids:
            if i:
                self.reasons.setdefault(self.find(int(i)), reason)

    def reason_of(self, i: int) -> str | None:
        """Why id ``i`` is blocked, or ``None``."""
        return self.reasons.get(self.find(i))

    # --- shadows ---------------------------------------------------------------------------------
    def shadow(self, t: object) -> torch.Tensor | None:
        """The shadow of tensor ``t`` or ``None`` when it carries no channel."""
        entry = self.shadows.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def set(self, t: torch.Tensor, s: torch.Tensor | None) -> None:
        """Record the shadow of ``t`` (dropped when it carries nothing)."""
        if s is None or not bool(s.any()):
            self.shadows.pop(id(t), None)
            return
        self.shadows[id(t)] = (t, s)

    def block_tensor(self, t: object, reason: str) -> None:
        """Block every id ``t`` carries."""
        s = self.shadow(t)
        if s is not None:
            self.block(s, reason)

    # --- members ---------------------------------------------------------------------------------
    def param(self, t: object) -> tuple[str, str, bool] | None:
        """(module qualname, name, is_buffer) of a parameter or buffer, or ``None``."""
        return self.params.get(id(t)) if isinstance(t, torch.Tensor) else None

    def member(self, t: torch.Tensor | None, dim: int, ids: torch.Tensor, role: str) -> bool:
        """Record that index ``i`` along ``dim`` of parameter ``t`` holds channel ``ids[i]`` (0: none);
        the same position seen twice (a layer called twice, a shared weight) couples the two ids."""
        info = self.param(t)
        if t is None or info is None:
            return False
        key: Member = (info[0], info[1], dim % t.dim())
        table = self.members.setdefault(key, {})
        self.roles[key] = max(self.roles.get(key, role), role, key=_RANK.__getitem__)
        for pos, i in enumerate(ids.abs().long().tolist()):
            if not i:
                continue
            old = table.setdefault(pos, i)
            if old != i:
                self.union(old, i)
        return True

    def touch(self, items: Iterable[object]) -> None:
        """Note the parameters among ``items`` (and inside lists or tuples of them) as read by an op:
        a layer whose weights an op of its parent reads (``nn.MultiheadAttention.out_proj``) was seen."""
        for a in items:
            if isinstance(a, (list, tuple)):
                self.touch(a)
            elif isinstance(a, torch.Tensor) and id(a) in self.params:
                self.used.add(id(a))

    def here(self) -> str:
        """The module running now (``'(model)'`` at top level)."""
        return self.stack[-1] if self.stack else "(model)"
