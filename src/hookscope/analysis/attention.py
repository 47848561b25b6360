"""Attention probabilities from any attention kernel, per head.

Fused kernels (``scaled_dot_product_attention`` on flash, memory-efficient or CPU paths) never
materialise the probabilities, which is why ``output_attentions=True`` needs eager attention in
transformers. :func:`attention` reads the inputs of each ``scaled_dot_product_attention`` call
(query, key, mask, causal flag, scale, grouped-query heads) and computes what the math kernel
would: ``softmax(q k^T * scale + mask)``, ``batch x heads x queries x keys``, zeros for a query the
mask leaves no key (where eager attention gives a uniform row). ``nn.MultiheadAttention``'s one
operation, ``multi_head_attention_forward``, gives its weights per head, computed by the same function
on the same inputs. A selected ``softmax`` operation (eager attention written by hand) gives its output
as it is.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..capture import capture
from ..core.inputs import model_kwargs, private
from ..core.ops import SEP, OpSite, split_op
from ..core.result import Result, missing
from ..core.state import restored
from ..core.text import table
from ..errors import HookscopeError, SelectionError, checked
from ..selection import Layers, Selector, layers as select
from ._targets import call_model

__all__ = ["attention", "attention_probabilities", "AttentionPatterns"]

SDPA = "scaled_dot_product_attention"
MHA = "multi_head_attention_forward"  # nn.MultiheadAttention's, which gives its weights when asked
KERNELS = (SDPA, MHA)


@checked
def attention_probabilities(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                            attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                            scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """The probabilities ``scaled_dot_product_attention`` weighs ``value`` with, for the same
    arguments (dropout left out): ``... x heads x queries x keys``. A query the mask leaves no key
    (a left pad under a causal mask) gets a row of zeros, as the kernel gives it, so that
    ``probabilities @ value`` is the kernel's output there too. Half-precision inputs are multiplied
    in float32, as the kernels accumulate them; the probabilities come back in the query's dtype.

    Example:
        >>> q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        >>> p = attention_probabilities(q, k, is_causal=True)
        >>> p.shape, bool(torch.allclose(p.sum(-1), torch.ones(1, 2, 3))), float(p[0, 0, 0, 1])
        (torch.Size([1, 2, 3, 3]), True, 0.0)
    """
    q_heads, k_heads = query.size(-3) if query.dim() > 2 else 1, key.size(-3) if key.dim() > 2 else 1
    if q_heads != k_heads:
        if q_heads % k_heads:
            raise HookscopeError(f"{q_heads} query heads cannot share {k_heads} key heads evenly; "
                                 "scaled_dot_product_attention would refuse these inputs too")
        key = key.repeat_interleave(q_heads // k_heads, dim=-3)
    factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    wide = torch.promote_types(query.dtype, torch.float32)  # the kernels accumulate half precision in float32
    logits = (query.to(wide) @ key.to(wide).transpose(-2, -1)) * factor
    length, source = query.size(-2), key.size(-2)
    if is_causal:
        causal = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        logits = logits.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else logits + attn_mask
    probs = torch.softmax(logits, dim=-1)
    # softmax of a row of -inf is nan; the kernel's softmax gives that row zeros (a nan input stays nan)
    return probs.masked_fill((logits == float("-inf")).all(dim=-1, keepdim=True), 0.0).to(query.dtype)


class AttentionPatterns(Result, Mapping[str, torch.Tensor]):
    """Attention probabilities by operation name (``h.0.attn::scaled_dot_product_attention``):
    ``batch x heads x queries x keys``; an operation run several times gives the first call's
    (``calls(name)`` gives them all)."""

    def __init__(self, patterns: dict[str, list[torch.Tensor]]) -> None:
        self._patterns = patterns

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.calls(name)[0]

    def calls(self, name: str) -> list[torch.Tensor]:
        """Every call's probabilities, in the order the calls ran."""
        if name not in self._patterns:
            raise missing(name, "attention operation", self._patterns)
        return self._patterns[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._patterns)

    def __len__(self) -> int:
        return len(self._patterns)

    def table(self) -> str:
        """One row per operation: its shape and how many calls."""
        rows = [[n, " x ".join(map(str, p[0].shape)), str(len(p))] for n, p in self._patterns.items()]
        return "\n".join(table(["operation", "batch x heads x queries x keys", "calls"], rows, left={0, 1}))

    def to_dict(self) -> dict[str, Any]:
        """``{name: probabilities}`` (the first call of each operation)."""
        return {n: p[0] for n, p in self._patterns.items()}


