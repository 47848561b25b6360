"""What a training step holds in memory, per module: measured on one real step, not estimated
from shapes.

Laid out by concern: ``_saved`` holds the saved-tensor hooks (every tensor autograd saves for
backward, its storage charged once to the innermost running module); ``_step`` runs the step
(forward, loss, backward, the optimizer's step) and puts the model, its gradients and the
optimizer back; ``_rows`` turns the figures into rows and totals; ``_result`` holds
:class:`StepMemory` and its text. Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..._tree import tensors
from ...core.inputs import model_args, model_kwargs
from ...core.state import rng_devices
from ...core.text import first_line
from ...errors import HookscopeError, checked
from ...selection import check_hookable, layers, unwrap
from ._result import StepMemory
from ._rows import MemoryRow, MemoryTotals, rows_of, totals_of
from ._saved import SavedTensors, distinct_bytes, storage_of
from ._step import run_step

__all__ = ["step_memory", "StepMemory", "MemoryRow", "MemoryTotals"]


@checked
def step_memory(
    model: nn.Module,
    inputs: Any = None,
    *,
    loss: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    kwargs: Mapping[str, Any] | None = None,
    depth: int | None = None,
    device: torch.device | str | None = None,
) -> StepMemory:
    """Run one real training step and say, per module, what it holds in memory, in bytes.

    The step is forward, ``loss(output)``, backward and, when ``optimizer`` is given, its
    ``step()``. Every tensor autograd saves for backward is seen through
    ``torch.autograd.graph.saved_tensors_hooks`` and its storage counted once over the whole step
    (a view, or the same tensor saved by two operations, counts once), in the innermost module
    whose forward was running when it was saved; a module called 100 times counts the tensors of
    its 100 calls. Saved parameters and buffers are told apart (``params_saved``): the model holds
    them anyway. Gradients are the ones this backward makes; the optimizer's state is what its
    step leaves in ``optimizer.state`` (``exp_avg``, ``exp_avg_sq``, ``step``, ... storages once).
    The peak is the most saved bytes alive at once, plus parameters, buffers, gradients and
    optimizer state: what these parts can hold together. Temporaries (outputs no backward needs, a
    kernel's workspace, the gradients of activations during backward) come on top, and so does the
    recomputation of a ``torch.utils.checkpoint`` block in backward: such a block saves its inputs,
    nothing inside it. On CUDA, ``totals.measured_peak`` is measured too, with
    ``torch.cuda.max_memory_allocated`` (the device's peak statistic is reset for it).

    Nothing is left changed: modes, buffers (BatchNorm's statistics) and random generators are
    put back; the caller's gradients and optimizer state are set aside for the step and handed back
    as they were (the same tensors, untouched); parameters get their values back after the
    optimizer's step (written back in place, so their version counters move on). The optimizer's
    own step hooks run, as in any step. Every hook is removed, also on errors.

    Args:
        model: any ``nn.Module``, in the mode it trains in (it is left in it); wrappers are seen
            through and rows are named as in the model inside.
        inputs: the model's positional input for one step, or a tuple of several (a private copy is used).
        loss: a function of the model's output returning one number; by default the output itself
            when it is one number, its ``loss`` when it has one (a transformers model given
            labels), else the sum of its floating tensors.
        optimizer: a ``torch.optim`` optimizer over the model's parameters, to count its state.
        kwargs: the model's keyword inputs, e.g. ``{"attention_mask": m}``.
        depth: keep rows down to this depth of the module tree (totals cover every module).
        device: where the inputs go and the step runs (default: the device of the model's first
            parameter or buffer); the model itself is never moved.

    Returns:
        A :class:`StepMemory`: ``print(m)`` shows the table, ``m["layer1"].saved_total`` one
        module's figure, ``m.totals.peak`` the peak.

    Raises:
        ForwardError: the forward pass failed, in one line naming the module.
        HookscopeError: a bad argument, a loss that is not one number, an output that needs no
            gradient, a failing backward or optimizer step, a call inside a block that sets
            saved-tensor hooks of its own (``save_on_cpu``) or disables them, in one line.

    Example:
        >>> import torch
        >>> class Reused(torch.nn.Module):  # one layer applied 100 times
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear = torch.nn.Linear(8, 8)
        ...     def forward(self, x):
        ...         for _ in range(100):
        ...             x = self.linear(x)
        ...         return x
        >>> m = step_memory(Reused(), torch.randn(4, 8))
        >>> m["linear"].calls, m["linear"].saved == 100 * 4 * 8 * 4
        (100, True)
    """
    inputs = model_args(inputs)
    if not inputs and not kwargs:
        raise HookscopeError("step_memory() runs one training step and needs an example input: "
                             "step_memory(model, torch.randn(8, 3, 224, 224))")
    kw = model_kwargs(kwargs)
    _check(model, loss, optimizer, depth)
    _check_saved_hooks()
    inner, _ = unwrap(model)
    selected = layers(model, lambda name, module: True)  # every module once, the model itself too
    check_hookable(selected)
    target = _device(inner, device)
    lazy = any(is_lazy(p) for p in inner.parameters())
    saved = SavedTensors(lambda: _storages(inner), lazy=lazy)
    used = list(tensors((inputs, kw)))
    step = run_step(model, selected, (inputs, kw), saved, loss=loss, optimizer=optimizer, device=target,
                    rng=rng_devices([*inner.parameters(), *inner.buffers(), *used]))
    rows = rows_of(selected, saved, step)
    on_device = distinct_bytes((t for t in (*inner.parameters(), *inner.buffers()) if t.device == target), set())
    totals = totals_of(rows, saved, step, on_device)
    return StepMemory(type(inner).__name__, rows, totals, device=str(target or "cpu"),
                      optimizer=type(optimizer).__name__ if optimizer is not None else None,
                      training=inner.training, depth=depth)


def _storages(model: nn.Module) -> set[int]:
    found = (storage_of(t)[0] for t in (*model.parameters(), *model.buffers()) if not is_lazy(t))
    return {k for k in found if k is not None}


def _check(model: Any, loss: Any, optimizer: Any, depth: Any) -> None:
    if not isinstance(model, nn.Module):
        raise HookscopeError(f"model is a {type(model).__name__}, not an nn.Module; pass the model itself")
    if loss is not None and not callable(loss):
        raise HookscopeError(f"loss={loss!r} is not a function; pass a function of the model's output that "
                             "returns one number, e.g. loss=lambda out: out.sum()")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise HookscopeError(f"optimizer={type(optimizer).__name__} is not a torch.optim.Optimizer; pass the "
                             "optimizer built on the model's parameters, e.g. torch.optim.Adam(model.parameters())")
    if optimizer is not None:
        mine = {id(p) for p in model.parameters()}
        if not any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            raise HookscopeError(f"the {type(optimizer).__name__} given holds none of this model's parameters; "
                                 "pass the optimizer built on model.parameters()")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise HookscopeError(f"depth={depth!r} is not a depth; pass an int >= 0 (0: the model only) or None")


def _check_saved_hooks() -> None:
    """The step needs the saved-tensor hooks to itself: a block of the caller's would be replaced for it
    (``save_on_cpu``: the numbers would not be that block's) or refuses them."""
    autograd: Any = torch._C._autograd
    if not autograd._saved_tensors_hooks_is_enabled():
        why = first_line(RuntimeError(autograd._saved_tensors_hooks_get_disabled_error_message() or ""))
        raise HookscopeError(f"step_memory() counts saved tensors through saved_tensors_hooks, which this block "
                             f"disables ({why}); call it outside that block")
    top = autograd._top_saved_tensors_default_hooks(False)
    if top is not None and top[0] is not None:
        name = getattr(top[0], "__qualname__", type(top[0]).__name__).replace(".<locals>", "")
        raise HookscopeError(f"step_memory() counts saved tensors with saved_tensors_hooks of its own, and a block "
                             f"of yours has set {name!r}, which it would replace for the step; call it "
                             "outside that block (save_on_cpu, an offloading context...)")


def _device(model: nn.Module, device: Any) -> torch.device | None:
    """Where the step runs: ``device``, else the model's first parameter or buffer's device."""
    if device is None:
        first = next((t for t in (*model.parameters(), *model.buffers()) if not is_lazy(t)), None)
        return first.device if first is not None else None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise HookscopeError(f"device={device!r} is not a device PyTorch knows; "
                             "pass 'cpu', 'cuda', 'cuda:1', 'mps' or a torch.device") from None
