"""A short distillation of a pruned model towards its dense original: Adam on the pruned model's
parameters, the loss the KL divergence from the dense model's output distribution (logits) plus,
for each layer in ``layers``, the mean squared difference of the two models' outputs there, read
through forward hooks on both. Masks stay: a masked weight's pre-hook multiplies by its mask, so the
pruned entries get no gradient. Must not import: any other analysis module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....core.hooks import HookGroup
from ....errors import HookscopeError
from ....selection import Layers, layers as resolve
from ._fit import batch_for

__all__ = ["distill"]


def _logits(out: Any) -> torch.Tensor:
    t = getattr(out, "logits", out)
    if not isinstance(t, torch.Tensor):
        raise HookscopeError("the model gives no logits tensor to distil towards; pass a model whose output is "
                             "one (or has .logits)")
    return t


def _call(model: nn.Module, batch: Any) -> Any:
    extra = {"use_cache": False} if hasattr(model, "config") else {}
    return model(**batch, **extra) if isinstance(batch, Mapping) else model(batch, **extra)


def _first(out: Any) -> torch.Tensor:
    t = out[0] if isinstance(out, (tuple, list)) else out
    assert isinstance(t, torch.Tensor)
    return t


def _tapped(model: nn.Module, names: list[str], batch: Any, grad: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    seen: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    with HookGroup() as hooks:
        for q in names:
            # own hook: the layer's output, matched against the other model's with a mean squared error
            hooks.add(mods[q].register_forward_hook(lambda m, a, out, q=q: seen.__setitem__(q, _first(out))))
        with torch.set_grad_enabled(grad):
            logits = _logits(_call(model, batch))
    return logits, [seen[q] for q in names]


def _real(batch: Any, tokens: tuple[int, ...]) -> torch.Tensor | None:
    """The positions an ``attention_mask`` marks as text, flattened; ``None``: every position counts."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tokens:
        return None
    return mask.reshape(-1) != 0


def _loss(got: torch.Tensor, want: torch.Tensor, hidden: list[tuple[torch.Tensor, torch.Tensor]],
          real: torch.Tensor | None) -> torch.Tensor:
    """The KL divergence per token (summed over the vocabulary) and each layer's squared error, both
    averaged over the real tokens only: pad positions are not text and pull nothing."""
    v = got.shape[-1]
    got_f, want_f = got.reshape(-1, v).float(), want.reshape(-1, v).float()
    keep = real.to(got.device) if real is not None else None
    if keep is not None:
        got_f, want_f = got_f[keep], want_f[keep]
    loss = nn.functional.kl_div(torch.log_softmax(got_f, -1), torch.log_softmax(want_f, -1), log_target=True,
                                reduction="batchmean")
    for g, w in hidden:
        g2, w2 = g.float().reshape(-1, g.shape[-1]), w.float().reshape(-1, w.shape[-1])
        if keep is not None and g2.shape[0] == keep.shape[0]:
            g2, w2 = g2[keep], w2[keep]
        loss = loss + nn.functional.mse_loss(g2, w2)
    return loss


def distill(model: nn.Module, dense: nn.Module, batches: list[Any], *, steps: int, lr: float,
            layers: Layers | None) -> list[float]:
    """``steps`` Adam steps (cycling through ``batches``) of ``model`` towards ``dense``; the loss of each."""
    names = [q for q, _ in resolve(model, layers)] if layers is not None else []
    theirs = dict(dense.named_modules())
    missing = [q for q in names if q not in theirs]
    if missing:
        raise HookscopeError(f"layer {missing[0]!r} is not in the dense model; pass layers both models have "
                             "(the final norm, for instance)")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    try:  # in the model's own mode: eval keeps dropout off, so the steps are deterministic
        for step in range(steps):
            batch = batches[step % len(batches)]
            with torch.no_grad():
                want, want_hidden = _tapped(dense, names, batch_for(dense, batch), False)
            got, got_hidden = _tapped(model, names, batch, True)
            want, want_hidden = want.to(got.device), [w.to(g.device) for w, g in zip(want_hidden, got_hidden)]
            loss = _loss(got, want, list(zip(got_hidden, want_hidden)), _real(batch, tuple(got.shape[:-1])))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        for p in params:
            p.grad = None
    return losses
