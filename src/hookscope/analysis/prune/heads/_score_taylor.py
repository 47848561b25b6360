"""First-order Taylor importance of attention heads (Michel et al. 2019): for head ``h`` and sample
``x``, ``|sum over positions and the head's channels of z_h * dL/dz_h|``, where ``z_h`` is the head's
slice of the attention output before the output projection; this is ``|dL/dxi_h|`` for a gate
``xi_h`` scaling the head. Averaged over the samples of every calibration batch, one streaming
pass: per batch one forward, one ``torch.autograd.grad`` to the heads' slices only (the parameters'
``.grad`` stay untouched), and per-head sums on the device. Must not import: any other analysis
module, ``cli``, ``viz``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ....anatomy import HeadLayout, attend, out_site
from ....core.hooks import HookGroup
from ....core.state import restored
from ....errors import HookscopeError
from ....selection import named_modules
from ..._targets import call_model
from ..importance import Batch, Loss, accumulator_dtype, batch_to, loss_of

__all__ = ["Kept", "taylor_scores"]

_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "attn_mask", "is_causal")


class Kept(Protocol):
    """What else a Taylor pass takes the gradient of: the tensors this batch kept (with their batch
    dim) and where each tensor's gradient goes (``add(tensor, gradient or None, batch dim)``)."""

    calls: list[tuple[torch.Tensor, int]]

    def add(self, z: torch.Tensor, g: torch.Tensor | None, batch_dim: int) -> None: ...


class _Heads:
    """One layer: the slices of this batch's calls (kept for the backward only) and the per-head sums."""

    def __init__(self, lay: HeadLayout) -> None:
        self.lay, self.total, self.count = lay, torch.zeros(0), 0
        self.calls: list[tuple[torch.Tensor, int]] = []  # (slices, batch dim)

    def keep(self, z: torch.Tensor, batch_dim: int) -> None:
        if not z.requires_grad:
            raise HookscopeError(f"taylor: no gradient reaches the heads of '{self.lay.module}' (their output "
                                 "is detached); score it with importance='output' or leave it out with layers=")
        self.calls.append((z, batch_dim))

    def add(self, z: torch.Tensor, g: torch.Tensor | None, batch_dim: int) -> None:
        z = z.detach().movedim(batch_dim, 0)
        if g is None:  # the loss does not depend on this call
            g = torch.zeros_like(z)
        g = g.movedim(batch_dim, 0)
        if z.dtype in (torch.float16, torch.bfloat16):  # products and sums of half precision lose the score
            z, g = z.float(), g.float()
        per = (z * g).reshape(z.shape[0], -1, z.shape[-1] // self.lay.head_dim, self.lay.head_dim)
        dots = per.sum((1, 3), dtype=accumulator_dtype(z.device)).abs().sum(0)  # per sample |dL/dxi_h|, summed
        self.total = dots if self.total.numel() == 0 else self.total + dots
        self.count += z.shape[0]

    def scores(self) -> torch.Tensor:
        if self.count == 0:
            raise HookscopeError(f"'{self.lay.module}' did not run on the calibration data, so its heads have no "
                                 "Taylor score; pass data that runs it or importance='l2'")
        return (self.total / self.count).cpu()


def _pre(heads: _Heads) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor):
            heads.keep(args[0], 0)
    return hook


def _mha(heads: _Heads) -> Callable[[nn.Module, Any, Any, Any], Any]:
    """The layer's output recomputed from its heads (``out_proj`` is never called as a module), so that
    the loss's gradient flows through the slices read here."""
    def hook(module: nn.Module, args: Any, kwargs: Any, out: Any) -> Any:
        assert isinstance(module, nn.MultiheadAttention)
        bound = inspect.signature(nn.MultiheadAttention.forward).bind(module, *args, **kwargs).arguments
        z, _ = attend(module, **{k: v for k, v in bound.items() if k in _MHA_ARGS})
        heads.keep(z, 1)
        new = F.linear(z, module.out_proj.weight, module.out_proj.bias)
        new = new.squeeze(1) if bound["query"].dim() != 3 else new.transpose(0, 1) if module.batch_first else new
        return (new, *out[1:])
    return hook


