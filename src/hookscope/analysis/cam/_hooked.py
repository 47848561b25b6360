"""The hooked forward pass of :func:`hookscope.cam`: what it keeps of each layer, and what it watches.

These are cam's own hooks, not :func:`hookscope.capture`'s: a kept activation must stay in the autograd graph
(capture detaches) and the model must run on a copy of it, so that an in-place op after the layer cannot
rewrite what the gradient methods differentiate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._tree import first_tensor, tree_map
from ...core.compiled import HookRefresh, eager, is_compiled
from ...core.hooks import HookGroup
from ...core.inputs import private
from ...errors import HookscopeError
from .._layout import LayoutProbe
from .._targets import call_model

__all__ = ["Pass", "activations", "hooked_forward", "reaches"]


class Pass:
    """What one hooked forward pass left behind."""

    def __init__(self, keep: list[tuple[str, nn.Module]]) -> None:
        self.output: Any = None
        self.kept: dict[str, list[torch.Tensor | None]] = {n: [] for n, _ in keep}
        self.watched: list[tuple[str, torch.Tensor, int]] = []  # (name, output, its version), in finish order
        self.order: list[tuple[bool, str, nn.Module, Any]] = []  # (started?, name, module, output): every call
        self.head: tuple[str, nn.Module, Any, Any] | None = None  # the last nn.Linear call
        self.probe = LayoutProbe([n for n, _ in keep])  # what tells a kept 4-D output's layout
        self.probed = False  # the probe was attached
        self.modules: dict[str, nn.Module] = {}  # of the watched layers, by name


def keeper(p: Pass, name: str) -> Any:
    store = p.kept[name]

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        t = first_tensor(output)
        if t is None:
            store.append(None)
            return None
        a = t if t.requires_grad else t.detach().requires_grad_()  # integer inputs (token ids) give no graph
        store.append(a)
        # Keep `a`, hand the model a copy: a later in-place op (ReLU(inplace=True), out += identity)
        # would rewrite the kept values and move `a`'s autograd history past it (pytorch/pytorch#61519).
        copy = a.clone()
        p.probe.hand(name, copy)
        return tree_map(lambda u: copy if u is t else u, output)

    return hook


def watcher(name: str, p: Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.ndim in (3, 4, 5):  # maps of 1-D, 2-D and 3-D inputs
            p.watched.append((name, output, output._version))
        p.order.append((False, name, module, output if isinstance(output, torch.Tensor) else None))

    return hook


def starts(name: str, p: Pass) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        p.order.append((True, name, module, None))

    return hook


def head_watcher(name: str, p: Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        p.head = (name, module, args[0] if args else None, output)

    return hook


def hooked_forward(model: nn.Module, x: torch.Tensor, kw: dict[str, Any], keep: list[tuple[str, nn.Module]],
                    watch: list[tuple[str, nn.Module]], heads: list[tuple[str, nn.Module]],
                    probe: nn.Module | None = None) -> Pass:
    p = Pass(keep)
    group = HookGroup()
    refresh = HookRefresh(model)  # a compiled model: traced anew with the hooks, which run eagerly between pieces
    hook: Callable[[Any], Any] = eager if is_compiled(model) else (lambda f: f)
    try:
        for name, module in keep:
            # the kept output stays in the autograd graph (capture detaches) and the model runs on a copy of it,
            # so no in-place op after the layer rewrites what is differentiated: cam's own hook
            group.add(module.register_forward_hook(hook(keeper(p, name))))
        if probe is not None:  # after the keepers, so that they see the copies handed on
            p.probe.attach(probe, keep, group, wrap=hook)
            p.probed = True
        for name, module in watch:
            # own hook: holds each output by reference with its version, only to find the layer; copies nothing
            group.add(module.register_forward_pre_hook(hook(starts(name, p))))
            group.add(module.register_forward_hook(hook(watcher(name, p))))
        for name, module in heads:
            # own hook: the last Linear's input and output, read by reference to check CAM's head
            group.add(module.register_forward_hook(hook(head_watcher(name, p))))
        refresh.open()
        p.output = call_model(model, (x,), private(kw))  # a failure names where it failed
    finally:
        group.remove()
        refresh.close()
        p.probe.release()  # the readers are known now: keep no extra tensor alive
    return p


def reaches(t: torch.Tensor, target: torch.Tensor) -> bool:
    """Does ``t``'s autograd graph reach the tensor ``target`` (its graph node, or itself as a leaf)?"""
    node = target.grad_fn
    seen: dict[int, Any] = {}  # keeps nodes alive so their ids stay unique
    stack = [t.grad_fn]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen[id(n)] = n
        if n is node or getattr(n, "variable", None) is target:
            return True
        stack.extend(m for m, _ in n.next_functions)
    return False


def activations(p: Pass, chosen: list[tuple[str, nn.Module]], leaf: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Each chosen layer's one output, checked to depend on the input (``leaf``; ``None``: integer inputs)."""
    acts: dict[str, torch.Tensor] = {}
    for name, _ in chosen:
        got = p.kept[name]
        if len(got) != 1 or got[0] is None:
            what = "did not run" if not got else f"ran {len(got)} times" if len(got) > 1 else "returned no tensor"
            raise HookscopeError(f"layer {name!r} {what} in the forward pass; CAM needs one tensor "
                                 "output per layer, so pick a layer that runs once")
        if leaf is not None and not reaches(got[0], leaf):
            raise HookscopeError(f"layer {name!r}'s output does not depend on the input, so its map says "
                                 "nothing about the image; pick a layer on the path from input to output")
        acts[name] = got[0]
    return acts
