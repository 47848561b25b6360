"""One real training step, counted and undone: forward under the saved-tensor hooks, the loss,
backward, the optimizer's step; then the parameters, their gradients and the optimizer's state put
back as they were.

The caller's gradients and optimizer state are set aside for the step (``p.grad = None``, a fresh
``optimizer.state``) and handed back afterwards as the same objects, untouched: the step makes and
measures its own, as a step after ``zero_grad()`` does. The optimizer's step changes the
parameters in place; their values are copied to the host first and written back after.
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..._tree import tensors
from ...core.compiled import HookRefresh, eager
from ...core.failure import forward_error, module_label, received
from ...core.hooks import HookGroup
from ...core.inputs import private
from ...core.state import RngDevices, restored
from ...core.text import first_line
from ...errors import ForwardError, HookscopeError
from ...selection import unwrap
from ._saved import SavedTensors

__all__ = ["Step", "run_step", "set_aside"]

Named = list[tuple[str, nn.Module]]
Loss = Callable[[Any], torch.Tensor]
_REMOVED: Any = object()  # the output a with_kwargs forward hook gets when it was removed mid-call


@dataclass
class Step:
    """What one step left to measure: calls per module, and the fresh gradients and optimizer state
    (read before they are put back)."""

    calls: dict[str, int] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # id(parameter) -> its fresh .grad
    state: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # id(parameter) -> its state's tensors
    measured: int | None = None


class _Calls:
    """Module hooks that keep the stack of open calls the saved-tensor hooks read."""

    def __init__(self, saved: SavedTensors, step: Step, group: HookGroup) -> None:
        self.saved, self.step, self.group = saved, step, group

    def register(self, selected: Named) -> None:
        for name, module in selected:
            # own hook: which module is running when autograd saves a tensor; keeps no tensor
            self.group.add(module.register_forward_pre_hook(eager(self._pre(name)), with_kwargs=True))
            self.group.add(module.register_forward_hook(eager(self._post(name)), with_kwargs=True))

    def _pre(self, name: str) -> Callable[..., None]:
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            if kwargs is None or self.group.closed:  # removed since this call began
                return
            self.step.calls[name] = self.step.calls.get(name, 0) + 1
            self.saved.calls.push((name, module, args, kwargs))

        return pre

    def _post(self, name: str) -> Callable[..., None]:
        def post(module: nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _REMOVED) -> None:
            if output is _REMOVED or self.group.closed:
                return
            # calls above it that raised inside a try/except of the model never returned: drop them
            while (top := self.saved.calls.top()) is not None and top[0] != name:
                self.saved.calls.pop()
            if self.saved.calls.pop() is not None:
                self.step.done.append(name)

        return post

    def failure(self, exc: Exception) -> ForwardError:
        top = self.saved.calls.top()
        if top is None:
            return forward_error(exc, None)
        name, module, args, kwargs = top
        return forward_error(exc, module_label(name, module), got=received(args, kwargs), after=self.step.done)


@contextlib.contextmanager
def set_aside(params: list[nn.Parameter], optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Inside: no parameter has a gradient, the optimizer has no state; after: both as before (the
    same objects), the optimizer's parameters holding their values again."""
    stepped = [p for g in optimizer.param_groups for p in g["params"]] if optimizer is not None else []
    grads = [(p, p.grad) for p in {id(p): p for p in (*params, *stepped)}.values()]
    values = [(p, p.detach().to("cpu", copy=True)) for p in stepped]  # on the host: the device's peak is the step's
    state = optimizer.state if optimizer is not None else None
    groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups] \
        if optimizer is not None else []
    for p, _ in grads:
        p.grad = None
    if optimizer is not None:
        optimizer.state = defaultdict(dict)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in values:
                p.copy_(v)
        for p, g in grads:
            p.grad = g
        if optimizer is not None and state is not None:
            optimizer.state = state
            for g, kept in zip(optimizer.param_groups, groups):
                for k in [k for k in g if k != "params" and k not in kept]:
                    del g[k]
                g.update(kept)


