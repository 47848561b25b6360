"""Closed-form recovery of a pruned model's projections from calibration activations, through hooks.

For each linear layer of the pruned model whose inputs were pruned (a smaller ``in_features`` than
the same-named layer of the dense model, as :func:`compact` leaves the output projection after
heads and the down projection after MLP units), the dense layer's outputs ``Y = X W^T + b`` and the
pruned layer's inputs ``X'`` are gathered on the same tokens, and either the weight is refitted,
``W', b' = argmin ||Y - X' W'^T - b'||^2 + lambda ||W'||^2`` (``"lstsq"``; ``lambda`` is ``damping``
times the mean diagonal of ``X'^T X'``), or the bias alone moves by the mean of what was lost,
``b' = b + mean(Y - X' W^T - b)`` (``"bias"``). Only the sums ``X'^T X'``, ``X'^T Y`` and the means
are kept. Must not import: any other analysis module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.hooks import HookGroup
from ....errors import HookscopeError
from ....selection import named_modules

__all__ = ["Pair", "pairs_of", "fit_pairs", "batch_for"]


@dataclass
class Pair:
    """A pruned projection and its dense counterpart, with the sums gathered over the tokens."""

    name: str
    pruned: nn.Linear
    dense: nn.Linear
    xtx: torch.Tensor | None = None  # [in' + 1, in' + 1], the last row and column the bias's ones
    xty: torch.Tensor | None = None  # [in' + 1, out]
    yy: float = 0.0
    tokens: int = 0


def pairs_of(model: nn.Module, dense: nn.Module) -> list[Pair]:
    """The linear layers of ``model`` with fewer inputs than the same-named layer of ``dense``."""
    theirs = dict(named_modules(dense))
    out = []
    for q, m in named_modules(model):
        d = theirs.get(q)
        if (type(m) is nn.Linear and type(d) is nn.Linear and m.out_features == d.out_features
                and m.in_features < d.in_features):
            out.append(Pair(q, m, d))
    if not out:
        raise HookscopeError("no linear layer of the pruned model has fewer inputs than the dense model's layer of "
                             "the same name; compact the pruned model first (hookscope.compact), or recover with "
                             "method='distill' (after remove_layers or masks)")
    return out


def batch_for(model: nn.Module, batch: Any) -> Any:
    """``batch`` on the device of ``model``'s first parameter: the dense model may sit elsewhere (the host)."""
    first = next(iter(model.parameters()), None)
    if first is None:
        return batch

    def to(v: Any) -> Any:
        return v.to(first.device) if isinstance(v, torch.Tensor) else v
    return {k: to(v) for k, v in batch.items()} if isinstance(batch, Mapping) else to(batch)


def _run(model: nn.Module, batch: Any) -> None:
    extra = {"use_cache": False} if hasattr(model, "config") else {}
    with torch.no_grad():
        model(**batch, **extra) if isinstance(batch, Mapping) else model(batch, **extra)


def _gather(model: nn.Module, dense: nn.Module, pairs: list[Pair], batch: Any) -> None:
    """One batch through both models: the dense layers' outputs, then the pruned layers' inputs."""
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        return lambda m, a, out: outputs.__setitem__(name, out.detach())

    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def fold(p: Pair) -> Any:
        def hook(m: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach().reshape(-1, p.pruned.in_features).double()
            x = torch.cat([x, torch.ones_like(x[:, :1])], 1)
            y = outputs[p.name].reshape(-1, p.pruned.out_features).to(x.device).double()
            if mask is not None:  # the pad positions are not text: out of the sums
                if tuple(args[0].shape[:-1]) != tuple(mask.shape):
                    raise HookscopeError(f"layer {p.name!r}'s inputs {tuple(args[0].shape)} do not follow the tokens "
                                         f"of the attention_mask {tuple(mask.shape)}; pass unpadded batches without "
                                         "attention_mask")
                real = mask.reshape(-1).to(x.device) != 0
                x, y = x[real], y[real]
            p.xtx = x.t() @ x if p.xtx is None else p.xtx + x.t() @ x
            p.xty = x.t() @ y if p.xty is None else p.xty + x.t() @ y
            p.yy += float((y * y).sum())
            p.tokens += x.shape[0]
        return hook

    with HookGroup() as hooks:
        for p in pairs:
            # own hook: the dense layer's output on this batch, the target of the refit
            hooks.add(p.dense.register_forward_hook(keep(p.name)))
        _run(dense, batch_for(dense, batch))
    with HookGroup() as hooks:
        for p in pairs:
            # own hook: the pruned layer's inputs folded into the sums, against the dense outputs
            hooks.add(p.pruned.register_forward_pre_hook(fold(p)))
        _run(model, batch)


def _error(p: Pair, w: torch.Tensor) -> float:
    """``||Y - X'_aug w||^2 / ||Y||^2`` from the sums alone (``w``: ``[in' + 1, out]``)."""
    assert p.xtx is not None and p.xty is not None
    sq = p.yy - 2 * float((w * p.xty).sum()) + float((w * (p.xtx @ w)).sum())
    return max(sq, 0.0) / max(p.yy, 1e-300)


def _current(p: Pair) -> torch.Tensor:
    w = p.pruned.weight.detach().double().t()
    b = p.pruned.bias.detach().double() if p.pruned.bias is not None else torch.zeros(w.shape[1], dtype=w.dtype,
                                                                                          device=w.device)
    return torch.cat([w, b.reshape(1, -1)], 0)


def _solve(p: Pair, method: str, damping: float) -> torch.Tensor:
    assert p.xtx is not None and p.xty is not None
    n = p.xtx.shape[0] - 1
    if method == "bias":
        w = _current(p)
        mean_x = p.xtx[n] / p.tokens  # the ones row: the sums of each input, and the count
        lost = p.xty[n] / p.tokens - mean_x @ w
        w[n] += lost
        return w
    a = p.xtx.clone()
    fit_bias = p.pruned.bias is not None
    if not fit_bias:
        a, xty = a[:n, :n], p.xty[:n]
    else:
        xty = p.xty
    diag = torch.arange(n, device=a.device)
    a[diag, diag] += damping * float(torch.diagonal(p.xtx)[:n].mean()) + 1e-12
    sol = torch.linalg.solve(a, xty)
    return sol if fit_bias else torch.cat([sol, torch.zeros_like(sol[:1])], 0)


def fit_pairs(model: nn.Module, dense: nn.Module, batches: list[Any], method: str,
              damping: float) -> list[tuple[str, float, float]]:
    """Refit every pair on the batches (written into ``model``); each layer's relative error before and after."""
    pairs = pairs_of(model, dense)
    if method == "bias" and any(p.pruned.bias is None for p in pairs):
        name = next(p.name for p in pairs if p.pruned.bias is None)
        raise HookscopeError(f"layer {name!r} has no bias to compensate; recover with method='lstsq'")
    for batch in batches:
        _gather(model, dense, pairs, batch)
    solved = [(p, _solve(p, method, damping)) for p in pairs]
    out = []
    with torch.no_grad():
        for p, w in solved:
            before = _error(p, _current(p))
            p.pruned.weight.copy_(w[:-1].t().to(p.pruned.weight))
            if p.pruned.bias is not None:
                p.pruned.bias.copy_(w[-1].to(p.pruned.bias))
            out.append((p.name, before, _error(p, w)))
    return out
