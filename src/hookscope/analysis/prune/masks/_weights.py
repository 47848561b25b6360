"""The public masking functions: :func:`prune`, :func:`remove`, :func:`sparsity`, and their result.

Every call resolves and checks all its targets (selectors, parameter, amount, method, current masks)
before it changes any, so a call that fails leaves the model as it was. Layers are keyed by their
qualified name on the unwrapped model (DataParallel, ``torch.compile``). Must not import:
``torch.nn.utils.prune``, any other analysis module.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ....core.result import Result, missing
from ....core.text import num, table
from ....errors import HookscopeError, checked, checked_as, did_you_mean
from ....selection import Selector, layers, named_modules, unwrap
from ..._sparsity import zeros_in
from ._hooks import apply_mask, make_permanent, mask_of
from ._methods import (
    Spec,
    criterion,
    global_masks,
    new_mask,
    to_prune,
    units_left,
    validate_amount,
)

__all__ = ["PruneRow", "Sparsity", "prune", "remove", "sparsity", "DEFAULT_TYPES"]

DEFAULT_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
"""The layers :func:`prune` masks when given no selector."""


@dataclass(frozen=True)
class PruneRow:
    """Zeros of one parameter of one layer: ``numel`` elements, ``zeros`` of them zero in the weight
    the layer computes with (``None`` if unreadable, on the meta device), ``masked`` if a mask
    (hookscope's or ``torch.nn.utils.prune``'s) is applied to it.

    Example:
        >>> PruneRow("fc", "weight", "Linear", 8, 2, True).sparsity
        0.25
    """

    layer: str
    param: str
    type: str
    numel: int
    zeros: int | None
    masked: bool

    @property
    def sparsity(self) -> float | None:
        """``zeros / numel`` (0.0 for an empty tensor), ``None`` when the zeros are unknown."""
        if self.zeros is None:
            return None
        return self.zeros / self.numel if self.numel else 0.0


class Sparsity(Result):
    """Per-layer and total sparsity: what :func:`prune` did, or what :func:`sparsity` reads.

    ``rows`` holds one :class:`PruneRow` per (layer, parameter) in ``named_modules()`` order;
    ``r["fc1"]`` (a layer with one row) or ``r["fc1.weight"]`` is one of them; ``numel``, ``zeros``
    and ``sparsity`` are the totals over the rows.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> r = prune(net, amount=0.5)
        >>> r.zeros, r.numel, r.sparsity, r["2"].zeros
        (12, 24, 0.5, 4)
    """

    def __init__(self, rows: list[PruneRow]) -> None:
        self.rows = rows

    @property
    def numel(self) -> int:
        """Elements of every row's parameter together."""
        return sum(r.numel for r in self.rows)

    @property
    def zeros(self) -> int | None:
        """Zeros of every row together; ``None`` if one row's are unknown."""
        counts = [r.zeros for r in self.rows]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def sparsity(self) -> float | None:
        """``zeros / numel`` over every row (0.0 for no element), ``None`` if the zeros are unknown."""
        z = self.zeros
        return None if z is None else (z / self.numel if self.numel else 0.0)

    def _find(self, key: object) -> list[PruneRow]:
        if not isinstance(key, str):
            return []
        exact = [r for r in self.rows if f"{r.layer}.{r.param}" == key or (not r.layer and r.param == key)]
        return exact or [r for r in self.rows if r.layer == key]

    def __getitem__(self, key: str) -> PruneRow:
        found = self._find(key)
        if len(found) > 1:
            raise HookscopeError(f"layer {key!r} has {len(found)} rows ({', '.join(r.param for r in found)}); "
                                 f"ask for one as '{key}.{found[0].param}'")
        if not found:
            raise missing(key, "layer", dict.fromkeys(r.layer for r in self.rows))
        return found[0]

    def __contains__(self, key: object) -> bool:
        return bool(self._find(key))

    def to_dict(self) -> dict[str, Any]:
        """Rows and totals as plain data.

        Example:
            >>> r = prune(nn.Sequential(nn.Linear(2, 2)), amount=1)
            >>> print(r.to_json())
            {"layers": [{"layer": "0", "param": "weight", "type": "Linear", "numel": 4, "zeros": 1, "masked": true, "sparsity": 0.25}], "numel": 4, "zeros": 1, "sparsity": 0.25}
        """
        rows = [{**asdict(r), "sparsity": r.sparsity} for r in self.rows]
        return {"layers": rows, "numel": self.numel, "zeros": self.zeros, "sparsity": self.sparsity}

    def table(self) -> str:
        """A text table for people (also ``str(result)``).

        Example:
            >>> print(prune(nn.Sequential(nn.Linear(2, 2)), amount=1).table())
            layer  type    param   numel  zeros  sparsity  mask
            ---------------------------------------------------
            0      Linear  weight      4      1     25.0%  yes
            total                      4      1     25.0%
        """
        def pct(v: float | None) -> str:
            return "?" if v is None else f"{100 * v:.1f}%"

        def zero_text(z: int | None) -> str:
            return "?" if z is None else str(z)

        body = [[r.layer or "(model)", r.type, r.param, str(r.numel), zero_text(r.zeros), pct(r.sparsity),
                 "yes" if r.masked else ""] for r in self.rows]
        body.append(["total", "", "", str(self.numel), zero_text(self.zeros), pct(self.sparsity), ""])
        return "\n".join(table(["layer", "type", "param", "numel", "zeros", "sparsity", "mask"], body,
                               left={0, 1, 2, 6}))

    def __repr__(self) -> str:
        return f"Sparsity({len(self.rows)} rows, sparsity {num(self.sparsity)})"


