"""What a saliency method explains: logits read from any model output, and class targets checked.

Shared by :mod:`.cam` and :mod:`.cam_metrics` so that ``target=`` and ``output=`` mean the same in
both, and so that both see the same models whose samples interact. Pure functions: no hook, no model call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import HookscopeError

__all__ = ["Target", "batch_coupled", "call_user", "check_range", "class_targets", "is_function", "read_logits"]

Target = int | Sequence[int] | torch.Tensor | Callable[[Any], torch.Tensor] | None
_USER_MISTAKES = (AttributeError, KeyError, IndexError, TypeError, ValueError)


def is_function(target: Any) -> bool:
    """A target given as a function of the model's output (tensors are callable objects too)."""
    return callable(target) and not isinstance(target, torch.Tensor)


def call_user(fn: Callable[[Any], Any], value: Any, what: str) -> Any:
    """``fn(value)``, with a mistake in the user's function turned into one line that names it.

    Example:
        >>> call_user(lambda o: o.logits, torch.zeros(2, 3), "output=")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: output= failed on the model's Tensor output (AttributeError: ...
    """
    try:
        return fn(value)
    except _USER_MISTAKES as e:
        raise HookscopeError(f"{what} failed on the model's {type(value).__name__} output "
                             f"({type(e).__name__}: {e}); fix the {what} function") from e


def read_logits(output: Callable[[Any], torch.Tensor] | None, out: Any, batch: int) -> torch.Tensor:
    """``batch x classes`` logits: ``out`` itself, or what ``output(out)`` picks from it.

    Example:
        >>> read_logits(lambda o: o["logits"], {"logits": torch.zeros(2, 5)}, 2).shape
        torch.Size([2, 5])
    """
    if output is None:
        if not isinstance(out, torch.Tensor):
            raise HookscopeError(f"the model returns a {type(out).__name__}, not a logits tensor; pass "
                                 "output= a function that picks B x classes logits, e.g. output=lambda o: o.logits")
        logits = out
    else:
        logits = call_user(output, out, "output=")
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != batch:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise HookscopeError(f"class targets need B x classes logits (B={batch}), got {shape}; pass output= "
                             "that returns them, or a target function that returns one score per sample")
    return logits


def class_targets(target: Target, batch: int, classes: int | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """``batch`` class indices (long) from an int, a list, a tensor or a numpy array of them.

    ``classes`` checks the range (one line naming the first class out of range).

    Example:
        >>> class_targets(3, 2, classes=10).tolist(), class_targets([1, 2], 2).tolist()
        ([3, 3], [1, 2])
    """
    try:  # ints, lists, tensors, numpy integers and arrays
        if isinstance(target, (bool, str, bytes)) or target is None or is_function(target):
            raise TypeError
        t = torch.as_tensor(target, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"target={target!r} is not a class index; pass an int, one int per sample, "
                             "a function returning one score per sample, or None for the predicted class") from None
    if t.numel() == 0 and t.ndim == 1:  # [] for an empty batch: as_tensor makes it float
        t = t.long()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise HookscopeError(f"target must hold integer class indices, got dtype {t.dtype}")
    if t.ndim > 1:
        raise HookscopeError(f"target of shape {tuple(t.shape)} is not one class index per sample; pass a flat list")
    t = t.long().expand(batch).clone() if t.ndim == 0 else t.long()
    if t.shape[0] != batch:
        raise HookscopeError(f"target has {t.shape[0]} class indices for a batch of {batch}; "
                             "give one per sample or one int for all")
    if classes is not None:
        check_range(t, classes)
    return t


def check_range(targets: torch.Tensor, classes: int) -> None:
    """One line naming the first target outside ``0 .. classes - 1``."""
    bad = ((targets < 0) | (targets >= classes)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        raise HookscopeError(f"target class {int(targets[i])} (sample {i}) is out of range: the model has "
                             f"{classes} classes (0 to {classes - 1})")


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def batch_coupled(model: nn.Module) -> str | None:
    """The first batch norm that normalises with each batch's own statistics even in eval mode
    (``track_running_stats=False``), named with its type; ``None`` when in eval mode every sample is
    computed on its own.

    Example:
        >>> batch_coupled(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2, track_running_stats=False)))
        "BatchNorm2d '1'"
    """
    for name, m in model.named_modules():
        if isinstance(m, _BATCH_NORMS) and m.running_mean is None:
            return f"{type(m).__name__} {name!r}"
    return None
