"""What a patching sweep measures on each run: a logit difference, a logit, a probability, or a
function of the logits that gives one number per run.

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...errors import HookscopeError

__all__ = ["METRICS", "Metric"]

METRICS = ("logit_diff", "logit", "prob")


class Metric:
    """``metric(logits)`` for logits ``[batch, pos, vocab]``: one value per row, differentiable.

    Example:
        >>> m = Metric("logit_diff", answer=1, wrong=0, position=-1, vocab=3)
        >>> m(torch.tensor([[[0.0, 2.0, 1.0]]])).tolist()
        [2.0]
    """

    def __init__(self, metric: str | Callable[[torch.Tensor], Any], *, answer: int | None, wrong: int | None,
                 position: int, vocab: int) -> None:
        for what, t in (("answer", answer), ("wrong", wrong)):
            if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab):
                raise HookscopeError(f"{what}={t!r} is not a token id of the vocabulary of {vocab}")
        if isinstance(metric, str):
            if metric not in METRICS:
                raise HookscopeError(f"metric={metric!r} is not one of {', '.join(METRICS)}; or pass a function of "
                                     "the logits [1, pos, vocab] that returns one number")
            if answer is None:
                raise HookscopeError(f"metric={metric!r} needs answer= (the token id the clean prompt should give)")
            if metric == "logit_diff" and wrong is None:
                raise HookscopeError("metric='logit_diff' needs wrong= (the token id the corrupted prompt gives); "
                                     "or use metric='logit'")
        elif not callable(metric):
            raise HookscopeError(f"metric= takes {', '.join(METRICS)} or a function, not {type(metric).__name__}")
        self.metric, self.answer, self.wrong, self.position = metric, answer, wrong, position
        self.name = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if callable(self.metric):
            return torch.stack([self._one(logits[i:i + 1]) for i in range(logits.shape[0])])
        last = logits[:, self.position].double()
        if self.metric == "prob":
            return torch.softmax(last, -1)[:, self.answer]
        value = last[:, self.answer]
        return value - last[:, self.wrong] if self.metric == "logit_diff" else value

    def _one(self, logits: torch.Tensor) -> torch.Tensor:
        fn: Callable[[torch.Tensor], Any] = self.metric  # type: ignore[assignment]
        value = fn(logits)
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)
        if t.numel() != 1:
            raise HookscopeError(f"the metric {self.name} returned a value of shape {list(t.shape)}: it must return one "
                                 "number for one run's logits [1, pos, vocab] (reduce it, e.g. .mean())")
        return t.reshape(()).double()