def default_loss(output: Any) -> torch.Tensor:
    """The output itself when it is one number, its ``loss`` when it has one (a transformers model
    given labels), else the sum of every floating tensor of it that needs a gradient.

    Example:
        >>> x = torch.ones(2, 3, requires_grad=True)
        >>> default_loss((x, x.sum())).item(), default_loss({"loss": x.sum() * 0}).item()
        (12.0, 0.0)
    """
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output
    own = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(own, torch.Tensor) and own.numel() == 1:
        return own
    parts = [t.sum() for t in tensors(output) if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if not parts:
        raise HookscopeError("the model's output needs no gradient (no parameter used requires grad, or the "
                             "model runs under no_grad): nothing to backpropagate; let a parameter require grad")
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total.real if total.is_complex() else total


def _loss_value(loss: Loss | None, output: Any) -> torch.Tensor:
    if loss is None:
        return default_loss(output)
    try:
        value = loss(output)
    except HookscopeError:
        raise
    except Exception as e:
        raise HookscopeError(f"loss(output) failed: {type(e).__name__}: {first_line(e)}; "
                             "loss= takes the model's output and returns one number") from e
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        need = "" if not isinstance(value, torch.Tensor) or value.numel() != 1 else " that needs no gradient"
        raise HookscopeError(f"loss(output) returned {what}{need}; return one number computed from the output, "
                             "e.g. loss=lambda out: out.logits.sum()")
    return value


def _backward(value: torch.Tensor) -> None:
    try:
        value.backward()
    except HookscopeError:
        raise
    except Exception as e:
        raise HookscopeError(f"the backward pass failed: {type(e).__name__}: {first_line(e)}") from e


def _optimize(optimizer: torch.optim.Optimizer, step: Step) -> None:
    try:
        optimizer.step()
    except Exception as e:
        raise HookscopeError(f"{type(optimizer).__name__}.step() failed: {type(e).__name__}: {first_line(e)}; "
                             "pass an optimizer whose step() takes no closure, or none") from e
    step.state = {id(p): list(tensors(s)) for p, s in optimizer.state.items()}


def _forward(model: nn.Module, selected: Named, inputs: Any, saved: SavedTensors, step: Step) -> Any:
    group = HookGroup()
    calls = _Calls(saved, step, group)
    refresh = HookRefresh(model)  # hooks added to a compiled model that already ran must take effect
    try:
        calls.register(selected)
        refresh.open()
        args, kw = inputs
        return model(*args, **kw)
    except HookscopeError:
        raise
    except Exception as e:
        raise calls.failure(e) from e
    finally:
        group.remove()
        refresh.close()
        saved.calls.clear()  # open calls hold their inputs


def run_step(model: nn.Module, selected: Named, inputs: Any, saved: SavedTensors, *, loss: Loss | None,
             optimizer: torch.optim.Optimizer | None, device: torch.device | None, rng: RngDevices) -> Step:
    """Forward, loss, backward and the optimizer's step on a private copy of ``inputs`` (moved to
    ``device``); everything counted, everything put back (modes, buffers, random state, gradients,
    optimizer state, parameter values)."""
    inner = unwrap(model)[0]
    step = Step()
    cuda = device if device is not None and device.type == "cuda" else None
    with restored(inner, rng=rng), set_aside(list(inner.parameters()), optimizer):
        before = _cuda_start(cuda) if cuda is not None else 0
        with torch.inference_mode(False), torch.enable_grad():
            placed = _placed(inputs, device)  # outside inference mode: copies autograd may save
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                output = _forward(model, selected, placed, saved, step)
                value = _loss_value(loss, output)
            del output, placed
            _backward(value)
            del value
        step.grads = {id(p): p.grad for p in inner.parameters() if p.grad is not None}
        if optimizer is not None:
            _optimize(optimizer, step)
        if cuda is not None:
            step.measured = torch.cuda.max_memory_allocated(cuda) - before
    return step


def _placed(inputs: Any, device: torch.device | None) -> Any:
    try:
        return private(inputs, device)  # the model may write into its inputs: ours
    except (RuntimeError, AssertionError) as e:  # a device this build or machine does not have
        raise HookscopeError(f"the example input cannot be moved to device={str(device)!r} ({first_line(e)}); "
                             "pass a device this machine has, or None for the model's own") from None


def _cuda_start(device: torch.device) -> int:
    """What the device holds before the step; its peak statistic reset to measure the step's."""
    try:
        torch.cuda.synchronize(device)
    except (RuntimeError, AssertionError) as e:  # no CUDA in this build or on this machine
        raise HookscopeError(f"device={str(device)!r} cannot run the step here ({first_line(e)}); "
                             "pass a device this machine has, or None for the model's own") from None
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)
