"""The settings of :func:`hookscope.cam` that only some methods read: refused for the others, checked, defaults filled."""

from __future__ import annotations

import math
from typing import Any

from ...errors import HookscopeError, SettingError, did_you_mean
from ._formulas import KERNELS
from ._methods import TABLE, readers

__all__ = ["check_settings"]


def _number(name: str, v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise HookscopeError(f"{name}={v!r} must be a finite number: {what}")
    return float(v)


def _ranks(v: Any) -> tuple[int, ...]:
    ranks = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v) if isinstance(v, (list, tuple)) else None
    if ranks is not None and not ranks:
        raise HookscopeError("comparison=[] names no class to compare the target with; pass ranks such as "
                             "comparison=[1, 2, 3] (1: the class whose logit is nearest the target's), or leave it out")
    if ranks is None or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise HookscopeError(f"comparison={v!r} must be ranks of the classes nearest the target, ints from 1 "
                             "(the nearest), e.g. comparison=[1, 2, 3]")
    if len(set(ranks)) != len(ranks):
        raise HookscopeError(f"comparison={list(ranks)} names a rank twice; give each once")
    return ranks


def _check(k: str, v: Any) -> Any:
    if k == "ratio":
        r = _number(k, v, "the share of the channels ablationcam ablates, in (0, 1]")
        if not 0 < r <= 1:
            raise HookscopeError(f"ratio={v!r} is outside (0, 1]: it is the share of the channels ablationcam "
                                 "ablates (1: all of them)")
        return r
    if k == "kernel":
        if v not in KERNELS:
            raise HookscopeError(f"kernel={v!r} is not a kernel of kpcacam.{did_you_mean(str(v), KERNELS)} "
                                 f"Use one of {', '.join(KERNELS)}")
        return v
    if k == "degree":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HookscopeError(f"degree={v!r} must be a positive int: the power of kpcacam's polynomial kernel")
        return v
    if k == "seed":
        if isinstance(v, bool) or not isinstance(v, int):
            raise HookscopeError(f"seed={v!r} must be an int: the seed of randomcam's channel weights")
        return v
    if k == "comparison":
        return _ranks(v)
    if k in ("gamma", "coef0", "alpha", "sigmas"):
        return _number(k, v, {"gamma": "the scale of kpcacam's kernel", "coef0": "the offset of kpcacam's kernel",
                              "alpha": "how much finercam subtracts of the compared classes' logits",
                              "sigmas": "fem's threshold, in standard deviations above each channel's mean"}[k])
    return v


def check_settings(method: str, given: dict[str, Any]) -> dict[str, Any]:
    """The settings ``method`` reads, given or its defaults, checked; one line for a setting it does not read.

    Example:
        >>> check_settings("kpcacam", {"kernel": "rbf", "gamma": None, "alpha": None})
        {'kernel': 'rbf', 'gamma': None, 'degree': 3, 'coef0': 1.0}
    """
    m = TABLE[method]
    for k, v in given.items():
        if v is not None and k not in m.reads:
            reading = readers(k)
            raise SettingError(f"{k}= is not a setting of {method} ({', '.join(reading)} read"
                               f'{"s" if len(reading) == 1 else ""} it); drop it or use method="{reading[0]}"')
    out = dict(m.defaults)
    for k in m.reads:
        v = given.get(k)
        if v is not None:
            out[k] = _check(k, v)
        elif k not in out and k != "progress":
            out[k] = None
    return out
