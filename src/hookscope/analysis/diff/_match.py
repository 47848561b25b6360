"""Which modules a comparison covers: the selected names both models have, matched by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ...errors import HookscopeError, SelectionError
from ...core.ops import SEP
from ...selection import exact_ops, layers, named_modules, unwrap
from ._result import Unmatched

__all__ = ["matched"]

Named = list[tuple[str, nn.Module]]


def _few(names: Sequence[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" (and {len(names) - n} more)" if len(names) > n else "")


def _selected(model_a: nn.Module, model_b: nn.Module, selectors: Any) -> tuple[list[str], list[str]]:
    """Names the selectors pick in each model; each selector must match in at least one of them."""
    items = list(selectors) if isinstance(selectors, (list, set, frozenset)) else [selectors]
    picked_a: list[str] = []
    picked_b: list[str] = []
    for sel in items:
        hits: list[SelectionError] = []
        for model, picked in ((model_a, picked_a), (model_b, picked_b)):
            try:
                found = [n for n, _ in layers(model, sel)]
            except SelectionError as e:
                hits.append(e)
                continue
            picked += found
        if len(hits) == 2:
            raise hits[0]
    return picked_a, picked_b


def matched(model_a: nn.Module, model_b: nn.Module, selectors: Any) -> tuple[Named, Named, Unmatched]:
    """The modules compared in each model (the same names, in A's order) and the names only one has.

    ``selectors`` is ``diff``'s ``layers=``: ``None`` for every module and the model itself.

    Example:
        >>> a, b = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> in_a, in_b, unmatched = matched(a, b, None)
        >>> [n for n, _ in in_a], unmatched
        (['', '0'], Unmatched(a_only=(), b_only=('1',)))
    """
    inner_a, inner_b = unwrap(model_a)[0], unwrap(model_b)[0]
    mods_a, mods_b = dict(named_modules(inner_a)), dict(named_modules(inner_b))
    if selectors is None:
        sel_a, sel_b = list(mods_a), list(mods_b)
    else:
        picked_a, picked_b = _selected(model_a, model_b, selectors)
        sel_a = list(dict.fromkeys(picked_a + [n for n in picked_b if n.split(SEP)[0] in mods_a]))
        sel_b = list(dict.fromkeys(picked_b + [n for n in picked_a if n.split(SEP)[0] in mods_b]))
    set_b = set(sel_b)
    common = [n for n in sel_a if n in set_b]
    real_a, real_b = [n for n in sel_a if n], [n for n in sel_b if n]
    if not [n for n in common if n] and (real_a and real_b or not common):
        raise HookscopeError(
            f"{type(inner_a).__name__} (A) and {type(inner_b).__name__} (B) share no layer name to "
            f"compare: A has {_few(real_a) or 'none'}, B has {_few(real_b) or 'none'}; diff matches "
            "modules by qualified name, so give two models of one architecture, or one model twice "
            "with b=hookscope.settings(...)"
        )
    order_b = {n: i for i, n in enumerate(mods_b)}
    unmatched = Unmatched(
        tuple(n for n in sel_a if n not in set_b),
        tuple(sorted((n for n in sel_b if n not in set(sel_a)), key=order_b.__getitem__)),
    )
    return _resolved(model_a, mods_a, common), _resolved(model_b, mods_b, common), unmatched


def _resolved(model: nn.Module, mods: dict[str, nn.Module], names: list[str]) -> Named:
    """``(name, module)`` for each name; an operation (``layer1.0::add``) by its exact name."""
    return [(n, mods[n]) if n in mods else exact_ops(layers(model, n), "diff")[0] for n in names]
