"""``prune_calibrated``: Wanda and SparseGPT masks, calibrated block by block through forward hooks.

Everything is checked before the first forward pass (method, sparsity, N:M against every layer's
input width, the data, the layers), and nothing is written into the model until every block is
done: the pruned weights of the blocks already calibrated are held aside and passed to the next
blocks' runs with ``torch.func.functional_call``, so a failure at any block leaves the model as it
was. Must not import: any other analysis module.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ....core.hooks import HookGroup
from ....errors import HookscopeError, checked, did_you_mean
from ....selection import named_modules
from ..masks import Sparsity, apply_mask, mask_of
from ..masks import sparsity as read_sparsity
from ._solvers import SOLVERS, Settings
from ._stack import Call, Stack, find_stack, first_calls, linears_in, run_block
from ._stats import InputStats, is_conv1d, matrix_of

__all__ = ["prune_calibrated", "calibration_batches", "device_of"]


@dataclass
class _Pending:
    """One layer's outcome, written into the model once every block is done."""

    qualname: str
    module: nn.Module
    weight: torch.Tensor | None  # SparseGPT's updated weight, in the layer's layout; None: unchanged
    keep: torch.Tensor  # the mask, in the layer's layout


def _settings(method: str, sparsity: object, n_m: object, blocksize: object, percdamp: object) -> Settings:
    if (sparsity is None) == (n_m is None):
        raise HookscopeError("pass one of sparsity= (a fraction of each row, e.g. 0.5) or n_m= (N of every M "
                             "inputs pruned, e.g. (2, 4)), not " + ("both" if n_m is not None else "neither"))
    if n_m is not None:
        if not (isinstance(n_m, Sequence) and len(n_m) == 2 and all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in n_m)
                and 0 < int(n_m[0]) < int(n_m[1])):
            raise HookscopeError(f"n_m={n_m!r} is not N:M; pass two ints 0 < N < M, e.g. n_m=(2, 4): 2 of every "
                                 "4 consecutive inputs pruned")
        pair = (int(n_m[0]), int(n_m[1]))
        nm: tuple[int, int] | None = pair
        value = pair[0] / pair[1]
    else:
        nm = None
        ok = isinstance(sparsity, numbers.Real) and not isinstance(sparsity, bool) and 0 <= float(sparsity) < 1
        if not ok:
            raise HookscopeError(f"sparsity={sparsity!r} is outside [0, 1); pass the fraction of each row to "
                                 "prune, e.g. 0.5")
        value = float(sparsity)  # type: ignore[arg-type]
    if isinstance(blocksize, bool) or not isinstance(blocksize, numbers.Integral) or blocksize < 1:
        raise HookscopeError(f"blocksize={blocksize!r} is not a count of columns; pass an int >= 1 (128)")
    if method == "sparsegpt" and nm is not None and int(blocksize) % nm[1]:  # SparseGPT picks each group inside one block of columns
        raise HookscopeError(f"blocksize={blocksize} is not a multiple of M={nm[1]}: an N:M group would straddle "
                             f"two blocks; pass a multiple of {nm[1]} (128)")
    if isinstance(percdamp, bool) or not isinstance(percdamp, numbers.Real) or not 0 <= float(percdamp) < float("inf"):
        raise HookscopeError(f"percdamp={percdamp!r} is not a dampening fraction; pass a number >= 0 (0.01)")
    return Settings(value, nm, int(blocksize), float(percdamp))


def _batch_ok(b: object) -> bool:
    if isinstance(b, torch.Tensor):
        return b.dim() >= 1 and b.numel() > 0
    return isinstance(b, Mapping) and bool(b) and all(isinstance(k, str) for k in b)


def _inputs(b: object) -> object:
    """A loader's ``(inputs, labels)`` batch as its inputs; any other batch as it is."""
    if isinstance(b, (list, tuple)) and b and isinstance(b[0], (torch.Tensor, Mapping)):
        return b[0]
    return b


def calibration_batches(data: object) -> list[Any]:
    """``data`` as a list of batches: one tensor (or dict of keyword inputs), or an iterable of them
    (a list, a DataLoader; ``(inputs, labels)`` batches give their inputs)."""
    if isinstance(data, (torch.Tensor, Mapping)):
        items: list[Any] | None = [data]
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        items = [_inputs(b) for b in data]
    else:
        items = None
    if not items or not all(_batch_ok(b) for b in items):
        bad = type(data).__name__ if items is None or not items else \
            next(type(b).__name__ for b in items if not _batch_ok(b)) + " in it"
        raise HookscopeError(f"data= is not calibration data (a {bad}, or empty); pass a tensor of inputs "
                             "(token ids [nsamples, seqlen] for a language model), a dict of keyword inputs, or "
                             "a list or DataLoader of those (batches)")
    return items


