"""Rows of dataclasses as JSON-safe dicts (NaN and infinities as strings), for every analysis."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["json_rows"]


def _clean(v: Any) -> Any:
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def json_rows(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """``[dataclasses.asdict(r)]`` with non-finite floats written as ``"nan"``, ``"inf"``, ``"-inf"``.

    Example:
        >>> @dataclasses.dataclass
        ... class R:
        ...     x: float
        >>> json_rows([R(float("inf"))])
        [{'x': 'inf'}]
    """
    return [{k: _clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows]
