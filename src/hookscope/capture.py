"""Record what selected modules receive and produce, forward and backward, one record per call.

One file past 500 lines: :func:`capture` and its context object share the rules of what is kept of a call
(copies, aliases, objects holding tensors), and half the file is their documented examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ._tree import map_exposed, tensors, tree_map
from .core.calls import CallStack
from .core.compiled import HookRefresh, compiled_modules, eager, is_compiled
from .core.guard import FAST_PATH_TYPES, Slot, held_by, origin, plain_output, release, settle_inputs
from .core.hooks import HookGroup, Orphans, ThreadScope
from .core.ops import SEP, OpSite, call_name, counts, covered, current_function, missed, seen_ops, written
from .errors import HookscopeError, SelectionError, StopForward, checked, did_you_mean
from .generation import FollowedPositions, TokenPositions
from .records import HOLE, CallRecord, Recording, Retention
from .records.retention import renamed_device
from .selection import At, Selector, aliases_of, as_at, check_hookable, layers

__all__ = ["capture", "Capture", "FIELDS", "boundary_modules", "check_hookable"]

FIELDS = ("input", "output", "grad_input", "grad_output")
_GROUPS = {"all": FIELDS, "grads": ("grad_input", "grad_output"), "io": ("input", "output")}


def parse_keep(keep: str | Iterable[str]) -> frozenset[str]:
    """``"output"``, ``"all"``, ``("input", "grad_output")`` ... -> the set of fields to record."""
    items = [keep] if isinstance(keep, str) else list(keep)
    out: set[str] = set()
    for k in items:
        if k in _GROUPS:
            out.update(_GROUPS[k])
        elif k in FIELDS:
            out.add(k)
        else:
            choices = list(FIELDS) + list(_GROUPS)
            raise HookscopeError(
                f"keep={k!r} is not something a capture records.{did_you_mean(str(k), choices)} "
                f"Use any of {', '.join(choices)}"
            )
    if not out:
        raise HookscopeError("keep= is empty; name at least one of " + ", ".join(FIELDS))
    return frozenset(out)


ORPHANED = ("its output is a view of another tensor (Flatten, a slice, a reshape) that an in-place op "
            "rewrote after the module returned, and PyTorch then drops the gradient hooks of the view; "
            "make that op out of place (inplace=False)")



def _inside_containers(obj: Any) -> set[int]:
    """``id()`` of the tensors of ``obj`` found in a list, dict or object (all tensors but those
    reached through tuples only)."""
    through_tuples: list[int] = []

    def note(t: torch.Tensor) -> torch.Tensor:
        through_tuples.append(id(t))
        return t

    map_exposed(note, obj)
    every: dict[int, int] = {}
    for t in tensors(obj):
        every[id(t)] = every.get(id(t), 0) + 1
    for i in through_tuples:
        every[i] -= 1
    return {i for i, n in every.items() if n > 0}


def _unkeepable(where: Any) -> Slot:
    """A record that refuses to be read: the value held an object whose copy is the object itself,
    so its tensors could not be kept apart from the model's."""
    slot = Slot(torch.empty(0), "copied", where, fix="")
    slot.blind = ("it holds an object whose copy (copy.copy) is the object itself, so its tensors could not "
                  "be kept apart from the model's; return a tuple, list, dict, dataclass or plain object")
    return slot

