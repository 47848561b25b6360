"""What a report is about: the model, its inputs, the pictures and masks that go with them, class names,
and where they came from (trained or random weights, images given or generated)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._tree import first_tensor
from ..analysis.summary import Summary, summary
from ..errors import HookscopeError
from .progress import Progress

__all__ = ["Subject", "kept_grads", "loss_of"]

_RANDOM_WEIGHTS = ("Random weights", "the model's weights are random, not trained, so the predictions, maps "
                   "and scores below show how each method works, not findings about a trained model.")
_GENERATED = ("Generated input", "the input is generated (random values, not images you gave), so the maps "
              "below show no real object; give real images to see what the model looks at.")


@dataclass
class Subject:
    """The model and inputs a report is built from, and the folder its pictures go to.

    ``pictures`` are the inputs as images (B x 3 x H x W in [0, 1]) for overlays; ``masks`` (B x H x W)
    the ground-truth object masks where they exist (the pointing game needs them); ``baselines`` what
    deletion and insertion put in place of removed pixels (default: zeros and a blur).
    ``random_weights`` and ``generated_inputs`` say where the model and inputs came from: the page
    opens with a banner for each that is true. ``progress`` counts the report's steps. ``x`` is the
    report's own copy of the inputs, never given to the model: each pass gets :meth:`inputs`.

    Example:
        >>> s = Subject(nn.Linear(2, 2), torch.zeros(1, 2), Path("."), random_weights=True)
        >>> [head for head, _ in s.banners()]
        ['Random weights']
    """

    model: nn.Module
    x: torch.Tensor
    folder: Path
    pictures: torch.Tensor | None = None
    masks: torch.Tensor | None = None
    class_names: Sequence[str] | None = None
    baselines: torch.Tensor | None = None
    random_weights: bool = False
    generated_inputs: bool = False
    progress: Progress = field(default_factory=lambda: Progress(0, enabled=False))
    _summary: Summary | None = field(default=None, init=False, repr=False)

    def inputs(self, n: int | None = None) -> torch.Tensor:
        """A fresh copy of the inputs (the first ``n``) for one pass: a model that writes into its input
        changes only that copy, so that every pass sees the caller's values."""
        return (self.x if n is None else self.x[:n]).clone()

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

    def summary(self) -> Summary:
        """``hookscope.summary`` of the model on the inputs, run once and kept (several sections read it)."""
        if self._summary is None:
            self._summary = summary(self.model, self.inputs())
        return self._summary

    def banners(self) -> list[tuple[str, str]]:
        """(heading, text) of each warning the page opens with: random weights, generated input."""
        return [b for b, on in ((_RANDOM_WEIGHTS, self.random_weights), (_GENERATED, self.generated_inputs)) if on]


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
