"""What a report is about: the model, its inputs, the pictures and masks that go with them, class names."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._tree import first_tensor
from ..errors import HookscopeError

__all__ = ["Subject", "kept_grads", "loss_of"]


@dataclass
class Subject:
    """The model and inputs a report is built from, and the folder its pictures go to.

    ``pictures`` are the inputs as images (B x 3 x H x W in [0, 1]) for overlays; ``masks`` (B x H x W)
    the ground-truth object masks where they exist (the pointing game needs them); ``baselines`` what
    deletion and insertion put in place of removed pixels (default: zeros and a blur).
    """

    model: nn.Module
    x: torch.Tensor
    folder: Path
    pictures: torch.Tensor | None = None
    masks: torch.Tensor | None = None
    class_names: Sequence[str] | None = None
    baselines: torch.Tensor | None = None

    def image(self, name: str) -> Path:
        """The path of a picture called ``name`` in the report's ``img`` folder."""
        (self.folder / "img").mkdir(exist_ok=True)
        return self.folder / "img" / f"{name}.png"

    def relative(self, path: Path) -> str:
        """``path`` as the page refers to it: relative to the report folder, with ``/``."""
        return Path(path).relative_to(self.folder).as_posix()

    def label(self, k: int) -> str:
        """A class index with its name where names are known: ``3 (triangle)``."""
        names = self.class_names
        return f"{k} ({names[k]})" if names is not None and 0 <= k < len(names) else str(k)


def loss_of(output: Any) -> torch.Tensor:
    """The scalar a report differentiates: ``logsumexp`` over the output's last dimension, summed."""
    t = first_tensor(output)
    if t is None or not t.is_floating_point() or not t.requires_grad:
        raise HookscopeError("the model's output is not a floating-point tensor that requires grad, so the "
                             "report cannot run a backward pass")
    t = t.float()
    return t.logsumexp(-1).sum() if t.dim() else t


@contextmanager
def kept_grads(model: nn.Module) -> Iterator[None]:
    """Put every parameter's ``.grad`` back as it was: a report's backward passes leave no trace.

    Inside, every ``.grad`` starts as ``None``, so a backward pass accumulates into fresh tensors,
    not into the caller's.
    """
    saved = [(p, p.grad) for p in model.parameters()]
    for p, _ in saved:
        p.grad = None
    try:
        yield
    finally:
        for p, g in saved:
            p.grad = g
