"""Running one side of a comparison: its own copy of the inputs, the model put back afterwards,
and either a capture of every compared output (run A) or each output handed to the comparison as
it is produced (run B). A failing forward pass raises :class:`~hookscope.ForwardError`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from ..._tree import map_exposed, tensors, tree_map
from ...capture import boundary_modules, capture
from ...core.calls import CallStack
from ...core.compiled import HookRefresh, eager, is_compiled
from ...core.failure import forward_error, module_label, received
from ...core.guard import Slot, guardable, plain, plain_output, protect, release, settle_inputs
from ...core.hooks import HookGroup
from ...core.inputs import private
from ...core.state import RngDevices, own_arithmetic, restored
from ...errors import ForwardError, RecordError
from ...records import CopyPolicy, Recording, Retention
from ...core.ops import OpSite
from ...selection import unwrap
from ._settings import Settings
from ._tolerance import low_precision, narrowest

try:  # private, but the only way to step outside the caller's dispatch modes
    from torch.utils._python_dispatch import _disable_current_modes as _no_modes
except ImportError:  # pragma: no cover
    _no_modes = contextlib.nullcontext  # type: ignore[assignment]

__all__ = ["Shared", "Run", "record", "fresh_inputs", "by_call"]

Named = list[tuple[str, nn.Module]]
OnOutput = Callable[[str, Any, "torch.dtype | None"], None]  # name, output, autocast dtype so far


@dataclass(frozen=True)
class Shared:
    """What both runs share: the inputs, the random stream they start from, how outputs are kept."""

    inputs: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    seed: int | None
    rng: RngDevices
    no_grad: bool
    copy: str
    to: torch.device | str | None  # where run A's records are kept
    device: torch.device | None = None  # where the inputs go (None: a model's device, see fresh_inputs)


class Run(NamedTuple):
    """What one run leaves: its records (run A) and the order its compared calls finished in."""

    rec: Recording | None  # None for a run compared as it went (see Streamed)
    done: list[str]  # names of the compared calls, in the order they finished
    cast: list[torch.dtype | None]  # for each call of ``done``: the low precision computed in so far


def by_call(done: list[str], casts: list[torch.dtype | None]) -> dict[tuple[str, int], torch.dtype | None]:
    """``Run.cast`` keyed by ``(name, k)``: the ``k``-th call of ``name`` that finished.

    Example:
        >>> by_call(["0", "0", ""], [None, torch.bfloat16, torch.bfloat16])
        {('0', 0): None, ('0', 1): torch.bfloat16, ('', 0): torch.bfloat16}
    """
    seen: dict[str, int] = {}
    found: dict[tuple[str, int], torch.dtype | None] = {}
    for name, cast in zip(done, casts):
        k = seen.get(name, 0)
        seen[name] = k + 1
        found[(name, k)] = cast
    return found


# --- the inputs of one run ------------------------------------------------------------------------
def _home(model: nn.Module) -> torch.device | None:
    """The one device every parameter and buffer of ``model`` is on; None if none or several."""
    found = {t.device for t in (*model.parameters(), *model.buffers())}
    return found.pop() if len(found) == 1 else None


def fresh_inputs(model: nn.Module, inputs: Any, device: torch.device | None = None) -> tuple[Any, torch.device]:
    """A copy of the inputs for one run (an in-place op of run A cannot reach run B), moved to the
    model's device when they are all on another one (a CPU model against a CUDA one), or to
    ``device``; and the device the run computes on, for autocast.

    Example:
        >>> x = torch.ones(2)
        >>> (copied,), dev = fresh_inputs(torch.nn.Linear(2, 2), (x,))
        >>> torch.equal(copied, x), copied is x, dev
        (True, False, device(type='cpu'))
    """
    home = _home(model)
    found = {t.device for t in tensors(inputs)}
    to = device if device is not None else home if home is not None and len(found) == 1 and home not in found else None

    first = next(iter(found), None)
    return private(inputs, to), to or first or home or torch.device("cpu")


# --- the model put back -----------------------------------------------------------------------------
@contextlib.contextmanager
def _put_back(model: nn.Module, shared: Shared) -> Iterator[None]:
    """Every train/eval flag and buffer of ``model`` as before after the run (BatchNorm's statistics
    in train mode, a KV cache written in eval mode too), and the caller's random stream.

    The run starts from ``seed``, so both runs draw the same dropout masks; with ``seed=None`` it
    draws on from the caller's stream, which then stays where the run left it (a kept stream would
    be rewound, and run B would draw run A's numbers again).
    """
    with restored(model, buffers=True, rng=shared.rng, seed=shared.seed, keep_rng=shared.seed is not None):
        yield


def _storage(t: torch.Tensor) -> int:
    return plain(t).untyped_storage().data_ptr()  # plain: a guarded alias would count it as an escape


def _unshare_buffers(rec: Recording, model: nn.Module) -> None:
    """Give run A's outputs that share memory with a buffer their own copy, before its capture
    closes: run B, or putting the buffers back, may write there (a KV cache returned as a view)."""
    storages = {_storage(b) for b in model.buffers() if guardable(b)}
    if not storages:
        return
    for call in rec.calls:
        try:
            out = call.output
        except RecordError:  # the call raised, and the model went on
            continue
        if not any(guardable(t) and _storage(t) in storages for t in tensors(out)):
            continue
        where = ("output", call.name, call.index)

        def own(t: torch.Tensor) -> Slot:
            if guardable(t) and _storage(t) in storages:
                return Slot(plain(t).clone(), "copied", where)
            return Slot(t, "auto", where)  # as kept: a later write is still seen by its version

        call.set_output(tree_map(own, out))


# --- the hooks of one run ----------------------------------------------------------------------------
@contextlib.contextmanager
def _outside_the_run(device_type: str) -> Iterator[None]:
    """hookscope's own arithmetic inside run B's hooks: no autograd or autocast, and no
    torch-function or dispatch mode of the caller's either (they would change or count it)."""
    with own_arithmetic(device_type), torch._C.DisableTorchFunction(), _no_modes():
        yield