def _current(module: nn.Module, name: str) -> torch.Tensor | None:
    """The tensor a layer computes with (``orig * mask`` when masked), detached, or ``None``."""
    mask = mask_of(module, name)
    with torch.no_grad():
        if mask is not None:
            orig = module._parameters[name + "_orig"]
            assert orig is not None
            return mask.to(dtype=orig.dtype) * orig.detach()
        p = module._parameters.get(name)
        return p if p is None or is_lazy(p) else p.detach()


def _no_param(qualname: str, module: nn.Module, name: str) -> HookscopeError:
    have = [n for n, p in module._parameters.items() if p is not None]
    where = f"{qualname!r} ({type(module).__name__})" if qualname else f"the model ({type(module).__name__})"
    if name in module._buffers:
        return HookscopeError(f"{name!r} of {where} is a buffer, not a parameter; masks apply to parameters "
                              f"({', '.join(repr(h) for h in have) or 'it has none'})")
    if hasattr(module, name):  # weight_norm, parametrize: a weight computed from other parameters
        return HookscopeError(f"{name!r} of {where} is computed by another reparametrization (weight_norm or "
                              "torch.nn.utils.parametrize?), which would overwrite a mask; remove it first")
    hint = f"none; select its layers, e.g. '{qualname}.*'" if qualname else "none"
    listed = ", ".join(repr(h) for h in have) if have else hint
    return HookscopeError(f"{where} has no parameter {name!r} (its parameters: {listed}); pass name= one of "
                          "those or select other layers")


def _targets(model: nn.Module, selectors: tuple[Selector, ...], name: str) -> list[tuple[str, nn.Module]]:
    """The selected layers that have parameter ``name`` (masked or not); each selector must give one."""
    def has(m: nn.Module) -> bool:
        return m._parameters.get(name) is not None or mask_of(m, name) is not None

    if not selectors:
        found = [(q, m) for q, m in named_modules(model) if isinstance(m, DEFAULT_TYPES) and has(m)]
        if not found:
            raise HookscopeError(f"{type(unwrap(model)[0]).__name__} has no nn.Linear or nn.Conv layer with a "
                                 f"parameter {name!r}; select the layers to prune")
        return found
    chosen: dict[int, tuple[str, nn.Module]] = {}
    for sel in selectors:
        hits = layers(model, sel)
        good = [(q, m) for q, m in hits if has(m)]
        if not good:
            raise _no_param(*hits[0], name)
        for q, m in good:
            chosen.setdefault(id(m), (q, m))
    order = {q: i for i, (q, _) in enumerate(named_modules(model, remove_duplicate=False))}
    return sorted(chosen.values(), key=lambda item: order[item[0]])


