"""Gradient flow after a backward pass: per-layer gradient norms, with vanishing and exploding flags.

Reads ``p.grad`` of each module's own parameters (no hook needed), and optionally the activation
gradient norms a ``hookscope.trace(..., keep='all')`` recorded. Norms are reduced on each device
and read back with one copy per device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, Protocol

import torch
from torch import nn

from ..core.result import Result, missing
from ..core.text import num, table
from ..errors import HookscopeError, checked
from ..selection import Selector, layers, named_modules, unwrap

__all__ = ["FlowRow", "GradientFlow", "gradient_flow"]

_DEFAULTS = {"vanish": 1e-7, "explode": 1e3}


class _TraceRow(Protocol):
    module: str
    which: str
    numel: int
    mean: float
    std: float


class _Traced(Protocol):
    @property
    def rows(self) -> list[Any]: ...


@dataclass(frozen=True)
class FlowRow:
    """Gradient norms of one module.

    ``param_norm`` is the L2 norm of the gradients of the module's own trainable parameters
    together (``None`` if it has none, or none got a gradient); ``act_norm`` the L2 norm of every
    gradient that reached its outputs (from a trace; ``None`` without). ``flag`` is ``"ok"``,
    ``"vanishing"``, ``"exploding"``, ``"non-finite"`` or ``"no grad"``.
    """

    module: str
    type: str
    params: int
    param_norm: float | None
    act_norm: float | None
    flag: str


def _norm_text(v: float | None) -> str:
    return "nan" if v is not None and math.isnan(v) else num(v)  # a NaN norm is news, not a gap


class GradientFlow(Result):
    """Per-layer gradient norms in ``named_modules()`` order; build it with :func:`gradient_flow`.

    ``flow.rows`` holds one :class:`FlowRow` per layer; ``flow["name"]`` is one of them (a
    :class:`~hookscope.RecordError` naming the closest layers if there is none).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
        >>> net(torch.tensor([[3.0, 4.0]])).sum().backward()
        >>> flow = gradient_flow(net)
        >>> flow["0"].param_norm, "0" in flow, "1" in flow
        (5.0, True, False)
    """

    def __init__(self, rows: list[FlowRow], vanish: float, explode: float) -> None:
        self.rows = rows
        self.vanish, self.explode = vanish, explode

    @property
    def vanishing(self) -> list[str]:
        """Names of the layers whose gradient norm is below ``vanish``.

        Example:
            >>> net = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False))
            >>> _ = net[0].weight.data.fill_(1.0), net[1].weight.data.fill_(1e-9)
            >>> net(torch.ones(1, 1)).sum().backward()
            >>> gradient_flow(net).vanishing
            ['0']
        """
        return [r.module for r in self.rows if r.flag == "vanishing"]

    @property
    def exploding(self) -> list[str]:
        """Names of the layers whose gradient norm is above ``explode`` (or NaN / Inf).

        Example:
            >>> net = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False))
            >>> _ = net[0].weight.data.fill_(1.0), net[1].weight.data.fill_(1e6)
            >>> net(torch.ones(1, 1)).sum().backward()
            >>> gradient_flow(net).exploding
            ['0']
        """
        return [r.module for r in self.rows if r.flag in ("exploding", "non-finite")]

    def __getitem__(self, name: str) -> FlowRow:
        """The row of one layer, by its qualified name (``""`` for the model itself)."""
        for r in self.rows:
            if r.module == name:
                return r
        raise missing(name, "layer", (r.module for r in self.rows))

    def __contains__(self, name: object) -> bool:
        return any(r.module == name for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """The thresholds and the rows as plain data (``to_json()`` writes NaN and infinities as strings).

        Example:
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
            >>> net(torch.tensor([[3.0, 4.0]])).sum().backward()
            >>> gradient_flow(net).to_dict()["layers"][0]["param_norm"]
            5.0
            >>> print(gradient_flow(net).to_json())
            {"vanish": 1e-07, "explode": 1000.0, "layers": [{"module": "0", "type": "Linear", "params": 2, "param_norm": 5.0, "act_norm": null, "flag": "ok"}]}
        """
        return {"vanish": self.vanish, "explode": self.explode,
                "layers": [dataclasses.asdict(r) for r in self.rows]}

    def table(self) -> str:
        """A text table for people (also ``str(flow)``).

        Example:
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
            >>> net(torch.tensor([[3.0, 4.0]])).sum().backward()
            >>> print(gradient_flow(net).table())
            module  type    params  |grad params|  |grad output|  flag
            ----------------------------------------------------------
            0       Linear       2              5              -  ok
            vanishing (< 1e-07): none; exploding (> 1000): none
        """
        head = ["module", "type", "params", "|grad params|", "|grad output|", "flag"]
        body = [[r.module or "(root)", r.type, str(r.params), _norm_text(r.param_norm),
                 _norm_text(r.act_norm), r.flag] for r in self.rows]
        lines = table(head, body, left={0, 1, 5})
        lines.append(f"vanishing (< {self.vanish:g}): {', '.join(self.vanishing) or 'none'}; "
                     f"exploding (> {self.explode:g}): {', '.join(self.exploding) or 'none'}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"GradientFlow({len(self.rows)} layers, {len(self.vanishing)} vanishing, {len(self.exploding)} exploding)"


def _flag(norms: list[float], vanish: float, explode: float) -> str:
    if not norms:
        return "no grad"
    if any(not math.isfinite(n) for n in norms):
        return "non-finite"
    if any(n > explode for n in norms):
        return "exploding"
    return "vanishing" if all(n < vanish for n in norms) else "ok"


def _norm(g: torch.Tensor) -> torch.Tensor:
    """The L2 norm of one gradient in its own precision (half precision summed in float32).

    Example:
        >>> _norm(torch.tensor([3.0, 4.0], dtype=torch.float64))
        tensor(5., dtype=torch.float64)
        >>> _norm(torch.sparse_coo_tensor([[0, 0, 2]], [1.0, 2.0, 4.0], (5,), check_invariants=True))
        tensor(5.)
    """
    if g.layout == torch.sparse_coo:  # nn.Embedding(sparse=True): the stored values hold the norm
        g = g.coalesce().values()
    elif g.layout != torch.strided:
        g = g.to_dense()
    low = g.dtype in (torch.float16, torch.bfloat16)
    norm: torch.Tensor = torch.linalg.vector_norm(g, dtype=torch.float32 if low else None)
    return norm


def _param_norms(own: list[list[nn.Parameter]]) -> dict[int, float]:
    """The norm of each module's parameter gradients (by index in ``own``), with one copy per device."""
    per_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, ps in enumerate(own):
        grads = [p.grad.detach() for p in ps if p.grad is not None]
        if grads:
            acc = torch.float32 if grads[0].device.type == "mps" else torch.float64
            each = torch.stack([_norm(g).to(device=grads[0].device, dtype=acc) for g in grads])
            per_device.setdefault(each.device, []).append((i, torch.linalg.vector_norm(each)))
    norms: dict[int, float] = {}
    for items in per_device.values():
        host = torch.stack([n.to(items[0][1].dtype) for _, n in items]).cpu().tolist()
        norms.update({i: v for (i, _), v in zip(items, host)})
    for i, v in norms.items():
        grads = [p.grad.detach() for p in own[i] if p.grad is not None] if math.isinf(v) else []
        if grads and grads[0].device.type != "mps":
            # finite gradients whose sum of squares overflowed float32 (above ~1.8e19), or a real Inf:
            # in float64 only a real Inf stays infinite
            norms[i] = math.hypot(*(_norm(g.to(torch.float64)).item() for g in grads))
    return norms


