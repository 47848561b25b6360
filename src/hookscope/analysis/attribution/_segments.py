""":func:`hookscope.attribute_segments`: which readable pieces of a prompt (its words, its sentences, pieces
you name) a language model's continuation depends on, by the change of the continuation's
log-probability when a piece is taken out (replaced by a baseline token), or by Shapley values over the
pieces; one score per piece for the whole continuation, and a matrix piece x token written.

The continuation is scored by teacher forcing: one pass over the prompt and the tokens written gives
every token's log-probability, so each perturbed prompt costs one forward pass, without gradients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...core.inputs import model_kwargs
from ...core.result import Result, jsonable
from ...core.text import num, table
from ...errors import HookscopeError, checked
from ...selection import unwrap
from .._targets import call_model, logits_of
from ._perturb import generator
from ._tokens import check_tokenizer, text_of
from ._writing import running, write

__all__ = ["SEGMENT_METHODS", "SegmentAttributions", "SegmentRow", "attribute_segments"]

SEGMENT_METHODS = ("feature_ablation", "shapley_value_sampling")


@dataclass
class SegmentRow:
    """One segment of a :class:`SegmentAttributions`: its text (or name), its score for the continuation, and
    its score for each token written."""

    segment: str
    score: float
    per_token: list[float]


@dataclass
class SegmentAttributions(Result):
    """What :func:`hookscope.attribute_segments` returns: how much each piece of the prompt makes the continuation.

    Speaks hookscope's result protocol: ``table()`` (also ``str(res)``), ``to_dict()``, ``to_json()``,
    ``to_pandas()`` (one row per segment).

    Attributes:
        segments: each segment's text (or its name, for named pieces).
        spans: each segment's tokens, as ``(start, end)`` positions of the prompt (end excluded; the
            tokens of a word split over several pieces are one span from its first to its last).
        written: the token ids of the continuation explained.
        written_text: those tokens as text (with a tokenizer), else ``None``.
        logprobs: each written token's log-probability with the whole prompt.
        matrix: ``segments x written`` scores: for ablation ``log p(token)`` minus the same with the
            segment replaced by the baseline; for Shapley values each segment's share of
            ``log p(token)`` minus the same with every segment replaced.
        scores: each segment's score for the whole continuation (the matrix's rows summed: the change of
            the continuation's log-probability).
        method: ``"feature_ablation"`` or ``"shapley_value_sampling"``.
        settings: the baseline token, and Shapley's ``samples`` and ``seed``.
        forwards: how many times the model was called (the continuation written included).
    """

    segments: list[str]
    spans: list[list[tuple[int, int]]]
    written: list[int]
    written_text: list[str] | None
    logprobs: torch.Tensor
    matrix: torch.Tensor
    scores: torch.Tensor
    method: str
    settings: dict[str, Any]
    forwards: int

    def table(self) -> str:
        """One line per segment: its score for the continuation, then per token written.

        Example:
            >>> import torch, hookscope
            >>> lm = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6))
            >>> res = hookscope.attribute_segments(lm, torch.tensor([[1, 2, 3, 4]]), segments=[0, 0, 1, 1], generate=2)
            >>> print(res.table().splitlines()[0])
            feature_ablation of 2 segments for 2 tokens written (baseline token 0), 3 forward passes
        """
        shown = self.written_text or [f"#{t}" for t in self.written]
        said = ", ".join(f"{k}={v}" for k, v in self.settings.items() if k != "baseline")
        head = (f"{self.method} of {len(self.segments)} segment{'s' if len(self.segments) != 1 else ''} for "
                f"{len(self.written)} token{'s' if len(self.written) != 1 else ''} written (baseline token "
                f"{self.settings['baseline']}{', ' + said if said else ''}), {self.forwards} forward passes")
        rows = [[s, num(float(self.scores[i])), *[num(float(v)) for v in self.matrix[i]]]
                for i, s in enumerate(self.segments)]
        return "\n".join([head, *table(["segment", "total", *[repr(t) for t in shown]], rows, left={0})])

    @property
    def rows(self) -> list[SegmentRow]:
        """One :class:`SegmentRow` per segment."""
        return [SegmentRow(s, float(self.scores[i]), [float(v) for v in self.matrix[i]])
                for i, s in enumerate(self.segments)]

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python data, the tensors kept as tensors."""
        return {"method": self.method, "settings": dict(self.settings), "segments": list(self.segments),
                "spans": [list(map(list, s)) for s in self.spans], "written": list(self.written),
                "written_text": self.written_text, "logprobs": self.logprobs, "matrix": self.matrix,
                "scores": self.scores, "forwards": self.forwards}

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(jsonable(self.to_dict()), indent=indent, allow_nan=False)


