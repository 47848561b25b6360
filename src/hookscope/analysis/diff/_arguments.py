"""Every argument of :func:`~hookscope.diff` checked before any hook is registered: one-line
errors that name the fix, and nothing run or changed when one is raised."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import torch
from torch import nn

from ...core.inputs import model_kwargs
from ...errors import HookscopeError
from ._compare import ATOL, RTOL

__all__ = ["check_models", "tolerance", "check_run_args", "check_run_device"]


def check_models(model_a: Any, model_b: Any) -> None:
    """Both are modules with values to compare (not on the meta device).

    Example:
        >>> check_models(nn.Linear(1, 1), "net")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: model_b is a str, not an nn.Module; call diff(model_a, model_b, ...
    """
    for side, m in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(m, nn.Module):
            raise HookscopeError(
                f"{side} is a {type(m).__name__}, not an nn.Module; call diff(model_a, model_b, inputs), "
                "or diff(model, model, inputs, b=hookscope.settings(...)) for one model under two settings"
            )
        if any(t.is_meta for t in (*m.parameters(), *m.buffers())):
            raise HookscopeError(
                f"{side} has tensors on the meta device, which hold no values to compare; load its "
                "weights first (model.to_empty(device='cpu') then model.load_state_dict(...))"
            )


def tolerance(name: str, value: Any) -> float:
    """``value`` as a float, if it is a finite number >= 0.

    Example:
        >>> tolerance("atol", 0)
        0.0
    """
    default = RTOL if name == "rtol" else ATOL
    if isinstance(value, bool) or not isinstance(value, Real):
        raise HookscopeError(f"{name}={value!r} is not a number; pass a float >= 0 such as {name}={default:g}")
    if not (math.isfinite(float(value)) and float(value) >= 0):
        raise HookscopeError(
            f"{name}={value!r} is not a finite number >= 0; pass for example {name}=0 for exact "
            f"equality or {name}={default:g} (the default)"
        )
    return float(value)


def check_run_device(device: Any, *models: nn.Module) -> torch.device | None:
    """``device=`` (where the inputs go and both runs compute) as a device every model is on.

    Example:
        >>> check_run_device("cpu", nn.Linear(1, 1))
        device(type='cpu')
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise HookscopeError(f"device={device!r} is not a torch device; pass device='cpu', 'cuda' or None") from None
    for side, m in zip(("model_a", "model_b"), models):
        found = {t.device for t in (*m.parameters(), *m.buffers())}
        if found and not any(_same_device(dev, d) for d in found):
            raise HookscopeError(
                f"diff(device={device!r}) moves the inputs where the models compute, but {side} is on "
                f"{', '.join(sorted(map(str, found)))}; pass that device, or to={device!r} to keep run A's "
                "records there")
    return dev


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def check_run_args(kwargs: Any, seed: Any, no_grad: Any, copy: Any, to: Any) -> None:
    """The keyword inputs and the knobs of how both runs are made."""
    model_kwargs(kwargs)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise HookscopeError(f"seed={seed!r} is not an int; pass seed=0 (the default), another int, or None")
    if not isinstance(no_grad, bool):
        raise HookscopeError(f"no_grad={no_grad!r} is not True or False; pass no_grad=False to run with autograd")
    if copy not in ("auto", "always", "never"):
        raise HookscopeError(f"copy={copy!r} is not a copy policy; use 'auto', 'always' or 'never'")
    if to is not None:
        try:
            torch.device(to)
        except (RuntimeError, TypeError, ValueError):
            raise HookscopeError(f"to={to!r} is not a torch device; pass to='cpu', 'cuda' or None") from None