class Capture(Recording):
    """A context that records selected modules; after the block it is the :class:`Recording`.

    Build it with :func:`capture`. It records the calls made in the thread that opened it and in
    threads started while it is open (DataParallel's replicas, your own workers); calls that
    threads which already existed make meanwhile (another capture's thread, a server's pool) are
    not recorded.
    """

    def __init__(
        self,
        model: nn.Module,
        selected: list[tuple[str, nn.Module]],
        keep: frozenset[str],
        retention: Retention,
        stop: bool,
        aliases: dict[str, str] | None = None,
        at: At | None = None,
        last: int | None = None,
        on_call: Callable[[CallRecord], object] | None = None,
    ) -> None:
        super().__init__([n for n, _ in selected], aliases, keep)
        self.at = at  # positions of the main output tensor to keep, or None for the whole output
        self.last = last  # keep only the last N calls of each module
        self.on_call = on_call  # hand each call to this function and keep nothing
        self._model: nn.Module | None = model
        self._targets: list[tuple[str, nn.Module]] | None = selected
        self.retention = retention
        self.stop = stop
        self._group = HookGroup()
        self._refresh = HookRefresh(model)
        self._call_slots: dict[int, list[Slot]] = {}  # call index -> the slots it keeps watched (last=, on_call=)
        self._slots: list[Slot] = []  # the slots kept watched otherwise, until the block ends
        self._call_hooks: dict[int, list[RemovableHandle]] = {}  # call index -> its gradient hooks (last=N)
        self._remaining: set[str] = set()
        self._scope = ThreadScope()
        self._orphans = Orphans()  # grad_output hooks on view outputs, orphaned by an in-place op
        self._sites = [s for _, s in selected if isinstance(s, OpSite)]
        self._written: dict[int, tuple[Any, Any, list[Slot | None]]] = {}  # id(call) -> (tensor, node before, grads)
        self._handed: dict[int, dict[int, tuple[torch.Tensor, int]]] = {}  # id(call) -> input aliases' originals
        self._since: dict[int, tuple[int, int]] = {}
        self.stopped = False

    # lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Capture:
        if self._targets is None:
            raise HookscopeError("this capture has already run; call hookscope.capture(...) again")
        assert self._model is not None
        self._scope.open()
        compiled = is_compiled(self._model)
        if compiled:
            # a guarded alias must not reach compiled graph pieces (their out= ops refuse subclasses)
            copy = "always" if self.retention.copy == "auto" else self.retention.copy
            self.retention = dataclasses.replace(self.retention, copy=copy, guard=False)
        try:
            if isinstance(self.at, TokenPositions):  # resolved at each forward from the model's own inputs
                self.at = self.at.follow(self._model, self._group)
            globs: list[tuple[str, nn.Module]] = [(n, g) for n, g in self._targets  # checked once per block
                                                  if isinstance(g, OpSite) and g.is_pattern]
            for name, module in self._targets:
                if not covered(module, globs):  # a glob beside it records its calls, once
                    self._register(name, module, compiled)
            if self.retention.guards_any():
                for module in boundary_modules(self._model):
                    self._group.add(module.register_forward_pre_hook(settle_inputs, with_kwargs=True))
                self._group.add(self._model.register_forward_hook(plain_output))
            self._refresh.open()
        except BaseException:
            self._close()
            raise
        self._since = counts(self._sites)
        self._remaining = set(self.selected)
        return self

    def _register(self, name: str, module: nn.Module, compiled: bool) -> None:
        (pre, with_kwargs), post = self._hooks(name, module)
        if compiled:  # hooks run eagerly between graph pieces: dynamo cannot trace their state
            pre, post = eager(pre), eager(post)
        self._group.add(module.register_forward_pre_hook(pre, with_kwargs=with_kwargs))
        self._group.add(module.register_forward_hook(post, with_kwargs=isinstance(module, OpSite)))  # out=

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._close()
        if isinstance(exc, StopForward) and exc.owner is self:
            self.stopped = True
            return True
        if exc is None and isinstance(self.at, FollowedPositions):
            self.at.check()
        unmatched = missed(self._sites, self._since) if exc is None else None
        if unmatched is not None:  # only the finished pass tells a misspelt operation from one not run yet
            raise SelectionError(unmatched)
        return False

    def _close(self) -> None:
        self._group.remove()  # sets closed first: a hook still running releases what it keeps
        for _, site in self._targets or ():
            if isinstance(site, OpSite) and seen_ops(site):
                self.ops_seen[site.owner_name] = list(seen_ops(site))
        self._remove_call_hooks()
        self._orphans.settle()
        self._refresh.close()
        self._scope.close()
        self._release_all()
        with self._lock:  # what calls that raised left pending: nothing of the model outlives the context
            self._written.clear()
            self._handed.clear()
        self._model = None  # nothing of the model outlives the context
        self._targets = None

    def remove(self) -> None:
        """Remove every hook now (the context does this by itself on exit). Idempotent."""
        self._close()

    def clear(self) -> None:
        """Forget every record and what it kept (a capture left open over many batches stays flat).

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
            >>> with hookscope.capture(net) as rec:
            ...     for _ in range(3):
            ...         rec.clear()
            ...         _ = net(torch.ones(1, 2))
            >>> len(rec.calls)
            1
        """
        self._remove_call_hooks()
        self._release_all()
        super().clear()

    def _release_all(self) -> None:
        with self._lock:
            slots, self._call_slots = self._call_slots, {}
            kept, self._slots = self._slots, []
        release(kept + [s for watched in slots.values() for s in watched])

    def _remove_call_hooks(self) -> None:
        """Remove the gradient hooks filed per call (last=N); the group holds them otherwise."""
        with self._lock:
            hooks, self._call_hooks = self._call_hooks, {}
        for handles in hooks.values():
            for h in handles:
                h.remove()

    def _add(self, name: str, file: bool = True) -> CallRecord:
        if self.last is None and self.on_call is None:
            return super()._add(name, file)
        call = super()._add(name, file=file and self.on_call is None)  # on_call: numbered, never kept
        if self.last is not None:
            self._trim(name, self.last)
        return call

    def _trim(self, name: str, last: int) -> None:
        """Drop the calls of ``name`` older than the last ``last`` ones, and what they kept."""
        with self._lock:
            calls = self._layers[name].calls
            old = calls[: max(0, len(calls) - last)]
            if not old:
                return
            del calls[: len(old)]
            for c in old:
                self.calls.remove(c)  # the oldest calls sit near the front: a short scan
        self._forget(old, lambda c: (
            f"call {c.index} of {c.name!r} was dropped: capture(last={last}) keeps only the last {last} calls "
            "of each module; read it before more calls run, or raise last="))

    def _forget(self, calls: list[CallRecord], why: Callable[[CallRecord], str]) -> None:
        """Mark ``calls`` dropped; release their slots and remove their gradient hooks."""
        with self._lock:
            for c in calls:
                c.drop(why(c))
            slots = [s for c in calls for s in self._call_slots.pop(c.index, ())]
            hooks = [h for c in calls for h in self._call_hooks.pop(c.index, ())]
        watched = [s for s in slots if s.policy != "copied"]  # a copied slot is in no registry
        if watched:
            release(watched)
        for h in hooks:
            h.remove()

    def _hand(self, call: CallRecord) -> None:
        """``on_call``: hand the finished call to the user's function, then forget it."""
        assert self.on_call is not None
        try:
            self.on_call(call)
        finally:
            self._forget([call], lambda c: (
                f"call {c.index} of {c.name!r} was handed to on_call and not kept (capture(on_call=...) keeps "
                "nothing); copy what you need inside the function"))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Call the model inside this capture; with ``stop=True`` returns ``None`` once stopped.

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
            >>> with hookscope.capture(net, "0", stop=True) as rec:
            ...     print(rec.run(torch.ones(1, 2)))  # '1' never runs
            None
            >>> rec["0"].output.shape, "1" in rec
            (torch.Size([1, 2]), False)
        """
        if self._model is None:
            raise HookscopeError("run() needs an open capture: call it inside the with block")
        try:
            return self._model(*args, **kwargs)
        except StopForward as e:
            if e.owner is not self:
                raise
            self.stopped = True
            return None

    # hooks ----------------------------------------------------------------------------------
    def _keep_tree(self, obj: Any, call: CallRecord, field: str, held: Any = None) -> tuple[Any, Any]:
        """(tree of slots, tree the model goes on with) for one input or output.

        Tensors reached through tuples are kept as :meth:`Retention.keep` says (large ones handed
        on as guarded aliases); tensors inside lists, dicts and objects are recorded as copies and
        their containers handed back untouched, since the model may hold and change them.
        """
        where = (field, call.name, call.index)
        if isinstance(obj, torch.Tensor):  # the common case, without the walks below
            slot, alias = self.retention.keep(obj, where, held)
            self._file([slot], call)
            return slot, alias
        kept: list[Slot] = []
        exposed: dict[int, Slot] = {}
        inside = _inside_containers(obj)

        def hand_on(t: torch.Tensor) -> torch.Tensor:
            if id(t) in inside:  # also in a list, dict or object: recorded as a copy, never aliased
                return t
            slot, alias = self.retention.keep(t, where, held)
            kept.append(slot)
            exposed[id(t)] = slot
            return alias

        occurrences: list[None] = []

        def record(t: torch.Tensor) -> Slot:
            occurrences.append(None)
            slot = exposed.get(id(t))
            if slot is None:
                slot = self.retention.keep(t, where, held, inner=True)[0]
                kept.append(slot)
            return slot

        if where[0] == "input" and isinstance(obj, dict):  # kwargs: a dict PyTorch made for the call
            new = {k: map_exposed(hand_on, v) for k, v in obj.items()}
            aliases = obj if all(new[k] is v for k, v in obj.items()) else new
        else:
            aliases = map_exposed(hand_on, obj)
        slots = tree_map(record, obj)
        self._file(kept, call)
        found: list[Slot] = []
        tree_map(found.append, slots, leaf=Slot)
        if len(found) < len(occurrences):  # an object whose copy is itself still holds live tensors
            return _unkeepable(where), aliases
        return slots, aliases

    def _file(self, kept: list[Slot], call: CallRecord) -> None:
        if self.last is None and self.on_call is None:  # nothing is dropped before the block ends
            self._slots.extend(kept)
            if self._group.closed:  # closed meanwhile by another thread: keep nothing watched
                release(kept)
            return
        with self._lock:
            if not (self._group.closed or call.dropped):
                self._call_slots.setdefault(call.index, []).extend(kept)
                return
        release(kept)  # closed meanwhile by another thread, or dropped (last=N): keep nothing watched

    def _watch_handle(self, call: CallRecord, handle: RemovableHandle) -> None:
        """Own a gradient hook of ``call``: with last=N it goes when the call is dropped."""
        if self.last is None:
            self._group.add(handle)
            return
        with self._lock:
            if not (self._group.closed or call.dropped):
                self._call_hooks.setdefault(call.index, []).append(handle)
                return
        handle.remove()

    def _ours(self, module: nn.Module, target: nn.Module) -> bool:
        """A call this capture records: not from a thread that existed before it opened."""
        return module is not target or self._scope.sees()

    def _hooks(self, name: str, target: nn.Module) -> tuple[Any, Any]:
        """The (pre-hook, takes kwargs) and post-hook that record one selected module."""
        keep = self.keep
        want_in, grad_in = "input" in keep, "grad_input" in keep
        open_calls: CallStack[CallRecord] = CallStack()  # per thread: DataParallel runs replicas in threads

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
            # kwargs may be missing: PyTorch calls a pre-hook removed mid-call without them
            if not self._ours(module, target) or self._group.closed:
                return None
            call = self._add(call_name(target, name))  # at the start, so records are in the order calls began
            open_calls.push(call)
            if "output" in keep:
                call.mark_running()
            if not (want_in or grad_in):
                return None
            into = written(current_function(), args, kwargs or {}) if isinstance(target, OpSite) else None
            writes_first = into is not None and into[0] == 0
            return self._record_inputs(call, args, kwargs or {}, held_by(module, args[:1]) if writes_first else None)

        def post(module: nn.Module, args: tuple[Any, ...], *rest: Any) -> Any:
            output = rest[-1]  # (kwargs, output) for an operation, (output,) for a module
            if not self._ours(module, target):
                return None
            call = open_calls.pop()
            if call is None:  # began before the capture opened
                call = self._add(call_name(target, name))
            into = written(current_function(), args, rest[0]) if len(rest) == 2 else None
            if into is not None:  # the model reads the written tensor on: record it, copied at once
                value = output if output is not None else into[1]  # x[i] = v returns None
                self._record_output(call, value, held_by(module, (*args, value)), wrote=True)
                new = output
            else:
                new = self._record_output(call, output, held_by(module, args))
            if grad_in and isinstance(target, OpSite):
                self._watch_written(call, args)
            if self.on_call is not None:
                self._hand(call)
            if self.stop:
                self._remaining.discard(name)
                if not self._remaining:
                    raise StopForward(self)
            return None if new is output else new

        return (pre, True), post

    def _record_inputs(self, call: CallRecord, args: tuple[Any, ...], kwargs: dict[str, Any],
                       written: Callable[[], set[int]] | None = None) -> Any:
        """``written``: the memory of the first input, when an operation writes into it (``add_``):
        the operation must write into the model's tensor itself, never an alias of it, so the
        value before the write is kept as a copy."""
        new_args, new_kwargs = args, kwargs
        writes_first = written is not None
        if "input" in self.keep:
            kept_args, new_args = self._keep_tree(args, call, "input", written)
            kept_kwargs, new_kwargs = self._keep_tree(kwargs, call, "input")
            call.set_inputs(kept_args, kept_kwargs)
            if writes_first and new_args is not args:
                new_args = (args[0], *new_args[1:])
        if "grad_input" in self.keep:
            new_args = self._watch_inputs(call, new_args, writes_first, args)
        if new_args is args and new_kwargs is kwargs:
            return None
        return new_args, new_kwargs

    def _record_output(self, call: CallRecord, output: Any, held: Any = None, wrote: bool = False) -> Any:
        """``wrote``: the output is a tensor an operation wrote into, which the model holds on to."""
        if "grad_input" in self.keep:
            call.check_inputs()
        new_output = output
        if "output" in self.keep and not self._group.closed and not call.dropped:
            if self.at is not None:  # a record of the slice alone; the model goes on with its output as is
                where = ("output", call.name, call.index)
                slot = self.retention.keep(self.at.take(output, call.name), where, inner=True)[0]
                self._file([slot], call)
                call.set_output(slot)
            else:
                kept, new_output = self._keep_tree(output, call, "output", held)
                call.set_output(kept)
        if "grad_output" in self.keep:
            with self._lock:
                handed = self._handed.pop(id(call), {})
            self._watch_outputs(call, output, handed, wrote)
        return new_output

    def _grad_setter(self, call: CallRecord, grads: list[Slot | None], i: int, where: Any, adopted: bool = False,
                     key: int | None = None) -> Any:
        ret, orphans = self.retention, self._orphans

        def hook(g: torch.Tensor) -> None:
            orphans.arrived(key)
            if not call.dropped:  # a gradient arriving for a dropped call (last=N) is not kept
                grads[i] = ret.keep_grad(g, where, adopted)

        return hook

    def _watch_outputs(self, call: CallRecord, output: Any, handed: dict[int, tuple[torch.Tensor, int]],
                       wrote: bool = False) -> None:
        # Tensor hooks on the output itself, not register_full_backward_hook: the full backward hook
        # breaks when an in-place op follows the module (pytorch/pytorch#61519), and a hook on an
        # alias is orphaned by such an op; a hook on the original fires with the true grad_output.
        outs = list(tensors(output))
        grads = call.expect_grad_output(tree_map(lambda t: HOLE, output), len(outs))
        if SEP in call.name and not torch.is_grad_enabled():
            call.lose_grad_output(f"the operation {call.name!r} ran where autograd records nothing (under torch.no_grad, "
                                  "or inside a custom autograd Function, whose internals have no gradient of their "
                                  "own); run the model with gradients on, or select the Function's caller")
            return
        where = ("grad_output", call.name, call.index)
        for i, t in enumerate(outs):
            if t.requires_grad:
                t = origin(t)  # an alias this module was handed and returns: hooked where an in-place op keeps it
                given = handed.get(id(t))
                into = wrote
                if given is not None and t._version != given[1]:
                    # the module wrote into the input alias it was given (ReLU(inplace=True)) and returns it:
                    # the model goes on with the tensor the alias was made of, where the write landed
                    t, into = given[0], True
                if into and t._is_view():
                    self._watch_written_view(call, grads, i, where, t)
                    continue
                key = self._orphans.watch(t, lambda: call.lose_grad_output(ORPHANED))
                # a view's gradient goes on to its base as a view of the same memory, which a leaf
                # (a parameter the output is a view of) may adopt as .grad and accumulate into
                hook = self._grad_setter(call, grads, i, where, t._is_view(), key)
                self._watch_handle(call, t.register_hook(hook))
                self._orphans.bind(key, hook)

    def _watch_inputs(self, call: CallRecord, args: tuple[Any, ...], writes_first: bool = False,
                      given: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        # A fresh alias per call, so its hook sees only the gradient that flows through this module
        # (the input itself may feed other modules too, e.g. a residual branch). Only tensors
        # reached through tuples: a list or dict the caller passed is handed on as it is.
        # An operation writing into its first input (add_, +=) must write into the model's tensor
        # itself, not an alias: its gradient is read off the operation's node (_watch_written).
        grad_on = torch.is_grad_enabled()
        aliases: dict[int, torch.Tensor] = {}
        first = args[0] if writes_first else None
        originals: dict[int, tuple[torch.Tensor, int]] = {}

        def alias(t: torch.Tensor) -> torch.Tensor:
            if not (t.requires_grad and grad_on) or t is first:
                return t
            aliases[id(t)] = a = t.view_as(t)
            return a

        new_args: tuple[Any, ...] = map_exposed(alias, args)
        if aliases and "grad_output" in self.keep:  # the model's own tensors, for a module that writes into its input
            for t, own in zip(tensors(args), tensors(given or args)):
                if id(t) in aliases:
                    made = aliases[id(t)]
                    originals[id(made)] = (own, made._version)
            with self._lock:
                self._handed[id(call)] = originals
        every = list(tensors(args))
        grads = call.expect_grad_input(tree_map(lambda t: HOLE, args), len(every))
        where = ("grad_input", call.name, call.index)
        if first is not None and first.requires_grad and grad_on:
            self._written[id(call)] = (first, first.grad_fn, grads)
        for i, t in enumerate(every):
            if i == 0 and first is not None:
                continue
            a = aliases.get(id(t))
            if a is not None:
                # a leaf's .grad would adopt a view of this gradient and accumulate into it
                self._watch_handle(call, a.register_hook(self._grad_setter(call, grads, i, where, t.is_leaf)))
                call.watch_input(a)
            elif t.requires_grad and grad_on:
                call.unwatchable_input()
        return new_args


    def _watch_written_view(self, call: CallRecord, grads: list[Slot | None], i: int, where: Any,
                            view: torch.Tensor) -> None:
        """The gradient of a view just written in place: the model may go on with the view or with
        its base, and either way the gradient passes the base's node of the write (CopySlices), whose
        incoming gradient is the base's; the view's part of it is this output's gradient."""
        base = view._base
        if base is None or base.grad_fn is None:
            return
        node = base.grad_fn
        size, stride = view.size(), view.stride()
        offset = view.storage_offset() - base.storage_offset()
        layout = (base.size(), base.stride())
        setter = self._grad_setter(call, grads, i, where)

        def prehook(grad_outputs: Any) -> None:
            g = grad_outputs[0]
            if g is not None:
                full = torch.empty_strided(*layout, dtype=g.dtype, device=g.device)
                setter(full.copy_(g).as_strided(size, stride, offset))

        self._watch_handle(call, node.register_prehook(prehook))

    def _watch_written(self, call: CallRecord, args: tuple[Any, ...]) -> None:
        """The input gradient of an operation that wrote into its first input: what its backward
        node sends to the value before the write (the model's tensor now holds the value after)."""
        with self._lock:
            pending = self._written.pop(id(call), None)
        if pending is None:
            return
        first, before, grads = pending
        if args[0] is not first:
            call.note = ("an edit entered after this capture runs the operation on a copy of its input; enter the "
                         "capture after the edit (it then sees the edited values), or capture the edit's layer alone")
            return
        node = args[0].grad_fn
        nexts = [] if node is None else [n for n, _ in node.next_functions]
        j = next((k for k, n in enumerate(nexts) if before is not None and n is before), None)
        if node is None or j is None:  # a view written in place: autograd rebased it on its base
            call.note = ("the operation writes into a view of another tensor, and PyTorch rebases the view's "
                         "autograd history on its base; read grad_output of the operation that made the view")
            return
        setter = self._grad_setter(call, grads, 0, ("grad_input", call.name, call.index))

        def node_hook(grad_inputs: Any, grad_outputs: Any) -> None:
            if grad_inputs[j] is not None:
                setter(grad_inputs[j])

        self._watch_handle(call, node.register_hook(node_hook))


