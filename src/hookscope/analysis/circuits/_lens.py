"""The logit lens: each layer's residual stream read as if it were the last, through the model's own
final norm (its scale recomputed for that stream: reusing the last stream's scale, as a cache of the
final norm's scale would, gives another distribution) and unembedding, position by position.

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...core.result import Result, missing
from ...core.text import table
from ...errors import HookscopeError, checked
from ._model import decoder, read, token_ids
from ._tuned import TunedLens, lens_streams

__all__ = ["LensRow", "LogitLens", "logit_lens"]


@dataclass(frozen=True)
class LensRow:
    """One stream at one position: the ``top`` tokens with their probabilities ``top_probs``, the
    chosen ``token``'s ``rank`` (0: the most likely) and ``prob``, and ``kl``, the KL divergence from
    the model's final distribution at that position to this stream's (nats)."""

    stream: str
    position: int
    top: tuple[int, ...]
    top_probs: tuple[float, ...]
    token: int
    rank: int
    prob: float
    kl: float


class LogitLens(Result):
    """The logit lens of one sequence: ``streams`` (``blocks.0.resid_pre`` then each block's
    ``resid_post``), ``logits`` ``[stream, pos, vocab]`` (the last stream's are the model's logits),
    ``probs`` of the chosen tokens, ``ranks`` and ``kl`` as ``[stream, pos]`` tensors, and ``rows``, one
    :class:`LensRow` per stream and position; ``kind`` is ``"logit lens"``, or ``"tuned lens"`` when read
    through a :class:`TunedLens`. ``lens[stream]`` is that stream's rows."""

    def __init__(self, model: str, streams: list[str], logits: torch.Tensor, final: torch.Tensor,
                 tokens: torch.Tensor, top: int, kind: str = "logit lens") -> None:
        self.model, self.streams, self.logits, self.tokens, self.kind = model, streams, logits, tokens, kind
        logp = torch.log_softmax(logits.double(), -1)
        final_logp = torch.log_softmax(final.double(), -1)
        self.kl = (final_logp.exp() * (final_logp - logp)).sum(-1).float()
        chosen = logits.gather(-1, tokens.expand(len(streams), -1)[..., None])
        self.ranks = (logits > chosen).sum(-1)
        self.probs = logp.exp().gather(-1, tokens.expand(len(streams), -1)[..., None])[..., 0].float()
        tp, ti = logp.exp().float().topk(min(top, logits.shape[-1]), dim=-1)
        self.rows = [LensRow(s, p, tuple(ti[i, p].tolist()), tuple(round(v, 6) for v in tp[i, p].tolist()),
                             int(tokens[0, p]), int(self.ranks[i, p]), float(self.probs[i, p]), float(self.kl[i, p]))
                     for i, s in enumerate(streams) for p in range(logits.shape[1])]

    def __getitem__(self, stream: str) -> list[LensRow]:
        if stream not in self.streams:
            raise missing(stream, "stream", self.streams)
        return [r for r in self.rows if r.stream == stream]

    def __contains__(self, stream: object) -> bool:
        return stream in self.streams

    def table(self, position: int = -1) -> str:
        """One row per stream at ``position`` (default: the last): its top token, the chosen token's rank
        and probability, and the KL divergence to the final distribution."""
        pos = range(self.logits.shape[1])[position]
        body = [[r.stream, str(r.top[0]), f"{r.top_probs[0]:.3f}", str(r.token), str(r.rank), f"{r.prob:.3f}",
                 f"{r.kl:.3f}"] for r in self.rows if r.position == pos]
        title = f"{self.kind} of {self.model} at position {pos}"
        return "\n".join([title, *table(["stream", "top", "p(top)", "token", "rank", "p(token)", "KL"], body,
                                        left={0})])

    def to_dict(self) -> dict[str, Any]:
        """``{model, kind, streams, rows}``: ``kind`` is ``"logit lens"`` or ``"tuned lens"``."""
        return {"model": self.model, "kind": self.kind, "streams": self.streams, "rows": self.rows}


@checked
def logit_lens(model: nn.Module, inputs: torch.Tensor, *, token: int | torch.Tensor | None = None, top: int = 5,
               tuned: TunedLens | None = None, kwargs: Mapping[str, Any] | None = None) -> LogitLens:
    """Read every layer's residual stream as the model's last: through its final norm, the norm's
    scale recomputed for each stream, and its unembedding (and Gemma2's final soft cap), at every
    position. The embeddings (``blocks.0.resid_pre``, Gemma's scaled embedding included) come first;
    the last block's ``resid_post`` gives the model's own logits.

    Args:
        model: a decoder of a family :func:`hookscope.components` knows, with its language-model head.
        inputs: one sequence of token ids, ``[pos]`` or ``[1, pos]``.
        token: the token whose rank and probability are followed: one id, or one per position
            (default: the model's final prediction at each position).
        top: how many of the most likely tokens each row keeps.
        tuned: a :class:`TunedLens` tuned for this model (:func:`hookscope.tune_lens`): each stream but
            the last read through its translator first (the tuned lens).
        kwargs: the model's keyword inputs.

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> lens = hookscope.logit_lens(lm, torch.tensor([1, 2, 3]))
        >>> lens.streams
        ['blocks.0.resid_pre', 'blocks.0.resid_post', 'blocks.1.resid_post']
        >>> lens["blocks.1.resid_post"][-1].rank, round(lens["blocks.1.resid_post"][-1].kl, 6)
        (0, 0.0)
    """
    if top < 1:
        raise HookscopeError(f"top={top} must be 1 or more")
    if tuned is not None and not isinstance(tuned, TunedLens):
        raise HookscopeError(f"tuned= is a {type(tuned).__name__}; give a TunedLens (hookscope.tune_lens or "
                             "hookscope.load_lens)")
    d = decoder(model, "logit_lens")
    if tuned is not None:
        tuned.check(d)
    ids = token_ids(inputs)
    streams = lens_streams(d)
    got, final = read(d, ids, streams, kwargs=kwargs)
    with torch.no_grad():
        read_as = tuned.translate if tuned is not None else (lambda _, h: h)
        logits = torch.cat([d.unembed(read_as(s, got[s])) for s in streams]).float()
    tokens = _tokens(token, final, ids.shape[1])
    return LogitLens(type(model).__name__, streams, logits, final[0].float(), tokens.to(logits.device), top,
                     "tuned lens" if tuned is not None else "logit lens")


def _tokens(token: int | torch.Tensor | None, final: torch.Tensor, length: int) -> torch.Tensor:
    """The followed token at each position, as ``[1, pos]``."""
    vocab = final.shape[-1]
    if token is None:
        return final[0].argmax(-1).reshape(1, -1)
    t = torch.as_tensor(token).reshape(1, -1).long().cpu()
    if t.shape[1] == 1:
        t = t.expand(1, length)
    if t.shape[1] != length:
        raise HookscopeError(f"token= gives {t.shape[1]} ids for {length} positions; give one id, or one per position")
    if int(t.min()) < 0 or int(t.max()) >= vocab:
        raise HookscopeError(f"token= {t.tolist()[0]} has an id outside the vocabulary of {vocab}")
    return t.to(final.device)
