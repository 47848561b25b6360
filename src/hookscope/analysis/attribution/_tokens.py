""":func:`hookscope.attribute_tokens`: which tokens a language model's next token depends on, and each
token of a greedy continuation, one score per token.

Token ids have no gradient, so the attribution is taken at the token embedding (or another layer whose
output has one row per token): one pass records the layer's output on the ids, then
:func:`hookscope.attribute` runs a stand-in model whose input *is* that output (``hookscope.edit``
puts it in place of the layer's output, the ids going in as before), so that every method, baseline
and integration rule of :func:`hookscope.attribute` holds as it is, with a baseline of zeros at the
layer by default. The scores of a token are its attribution summed over the hidden dimension.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..._tree import first_tensor, tree_map
from ...capture import capture
from ...core.inputs import model_kwargs
from ...core.text import shape_text
from ...edit import edit
from ...errors import HookscopeError, checked
from ...selection import Selector, check_hookable, exact_ops, unwrap
from ...selection import layers as select
from .._target_classes import Token
from .._targets import call_model, is_function, logits_of
from ._api import attribute, chosen_method
from ._engine import sharing
from ._settings import AttributionMethod, IntegratedGradients
from ._tokens_result import TokenAttributions, TokenRow
from ._writing import DECODER, LogProb, extended, running, seq2seq, with_decoder, write, written

__all__ = ["TOKEN_METHODS", "attribute_tokens", "check_tokenizer", "text_of"]

TOKEN_METHODS = ("integrated_gradients", "input_x_gradient", "saliency", "gradient")  # those with no noise
_IDS = "hookscope token ids"  # the stand-in's keyword for the ids: no model takes a name with spaces

Site = tuple[str, nn.Module]


@dataclass(frozen=True)
class _Plan:
    """What every attribution of one call shares."""

    model: nn.Module
    site: Site
    method: AttributionMethod
    baseline: int | torch.Tensor | None


@checked
def attribute_tokens(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    target: Any = None,
    generate: int = 0,
    continuation: torch.Tensor | int | None = None,
    method: str | AttributionMethod = "integrated_gradients",
    steps: int | None = None,
    rule: str | None = None,
    baseline: int | torch.Tensor | None = None,
    layers: Selector | None = None,
    tokenizer: Any = None,
    batch_size: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **unknown: Any,
) -> TokenAttributions:
    """Per-token scores for the token a language model writes next, or for every token of a greedy continuation.

    The attribution of :func:`hookscope.attribute` (``method``, ``steps``, ``rule``) is taken at the
    token embedding (``model.get_input_embeddings()``, or ``layers=``) and summed over its hidden
    dimension: one score per token. With integrated gradients the path runs from ``baseline`` to the
    embedding of the tokens, and each row's ``delta`` says how far the sum of its scores is from
    ``f(x) - f(baseline)``; the result equals captum's ``LayerIntegratedGradients`` at the embedding.

    With ``generate=N`` the model first writes ``N`` tokens greedily (its own ``generate()`` where it
    has one, as transformers models do, else a greedy loop over the last position's logits; a
    sequence stops after its end-of-sequence token, any id the config or the generation config
    names; sampling off, the generation config's other settings such as a repetition penalty kept),
    then each new token is explained over all the tokens before it: row ``k`` equals
    ``attribute_tokens`` on the prompt and the first ``k`` new tokens with ``target`` the ``k``-th.

    With ``continuation=`` (the output of ``model.generate(inputs, ...)``, greedy or sampled, or a number
    ``N`` of tokens for hookscope to write greedily first) each token of the continuation is explained
    by its log-probability, as captum's ``LLMGradientAttribution`` explains a target continuation: the
    prompt and the continuation go through the model teacher-forced, one row of the batch per token
    explained (the rows batched together), and row ``k`` holds the scores of the prompt and of the
    ``k`` tokens written before it; :meth:`TokenAttributions.matrix` gives prompt tokens x tokens written
    and :meth:`TokenAttributions.totals` each prompt token's score for the whole continuation (the
    matrix's rows summed, the change of the continuation's log-probability for integrated gradients).
    Left padding is read from ``kwargs["attention_mask"]``: pads score 0 and, with positions numbered
    as ``generate()`` numbers them, change nothing of the other tokens' scores.

    An encoder-decoder model (T5, BART) takes ``inputs`` as the encoder's tokens and is attributed
    at the encoder's embedding; the token explained is the decoder's next one after
    ``decoder_input_ids`` in ``kwargs`` (its start token by default), and with ``generate`` row ``k``
    scores the encoder's tokens for the ``k``-th token the decoder writes.

    The model is left as it was (no hook, flags, buffers, random state and ``.grad`` untouched).

    Args:
        model: a language model whose output (or its ``.logits``) is ``B x T x vocab``.
        inputs: ``B x T`` token ids (``T`` for one sequence); pad on the left, so that the last
            position is each sequence's own.
        target: ``None`` (each sequence's most likely next token), a token id, one per sequence, a
            :class:`hookscope.targets.Token` (another position), or a function of the output giving one
            score per sequence. Not with ``generate``.
        generate: how many tokens to write and explain one by one (0: explain the next token only).
        continuation: the prompt and its continuation (``B x (T + N)``, starting with ``inputs``, as
            ``generate()`` returns it), or how many tokens to write greedily; each written token's
            log-probability is explained. Not with ``target`` or ``generate``; a decoder-only model.
        method: ``"integrated_gradients"``, ``"input_x_gradient"``, ``"saliency"`` or ``"gradient"``,
            or its settings object (:class:`~hookscope.IntegratedGradients`, ...); a setting the method
            does not read is refused in one line, as :func:`hookscope.attribute` refuses it.
        steps: integrated gradients' number of points on the path (``None``: 50).
        rule: integrated gradients' integration rule, as :func:`hookscope.attribute` takes it
            (``None``: ``"riemann_trapezoid"``).
        baseline: where integrated gradients' path starts: ``None`` (zeros at the layer), a token id
            (a pad token at every position), token ids (``T`` or ``B x T``), or a float tensor, the
            layer's output itself (one sequence's, or ``B`` of them).
        layers: the layer to attribute at (default: the input embedding); its output must have one
            row per token, ``B x T x ...``.
        tokenizer: turns ids into text in the result: a tokenizer with ``decode`` (transformers), a
            list of strings indexed by id, or a function ``id -> str``.
        batch_size: rows per forward pass for integrated gradients' scaled copies (``None``: 64).
        kwargs: the model's keyword inputs, e.g. ``{"attention_mask": m}`` (extended by ones for
            the tokens written with ``generate``).
        **unknown: refused in one line naming the keyword it was near.

    Returns:
        A :class:`TokenAttributions`: ``rows`` of per-token scores, the tokens and their text.

    Raises:
        HookscopeError: a method, target, baseline, layer or token id that cannot work, in one line.

    Example:
        >>> import torch, hookscope
        >>> lm = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
        >>> res = hookscope.attribute_tokens(lm, torch.tensor([[1, 2, 3]]), layers="0", steps=8, target=4)
        >>> res.rows[0].scores.shape, res.rows[0].target
        (torch.Size([3]), 4)
    """
    _check_baseline(baseline)  # a token's baseline said in the words of tokens, before the method's own check
    chosen = chosen_method(method, {"steps": steps, "rule": rule, "baseline": baseline, "batch_size": batch_size},
                           unknown, fn="attribute_tokens", among=TOKEN_METHODS)
    ids = _check_ids(inputs)
    kw = model_kwargs(kwargs)
    n = _check_generate(generate, target)
    check_tokenizer(tokenizer)
    start = chosen.baseline if isinstance(chosen, IntegratedGradients) else None
    plan = _Plan(model, _site(model, layers), chosen, _check_baseline(start))
    kw = with_decoder(model, kw, ids)
    if continuation is not None:
        rows, forwards, tokens = _explain_written(plan, ids, kw, written(model, ids, kw, continuation, target, n))
    elif n == 0:
        rows, forwards = _explain(plan, ids, kw, target, list(range(ids.shape[0])), 0)
        tokens = ids.tolist()
    else:
        rows, forwards, tokens = _explain_continuation(plan, ids, kw, n)
    texts = _texts(tokenizer, tokens)
    for r in rows:
        r.text = None if texts is None or r.target is None else text_of(tokenizer, r.target)
    settings = ({"steps": chosen.steps, "rule": chosen.rule, "baseline": _baseline_text(start)}
                if isinstance(chosen, IntegratedGradients) else None)
    return TokenAttributions(rows, tokens, texts, ids.shape[1], chosen.name, plan.site[0], settings, forwards)


def _check_ids(input_ids: Any) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex() \
            or input_ids.dtype == torch.bool or input_ids.ndim not in (1, 2) or input_ids.numel() == 0:
        got = (f"{shape_text(tuple(input_ids.shape))} {input_ids.dtype}" if isinstance(input_ids, torch.Tensor)
               else type(input_ids).__name__)
        raise HookscopeError(f"inputs ({got}) are not token ids; pass a B x T (or T) tensor of ints, e.g. "
                             "tokenizer(text, return_tensors='pt')['input_ids']")
    if bool((input_ids < 0).any()):
        raise HookscopeError(f"inputs hold {int(input_ids.min())}, a negative id; token ids count from 0")
    return (input_ids if input_ids.ndim == 2 else input_ids.unsqueeze(0)).long()


def _check_generate(generate: Any, target: Any) -> int:
    if isinstance(generate, bool) or not isinstance(generate, int) or generate < 0:
        raise HookscopeError(f"generate={generate!r} must be an int >= 0, the number of tokens to write and explain")
    if generate and target is not None:
        raise HookscopeError("generate= explains the tokens the model writes, so it takes no target=; pass one of them")
    return generate


def _check_baseline(baseline: Any) -> int | torch.Tensor | None:
    if baseline is None or isinstance(baseline, torch.Tensor):
        return baseline
    if isinstance(baseline, int) and not isinstance(baseline, bool) and baseline >= 0:
        return baseline
    raise HookscopeError(f"baseline={baseline!r} is not a baseline; pass None (zeros at the layer), a token id "
                         "such as the pad token's, token ids, or the layer's output as a float tensor")


def _site(model: nn.Module, layers: Selector | None) -> Site:
    """The layer to attribute at: ``layers=``, else the input embedding."""
    if layers is None:
        layers = _embedding(model)
    chosen = exact_ops(select(model, layers), "attribute_tokens")
    check_hookable(chosen)
    if len(chosen) != 1:
        shown = ", ".join(repr(n) for n, _ in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        raise HookscopeError(f"layers={layers!r} selects {len(chosen)} layers ({shown}); token attribution "
                             "takes one: pass the token embedding's exact name")
    return chosen[0]


def _embedding(model: nn.Module) -> nn.Module:
    """``get_input_embeddings()`` (transformers), else the model's one ``nn.Embedding``."""
    inner = unwrap(model)[0]
    encoder = getattr(inner, "get_encoder", None)
    if seq2seq(model) and callable(encoder) and isinstance(encoder(), nn.Module):
        inner = encoder()  # the tokens given are the encoder's; the decoder's embedding reads the tokens written
    get = getattr(inner, "get_input_embeddings", None)
    try:
        found = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        found = None
    if isinstance(found, nn.Module):
        return found
    tables = [(n, m) for n, m in inner.named_modules() if isinstance(m, nn.Embedding)]
    if len(tables) == 1:
        return tables[0][1]
    names = ", ".join(repr(n) for n, _ in tables[:4]) if tables else "none"
    raise HookscopeError(f"cannot tell which layer embeds the tokens of {type(inner).__name__} (nn.Embedding: "
                         f"{names}); pass layers= its name")


