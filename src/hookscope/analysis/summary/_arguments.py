"""Every argument of :func:`~hookscope.summary` checked before any hook is registered, and the
example inputs moved where the model computes: one-line errors that name the fix."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..._tree import tree_map
from ...core.text import first_line
from ...errors import HookscopeError

__all__ = ["check_depth", "placed"]

def check_depth(depth: Any) -> None:
    """``None`` or an int >= 0.

    Example:
        >>> check_depth(-1)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: depth=-1 is not a depth; pass an int >= 0 (0: the model only) or None
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise HookscopeError(f"depth={depth!r} is not a depth; pass an int >= 0 (0: the model only) or None")


def _model_device(model: nn.Module) -> torch.device | None:
    for t in (*model.parameters(), *model.buffers()):
        if not is_lazy(t):
            return t.device
    return None


def _target_device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise HookscopeError(f"device={device!r} is not a device PyTorch knows; "
                             "pass 'cpu', 'cuda', 'cuda:1', 'mps' or a torch.device") from None


def placed(model: nn.Module, inputs: Any, device: Any) -> Any:
    """``inputs`` (any nesting of tensors) moved to ``device``, by default the device of the model's
    first parameter or buffer; as they are when the model holds no tensor. The model never moves.

    Example:
        >>> placed(nn.Linear(2, 2).to("meta"), (torch.zeros(1, 2),), None)[0].device
        device(type='meta')
    """
    target = _target_device(device) if device is not None else _model_device(model)
    if target is None:
        return inputs
    try:
        return tree_map(lambda t: t.to(target), inputs)
    except (RuntimeError, AssertionError) as e:  # a device this build or machine does not have
        raise HookscopeError(f"the example input cannot be moved to device={str(target)!r} ({first_line(e)}); "
                             "pass a device this machine has, or None for the model's own") from None
