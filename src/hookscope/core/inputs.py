"""What an analysis hands the user's model: its keyword inputs (``kwargs=``, checked once) and its own
copy of the caller's tensors.

Every analysis that runs the model (summary, diff, cam, metrics) takes the model's keyword inputs as
one mapping, never as ``**kwargs`` of its own, so a typo of the analysis's own keyword is refused
instead of being forwarded to the model.

The caller's tensors, one rule: an analysis that runs the model itself hands it a private copy of
every tensor the caller gave, a fresh one for each run (:func:`private`). A model that writes into its
input (``x.div_(2)``, a ``ReLU(inplace=True)`` first) then changes neither the caller's tensors nor what
the next run sees. Context managers (``capture``, ``edit``, ``grads``, ``trace``, ``watch``) run
nothing themselves: the caller's own call passes the caller's tensors, as it would without hookscope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._tree import tree_map
from ..errors import HookscopeError

__all__ = ["model_args", "model_kwargs", "private"]


def model_args(inputs: Any) -> tuple[Any, ...]:
    """``inputs=`` (the model's positional inputs, one argument) as the tuple ``model(*args)`` takes:
    ``None`` for none, a tuple for several, anything else (a named tuple too) for the one input.

    Example:
        >>> x = torch.ones(1)
        >>> model_args(x) == (x,), model_args((x, x)) == (x, x), model_args(None)
        (True, True, ())
    """
    if inputs is None:
        return ()
    return inputs if type(inputs) is tuple else (inputs,)


def model_kwargs(kwargs: Any) -> dict[str, Any]:
    """``kwargs=`` as a dict of argument names (``None``: no keyword input), or one line saying how.

    Example:
        >>> model_kwargs(None), model_kwargs({"mask": 1})
        ({}, {'mask': 1})
        >>> model_kwargs(["mask"])
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: kwargs=['mask'] is not a mapping of argument names; pass the model's keyword inputs as kwargs={'mask': m}
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        shown = repr(kwargs) if len(repr(kwargs)) <= 60 else f"<{type(kwargs).__name__}>"
        raise HookscopeError(f"kwargs={shown} is not a mapping of argument names; pass the model's keyword "
                             "inputs as kwargs={'mask': m}")
    return dict(kwargs)


def private(inputs: Any, device: torch.device | str | None = None) -> Any:
    """A copy of every tensor in ``inputs`` (any nesting), for one run of the model: detached, on
    ``device`` when given (one copy, not two), needing a gradient where the caller's tensor did.

    Example:
        >>> x = torch.ones(2)
        >>> (c,), kw = private(((x,), {"scale": 2.0}))
        >>> c.div_(2); x.tolist(), kw
        tensor([0.5000, 0.5000])
        ([1.0, 1.0], {'scale': 2.0})
    """
    def copy(t: torch.Tensor) -> torch.Tensor:
        c = t.detach().to(device, copy=True) if device is not None else t.detach().clone()
        return c.requires_grad_() if t.requires_grad and (c.is_floating_point() or c.is_complex()) else c

    return tree_map(copy, inputs)
