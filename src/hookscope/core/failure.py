"""One place that says where a model's forward pass failed: one line, always a ForwardError.

"the forward pass failed in 'layer2.0.conv1' (Conv2d), which received input[0] 1x3x32x32 float32,
after 'layer1.1.bn2' had run: <the model's message>; check the example input's shape and dtype".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._tree import paths
from ..errors import ForwardError
from .ops import OpSite, call_name, current_function
from .text import dtype_text, first_line, shape_text

__all__ = ["received", "module_label", "forward_error"]


def received(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, limit: int = 4) -> str:
    """What a call received, for a message: ``"input[0] 1x5 float32, input.mask 1x5 bool"``.

    Example:
        >>> received((torch.zeros(1, 5),), {"mask": torch.ones(1, 5, dtype=torch.bool)})
        'input[0] 1x5 float32, input.mask 1x5 bool'
    """
    found = [(f"input[{i}]{p}", t) for i, a in enumerate(args) for p, t in paths(a)]
    found += [(f"input.{k}{p}", t) for k, v in (kwargs or {}).items() for p, t in paths(v)]
    shown = [f"{p} {_describe(t)}" for p, t in found[:limit]]
    more = f", ... ({len(found)} tensors)" if len(found) > limit else ""
    return ", ".join(shown) + more if shown else "no tensor"


def _describe(t: torch.Tensor) -> str:
    dtype = dtype_text(t.dtype)
    if t.is_nested:  # a nested tensor has no single shape
        try:
            return f"nested tensor of {t.size(0)} {dtype}"
        except RuntimeError:  # a strided nested tensor does not say even that
            return f"nested tensor {dtype}"
    return f"{shape_text(tuple(t.shape))} {dtype}"


def module_label(name: str, module: torch.nn.Module, model_name: str = "") -> str:
    """``'layer1.0' (BasicBlock)``, or ``ResNet's own forward`` for the root.

    Example:
        >>> module_label("fc", torch.nn.Linear(1, 1))
        "'fc' (Linear)"
    """
    if isinstance(module, OpSite):  # inside its hooks: the operation that runs now
        func = current_function()
        return f"{call_name(module, name)!r} ({getattr(func, '__name__', None) or 'an operation'})"
    if not name:
        return f"{model_name or type(module).__name__}'s own forward"
    return f"{name!r} ({type(module).__name__})"


def forward_error(
    exc: BaseException,
    where: str | None,
    *,
    got: str = "",
    after: Sequence[str] | None = (),
    run: str = "",
) -> ForwardError:
    """The one-line :class:`ForwardError` for a failed forward pass (raise it ``from exc``).

    Args:
        exc: what the model raised.
        where: the module that was running (:func:`module_label`), or ``None`` when none had started.
        got: what it received (:func:`received`).
        after: names of the modules that had finished before it, in order (the last is named);
            ``None`` when that was not tracked (the clause is left out).
        run: a prefix naming the run, e.g. ``"run B: "`` in a comparison.

    Example:
        >>> e = forward_error(RuntimeError("shape mismatch\\nmore"), "'fc' (Linear)",
        ...                   got="input[0] 1x3 float32", after=["conv", "pool"])
        >>> str(e)  # doctest: +NORMALIZE_WHITESPACE
        "the forward pass failed in 'fc' (Linear), which received input[0] 1x3 float32, after
        'pool' had run: RuntimeError: shape mismatch; check the example input's shape and dtype"
    """
    detail = f"{type(exc).__name__}: {first_line(exc)}"
    if where is None:
        place = "before any module ran"
    else:
        if after is None:
            done = ""
        elif after:
            done = f", after {after[-1]!r} had run"
        else:
            done = ", before any other module had finished"
        place = f"in {where}, which received {got or 'no tensor'}{done}"
    return ForwardError(f"{run}the forward pass failed {place}: {detail}; "
                        "check the example input's shape and dtype")
