"""What an analysis hands the user's model besides positional inputs: ``kwargs=``, checked once.

Every analysis that runs the model (summary, diff, cam, metrics) takes the model's keyword inputs as
one mapping, never as ``**kwargs`` of its own, so a typo of the analysis's own keyword is refused
instead of being forwarded to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import HookscopeError

__all__ = ["model_kwargs"]


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