def _probe(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    """The model's output on ``ids`` and the layer's output there (one pass, no gradient)."""
    name, module = plan.site
    with running(plan.model), torch.no_grad(), capture(plan.model, module) as rec:
        out = call_model(plan.model, (ids,), kw)
    calls = len(rec[name]) if name in rec else 0
    t = first_tensor(rec[name][0].output) if calls == 1 else None
    if not calls:
        raise HookscopeError(f"layer {name!r} did not run in the forward pass; " + _ran_instead(plan, ids, kw))
    if calls != 1:
        raise HookscopeError(f"layer {name!r} ran {calls} times in the forward pass; attribute at a layer that runs "
                             "once, such as the token embedding")
    if t is None or t.ndim < 2 or tuple(t.shape[:2]) != tuple(ids.shape) or not t.is_floating_point():
        got = shape_text(tuple(t.shape)) if t is not None else "no tensor"
        raise HookscopeError(f"layer {name!r} gives {got}, not one row per token ({shape_text(tuple(ids.shape))} x "
                             "...); attribute at the token embedding or a layer of B x T x hidden")
    return out, t.detach().clone()


def _ran_instead(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any]) -> str:
    """The remedy for a layer that never ran: the layers sharing its weights (a tied embedding) that run
    once with one row per token, found by one more pass."""
    others = sharing(plan.model, plan.site[1])
    if others:
        with running(plan.model), torch.no_grad(), capture(plan.model, *others) as rec:
            call_model(plan.model, (ids,), kw)
        fit = [n for n in others if n in rec and len(rec[n]) == 1
               and tuple(getattr(first_tensor(rec[n][0].output), "shape", ())[:2]) == tuple(ids.shape)]
        if fit:
            return (f"its weights are used by {', '.join(map(repr, others))}, and {fit[0]!r} runs once "
                    f"with one row per token: pass layers={fit[0]!r}")
    return "attribute at a layer that runs once with one row per token, named as hookscope.names(model) lists it"


