"""The model as a stack of blocks calibrated one after another, and the inputs each block sees.

Three shapes: an ``nn.Sequential`` (its children, each fed the previous one's output), a model whose
blocks sit in an ``nn.ModuleList`` (a transformers decoder: the longest list whose entries hold linear
layers; the inputs of its first block are caught once, with the keyword inputs the blocks need, such
as the attention mask and position embeddings, and each block's output feeds the next), and any other
model, one block. Must not import: any other analysis module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.parameter import is_lazy

from ....core.hooks import HookGroup
from ....errors import HookscopeError
from ....selection import named_modules, unwrap
from ._stats import is_conv1d

__all__ = ["Call", "Stack", "find_stack", "linears_in", "check_chain", "first_calls", "run_block"]

Call = tuple[tuple[Any, ...], dict[str, Any]]
"""The positional and keyword inputs of one call of a block (one calibration batch)."""


@dataclass(frozen=True)
class Stack:
    """``blocks``: ``(qualname, module)`` in the order they run; ``kind``: ``"sequential"``,
    ``"list"`` (blocks in an ``nn.ModuleList``, their inputs caught) or ``"whole"`` (the model, one block).

    Example:
        >>> find_stack(nn.Sequential(nn.Linear(2, 2), nn.ReLU())).kind
        'sequential'
    """

    blocks: list[tuple[str, nn.Module]]
    kind: str


def _linear(m: nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return (isinstance(m, nn.Linear) or is_conv1d(m)) and isinstance(w, torch.Tensor) and (is_lazy(w) or w.dim() == 2)


def linears_in(block: nn.Module, qualname: str) -> list[tuple[str, str, nn.Module]]:
    """``(qualname in the model, name in the block, module)`` of every linear layer in ``block``.

    Example:
        >>> [q for q, _, _ in linears_in(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), "mlp")]
        ['mlp.0']
    """
    out = []
    for local, m in block.named_modules():
        if _linear(m) or (local == "" and isinstance(m, nn.Linear)):
            out.append((f"{qualname}.{local}".strip(".") if local else qualname, local, m))
    return out


def find_stack(model: nn.Module) -> Stack:
    """The blocks of ``model`` in calling order (see the module's docstring)."""
    inner, _ = unwrap(model)
    if isinstance(inner, nn.Sequential):
        return Stack([(q, m) for q, m in inner.named_children()], "sequential")
    lists = [(q, m) for q, m in named_modules(model) if isinstance(m, nn.ModuleList) and len(m)
             and all(linears_in(b, "") for b in m)]
    if lists:
        q, best = max(lists, key=lambda item: len(item[1]))  # max keeps the first of equal lengths
        return Stack([(f"{q}.{i}", b) for i, b in enumerate(best)], "list")
    return Stack([("", inner)], "whole")


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _no_cache(value: Any) -> Any:
    """Calibration passes run every block many times: a transformers cache would grow with each."""
    return None if type(value).__name__.endswith("Cache") else value


class _Caught(Exception):
    def __init__(self, call: Call) -> None:
        self.call = call


def _catch(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    kw = {k: _no_cache(v) for k, v in kwargs.items()}
    if "use_cache" in kw:
        kw["use_cache"] = False
    raise _Caught((tuple(_no_cache(a) for a in args), kw))


def _call_model(model: nn.Module, batch: Any) -> Any:
    return model(**batch) if isinstance(batch, Mapping) else model(batch)


def _caught(model: nn.Module, first: nn.Module, batch: Any, i: int) -> Call:
    """The inputs ``first`` is called with when the model runs on ``batch`` (the rest is not run)."""
    with HookGroup() as hooks:
        # own hook: it stops the forward at the first block, whose inputs are all the calibration needs
        hooks.add(first.register_forward_pre_hook(_catch, with_kwargs=True))
        try:
            _call_model(model, batch)
        except _Caught as caught:
            return caught.call
        except Exception as e:  # the user's data in the user's model: say which batch, in one line
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise HookscopeError(f"calibration batch {i} fails in {type(model).__name__} ({type(e).__name__}: "
                                 f"{text}); pass batches the model takes (token ids for a language model)") from e
    raise HookscopeError(f"{type(model).__name__} ran calibration batch {i} without calling its first block; "
                         "pass an nn.Sequential or a model that runs its nn.ModuleList of blocks")


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("hidden_states")


def _one_sample(batch: Any) -> Any:
    """The first sequence of a batch: the order check runs the whole model (its head's logits too)."""
    if isinstance(batch, torch.Tensor):
        return batch[:1]
    n = next((v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim()), None)
    return {k: v[:1] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v for k, v in batch.items()}


def check_chain(model: nn.Module, stack: Stack, batch: Any) -> None:
    """Refuse, before any pruning, blocks in a list that do not feed each other in order (parallel
    branches, a list called twice): each block must be called once, on the previous block's output."""
    seen: list[tuple[int, str, Any]] = []

    def pre(k: int) -> Any:
        return lambda m, a, kw: seen.append((k, "in", _hidden(a, kw)))

    def post(k: int) -> Any:
        return lambda m, a, kw, out: seen.append((k, "out", out[0] if isinstance(out, (tuple, list)) else out))

    with HookGroup() as hooks:
        for k, (_, block) in enumerate(stack.blocks):
            # own hook: one dense pass that shows the order the blocks run in and what each is fed
            hooks.add(block.register_forward_pre_hook(pre(k), with_kwargs=True))
            hooks.add(block.register_forward_hook(post(k), with_kwargs=True))
        _call_model(model, batch)
    order = [(k, side) for k, side, _ in seen]
    chained = order == [(k, side) for k in range(len(stack.blocks)) for side in ("in", "out")] and all(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        for (_, _, a), (_, _, b) in zip(seen[1:-1:2], seen[2::2]))
    if not chained:
        raise HookscopeError(f"the blocks in {stack.blocks[0][0].rsplit('.', 1)[0]!r} are not run one after another, "
                             "each on the previous one's output; pass an nn.Sequential of the parts, or the model "
                             "whose blocks do")


def first_calls(model: nn.Module, stack: Stack, batches: list[Any], device: torch.device) -> list[Call]:
    """The inputs of the first block, one call per batch, on ``device``."""
    moved = [{k: _to(v, device) for k, v in b.items()} if isinstance(b, Mapping) else _to(b, device)
             for b in batches]
    if stack.kind == "list":
        calls = [_caught(unwrap(model)[0], stack.blocks[0][1], b, i) for i, b in enumerate(moved)]
        check_chain(unwrap(model)[0], stack, _one_sample(moved[0]))
        return calls
    return [((), dict(b)) if isinstance(b, Mapping) else ((b,), {}) for b in moved]


def _next(call: Call, out: Any, kind: str) -> Call:
    args, kwargs = call
    if kind == "sequential":
        return (out,), {}
    hidden = out[0] if isinstance(out, (tuple, list)) else out
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def run_block(block: nn.Module, calls: list[Call], kind: str,
              params: dict[str, torch.Tensor] | None = None) -> list[Call]:
    """Run ``block`` on each call (with ``params`` in place of its own, the model untouched); the
    inputs of the next block."""
    out = []
    for call in calls:
        result = block(*call[0], **call[1]) if params is None else functional_call(block, params, call[0], call[1])
        out.append(_next(call, result, kind))
    return out
