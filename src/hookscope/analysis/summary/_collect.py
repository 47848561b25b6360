"""The one traced forward pass: a pre-hook and a hook on every module, removed again in ``finally``.

:func:`collect` runs the model under ``torch.no_grad()`` with a :class:`~hookscope.analysis._macs.ProductCounter`
active, inside :func:`~hookscope.core.state.restored` (train/eval flags, the buffers a training-mode
pass updates and the caller's random generators are put back), and returns one
:class:`~._rows.Call` per module call in the order calls started. A forward pass that fails raises
:class:`~hookscope.ForwardError`, which names the module that was running and what it received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._tree import tensors
from ...core.calls import CallStack
from ...core.compiled import HookRefresh, eager
from ...core.failure import forward_error, module_label, received
from ...core.hooks import HookGroup
from ...core.state import RngDevices, restored
from ...errors import ForwardError, HookscopeError
from ...selection import unwrap
from .._macs import ProductCounter, has_rule, own_macs
from ._rows import Call, described, nbytes

__all__ = ["Tracer", "collect"]

Named = list[tuple[str, nn.Module]]
# A call that has begun: its record, and what it received (held only until it returns, for a
# failure message; the records themselves keep no tensor).
Open = tuple[Call, nn.Module, tuple[Any, ...], dict[str, Any]]

_REMOVED: Any = object()  # the output a with_kwargs forward hook gets when it was removed mid-call


def _storage(t: torch.Tensor) -> int | None:
    try:
        storage = t.untyped_storage()
        # meta tensors have no data (every data_ptr is 0): tell their storages apart by identity
        return storage._cdata if t.device.type == "meta" else storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and some subclass tensors have no storage
        return None


def _new_bytes(outs: list[torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the outputs that are new memory: not an input, a view of one, or written in place."""
    seen = {_storage(t) for t in tensors((args, kwargs))}
    found = 0
    for t in outs:
        key = _storage(t)
        if key is None or key not in seen:
            found += nbytes(t)
            seen.add(key)
    return found


class Tracer:
    """The hooks of one summary: calls listed in the order they start, open calls per thread.

    The hooks run eagerly (a graph break under ``torch.compile``, never traced) and do nothing once
    the group is removed: PyTorch may still call them, without ``kwargs``, in a thread that was
    between a module's hooks at that moment.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
        >>> tracer, group = Tracer(), HookGroup()
        >>> tracer.register([("", net), ("0", net[0]), ("1", net[1])], group)
        >>> _ = net(torch.zeros(1, 2)); group.remove()
        >>> [(c.name, c.outputs, c.macs) for c in tracer.calls]
        [('', [((1, 3), 'float32')], 6), ('0', [((1, 3), 'float32')], 6), ('1', [((1, 3), 'float32')], 0)]
    """

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.done: list[str] = []  # names of the calls that returned, in the order they did
        self.running: CallStack[Open] = CallStack()  # per thread: DataParallel runs replicas in threads
        self._group = HookGroup()

    def register(self, selected: Named, group: HookGroup) -> None:
        """A pre-hook and a hook on each selected module, owned by ``group``."""
        self._group = group
        for name, module in selected:
            # own hook: the shapes, dtypes and mult-adds of every call; keeps no tensor
            group.add(module.register_forward_pre_hook(eager(self._pre(name)), with_kwargs=True))
            group.add(module.register_forward_hook(eager(self._post(name)), with_kwargs=True))

    def product(self, op: str, macs: int | None) -> None:
        """A matrix product a function computed (see ProductCounter): the innermost open call's."""
        top = self.running.top()
        if top is None or top[0].ruled:  # the module's rule counts it already
            return
        if macs is None:
            top[0].uncounted[op] = None
        else:
            top[0].own_macs += macs

    def _pre(self, name: str) -> Callable[..., None]:
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
            if kwargs is None or self._group.closed:  # removed since this call began
                return
            parent = self.running.top()
            if parent is not None:
                parent[0].nested += 1
            call = Call(name, described(list(tensors((args, kwargs)))), has_rule(module))
            self.calls.append(call)
            self.running.push((call, module, args, kwargs))

        return pre

    def _post(self, name: str) -> Callable[..., None]:
        def post(module: nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _REMOVED) -> None:
            if output is _REMOVED or self._group.closed:  # removed mid-call: called as (m, args, output)
                return
            # calls above it that raised inside a try/except of the model never returned: drop them
            while (top := self.running.top()) is not None and top[0].name != name:
                self.running.pop()
            if top is None:
                return
            self.running.pop()
            self._returned(top[0], module, args, kwargs, output)

        return post

    def _returned(self, call: Call, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  output: Any) -> None:
        """Fill in a call that returned and add its mult-adds to the call it ran inside."""
        outs = list(tensors(output))
        call.outputs = described(outs)
        call.own_macs += own_macs(module, args, kwargs, output)
        call.macs += call.own_macs
        call.partial = call.partial or bool(call.uncounted)
        if not call.nested:  # an innermost call: its new outputs are the activations
            call.activation_bytes = _new_bytes(outs, args, kwargs)
        self.done.append(call.name)
        parent = self.running.top()
        if parent is not None:
            parent[0].macs += call.macs
            parent[0].partial = parent[0].partial or call.partial

    def failure(self, exc: Exception) -> ForwardError:
        """Where the forward pass failed: the innermost call still open, what it received, what ran."""
        top = self.running.top()
        if top is None:
            return forward_error(exc, None)
        call, module, args, kwargs = top
        return forward_error(exc, module_label(call.name, module), got=received(args, kwargs), after=self.done)


def collect(model: nn.Module, selected: Named, args: tuple[Any, ...], kwargs: dict[str, Any],
            rng: RngDevices) -> list[Call]:
    """Run ``model(*args, **kwargs)`` once with every selected module traced; the model as before.

    Every hook is removed and a compiled model runs its own compiled code again afterwards, also
    when the pass fails; the failure is a :class:`~hookscope.ForwardError` chained to the model's.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3))
        >>> calls = collect(net, [("", net), ("0", net[0])], (torch.zeros(4, 2),), {}, ([], None))
        >>> [(c.name, c.own_macs) for c in calls], len(net[0]._forward_hooks)
        ([('', 0), ('0', 24)], 0)
    """
    tracer, group = Tracer(), HookGroup()
    refresh = HookRefresh(model)  # hooks added to a compiled model that already ran must take effect
    # dropout draws from the caller's generators, BatchNorm in training mode updates its
    # statistics: both put back, as if the pass had not run
    with restored(unwrap(model)[0], rng=rng):
        try:
            tracer.register(selected, group)
            refresh.open()
            counter = ProductCounter(tracer.product)
            with torch.no_grad(), counter:
                model(*args, **kwargs)
        except HookscopeError:
            raise
        except Exception as e:
            raise tracer.failure(e) from e
        finally:
            group.remove()
            refresh.close()
            tracer.running.clear()  # open calls hold their inputs
    _say_replaced(tracer.calls, counter.replaced)
    return tracer.calls


def _say_replaced(calls: list[Call], replaced: tuple[str, ...]) -> None:
    """Torch functions another library replaced: their products may escape the count (a wrapper that calls
    torch's function with the mode off), so the outermost call's count is said to be a lower bound."""
    if not replaced or not calls:
        return
    shown = ", ".join(replaced[:3]) + (f" and {len(replaced) - 3} more" if len(replaced) > 3 else "")
    calls[0].uncounted[f"{shown} (replaced by another library, their products may be missed: undo that for a full count)"] = None
    calls[0].partial = True
