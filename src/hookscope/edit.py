"""Change what modules receive and produce, forward and backward, for the duration of a block."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ._tree import map_exposed, paths, tensors, tree_map
from .core.compiled import HookRefresh, eager, is_compiled
from .core.hooks import HookGroup, Orphans, ThreadScope
from .core.calls import CallStack
from .core.ops import OpSite, counts, current_function, missed, written
from .errors import HookscopeError, SelectionError, checked
from .generation import FollowedPositions, TokenPositions
from .named import check_writable
from .selection import At, Selector, as_at, check_hookable, layers

__all__ = ["edit", "Edit", "ablate", "scale"]

Change = Callable[[Any], Any]


def _as_fn(change: Any, what: str) -> Change | None:
    """A function, or a fixed value turned into one that checks shapes and hands out copies.

    Each call gets fresh copies of the fixed tensors: the model may write into what a module
    returns (``out += identity``, an in-place ReLU), and a fixed value is often a record the user
    still reads (activation patching from a clean run), so it must never be the model's own memory.
    """
    if change is None or callable(change):
        return cast("Change | None", change)

    def replace(old: Any) -> Any:
        olds, news = list(paths(old)), list(paths(change))
        if not olds:  # nothing there to match (an input that was None): the value as given
            return tree_map(lambda t: t.clone(), change)
        if [p for p, _ in olds] != [p for p, _ in news]:
            raise HookscopeError(
                f"the fixed {what} holds tensors at {[p or 'top' for p, _ in news]} but the module's {what} "
                f"at {[p or 'top' for p, _ in olds]}; pass a value of the same structure, or a function")
        for (where, o), (_, n) in zip(olds, news):
            if o.shape != n.shape:
                raise HookscopeError(
                    f"the fixed {what}{where} has shape {tuple(n.shape)} but the module's {what}{where} has "
                    f"shape {tuple(o.shape)}; pass a tensor of that shape, or a function")
        like = iter([o for _, o in olds])
        # differentiable copies, on the module's device and in its dtype
        return tree_map(lambda t: t.to(device=(o := next(like)).device, dtype=o.dtype, copy=True), change)

    return replace


def _as_is(f: Any) -> Any:
    return f


class Edit:
    """Context that rewrites inputs, outputs and gradients of selected modules. Build it with :func:`edit`.

    ``counts[name]`` says how many calls of each module were edited. Like a capture, it changes the
    calls made in the thread that opened it and in threads started while it is open.
    """

    def __init__(
        self,
        model: nn.Module,
        selected: list[tuple[str, nn.Module]],
        changes: dict[str, Change | None],
        inputs: dict[int | str, Change],
        at: At | None = None,
    ) -> None:
        self._model = model
        self._at = at  # the output change applies to these positions of the main output tensor
        self._targets: list[tuple[str, nn.Module]] | None = selected
        self._changes = changes
        self._inputs = inputs
        self._group = HookGroup()
        self._refresh = HookRefresh(model)
        self._scope = ThreadScope()
        self._orphans = Orphans()  # gradient hooks on views, which a later in-place op orphans
        self._lost: list[str] = []
        self._sites = [s for _, s in selected if isinstance(s, OpSite)]
        self._since: dict[int, tuple[int, int]] = {}
        self.counts = {n: 0 for n, _ in selected}

    def __enter__(self) -> Edit:
        if self._targets is None:
            raise HookscopeError("this edit has already run; call hookscope.edit(...) again")
        self._scope.open()
        c = self._changes
        wrap: Callable[[Any], Any] = eager if is_compiled(self._model) else _as_is
        try:
            if isinstance(self._at, TokenPositions):  # resolved at each forward from the model's own inputs
                self._at = self._at.follow(self._model, self._group)
            for name, module in self._targets:
                # an operation that writes into a tensor runs on a copy, then the edited value goes in
                writes: CallStack[_Write | None] | None = CallStack() if isinstance(module, OpSite) else None
                if self._inputs or c["grad_input"] or writes is not None:
                    pre = wrap(self._pre(name, module, writes))
                    self._group.add(module.register_forward_pre_hook(pre, with_kwargs=True))
                if c["output"] or c["grad_output"] or writes is not None:
                    post = wrap(self._post(name, module, writes))
                    self._group.add(module.register_forward_hook(post, with_kwargs=writes is not None))
            self._refresh.open()
        except BaseException:
            self.remove()
            raise
        self._since = counts(self._sites)
        self._targets = None
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.remove()
        if exc_type is None and isinstance(self._at, FollowedPositions):
            self._at.check()
        unmatched = missed(self._sites, self._since) if exc_type is None else None
        if unmatched is not None:  # only the finished pass tells a misspelt operation from one not run yet
            raise SelectionError(unmatched)
        if self._lost and exc_type is None:
            what, name = self._lost[0].split(" ", 1)
            raise HookscopeError(
                f"the {what} edit of {name!r} was not applied: the tensor it hooks is a view that an in-place "
                "op rewrote (a Flatten or slice output, or an input the module writes into), and PyTorch "
                "then drops the gradient hooks of the view; make that op out of place (inplace=False)")

    def remove(self) -> None:
        """Remove the hooks now (the context does it by itself). Idempotent."""
        self._group.remove()
        self._orphans.settle()
        self._refresh.close()
        self._scope.close()

    def _ours(self, module: nn.Module, target: nn.Module) -> bool:
        return module is not target or self._scope.sees()

    def _pre(self, name: str, target: nn.Module, writes: CallStack[_Write | None] | None) -> Any:
        grad_change = self._changes["grad_input"]
        counted_later = bool(self._changes["output"] or self._changes["grad_output"]) or writes is not None

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
            # kwargs may be missing: PyTorch calls a pre-hook removed mid-call without them
            if not self._ours(module, target):
                return None
            kwargs = kwargs or {}
            into = written(current_function(), args, kwargs) if writes is not None else None
            new_args, new_kwargs = _change_inputs(name, self._inputs, args, kwargs)
            if writes is not None:
                writes.push(None if into is None else _Write(into[1]))
            if into is not None:
                return self._on_copy(name, writes, into[0], new_args, new_kwargs)
            if grad_change is not None and new_args:
                first = _hook_first_input(new_args[0], lambda t: self._hook_grad(t, grad_change, f"grad_input {name}"),
                                          name)
                new_args = (first, *new_args[1:])
            if not counted_later:
                self.counts[name] += 1
            if new_args is args and new_kwargs is kwargs:
                return None
            return new_args, new_kwargs

        return pre

    def _on_copy(self, name: str, writes: Any, where: str | int, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The inputs of an operation that writes into a tensor, with a private copy in its place:
        the operation's backward may keep what it wrote (``relu_`` keeps its result), which the
        edited value must not overwrite. The copy is also the fresh per-call tensor whose gradient
        is exactly what flows back through this operation."""
        write: _Write = writes.top()
        if where == "out":
            write.copy = torch.empty_like(kwargs["out"])
            return args, {**kwargs, "out": write.copy}
        write.copy = args[0].clone()
        grad_change = self._changes["grad_input"]
        if grad_change is not None:
            write.copy = self._hook_grad(write.copy, grad_change, f"grad_input {name}", fresh=False)
        return (write.copy, *args[1:]), kwargs

    def _post(self, name: str, target: nn.Module, writes: CallStack[_Write | None] | None) -> Any:
        change, grad_change = self._changes["output"], self._changes["grad_output"]

        def post(module: nn.Module, args: Any, *rest: Any) -> Any:
            output = rest[-1]  # (kwargs, output) for an operation, (output,) for a module
            if not self._ours(module, target):
                return None
            write = writes.pop() if writes is not None else None
            if write is not None:  # the operation wrote into a copy: edit that, then put it in the model's tensor
                self._edit_value(name, write)
                return None if output is None else write.into  # setitem returns None
            new = output
            if change is not None and self._at is not None:
                new = self._at.put(output, change, name)
            elif change is not None:
                got = change(output)
                new = output if got is None else got
            if grad_change is not None:
                tree_map(lambda t: self._hook_grad(t, grad_change, f"grad_output {name}"), new)
            self.counts[name] += 1
            return None if new is output else new

        return post

    def _edit_value(self, name: str, write: _Write) -> None:
        """The output and grad_output changes of one call of an operation that wrote into a tensor,
        applied to the private copy ``write`` holds; the result is copied into the model's tensor."""
        copy: torch.Tensor = write.copy
        change, grad_change = self._changes["output"], self._changes["grad_output"]
        new: Any = copy
        if change is not None and self._at is not None:
            new = self._at.put(copy, change, name)
        elif change is not None:
            got = change(copy)
            new = copy if got is None else got
        if not isinstance(new, torch.Tensor) or new.shape != write.into.shape:
            got_text = f"shape {tuple(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
            raise HookscopeError(
                f"the output edit of {name!r} gave {got_text}, but the operation writes into a tensor of shape "
                f"{tuple(write.into.shape)}, which the model reads on; return a tensor of that shape")
        if grad_change is not None:
            new = self._hook_grad(new, grad_change, f"grad_output {name}")
        write.into.copy_(new)
        self.counts[name] += 1

    def _hook_grad(self, t: torch.Tensor, fn: Change, what: str, fresh: bool = True) -> torch.Tensor:
        """Hook ``fn`` on the gradient of ``t``; ``what`` is ``"grad_input NAME"`` or ``"grad_output NAME"``.
        ``fresh=False``: ``t`` is already a tensor of this call alone."""
        if not (t.requires_grad and torch.is_grad_enabled()):
            return t
        # input gradients: a fresh alias per call, so only what flows through this module changes
        target = t.view_as(t) if fresh and what.startswith("grad_input") else t
        orphans, key = self._orphans, self._orphans.watch(target, lambda: self._lost.append(what))

        def hook(g: torch.Tensor) -> Any:
            orphans.arrived(key)
            return fn(g)

        self._group.add(target.register_hook(hook))
        orphans.bind(key, hook)
        return target


