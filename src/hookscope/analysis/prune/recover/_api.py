"""``recover``: what pruning lost, restored from calibration activations, and measured.

Three methods in one table: ``"lstsq"`` and ``"bias"`` (``_fit``: each projection whose inputs were
pruned refitted in closed form, or its bias moved by the mean of what was lost) and ``"distill"``
(``_distill``: a few Adam steps towards the dense model's outputs). The metric (perplexity for a
language model on token ids, else the mean squared difference from the dense model's outputs) is
measured on held-out data before pruning (the dense model), after pruning, and after recovery.
Must not import: any other analysis module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....core.result import Result, missing
from ....core.text import table
from ....errors import HookscopeError, checked, did_you_mean
from ....selection import Layers
from ..calibrated import calibration_batches, device_of
from ..layers import lm_loss
from ._distill import distill
from ._fit import batch_for, fit_pairs

__all__ = ["RecoveryRow", "Recovery", "recover", "RECOVERY"]

RECOVERY = ("lstsq", "bias", "distill")


@dataclass(frozen=True)
class RecoveryRow:
    """One refitted layer: the relative error ``||Y - Y'||^2 / ||Y||^2`` of its outputs against the
    dense layer's on the calibration tokens, before and after.

    Example:
        >>> RecoveryRow("mlp.down_proj", 0.25, 0.01).layer
        'mlp.down_proj'
    """

    layer: str
    error_before: float
    error_after: float


class Recovery(Result):
    """What :func:`recover` did and what it gave back: the metric of the dense model, of the pruned
    model before recovery and after; one row per refitted layer (none for ``"distill"``, whose
    ``losses`` are its steps').

    Example:
        >>> r = Recovery("lstsq", "perplexity", 2.0, 3.0, 2.2, [RecoveryRow("fc", 0.5, 0.1)], [])
        >>> round(r.recovered_share, 6)
        0.8
    """

    def __init__(self, method: str, metric: str, dense: float, pruned: float, recovered: float,
                 rows: list[RecoveryRow], losses: list[float]) -> None:
        self.method, self.metric, self.dense, self.pruned, self.recovered = method, metric, dense, pruned, recovered
        self.rows, self.losses = rows, losses

    @property
    def recovered_share(self) -> float:
        """How much of the gap pruning opened recovery closed: ``(pruned - recovered) / (pruned - dense)``."""
        gap = self.pruned - self.dense
        return (self.pruned - self.recovered) / gap if gap else 0.0

    def __getitem__(self, key: str) -> RecoveryRow:
        for r in self.rows:
            if r.layer == key:
                return r
        raise missing(key, "layer", [r.layer for r in self.rows])

    def __contains__(self, key: object) -> bool:
        return any(r.layer == key for r in self.rows)

    def table(self) -> str:
        """The refitted layers, then the metric before pruning, after, and after recovery."""
        lines = table(["layer", "error before", "error after"],
                      [[r.layer, f"{r.error_before:.4g}", f"{r.error_after:.4g}"] for r in self.rows], left=(0,)) \
            if self.rows else []
        if self.losses:
            lines.append(f"{len(self.losses)} distillation steps, loss {self.losses[0]:.4g} -> {self.losses[-1]:.4g}")
        lines.append(f"{self.metric}: dense {self.dense:.6g}, pruned {self.pruned:.6g}, recovered {self.recovered:.6g} "
                     f"({self.method}; {self.recovered_share:.0%} of the gap closed)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the method, the metric three times, the rows and the distillation losses."""
        return {"method": self.method, "metric": self.metric, "dense": self.dense, "pruned": self.pruned,
                "recovered": self.recovered, "recovered_share": self.recovered_share,
                "rows": [{"layer": r.layer, "error_before": r.error_before, "error_after": r.error_after}
                         for r in self.rows], "losses": self.losses}


def _is_lm(batches: list[Any]) -> bool:
    ids = [b.get("input_ids") if isinstance(b, Mapping) else b for b in batches]
    return all(isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() for t in ids)


def _call(model: nn.Module, batch: Any) -> Any:
    extra = {"use_cache": False} if hasattr(model, "config") else {}
    with torch.no_grad():
        return model(**batch, **extra) if isinstance(batch, Mapping) else model(batch, **extra)


def _output(out: Any) -> torch.Tensor:
    t = getattr(out, "logits", out)
    t = t[0] if isinstance(t, (tuple, list)) else t
    if not isinstance(t, torch.Tensor):
        raise HookscopeError("the model's output is not a tensor (nor has .logits); recover measures models that give one")
    return t


def _metric(model: nn.Module, dense: nn.Module, batches: list[Any], lm: bool) -> float:
    if lm:
        return math.exp(lm_loss(model, batches))
    total, count = 0.0, 0
    for b in batches:
        m = _output(_call(model, b)).double()
        d = _output(_call(dense, batch_for(dense, b))).to(m.device).double()
        total += float(((d - m) ** 2).sum())
        count += d.numel()
    return total / max(count, 1)


def _moved(batches: list[Any], device: torch.device) -> list[Any]:
    def to(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) else v
    return [{k: to(v) for k, v in b.items()} if isinstance(b, Mapping) else to(b) for b in batches]


def _check(method: object, steps: object, lr: object, damping: object, model: nn.Module, dense: nn.Module) -> None:
    if method not in RECOVERY:
        hint = did_you_mean(method, RECOVERY) if isinstance(method, str) else ""
        raise HookscopeError(f"no recovery method {method!r}.{hint} The methods: {', '.join(RECOVERY)}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise HookscopeError(f"steps={steps!r} is not a count of steps; pass an int >= 1 (20)")
    for word, v in (("lr", lr), ("damping", damping)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= float(v) < float("inf"):
            raise HookscopeError(f"{word}={v!r} is not a number >= 0")
    if model is dense:
        raise HookscopeError("model and dense are the same object; pass the pruned model and a copy of the dense one "
                             "taken before pruning (copy.deepcopy)")


@checked
def recover(model: nn.Module, dense: nn.Module, data: Any, *, method: str = "lstsq", held_out: Any = None,
            layers: Layers | None = None, steps: int = 20, lr: float = 1e-3, damping: float = 0.01,
            device: torch.device | str | None = None) -> Recovery:
    """Restore what pruning took from ``model``, from ``dense``'s activations on ``data``, in place.

    Args:
        model: the pruned model (compacted by :func:`compact`, with blocks removed by
            :func:`remove_layers`, or masked).
        dense: the model before pruning (left as it is; it may sit on another device, the inputs go
            to it there).
        data: calibration inputs: token ids ``[batch, seqlen]``, a dict of keyword inputs, or a list or
            DataLoader of those.
        method: ``"lstsq"``: every linear layer whose inputs were pruned (fewer ``in_features`` than the
            dense layer of its name, as after heads, MLP units or channels are compacted) refitted in
            closed form so that its outputs on the pruned model's activations match the dense layer's,
            ``argmin ||Y - X' W'^T - b'||^2 + damping * mean(diag(X'^T X')) ||W'||^2``; ``"bias"``: only
            the bias moved, by the mean of the lost contribution; ``"distill"``: ``steps`` Adam steps
            (``lr``) towards the dense model's output distribution (KL divergence), plus the mean
            squared difference of the outputs of ``layers`` where given. After :func:`remove_layers`
            or masks only ``"distill"`` applies.
        held_out: the data the metric is measured on (default: ``data``).
        layers, steps, lr: ``"distill"``'s. damping: ``"lstsq"``'s.
        device: where the inputs go (default: the model's first parameter's).

    Returns:
        :class:`Recovery`: the metric (perplexity for a language model given token ids, else the mean
        squared difference from the dense model's outputs) of the dense model, the pruned model
        before recovery and after.

    Example:
        >>> torch.manual_seed(0) and None
        >>> dense = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        >>> small = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4))
        >>> with torch.no_grad():
        ...     _ = small[0].weight.copy_(dense[0].weight[:12]), small[0].bias.copy_(dense[0].bias[:12])
        ...     _ = small[2].weight.copy_(dense[2].weight[:, :12]), small[2].bias.copy_(dense[2].bias)
        >>> r = recover(small, dense, torch.randn(256, 8))
        >>> [row.layer for row in r.rows], r.recovered < r.pruned, r.dense
        (['2'], True, 0.0)
    """
    _check(method, steps, lr, damping, model, dense)
    batches = _moved(calibration_batches(data), device_of(device, model))
    measured = batches if held_out is None else _moved(calibration_batches(held_out), device_of(device, model))
    lm = _is_lm(measured)
    try:
        before = _metric(dense, dense, [batch_for(dense, b) for b in measured], lm)
        pruned = _metric(model, dense, measured, lm)
    except HookscopeError:
        raise
    except Exception as e:  # the models on the user's data, before anything is changed: one line
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise HookscopeError(f"the dense or the pruned model fails on the data ({type(e).__name__}: {text}); pass "
                             "data both take, and a dense model of the pruned one's dtype") from e
    rows: list[RecoveryRow] = []
    losses: list[float] = []
    if method == "distill":
        losses = distill(model, dense, batches, steps=int(steps), lr=float(lr), layers=layers)
    else:
        rows = [RecoveryRow(*r) for r in fit_pairs(model, dense, batches, method, float(damping))]
    return Recovery(method, "perplexity" if lm else "output mse", before, pruned, _metric(model, dense, measured, lm),
                    rows, losses)