@checked
def attention(model: nn.Module, inputs: Any, *, layers: Layers | None = None,
              kwargs: Mapping[str, Any] | None = None) -> AttentionPatterns:
    """The attention probabilities of one forward pass, whatever kernel the model runs.

    Args:
        model: any model; it runs once, in eval mode, without gradients, and is left as it was.
        inputs: its positional input (a tensor, or a tuple of them).
        layers: the attention operations: ``"h.*::scaled_dot_product_attention"`` (computed from
            the kernel's inputs), ``"*::multi_head_attention_forward"`` (``nn.MultiheadAttention``'s
            weights per head, as ``need_weights=True, average_attn_weights=False`` gives them), or a
            ``softmax`` operation of eager attention (its output). By default every call of the
            first two.
        kwargs: keyword inputs of the model (``attention_mask=...``).

    Example:
        >>> import torch, hookscope
        >>> class Attend(torch.nn.Module):
        ...     def forward(self, q, k, v):
        ...         return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> net = torch.nn.Sequential()
        >>> net.attn = Attend()
        >>> q = torch.randn(1, 2, 3, 4)
        >>> p = hookscope.attention(net.attn, (q, q, q))
        >>> list(p), tuple(p["::scaled_dot_product_attention"].shape)
        (['::scaled_dot_product_attention'], (1, 2, 3, 3))
    """
    chosen = [layers] if layers is None or not isinstance(layers, (list, tuple)) else list(layers)
    selectors = [f"*{SEP}{k}" for k in KERNELS] if layers is None else chosen
    sites = select(model, *selectors)
    args = (inputs if isinstance(inputs, tuple) else (inputs,), model_kwargs(kwargs))
    module = next(((n, site) for n, site in sites if not isinstance(site, OpSite)), None)
    if module is not None:
        raise HookscopeError(f"{module[0]!r} is a module; attention patterns come from an operation: "
                             + _inside(model, module, args))
    patterns: dict[str, list[torch.Tensor]] = {}
    # the default kernels go as their globs: one resolution each, not one per module they name
    names = [f"*{SEP}{k}" for k in KERNELS] if layers is None else [n for n, _ in sites]
    for call in _calls(model, names, args, any_of=layers is None):
        op = (split_op(call.name) or ("", ""))[1].split(".")[0]
        got = attention_probabilities(*call.args, **call.kwargs) if op == SDPA else \
            _mha_weights(call.args, call.kwargs, call.output) if op == MHA else call.output
        patterns.setdefault(call.name, []).append(got)
    if not patterns:
        raise HookscopeError(f"no {' or '.join(KERNELS)} ran in {type(model).__name__}"
                             f"{'' if layers is None else f' at {layers!r}'}; for attention written by hand, find "
                             "the softmax of its probabilities with hookscope.operations(model, inputs) and pass "
                             "layers= its name ('<module>::softmax')")
    return AttentionPatterns(patterns)


def _calls(model: nn.Module, names: list[str], args: tuple[Any, ...], *, any_of: bool = False) -> list[Any]:
    """The calls of the operations ``names`` in one pass, inputs and outputs kept. With ``any_of``
    the names are alternatives (the kernels one of which a model runs): those that never ran are no
    misspelling, so the capture's end-of-block check is not passed on."""
    rec = capture(model, *names, keep="io")
    try:
        with restored(model, train=False), torch.no_grad(), rec:
            call_model(model, *private(args))
    except SelectionError:  # raised only by the capture's exit, after the pass: its calls are whole
        if not any_of:
            raise
    return list(rec.calls)


def _inside(model: nn.Module, module: tuple[str, nn.Module], args: tuple[Any, ...]) -> str:
    """The remedy for a module selected: the attention operations that ran in it (one more pass)."""
    ops = [*KERNELS, "softmax"]
    where = [module[0]] + ([f"{module[0]}.*"] if next(module[1].children(), None) is not None else [])
    ran = [c.name for c in _calls(model, [f"{w}{SEP}{op}" for op in ops for w in where], args, any_of=True)]
    for op in ops:  # the kernels before a softmax
        found = next((n for n in ran if (split_op(n) or ("", ""))[1].split(".")[0] == op), None)
        if found is not None:
            return f"select {found!r}"
    return (f"no {', '.join(ops)} runs inside it; list the operations of one pass with "
            "hookscope.operations(model, inputs) and select the one giving its probabilities")


_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def _mha_weights(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> torch.Tensor:
    """``nn.MultiheadAttention``'s weights per head for the same call, ``batch x heads x queries x keys``;
    zeros where the kernel that ran weighed a query that sees no key with zeros (its output finite)."""
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    bound.arguments.update(need_weights=True, average_attn_weights=False, training=False)  # dropout left out
    weights = F.multi_head_attention_forward(*bound.args, **bound.kwargs)[1]
    assert weights is not None
    ran = output[0] if isinstance(output, tuple) else output  # queries x batch x features, or queries x features
    seen = ran.isfinite().all(-1)  # queries x batch, or queries
    seen = seen.transpose(0, 1)[:, None, :, None] if seen.dim() == 2 else seen[None, :, None]
    return weights.masked_fill(seen & weights.isnan(), 0.0)