def _check_tied(model: nn.Module, targets: list[tuple[str, nn.Module]], name: str) -> None:
    """Refuse a parameter another module holds too (tied weights): torch would move it to ``_orig`` in one
    module and leave the other computing with it dense, silently."""
    holders: dict[int, list[str]] = {}
    for q, m in named_modules(model):
        for local, p in m._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append(f"{q}.{local}" if q else local)
    for q, m in targets:
        p = m._parameters.get(name + "_orig") if mask_of(m, name) is not None else m._parameters.get(name)
        label = f"{q}.{name}" if q else name
        others = [h for h in holders.get(id(p), []) if h not in (label, label + "_orig")]
        if others:
            raise HookscopeError(f"{label} is the same Parameter as {others[0]} (tied weights): a mask on one would "
                                 "leave the other dense; untie them first")


def _spec(amount: object, method: str, n: object, dim: object, scope: object, generator: object) -> Spec:
    kind = criterion(method).kind
    if scope not in ("layer", "global"):
        raise HookscopeError(f"scope={scope!r} is not a scope; pass scope='layer' (each layer ranked alone) "
                             "or scope='global' (every selected layer ranked together)")
    if scope == "global" and kind != "unstructured":
        raise HookscopeError(f"scope='global' ranks single weights across layers and {method!r} ranks channels; "
                             "use method='l1_unstructured' or 'random_unstructured', or scope='layer'")
    if isinstance(n, bool) or not (isinstance(n, numbers.Real) or (isinstance(n, str) and n in ("fro", "nuc"))):
        raise HookscopeError(f"n={n!r} is not a norm order; pass a number (1, 2, float('inf')...), 'fro' or 'nuc'")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise HookscopeError(f"dim={dim!r} is not an int; pass the dim of the channels (0: output channels)")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise HookscopeError(f"generator={generator!r} is not a torch.Generator; pass one, or None")
    return Spec(validate_amount(amount), n, int(dim), generator)  # type: ignore[arg-type]


def _check_one(method: str, spec: Spec, label: str, t: torch.Tensor | None, mask: torch.Tensor | None) -> int:
    """Refuse what would fail or be silently wrong on one target; the units its amount counts against."""
    if t is None or is_lazy(t) or t.device.type == "meta":  # is_lazy first: a lazy one refuses .device
        raise HookscopeError(f"{label} holds no values yet (lazy or on the meta device); run one forward pass "
                             "or load the weights first")
    if not t.is_floating_point():
        raise HookscopeError(f"{label} is a {t.dtype} tensor; only floating-point parameters are pruned")
    # torch ranks only the entries where an old mask == 1: a soft mask (0.5...) would be silently
    # counted as pruned and never ranked again, so composing on it is refused.
    if mask is not None and not bool(((mask == 0) | (mask == 1)).all()):
        raise HookscopeError(f"the mask of {label} holds values other than 0 and 1, which a new criterion cannot "
                             "compose with; make it permanent first (hookscope.remove)")
    g = spec.generator
    if g is not None and g.device.type != t.device.type and method == "random_unstructured":
        raise HookscopeError(f"{label} is on {t.device} and the generator on {g.device}; pass a "
                             f"generator on {t.device.type} (torch.Generator(device=...))")
    if spec.n == "nuc" and criterion(method).kind == "structured" and t.dim() != 3:  # torch fails deep inside
        raise HookscopeError(f"{label}: n='nuc' needs a parameter of 3 dims (a matrix per channel), this one has "
                             f"shape {tuple(t.shape)}; pick n=1, 2, 'fro'...")
    try:
        return units_left(method, t, mask, spec)
    except HookscopeError as e:
        raise HookscopeError(f"{label}: {e}") from None


def _check(method: str, spec: Spec, targets: list[tuple[str, nn.Module]], name: str, scope: str) -> None:
    """Refuse, before any change, what would fail or be silently wrong on any target."""
    left = 0
    for q, m in targets:
        label = f"{q}.{name}" if q else name
        units = _check_one(method, spec, label, _current(m, name), mask_of(m, name))
        if scope == "layer":
            try:
                to_prune(spec.amount, units)
            except HookscopeError as e:
                raise HookscopeError(f"{label}: {e}") from None
        left += units
    if scope == "global":
        try:
            to_prune(spec.amount, left)
        except HookscopeError as e:
            raise HookscopeError(f"global pruning of {len(targets)} layers: {e}") from None


