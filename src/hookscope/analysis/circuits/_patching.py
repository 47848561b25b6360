"""Activation patching sweeps: ``activation_patching`` (each cell patched, many cells a pass) and
``attribution_patching`` (every cell estimated from the gradient of the metric: one forward and one
backward pass, or integrated along the path from one prompt to the other).

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import HookscopeError, checked
from ._cells import Grid, grid
from ._metric import Metric
from ._model import Decoder, decoder, token_ids, unembedding
from ._result import Patching
from ._runs import needed, patched, source_run

__all__ = ["activation_patching", "Setting", "setting"]

DIRECTIONS = ("denoise", "noise")


@dataclass
class Setting:
    """A sweep's checked arguments: the decoder, both prompts, the grid and the metric."""

    d: Decoder
    clean: torch.Tensor
    corrupted: torch.Tensor
    grid: Grid
    metric: Metric
    direction: str

    @property
    def base(self) -> torch.Tensor:
        return self.corrupted if self.direction == "denoise" else self.clean


def setting(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, what: str, *,
            answer: int | None, wrong: int | None, metric: str | Callable[[torch.Tensor], Any],
            component: str | Sequence[str], per: str | None, direction: str, position: int) -> Setting:
    """The arguments of a sweep checked, each mistake one line."""
    a, b = token_ids(clean, "clean"), token_ids(corrupted, "corrupted")
    if a.shape != b.shape:
        raise HookscopeError(f"clean and corrupted hold {a.shape[1]} and {b.shape[1]} tokens: patching pairs their "
                             "positions one to one, so give prompts of the same length (reword or pad one)")
    if direction not in DIRECTIONS:
        raise HookscopeError(f"direction={direction!r} is not one of {', '.join(DIRECTIONS)} (denoise: clean "
                             "activations into the corrupted run; noise: corrupted into the clean run)")
    if not -a.shape[1] <= position < a.shape[1]:
        raise HookscopeError(f"position={position} is outside the {a.shape[1]} positions of the prompts")
    d = decoder(model, what)
    vocab = unembedding(d)[0].shape[0]
    return Setting(d, a, b, grid(d, component, per, a.shape[1]),
                   Metric(metric, answer=answer, wrong=wrong, position=position, vocab=vocab), direction)


@checked
def activation_patching(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, *, answer: int | None = None,
                        wrong: int | None = None, metric: str | Callable[[torch.Tensor], Any] = "logit_diff",
                        component: str | Sequence[str] = "resid_pre", per: str | None = None, direction: str = "denoise",
                        position: int = -1, batch_size: int = 64,
                        kwargs: Mapping[str, Any] | None = None) -> Patching:
    """Patch each activation of one kind from one run into the other, one cell at a time, and measure.

    ``direction="denoise"`` runs the corrupted prompt with one cell's activation taken from the clean
    run; ``"noise"`` runs the clean prompt with one cell from the corrupted run. The cells: a layer x
    position grid of a stream kind (``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``,
    ``mlp_out``), a layer x head grid of a head kind (``attn.z``, the heads' outputs before the output
    projection; ``attn.q``, ``attn.k``, ``attn.v``; ``attn.pattern``, each head's attention probabilities,
    eager attention only), or with several kinds a layer x kind grid (each component at every position
    at once), named by ``component``. ``per="layer"`` patches a layer's whole component, every position and head.

    The base prompt is stacked along the batch, ``batch_size`` cells per forward pass (each row patched
    at its own cell through ``hookscope.edit``), which bounds the memory a pass takes.

    Args:
        model: a decoder of a family :func:`hookscope.components` knows, with its language-model head.
        clean, corrupted: the two prompts, token ids of the same length (``[pos]`` or ``[1, pos]``).
        answer, wrong: the token ids the metric reads.
        metric: ``"logit_diff"`` (``logit[answer] - logit[wrong]``), ``"logit"``, ``"prob"`` (of
            ``answer``), each at ``position``; or a function of the logits ``[1, pos, vocab]`` of one run
            that returns one number.
        component: the component kind swept, or several (a layer x kind grid).
        per: ``"position"``, ``"head"`` or ``"layer"`` (default: position for stream kinds, head for head
            kinds, layer for several kinds).
        direction: ``"denoise"`` or ``"noise"``.
        position: the position the metric reads (default: the last).
        batch_size: cells patched per forward pass.
        kwargs: the model's keyword inputs (tensors of batch 1 are stacked with the prompt).

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> p = hookscope.activation_patching(lm, torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]), answer=4, wrong=6)
        >>> p.values.shape, p.layers
        (torch.Size([2, 3]), ['blocks.0', 'blocks.1'])
        >>> abs(float(p.values[0, 1]) - p.clean) < 1e-5   # position 1 holds all that differs
        True
    """
    s = setting(model, clean, corrupted, "activation_patching", answer=answer, wrong=wrong, metric=metric, component=component,
                per=per, direction=direction, position=position)
    names = needed(s.grid.cells)
    got_clean, logits_clean = source_run(s.d, s.clean, names, kwargs)
    got_corrupted, logits_corrupted = source_run(s.d, s.corrupted, names, kwargs)
    source = got_clean if direction == "denoise" else got_corrupted
    values = patched(s.d, s.base, s.grid.cells, source, s.metric, batch_size, kwargs)
    return result(s, values, float(s.metric(logits_clean)[0]), float(s.metric(logits_corrupted)[0]), "activation")


def result(s: Setting, values: torch.Tensor, clean: float, corrupted: float, method: str, steps: int = 0) -> Patching:
    """The sweep's values laid out on its grid."""
    g = s.grid
    table = torch.zeros(len(g.rows), len(g.columns), dtype=torch.float64)
    for c, v in zip(g.cells, values.tolist()):
        table[c.layer, c.column] = v
    return Patching(type(s.d.model).__name__, g.kind, g.per, s.direction, method, s.metric.name, g.rows, g.columns,
                    table, clean, corrupted, steps)
