"""Change what modules receive and produce, forward and backward, for the duration of a block."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ._tree import tree_map
from .capture import check_hookable
from .core.hooks import HookGroup
from .errors import HookscopeError
from .selection import Selector, layers

__all__ = ["edit", "Edit", "ablate", "scale"]

Change = Callable[[Any], Any]


def _as_fn(change: Any, what: str) -> Change | None:
    """A function, or a fixed value turned into one that checks shapes."""
    if change is None or callable(change):
        return change

    def replace(old: Any) -> Any:
        if isinstance(old, torch.Tensor) and isinstance(change, torch.Tensor) and old.shape != change.shape:
            raise HookscopeError(
                f"the fixed {what} has shape {tuple(change.shape)} but the module's {what} has shape "
                f"{tuple(old.shape)}; pass a tensor of that shape, or a function"
            )
        if isinstance(old, torch.Tensor) and isinstance(change, torch.Tensor):
            return change.to(device=old.device, dtype=old.dtype)
        return change

    return replace


class Edit:
    """Context that rewrites inputs, outputs and gradients of selected modules. Build it with :func:`edit`.

    ``counts[name]`` says how many calls of each module were edited.
    """

    def __init__(self, selected: list[tuple[str, nn.Module]], changes: dict[str, Change | None]) -> None:
        self._targets: list[tuple[str, nn.Module]] | None = selected
        self._changes = changes
        self._group = HookGroup()
        self.counts = {n: 0 for n, _ in selected}

    def __enter__(self) -> Edit:
        assert self._targets is not None, "an Edit runs once; call hookscope.edit(...) again"
        c = self._changes
        try:
            for name, module in self._targets:
                if c["input"] or c["grad_input"]:
                    self._group.add(module.register_forward_pre_hook(self._pre(name)))
                if c["output"] or c["grad_output"]:
                    self._group.add(module.register_forward_hook(self._post(name)))
        except BaseException:
            self._group.remove()
            raise
        self._targets = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self._group.remove()

    def remove(self) -> None:
        """Remove the hooks now (the context does it by itself). Idempotent."""
        self._group.remove()

    def _pre(self, name: str) -> Any:
        change, grad_change = self._changes["input"], self._changes["grad_input"]
        counted_later = bool(self._changes["output"] or self._changes["grad_output"])

        def pre(module: nn.Module, args: tuple[Any, ...]) -> Any:
            if not args:
                raise HookscopeError(
                    f"{name!r} was called without positional input, so input= has nothing to "
                    "change; edit the output of the layer before it instead"
                )
            first = args[0]
            if change is not None:
                new = change(first)
                first = first if new is None else new
            if grad_change is not None:
                first = tree_map(lambda t: self._hook_grad(t, grad_change, alias=True), first)
            if not counted_later:
                self.counts[name] += 1
            return None if first is args[0] else (first, *args[1:])

        return pre

    def _post(self, name: str) -> Any:
        change, grad_change = self._changes["output"], self._changes["grad_output"]

        def post(module: nn.Module, args: Any, output: Any) -> Any:
            new = output
            if change is not None:
                got = change(output)
                new = output if got is None else got
            if grad_change is not None:
                tree_map(lambda t: self._hook_grad(t, grad_change, alias=False), new)
            self.counts[name] += 1
            return None if new is output else new

        return post

    def _hook_grad(self, t: torch.Tensor, fn: Change, alias: bool) -> torch.Tensor:
        if not (t.requires_grad and torch.is_grad_enabled()):
            return t
        # input gradients: a fresh alias per call, so only what flows through this module changes
        target = t.view_as(t) if alias else t
        self._group.add(target.register_hook(fn))
        return target


def edit(
    model: nn.Module,
    *selectors: Selector,
    input: Any = None,
    output: Any = None,
    grad_input: Any = None,
    grad_output: Any = None,
) -> Edit:
    """Rewrite what the selected modules receive or produce, for the duration of a ``with`` block.

    Each change is a function ``old -> new`` (return ``None`` to keep ``old``, for example after
    changing it in place) or a fixed value that replaces ``old`` (activation patching):

    - ``input``: the first positional input, before the module runs (a forward pre-hook);
    - ``output``: the whole output (a tensor, tuple, dict, ...), after the module runs;
    - ``grad_output``: the gradient arriving at each output tensor, before it flows into the module;
    - ``grad_input``: the gradient the module sends back to its first input.

    Hooks run in the order contexts were entered: a capture entered after an edit sees the edited
    values, one entered before sees the originals.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with hookscope.edit(net, "0", output=hookscope.ablate([0, 1, 2])):
        ...     y = net(torch.randn(4, 2))
        >>> bool((y == 0).all())
        True
    """
    changes = {
        "input": _as_fn(input, "input"),
        "output": _as_fn(output, "output"),
        "grad_input": _as_fn(grad_input, "grad_input"),
        "grad_output": _as_fn(grad_output, "grad_output"),
    }
    if all(v is None for v in changes.values()):
        raise HookscopeError("edit() needs at least one of input=, output=, grad_input=, grad_output=")
    selected = layers(model, *selectors)
    check_hookable(selected)
    return Edit(selected, changes)


def ablate(channels: int | Sequence[int], dim: int = 1, value: float = 0.0) -> Change:
    """A change that sets whole channels (indices along ``dim``) to ``value``, out of place.

    Example:
        >>> ablate([0])(torch.ones(1, 2, 1, 1)).flatten().tolist()
        [0.0, 1.0]
    """
    index = [channels] if isinstance(channels, int) else list(channels)

    def fn(t: Any) -> Any:
        def one(x: torch.Tensor) -> torch.Tensor:
            if not -x.dim() <= dim < x.dim() or not index:
                raise HookscopeError(f"cannot ablate dim {dim} of a tensor of shape {tuple(x.shape)}")
            idx = torch.as_tensor(index, device=x.device)
            return x.index_fill(dim, idx, value)

        return tree_map(one, t)

    return fn


def scale(factor: float) -> Change:
    """A change that multiplies every tensor by ``factor`` (for activations or gradients).

    Example:
        >>> scale(0.5)(torch.ones(2)).tolist()
        [0.5, 0.5]
    """
    return lambda t: tree_map(lambda x: x * factor, t)