def _start(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any], at: torch.Tensor) -> tuple[torch.Tensor | None, int]:
    """Integrated gradients' start at the layer (zeros, the layer's output for baseline ids, or as given),
    and the forward passes that took."""
    b = plan.baseline
    if not isinstance(plan.method, IntegratedGradients) or b is None:
        return None, 0
    if isinstance(b, torch.Tensor) and b.is_floating_point():
        return b.detach().to(device=at.device, dtype=at.dtype), 0
    base = torch.full_like(ids, b) if isinstance(b, int) else _check_ids(b).to(ids.device)
    if base.shape[0] == 1 and ids.shape[0] > 1 and base.shape[1] == ids.shape[1]:
        base = base.expand_as(ids)
    if tuple(base.shape) != tuple(ids.shape):
        raise HookscopeError(f"baseline ids of shape {shape_text(tuple(base.shape))} do not fit inputs of "
                             f"{shape_text(tuple(ids.shape))}; pass T ids, B x T, or one token id")
    return _probe(plan, base.contiguous(), kw)[1], 1


def _pinned(target: Any, out: Any, batch: int) -> Any:
    """The target as :func:`hookscope.attribute` takes it: a :class:`Token`, or the caller's function."""
    if target is None:
        logits = out if isinstance(out, torch.Tensor) else logits_of(out)
        if logits is None or logits.ndim != 3:
            got = shape_text(tuple(logits.shape)) if logits is not None else type(out).__name__
            raise HookscopeError(f"the model gives {got}, not B x T x vocab logits; pass target= a function of "
                                 "its output giving one score per sequence")
        return Token(logits[:, -1].argmax(-1).cpu())
    if isinstance(target, Token) or is_function(target):
        return target
    return Token(target)


