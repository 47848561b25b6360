"""The operations one forward pass makes, module by module, with their shapes.

Each row is one call of a torch function, ``Tensor`` method or operator that a module's own
``forward`` ran (``layer1.0::add``: the residual ``out += identity`` of a ResNet block), under the
name that selects it in :func:`~hookscope.capture`, :func:`~hookscope.edit`, ``--layers`` and the
rest: ``module::op``, ``module::op.1`` for its second use in one call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import checked
from .._tree import tensors
from ..core.inputs import model_kwargs, private
from ..core.hooks import HookGroup
from ..core.ops import SEP, call_name, current_function, written
from ..core.result import Result
from ..core.state import restored
from ..core.text import table
from ..selection import Layers, Selector, layers as select
from ._targets import call_model

__all__ = ["operations", "Operations", "OperationRow"]


@dataclass(frozen=True)
class OperationRow:
    """One call of one operation."""

    name: str
    call: int
    function: str
    in_place: bool
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[tuple[int, ...], ...]


def _shapes(obj: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t.shape) for t in tensors(obj))


def _function_text(func: Any) -> str:
    """``torch.conv2d``, ``F.relu``, ``Tensor.add_``, ``Tensor.__matmul__``: how the code called it."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__
    if name.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return "Tensor." + name.split(".", 1)[1]
    if name.startswith("_VariableFunctionsClass."):
        return "torch." + name.split(".", 1)[1]
    if getattr(func, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{'F' if module in ('torch.nn.functional', 'torch._C._nn') else module}.{name}"


class Operations(Result, Mapping[str, list[OperationRow]]):
    """Rows of :func:`operations`, also by name: ``ops["layer1.0::add"]`` is the list of its calls."""

    def __init__(self, rows: list[OperationRow]) -> None:
        self.rows = rows
        self._by_name: dict[str, list[OperationRow]] = {}
        for r in rows:
            self._by_name.setdefault(r.name, []).append(r)

    def __getitem__(self, name: str) -> list[OperationRow]:
        from ..core.result import missing

        if name not in self._by_name:
            raise missing(name, "operation", self._by_name)
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def table(self) -> str:
        """One row per call: name, call number, function, input and output shapes."""
        def shape_text(shapes: tuple[tuple[int, ...], ...]) -> str:
            return ", ".join("x".join(map(str, s)) or "scalar" for s in shapes) or "-"

        body = [[r.name, str(r.call), r.function + (" (in place)" if r.in_place else ""), shape_text(r.inputs),
                 shape_text(r.output)] for r in self.rows]
        return "\n".join(table(["operation", "call", "function", "inputs", "output"], body, left={0, 2, 3, 4},
                               pad_last=False))

    def to_dict(self) -> dict[str, Any]:
        """``{name: [{call, function, in_place, inputs, output}, ...]}``."""
        return {n: [{"call": r.call, "function": r.function, "in_place": r.in_place, "inputs": r.inputs,
                     "output": r.output} for r in rows] for n, rows in self._by_name.items()}


@checked
def operations(model: nn.Module, inputs: Any, *, layers: Layers | None = None,
               kwargs: Mapping[str, Any] | None = None) -> Operations:
    """List the operations one forward pass makes (in eval mode, without gradients; the model is
    left as it was).

    Args:
        model: any eager model.
        inputs: its positional input (a tensor, or a tuple of them).
        layers: whose operations: module selectors (``"layer1.*"``); every module by default.
        kwargs: keyword inputs of the model.

    Example:
        >>> import torch, hookscope
        >>> class Residual(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(4, 4)
        ...     def forward(self, x):
        ...         out = self.fc(x)
        ...         out += x
        ...         return torch.relu(out)
        >>> print(hookscope.operations(Residual(), torch.ones(2, 4)))
        operation   call  function                inputs       output
        -------------------------------------------------------------
        fc::linear     0  F.linear                2x4, 4x4, 4  2x4
        ::add          0  Tensor.add_ (in place)  2x4, 2x4     2x4
        ::relu         0  torch.relu              2x4          2x4
    """
    chosen = ["*"] if layers is None else list(layers) if isinstance(layers, (list, tuple)) else [layers]
    sites = [f"{s}{SEP}*" for s in chosen] if all(isinstance(s, str) for s in chosen) else []
    if not sites:
        from ..errors import HookscopeError

        raise HookscopeError("operations(layers=...) takes module names or globs (str), such as 'layer1.*'")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    rows: list[OperationRow] = []
    counts: dict[str, int] = {}

    def note(site: nn.Module, op_args: tuple[Any, ...], op_kwargs: dict[str, Any], out: Any) -> None:
        name = call_name(site, "")
        counts[name] = counts.get(name, -1) + 1
        func = current_function()
        writes = written(func, op_args, op_kwargs) is not None
        rows.append(OperationRow(name, counts[name], _function_text(func), writes,
                                 _shapes(op_args) + _shapes(op_kwargs), _shapes(out)))

    with HookGroup() as group, restored(model, train=False), torch.no_grad():
        for _, site in select(model, *sites):
            # own hook: shapes and the function only, nothing kept of the values
            group.add(site.register_forward_hook(note, with_kwargs=True))
        call_model(model, *private((args, model_kwargs(kwargs))))
    return Operations(rows)
