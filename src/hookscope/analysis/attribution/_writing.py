"""The tokens :func:`hookscope.attribute_tokens` explains with ``generate=``: the model writes them (its
own ``generate()``, sampling off, or a greedy loop over the last position's logits), each sequence
ending after any end-of-sequence id its config or generation config names; for an encoder-decoder
model the decoder writes, from its start token. With ``continuation=``: ``generate()``'s output checked
against the prompt (or tokens written greedily), and each token's target, its log-probability at the
position before it, teacher-forced."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
from torch import nn

from ...core.state import restored
from ...core.text import shape_text
from ...errors import HookscopeError
from ...selection import unwrap
from .._targets import call_model, logits_of

__all__ = ["DECODER", "LogProb", "ends", "extended", "running", "seq2seq", "with_decoder", "write", "written"]

DECODER = "decoder_input_ids"  # an encoder-decoder model's keyword for the decoder's tokens


def running(model: nn.Module) -> AbstractContextManager[Any]:
    """Eval mode inside, every flag and buffer put back after (dropout would make the rows random)."""
    return restored(model, train=False, buffers=True)  # buffers too: a forward may write one in eval mode


def extended(kw: dict[str, Any], pick: torch.Tensor, batch: int, k: int) -> dict[str, Any]:
    """The keyword inputs of the samples ``pick`` with ``k`` tokens written: the attention mask grown by ones."""
    def grow(name: str, v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or v.ndim == 0 or v.shape[0] != batch:
            return v
        v = v[pick.to(v.device)]
        return torch.cat([v, v.new_ones(v.shape[0], k)], dim=1) if name == "attention_mask" and k else v

    return {name: grow(name, v) for name, v in kw.items()}


def write(model: nn.Module, ids: torch.Tensor, n: int, kw: dict[str, Any]) -> tuple[torch.Tensor, list[int]]:
    """The sequences written on (``B x (T + n)``: the prompt and its greedy continuation; an encoder-decoder
    model's decoder tokens), and how many tokens each sample wrote."""
    _check_growable(model, kw, ids)
    inner = unwrap(model)[0]
    can = getattr(inner, "can_generate", None)
    with running(model), torch.no_grad():
        if callable(getattr(inner, "generate", None)) and callable(can) and can():
            full = _hf_generate(inner, ids, n, kw)
        elif seq2seq(model):
            raise HookscopeError(f"generate= on the encoder-decoder {type(inner).__name__} needs its generate(), "
                                 "which it lacks; pass generate=0 and decoder_input_ids in kwargs")
        else:
            full = _greedy(model, ids, n, kw)
    stops = ends(inner)
    counts = []
    written = kw[DECODER].shape[1] if seq2seq(model) else ids.shape[1]  # where the tokens written begin
    for row in full[:, written:].tolist():
        stop = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        counts.append(stop)
    return full, counts


def _ids_of(value: Any) -> set[int]:
    """An end-of-sequence setting as a set of ids: ``None``, an id or a list of them."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    return {int(v) for v in value if isinstance(v, int)} if isinstance(value, (list, tuple, set)) else set()


def ends(inner: nn.Module) -> set[int]:
    """Every end-of-sequence id: the config's and the generation config's (which may name more, as a list)."""
    return set().union(*(_ids_of(getattr(getattr(inner, c, None), "eos_token_id", None))
                         for c in ("config", "generation_config")))


def seq2seq(model: nn.Module) -> bool:
    """An encoder-decoder model (T5, BART): its inputs are the encoder's, the decoder writes."""
    return getattr(getattr(unwrap(model)[0], "config", None), "is_encoder_decoder", False) is True


def with_decoder(model: nn.Module, kw: dict[str, Any], ids: torch.Tensor) -> dict[str, Any]:
    """An encoder-decoder model's keyword inputs with the decoder's tokens: as given, else its start token."""
    if not seq2seq(model) or kw.get(DECODER) is not None:
        return kw
    inner = unwrap(model)[0]
    starts = [getattr(getattr(inner, c, None), "decoder_start_token_id", None) for c in ("generation_config", "config")]
    start = next((s for s in starts if isinstance(s, int)), None)
    if start is None:
        raise HookscopeError(f"{type(inner).__name__} is an encoder-decoder model without a decoder_start_token_id; "
                             f"pass the decoder's first tokens as kwargs={{'{DECODER}': ids}}")
    return {**kw, DECODER: torch.full((ids.shape[0], 1), start, dtype=torch.long, device=ids.device)}


def _check_growable(model: nn.Module, kw: dict[str, Any], ids: torch.Tensor) -> None:
    if seq2seq(model):  # the encoder's inputs stay as they are; only the decoder's grow
        grown = next((n for n in kw if n.startswith("decoder_") and n != DECODER), None)
        if grown is not None:
            raise HookscopeError(f"kwargs[{grown!r}] is the decoder's, which would have to grow with the tokens "
                                 "generate= writes; leave it out or pass generate=0")
        return
    for name, v in kw.items():
        if name != "attention_mask" and isinstance(v, torch.Tensor) and tuple(v.shape[:2]) == tuple(ids.shape):
            raise HookscopeError(f"kwargs[{name!r}] holds one value per token, which does not grow with the tokens "
                                 "generate= writes; only attention_mask does: leave it out or pass generate=0")


def _hf_generate(model: nn.Module, ids: torch.Tensor, n: int, kw: dict[str, Any]) -> torch.Tensor:
    """transformers' own greedy ``generate()``, its pad id set so that it says nothing."""
    pads = [getattr(getattr(model, c, None), "pad_token_id", None) for c in ("generation_config", "config")]
    extra = {} if any(p is not None for p in pads) else {"pad_token_id": min(ends(model), default=0)}
    greedy = {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "penalty_alpha": 0.0}  # one each
    own = getattr(model, "generation_config", None)
    if own is not None and callable(getattr(own, "to_dict", None)):  # generate() keeps the model's own values
        own = copy.deepcopy(own)                                       # over keywords that equal the defaults
        for k, v in greedy.items():
            setattr(own, k, v)
        greedy = {"generation_config": own}
    with warnings.catch_warnings():  # transformers' notes on the generation settings given here
        warnings.simplefilter("ignore")
        gen = cast(Callable[..., torch.Tensor], getattr(model, "generate"))
        try:
            out = gen(ids, max_new_tokens=n, **greedy, **extra, **kw)
        except (ValueError, TypeError, RuntimeError) as e:
            said = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise HookscopeError(f"{type(model).__name__}.generate() failed writing {n} tokens: {said}; fix its "
                                 "generation_config or pass generate=0") from e
    return out if isinstance(out, torch.Tensor) else cast(torch.Tensor, getattr(out, "sequences"))


def _greedy(model: nn.Module, ids: torch.Tensor, n: int, kw: dict[str, Any]) -> torch.Tensor:
    """``n`` steps of: the model on all tokens so far, the most likely next token appended."""
    full = ids
    everyone = torch.arange(ids.shape[0], device=ids.device)
    for k in range(n):
        out = call_model(model, (full,), extended(kw, everyone, ids.shape[0], k))
        logits = out if isinstance(out, torch.Tensor) else logits_of(out)
        if logits is None or logits.ndim != 3:
            raise HookscopeError(f"generate= needs B x T x vocab logits from the model, got {type(out).__name__}; "
                                 "pass a language model")
        full = torch.cat([full, logits[:, -1].argmax(-1, keepdim=True).to(full.device)], dim=1)
    return full


def written(model: nn.Module, ids: torch.Tensor, kw: dict[str, Any], continuation: Any, target: Any,
             generate: int) -> tuple[torch.Tensor, list[int]]:
    """The prompt with its continuation (``B x (T + N)``), and how many tokens of each row to explain (up to
    its first end token)."""
    if target is not None or generate:
        raise HookscopeError("continuation= explains the tokens written after the prompt, so it takes no target= "
                             "and no generate=; pass one of them")
    if seq2seq(model):
        raise HookscopeError(f"continuation= reads a decoder-only model's prompt and continuation as one sequence; "
                             f"{type(unwrap(model)[0]).__name__} is an encoder-decoder: pass generate=N")
    if isinstance(continuation, int) and not isinstance(continuation, bool):
        if continuation < 1:
            raise HookscopeError(f"continuation={continuation} must be the output of generate() or a number of "
                                 "tokens to write, 1 or more")
        return write(model, ids, continuation, kw)
    full = continuation.unsqueeze(0) if isinstance(continuation, torch.Tensor) and continuation.ndim == 1 \
        else continuation
    if not isinstance(full, torch.Tensor) or full.ndim != 2 or full.is_floating_point() or full.shape[0] != ids.shape[0]:
        got = shape_text(tuple(full.shape)) if isinstance(full, torch.Tensor) else type(full).__name__
        raise HookscopeError(f"continuation= is {got}; pass the token ids generate() returns for the {ids.shape[0]} "
                             "prompt(s), B x (T + N), or a number of tokens to write")
    T = ids.shape[1]
    if full.shape[1] <= T or not torch.equal(full[:, :T].to(ids.device).long(), ids):
        why = "holds no token after the prompt" if full.shape[1] <= T else "does not start with the prompt"
        raise HookscopeError(f"continuation= {why}; pass the output of model.generate(inputs, ...), which begins "
                             "with inputs and goes on with the tokens written")
    stops = ends(unwrap(model)[0])
    counts = [next((i + 1 for i, t in enumerate(row) if t in stops), len(row)) for row in full[:, T:].tolist()]
    return full.to(ids.device).long(), counts


class LogProb:
    """The log-probability of ``ids[b]`` at ``positions[b]`` of row ``b``: one token written per row, teacher-forced."""

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor) -> None:
        self.ids, self.positions = ids, positions

    def __call__(self, out: Any) -> torch.Tensor:
        logits = out if isinstance(out, torch.Tensor) else logits_of(out)
        if logits is None or logits.ndim != 3:
            raise HookscopeError("continuation= needs B x T x vocab logits from the model; pass a language model")
        rows = torch.arange(logits.shape[0], device=logits.device)
        picked = logits[rows, self.positions.to(logits.device)]
        return torch.log_softmax(picked, -1).gather(1, self.ids.to(logits.device)[:, None])[:, 0]

    def take(self, rows: torch.Tensor) -> LogProb:
        return LogProb(self.ids[rows.cpu()], self.positions[rows.cpu()])