class _Write:
    """One call of an operation that writes into ``into``: the private copy it wrote instead."""

    __slots__ = ("into", "copy")

    def __init__(self, into: torch.Tensor) -> None:
        self.into = into
        self.copy: torch.Tensor = into


def _hook_first_input(first: Any, hook: Callable[[torch.Tensor], torch.Tensor], name: str) -> Any:
    """``first`` with ``hook`` applied to the tensors reached through tuples (a list or dict the
    caller passed goes on as it is); a tensor needing a gradient inside one cannot be edited."""
    visited: set[int] = set()

    def visit(t: torch.Tensor) -> torch.Tensor:
        visited.add(id(t))
        return hook(t)

    new = map_exposed(visit, first)
    if torch.is_grad_enabled() and any(t.requires_grad and id(t) not in visited for t in tensors(first)):
        raise HookscopeError(f"edit(grad_input=...) cannot reach the tensors inside the list, dict or object "
                             f"that {name!r} receives first; edit grad_output of the layer that makes them")
    return new


def _change_inputs(
    name: str, inputs: dict[int | str, Change], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Apply each input change (by position or keyword name) to one call's inputs."""
    if not inputs:
        return args, kwargs
    new_args, new_kwargs = list(args), dict(kwargs)
    for key, change in inputs.items():
        if isinstance(key, int):
            if key >= len(args):
                raise HookscopeError(
                    f"{name!r} was called with {len(args)} positional input(s), so input {key} does "
                    f"not exist; edit one of positions 0..{len(args) - 1} or a keyword by its name"
                    if args else f"{name!r} was called without positional input, so input= has "
                    "nothing to change; edit a keyword input by name or the output of the layer before"
                )
            got = change(args[key])
            new_args[key] = args[key] if got is None else got
        else:
            if key not in kwargs:
                raise HookscopeError(
                    f"{name!r} was not called with keyword input {key!r}; its keywords were "
                    f"{sorted(kwargs) or 'none'}; edit a positional input by its index instead"
                )
            got = change(kwargs[key])
            new_kwargs[key] = kwargs[key] if got is None else got
    changed_args = any(a is not b for a, b in zip(new_args, args))
    changed_kwargs = any(new_kwargs[k] is not kwargs[k] for k in kwargs)
    return (tuple(new_args) if changed_args else args), (new_kwargs if changed_kwargs else kwargs)


@checked
def edit(
    model: nn.Module,
    *selectors: Selector,
    input: Any = None,
    inputs: Mapping[int | str, Any] | None = None,
    output: Any = None,
    grad_input: Any = None,
    grad_output: Any = None,
    at: At | Any = None,
) -> Edit:
    """Rewrite what the selected modules receive or produce, for the duration of a ``with`` block.

    Each change is a function ``old -> new`` (return ``None`` to keep ``old``, for example after
    changing it in place) or a fixed value that replaces ``old`` (activation patching):

    - ``input``: the first positional input, before the module runs (a forward pre-hook);
    - ``inputs``: any inputs, keyed by position (``0``, ``1``...) or keyword name
      (``{"attention_mask": ...}``), each a change as above;
    - ``output``: the whole output (a tensor, tuple, dict, ...), after the module runs;
    - ``grad_output``: the gradient arriving at each output tensor, before it flows into the module;
    - ``grad_input``: the gradient the module sends back to its first input.

    ``at`` (for example ``hookscope.at[:, -1]``, the last token) limits the ``output`` change to
    those positions of the output's main tensor (the output itself when it is a tensor, else its
    first tensor, such as the hidden states of a ``(hidden, cache)`` tuple): the change receives
    that slice (a copy) and its result replaces the slice out of place, the rest untouched and
    gradients flowing to both. Positions that do not fit raise one line.

    Hooks run in the order contexts were entered: a capture entered after an edit sees the edited
    values, one entered before sees the originals.

    An operation that writes into a tensor (``scores.masked_fill_(mask, v)``, ``h += x``,
    ``x[i] = v``, ``out=``) is usually a statement whose returned value nobody reads: it runs on a
    private copy, the changes apply to what it wrote there, and the result is copied into the tensor
    it writes, which the model reads on (gradients flow through the change). An operation selector
    that matched no operation in a pass its module ran raises :class:`~hookscope.SelectionError`
    when the block ends, naming the closest operations that ran.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with hookscope.edit(net, "0", output=hookscope.ablate([0, 1, 2])):
        ...     y = net(torch.randn(4, 2))
        >>> bool((y == 0).all())
        True
        >>> bil = torch.nn.Bilinear(2, 2, 1)
        >>> with hookscope.edit(bil, "", inputs={1: torch.zeros(1, 2)}):
        ...     z = bil(torch.ones(1, 2), torch.ones(1, 2))
        >>> torch.equal(z, bil.bias.reshape(1, 1))
        True
    """
    changes = {
        "output": _as_fn(output, "output"),
        "grad_input": _as_fn(grad_input, "grad_input"),
        "grad_output": _as_fn(grad_output, "grad_output"),
    }
    by_input = _input_changes(input, inputs)
    if not by_input and all(v is None for v in changes.values()):
        raise HookscopeError(
            "edit() needs at least one of input=, inputs=, output=, grad_input=, grad_output="
        )
    positions = as_at(at)
    if positions is not None and (by_input or changes["output"] is None or changes["grad_input"]
                                  or changes["grad_output"]):
        raise HookscopeError("at= picks positions of the output, so it goes with output= alone; "
                             "make the other changes in a second edit(...) without at=")
    selected = layers(model, *selectors)
    check_hookable(selected)
    check_writable(selected, bool(by_input or changes["grad_input"]))  # components: output= alone, never attn.pattern
    return Edit(model, selected, changes, by_input, positions)


def _input_changes(input: Any, inputs: Mapping[int | str, Any] | None) -> dict[int | str, Change]:
    if inputs is not None and not isinstance(inputs, Mapping):
        raise HookscopeError(
            f"inputs= takes a dict from input position or keyword name to a change, not "
            f"{type(inputs).__name__}; for example inputs={{1: fn, 'mask': tensor}}"
        )
    items: dict[int | str, Any] = dict(inputs or {})
    if input is not None:
        if 0 in items:
            raise HookscopeError("input= and inputs={0: ...} both change the first input; give one")
        items[0] = input
    out: dict[int | str, Change] = {}
    for key, change in items.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)) or (isinstance(key, int) and key < 0):
            raise HookscopeError(
                f"inputs= key {key!r} is neither an input position (0, 1, ...) nor a keyword name"
            )
        fn = _as_fn(change, f"input {key!r}")
        if fn is not None:
            out[key] = fn
    return out


