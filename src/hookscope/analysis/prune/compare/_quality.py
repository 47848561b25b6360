"""How well a model does on the user's data: perplexity of a language model, accuracy of a classifier.

Collect (:func:`batches` reads the data once and says which measure its batches ask for), measure
(:func:`score`: one model over every batch, in the caller's eval mode and ``torch.no_grad()``).
Used by :func:`compare_models` for its quality row. Must not import: any other analysis, ``cli``, ``viz``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ....core.failure import forward_error, received
from ....core.inputs import private
from ....errors import HookscopeError

__all__ = ["Batch", "Score", "batches", "score"]

QUALITIES = ("perplexity", "accuracy")
_IGNORE = -100  # the label Hugging Face's losses skip (padding, prompt tokens)


@dataclass(frozen=True)
class Batch:
    """One batch split into what the model is called with and the labels it is scored against."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    labels: torch.Tensor


@dataclass(frozen=True)
class Score:
    """A model's quality on the data: ``value`` over ``count`` tokens (perplexity) or samples (accuracy)."""

    value: float
    count: int


def _is_ids(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() and t.dim() == 2


def _kind_of(batch: Any) -> str | None:
    """The measure a batch's shape asks for: token ids (a 2-D integer tensor, or a dict with
    ``input_ids``) -> perplexity; an ``(inputs, labels)`` pair with 1-D integer labels -> accuracy."""
    if _is_ids(batch) or (isinstance(batch, Mapping) and _is_ids(batch.get("input_ids"))):
        return "perplexity"
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor) \
            and batch[1].dim() == 1 and not batch[1].is_floating_point():
        return "accuracy"
    return None


def _lm_batch(batch: Any) -> Batch:
    if isinstance(batch, torch.Tensor):
        return Batch((batch,), {}, batch)
    if isinstance(batch, Mapping):
        kw = {k: v for k, v in batch.items() if k != "labels"}  # the model is not asked for its loss
        labels = batch.get("labels", kw["input_ids"])
        mask = kw.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.shape == labels.shape:
            labels = labels.masked_fill(mask == 0, _IGNORE)  # padding is not text
        return Batch((), kw, labels)
    inputs, labels = batch
    return Batch(inputs if isinstance(inputs, tuple) else (inputs,), {}, labels)


def _classifier_batch(batch: Any) -> Batch:
    inputs, labels = batch
    if isinstance(inputs, Mapping):
        return Batch((), dict(inputs), labels)
    return Batch(inputs if isinstance(inputs, tuple) else (inputs,), {}, labels)


def batches(data: Any, quality: str | None) -> tuple[str, list[Batch]]:
    """``(measure, batches)``: ``data`` read once (an iterable of batches, or one batch), each batch split
    into the model's inputs and its labels; ``quality=None`` takes the measure from the first batch."""
    if quality is not None and quality not in QUALITIES:
        raise HookscopeError(f"compare_models: quality={quality!r} is not a measure; pass 'perplexity', "
                             "'accuracy' or None (taken from the batches)")
    items = [data] if _kind_of(data) is not None else list(data) if _iterable(data) else []
    if not items:
        raise HookscopeError(f"compare_models: data (a {type(data).__name__}) holds no batch; pass a list of "
                             "token-id tensors [batch, tokens] or of (inputs, labels) pairs")
    kind = quality or _kind_of(items[0])
    if kind is None:
        raise HookscopeError("compare_models cannot tell from the batches what to measure; pass "
                             "quality='perplexity' or quality='accuracy' (batches: token ids, or (inputs, labels))")
    split = _lm_batch if kind == "perplexity" else _classifier_batch
    out = []
    for i, b in enumerate(items):
        if kind == "accuracy" and not (isinstance(b, (tuple, list)) and len(b) == 2):
            raise HookscopeError(f"compare_models: batch {i} is a {type(b).__name__}; accuracy needs "
                                 "(inputs, labels) pairs, the labels a 1-D tensor of class indices")
        if kind == "perplexity" and not (isinstance(b, (torch.Tensor, Mapping)) or
                                         (isinstance(b, (tuple, list)) and len(b) == 2)):
            raise HookscopeError(f"compare_models: batch {i} is a {type(b).__name__}; perplexity needs token "
                                 "ids [batch, tokens], a dict with input_ids, or (input_ids, labels) pairs")
        out.append(split(b))
        if kind == "perplexity" and not _is_ids(out[-1].labels):
            t = out[-1].labels
            raise HookscopeError(f"compare_models: batch {i} holds {tuple(t.shape)} {t.dtype} labels; perplexity "
                                 "needs token ids, integers [batch, tokens]")
    return kind, out


def _iterable(data: Any) -> bool:
    return not isinstance(data, (torch.Tensor, Mapping, str, bytes)) and hasattr(data, "__iter__")


def _logits(output: Any, side: str) -> torch.Tensor:
    """The scores in a model's output: the tensor itself, ``.logits`` / ``["logits"]``, or the first of a tuple."""
    if isinstance(output, Mapping) and "logits" in output:
        output = output["logits"]
    elif not isinstance(output, torch.Tensor) and isinstance(getattr(output, "logits", None), torch.Tensor):
        output = output.logits
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise HookscopeError(f"compare_models: the {side} model returned a {type(output).__name__} with no "
                             "logits tensor; give a model that returns its scores (a tensor, or .logits)")
    return output


def _nll(logits: torch.Tensor, labels: torch.Tensor, side: str, i: int) -> tuple[float, int]:
    """Summed next-token NLL and its token count: logits at position t scored against label t + 1."""
    if logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise HookscopeError(f"compare_models: the {side} model's logits on batch {i} are {tuple(logits.shape)}, "
                             f"the labels {tuple(labels.shape)}; perplexity needs [batch, tokens, vocabulary]")
    target = labels[:, 1:].reshape(-1)
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).double(), target,
                          ignore_index=_IGNORE, reduction="sum")
    return float(nll), int((target != _IGNORE).sum())


def _hits(logits: torch.Tensor, labels: torch.Tensor, side: str, i: int) -> tuple[float, int]:
    if logits.dim() != 2 or logits.shape[0] != labels.shape[0]:
        raise HookscopeError(f"compare_models: the {side} model's output on batch {i} is {tuple(logits.shape)} "
                             f"for {labels.shape[0]} labels; accuracy needs [batch, classes]")
    return float((logits.argmax(-1) == labels).sum()), labels.shape[0]


def score(model: nn.Module, kind: str, data: list[Batch], side: str) -> Score:
    """``model``'s perplexity (exp of the mean next-token NLL over every scored token) or accuracy
    (share of samples whose top class is the label) over every batch; the caller sets eval mode and
    ``torch.no_grad()``. Each batch runs on a private copy of its inputs."""
    total, count = 0.0, 0
    measure = _nll if kind == "perplexity" else _hits
    for i, b in enumerate(data):
        args, kw = private((b.args, b.kwargs))
        try:
            out = model(*args, **kw)
        except HookscopeError:
            raise
        except Exception as e:
            raise forward_error(e, f"the {side} model ({type(model).__name__})", got=received(args, kw),
                                after=None, run=f"{side}, batch {i}: ") from e
        part, n = measure(_logits(out, side), b.labels, side, i)
        total, count = total + part, count + n
    if count == 0:
        raise HookscopeError(f"compare_models: the data holds no scored {'token' if kind == 'perplexity' else 'sample'}"
                             "; give batches with at least two tokens (perplexity) or one sample (accuracy)")
    return Score(math.exp(total / count) if kind == "perplexity" else total / count, count)
