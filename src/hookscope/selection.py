"""Turn selectors into an ordered list of ``(qualified_name, module)``; see through model wrappers.

Pure: nothing here registers a hook. Names are those of the *unwrapped* model, exactly as its
``named_modules()`` gives them once every ``torch.compile`` wrapper in it is replaced by the module
it wraps (``1.a`` for the child of ``model[1] = torch.compile(model[1])``, not ``1._orig_mod.a``).

One file past 500 lines: every selector form, ``layers=`` (:data:`Layers`), the wrappers seen
through and ``at[...]`` share one set of name rules, and a third of the file is their examples.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Union

import torch
from torch import nn

from ._tree import paths, tree_map
from .core.ops import SEP, OpSite
from .errors import HookscopeError, SelectionError, checked, checked_init, did_you_mean
from .named import ComponentSite, component_sites

__all__ = ["Selector", "Layers", "as_selectors", "At", "at", "as_at", "layers", "unwrap", "named_modules", "strip_prefix", "aliases_of",
           "check_hookable", "exact_ops"]

Predicate = Callable[[str, nn.Module], bool]
Selector = Union[str, "re.Pattern[str]", type, "tuple[type, ...]", nn.Module, Predicate]
Layers = Union[Selector, Sequence[Selector]]
"""What every ``layers=`` takes: one selector or a list of them (``layers(model, *selectors)`` picks the same)."""

# Wrapper class name -> attribute holding the wrapped model. The attribute name is also the prefix
# the wrapper adds to every qualified name ("module.features.0", "_orig_mod.features.0").
_WRAPPERS = {
    "DataParallel": "module",
    "DistributedDataParallel": "module",
    "OptimizedModule": "_orig_mod",  # torch.compile
}
_GLOB_CHARS = set("*?[")


@checked
def unwrap(model: nn.Module) -> tuple[nn.Module, str]:
    """The model inside DataParallel / DDP / ``torch.compile`` wrappers, and the prefix they add.

    Example:
        >>> inner, prefix = unwrap(nn.DataParallel(nn.Linear(2, 2)))
        >>> prefix
        'module.'
    """
    if not isinstance(model, nn.Module):
        raise HookscopeError(
            f"expected a torch.nn.Module, got {type(model).__name__}; pass the model itself"
        )
    prefix = ""
    while True:
        attr = _WRAPPERS.get(type(model).__name__)
        inner = getattr(model, attr, None) if attr else None
        if attr is None or not isinstance(inner, nn.Module):
            break
        prefix += attr + "."
        model = inner
    if isinstance(model, torch.jit.ScriptModule):
        raise HookscopeError(
            "hooks do not run on TorchScript modules (torch.jit.ScriptModule); "
            "pass the eager nn.Module you scripted instead"
        )
    return model, prefix


def _see_through(module: nn.Module) -> nn.Module:
    """The module inside ``torch.compile`` wrappers (``OptimizedModule``), or ``module`` itself."""
    while type(module).__name__ == "OptimizedModule":
        inner = module._modules.get("_orig_mod")
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


def named_modules(model: nn.Module, *, remove_duplicate: bool = True) -> list[tuple[str, nn.Module]]:
    """``named_modules()`` of the unwrapped model, each ``torch.compile`` wrapper in it (at any
    depth) replaced by the module it wraps: the names and modules every selection is made from.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
        >>> net[1] = torch.compile(net[1])
        >>> [name for name, _ in named_modules(net)]
        ['', '0', '1', '1.0']
    """
    inner, _ = unwrap(model)
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack = [("", inner)]
    while stack:
        name, module = stack.pop()
        module = _see_through(module)
        if remove_duplicate:
            if id(module) in seen:
                continue
            seen.add(id(module))
        out.append((name, module))
        children = [(f"{name}.{k}" if name else k, c) for k, c in module._modules.items() if c is not None]
        stack.extend(reversed(children))
    return out


def strip_prefix(name: str, known: Iterable[str] | None = None) -> str:
    """Drop leading wrapper prefixes (``module.``, ``_orig_mod.``) unless ``name`` is itself known,
    and an inner ``_orig_mod.`` (a submodule wrapped by ``torch.compile``) when that makes it known."""
    known_set = known if isinstance(known, (set, frozenset, dict)) else set(known or ())
    prefixes = tuple(a + "." for a in set(_WRAPPERS.values()))
    while name not in known_set and name.startswith(prefixes):
        name = name.split(".", 1)[1]
    if name not in known_set and "_orig_mod" in name:
        seen_through = ".".join(part for part in name.split(".") if part != "_orig_mod")
        if seen_through in known_set:
            return seen_through
    return name


def _describe(sel: object) -> str:
    if isinstance(sel, str):
        return repr(sel)
    if isinstance(sel, re.Pattern):
        return f"re.compile({sel.pattern!r})"
    if isinstance(sel, type):
        return sel.__name__
    return repr(sel)


def _matcher(sel: object) -> Callable[[str, nn.Module], bool]:
    if isinstance(sel, str):
        if sel.startswith("re:"):
            try:
                rx = re.compile(sel[3:])
            except re.error as e:
                raise SelectionError(
                    f"selector {sel!r} is not a valid regular expression ({e}); write it like "
                    "'re:layer[12]\\..*', or use a glob such as 'layer*.conv1'"
                ) from None
            return lambda n, m: rx.fullmatch(n) is not None
        if _GLOB_CHARS & set(sel):
            return lambda n, m: fnmatch.fnmatchcase(n, sel)
        return lambda n, m: n == sel
    if isinstance(sel, re.Pattern):
        return lambda n, m: sel.fullmatch(n) is not None
    if isinstance(sel, type) and issubclass(sel, nn.Module):
        return lambda n, m: isinstance(m, sel)
    if isinstance(sel, tuple) and sel and all(isinstance(t, type) for t in sel):
        return lambda n, m: isinstance(m, sel)
    if isinstance(sel, nn.Module):
        inner = _see_through(sel)  # a submodule's torch.compile wrapper selects what it wraps
        return lambda n, m: m is inner
    if callable(sel):
        return lambda n, m: bool(sel(n, m))
    raise SelectionError(
        f"{sel!r} ({type(sel).__name__}) is not a selector; use a layer name, a glob such as "
        "'layer*.conv1', 're:<regex>', an nn.Module type, a module, or a function (name, module) -> bool"
    )


def as_selectors(spec: Layers) -> list[Selector]:
    """``layers=`` as the flat list of selectors :func:`layers` takes (a tuple of types stays one selector).

    Example:
        >>> as_selectors("fc"), as_selectors(["a", ("b", "c")]), as_selectors((nn.Conv2d, nn.Linear))
        (['fc'], ['a', 'b', 'c'], [(<class 'torch.nn.modules.conv.Conv2d'>, <class 'torch.nn.modules.linear.Linear'>)])
    """
    return _flatten([spec])  # type: ignore[return-value]


def _flatten(selectors: Sequence[object]) -> list[object]:
    out: list[object] = []
    for s in selectors:
        if isinstance(s, (list, set, frozenset)) or (
            isinstance(s, tuple) and not all(isinstance(t, type) for t in s)
        ):
            out.extend(_flatten(list(s)))
        else:
            out.append(s)
    return out


@checked
def layers(model: nn.Module, *selectors: Layers) -> list[tuple[str, nn.Module]]:
    """Resolve selectors to ``[(qualified_name, module)]`` in ``named_modules()`` order.

    A selector is an exact name (``"features.0"``; the wrapper spelling ``"module.features.0"`` works
    too), a glob (``"layer*.conv1"``), a regular expression (``"re:layer[12]\\..*"`` or a compiled
    pattern), an ``nn.Module`` type or tuple of types, a module object, or a predicate
    ``(name, module) -> bool``. Lists of selectors are flattened. With no selector, every module but
    the root is selected. Every selector must match something, or :class:`SelectionError` names it
    and the closest real names.

    ``"module::op"`` selects operations (torch functions, ``Tensor`` methods, operators) that the
    module's own ``forward`` runs: ``"layer1.0::add"`` (the residual ``out += identity``),
    ``"h.*::scaled_dot_product_attention"``, ``"::matmul"`` for the model's own forward, a glob
    such as ``"layer1.0::*"``; each comes back as an operation site, hooked like a module (see
    :func:`hookscope.operations` for the names one pass runs).

    On a transformers model of a supported family, a name that is no module's is read as a
    component name (see :func:`hookscope.components`): ``"blocks.3.resid_post"``,
    ``"blocks.3.attn.z"``, one head ``"blocks.3.attn.head.5.z"``, ``"embed"``, ``"final_norm"``,
    ``"unembed"``, or a glob of them (``"blocks.*.mlp_out"``); each comes back as a
    :class:`~hookscope.named.ComponentSite`, hooked like a module whose output is the component.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
        >>> [name for name, _ in layers(net, nn.Conv2d)]
        ['0', '2']
        >>> [name for name, _ in layers(net, "1::relu")]
        ['1::relu']
    """
    inner, _ = unwrap(model)
    named = named_modules(model, remove_duplicate=False)
    names = [n for n, _ in named]
    flat = _flatten(list(selectors))
    if selectors and not flat:
        raise SelectionError(
            "the selection is empty (an empty list of selectors was given); pass at least one "
            "selector, or none at all to select every module"
        )
    if not flat:
        every = [(n, m) for n, m in _dedupe(named) if n]
        if not every:
            raise SelectionError(
                f"{type(inner).__name__} has no submodules to select; select the model itself with ''"
            )
        return every
    chosen: dict[int, tuple[str, nn.Module]] = {}  # a module under several names: the first selected
    sites: list[tuple[str, nn.Module]] = []
    for sel in flat:
        if isinstance(sel, (OpSite, ComponentSite)):  # a site resolved before (one layer handed on)
            sites.append((sel.site_name, sel))
            continue
        if isinstance(sel, str) and SEP in sel:
            sites.extend(_op_sites(model, sel))
            continue
        if isinstance(sel, str) and not sel.startswith("re:") and not (_GLOB_CHARS & set(sel)):
            sel = strip_prefix(sel, names)
        match = _matcher(sel)
        hits = [(n, m) for n, m in named if match(n, m)]
        found = None if hits else component_sites(inner, sel)  # "blocks.3.attn.z": a transformers component
        if found is not None:
            sites.extend(found)
            continue
        if not hits:
            hint = did_you_mean(sel, names) if isinstance(sel, str) else ""
            if not hint:
                shown = ", ".join(repr(n) for n in names[1:6])
                more = f" (and {len(names) - 6} more)" if len(names) > 6 else ""
                hint = f" Some real names: {shown}{more}."
            raise SelectionError(
                f"selector {_describe(sel)} matches no module of {type(inner).__name__}.{hint} "
                "List them all with hookscope.names(model), or `hookscope layers MODEL` in a shell"
            )
        for n, m in hits:  # a module reachable under two names is keyed by the name selected
            chosen.setdefault(id(m), (n, m))
    order = {n: i for i, n in enumerate(names)}
    every = list(chosen.values()) + _unique_sites(sites)  # an operation comes right after its module
    return sorted(every, key=lambda item: _place(item, order))


def _place(item: tuple[str, nn.Module], order: dict[str, int]) -> tuple[int, int, int]:
    """Where a selected module, operation or component goes: modules in ``named_modules()`` order,
    each operation right after its module, then the components in the stream's order (OPT keeps
    its final norm before its blocks, but ``final_norm`` still comes after ``blocks.0.resid_post``)."""
    name, module = item
    if isinstance(module, ComponentSite):
        return 1, module.rank, 0
    return 0, order[name.split(SEP)[0]], int(SEP in name)


def _op_sites(model: nn.Module, sel: str) -> list[tuple[str, nn.Module]]:
    """``"layer1.*::add"`` -> an :class:`~hookscope.core.ops.OpSite` for each module the part before
    ``::`` selects (``"::add"``: the model's own forward)."""
    module_part, op = sel.split(SEP, 1)
    if not op or SEP in op:
        raise SelectionError(f"selector {sel!r} names no operation after '::'; write 'module::op' such as "
                             "'layer1.0::add' (list them with `hookscope layers --ops MODEL`)")
    owners = [("", named_modules(model)[0][1])] if module_part == "" else layers(model, module_part)
    compiled = _compiled_names(model)
    out: list[tuple[str, nn.Module]] = []
    for name, module in owners:
        if isinstance(module, OpSite):
            continue
        if isinstance(module, torch.jit.ScriptModule):
            raise SelectionError(f"{sel!r}: {name or 'the model'!r} is a TorchScript module, whose operations run "
                                 "outside Python; select them on its eager nn.Module")
        inside = next((c for c in compiled if c == "" or name == c or name.startswith(c + ".")), None)
        if inside is not None:
            raise SelectionError(
                f"{sel!r}: the operations of {name or 'the model'!r} run inside the torch.compile'd "
                f"{inside or 'model'!r}, where they are fused into compiled code and cannot be hooked; "
                "select them on the eager model, or select modules")
        site = OpSite(module, name, op)
        site.selector = sel  # a misspelt operation is told per selector, over all the modules it names
        out.append((f"{name}{SEP}{op}", site))
    return out


def _compiled_names(model: nn.Module) -> list[str]:
    """Names of the ``torch.compile`` wrappers in ``model`` (``""``: the model itself)."""
    found = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        wrapper = type(module).__name__
        if wrapper == "OptimizedModule":
            found.append(name)
        attr = _WRAPPERS.get(wrapper)
        for key, child in module._modules.items():
            if child is not None:
                inner = name if key == attr else (f"{name}.{key}" if name else key)
                stack.append((inner, child))
    return found


def _unique_sites(sites: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    seen: set[str] = set()
    return [(n, s) for n, s in sites if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]


def aliases_of(model: nn.Module, selected: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """Every other name of a selected module (a shared submodule) -> the name it was selected by.

    Example:
        >>> shared = nn.Linear(2, 2)
        >>> net = nn.Module(); net.enc = shared; net.dec = shared
        >>> aliases_of(net, layers(net, "dec"))
        {'enc': 'dec'}
    """
    key = {id(m): n for n, m in selected}
    return {n: key[id(m)] for n, m in named_modules(model, remove_duplicate=False)
            if id(m) in key and n != key[id(m)]}


def check_hookable(selected: list[tuple[str, nn.Module]]) -> None:
    """Refuse TorchScript submodules before anything is registered: their hooks would never run."""
    for name, module in selected:
        if isinstance(module, torch.jit.ScriptModule):
            raise HookscopeError(
                f"{name!r} is a TorchScript module, where Python hooks do not run; "
                "select its eager nn.Module (before torch.jit.script) instead"
            )


def exact_ops(selected: list[tuple[str, nn.Module]], what: str) -> list[tuple[str, nn.Module]]:
    """``selected`` as it is, or one line refusing an operation given as a glob (``h.0::soft*``)
    where results are keyed by exact name (``what`` says by whom).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2))
        >>> exact_ops(layers(net, "0::linear"), "diff")[0][0]
        '0::linear'
    """
    for name, module in selected:
        if isinstance(module, OpSite) and module.is_pattern:
            raise SelectionError(
                f"{name!r}: {what} needs each operation by its exact name, not a glob; list them with "
                "hookscope.operations(model, inputs) or `hookscope layers --ops MODEL`, and pass the names")
    return selected


def _dedupe(named: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    seen: set[int] = set()
    out = []
    for n, m in named:
        if id(m) not in seen:
            seen.add(id(m))
            out.append((n, m))
    return out


@checked
def names(model: nn.Module) -> list[str]:
    """Every qualified module name of the unwrapped model, root (``""``) excluded.

    Example:
        >>> names(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        ['0', '1']
    """
    return [n for n, _ in named_modules(model) if n]


_ROOT: object = object()  # the bare indexer ``at``, before any position is given


def _index_text(part: object) -> str:
    if part is Ellipsis:
        return "..."
    if isinstance(part, slice):
        text = ":".join("" if v is None else str(v) for v in (part.start, part.stop))
        return text + (f":{part.step}" if part.step is not None else "")
    if isinstance(part, torch.Tensor):
        return f"tensor({part.tolist()})" if part.numel() <= 8 else f"tensor(shape {tuple(part.shape)})"
    return repr(part)


def _whole(v: object) -> int | None:
    """``v`` as an int if it is a whole-number position (Python or numpy integer, not a bool), else None."""
    if isinstance(v, (bool, torch.Tensor)) or not hasattr(v, "__index__"):
        return None
    return operator.index(v)


def _index_part(part: object) -> object:
    """``part`` of an index, numpy integers made ints, or a one-line error if it is not a tensor position."""
    if part is None or part is Ellipsis:
        return part
    if isinstance(part, torch.Tensor):
        if part.dtype == torch.bool or not (part.is_floating_point() or part.is_complex()):
            return part
    elif isinstance(part, slice):
        ends = [None if v is None else _whole(v) for v in (part.start, part.stop, part.step)]
        if all(e is not None or v is None for e, v in zip(ends, (part.start, part.stop, part.step))):
            return slice(*ends)
    elif isinstance(part, list):
        whole = [_whole(v) for v in part]
        if all(w is not None for w in whole):
            return whole
    elif (n := _whole(part)) is not None:
        return n
    raise HookscopeError(
        f"{_index_text(part)} ({type(part).__name__}) is not a tensor position; index with ints, "
        "slices, ..., None, lists of ints or integer/bool tensors, e.g. hookscope.at[:, -1]")


@checked_init
class At:
    """Positions in a module's main output tensor, written as an index: ``at[:, -1]``.

    ``hookscope.at`` is the indexer: ``at[:, -1]`` (the last token of a ``batch x tokens x
    features`` output), ``at[0, 3:5]``, ``at[..., 7]``. The main tensor is the output itself when
    it is a tensor, else its first tensor (the hidden states of a tuple ``(hidden, cache)``, the
    first field of a ``ModelOutput``). :func:`~hookscope.capture` records only those positions;
    :func:`~hookscope.edit` changes only them.

    Example:
        >>> import torch
        >>> at[:, -1]
        at[:, -1]
        >>> at[:, -1].take((torch.arange(6).reshape(1, 3, 2), None), "h.0")
        tensor([[4, 5]])
    """

    __slots__ = ("index",)

    def __init__(self, index: object = _ROOT) -> None:
        if isinstance(index, tuple):
            index = tuple(_index_part(p) for p in index)
        elif index is not _ROOT:
            index = _index_part(index)
        self.index = index

    def __getitem__(self, index: object) -> At:
        return At(index)

    def __repr__(self) -> str:
        if self.index is _ROOT:
            return "at"
        parts = self.index if isinstance(self.index, tuple) else (self.index,)
        return f"at[{', '.join(_index_text(p) for p in parts)}]"

    def main(self, output: object, name: str) -> tuple[torch.Tensor, str]:
        """The tensor the positions apply to, ``output`` itself or its first tensor, and where it is."""
        if self.index is _ROOT:
            raise HookscopeError("at needs positions: write at[:, -1] (the last token), not at alone")
        if isinstance(output, torch.Tensor):
            return output, "output"
        found = next(paths(output, "output"), None)
        if found is None:
            raise HookscopeError(f"the output of {name!r} holds no tensor, so {self!r} has nothing to index; "
                                 "select a module that returns a tensor")
        return found[1], found[0]

    def take(self, output: object, name: str) -> torch.Tensor:
        """The positions of ``output``'s main tensor (a view), or a one-line error if they do not fit."""
        main, where = self.main(output, name)
        try:
            return main[self.index]  # type: ignore[index]
        except (IndexError, RuntimeError, TypeError, ValueError):
            what = "a tensor" if where == "output" else f"whose first tensor, {where}, is a tensor"
            raise HookscopeError(
                f"{self!r} does not fit the output of {name!r}, {what} of shape {tuple(main.shape)}; pick "
                "positions inside that shape (at[:, -1] is the last token of batch x tokens x features), or "
                "select the module whose output holds the tensor you mean") from None

    def put(self, output: object, change: Callable[[torch.Tensor], object], name: str) -> object:
        """``output`` with its main tensor's positions replaced by ``change(positions)``, out of place:
        the rest of the tensor is untouched and gradients flow to both."""
        main, _ = self.main(output, name)
        old = self.take(output, name).clone()  # changed in place by ``change``, the model never sees it
        got = change(old)
        new_part = old if got is None else got
        if not isinstance(new_part, torch.Tensor):
            raise HookscopeError(f"the change of {self!r} in {name!r} returned {type(new_part).__name__}; "
                                 "return a tensor (or None after changing it in place)")
        if new_part.shape != old.shape or new_part.dtype != old.dtype:  # no silent broadcast or cast
            raise HookscopeError(
                f"the change of {self!r} in {name!r} returned {new_part.dtype} of shape {tuple(new_part.shape)} for "
                f"positions holding {old.dtype} of shape {tuple(old.shape)}; return a tensor of that shape and dtype")
        new = main.clone()
        try:
            new[self.index] = new_part  # type: ignore[index]
        except (IndexError, RuntimeError, TypeError, ValueError):
            raise HookscopeError(
                f"the change of {self!r} in {name!r} returned shape {tuple(new_part.shape)}, which does not "
                f"fit positions of shape {tuple(old.shape)}; return a tensor of that shape") from None
        return new if output is main else tree_map(lambda t: new if t is main else t, output)


at = At()
"""The position indexer: ``hookscope.at[:, -1]`` (see :class:`At`)."""


def as_at(value: object) -> At | None:
    """``at=`` as given to capture or edit: ``None``, an :class:`At`, or a bare index turned into one.

    Example:
        >>> as_at((slice(None), -1))
        at[:, -1]
    """
    if isinstance(value, At) and value.index is _ROOT:
        raise HookscopeError("at= needs positions: write at=hookscope.at[:, -1] (the last token), not at=hookscope.at")
    if value is None or isinstance(value, At):
        return value
    return At(value)