@checked
def ablate(channels: int | Sequence[int], dim: int = 1, value: float = 0.0) -> Change:
    """A change that sets whole channels (indices along ``dim``) to ``value``, out of place.

    Example:
        >>> ablate([0])(torch.ones(1, 2, 1, 1)).flatten().tolist()
        [0.0, 1.0]
    """
    index = _channel_list(channels)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise HookscopeError(f"ablate(dim={dim!r}): dim is the channel dimension, an int such as 1")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HookscopeError(f"ablate(value={value!r}): value must be a number such as 0.0")
    lo, hi = min(index), max(index)

    def fn(t: Any) -> Any:
        def one(x: torch.Tensor) -> torch.Tensor:
            if not -x.dim() <= dim < x.dim():
                raise HookscopeError(
                    f"cannot ablate dim {dim} of a tensor of shape {tuple(x.shape)}; pass dim= "
                    f"between {-x.dim()} and {x.dim() - 1}"
                )
            size = x.shape[dim]
            if hi >= size or lo < -size:
                bad = hi if hi >= size else lo
                raise HookscopeError(
                    f"ablate: channel {bad} is out of range for dim {dim} of a tensor of shape "
                    f"{tuple(x.shape)}; channels run 0..{size - 1}"
                )
            idx = torch.as_tensor([i % size for i in index], device=x.device)
            return x.index_fill(dim, idx, value)

        return tree_map(one, t)

    return fn


def _channel_list(channels: Any) -> list[int]:
    try:
        items = [channels] if isinstance(channels, int) else list(channels)
        if any(isinstance(i, bool) for i in items):
            raise TypeError
        index = [operator.index(i) for i in items]  # ints, numpy integers, 0-d integer tensors
    except TypeError:
        raise HookscopeError(
            f"ablate({channels!r}): channels are an int or a list of ints, such as ablate([3, 7])"
        ) from None
    if not index:
        raise HookscopeError("ablate([]) names no channel to ablate; pass at least one, such as ablate([0])")
    return index


@checked
def scale(factor: float) -> Change:
    """A change that multiplies every tensor by ``factor`` (for activations or gradients).

    Example:
        >>> scale(0.5)(torch.ones(2)).tolist()
        [0.5, 0.5]
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float, torch.Tensor)):
        raise HookscopeError(f"scale({factor!r}): the factor must be a number (or a tensor)")
    return lambda t: tree_map(lambda x: x * factor, t)
