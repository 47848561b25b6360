"""The statistics engine's ReLU shortcut: ``ReLU(inplace=True)`` rewrites its input, so the statistics
of its output would take one more pass over the tensor; when the input is reduced anyway (an input
row, or watch's finiteness check of a received input), that same pass also tells the statistics
the ReLU's output will have (:func:`~hookscope.analysis._reduce.stats_and_relu`), and the post-hook
takes them as the output's when the ReLU did exactly that one in-place write. Only for torch's own
ReLU, running its ``relu_`` alone (no other hook, no torch function or dispatch mode, nothing
replaced): anything else is read as every other output is.

A room of its own beside ``_recorder``, which calls it from its hooks; it keeps no state: the
recorder's memo of statistics is handed in. Must not import: ``_recorder``, any analysis, ``cli``,
``viz``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules import module as _module_globals  # torch's global module hooks

from ._reduce import on_host, relu_told

__all__ = ["Told", "Memo", "inplace_relu", "runs_torchs_relu", "tell_before", "settle_after"]

Told = tuple[torch.Tensor, int, torch.Tensor]  # an in-place ReLU's input, its version, the statistics after


class Memo(Protocol):
    """What the shortcut asks of the recorder's memo of statistics (``_recorder``'s)."""

    def known(self, t: torch.Tensor) -> bool: ...
    def stats_relu(self, t: torch.Tensor) -> torch.Tensor | None: ...
    def check(self, t: torch.Tensor) -> torch.Tensor | None: ...
    def remember(self, t: torch.Tensor, stats: torch.Tensor) -> None: ...


_RELU_FORWARD = nn.ReLU.forward
_F_RELU, _RELU_ = torch.nn.functional.relu, torch.relu_  # what nn.ReLU(inplace=True) runs, as imported


def inplace_relu(module: nn.Module) -> bool:
    """Whether ``module`` is torch's own ``ReLU(inplace=True)``, whose forward is one ``relu_`` on its
    input, returned: a subclass, or a forward replaced on the instance, may do anything else.

    Example:
        >>> inplace_relu(nn.ReLU(inplace=True)), inplace_relu(nn.ReLU())
        (True, False)
    """
    return (type(module) is nn.ReLU and module.inplace is True and "forward" not in vars(module)
            and type(module).forward is _RELU_FORWARD)


def runs_torchs_relu(module: nn.Module) -> bool:
    """Whether a call of ``module`` (see :func:`inplace_relu`) starting now runs torch's ``relu_``
    and nothing else that could write into its tensor: ``F.relu`` and ``torch.relu_`` not replaced
    since hookscope was imported, no torch function or dispatch mode active, and no hook on it but
    the recorder's own two, nor any global module hook (another hook could write through ``.data``,
    which no version counter sees). Where torch cannot say, no.

    Example:
        >>> relu = nn.ReLU(inplace=True)
        >>> runs_torchs_relu(relu)
        False
        >>> h = [relu.register_forward_pre_hook(print), relu.register_forward_hook(print)]
        >>> runs_torchs_relu(relu)
        True
    """
    stacks = (getattr(torch._C, "_len_torch_function_stack", None), getattr(torch._C, "_len_torch_dispatch_stack", None))
    if any(depth is None or depth() for depth in stacks):
        return False
    if torch.nn.functional.relu is not _F_RELU or torch.relu_ is not _RELU_:
        return False
    if len(module._forward_pre_hooks) != 1 or len(module._forward_hooks) != 1:
        return False
    found = [getattr(_module_globals, n, None) for n in ("_global_forward_pre_hooks", "_global_forward_hooks")]
    return all(isinstance(hooks, dict) and not hooks for hooks in found)


def tell_before(memo: Memo, module: nn.Module, t: Any, *, inputs: bool, received: bool) -> Told | None:
    """Before ``ReLU(inplace=True)`` runs on ``t``, not reduced at this version: when its row is taken
    now anyway (``inputs``: an input row) or watch checks it (``received``: made by the parent's own
    code), the same pass tells the statistics the ReLU's output will have, returned for the post-hook.
    Only for a call that runs torch's ``relu_`` alone (:func:`runs_torchs_relu`); ``None`` otherwise.

    Example:
        >>> tell_before(None, nn.ReLU(inplace=True), "not a tensor", inputs=True, received=False) is None
        True
    """
    if (type(t) is not torch.Tensor or not on_host(t) or t.is_inference() or memo.known(t)
            or not runs_torchs_relu(module)):
        return None
    if inputs:
        after = memo.stats_relu(t)
    elif received and relu_told(t):
        after = memo.check(t)  # what the recorder would sum to see it finite: one pass for both
    else:
        return None
    return None if after is None else (t, t._version, after)


def settle_after(memo: Memo, output: Any, before: Told) -> None:
    """After ``ReLU(inplace=True)``: its output is its input rewritten by exactly one in-place op (one
    new version, nothing else in between) when the statistics told before are its own: remembered.

    Example:
        >>> t = torch.ones(2); settle_after(None, torch.zeros(2), (t, t._version, torch.zeros(9)))
    """
    t, version, after = before
    if output is t and t._version == version + 1:
        memo.remember(t, after)