def boundary_modules(model: nn.Module) -> list[nn.Module]:
    """Modules that must receive plain tensors: compiled entries and native fast paths."""
    entries = set(map(id, compiled_modules(model)))
    return [m for m in model.modules() if id(m) in entries or isinstance(m, FAST_PATH_TYPES)]


_hand_back_plain = plain_output  # the old private name, until every caller uses plain_output


@checked
def capture(
    model: nn.Module,
    *selectors: Selector,
    keep: str | Iterable[str] = "output",
    copy: str = "auto",
    detach: bool = True,
    to: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    stop: bool = False,
    at: At | Any = None,
    last: int | None = None,
    on_call: Callable[[CallRecord], object] | None = None,
    device: torch.device | str | None = None,
) -> Capture:
    """Record what the selected modules receive and produce, one record per call.

    Args:
        model: any ``nn.Module``; DataParallel / DDP / ``torch.compile`` wrappers are seen through
            and records are keyed by the names of the model inside.
        *selectors: names, globs, ``"re:..."`` regexes, module types, modules or predicates (see
            :func:`hookscope.layers`). None selects every module.
        keep: what to record: ``"output"`` (default), ``"input"`` (positional and keyword),
            ``"grad_output"``, ``"grad_input"``, or groups ``"io"``, ``"grads"``, ``"all"``.
        copy: ``"auto"`` (the default): no copy unless something writes into a recorded tensor
            later (``ReLU(inplace=True)``, ``out += identity``), then a copy of that one tensor is
            made just before (with ``on_call=``, a copy at once: ``fn`` may keep what it reads);
            ``"always"``: copy every record;
            ``"never"``: no copy, and a record whose memory was overwritten raises
            :class:`~hookscope.MutationError` when read.
        detach: keep records without their autograd graph (default).
        to, dtype: move / cast records (for example ``to="cpu"`` frees accelerator memory).
        stop: end the forward pass once every selected module has run once (later layers are not
            computed). Use ``rec.run(x)``, or know that the rest of the ``with`` block is skipped.
        at: keep only these positions of each output's main tensor, e.g. ``hookscope.at[:, -1]``
            (the last token): the output itself when it is a tensor, else its first tensor (the
            hidden states of a ``(hidden, cache)`` tuple). The record's ``output`` is then that
            slice (a copy; under ``copy="never"`` a view that raises on reading if overwritten).
            Positions that do not fit an output raise one line. Works with ``keep="output"``.
        last: keep only the last ``last`` calls of each module: an older call is dropped as a newer
            one begins, with what it kept, so a capture left open over a long loop stays flat.
            ``call.index`` still counts every call; reading a dropped record raises.
        on_call: ``fn(call)`` is called with each call's record as soon as its module returns,
            and nothing is kept (``rec.calls`` stays empty). The tensors ``fn`` reads are copies
            the model cannot rewrite, so ``fn`` may keep them (unless ``copy="never"``). Forward
            fields only (``keep="output"``, ``"input"`` or ``"io"``); an exception in ``fn``
            propagates. Nested selected modules reach ``fn`` as they return (inner ones first).
        device: the former name of ``to=``: still taken, with a ``FutureWarning``.

    Returns:
        A context manager; inside and after the block it maps names to :class:`LayerRecord`. An
        operation selector that matched no operation in a pass its module ran raises
        :class:`~hookscope.SelectionError` when the block ends, naming the closest operations that ran.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True))
        >>> with hookscope.capture(net, "0") as rec:
        ...     y = net(-torch.ones(1, 4))
        >>> bool((rec["0"].output < 0).any())   # the true pre-ReLU values, not the rewritten ones
        True
        >>> with hookscope.capture(net, "0", last=2) as ring:  # a long loop stays flat
        ...     for _ in range(5):
        ...         y = net(torch.ones(1, 4))
        >>> [call.index for call in ring.calls]
        [3, 4]
        >>> sums = []
        >>> with hookscope.capture(net, "0", on_call=lambda call: sums.append(call.output.sum())) as none:
        ...     for _ in range(3):
        ...         y = net(torch.ones(1, 4))
        >>> len(sums), len(none.calls)
        (3, 0)
    """
    fields = parse_keep(keep)
    _check_bounds(last, on_call, fields)
    positions = as_at(at)
    if positions is not None and fields != {"output"}:
        raise HookscopeError(f"at= picks positions of the output, so it works with keep='output' only (got "
                             f"{sorted(fields)}); capture the rest without at= and index the records")
    if stop and fields & {"grad_input", "grad_output"}:
        raise HookscopeError(
            "stop=True ends the forward pass early, so no backward pass can record gradients; "
            "drop stop=True or keep only 'input'/'output'"
        )
    if device is not None:
        to = renamed_device("capture", device, to)
    policy = "always" if on_call is not None and copy == "auto" else copy
    retention = Retention(copy=policy, detach=detach, to=to, dtype=dtype)  # type: ignore[arg-type]
    selected = layers(model, *selectors)
    check_hookable(selected)
    return Capture(model, selected, fields, retention, stop, aliases_of(model, selected), positions,
                   last, on_call)


def _check_bounds(last: Any, on_call: Any, fields: frozenset[str]) -> None:
    """One-line refusals of a bad ``last=`` / ``on_call=``."""
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 1):
        raise HookscopeError(f"last={last!r} is not a number of calls; pass an int >= 1 (last=1 keeps the latest)")
    if on_call is None:
        return
    if not callable(on_call):
        raise HookscopeError(f"on_call={on_call!r} is not callable; pass a function that takes a CallRecord")
    if last is not None:
        raise HookscopeError("on_call= keeps nothing, so last= has nothing to bound; pass one of them")
    if fields & {"grad_input", "grad_output"}:
        raise HookscopeError(
            "on_call= hands each record on as its module returns, before any gradient exists; use "
            "keep='output', 'input' or 'io', or last=N to keep gradients of the latest calls")
