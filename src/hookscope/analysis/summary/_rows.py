"""One record per module call: :class:`Call` while the pass runs, :class:`Row` once it is over.

The hooks fill a :class:`Call` with metadata only (shapes, dtypes, counts), never a tensor; after
the pass, :func:`rows_of` joins each call with the static facts of its module (parameters,
buffers, children, names it is also reachable under) into one :class:`Row`, and puts the modules
the pass never reached where they sit in the tree. Nothing here registers a hook or runs a model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ...core.text import dtype_text
from ...selection import aliases_of
from .._sparsity import module_zeros

__all__ = ["Shape", "Call", "Row", "numel", "nbytes", "described", "rows_of"]

Shape = tuple[int, ...]
Named = list[tuple[str, nn.Module]]


def numel(t: torch.Tensor) -> int:
    """Elements of ``t``; 0 for a lazy parameter that has no shape yet.

    Example:
        >>> numel(torch.zeros(2, 3)), numel(nn.LazyLinear(4).weight)
        (6, 0)
    """
    return 0 if is_lazy(t) else t.numel()


def nbytes(t: torch.Tensor) -> int:
    """Bytes ``t``'s elements take (a meta tensor counts as if it held them)."""
    return numel(t) * t.element_size()


def described(ts: list[torch.Tensor]) -> list[tuple[Shape, str]]:
    """Shape and dtype name of each tensor: what a row keeps of a call's inputs and outputs.

    Example:
        >>> described([torch.zeros(2, 3), torch.tensor(1)])
        [((2, 3), 'float32'), ((), 'int64')]
    """
    return [(tuple(t.shape), dtype_text(t.dtype)) for t in ts]


class Call:
    """What the hooks learn about one call while the forward pass runs (metadata only)."""

    __slots__ = ("name", "inputs", "ruled", "outputs", "own_macs", "macs", "uncounted", "partial", "nested",
                 "activation_bytes")

    def __init__(self, name: str, inputs: list[tuple[Shape, str]], ruled: bool) -> None:
        self.name = name
        self.inputs = inputs
        self.ruled = ruled  # own_macs has a rule for the module: the products inside it are its own
        self.outputs: list[tuple[Shape, str]] | None = None  # None until the call returns
        self.own_macs = 0  # the rule's count, or the products of functions it called itself
        self.macs = 0  # nested calls included
        self.uncounted: dict[str, None] = {}  # products it computed that could not be counted
        self.partial = False  # macs is a lower bound: a product here or in a nested call not counted
        self.nested = 0
        self.activation_bytes = 0