def _ranked(method: str, spec: Spec, targets: list[tuple[str, nn.Module]], name: str,
            scores: Mapping[str, torch.Tensor] | None) -> list[torch.Tensor]:
    """What each target is ranked by: its current weight, or its ``scores`` (torch's ``importance_scores``),
    a 1-D score per channel spread along the other dims for a structured method."""
    weights = [_current(m, name) for _, m in targets]
    if scores is None:
        return weights  # type: ignore[return-value]
    if method.startswith("random"):
        raise HookscopeError(f"{method!r} draws at random and takes no scores; pass scores= with l1_unstructured "
                             "or ln_structured")
    if not isinstance(scores, Mapping):
        raise HookscopeError(f"scores= is a {type(scores).__name__}; pass a dict layer name -> tensor")
    names = [q for q, _ in targets]
    extra = [k for k in scores if k not in names]
    lacking = [q for q in names if q not in scores]
    if extra or lacking:
        what = f"{extra[0]!r} is not a pruned layer{did_you_mean(str(extra[0]), names)}" if extra else \
            f"no scores for {lacking[0]!r}"
        raise HookscopeError(f"scores= must hold one tensor for each pruned layer and no other: {what}")
    return [_score(q, scores[q], w, spec, criterion(method).kind, name) for q, w in zip(names, weights)]


def _score(q: str, s: object, w: torch.Tensor | None, spec: Spec, kind: str, name: str) -> torch.Tensor:
    assert w is not None
    if not isinstance(s, torch.Tensor) or not (s.is_floating_point() or s.dtype == torch.int64):
        raise HookscopeError(f"scores[{q!r}] is not a tensor of numbers; pass one of shape {tuple(w.shape)}")
    s = s.detach().to(w.device, dtype=s.dtype if s.is_floating_point() else torch.float64).contiguous()
    if kind == "structured" and s.dim() == 1 and w.dim() > 1 and len(s) == w.shape[spec.dim]:
        view = [1] * w.dim()
        view[spec.dim] = len(s)
        return s.view(view).expand(w.shape)
    if s.shape != w.shape:
        per = f", or {w.shape[spec.dim]} channel scores" if kind == "structured" and w.dim() > 1 else ""
        raise HookscopeError(f"scores[{q!r}] has shape {tuple(s.shape)}, {q}.{name} {tuple(w.shape)}; pass scores "
                             f"of that shape{per}")
    return s


@checked
def prune(model: nn.Module, *selectors: Selector, amount: int | float, method: str = "l1_unstructured",
          name: str = "weight", n: int | float | str = 1, dim: int = 0, scope: str = "layer",
          generator: torch.Generator | None = None,
          scores: Mapping[str, torch.Tensor] | None = None) -> Sparsity:
    """Mask parameter ``name`` of the selected layers, exactly as ``torch.nn.utils.prune`` would.

    Args:
        model: the model (DataParallel and ``torch.compile`` wrappers are seen through).
        selectors: the layers (names, globs, types...; see :func:`hookscope.selection.layers`); each
            must match at least one layer that has parameter ``name``. None: every ``nn.Linear`` and
            ``nn.Conv*`` (:data:`DEFAULT_TYPES`) that has it.
        amount: a fraction in [0, 1] of the units still unpruned, or a count of them (torch's rounding).
        method: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"`` (channels along
            ``dim`` by their L``n`` norm) or ``"random_structured"``.
        name: the parameter to mask. n, dim: the norm and channel dim of structured methods
            (``dim=0``: output channels of Linear and Conv; input channels of ConvTranspose).
        generator: for random methods (``None``: the global RNG, drawn as torch draws).
        scores: layer name -> what to rank instead of the weight (torch's ``importance_scores``): a
            tensor of the parameter's shape, or for ``ln_structured`` one score per channel along ``dim``
            (lowest ``|score|`` pruned first). One for every pruned layer.
        scope: ``"layer"`` ranks each layer alone; ``"global"`` ranks every selected layer's weights
            together (torch's ``global_unstructured``; unstructured methods only).

    Returns:
        :class:`Sparsity` of the pruned layers. A layer pruned before (by hookscope or torch) has
        the new mask composed with its old one, as torch's ``PruningContainer`` does.

    Example:
        >>> torch.manual_seed(0) and None
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
        >>> print(prune(net, "0", amount=0.25, method="ln_structured", n=2))
        layer  type    param   numel  zeros  sparsity  mask
        ---------------------------------------------------
        0      Conv2d  weight    216     54     25.0%  yes
        total                    216     54     25.0%
    """
    spec = _spec(amount, method, n, dim, scope, generator)
    targets = _targets(model, selectors, name)
    _check_tied(model, targets, name)
    _check(method, spec, targets, name, scope)
    tensors = _ranked(method, spec, targets, name, scores)
    masks = [mask_of(m, name) for _, m in targets]
    if scope == "global":
        new = global_masks(method, tensors, masks, spec)
    else:
        new = [new_mask(method, t, mask, spec) for t, mask in zip(tensors, masks)]
    for (_, m), mask in zip(targets, new):
        apply_mask(m, name, mask)
    return Sparsity([_row(q, m, name) for q, m in targets])


