"""Summarise a model from one real forward pass: module tree, shapes, parameters, buffers, mult-adds.

Parameters are counted by identity, so a tensor shared by several modules (tied embeddings, one
module under two parents) counts once in every total, as ``model.parameters()`` counts it; a module
called several times gets one row per call, its parameters counted once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .._rng import kept_rng, rng_devices
from .._tree import tensors, tree_map
from ..capture import check_hookable
from ..core.compiled import HookRefresh, eager
from ..core.hooks import HookGroup
from ..errors import HookscopeError, did_you_mean
from ..selection import layers, unwrap
from ._macs import ProductCounter, has_rule, own_macs

__all__ = ["summary", "Summary", "Row", "Totals", "own_macs"]

Shape = tuple[int, ...]


@dataclass
class Row:
    """One call of one module, or a module the forward pass never reached (``called=False``).

    Counts are numbers of elements. ``params`` counts the module's own parameters (those it shares
    with a module listed earlier are named in ``shared``); ``params_total`` and ``trainable_total``
    count every distinct parameter of its subtree once. ``macs`` are the multiply-adds of this call,
    calls nested inside it included: the module's rule for common layers, else the matrix products
    of the functions its own forward calls (``@``, ``F.linear``, ``einsum``, attention...).
    ``uncounted`` names the products this call computed but could not count (``einsum`` of three
    operands, ``tensordot``...); ``macs_partial`` says ``macs`` is then only a lower bound, also
    when the uncounted product ran in a nested call.
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
            >>> d = summary(nn.Linear(4, 2), torch.zeros(3, 4)).row("").to_dict()
            >>> d["type"], d["output_shapes"], d["params_total"], d["macs"]
            ('Linear', [(3, 2)], 10, 24)
        """
        return {**dataclasses.asdict(self), "frozen_total": self.frozen_total}


@dataclass(frozen=True)
class Totals:
    """Whole-model figures: each parameter and buffer tensor once, the mult-adds of every call.

    ``macs_partial``: some call computed a product that could not be counted (see ``Row.uncounted``),
    so ``macs`` is a lower bound.
    """

    params: int
    trainable: int
    frozen: int
    param_bytes: int
    buffers: int
    buffer_numel: int
    buffer_bytes: int
    activation_bytes: int
    input_bytes: int
    macs: int
    calls: int
    modules: int
    not_called: int
    macs_partial: bool = False


class Summary:
    """The result of :func:`summary`: ``rows`` in execution order, ``totals``, text and JSON.

    ``parameters`` and ``buffers`` map every qualified name to its shape, each tensor once, as
    ``model.named_parameters()`` / ``named_buffers()`` name them; ``modules`` maps every module name
    to its type. ``rows`` holds the rows down to ``depth``; :meth:`row` finds any row.

    Example:
        >>> s = summary(nn.Sequential(nn.Linear(4, 8), nn.ReLU()), torch.zeros(3, 4))
        >>> s.totals.params, s.row("0").output_shapes, s.modules
        (40, [(3, 8)], {'': 'Sequential', '0': 'Linear', '1': 'ReLU'})
    """

    def __init__(self, model: str, inputs: list[tuple[Shape, str]], rows: list[Row], totals: Totals,
                 modules: dict[str, str], parameters: dict[str, Shape], buffers: dict[str, Shape],
                 depth: int | None) -> None:
        self.model = model
        self.inputs = inputs
        self.totals = totals
        self.modules = modules
        self.parameters = parameters
        self.buffers = buffers
        self.depth = depth
        self.all_rows = rows
        self.rows = rows if depth is None else [r for r in rows if r.depth <= depth]

    def row(self, name: str, *, call: int = 0) -> Row:
        """The row of call number ``call`` (from 0) of module ``name`` (``""`` is the model).

        Example:
            >>> relu = nn.ReLU()  # one module called twice: a row per call
            >>> s = summary(nn.Sequential(relu, nn.Flatten(), relu), torch.zeros(2, 3, 4))
            >>> s.row("0").output_shapes, s.row("0", call=1).output_shapes
            ([(2, 3, 4)], [(2, 12)])
        """
        found = [r for r in self.all_rows if r.name == name]
        if not found:
            raise HookscopeError(
                f"the summary has no module {name!r}.{did_you_mean(name, self.modules)} "
                "List them with summary.modules"
            )
        if not 0 <= call < len(found):
            raise HookscopeError(f"{name!r} has {len(found)} row(s); pass call= from 0 to {len(found) - 1}")
        return found[call]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers, strings), ready for ``json.dumps``.

        Example:
            >>> summary(nn.Linear(4, 2), torch.zeros(3, 4)).to_dict()["totals"]["macs"]
            24
        """
        return {
            "model": self.model,
            "inputs": [{"shape": list(s), "dtype": d} for s, d in self.inputs],
            "depth": self.depth,
            "rows": [r.to_dict() for r in self.rows],
            "totals": dataclasses.asdict(self.totals),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text.

        Example:
            >>> data = json.loads(summary(nn.Linear(4, 2), torch.zeros(3, 4)).to_json())
            >>> data["rows"][0]["output_shapes"], data["totals"]["params"]
            ([[3, 2]], 10)
        """
        return json.dumps(self.to_dict(), indent=indent)

    def to_text(self) -> str:
        """The table for people: the module tree with shapes, counts, mult-adds and modes, then totals.

        Example:
            >>> print(summary(nn.Linear(4, 2).eval(), torch.zeros(3, 4)).to_text())
            Linear: input 3x4 float32
            =====================================================================================
            Layer (type)  Output shape  Params  Total  Trainable  Buffers  Mult-adds  Mode  Notes
            =====================================================================================
            Linear        3x2               10     10        yes        0         24  eval
            =====================================================================================
            Params: 10; trainable 10, frozen 0 (shared tensors counted once)
            Param bytes: 40 B
            Buffers: 0 tensors, 0 elements, 0 B
            Mult-adds: 24
            Input bytes: 48 B
            Activation bytes (new outputs of innermost calls): 24 B
            Module calls: 1; modules: 1, never called: 0
            =====================================================================================
            <BLANKLINE>
        """
        return _render(self)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"Summary({self.model}, {len(self.all_rows)} rows, {self.totals.params:,} params)"


# --- the forward pass -----------------------------------------------------------------------------
def _described(ts: list[torch.Tensor]) -> list[tuple[Shape, str]]:
    return [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in ts]


def _numel(t: torch.Tensor) -> int:
    return 0 if is_lazy(t) else t.numel()


def _nbytes(t: torch.Tensor) -> int:
    return _numel(t) * t.element_size()


def _storage(t: torch.Tensor) -> int | None:
    try:
        storage = t.untyped_storage()
        # meta tensors have no data (every data_ptr is 0): tell their storages apart by identity
        return storage._cdata if t.device.type == "meta" else storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and some subclass tensors have no storage
        return None


class _Call:
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


_REMOVED: Any = object()  # the output a with_kwargs forward hook gets when it was removed mid-call


class _Tracer:
    """A pre-hook and a hook on every module; calls are listed in the order they start.

    The hooks run eagerly (a graph break under ``torch.compile``, never traced) and do nothing once
    ``group`` is removed: PyTorch may still call them, without ``kwargs``, in a thread that was
    between a module's hooks at that moment.
    """

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self._stacks: dict[int, list[_Call]] = {}  # per thread: DataParallel runs replicas in threads
        self._group = HookGroup()

    def register(self, selected: list[tuple[str, nn.Module]], group: HookGroup) -> None:
        self._group = group
        for name, module in selected:
            group.add(module.register_forward_pre_hook(eager(self._pre(name)), with_kwargs=True))
            group.add(module.register_forward_hook(eager(self._post(name)), with_kwargs=True))

    def open_calls(self) -> list[_Call]:
        return self._stacks.get(threading.get_ident(), [])

    def product(self, op: str, macs: int | None) -> None:
        """A matrix product a function computed (see ProductCounter): the innermost open call's."""
        stack = self.open_calls()
        if not stack or stack[-1].ruled:  # the module's rule counts it already
            return
        if macs is None:
            stack[-1].uncounted[op] = None
        else:
            stack[-1].own_macs += macs

    def _pre(self, name: str) -> Any:
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            if kwargs is None or self._group.closed:  # removed since this call began
                return
            stack = self._stacks.setdefault(threading.get_ident(), [])
            if stack:
                stack[-1].nested += 1
            call = _Call(name, _described(list(tensors((args, kwargs)))), has_rule(module))
            self.calls.append(call)
            stack.append(call)

        return pre

    def _post(self, name: str) -> Any:
        def post(module: nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _REMOVED) -> None:
            if output is _REMOVED or self._group.closed:  # removed mid-call: called as (m, args, output)
                return
            stack = self._stacks.get(threading.get_ident(), [])
            while stack and stack[-1].name != name:
                stack.pop()  # a call that raised inside a try/except of the model never returned
            if not stack:
                return
            call = stack.pop()
            outs = list(tensors(output))
            call.outputs = _described(outs)
            call.own_macs += own_macs(module, args, kwargs, output)
            call.macs += call.own_macs
            call.partial = call.partial or bool(call.uncounted)
            if not call.nested:  # an innermost call: its new outputs are the activations
                seen = {_storage(t) for t in tensors((args, kwargs))}  # in place or a view: not new
                for t in outs:
                    key = _storage(t)
                    if key is None or key not in seen:
                        call.activation_bytes += _nbytes(t)
                        seen.add(key)
            if stack:
                stack[-1].macs += call.macs
                stack[-1].partial = stack[-1].partial or call.partial

        return post


def _fmt_shape(s: Shape) -> str:
    return "x".join(str(d) for d in s) if s else "scalar"


def _failure(e: Exception, tracer: _Tracer, model_name: str) -> HookscopeError:
    """One line: where the forward pass failed, what reached it, what ran before (torchinfo's idea)."""
    done = [c.name for c in tracer.calls if c.outputs is not None and c.name]
    before = "no layer completed before it"
    if done:
        more = f" (the last 4 of {len(done)})" if len(done) > 4 else ""
        before = f"layers executed before it: {', '.join(done[-4:])}{more}"
    detail = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    open_calls = tracer.open_calls()
    if not open_calls:
        return HookscopeError(f"the forward pass of {model_name} failed before any module ran ({detail}); "
                              "check the example input")
    call = open_calls[-1]
    where = f"{call.name!r}" if call.name else f"{model_name}'s own forward"
    got = ", ".join(f"{_fmt_shape(s)} {d}" for s, d in call.inputs) or "no tensor"
    return HookscopeError(
        f"the forward pass failed in {where}, which received {got} ({detail}); {before}. "
        "Check the example input's shape and dtype"
    )


_SavedBuffer = tuple[nn.Module, str, torch.Tensor, torch.Tensor]


def _snapshot_buffers(inner: nn.Module) -> list[_SavedBuffer]:
    """Buffers a forward pass in training mode may update (BatchNorm's running statistics)."""
    if not any(m.training for m in inner.modules()):
        return []
    return [(m, k, b, b.detach().clone()) for m in inner.modules() for k, b in m._buffers.items()
            if b is not None and not is_lazy(b)]


def _restore_buffers(saved: list[_SavedBuffer]) -> None:
    with torch.no_grad():
        for m, k, original, copy in saved:
            m._buffers[k] = original  # also undoes a forward that rebinds the buffer
            original.copy_(copy)


def _model_device(model: nn.Module) -> torch.device | None:
    for t in list(model.parameters()) + list(model.buffers()):
        if not is_lazy(t):
            return t.device
    return None


def _target_device(device: torch.device | str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise HookscopeError(f"device={device!r} is not a device PyTorch knows; "
                             "pass 'cpu', 'cuda', 'cuda:1', 'mps' or a torch.device") from None


def _moved(inputs: Any, target: torch.device) -> Any:
    try:
        return tree_map(lambda t: t.to(target), inputs)
    except (RuntimeError, AssertionError) as e:  # a device this build or machine does not have
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise HookscopeError(f"the example input cannot be moved to device={str(target)!r} ({detail}); "
                             "pass a device this machine has, or None for the model's own") from None


def summary(
    model: nn.Module,
    *inputs: Any,
    depth: int | None = None,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> Summary:
    """Run one forward pass (under ``torch.no_grad()``) and summarise every module.

    Per module call, in execution order: qualified name (indented by its depth in the module
    tree), type, the shape of every tensor of its (nested) output, own and total parameters
    (trainable / frozen), buffers, train/eval flag and multiply-adds; modules the pass never
    reached get a row with ``called=False``. Totals count each parameter tensor once, however many
    modules share it.

    Multiply-adds come from a rule per common layer (convolutions, linear, bilinear,
    ``MultiheadAttention``, recurrent layers), and, in any other module, from the matrix products
    of the torch functions its own forward calls (``@``, ``matmul``, ``bmm``, ``einsum`` of two
    operands, ``F.linear``, ``F.conv*``, ``F.scaled_dot_product_attention``), seen by a torch
    function mode active during this pass only. A product it cannot count (``einsum`` of three
    operands, ``tensordot``) is named in ``Row.uncounted`` and the counts above it are marked as
    lower bounds.

    The train/eval flags are left as they are; in training mode, buffers the pass updates
    (BatchNorm's running statistics) are restored afterwards, and so are the caller's random
    number generators (dropout draws). Every hook is removed, also on errors.

    Args:
        model: any ``nn.Module``; DataParallel / DDP / ``torch.compile`` wrappers are seen through
            and rows are named as in the model inside.
        *inputs: the example positional inputs of ``model(...)``.
        depth: keep rows down to this depth of the module tree (the model is 0); totals always
            cover every module.
        device: move tensor inputs there first (default: the device of the model's first parameter
            or buffer). The model itself is never moved.
        **kwargs: keyword inputs of ``model(...)``.

    Returns:
        A :class:`Summary`: ``print(s)`` shows the table, ``s.to_json()`` gives it to programs.

    Raises:
        HookscopeError: ``device`` is not a device this machine has; or the forward pass failed
            (for example an input of the wrong shape or dtype): the message names the module where
            it failed, the inputs that reached it and the layers executed before it.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> s = summary(net, torch.randn(3, 4))
        >>> s.totals.params, s.totals.macs, s.row("2").output_shapes
        (58, 144, [(3, 2)])
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise HookscopeError(f"depth={depth!r} is not a depth; pass an int >= 0 (0: the model only) or None")
    if not inputs and not kwargs:
        raise HookscopeError("summary() runs the model once and needs an example input: "
                             "summary(model, torch.randn(1, 3, 224, 224))")
    inner, _ = unwrap(model)
    selected = layers(model, lambda name, module: True)  # every module once, the model itself too
    check_hookable(selected)
    target = _target_device(device) if device is not None else _model_device(inner)
    args, kw = (inputs, kwargs) if target is None else _moved((inputs, kwargs), target)
    rngs = rng_devices([*inner.parameters(), *inner.buffers(), *tensors((args, kw))])
    tracer = _Tracer()
    saved = _snapshot_buffers(inner)
    group = HookGroup()
    refresh = HookRefresh(model)  # hooks added to a compiled model that already ran must take effect
    try:
        tracer.register(selected, group)
        refresh.open()
        # dropout draws from the caller's generators: put back, as if the pass had not run
        with kept_rng(rngs), torch.no_grad(), ProductCounter(tracer.product):
            model(*args, **kw)
    except HookscopeError:
        raise
    except Exception as e:
        raise _failure(e, tracer, type(inner).__name__) from e
    finally:
        group.remove()
        refresh.close()
        _restore_buffers(saved)
    return _assemble(inner, selected, tracer, list(tensors((args, kw))), depth)


# --- from calls to rows ---------------------------------------------------------------------------
def _templates(inner: nn.Module, selected: list[tuple[str, nn.Module]]) -> dict[str, Row]:
    """One row per module with its static facts (read after the pass, once lazy modules are built)."""
    canonical = {id(m): n for n, m in selected}
    aliases: dict[str, list[str]] = {}
    for n, m in inner.named_modules(remove_duplicate=False):
        if n != canonical[id(m)]:
            aliases.setdefault(canonical[id(m)], []).append(n)
    owner: dict[int, str] = {}  # parameter -> the qualified name it was first seen under
    out: dict[str, Row] = {}
    for name, m in selected:
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
        subtree = list(m.parameters())  # distinct by identity, as PyTorch counts them
        out[name] = Row(
            name=name,
            type=type(m).__name__,
            depth=name.count(".") + 1 if name else 0,
            training=m.training,
            parameters=own,
            buffers={k: tuple(b.shape) for k, b in m._buffers.items() if b is not None and not is_lazy(b)},
            children=tuple(canonical[id(c)] for c in dict.fromkeys(m.children())),
            params=sum(_numel(p) for p in distinct.values()),
            params_total=sum(_numel(p) for p in subtree),
            trainable_total=sum(_numel(p) for p in subtree if p.requires_grad),
            shared=shared,
            aliases=tuple(aliases.get(name, ())),
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


def _assemble(inner: nn.Module, selected: list[tuple[str, nn.Module]], tracer: _Tracer,
              inputs: list[torch.Tensor], depth: int | None) -> Summary:
    templates = _templates(inner, selected)
    counts: dict[str, int] = {}
    for c in tracer.calls:
        counts[c.name] = counts.get(c.name, 0) + 1
    rows: list[Row] = []
    index: dict[str, int] = {}
    for c in tracer.calls:
        index[c.name] = index.get(c.name, -1) + 1
        outs = c.outputs or []
        rows.append(dataclasses.replace(
            templates[c.name], called=True, call=index[c.name], calls=counts[c.name],
            input_shapes=[s for s, _ in c.inputs], input_dtypes=[d for _, d in c.inputs],
            output_shapes=[s for s, _ in outs], output_dtypes=[d for _, d in outs], macs=c.macs,
            macs_partial=c.partial, uncounted=tuple(c.uncounted),
        ))
    _place_never_called(rows, templates, [n for n, _ in selected])
    params, buffers = list(inner.parameters()), list(inner.buffers())
    totals = Totals(
        params=sum(_numel(p) for p in params),
        trainable=sum(_numel(p) for p in params if p.requires_grad),
        frozen=sum(_numel(p) for p in params if not p.requires_grad),
        param_bytes=sum(_nbytes(p) for p in params),
        buffers=len(buffers),
        buffer_numel=sum(_numel(b) for b in buffers),
        buffer_bytes=sum(_nbytes(b) for b in buffers),
        activation_bytes=sum(c.activation_bytes for c in tracer.calls),
        input_bytes=sum(_nbytes(t) for t in inputs),
        macs=sum(c.own_macs for c in tracer.calls),
        calls=len(tracer.calls),
        modules=len(selected),
        not_called=sum(1 for n in templates if n not in counts),
        macs_partial=any(c.uncounted for c in tracer.calls),
    )
    return Summary(
        type(inner).__name__,
        _described(inputs),
        rows,
        totals,
        {n: r.type for n, r in templates.items()},
        {n: () if is_lazy(p) else tuple(p.shape) for n, p in inner.named_parameters()},
        {n: tuple(b.shape) for n, b in inner.named_buffers() if not is_lazy(b)},
        depth,
    )


# --- text -----------------------------------------------------------------------------------------
_HEADERS = ("Layer (type)", "Output shape", "Params", "Total", "Trainable", "Buffers", "Mult-adds", "Mode", "Notes")
_LEFT = {0, 1, 7, 8}


def _scaled(n: float, units: tuple[str, ...], base: int) -> str:
    for unit in units:
        n /= base
        if abs(n) < base or unit == units[-1]:
            break
    return f"{n:.2f} {unit}"


def _bytes(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n:,} B ({_scaled(n, ('KiB', 'MiB', 'GiB', 'TiB'), 1024)})"


def _count(n: int) -> str:
    return f"{n:,}" if n < 1000 else f"{n:,} ({_scaled(n, ('K', 'M', 'G', 'T'), 1000)})"


def _shapes(shapes: list[Shape]) -> str:
    shown = ", ".join(_fmt_shape(s) for s in shapes[:4])
    return (shown + f", ... ({len(shapes)} tensors)") if len(shapes) > 4 else shown or "-"


def _macs_cell(macs: int, partial: bool) -> str:
    if partial:  # a lower bound: some product was not counted
        return f">= {macs:,}" if macs else "?"
    return f"{macs:,}" if macs else "-"


def _cells(r: Row) -> list[str]:
    label = "  " * r.depth + (f"{r.name} ({r.type})" if r.name else r.type)
    first = r.call == 0
    if r.params_total == 0:
        trainable = "-"
    else:
        trainable = "yes" if r.frozen_total == 0 else "no" if r.trainable_total == 0 else "partial"
    notes = []
    if r.calls > 1:
        notes.append(f"call {r.call + 1} of {r.calls}")
    if first:
        notes += [f"{k} shared with {v}" for k, v in r.shared.items()]
        notes += [f"also named {a}" for a in r.aliases]
    if r.uncounted:
        notes.append(f"mult-adds not counted: {', '.join(r.uncounted)}")
    return [
        label,
        _shapes(r.output_shapes) if r.called else "(not called)",
        f"{r.params:,}" if first else "--",
        f"{r.params_total:,}" if first else "--",
        trainable if first else "--",
        f"{r.buffer_numel:,}" if first else "--",
        _macs_cell(r.macs, r.macs_partial),
        "train" if r.training else "eval",
        "; ".join(notes),
    ]


def _uncounted(s: Summary) -> str:
    where = [f"{', '.join(r.uncounted)} in {r.name or s.model}" for r in s.all_rows if r.uncounted]
    where = list(dict.fromkeys(where))
    return "; ".join(where[:3]) + (f" and {len(where) - 3} more (Row.uncounted)" if len(where) > 3 else "")


def _render(s: Summary) -> str:
    table = [list(_HEADERS)] + [_cells(r) for r in s.rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADERS) - 1)]

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) if i in _LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return ("  ".join(parts) + "  " + cells[-1]).rstrip()

    rule = "=" * (sum(widths) + 2 * len(widths) + len(_HEADERS[-1]))
    t = s.totals
    got = ", ".join(f"{_fmt_shape(shape)} {dtype}" for shape, dtype in s.inputs)
    depth = "" if s.depth is None else f", depth <= {s.depth}"
    out = [f"{s.model}: input {got}{depth}", rule, line(table[0]), rule]
    out += [line(cells) for cells in table[1:]]
    out += [
        rule,
        f"Params: {_count(t.params)}; trainable {t.trainable:,}, frozen {t.frozen:,} "
        "(shared tensors counted once)",
        f"Param bytes: {_bytes(t.param_bytes)}",
        f"Buffers: {t.buffers} tensors, {t.buffer_numel:,} elements, {_bytes(t.buffer_bytes)}",
        f"Mult-adds: {_count(t.macs)}" + (f" at least; not counted: {_uncounted(s)}" if t.macs_partial else ""),
        f"Input bytes: {_bytes(t.input_bytes)}",
        f"Activation bytes (new outputs of innermost calls): {_bytes(t.activation_bytes)}",
        f"Module calls: {t.calls}; modules: {t.modules}, never called: {t.not_called}",
        rule,
    ]
    return "\n".join(out) + "\n"