def _check_layer(model: nn.Module, q: str, m: nn.Module, settings: Settings, held: dict[int, int]) -> None:
    w = m._parameters.get("weight")
    label = f"{q}.weight" if q else "weight"
    if w is not None and is_lazy(w):
        raise HookscopeError(f"{label} holds no values yet (a lazy layer); run one forward pass first")
    if mask_of(m, "weight") is not None or w is None:
        raise HookscopeError(f"{label} is masked already; make its mask permanent first "
                             "(hookscope.remove_masks) or pass an unpruned model")
    if not w.is_floating_point() or w.device.type == "meta":
        raise HookscopeError(f"{label} is a {w.dtype} tensor on {w.device}; only floating-point weights "
                             "with values are pruned")
    if held.get(id(w), 0) > 1:
        raise HookscopeError(f"{label} is shared with another layer (tied weights): a mask on one would leave "
                             "the other dense; untie them first")
    cols = matrix_of(m).shape[1]
    if settings.n_m is not None and cols % settings.n_m[1]:
        raise HookscopeError(f"layer {q!r} has {cols} inputs, which {settings.n_m[1]} does not divide; pass an "
                             f"n_m=(N, M) with M dividing {cols}")


def _plan(model: nn.Module, stack: Stack, settings: Settings) -> list[list[tuple[str, str, nn.Module]]]:
    """The linear layers of each block, every one checked."""
    plan = [linears_in(block, q) for q, block in stack.blocks]
    if not any(plan):
        raise HookscopeError(f"{type(model).__name__} has no nn.Linear layer to prune; Wanda and SparseGPT "
                             "prune the linear layers of a model")
    held: dict[int, int] = {}
    for _, m in named_modules(model):
        for p in m._parameters.values():
            if p is not None:
                held[id(p)] = held.get(id(p), 0) + 1
    for layers in plan:
        for q, _, m in layers:
            _check_layer(model, q, m, settings, held)
    return plan


def device_of(device: object, model: nn.Module) -> torch.device:
    """``device=`` as a device (``None``: the model's first parameter's), or a one-line error."""
    if device is None:
        first = next(iter(model.parameters()), None)
        return first.device if first is not None else torch.device("cpu")
    try:
        where: torch.device = torch.device(device)  # type: ignore[call-overload]
        return where
    except (RuntimeError, TypeError):
        raise HookscopeError(f"device={device!r} is not a device; pass 'cpu', 'cuda', 'cuda:1'...") from None


def token_masks(batches: list[Any], device: torch.device) -> list[torch.Tensor | None]:
    """Each batch's ``attention_mask`` (``[batch, seq]``, on ``device``) where it has one: its pad positions."""
    out: list[torch.Tensor | None] = []
    for b in batches:
        t = b.get("attention_mask") if isinstance(b, Mapping) else None
        out.append(t.to(device) if isinstance(t, torch.Tensor) and t.dim() == 2 and not bool(t.all()) else None)
    return out


def _measure(block: nn.Module, calls: list[Call], tokens: list[torch.Tensor | None],
             layers: list[tuple[str, str, nn.Module]], statistic: str, device: torch.device,
             kind: str) -> list[InputStats]:
    """Each layer's input statistic over the block's calls (the block as it is, dense), pad tokens left out."""
    stats = [InputStats(statistic, matrix_of(m).shape[1], device,
                        torch.promote_types(matrix_of(m).dtype, torch.float32)) for _, _, m in layers]
    with HookGroup() as hooks:
        for s, (_, _, m) in zip(stats, layers):
            # own hook: the statistic is gathered over every calibration call, then read once
            hooks.add(m.register_forward_hook(s))
        for call, t in zip(calls, tokens):
            for s in stats:
                s.tokens = t
            run_block(block, [call], kind)
    return stats


def _solve(layers: list[tuple[str, str, nn.Module]], stats: list[InputStats], method: str,
           settings: Settings) -> list[_Pending]:
    out = []
    for (q, _, m), s in zip(layers, stats):
        w = matrix_of(m).detach()
        new, pruned = SOLVERS[method].solve(w.to(s.device, s.dtype), s.value, settings)
        keep = (~pruned).to(w.device, w.dtype)
        weight = None if new is None else new.to(w.device, w.dtype)
        if is_conv1d(m):
            keep, weight = keep.t(), None if weight is None else weight.t()
        out.append(_Pending(q, m, weight, keep))
    return out


def _params(layers: list[tuple[str, str, nn.Module]], pending: list[_Pending]) -> dict[str, torch.Tensor]:
    """The block's pruned weights by their names in the block, for its run that feeds the next block."""
    out = {}
    for (_, local, m), p in zip(layers, pending):
        w = m.weight if p.weight is None else p.weight
        assert isinstance(w, torch.Tensor)
        out[f"{local}.weight" if local else "weight"] = w.detach() * p.keep
    return out


