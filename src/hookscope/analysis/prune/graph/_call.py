"""One intercepted torch call as the channel tracer sees it (``Call``), the name it is looked up by
in the handler table, and the fallback that blocks what an op reads. Must not import: the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._state import Tracer

__all__ = ["Call", "Handler", "op_name", "block_inputs", "unknown"]


@dataclass
class Call:
    """One intercepted call: the function, its name in the table, arguments and result.

    Example:
        >>> Call(torch.softmax, "softmax", (torch.ones(2),), {"dim": 0}, None).arg(1, "dim")
        0
    """

    func: Any
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    inplace: bool = False

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        """Argument ``key`` given by keyword or at position ``i``."""
        if key in self.kwargs:
            return self.kwargs[key]
        return self.args[i] if len(self.args) > i else default

    def tensors(self) -> Iterator[torch.Tensor]:
        """Tensors among the arguments (one level into lists and tuples)."""
        for a in (*self.args, *self.kwargs.values()):
            if isinstance(a, torch.Tensor):
                yield a
            elif isinstance(a, (list, tuple)):
                yield from (t for t in a if isinstance(t, torch.Tensor))


Handler = Callable[[Tracer, Call], None]

_DUNDER = {"add": "add", "radd": "add", "iadd": "add", "sub": "sub", "rsub": "sub", "isub": "sub",
           "mul": "mul", "rmul": "mul", "imul": "mul", "truediv": "div", "rtruediv": "div",
           "itruediv": "div", "div": "div", "rdiv": "div", "pow": "pow", "rpow": "pow",
           "matmul": "matmul", "rmatmul": "matmul", "neg": "neg", "abs": "abs", "getitem": "getitem",
           "setitem": "setitem", "floordiv": "floor_divide", "mod": "remainder"}


def op_name(func: Any) -> tuple[str, bool]:
    """The table name of ``func`` and whether it works in place.

    Example:
        >>> op_name(torch.Tensor.__iadd__), op_name(torch.Tensor.relu_), op_name(torch.nn.functional.linear)
        (('add', True), ('relu', True), ('linear', False))
    """
    n = getattr(func, "__name__", "") or ""
    if n == "__get__":
        return "get:" + getattr(getattr(func, "__self__", None), "__name__", "?"), False
    if n.startswith("__") and n.endswith("__"):
        core = n[2:-2]
        return _DUNDER.get(core, core), core.startswith("i") and core[1:] in _DUNDER
    if n.endswith("_") and not n.startswith("_"):
        return n[:-1], True
    return n, False


def block_inputs(tr: Tracer, c: Call, why: str) -> None:
    """Block what the op reads; its tensor outputs get one blocked id everywhere (a poison), so that
    whatever they later meet position by position is blocked too.

    Example:
        >>> tr = Tracer({}); x = torch.ones(2, 2); tr.set(x, tr.fresh(2).expand(2, 2)); out = x @ x
        >>> block_inputs(tr, Call(torch.matmul, "matmul", (x, x), {}, out), "read by matmul")
        >>> tr.reason_of(1), tr.reason_of(int(tr.shadow(out)[0, 0].abs()))
        ("read by matmul in '(model)'", "read by matmul in '(model)'")
    """
    if not any(tr.shadow(t) is not None for t in c.tensors()):
        return
    for t in c.tensors():
        tr.block_tensor(t, f"{why} in '{tr.here()}'")
    outs = [c.out] if isinstance(c.out, torch.Tensor) else [o for o in c.out if isinstance(o, torch.Tensor)] \
        if isinstance(c.out, (list, tuple)) else []
    for o in outs:
        if o.is_floating_point() and o.numel():
            poison = tr.fresh(1)
            tr.block(poison.long().tolist(), f"{why} in '{tr.here()}'")
            tr.set(o, (-poison).expand(o.shape))


def unknown(tr: Tracer, c: Call) -> None:
    """An op the tracer does not understand reads channels: they cannot be removed.

    Example:
        >>> tr = Tracer({}); x = torch.ones(3); tr.set(x, tr.fresh(3))
        >>> unknown(tr, Call(torch.fft.fft, "fft", (x,), {}, torch.fft.fft(x))); tr.reason_of(3)
        "read by fft (an op the channel tracer does not follow) in '(model)'"
    """
    block_inputs(tr, c, f"read by {c.name} (an op the channel tracer does not follow)")