def _explain(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any], target: Any, samples: list[int],
             step: int) -> tuple[list[TokenRow], int]:
    """One row per sequence of ``ids`` (the samples ``samples`` of the caller's batch)."""
    out, at = _probe(plan, ids, kw)
    token = _pinned(target, out, ids.shape[0])
    start, used = _start(plan, ids, kw, at)
    method = dataclasses.replace(plan.method, baseline=start) if isinstance(plan.method, IntegratedGradients) \
        else plan.method  # the start at the layer, where the attribution is taken
    res = attribute(_Through(plan.model, plan.site), at, method=method, target=token, kwargs={**kw, _IDS: ids})
    scores = res.maps.flatten(2).sum(-1) if res.maps.ndim > 2 else res.maps
    logits = out if isinstance(out, torch.Tensor) else logits_of(out)
    span = logits.shape[1] if logits is not None and logits.ndim == 3 else ids.shape[1]  # the decoder's, if any
    position = (token.position % span) if isinstance(token, Token) else span - 1
    chosen = token.token_id.expand(ids.shape[0]).tolist() if isinstance(token, Token) else [None] * ids.shape[0]
    rows = [TokenRow(s, step, position, chosen[i], None, float(res.scores[i]),
                     None if res.delta is None else float(res.delta[i]), scores[i].detach().cpu())
            for i, s in enumerate(samples)]
    return rows, res.forwards + 1 + used