def _so_far(cast: torch.dtype | None, device_type: str, out: Any) -> torch.dtype | None:
    """The low precision a run computed in up to this output: ``cast`` so far, narrowed by the
    autocast running now and by a bfloat16/float16 tensor in the output. Sticky: an output cast
    back to float32 later still carries the error of what was computed before it.

    Example:
        >>> _so_far(None, "cpu", (torch.ones(1, dtype=torch.float16), 2)), _so_far(None, "cpu", torch.ones(1))
        (torch.float16, None)
    """
    found = [t.dtype for t in tensors(out) if low_precision(t.dtype)]
    if torch.is_autocast_enabled(device_type):  # before _outside_the_run turns it off
        found.append(torch.get_autocast_dtype(device_type))
    return narrowest(cast, *found) if found else cast


Open = tuple[str, nn.Module, tuple[Any, ...], dict[str, Any]]  # a running call: name, module, inputs
_NOTHING = torch.empty(0)  # what a run B marker keeps (never written: a write clones it first)


class Tracker:
    """The hooks of one run: which compared module is running (to say where a failure happened),
    which calls finished, and (run B) each output handed to the comparison as it is produced."""

    def __init__(self, model: nn.Module, label: str, device_type: str, on_output: OnOutput | None,
                 like_a: Retention) -> None:
        self.model, self.label, self.device_type = model, label, device_type
        self.on_output, self.like_a = on_output, like_a
        self.done: list[str] = []
        self.cast: torch.dtype | None = None  # the low precision this run computed in so far
        self.casts: list[torch.dtype | None] = []  # see Run.cast
        self.running: CallStack[Open] = CallStack()
        self.failed: list[BaseException] = []  # errors of the comparison, not of the model
        self.markers: list[Slot] = []  # slots that keep nothing, for the aliases handed on
        self.group = HookGroup()
        self.refresh = HookRefresh(model)  # before run A's capture opens and swaps compiled entries

    def enter(self, name: str) -> Callable[..., None]:
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            self.running.push((name, module, args, kwargs or {}))
        return pre

    def leave(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
        def post(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
            # also drops calls above it that raised and were caught by the model
            while (top := self.running.pop()) is not None and top[1] is not module:
                pass
            self.done.append(name)
            self.cast = _so_far(self.cast, self.device_type, out)
            self.casts.append(self.cast)
            if self.on_output is None:
                return None
            try:
                with _outside_the_run(self.device_type):
                    self.on_output(name, tree_map(plain, out), self.cast)  # now, before an in-place op rewrites it
            except BaseException as e:
                self.failed.append(e)
                raise
            new = map_exposed(self.hand_on, out)  # as capture(): lists, dicts, objects handed back as they are
            return None if new is out else new
        return post

    def hand_on(self, t: torch.Tensor) -> torch.Tensor:
        # The compared run is handed the same kind of tensors the recorded run gets from capture():
        # guarded aliases of large outputs, registered by a slot that keeps nothing but has run A's
        # copy policy, so that the guard treats them as run A's records (their views stay guarded,
        # a hand-over makes them plain alike); both runs then take the same PyTorch code paths.
        if not self.like_a.guards(t):
            return t
        marker = Slot(_NOTHING, self.like_a.copy, f"run {self.label}")
        self.markers.append(marker)
        return protect(t, marker)

    def register(self, targets: Named) -> None:
        """Hook the compared modules (and, for run B, what capture() hooks for run A)."""
        # Under torch.compile, hooks run eagerly between graph pieces instead of being traced.
        wrap: Callable[[Any], Any] = eager if is_compiled(self.model) else (lambda f: f)
        for name, module in targets:
            # own hook: run B hands each output to the comparison as it is produced, keeping none (run A is a capture)
            self.group.add(module.register_forward_pre_hook(wrap(self.enter(name)), with_kwargs=True))
            self.group.add(module.register_forward_hook(wrap(self.leave(name))))
        if self.on_output is not None and self.like_a.guards_any():  # as capture() does for run A
            for module in boundary_modules(self.model):
                # own hook: what capture() registers for run A, so that run B takes the same code paths
                self.group.add(module.register_forward_pre_hook(settle_inputs, with_kwargs=True))
            # own hook: as above, capture()'s hook on the model's output
            self.group.add(self.model.register_forward_hook(plain_output))
        self.refresh.open()  # a compiled model that already ran would not see the new hooks

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.model(*args, **kwargs)
        except Exception as e:
            if any(e is f for f in self.failed):
                raise  # the comparison's own error, as it was raised
            raise self.failure(e, args, kwargs) from e

    def failure(self, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ForwardError:
        """Where the forward pass failed: the innermost compared module running, else the model."""
        top = self.running.top()
        name, module, a, k = top if top is not None else ("", unwrap(self.model)[0], args, kwargs)
        return forward_error(exc, module_label(name, module), got=received(a, k), after=self.done,
                             run=f"run {self.label}: ")

    def close(self) -> None:
        self.failed.clear()  # an exception holds frames, and they hold tensors
        self.running.clear()
        release(self.markers)
        self.markers.clear()
        self.group.remove()
        self.refresh.close()


def record(model: nn.Module, targets: Named, setting: Settings, shared: Shared, *, label: str,
           on_output: OnOutput | None = None) -> Run:
    """One forward pass, recorded or, with ``on_output``, handed over output by output as it runs.

    Every flag, buffer and random generator of the model is as before afterwards; every hook is
    removed, and a compiled model runs its own compiled code again.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> shared = Shared((torch.ones(1, 2),), {}, seed=0, rng=([], None), no_grad=True,
        ...                 copy="auto", to=None)
        >>> run = record(net, [("0", net[0]), ("", net)], Settings(), shared, label="A")
        >>> run.done, run.rec["0"].output.shape
        (['0', ''], torch.Size([1, 2]))
    """
    inner = unwrap(model)[0]
    compiled = is_compiled(model)
    # Inside torch.compile, the guarded alias that copy="auto" hands on fails in the compiled
    # matmul (TypeError: multiple dispatch failed for aten.addmm.out); copies work there.
    copy = cast(CopyPolicy, "always" if compiled and shared.copy == "auto" else shared.copy)
    (args, kw), dev = fresh_inputs(model, (shared.inputs, dict(shared.kwargs)), shared.device)
    like_a = Retention(copy=copy, to=shared.to)
    track = Tracker(model, label, dev.type, on_output, like_a)
    wanted = {id(m) for _, m in targets if not isinstance(m, OpSite)}  # one predicate: O(modules), not O(m x s)
    sites: list[Any] = [m for _, m in targets if isinstance(m, OpSite)]  # operations, by the sites resolved
    chosen = ([lambda n, m: id(m) in wanted] if wanted else []) + sites
    rec = None if on_output is not None else capture(model, *chosen, copy=copy, to=shared.to)
    grad_mode = torch.no_grad() if shared.no_grad else contextlib.nullcontext()
    with _put_back(inner, shared):
        try:
            with rec if rec is not None else contextlib.nullcontext():
                track.register(targets)
                with grad_mode, setting.apply(inner, dev.type):
                    track.run(args, kw)
                if rec is not None and copy == "auto":
                    _unshare_buffers(rec, inner)
        finally:
            track.close()
    return Run(rec, track.done, track.casts)
