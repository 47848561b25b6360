"""What the forward hooks gather from a layer's inputs over the calibration batches, kept on the
device the calibration runs on and never read back to the host inside a hook.

Both statistics are running means over ``nsamples``, counted as the references count them: the
leading dim of an input of 3 or more dims (the sequences of a batch), 1 for a 2-dim input. The pad
positions of a batch (its ``attention_mask`` 0) are left out of the sums: they are not text. Must not
import: any other analysis module.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ....errors import HookscopeError

__all__ = ["InputStats", "matrix_of", "is_conv1d"]


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): a linear layer whose weight is stored ``(in, out)``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def matrix_of(module: nn.Module) -> torch.Tensor:
    """The layer's weight as a matrix ``(out, in)`` (a view: transposed for ``Conv1D``)."""
    w = module.weight
    assert isinstance(w, torch.Tensor)
    return w.t() if is_conv1d(module) else w


class InputStats:
    """The running statistic of one layer's inputs: ``"norms"`` (the mean squared norm of each input
    over the samples, Wanda's ``scaler_row``) or ``"hessian"`` (``2 X X^T / nsamples``, SparseGPT's ``H``).

    Example:
        >>> s = InputStats("norms", 2, torch.device("cpu"), torch.float32)
        >>> s.add(torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]]]))
        >>> s.value.tolist(), s.nsamples
        ([5.0, 2.0], 2)
    """

    def __init__(self, statistic: str, width: int, device: torch.device, dtype: torch.dtype) -> None:
        self.statistic, self.nsamples, self.dtype, self.device = statistic, 0, dtype, device
        shape = (width, width) if statistic == "hessian" else (width,)
        self.value = torch.zeros(shape, device=device, dtype=dtype)
        self.tokens: torch.Tensor | None = None  # the current batch's attention mask [batch, seq]; None: all count

    def _real(self, inp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x`` (the input's rows) with the pad positions' rows zeroed."""
        t = self.tokens
        if t is None:
            return x
        if tuple(inp.shape[:-1]) != tuple(t.shape) and not (inp.dim() == 2 and inp.shape[0] == t.numel()):
            raise HookscopeError(f"a layer's input of shape {tuple(inp.shape)} does not follow the tokens of the "
                                 f"attention_mask {tuple(t.shape)}, so its pad positions cannot be left out; pass "
                                 "unpadded batches (a list of token-id tensors, one length each) without attention_mask")
        return x * (t.reshape(-1, 1) != 0).to(x.dtype)

    def add(self, inp: torch.Tensor) -> None:
        """Fold one call's input in: the reference's order of operations (scale, count, add)."""
        count = inp.shape[0] if inp.dim() >= 3 else 1
        x = self._real(inp, inp.detach().reshape(-1, inp.shape[-1]).to(self.device, self.dtype))
        self.value *= self.nsamples / (self.nsamples + count)
        self.nsamples += count
        if self.statistic == "hessian":
            x = math.sqrt(2 / self.nsamples) * x
            self.value += x.t().matmul(x)
        else:
            self.value += torch.linalg.vector_norm(x, ord=2, dim=0) ** 2 / self.nsamples

    def __call__(self, module: nn.Module, inputs: tuple[object, ...], output: object) -> None:
        first = inputs[0] if inputs else None
        if isinstance(first, torch.Tensor):
            self.add(first)