def _row(qualname: str, module: nn.Module, name: str) -> PruneRow:
    t = _current(module, name)
    assert t is not None
    return PruneRow(qualname, name, type(module).__name__, 0 if is_lazy(t) else t.numel(), zeros_in(t),
                    mask_of(module, name) is not None)


def _params(module: nn.Module) -> list[str]:
    """The module's own parameter names, a masked one by its base name (``weight``, not ``weight_orig``)."""
    out = []
    for local, p in module._parameters.items():
        base = local[:-5] if local.endswith("_orig") else None
        if base is not None and mask_of(module, base) is not None:
            out.append(base)
        elif p is not None:
            out.append(local)
    return out


@checked
def sparsity(model: nn.Module, *selectors: Selector, name: str | None = None) -> Sparsity:
    """Zeros of every parameter of the selected layers (every layer, the model's own included, if none),
    masks applied (hookscope's or ``torch.nn.utils.prune``'s), each parameter once.

    ``name`` keeps one parameter (``"weight"``). Works on any model: pruned by hookscope, by torch,
    zeroed by hand, or not at all.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 2, bias=False), nn.ReLU())
        >>> with torch.no_grad(): _ = net[0].weight[0].zero_()
        >>> r = sparsity(net)
        >>> [(row.layer, row.param, row.zeros, row.masked) for row in r.rows], r.sparsity
        ([('0', 'weight', 4, False)], 0.5)
    """
    chosen = layers(model, *selectors) if selectors else named_modules(model)
    seen: set[int] = set()
    rows = []
    for q, m in chosen:
        for local in _params(m):
            p = m._parameters.get(local + "_orig" if local not in m._parameters else local)
            if (name is not None and local != name) or p is None or id(p) in seen:
                continue
            seen.add(id(p))
            rows.append(_row(q, m, local))
    if selectors and not rows:
        what = f"parameter {name!r}" if name else "parameters"
        raise HookscopeError(f"the selected layers have no {what}; select layers that have "
                             "(hookscope.names(model) lists them)")
    return Sparsity(rows)


@checked_as("remove_masks")
def remove(model: nn.Module, *selectors: Selector, name: str | None = None) -> list[str]:
    """Make masks permanent, as ``torch.nn.utils.prune.remove`` does (hookscope's and torch's): the
    parameter holds ``orig * mask`` as a plain Parameter, its ``_orig``, ``_mask`` and hook are gone.

    With no selector, every masked parameter of the model; ``name`` keeps one parameter. Returns the
    qualified names made permanent. Refuses, before any change, a selection with no mask in it.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> _ = prune(net, amount=0.5)
        >>> remove(net), [n for n, _ in net.named_parameters()]
        (['0.weight', '1.weight'], ['0.bias', '0.weight', '1.bias', '1.weight'])
    """
    chosen = layers(model, *selectors) if selectors else named_modules(model)
    found = [(q, m, base) for q, m in chosen for base in _params(m)
             if mask_of(m, base) is not None and (name is None or base == name)]
    if not found and (selectors or name is not None):
        what = f"parameter {name!r}" if name else "parameter"
        raise HookscopeError(f"no masked {what} in the selected layers; list the masked ones with "
                             "hookscope's masked(model)")
    for _, m, base in found:
        make_permanent(m, base)
    return [f"{q}.{base}" if q else base for q, _, base in found]