def _explain_continuation(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any],
                          n: int) -> tuple[list[TokenRow], int, list[list[int]]]:
    """Write ``n`` tokens, then explain each over the tokens before it."""
    full, counts = write(plan.model, ids, n, kw)  # the sequences written on: the decoder's, if any
    decoder = kw.get(DECODER) if seq2seq(plan.model) else None
    rows: list[TokenRow] = []
    forwards, length = 0, ids.shape[1] if decoder is None else decoder.shape[1]
    for k in range(max(counts, default=0)):
        alive = [b for b in range(ids.shape[0]) if counts[b] > k]
        pick = torch.tensor(alive, device=ids.device)
        if decoder is None:
            given, step_kw = full[pick, : length + k], extended(kw, pick, ids.shape[0], k)
        else:  # the encoder reads the prompt as it is; the decoder reads what it wrote so far
            given, step_kw = ids[pick], {**extended(kw, pick, ids.shape[0], 0), DECODER: full[pick, : length + k]}
        found, used = _explain(plan, given, step_kw, Token(full[pick, length + k].cpu()), alive, k)
        rows += found
        forwards += used
    rows.sort(key=lambda r: (r.sample, r.step))
    head = [full[b, :length].tolist() if decoder is None else ids[b].tolist() for b in range(ids.shape[0])]
    return rows, forwards, [head[b] + full[b, length: length + counts[b]].tolist() for b in range(ids.shape[0])]


