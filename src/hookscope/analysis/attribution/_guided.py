"""Guided backpropagation: gradients that pass back through every ReLU only where they are positive.

The rule is put on the gradient arriving at each ReLU's output (``relu`` operations of every module:
``nn.ReLU`` modules, ``F.relu`` and ``torch.relu`` inside ``forward``, in place or not, a module used
several times), through :func:`hookscope.edit` on the operation ``*::relu``: the ReLU's own
backward then applies its mask, so what reaches its input is ``relu(grad) * (x > 0)``. Nothing of
the model is rewritten; the hooks go when the pass ends. The pass runs on the model inside
``DataParallel`` or ``torch.compile`` wrappers (the same weights, run eagerly).
"""

from __future__ import annotations

import dataclasses

import torch

from ...edit import edit
from ...selection import unwrap
from ._engine import Job, Pass, grad, probe

__all__ = ["guided_backprop"]

RELUS = "*::relu"


def guided_backprop(job: Job, p: Pass, s: object) -> tuple[torch.Tensor, None, int]:
    """The gradient of the target's score at the inputs with every ReLU passing back only positive
    gradients (one more forward and backward pass, under the rule)."""
    eager = dataclasses.replace(job, model=unwrap(job.model)[0])
    with edit(eager.model, RELUS, grad_output=lambda g: g.clamp(min=0)):
        again = probe(eager, None, count=False)
        assert again.scores is not None and again.leaf is not None
        maps = grad(eager, again.scores, again.leaf)
    return maps, None, 1