@dataclass
class Row:
    """One call of one module, or a module the forward pass never reached (``called=False``).

    Counts are numbers of elements. ``params`` counts the module's own parameters (those it shares
    with a module listed earlier are named in ``shared``); ``params_total`` and ``trainable_total``
    count every distinct parameter of its subtree once. ``macs`` are the multiply-adds of this call,
    calls nested inside it included: the module's rule for common layers, else the matrix products
    of the functions its own forward calls (``@``, ``bmm``, ``F.linear``, ``einsum``, attention...),
    counted in the innermost module that runs them.
    ``uncounted`` names the products this call computed but could not count (``einsum`` of three
    operands, ``tensordot``...); ``macs_partial`` says ``macs`` is then only a lower bound, also
    when the uncounted product ran in a nested call. ``zeros`` counts the zero elements of the
    module's own parameters as ``params`` counts them, a masked parameter (``weight_orig`` with a
    ``weight_mask`` buffer, as ``torch.nn.utils.prune`` leaves it) as the weight it computes with
    (``None``: values that cannot be read, e.g. on the meta device); ``masked`` names those parameters.
    """

    name: str
    type: str
    depth: int
    training: bool
    parameters: dict[str, Shape]
    buffers: dict[str, Shape]
    children: tuple[str, ...]
    params: int
    params_total: int
    trainable_total: int
    shared: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    called: bool = False
    call: int = 0
    calls: int = 0
    input_shapes: list[Shape] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    output_shapes: list[Shape] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    macs: int = 0
    macs_partial: bool = False
    uncounted: tuple[str, ...] = ()
    zeros: int | None = 0
    masked: tuple[str, ...] = ()

    @property
    def sparsity(self) -> float | None:
        """Fraction of the module's own parameter elements that are zero (0.0 without parameters)."""
        if self.zeros is None:
            return None
        return self.zeros / self.params if self.params else 0.0

    @property
    def frozen_total(self) -> int:
        """Distinct parameter elements of the subtree that do not require a gradient."""
        return self.params_total - self.trainable_total

    @property
    def buffer_numel(self) -> int:
        """Elements in the module's own buffers."""
        return sum(math.prod(s) for s in self.buffers.values())

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data (tuples become lists in JSON).

        Example:
            >>> from hookscope import summary
            >>> d = summary(nn.Linear(4, 2), torch.zeros(3, 4))[""][0].to_dict()
            >>> d["type"], d["output_shapes"], d["params_total"], d["macs"]
            ('Linear', [(3, 2)], 10, 24)
        """
        return {**dataclasses.asdict(self), "frozen_total": self.frozen_total, "sparsity": self.sparsity}


# --- the static facts of each module ---------------------------------------------------------------
def _own_parameters(name: str, m: nn.Module, owner: dict[int, str]) -> tuple[dict[str, Shape], dict[str, str], int]:
    """``m``'s own parameters: shapes, those first seen under another name (``owner`` is updated),
    and their elements, each tensor once."""
    own: dict[str, Shape] = {}
    shared: dict[str, str] = {}
    distinct: dict[int, torch.Tensor] = {}
    for local, p in m._parameters.items():
        if p is None:
            continue
        own[local] = () if is_lazy(p) else tuple(p.shape)
        if id(p) in owner:
            shared[local] = owner[id(p)]
        else:
            owner[id(p)] = f"{name}.{local}" if name else local
        distinct[id(p)] = p
    return own, shared, sum(numel(p) for p in distinct.values())


def _templates(model: nn.Module, selected: Named) -> dict[str, Row]:
    """One row per module with its static facts (read after the pass, once lazy modules are built)."""
    canonical = {id(m): n for n, m in selected}
    aliases: dict[str, list[str]] = {}
    for alias, name in aliases_of(model, selected).items():
        aliases.setdefault(name, []).append(alias)
    owner: dict[int, str] = {}  # parameter -> the qualified name it was first seen under
    out: dict[str, Row] = {}
    for name, m in selected:
        own, shared, params = _own_parameters(name, m, owner)
        subtree = list(m.parameters())  # distinct by identity, as PyTorch counts them
        zeros = module_zeros(m)
        out[name] = Row(
            name=name,
            type=type(m).__name__,
            depth=name.count(".") + 1 if name else 0,
            training=m.training,
            parameters=own,
            buffers={k: tuple(b.shape) for k, b in m._buffers.items() if b is not None and not is_lazy(b)},
            children=tuple(canonical[id(c)] for c in dict.fromkeys(m.children())),
            params=params,
            params_total=sum(numel(p) for p in subtree),
            trainable_total=sum(numel(p) for p in subtree if p.requires_grad),
            shared=shared,
            aliases=tuple(aliases.get(name, ())),
            zeros=zeros.zeros,
            masked=zeros.masked,
        )
    return out


def _place_never_called(rows: list[Row], templates: dict[str, Row], order: list[str]) -> None:
    """Put each module the pass never reached where it sits in the tree, after its previous sibling."""
    called = {r.name for r in rows}
    for i, name in enumerate(order):
        if name in called:
            continue
        row = templates[name]
        prev = order[i - 1] if i else None
        if prev is None:
            rows.insert(0, row)
            continue
        if prev == "" or name.startswith(prev + "."):  # its parent: right after the parent's row
            hits = [j for j, r in enumerate(rows) if r.name == prev][:1]
        else:  # after the whole subtree of the sibling before it
            sibling = ".".join(prev.split(".")[: row.depth])
            hits = [j for j, r in enumerate(rows) if r.name == sibling or r.name.startswith(sibling + ".")]
        rows.insert(hits[-1] + 1 if hits else len(rows), row)


def rows_of(model: nn.Module, selected: Named, calls: list[Call]) -> list[Row]:
    """A row per call in the order calls started, and one per module never called, in tree order.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2))
        >>> call = Call("", [((1, 2), "float32")], ruled=False)
        >>> [(r.name, r.called) for r in rows_of(net, [("", net), ("0", net[0])], [call])]
        [('', True), ('0', False)]
    """
    templates = _templates(model, selected)
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.name] = counts.get(c.name, 0) + 1
    rows: list[Row] = []
    index: dict[str, int] = {}
    for c in calls:
        index[c.name] = index.get(c.name, -1) + 1
        outs = c.outputs or []
        rows.append(dataclasses.replace(
            templates[c.name], called=True, call=index[c.name], calls=counts[c.name],
            input_shapes=[s for s, _ in c.inputs], input_dtypes=[d for _, d in c.inputs],
            output_shapes=[s for s, _ in outs], output_dtypes=[d for _, d in outs], macs=c.macs,
            macs_partial=c.partial, uncounted=tuple(c.uncounted),
        ))
    _place_never_called(rows, templates, [n for n, _ in selected])
    return rows