@contextlib.contextmanager
def _with_grad(model: nn.Module) -> Iterator[None]:
    """Eval mode, gradients on (also inside a caller's ``no_grad``), every parameter requiring grad so
    that the graph reaches the heads; modes, buffers and flags put back after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    with restored(model, train=False, buffers=True), torch.inference_mode(False), torch.enable_grad():
        try:
            for p, _ in flags:
                p.requires_grad_(True)
            yield
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)


def _own_loss(out: Any) -> torch.Tensor | None:
    found = getattr(out, "loss", None)
    if found is None and isinstance(out, Mapping):
        found = out.get("loss")
    return found if isinstance(found, torch.Tensor) else None


def _batch_loss(out: Any, batch: Batch, index: int, loss: Loss | None) -> torch.Tensor:
    """``loss(output, batch)`` when given, else the model's own ``.loss``, else cross entropy against the
    batch's labels; refused when there is none of them."""
    own = _own_loss(out) if loss is None else None
    if own is not None:
        return own.sum()
    if loss is None and batch.labels is None:
        raise HookscopeError(f"taylor needs a loss, and calibration batch {index} gives none (the model returns "
                             "no .loss and the batch has no labels); pass loss=lambda output, batch: ... or "
                             "batches with labels")
    return loss_of(loss, out, batch, index)


def taylor_scores(model: nn.Module, lays: list[HeadLayout], batches: Iterable[Batch], loss: Loss | None,
                  device: torch.device | str | None, also: Sequence[Kept] = ()) -> dict[str, torch.Tensor]:
    """Every layer's per-head Taylor scores (float64, on the CPU), one streaming pass over ``batches``;
    the tensors ``also`` keeps during a forward get their gradients in the same backward.

    Example:
        >>> from hookscope.analysis.prune.heads._groups import layouts
        >>> from hookscope.analysis.prune.importance._run import split_batch
        >>> net = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> s = taylor_scores(net, layouts(net), [split_batch(torch.randn(3, 4, 8), 0)],
        ...                   lambda out, batch: out.square().sum(), None)
        >>> s["self_attn"].shape, net.self_attn.in_proj_weight.grad is None
        (torch.Size([2]), True)
    """
    mods = dict(named_modules(model))
    heads = {lay.module: _Heads(lay) for lay in lays}
    where = torch.device(device) if device is not None else None
    with HookGroup() as group, _with_grad(model):
        for lay in lays:
            if lay.out is None:  # own hook: the MHA's output rebuilt from its heads, to read their gradient
                group.add(mods[lay.module].register_forward_hook(_mha(heads[lay.module]), with_kwargs=True))
            else:  # own hook: keeps the output projection's input of this batch for the backward
                group.add(out_site(lay, mods).register_forward_pre_hook(_pre(heads[lay.module])))
        for index, batch in enumerate(batches):
            batch = batch_to(batch, where)
            try:
                value = _batch_loss(call_model(model, batch.args, batch.kwargs), batch, index, loss)
                kept: list[tuple[Kept, torch.Tensor, int]] = [
                    (h, z, d) for h in [*heads.values(), *also] for z, d in h.calls]
                if not kept:
                    continue
                if not value.requires_grad:
                    raise HookscopeError("taylor: the loss does not depend on the model's output (detached?); "
                                         "return a loss computed from the output in loss=")
                grads = torch.autograd.grad(value, [z for _, z, _ in kept], allow_unused=True)
                for (h, z, d), g in zip(kept, grads):
                    h.add(z, g, d)
            finally:
                for h in [*heads.values(), *also]:
                    h.calls = []
    return {q: h.scores() for q, h in heads.items()}
