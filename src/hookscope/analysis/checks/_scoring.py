"""The model's score of a target on any batch made of the inputs' samples (perturbed copies of them).

Run under ``torch.no_grad()`` in eval mode by the callers; the target is pinned once on the inputs'
own output, so that ``target=None`` (the predicted class) stays the class predicted on the inputs.
Must not import any analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ...core.inputs import private
from ...errors import HookscopeError, did_you_mean
from .._targets import Target, batch_coupled, call_model, class_index_of, is_function, pinned, rows_of, scores_of

__all__ = ["SCORES", "Scorer"]

SCORES = ("prob", "logit")


class Scorer:
    """Scores of the target for batches of rows of the inputs, read as ``score=`` says.

    Example:
        >>> net = nn.Linear(2, 3)
        >>> with torch.no_grad():
        ...     s = Scorer(net, torch.ones(2, 2), target=1, output=None, score="logit", kwargs={}, what="test")
        ...     s(torch.zeros(2, 2), torch.tensor([0, 1])).tolist() == [net.bias[1].item()] * 2
        True
    """

    def __init__(self, model: nn.Module, inputs: torch.Tensor, *, target: Target,
                 output: Callable[[Any], torch.Tensor] | None, score: str, kwargs: Mapping[str, Any],
                 what: str) -> None:
        if score not in SCORES:
            raise HookscopeError(f"score={score!r} is not a score.{did_you_mean(str(score), SCORES)} "
                                 "Use 'prob' or 'logit'")
        self.model, self.output, self.kwargs, self.batch = model, output, kwargs, inputs.shape[0]
        coupled = batch_coupled(model)
        if coupled is not None and self.batch > 1:
            raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so a "
                                 f"score would depend on the other images in its batch; pass one image to {what}")
        target = class_index_of(target)
        self.prob = score == "prob" and not is_function(target)
        out = self._read(call_model(model, (inputs.clone(),), private(kwargs)))
        if self.prob and isinstance(out, torch.Tensor) and out.ndim == 2 and out.shape[1] == 1:
            raise HookscopeError("score='prob' is a softmax over classes, always 1 for a model with one logit; use "
                                 "score='logit' or a target function, e.g. target=lambda o: o[:, 0].sigmoid()")
        self.target = pinned(target, out, self.batch)
        self.targets = None if is_function(self.target) else self.target
        self.before = self._scores(out, torch.arange(self.batch, device=inputs.device))

    def _read(self, out: Any) -> Any:
        if self.output is not None:
            out = self.output(out)
        if self.prob and isinstance(out, torch.Tensor) and out.ndim == 2 and out.shape[1] > 1:
            out = out.float().softmax(dim=1)
        return out

    def _scores(self, out: Any, rows: torch.Tensor) -> torch.Tensor:
        return scores_of(self.target, out, rows).float()

    def __call__(self, batch: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The scores of ``batch``, whose row ``k`` is a copy of sample ``rows[k]``."""
        out = call_model(self.model, (batch,), private(rows_of(self.kwargs, rows, self.batch)))
        return self._scores(self._read(out), rows)
