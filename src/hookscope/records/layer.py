"""Every call of one module (:class:`LayerRecord`), with shortcuts that read its only call.

Must not import: anything of hookscope but ``errors`` and ``records.call``.
"""

from __future__ import annotations

from collections.abc import Iterator

from .call import CallRecord, FieldError

__all__ = ["LayerRecord"]


def _only(name: str, calls: list[CallRecord], what: str) -> CallRecord:
    if len(calls) == 1:
        return calls[0]
    if not calls:
        raise FieldError(f"{name!r} was selected but never called; check that the forward pass reaches it")
    raise FieldError(
        f"{name!r} was called {len(calls)} times, so .{what} is ambiguous; "
        f"read rec[{name!r}].calls[i].{what} or rec[{name!r}].{what}s"
    )


class LayerRecord:
    """Every call of one module, in order. Shortcuts read the only call; several calls must be indexed.

    Example:
        >>> import torch, hookscope
        >>> shared = torch.nn.Linear(2, 2)
        >>> net = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)  # one module used twice
        >>> with hookscope.capture(net, "0", "1") as rec:
        ...     _ = net(torch.ones(1, 2))
        >>> rec["1"].output.shape, len(rec["0"]), rec["0"].calls[1].output.shape
        (torch.Size([1, 2]), 2, torch.Size([1, 2]))
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[CallRecord] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self) -> Iterator[CallRecord]:
        return iter(self.calls)

    def __getitem__(self, i: int) -> CallRecord:
        return self.calls[i]

    output = property(lambda self: _only(self.name, self.calls, "output").output)
    input = property(lambda self: _only(self.name, self.calls, "input").input)
    args = property(lambda self: _only(self.name, self.calls, "args").args)
    kwargs = property(lambda self: _only(self.name, self.calls, "kwargs").kwargs)
    grad_output = property(lambda self: _only(self.name, self.calls, "grad_output").grad_output)
    grad_input = property(lambda self: _only(self.name, self.calls, "grad_input").grad_input)
    outputs = property(lambda self: [c.output for c in self.calls])
    inputs = property(lambda self: [c.input for c in self.calls])
    grad_outputs = property(lambda self: [c.grad_output for c in self.calls])
    grad_inputs = property(lambda self: [c.grad_input for c in self.calls])

    def __repr__(self) -> str:
        return f"LayerRecord({self.name!r}, calls={len(self.calls)})"
