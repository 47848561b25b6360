"""Guided backpropagation: gradients that pass back through every ReLU only where they are positive,
and only where the ReLU's input was.

The rule is put on the ReLU functions themselves (``F.relu``, ``torch.relu``, ``Tensor.relu_`` and
the ``nn.ReLU`` modules that call them, in place or not, a module used several times) by
:class:`._activations.RuleMode`, for the pass only: what reaches a ReLU's input is
``relu(grad) * (x > 0)``. Nothing of the model is rewritten. The pass runs on the model inside
``DataParallel`` or ``torch.compile`` wrappers (the same weights, run eagerly).
"""

from __future__ import annotations

import torch

from ._activations import RuleMode, rule_pass
from ._engine import Job, Pass, grad

__all__ = ["guided_backprop"]


def guided_backprop(job: Job, p: Pass, s: object) -> tuple[torch.Tensor, None, int]:
    """The gradient of the target's score at the inputs with every ReLU passing back only positive
    gradients (one forward and backward pass, under the rule; the target pinned on its output)."""
    scores, leaf = rule_pass(job, RuleMode("guided"), p)
    return grad(job, scores, leaf), None, 1