def _activation_norms(traced: _Traced) -> dict[str, float]:
    squares: dict[str, float] = {}
    for r in traced.rows:
        if r.which != "grad_output":
            continue
        if getattr(r, "nan", 0):
            square = math.nan
        elif getattr(r, "inf", 0):
            square = math.inf
        elif r.numel == 0:  # an empty gradient has no mean (NaN): its norm is 0
            square = 0.0
        else:  # the norm from mean and population std: sum x^2 = n (s^2 + m^2)
            square = r.numel * (r.std**2 + r.mean**2)
        squares[r.module] = squares.get(r.module, 0.0) + square
    return {k: math.sqrt(v) for k, v in squares.items()}


def _threshold(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise HookscopeError(
            f"{name}={value!r} is not a number; pass a float such as {name}={_DEFAULTS[name]:g} (the default)"
        )
    if math.isnan(float(value)) or float(value) < 0:
        raise HookscopeError(
            f"{name}={value!r} is not a number >= 0; pass a float such as {name}={_DEFAULTS[name]:g} (the default)"
        )
    return float(value)


def _check_arguments(model: Any, trace: Any, vanish: Any, explode: Any) -> tuple[float, float]:
    """Every argument of :func:`gradient_flow` checked, before anything is read."""
    if not isinstance(model, nn.Module):
        raise HookscopeError(
            f"model is of type {type(model).__name__}, not an nn.Module; call gradient_flow(model) after loss.backward()"
        )
    vanish, explode = _threshold("vanish", vanish), _threshold("explode", explode)
    if not vanish < explode:
        raise HookscopeError(
            f"vanish={vanish:g} must be below explode={explode:g}; pass for example vanish=1e-7, explode=1e3"
        )
    if trace is not None:
        rows = getattr(trace, "rows", None)
        if not isinstance(rows, Sequence) or not all(
                hasattr(r, f) for r in rows for f in ("module", "which", "numel", "mean", "std")):
            raise HookscopeError(
                f"trace={type(trace).__name__} is not a finished hookscope trace; pass "
                "trace=t from 'with hookscope.trace(model, keep=\"all\") as t:' around the backward pass"
            )
    return vanish, explode


@checked
def gradient_flow(model: nn.Module, *selectors: Selector, trace: _Traced | None = None,
                  vanish: float = 1e-7, explode: float = 1e3) -> GradientFlow:
    """Per-layer gradient norms after a backward pass, flagging vanishing and exploding layers.

    A layer's parameter norm is the L2 norm of the ``.grad`` of its own trainable parameters taken
    together (children not included; a weight shared by two modules counts in both), in each
    gradient's own precision (float16 and bfloat16 summed in float32; float64 stays float64); a
    sparse gradient (``nn.Embedding(sparse=True)``) counts its stored values, duplicates summed. With
    ``trace=`` (a ``hookscope.trace(..., keep='all')`` run over the same backward pass), each
    layer also gets the norm of the gradients that reached its outputs, over all its calls.

    Args:
        model: the model, after ``loss.backward()``; names are the inner model's, through wrappers.
        *selectors: as for :func:`hookscope.layers`; none means every module (the root included)
            that owns a parameter or, with ``trace=``, has an activation gradient.
        trace: a finished trace with ``keep='all'`` (optional).
        vanish: a layer whose norms are all below this is ``"vanishing"`` (default 1e-7).
        explode: a layer with a norm above this is ``"exploding"`` (default 1e3).

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> net(torch.ones(1, 2)).sum().backward()
        >>> [r.flag for r in hookscope.gradient_flow(net).rows]
        ['ok', 'ok']
    """
    vanish, explode = _check_arguments(model, trace, vanish, explode)
    inner, _ = unwrap(model)
    acts = _activation_norms(trace) if trace is not None else {}
    if selectors:
        chosen = layers(model, *selectors)
    else:
        seen: set[int] = set()
        chosen = []
        for name, m in named_modules(inner):
            if id(m) not in seen and (any(True for _ in m.parameters(recurse=False)) or name in acts):
                seen.add(id(m))
                chosen.append((name, m))
    own = [[p for p in dict.fromkeys(m.parameters(recurse=False)) if p.requires_grad] for _, m in chosen]
    if not any(p.grad is not None for ps in own for p in ps) and not acts:
        raise HookscopeError(
            f"no parameter of {type(inner).__name__} has a gradient; call loss.backward() first "
            "(gradient_flow reads p.grad after a backward pass), outside torch.no_grad()"
        )
    norms = _param_norms(own)
    rows = []
    for i, (name, m) in enumerate(chosen):
        pn, an = norms.get(i), acts.get(name)
        flag = _flag([n for n in (pn, an) if n is not None], vanish, explode)
        rows.append(FlowRow(name, type(m).__name__, sum(p.numel() for p in own[i]), pn, an, flag))
    return GradientFlow(rows, vanish, explode)
