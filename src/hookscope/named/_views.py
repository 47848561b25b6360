"""How a named component is read from its module's input or output, and written back: a :class:`View`
(which element of a tuple output, and where each head's channels lie in the last dimension).

Must not import: ``selection``, capture, edit, analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import SelectionError

__all__ = ["View", "first_argument"]


class View(NamedTuple):
    """The tensor a component is, in its module's input or output.

    ``element``: which element of a tuple or list (``None``: the tensor itself, or element 0 where the
    module returns a tuple). ``heads`` 0: that tensor as it is. Otherwise its last dimension holds
    ``heads`` heads of ``d_head`` channels, read as ``[..., head, d_head]``: channel ``d`` of head ``h``
    is column ``offset + (h // group) * group_stride + (h % group) * head_stride + d`` (``group`` 0:
    every head in one group), and ``width`` is the size the last dimension must have (0: any).

    Example:
        >>> v = View(heads=2, d_head=3, head_stride=3, width=6)
        >>> v.read(torch.arange(6.0).reshape(1, 6)).tolist()
        [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]
        >>> str(View(element=1))
        'element 1'
    """

    element: int | None = None
    heads: int = 0
    d_head: int = 0
    offset: int = 0
    head_stride: int = 0
    group: int = 0
    group_stride: int = 0
    width: int = 0

    def __str__(self) -> str:
        where = f"element {self.element}" if self.element is not None else ""
        if not self.heads:
            return where or "as is"
        cols = f"{self.offset} + " if self.offset else ""
        if self.group and self.group < self.heads:
            cols += f"{self.group_stride}*(h//{self.group}) + {self.head_stride}*(h%{self.group}) + d"
        else:
            cols += f"{self.head_stride}*h + d"
        heads = f"heads {self.heads} x {self.d_head} at columns {cols} of {self.width}"
        return f"{where}, {heads}" if where else heads

    def columns(self, device: torch.device | None = None) -> torch.Tensor:
        """The column of each (head, channel): a ``[heads, d_head]`` index into the last dimension.

        Example:
            >>> View(heads=2, d_head=1, offset=1, head_stride=3).columns().tolist()
            [[1], [4]]
        """
        h = torch.arange(self.heads, device=device)
        group = self.group or self.heads
        start = self.offset + (h // group) * self.group_stride + (h % group) * self.head_stride
        return start[:, None] + torch.arange(self.d_head, device=device)[None, :]

    def main(self, value: Any) -> torch.Tensor:
        """The tensor this view reads before the heads are taken apart (its element, or the tensor)."""
        if isinstance(value, torch.Tensor) and self.element is None:
            return value
        if isinstance(value, (tuple, list)) and len(value) > (self.element or 0):
            found = value[self.element or 0]
            if isinstance(found, torch.Tensor):
                return found
        raise SelectionError(f"the view {self} finds no tensor in a {type(value).__name__}: the module's output "
                             "is not laid out as the family's row says")

    def _plain(self, width: int) -> bool:
        return not self.offset and self.head_stride == self.d_head and self.heads * self.d_head == width \
            and (not self.group or self.group >= self.heads)

    def read(self, value: Any) -> torch.Tensor:
        """The component in ``value`` (a module's first input or its output).

        Example:
            >>> View(element=0).read((torch.ones(2), None)).shape
            torch.Size([2])
        """
        t = self.main(value)
        if not self.heads:
            return t
        width = t.shape[-1] if t.dim() else 0
        if self.width and width != self.width:
            raise SelectionError(f"a tensor of {width} columns where the view {self} expects {self.width}: the "
                                 "model's heads are not the ones its config says (a pruned or changed layer?)")
        if self._plain(width):  # a view, no copy, where the heads lie side by side
            picked: torch.Tensor = t.unflatten(-1, (self.heads, self.d_head))
        else:
            picked = t[..., self.columns(t.device)]
        return picked

    def write(self, value: Any, new: torch.Tensor) -> Any:
        """``value`` with this view's component replaced by ``new``, out of place (the module's own
        tensor untouched, gradients flowing to ``new`` and to the rest of the tensor).

        Example:
            >>> v = View(heads=2, d_head=1, head_stride=1, width=2)
            >>> v.write(torch.zeros(1, 2), torch.tensor([[[1.0], [2.0]]])).tolist()
            [[1.0, 2.0]]
        """
        t = self.main(value)
        if self.heads and self._plain(t.shape[-1]) and new.shape == (*t.shape[:-1], self.heads, self.d_head):
            out = new.to(t.dtype).flatten(-2)  # the heads side by side: the new tensor itself, no copy
        elif self.heads:
            out = t.clone()
            out[..., self.columns(t.device)] = new.to(t.dtype)
        else:
            out = new.to(t.dtype).expand_as(t).clone() if new.shape != t.shape else new.to(t.dtype)
        if isinstance(value, torch.Tensor) and self.element is None:
            return out
        i = self.element or 0
        items = list(value)
        items[i] = out
        return tuple(items) if isinstance(value, tuple) else items


def first_argument(module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """What a module's input field means: its first positional argument, or, where the caller passed
    it by keyword, the argument of its ``forward``'s first parameter.

    Example:
        >>> first_argument(nn.Linear(2, 2), (), {"input": 5})
        5
    """
    if args:
        return args[0]
    params = list(inspect.signature(module.forward).parameters)
    if params and params[0] in kwargs:
        return kwargs[params[0]]
    raise SelectionError(f"{type(module).__name__} was called with no first argument to read "
                         f"(keywords {sorted(kwargs)}): its input is not the stream the row names")