def _calibrate(model: nn.Module, stack: Stack, plan: list[list[tuple[str, str, nn.Module]]], batches: list[Any],
               method: str, settings: Settings, device: torch.device) -> list[_Pending]:
    calls = first_calls(model, stack, batches, device)
    tokens = token_masks(batches, device)
    pending: list[_Pending] = []
    for i, ((q, block), layers) in enumerate(zip(stack.blocks, plan)):
        try:
            done = _block(block, layers, calls, tokens, method, settings, device, stack.kind)
            if i + 1 < len(stack.blocks) and stack.kind != "whole":
                calls = run_block(block, calls, stack.kind, _params(layers, done) if layers else None)
        except HookscopeError:
            raise
        except Exception as e:  # the user's model on the user's data: say where, in one line
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            where = f"block {q!r}" if q else type(block).__name__
            raise HookscopeError(f"calibration fails in {where} ({type(e).__name__}: {text}); pass data the model "
                                 "takes (its inputs, or token ids for a language model)") from e
        pending += done
    return pending


def _block(block: nn.Module, layers: list[tuple[str, str, nn.Module]], calls: list[Call],
           tokens: list[torch.Tensor | None], method: str, settings: Settings, device: torch.device,
           kind: str) -> list[_Pending]:
    """The block's layers measured on its calls and solved; one block's statistics held at a time."""
    if not layers:
        return []
    stats = _measure(block, calls, tokens, layers, SOLVERS[method].statistic, device, kind)
    return _solve(layers, stats, method, settings)


@checked
def prune_calibrated(model: nn.Module, data: Any, *, method: str = "wanda", sparsity: float | None = None,
                     n_m: tuple[int, int] | None = None, device: torch.device | str | None = None,
                     blocksize: int = 128, percdamp: float = 0.01) -> Sparsity:
    """Mask the linear layers of ``model`` with Wanda or SparseGPT, calibrated on ``data`` block by block.

    Each block (an ``nn.Sequential``'s children; a transformers decoder's layers; else the model as one
    block) is run on the calibration inputs with a forward hook on each of its linear layers (``nn.Linear``
    and transformers' ``Conv1D``), pruned, then run again pruned to make the next block's inputs, so each
    block sees the already-pruned blocks' outputs. Layers outside the blocks (a language model's
    embeddings and head) are left alone. The masks are :func:`prune`'s (``weight_orig``, ``weight_mask``,
    a forward pre-hook): :func:`remove_masks`, :func:`sparsity` and ``summary`` read them.

    Args:
        model: the model, on ``device``, left in its training mode.
        data: the calibration inputs: a tensor (token ids ``[nsamples, seqlen]`` for a language model),
            a dict of keyword inputs, or a list or DataLoader of those (batches, run one at a time; an
            ``(inputs, labels)`` batch gives its inputs). A batch's pad positions (its ``attention_mask``
            0) are left out of the statistics.
        method: ``"wanda"`` (score ``|W_ij| * ||X_j||_2``, the weights kept as they are) or ``"sparsegpt"``
            (the optimal-brain-surgeon mask and weight update, written into ``weight_orig``).
        sparsity: a fraction in [0, 1): the lowest-scored share of each row (Wanda) or of each block of
            ``blocksize`` columns (SparseGPT); ``int(fraction * count)`` entries.
        n_m: ``(N, M)`` instead of ``sparsity``: N of every M consecutive inputs of each row pruned,
            e.g. ``(2, 4)``; M must divide every layer's input width.
        device: where the inputs go and the statistics are computed (default: the model's first parameter's).
        blocksize, percdamp: SparseGPT's lazy-update block of columns and dampening (a fraction of the
            Hessian's mean diagonal).

    Returns:
        :class:`Sparsity` of the pruned layers.

    Example:
        >>> torch.manual_seed(0) and None
        >>> net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> r = prune_calibrated(net, torch.randn(32, 8), method="sparsegpt", n_m=(2, 4))
        >>> r.sparsity, r["2"].zeros
        (0.5, 16)
    """
    if method not in SOLVERS:
        hint = did_you_mean(method, SOLVERS) if isinstance(method, str) else ""
        raise HookscopeError(f"no calibrated pruning method {method!r}.{hint} The methods: {', '.join(SOLVERS)}")
    settings = _settings(method, sparsity, n_m, blocksize, percdamp)
    batches = calibration_batches(data)
    stack = find_stack(model)
    plan = _plan(model, stack, settings)
    where = device_of(device, model)
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            pending = _calibrate(model, stack, plan, batches, method, settings, where)
    finally:
        for m, mode in modes:
            m.training = mode
    with torch.no_grad():
        for p in pending:
            weight = p.module.weight
            if p.weight is not None and isinstance(weight, torch.Tensor):
                weight.copy_(p.weight)
            apply_mask(p.module, "weight", p.keep)
    return read_sparsity(model, *[p.qualname for p in pending], name="weight")