Segments = str | Sequence[str] | Mapping[str, str] | Sequence[int] | torch.Tensor


@checked
def attribute_segments(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    segments: Segments = "words",
    target: Any = None,
    generate: int = 0,
    method: str = "feature_ablation",
    baseline: int | None = None,
    samples: int | None = None,
    seed: int | None = None,
    tokenizer: Any = None,
    batch_size: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> SegmentAttributions:
    """How much each segment of a prompt (words, sentences, pieces you name) makes a language model's continuation.

    The continuation is ``target`` (token ids) or, with ``generate=N``, the ``N`` tokens the model
    writes greedily (one token when neither is given). A segment is taken out by replacing its tokens
    with ``baseline``; ``method="feature_ablation"`` scores each segment by the drop of each written
    token's log-probability, ``"shapley_value_sampling"`` by its mean drop over ``samples`` random
    orders of putting the segments back (captum's ``LLMAttribution`` with ``FeatureAblation`` or
    ``ShapleyValueSampling`` over a template's slots). Tokens in no segment are held as they are.

    Args:
        model: a language model taking token ids (``B = 1``) and giving logits ``1 x T x V``.
        inputs: the prompt, ``1 x T`` token ids.
        segments: ``"words"`` (a word starts at a token whose text starts with a space, with a
            tokenizer), ``"sentences"`` (one ends after ``.``, ``!`` or ``?``), ``"tokens"``, a list of
            pieces of the prompt's text (each must occur in it, in order), a mapping ``{name: piece}``
            (template slots you name), or one label per token (``-1``: held), labels ``0..K-1``.
        target: the continuation's token ids (a list or a tensor), instead of ``generate``.
        generate: how many tokens the model writes greedily to explain.
        method: ``"feature_ablation"`` or ``"shapley_value_sampling"``.
        baseline: the token a segment's tokens are replaced by (``None``: the model's pad token, else
            its end-of-sequence token, else 0).
        samples: Shapley's random orders (``None``: 25).
        seed: seeds the orders (``None``: 0).
        tokenizer: turns ids into text: a tokenizer with ``decode``, a list of strings, or ``id -> str``.
        batch_size: prompts per forward pass (``None``: 16).
        kwargs: keyword inputs of the model.

    Returns:
        A :class:`SegmentAttributions`.

    Raises:
        HookscopeError: a segment that does not occur in the prompt, labels with a gap, segments that
            need a tokenizer without one, a batch of several prompts, in one line.

    Example:
        >>> import torch, hookscope
        >>> lm = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6))
        >>> words = ["<pad>", " the", " cat", " sat", ".", " on"]
        >>> res = hookscope.attribute_segments(lm, torch.tensor([[1, 2, 3, 4]]), tokenizer=words, generate=2)
        >>> res.segments
        [' the', ' cat', ' sat.']
    """
    if method not in SEGMENT_METHODS:
        raise HookscopeError(f"method={method!r} is not a segment method; use one of {', '.join(SEGMENT_METHODS)}")
    check_tokenizer(tokenizer)
    if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2 or inputs.shape[0] != 1 or inputs.is_floating_point():
        raise HookscopeError("inputs must be one prompt of token ids, 1 x T; explain prompts one at a time")
    for name, v, least in (("samples", samples, 1), ("batch_size", batch_size, 1), ("generate", generate, 0)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise HookscopeError(f"{name}={v!r} must be an int >= {least}")
    kw = model_kwargs(kwargs)
    prompt = inputs.tolist()[0]
    texts = None if tokenizer is None else [text_of(tokenizer, t) for t in prompt]
    labels, names = _labels(segments, texts, len(prompt))
    base = _baseline(model, baseline)
    written, forwards = _continuation(model, inputs, target, generate, kw)
    full = torch.cat([inputs, torch.tensor([written], dtype=inputs.dtype, device=inputs.device)], 1)
    runner = _Runner(model, full, len(prompt), torch.tensor(labels, device=inputs.device), base, kw, batch_size or 16)
    K = len(names)
    if method == "feature_ablation":
        keep = ~torch.eye(K, dtype=torch.bool)
        scored = runner.logprobs(torch.cat([torch.ones(1, K, dtype=torch.bool), keep]))
        logp, matrix = scored[0], scored[0] - torch.stack(scored[1:])
        told: dict[str, Any] = {"baseline": base}
    else:
        n, g = samples or 25, generator(0 if seed is None else seed)
        logp, matrix = _shapley(runner, K, n, g)
        told = {"baseline": base, "samples": n, "seed": 0 if seed is None else seed}
    spans = [_spans([i for i, lab in enumerate(labels) if lab == k]) for k in range(K)]
    return SegmentAttributions(segments=names, spans=spans, written=written,
                               written_text=None if tokenizer is None else [text_of(tokenizer, t) for t in written],
                               logprobs=logp, matrix=matrix, scores=matrix.sum(1), method=method, settings=told,
                               forwards=forwards + runner.forwards)


def _shapley(runner: _Runner, K: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each segment's mean gain of every token's log-probability over ``n`` orders of putting segments back."""
    orders = [torch.randperm(K, generator=g) for _ in range(n)]  # captum's draw
    rows = [torch.ones(K, dtype=torch.bool), torch.zeros(K, dtype=torch.bool)]
    for order in orders:
        kept = torch.zeros(K, dtype=torch.bool)
        for k in order.tolist():
            kept = kept.clone()
            kept[k] = True
            rows.append(kept)
    scored = runner.logprobs(torch.stack(rows))
    logp, empty, steps = scored[0], scored[1], torch.stack(scored[2:]).view(n, K, -1)
    gains = torch.zeros(K, steps.shape[-1], dtype=torch.float64)
    for o, order in enumerate(orders):
        before = empty
        for t, k in enumerate(order.tolist()):
            gains[k] += steps[o, t] - before
            before = steps[o, t]
    return logp, gains / n


class _Runner:
    """Prompts with segments replaced, scored by the log-probability of each token written."""

    def __init__(self, model: nn.Module, full: torch.Tensor, prompt: int, labels: torch.Tensor, base: int,
                 kw: dict[str, Any], batch_size: int) -> None:
        self.model, self.full, self.prompt, self.labels, self.base = model, full, prompt, labels, base
        self.kw, self.batch_size, self.forwards = kw, batch_size, 0

    def logprobs(self, kept: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``len(kept)`` rows of log-probabilities, one per token written; ``kept[i, k]``: segment ``k`` kept."""
        out = []
        with running(self.model), torch.no_grad():
            for lo in range(0, len(kept), self.batch_size):
                part = kept[lo:lo + self.batch_size].to(self.full.device)
                ids = self.full.repeat(len(part), 1)
                held = self.labels < 0
                keep = held | part.gather(1, self.labels.clamp(min=0).expand(len(part), -1))
                ids[:, :self.prompt] = torch.where(keep, ids[:, :self.prompt], torch.full_like(ids[:, :self.prompt],
                                                                                              self.base))
                kw = {k: (v.expand(len(part), *v.shape[1:]) if isinstance(v, torch.Tensor) and v.shape[:1] == (1,)
                          else v) for k, v in self.kw.items()}
                out.append(self._scored(call_model(self.model, (ids,), kw), ids))
                self.forwards += 1
        return tuple(torch.cat(out).double().cpu())

    def _scored(self, output: Any, ids: torch.Tensor) -> torch.Tensor:
        logits = logits_of(output)
        logits = logits if logits is not None else output if isinstance(output, torch.Tensor) else None
        if logits is None or logits.ndim != 3 or logits.shape[1] != ids.shape[1]:
            raise HookscopeError("the model gave no logits B x T x V for the tokens; attribute_segments needs a "
                                 "language model's output (logits, or an output with .logits)")
        logp = torch.log_softmax(logits[:, self.prompt - 1:-1].double(), -1)
        return logp.gather(2, ids[:, self.prompt:].unsqueeze(2)).squeeze(2)


def _continuation(model: nn.Module, inputs: torch.Tensor, target: Any, generate: int,
                  kw: dict[str, Any]) -> tuple[list[int], int]:
    if target is not None:
        if generate:
            raise HookscopeError("give target= (the continuation's ids) or generate=N, not both")
        ids = target.reshape(-1).tolist() if isinstance(target, torch.Tensor) else (
            [target] if isinstance(target, int) else list(target))
        if not ids or not all(isinstance(t, int) for t in ids):
            raise HookscopeError(f"target={target!r} is not a continuation; pass its token ids, e.g. [464, 3797]")
        return ids, 0
    n = generate or 1
    full, counts = write(model, inputs, n, kw)
    return full[0, inputs.shape[1]:inputs.shape[1] + counts[0]].tolist(), n


def _baseline(model: nn.Module, baseline: int | None) -> int:
    inner = unwrap(model)[0]
    find = getattr(inner, "get_input_embeddings", None)
    embed = find() if callable(find) else None
    vocab = getattr(embed, "num_embeddings", None)
    if baseline is not None:
        if isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0 or (
                isinstance(vocab, int) and baseline >= vocab):
            raise HookscopeError(f"baseline={baseline!r} must be a token id of the vocabulary (0 to "
                                 f"{'V' if vocab is None else vocab - 1}), e.g. the pad token's")
        return baseline
    config = getattr(inner, "config", None)
    for name in ("pad_token_id", "eos_token_id"):
        v = getattr(config, name, None)
        v = v[0] if isinstance(v, (list, tuple)) and v else v
        if isinstance(v, int) and (not isinstance(vocab, int) or 0 <= v < vocab):
            return v
    return 0


def _labels(segments: Any, texts: list[str] | None, T: int) -> tuple[list[int], list[str]]:
    """One label per prompt token (``-1``: held) and each segment's name."""
    if isinstance(segments, torch.Tensor) or (isinstance(segments, Sequence) and not isinstance(segments, str)
                                              and all(isinstance(s, int) for s in segments)):
        labels = [int(v) for v in (segments.reshape(-1).tolist() if isinstance(segments, torch.Tensor) else segments)]
        return _checked(labels, T), [_joined(texts, labels, k) for k in range(max(labels) + 1)]
    if segments == "tokens":
        return list(range(T)), [_joined(texts, list(range(T)), k) for k in range(T)]
    if isinstance(segments, str) and segments in ("words", "sentences"):
        if texts is None:
            raise HookscopeError(f"segments={segments!r} reads the tokens' text; pass tokenizer= (a tokenizer, a "
                                 "list of strings or id -> str), or segments= one label per token")
        labels, k = [], -1
        for i, t in enumerate(texts):
            starts = i == 0 or (t[:1].isspace() if segments == "words" else texts[i - 1].rstrip()[-1:] in (".", "!", "?"))
            k += int(starts)
            labels.append(k)
        return labels, [_joined(texts, labels, j) for j in range(k + 1)]
    if isinstance(segments, str) or not isinstance(segments, (Sequence, Mapping)):
        raise HookscopeError(f"segments={segments!r} is not a way to cut the prompt; pass 'words', 'sentences', "
                             "'tokens', a list of pieces of its text, {name: piece} or one label per token")
    return _pieces(segments, texts, T)


def _pieces(segments: Sequence[str] | Mapping[str, str], texts: list[str] | None, T: int) -> tuple[list[int], list[str]]:
    if texts is None:
        raise HookscopeError("segments given as text need tokenizer= to find them in the prompt; pass one, or "
                             "segments= one label per token")
    names, pieces = (list(segments), list(segments.values())) if isinstance(segments, Mapping) else (
        list(segments), list(segments))
    text = "".join(texts)
    starts = [sum(len(t) for t in texts[:i]) for i in range(T + 1)]
    labels, at = [-1] * T, 0
    for k, piece in enumerate(pieces):
        if not isinstance(piece, str) or not piece:
            raise HookscopeError(f"segment {names[k]!r} is {piece!r}; pass a piece of the prompt's text")
        found = text.find(piece, at)
        if found < 0:
            where = "after the segment before it" if text.find(piece) >= 0 else "in the prompt"
            raise HookscopeError(f"segment {piece!r} does not occur {where} {text!r}; pass pieces of the prompt "
                                 "as written, in order")
        at = found + len(piece)
        for i in range(T):
            if starts[i] < at and starts[i + 1] > found:
                if labels[i] >= 0:
                    raise HookscopeError(f"segments {names[labels[i]]!r} and {names[k]!r} share the token "
                                         f"{texts[i]!r}; pass pieces that end where a token ends")
                labels[i] = k
    return labels, [str(n) for n in names]


def _checked(labels: list[int], T: int) -> list[int]:
    if len(labels) != T:
        raise HookscopeError(f"segments= gives {len(labels)} labels for a prompt of {T} tokens; pass one per token")
    used = sorted({v for v in labels if v >= 0})
    if min(labels) < -1 or used != list(range(len(used))) or not used:
        gap = next((k for k in range(max(used, default=0) + 1) if k not in used), None)
        raise HookscopeError(f"segments= labels must be 0..K-1 with none missing (-1 holds a token)"
                             + (f"; {gap} is missing" if gap is not None else "") + ": renumber them")
    return labels


def _joined(texts: list[str] | None, labels: list[int], k: int) -> str:
    tokens = [i for i, lab in enumerate(labels) if lab == k]
    return "".join(texts[i] for i in tokens) if texts is not None else f"tokens {_spans(tokens)}"


def _spans(tokens: list[int]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for i in tokens:
        if spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans

