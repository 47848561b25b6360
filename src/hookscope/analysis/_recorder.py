"""The statistics engine under ``trace`` and ``watch``: hooks, their lifecycle, and failure naming.

Each hook reduces every tensor it sees to one small tensor of
:data:`~hookscope.analysis._reduce.STATS` on that tensor's own device and keeps it there; nothing
reaches the host until the rows are read (:func:`~hookscope.analysis._rows.gather`), and then the
numbers of each device come back in one transfer. Statistics are taken inside the hook, before any
later in-place op (``ReLU(inplace=True)``, ``out += identity``) can rewrite the tensor, so the
in-place trap of kept references does not apply to them.

``trace`` and ``watch`` are siblings on this floor: each is a :class:`RecorderSession` with its own
``sink`` for the events.

The speed shortcut of ``ReLU(inplace=True)`` (its output's statistics told from the pass over its
input) is ``_relu_shortcut``'s: the hooks ask it before and after such a call, and hand it the memo.

One file past 500 lines: the hooks, their lifecycle and the naming of failures all read and write one
session's state; split apart, each part would reach into the others' fields.
"""

from __future__ import annotations

import itertools
import math
import sys
import weakref
from collections.abc import Callable, Sequence
from types import CodeType, TracebackType
from typing import Any, TypeVar, cast

import torch
from torch import nn

from .._memory import TensorMemo
from .._tree import paths, tree_map
from ..core.calls import CallStack
from ..core.compiled import HookRefresh, eager
from ..core.guard import plain
from ..core.failure import forward_error, module_label, received
from ..core.hooks import HookGroup
from ..core.ops import SEP, OpSite, call_name, seen_ops
from ..errors import ForwardError, HookscopeError, did_you_mean
from ..selection import Selector, check_hookable, layers, named_modules, unwrap
from ._reduce import Scratch, on_host, stats_and_relu, tensor_stats
from ._relu_shortcut import Told, inplace_relu, settle_after, tell_before
from ._rows import Pending

__all__ = ["Context", "Recorder", "RecorderSession", "param_targets",
           "refresh_for", "select"]

_T = TypeVar("_T")


def _input_paths(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a call received, positional first, with its path (``input[0]``, ``input.mask``)."""
    found = [(f"input[{i}]{p}", t) for i, a in enumerate(args) for p, t in paths(a)]
    return found + [(f"input.{k}{p}", t) for k, v in kwargs.items() for p, t in paths(v)]


class _Memo:
    """Statistics already taken of the elements a tensor shows at their current version (an input is
    usually the output just traced; a ``flatten`` shows its input's elements): see
    :class:`~hookscope._memory.TensorMemo`, which never mistakes a freed tensor's memory.

    :meth:`stats_relu` and :meth:`check` also tell, from the same pass, the statistics the tensor
    will have after ``ReLU(inplace=True)`` (:func:`~hookscope.analysis._reduce.stats_and_relu`)."""

    def __init__(self) -> None:
        self._seen: TensorMemo[torch.Tensor] = TensorMemo()
        self._finite: TensorMemo[bool] = TensorMemo()
        self._scratch = Scratch()

    def stats(self, t: torch.Tensor) -> torch.Tensor:
        x = plain(t)  # not the guarded alias: asking for its storage would make it copy
        return self._seen.setdefault(x, lambda: tensor_stats(x, self._scratch))

    def stats_relu(self, t: torch.Tensor) -> torch.Tensor | None:
        """Reduce ``t`` (not reduced at this version) and remember it; the statistics of ``t.relu()``
        if the same pass tells them."""
        x = plain(t)
        found, after = stats_and_relu(x, self._scratch)
        self._seen.put(x, found)
        return after

    def check(self, t: torch.Tensor) -> torch.Tensor | None:
        """Reduce ``t`` without making it :meth:`known`, noting whether it is finite (:meth:`finite`);
        the statistics of ``t.relu()`` if the same pass tells them."""
        x = plain(t)
        found, after = stats_and_relu(x, self._scratch)
        if not found[6:].any():  # no NaN, no Inf
            self._finite.put(x, True)
        return after

    def known(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s elements were reduced at their current version (it was an output)."""
        return self._seen.get(plain(t)) is not None

    def seen(self, t: torch.Tensor) -> torch.Tensor | None:
        """The statistics of ``t``'s elements at their current version, if they were reduced."""
        return self._seen.get(plain(t))

    def finite(self, t: torch.Tensor) -> bool:
        """Whether :meth:`check` found ``t``'s elements finite at their current version."""
        return self._finite.get(plain(t)) is not None

    def remember(self, t: torch.Tensor, stats: torch.Tensor) -> None:
        """Take ``stats`` as those of ``t``'s elements at their current version."""
        self._seen.put(plain(t), stats)


def _call_namer(name: str, module: nn.Module) -> Callable[[], tuple[str, int]] | None:
    """For a site of several operations (``"h.0::soft*"``), a function giving the name of the
    operation whose hooks run now (``"h.0::softmax"``) and that operation's call number; ``None``
    for a module, or a site of one operation, whose calls go by ``name``.

    Example:
        >>> _call_namer("fc", nn.Linear(1, 1)) is None, _call_namer("fc::*", OpSite(nn.Linear(1, 1), "fc", "*")) is None
        (True, False)
    """
    if not (isinstance(module, OpSite) and module.is_pattern):
        return None
    counters: dict[str, itertools.count[int]] = {}

    def named() -> tuple[str, int]:
        here = call_name(module, name)
        counter = counters.get(here)
        if counter is None:
            counter = counters.setdefault(here, itertools.count())
        return here, next(counter)

    return named


def _owner(site: OpSite) -> nn.Module:
    """The module whose operations ``site`` stands for."""
    return site.owner


class _Operations(OpSite):
    """Several operation selectors of one module as one site, so that each call of an operation is
    seen once (``"*::*"`` and ``"::add"`` both select the model's ``add``): one row per call."""

    def __init__(self, sites: list[OpSite]) -> None:
        super().__init__(_owner(sites[0]), sites[0].owner_name, "|".join(s.pattern for s in sites))
        self.parts = list(sites)
        self.is_pattern = True  # each call goes by the operation's own name

    def matches(self, label: str) -> bool:
        return any(site.matches(label) for site in self.parts)


def _one_site_per_module(chosen: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """``chosen`` with the operation sites of one module made one (at the first one's place).

    Example:
        >>> fc = nn.Linear(1, 1)
        >>> sites = [("fc::*", OpSite(fc, "fc", "*")), ("fc", fc), ("fc::add", OpSite(fc, "fc", "add"))]
        >>> [(n, type(m).__name__) for n, m in _one_site_per_module(sites)]
        [('fc::*|add', '_Operations'), ('fc', 'Linear')]
    """
    by_owner: dict[int, list[OpSite]] = {}
    for _, m in chosen:
        if isinstance(m, OpSite):
            by_owner.setdefault(id(_owner(m)), []).append(m)
    if all(len(group) == 1 for group in by_owner.values()):
        return chosen
    out: list[tuple[str, nn.Module]] = []
    for name, m in chosen:
        group = by_owner.get(id(_owner(m))) if isinstance(m, OpSite) else None
        if group is None or len(group) == 1:
            out.append((name, m))
        elif group[0] is m:
            site = _Operations(group)
            out.append((site.site_name, site))
    return out


def _raised_in(exc: BaseException, codes: set[CodeType]) -> bool:
    """Whether ``exc`` passed through one of these functions (a hook of ours, not the model)."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def param_targets(model: nn.Module, selected: list[tuple[str, nn.Module]], *,
                  every: bool) -> list[tuple[str, str, nn.Parameter]]:
    """``(owner module, parameter name, parameter)`` for the trainable parameters to watch.

    With ``every``, all of ``model``'s; otherwise those of the selected modules and their
    submodules. Each parameter once, named after the module that owns it (its first name).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 1, bias=False)))
        >>> [(m, p) for m, p, _ in param_targets(net, [("1", net[1])], every=False)]
        [('1.0', 'weight')]
    """
    wanted = None if every else {id(p) for _, m in selected for p in m.parameters()}
    found: dict[int, tuple[str, str, nn.Parameter]] = {}
    for name, module in named_modules(model):
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in found and (wanted is None or id(p) in wanted):
                found[id(p)] = (name, pname, p)
    return list(found.values())


Context = tuple["str | None", int, str, "str | None", int]
"""Where a call's inputs were made: ``(parent, parent's call, parent's class, after, forward)``: the
innermost watched module running (``""`` the model's own forward; ``None`` the caller: a model
input), its direct child that finished last in that call (``None`` if none had yet), and which
forward pass of the model it is (counted from 0; -1 outside any)."""
_Box = list["str | None"]  # the last direct child of an open call that finished: set by the child
_Relu = list[Told]  # an in-place ReLU's input, its version, the statistics after
_Call = tuple[int, list[tuple[str, torch.Tensor, int]], str, nn.Module, _Box, _Relu]  # call, aliases, name, module, box, relu
_RootCall = tuple[int, _Box, list[tuple["weakref.ref[torch.Tensor]", int]]]  # call, box, the model's inputs


def _finite(t: torch.Tensor) -> bool:
    """Whether a CPU tensor holds no NaN and no Inf: one ``sum`` (a sum of finite values is finite
    unless it overflows: then the exact check). On the CPU ``.item()`` waits for no device: it costs
    what a small op costs (a 4-layer GPT-2 forward, one thread: 34 checks, ~0.3 ms of watch's ~8 ms)."""
    t = plain(t).detach()  # no autograd node, no guard of a kept alias
    wide = t if t.element_size() >= 4 else t.float()  # half precision overflows at 65504
    return math.isfinite(abs(wide.sum().item())) or bool(torch.isfinite(t).all())


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter; -1 for an inference tensor, which has none (``torch.inference_mode``)."""
    return -1 if t.is_inference() else t._version


def _same(t: torch.Tensor, refs: list[tuple[weakref.ref[torch.Tensor], int]]) -> bool:
    """Whether ``t`` is one of these tensors, unchanged since (an inference tensor can be rewritten
    unseen: never the same)."""
    return any(r() is t and v == _version(t) and v >= 0 for r, v in refs)


class Recorder:
    """Registers the statistics hooks on selected modules and hands every event to ``sink``.

    Forward: a pre-hook takes the inputs' statistics, a post-hook (``always_call``, so a failing
    call is seen) the outputs'. Backward: tensor hooks on each output and on a per-call alias of
    each input; not ``register_full_backward_hook``, which fails when an in-place op follows the
    module (pytorch/pytorch#61519). With ``params``, a post-accumulate-grad hook on each of those
    parameters reads its ``.grad``. The ``root`` model's own forward is always followed (no rows),
    so that a failure in it, outside every selected module, is named too. ``keep`` is the set of
    fields recorded (see :func:`recorded`).

    With ``received`` (watch), each call's inputs that no watched call output (made by the running
    parent's own code) are checked for NaN and Inf: on the CPU with one ``sum`` (finite sum, finite
    tensor; the exact check only when it is not), an event ``which="received"`` only when one is
    found; on other devices the statistics of each such input as an event, with no synchronisation.
    ``on_context`` is then told, for each call with an input event, where its inputs were made
    (:data:`Context`).

    ``on_pass``, when given, is called as each forward pass of the ``root`` model begins (not a
    call nested in another), before anything of that pass is recorded: a streaming trace gathers
    the previous pass's events there.

    A selected operation (an :class:`~hookscope.core.ops.OpSite`, ``"norm::div"``) is hooked like
    a module; a site of several operations (a glob) files each call under the operation that runs
    (``"norm::div"`` for ``"norm::*"``), numbered per operation. The sites of one module are made
    one (:func:`select`), so that a call matched by two selectors makes one set of records.

    Every module hook runs eagerly (:func:`~hookscope.core.compiled.eager`): under
    ``torch.compile`` the graph breaks around it instead of Dynamo tracing it. A hook that PyTorch
    still calls after :meth:`close` (another thread was between a module's hooks when the block
    ended) does nothing and keeps nothing.
    """

    def __init__(self, selected: list[tuple[str, nn.Module]], *, keep: frozenset[str],
                 sink: Callable[[Pending], None], root: nn.Module | None = None,
                 params: Sequence[tuple[str, str, nn.Parameter]] = (), received: bool = False,
                 on_context: Callable[[str, int, str, Context], None] | None = None,
                 on_pass: Callable[[], None] | None = None,
                 on_output: Callable[[str, Any], None] | None = None) -> None:
        self.selected, self.keep, self.sink = selected, keep, sink
        self.on_pass, self.on_output = on_pass, on_output
        self.received = received and "output" in keep  # the outputs' statistics say what was checked
        self.on_context = on_context
        # read in every hook: plain attributes, not set lookups
        self.inputs, self.outputs = "input" in keep, "output" in keep
        self.grad_inputs, self.grad_outputs = "grad_input" in keep, "grad_output" in keep
        self.root = root
        self.params = list(params)
        self.group = HookGroup()
        self.enabled = True
        self.failure: tuple[BaseException, ForwardError] | None = None  # the innermost failed call
        self.last_done: str | None = None  # the selected module that finished last in this forward
        self._memo = _Memo()
        self._open: CallStack[_Call] = CallStack()
        self._root_open: CallStack[_RootCall] = CallStack()
        self._root_calls = itertools.count()
        self._own_code: set[CodeType] = set()  # our forward hooks, to tell our errors from the model's

    def attach(self) -> None:
        """Register every hook (all of them or, if one registration fails, none).

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2))
            >>> rec = Recorder([("0", net[0])], keep=frozenset({"output"}), sink=print)
            >>> rec.attach(); len(rec.group)
            2
            >>> rec.group.remove(); len(net[0]._forward_hooks)
            0
        """
        try:
            targets = [(None, self.root)] if self.root is not None else []
            for name, module in [*targets, *self.selected]:
                pre, post = self._root_hooks() if name is None else self._hooks(name, module_label(name, module), module)
                self._own_code.update((pre.__code__, post.__code__))
                # own hook: the statistics engine reduces each tensor on its device in the hook; capture would keep it
                self.group.add(module.register_forward_pre_hook(eager(pre), with_kwargs=True))
                self.group.add(module.register_forward_hook(eager(post), with_kwargs=True, always_call=True))
            for owner, pname, p in self.params:
                # own hook: a parameter's gradient, reduced once accumulated (capture records module calls only)
                self.group.add(p.register_post_accumulate_grad_hook(self._param_hook(owner, pname)))
        except BaseException:
            self.group.remove()
            raise

    def operations_ran(self) -> list[str]:
        """Every operation (``module::op``) that a module of a selected operation ran while hooked.

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2))
            >>> rec = Recorder(select(net, ("0::lin",)), keep=frozenset({"output"}), sink=print)
            >>> rec.attach(); _ = net(torch.ones(1, 2)); rec.close()
            >>> rec.operations_ran()
            ['0::linear']
        """
        return [f"{site.owner_name}{SEP}{op}" for _, site in self.selected if isinstance(site, OpSite)
                for op in seen_ops(site)]

    def never_ran(self) -> list[str]:
        """The operation selectors that matched no operation that ran, each with the closest
        operations that did (a misspelt name: ``"'0::lin' never ran. Did you mean '0::linear'?"``).

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2))
            >>> rec = Recorder(select(net, ("0::lin",)), keep=frozenset({"output"}), sink=print)
            >>> rec.attach(); _ = net(torch.ones(1, 2)); rec.close()
            >>> rec.never_ran()
            ["'0::lin' never ran. Did you mean '0::linear'?"]
        """
        ran = self.operations_ran()
        out = []
        globs: dict[str, bool] = {}  # a glob's operation part -> whether some module ran a match
        for _, site in self.selected:
            seen = seen_ops(site)  # of the site hooked: the parts of a merged one never were
            for part in site.parts if isinstance(site, _Operations) else [site]:
                if not isinstance(part, OpSite):
                    continue
                hit = any(part.matches(op) for op in seen)
                if part.is_pattern:  # '*::*' over a container that runs no operation of its own is fine
                    globs[part.pattern] = globs.get(part.pattern, False) or hit
                elif not hit:
                    out.append(f"{part.site_name!r} never ran.{did_you_mean(part.site_name, ran)}")
        out += [f"no selected module ran an operation matching {p!r}" for p, hit in globs.items() if not hit]
        return out

    def close(self) -> None:
        """Remove every hook and forget the calls still open in any thread. Idempotent."""
        self.group.remove()  # closed first: a hook running now sees it and keeps nothing
        self._open.clear()
        self._root_open.clear()

    def _push(self, stack: CallStack[_T], entry: _T) -> bool:
        """Open a call on this thread's stack; False, keeping nothing, if the hooks are removed."""
        stack.push(entry)
        if self.group.closed:  # closed meanwhile by another thread: close() may have cleared already
            stack.pop()
            return False
        return True

    def _emit(self, name: str, call: int, phase: str, which: str, path: str, t: torch.Tensor) -> None:
        if self.enabled and not self.group.closed:
            self.sink((name, call, phase, which, path, t.shape, t.dtype, t.device, self._memo.stats(t)))

    def _grad_hook(self, name: str, call: int, which: str, path: str) -> Callable[[torch.Tensor], None]:
        return lambda g: self._emit(name, call, "backward", which, path, g)

    def _param_hook(self, owner: str, pname: str) -> Callable[[torch.Tensor], None]:
        counter = itertools.count()

        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if g is None:
                return
            if g.layout == torch.sparse_coo:  # nn.Embedding(sparse=True): the stored values
                g = g.coalesce().values()
            elif g.layout != torch.strided:
                g = g.to_dense()
            self._emit(owner, next(counter), "backward", "grad_param", pname, g)

        return hook

    def _failed(self, error: BaseException, label: str, args: tuple[Any, ...], kwargs: Any) -> None:
        """Note where ``error`` was raised: the post-hook of a call that raised it (innermost first)."""
        if self.failure is not None and self.failure[0] is error:  # the innermost call saw it first
            return
        got = received(args, kwargs if isinstance(kwargs, dict) else {})
        after = [] if self.last_done is None else [self.last_done]
        self.failure = (error, forward_error(error, label, got=got, after=after))

    def _root_hooks(self) -> tuple[Any, Any]:
        # PyTorch calls a with_kwargs hook removed since its call began without kwargs
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            if kwargs is None or self.group.closed:
                return
            if self._root_open.top() is None:
                self.last_done = None  # a new forward pass: what ran in the one before is not "before"
                if self.on_pass is not None and self.enabled:
                    self.on_pass()
            found = _input_paths(args, kwargs) if self.received else []
            refs = [(weakref.ref(t), _version(t)) for _, t in found]
            call = next(self._root_calls)
            entry: _RootCall = (call, [None], refs)
            if self._push(self._root_open, entry) and self.enabled:
                self._check("", call, found, (None, 0, "", None, call))  # the model's input

        def post(module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:  # rest: [kwargs,] output
            self._root_open.pop()
            error = sys.exc_info()[1]
            if not self.group.closed and rest[-1] is None and error is not None:  # always_call: it raised
                self._failed(error, module_label("", module), args, rest[0])

        return pre, post

    def _alias_inputs(self, args: tuple[Any, ...], found: list[tuple[str, torch.Tensor]],
                      aliases: list[tuple[str, torch.Tensor, int]]) -> tuple[Any, ...]:
        """``args`` with a fresh alias of each tensor that requires grad: its gradient is what
        flowed back through this call only. Positional tensors come first in ``found``, in
        ``tree_map``'s order."""
        names = iter([p for p, _ in found])

        def alias(t: torch.Tensor) -> torch.Tensor:
            path = next(names)
            if not t.requires_grad:
                return t
            a = t.view_as(t)
            aliases.append((path, a, a._version))
            return a

        result: tuple[Any, ...] = tree_map(alias, args)
        return result

    def _hooks(self, name: str, label: str, module: nn.Module) -> tuple[Any, Any]:
        counter = itertools.count()  # next() is atomic: DataParallel runs replicas in threads
        named = _call_namer(name, module)  # several operations: each call under its own name
        op = isinstance(module, OpSite)
        relu = inplace_relu(module) and self.outputs

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
            if kwargs is None or self.group.closed:  # removed since this call began (see _root_hooks)
                return None
            here, call = (name, next(counter)) if named is None else named()
            aliases: list[tuple[str, torch.Tensor, int]] = []
            context = self._context(module) if self.received else None
            entry: _Call = (call, aliases, here, module, [None], [])
            if not self._push(self._open, entry) or not self.enabled:
                return None
            if relu and len(args) == 1 and not kwargs:
                told = tell_before(self._memo, module, args[0], inputs=self.inputs, received=self.received)
                if told is not None:
                    entry[5].append(told)
            if not (self.inputs or self.grad_inputs or self.received):
                return None  # nothing of the inputs is wanted: not even walked
            found = _input_paths(args, kwargs)
            if self.inputs:
                if context is not None and self.on_context is not None:
                    self.on_context(here, call, "input", context)
                for path, t in found:
                    self._emit(here, call, "forward", "input", path, t)
            elif context is not None:
                # an operation's parameters are no code's making: a non-finite one shows in its output
                self._check(here, call, [(p, t) for p, t in found if not isinstance(t, nn.Parameter)] if op else found,
                            context)
            if self.grad_inputs and found and torch.is_grad_enabled() and getattr(module, "inplace", False) is not True:
                # an in-place module (ReLU(inplace=True)) would write into the alias: no gradient row
                # could come of it (see post), and autograd would rebuild the base's history around
                # the view (CopySlices: a full-size copy of the gradient in the backward pass)
                new_args = self._alias_inputs(args, found, aliases)
                return None if new_args is args else (new_args, kwargs)
            return None

        def post(module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:  # rest: [kwargs,] output
            top = self._pop(module)
            call, aliases, here = (top[0], top[1], top[2]) if top is not None else (-1, [], name)
            output, error = rest[-1], sys.exc_info()[1]
            if self.group.closed:
                return
            if self.received:
                self._finished(here)
            if output is None and error is not None:  # always_call: the forward raised
                self._failed(error, module_label(here, module) if isinstance(module, OpSite) else label, args, rest[0])
                return
            self.last_done = here
            if top is not None and top[5]:
                settle_after(self._memo, output, top[5][0])
            self._outputs(here, call, output)
            for path, a, version in aliases:
                if a._version == version:  # an in-place write detaches the alias's gradient (#61519)
                    # own hook: a tensor hook from the forward hook (full backward hooks fail after in-place ops)
                    self.group.add(a.register_hook(self._grad_hook(here, call, "grad_input", path)))

        return pre, post

    def _pop(self, module: nn.Module) -> _Call | None:
        """Close the innermost open call of ``module`` on this thread. An operation that raised
        never ran its post-hook: its call, left open above, is closed with it."""
        top = self._open.pop()
        while top is not None and top[3] is not module and isinstance(top[3], OpSite):
            top = self._open.pop()
        return top

    def _context(self, module: nn.Module) -> Context:
        """Where the inputs of a call of ``module`` starting now were made (see :data:`Context`)."""
        top, root = self._open.top(), self._root_open.top()
        forward = root[0] if root is not None else -1
        if top is not None:
            return top[2], top[0], type(top[3]).__name__, top[4][0], forward
        if root is None or module is self.root:
            return None, 0, "", None, forward
        return "", root[0], type(self.root).__name__, root[1][0], forward

    def _finished(self, name: str) -> None:
        """Note ``name`` as the last child that finished in the call running around it."""
        top = self._open.top()
        if top is not None:
            top[4][0] = name
        elif (root := self._root_open.top()) is not None:
            root[1][0] = name

    def _check(self, name: str, call: int, found: list[tuple[str, torch.Tensor]], context: Context) -> None:
        """Check the inputs of a call that no watched call output (see :class:`Recorder`)."""
        root = self._root_open.top()
        told = False
        for path, t in found:
            if not (t.is_floating_point() or t.is_complex()) or self._memo.known(t):
                continue  # integers are finite; an output's statistics are already an event
            if name and root is not None and _same(t, root[2]):
                continue  # the model's input, checked once when the forward began
            if on_host(t) and (self._memo.finite(t) or _finite(t)):
                continue
            if not told and self.on_context is not None:
                self.on_context(name, call, "received", context)
                told = True
            self._emit(name, call, "forward", "received", path, t)

    def stats_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The statistics already taken of ``t``'s elements at their current version (an output or
        input recorded), or ``None``: no pass is made."""
        return self._memo.seen(t)

    def _outputs(self, name: str, call: int, output: Any) -> None:
        """The events of one call's outputs, the hooks on their gradients, then :attr:`on_output`."""
        self._output_events(name, call, output)
        if self.on_output is not None and self.enabled:
            self.on_output(name, output)

    def _output_events(self, name: str, call: int, output: Any) -> None:
        if not (self.outputs or self.grad_outputs):
            return
        grads = self.grad_outputs and self.enabled and torch.is_grad_enabled()
        for path, t in paths(output, "output"):
            if self.outputs:
                self._emit(name, call, "forward", "output", path, t)
            if grads and t.requires_grad:
                # own hook: the output's gradient, reduced on its device as it arrives
                self.group.add(t.register_hook(self._grad_hook(name, call, "grad_output", path)))

    def forward_error(self, exc: BaseException | None) -> ForwardError | None:
        """The one-line :class:`~hookscope.ForwardError` for ``exc`` if a traced forward raised it.

        ``None`` for anything else: an error raised outside every forward pass, one of hookscope's
        own errors, or one that passed through hookscope's hooks (a bug of ours, left as it is).
        """
        if (exc is None or self.failure is None or self.failure[0] is not exc
                or isinstance(exc, HookscopeError) or _raised_in(exc, self._own_code)):
            return None
        return self.failure[1]

    def reraise(self, exc: BaseException | None) -> None:
        """Raise the :class:`~hookscope.ForwardError` (chained) for an exception a forward pass in
        the block raised; anything else is left as it is."""
        error = self.forward_error(exc)
        if error is not None and isinstance(exc, Exception):
            raise error from exc


_S = TypeVar("_S", bound="RecorderSession")


class RecorderSession:
    """The lifecycle shared by trace and watch: runs once, hooks removed on exit, errors re-raised.

    A subclass builds its :class:`Recorder` through ``RecorderSession.__init__`` with its own sink.
    """

    _kind = "trace"

    def __init__(self, selected: list[tuple[str, nn.Module]], *, keep: frozenset[str],
                 sink: Callable[[Pending], None], root: nn.Module | None,
                 params: Sequence[tuple[str, str, nn.Parameter]], model: nn.Module | None,
                 received: bool = False, on_context: Callable[[str, int, str, Context], None] | None = None,
                 on_pass: Callable[[], None] | None = None) -> None:
        self._rec = Recorder(selected, keep=keep, sink=sink, root=root, params=params, received=received,
                             on_context=on_context, on_pass=on_pass)
        self._refresh = refresh_for(model, root, selected)
        self._used = False

    def __enter__(self: _S) -> _S:
        if self._used:
            raise HookscopeError(f"this {self._kind} has already run; call hookscope.{self._kind}(...) again")
        self._used = True
        self._rec.attach()
        try:
            self._refresh.open()  # a compiled model that already ran must see the new hooks
        except BaseException:
            self._rec.close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.remove()
        self._rec.reraise(exc)

    def remove(self) -> None:
        """Remove every hook now (the context does this by itself on exit). Idempotent.

        Example:
            >>> net = nn.Sequential(nn.ReLU())
            >>> s = RecorderSession(select(net, ()), keep=frozenset({"output"}), sink=print, root=net,
            ...                     params=(), model=net).__enter__()
            >>> s.remove(); s.remove()
            >>> len(net[0]._forward_hooks)
            0
        """
        self._rec.close()
        self._refresh.close()  # after the hooks are gone: the graphs compiled without them are valid

    def operations_ran(self) -> list[str]:
        """Every operation (``module::op``) that a module of a selected operation ran in the block:
        the names a misspelt operation is told the closest of.

        Example:
            >>> net = nn.Sequential(nn.Linear(2, 2))
            >>> with RecorderSession(select(net, ("0::*",)), keep=frozenset({"output"}), sink=list, root=net,
            ...                      params=(), model=net) as s:
            ...     _ = net(torch.ones(1, 2))
            >>> s.operations_ran(), s.never_ran()
            (['0::linear'], [])
        """
        return self._rec.operations_ran()

    def never_ran(self) -> list[str]:
        """The operation selectors that matched no operation in the block, with the closest names
        that ran (see :meth:`Recorder.never_ran`)."""
        return self._rec.never_ran()

    def forward_error(self, exc: BaseException) -> ForwardError | None:
        """The one-line :class:`~hookscope.ForwardError` for ``exc`` if a forward pass in the block
        raised it, else ``None``: an error raised outside every forward pass, one of hookscope's own
        errors, or one that passed through hookscope's hooks (a bug of ours, left as it is).

        The block raises it by itself on exit; this is for code that caught the model's exception
        inside the block.

        Example:
            >>> class Pick(nn.Module):
            ...     def forward(self, x):
            ...         return x[5]
            >>> net = nn.Sequential(nn.Linear(2, 2), Pick())
            >>> s = RecorderSession(select(net, ()), keep=frozenset({"output"}), sink=list, root=net,
            ...                     params=(), model=net)
            >>> with s:
            ...     try:
            ...         _ = net(torch.ones(1, 2))
            ...     except IndexError as e:
            ...         print(s.forward_error(e))  # doctest: +NORMALIZE_WHITESPACE
            the forward pass failed in '1' (Pick), which received input[0] 1x2 float32, after '0' had
            run: IndexError: index 5 is out of bounds for dimension 0 with size 1; check the example
            input's shape and dtype
        """
        return self._rec.forward_error(exc)


def refresh_for(model: nn.Module | None, root: nn.Module | None,
                selected: list[tuple[str, nn.Module]]) -> HookRefresh:
    """The :class:`~hookscope.core.compiled.HookRefresh` of the model as the user passed it (with its
    ``torch.compile`` wrapper), so that hooks added to an already compiled model take effect."""
    if model is None:
        model = root if root is not None else nn.ModuleList([m for _, m in selected])
    return HookRefresh(model)


def select(model: nn.Module, selectors: tuple[Selector, ...]) -> list[tuple[str, nn.Module]]:
    """Resolve and check selectors; with none, every module but the root (a model without children
    selects itself). The operation sites of one module are made one.

    Example:
        >>> [name for name, _ in select(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ())]
        ['0', '1']
        >>> select(nn.ReLU(), ())
        [('', ReLU())]
    """
    inner, _ = unwrap(model)
    if selectors or next(inner.children(), None) is not None:
        chosen = _one_site_per_module(layers(model, *selectors))
    else:
        chosen = [("", inner)]
    check_hookable(chosen)
    return chosen