def _explain_written(plan: _Plan, ids: torch.Tensor, kw: dict[str, Any],
                     written: tuple[torch.Tensor, list[int]]) -> tuple[list[TokenRow], int, list[list[int]]]:
    """Each token written explained by its log-probability, all of them in one batch over the whole sequence."""
    (full, counts), (B, T) = written, ids.shape
    whole = extended(kw, torch.arange(B, device=ids.device), B, full.shape[1] - T)
    mask = whole.get("attention_mask")
    padded = isinstance(mask, torch.Tensor) and mask.ndim == 2 and bool((mask == 0).any())
    if padded and isinstance(mask, torch.Tensor) and "position_ids" not in whole and _takes(plan.model, "position_ids"):
        whole["position_ids"] = (mask.long().cumsum(1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
    pairs = [(b, k) for b in range(B) for k in range(counts[b])]
    pick = torch.tensor([b for b, _ in pairs], device=ids.device)
    given, given_kw = full[pick], extended(whole, pick, B, 0)
    target = LogProb(torch.stack([full[b, T + k].cpu() for b, k in pairs]), torch.tensor([T - 1 + k for _, k in pairs]))
    out, at = _probe(plan, given, given_kw)
    start, used = _prompt_start(plan, given, given_kw, at, (pick, T))
    method = dataclasses.replace(plan.method, baseline=start) if isinstance(plan.method, IntegratedGradients) \
        else plan.method
    res = attribute(_Through(plan.model, plan.site), at, method=method, target=target, kwargs={**given_kw, _IDS: given})
    scores = (res.maps.flatten(2).sum(-1) if res.maps.ndim > 2 else res.maps).detach()
    if padded:
        scores = torch.where(given_kw["attention_mask"].to(scores.device).bool(), scores, torch.zeros_like(scores))
    rows = [TokenRow(b, k, T - 1 + k, int(target.ids[i]), None, float(res.scores[i]),
                     None if res.delta is None else float(res.delta[i]), scores[i, : T + k].cpu())
            for i, (b, k) in enumerate(pairs)]
    return rows, res.forwards + 1 + used, [full[b, : T + counts[b]].tolist() for b in range(B)]


def _prompt_start(plan: _Plan, given: torch.Tensor, kw: dict[str, Any], at: torch.Tensor,
                  where: tuple[torch.Tensor, int]) -> tuple[torch.Tensor | None, int]:
    """Integrated gradients' start for a continuation: the prompt's columns at the baseline, the tokens written
    held as they are (as captum's ``LLMGradientAttribution`` holds them), and the forward passes that took."""
    (pick, T), b = where, plan.baseline
    if not isinstance(plan.method, IntegratedGradients):
        return None, 0
    start, used = at.clone(), 0
    if b is None:
        start[:, :T] = 0
    elif isinstance(b, torch.Tensor) and b.is_floating_point():
        b = b.detach().to(device=at.device, dtype=at.dtype)
        b = b.unsqueeze(0) if b.ndim == at.ndim - 1 else b
        if tuple(b.shape[1:]) != (T, *at.shape[2:]) or b.shape[0] not in (1, int(pick.max()) + 1):
            raise HookscopeError(f"a float baseline with continuation= is the prompt's layer output, "
                                 f"{shape_text((T, *at.shape[2:]))} or B x that; got {shape_text(tuple(b.shape))}")
        start[:, :T] = b if b.shape[0] == 1 else b[pick.to(b.device)]
    else:
        base = _check_ids(b).to(given.device) if isinstance(b, torch.Tensor) else torch.full((1, T), b)
        if base.shape[1] != T or base.shape[0] not in (1, int(pick.max()) + 1):
            raise HookscopeError(f"baseline ids of shape {shape_text(tuple(base.shape))} do not fit a prompt of {T} "
                                 "tokens; pass T ids, B x T, or one token id")
        ids = given.clone()
        ids[:, :T] = base.to(given.device) if base.shape[0] == 1 else base.to(given.device)[pick]
        start, used = _probe(plan, ids, kw)[1], 1
    return start, used


def _takes(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(unwrap(model)[0].forward).parameters
    except (TypeError, ValueError):
        return False


class _Through(nn.Module):
    """The model run on its token ids with the layer's output replaced by this module's input, so that
    :func:`hookscope.attribute` differentiates at the layer with float inputs and a float baseline."""

    def __init__(self, model: nn.Module, site: Site) -> None:
        super().__init__()
        self.model = model
        self.site = site  # a tuple: the layer is not registered a second time

    def forward(self, given: torch.Tensor, **kw: Any) -> Any:
        ids = kw.pop(_IDS)
        name, module = self.site

        def put(out: Any) -> Any:
            t = first_tensor(out)
            if t is None or t.shape != given.shape:
                raise HookscopeError(f"layer {name!r} changed shape between passes; attribute at a layer whose "
                                     "output depends only on the token ids")
            new = given.to(t.dtype)
            return new if t is out else tree_map(lambda u: new if u is t else u, out)

        with edit(self.model, module, output=put) as changed:
            out = self.model(ids, **kw)
        if sum(changed.counts.values()) != 1:
            raise HookscopeError(f"layer {name!r} ran {sum(changed.counts.values())} times in one forward pass; "
                                 "attribute at a layer that runs once")
        return out


def check_tokenizer(tokenizer: Any) -> None:
    if tokenizer is None or callable(tokenizer) or callable(getattr(tokenizer, "decode", None)) or (
            isinstance(tokenizer, Sequence) and not isinstance(tokenizer, (str, bytes))):
        return
    raise HookscopeError(f"tokenizer= is a {type(tokenizer).__name__}; pass a tokenizer with decode(), a list of "
                         "strings indexed by id, or a function id -> str")


def text_of(tokenizer: Any, token: int) -> str:
    if callable(getattr(tokenizer, "decode", None)):
        return str(tokenizer.decode([token])) or f"#{token}"  # an id the tokenizer has no text for
    if isinstance(tokenizer, Sequence) and not isinstance(tokenizer, (str, bytes)):
        if not 0 <= token < len(tokenizer):
            raise HookscopeError(f"tokenizer= holds {len(tokenizer)} strings but the tokens hold id {token}; pass "
                                 "one string per id of the vocabulary")
        return str(tokenizer[token])
    return str(tokenizer(token))


def _texts(tokenizer: Any, tokens: list[list[int]]) -> list[list[str]] | None:
    if tokenizer is None:
        return None
    return [[text_of(tokenizer, t) for t in row] for row in tokens]


def _baseline_text(baseline: Any) -> str:
    if baseline is None:
        return "zeros"
    if isinstance(baseline, int):
        return f"token {baseline}"
    return "ids" if not baseline.is_floating_point() else "given"
