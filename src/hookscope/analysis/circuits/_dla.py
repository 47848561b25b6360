"""Direct logit attribution: the last residual stream split into what wrote it (the embeddings, each
attention head through its slice of the output projection, the output projection's bias, each MLP's
output), each term read through the final norm with its scale frozen at this run and through the
unembedding's direction for a logit or a logit difference, so that the terms sum to it exactly.

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
from ...errors import HookscopeError, SelectionError, checked
from ._model import Decoder, decoder, frozen, out_weight, read, token_ids, unembedding

__all__ = ["DlaRow", "LogitAttribution", "logit_attribution"]


@dataclass(frozen=True)
class DlaRow:
    """One term of the stream: its ``name`` (``embed``, ``pos_embed``, ``blocks.1.head.0``,
    ``blocks.1.attn.bias``, ``blocks.1.mlp_out``, ``final_norm.bias``, ``unembed.bias``), the ``layer``
    it is written in (-1: before the blocks and after them), the ``head`` (-1: not a head) and its
    ``value``, its contribution to the logit (difference)."""

    name: str
    layer: int
    head: int
    value: float


class LogitAttribution(Result):
    """The terms of a logit (difference) at one position: ``rows`` (:class:`DlaRow`), ``total`` (their
    sum) and ``logit``, the model's own value (the unembedding's output; before Gemma2's final soft cap),
    which ``total`` equals; ``centring`` is what the final LayerNorm's centring takes out of the terms'
    raw sum (the mean over the width of each term, read through the norm: 0 for an RMSNorm), so that
    ``total == raw sum - centring``. ``attribution[name]`` is that term's value."""

    def __init__(self, model: str, answer: int, wrong: int | None, position: int, rows: list[DlaRow], logit: float,
                 centring: float, norm: str, capped: bool) -> None:
        self.model, self.answer, self.wrong, self.position, self.rows = model, answer, wrong, position, rows
        self.logit, self.centring, self.norm, self.capped = logit, centring, norm, capped
        self.total = float(sum(r.value for r in rows))
        self._by_name = {r.name: r for r in rows}

    def __getitem__(self, name: str) -> float:
        if name not in self._by_name:
            raise missing(name, "term", self._by_name)
        return self._by_name[name].value

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def heads(self) -> torch.Tensor:
        """The heads' terms as a ``[layer, head]`` tensor."""
        heads = [r for r in self.rows if r.head >= 0]
        if not heads:
            return torch.zeros(0, 0)
        out = torch.zeros(max(r.layer for r in heads) + 1, max(r.head for r in heads) + 1)
        for r in heads:
            out[r.layer, r.head] = r.value
        return out

    def table(self) -> str:
        """A title (what is explained, its value, the sum of the terms), then one row per term."""
        what = f"logit[{self.answer}]" if self.wrong is None else f"logit[{self.answer}] - logit[{self.wrong}]"
        title = (f"direct logit attribution of {what} at position {self.position} of {self.model}: {self.logit:.4f}"
                 f"{' (before the final soft cap)' if self.capped else ''}; terms sum to {self.total:.4f}; "
                 f"{self.norm} centring took {self.centring:.4f} out of their raw sum")
        body = [[r.name, f"{r.value:.4f}"] for r in self.rows]
        return "\n".join([title, *table(["term", "value"], body, left={0})])

    def to_dict(self) -> dict[str, Any]:
        """``{model, answer, wrong, position, logit, total, centring, norm, capped, rows}``."""
        return {"model": self.model, "answer": self.answer, "wrong": self.wrong, "position": self.position,
                "logit": self.logit, "total": self.total, "centring": self.centring, "norm": self.norm,
                "capped": self.capped, "rows": self.rows}


def _linear_heads(d: Decoder, i: int) -> bool:
    """Whether block ``i``'s attention output is its heads through the output projection (no norm after it,
    as Gemma2's and OLMo2's post-attention norms are)."""
    return d[f"blocks.{i}.attn_out"].module == d[f"blocks.{i}.attn.pattern"].module


def _terms(d: Decoder, got: Mapping[str, torch.Tensor], pos: int) -> list[tuple[str, int, int, torch.Tensor]]:
    """(name, layer, head, the term's vector in the stream at ``pos``), fp64; they sum to the last stream."""
    def at(t: torch.Tensor) -> torch.Tensor:
        return t[0, pos].double()

    embed, first = at(got["embed"]), at(got["blocks.0.resid_pre"])
    pos_embed = at(got["pos_embed"]) if "pos_embed" in got else torch.zeros_like(embed)
    if torch.allclose(embed + pos_embed, first, atol=1e-5 * max(1.0, float(first.abs().max()))):
        terms = [("embed", -1, -1, embed)] + ([("pos_embed", -1, -1, pos_embed)] if "pos_embed" in got else [])
    else:  # Gemma scales its embedding by sqrt(width) between the two: the stream as the first block reads it
        terms = [("embed", -1, -1, first)]
    for i in range(d.blocks):
        b = f"blocks.{i}"
        if _linear_heads(d, i):
            z = at(got[f"{b}.attn.z"])  # [head, d_head]
            proj = d.modules[d[f"{b}.attn.z"].module]
            w = out_weight(proj, z.shape[0], z.shape[1])
            terms += [(f"{b}.head.{h}", i, h, z[h] @ w[h]) for h in range(z.shape[0])]
            bias = getattr(proj, "bias", None)
            if isinstance(bias, torch.Tensor):
                terms.append((f"{b}.attn.bias", i, -1, bias.detach().double()))
        else:
            terms.append((f"{b}.attn_out", i, -1, at(got[f"{b}.attn_out"])))
        terms.append((f"{b}.mlp_out", i, -1, at(got[f"{b}.mlp_out"])))
    return terms


@checked
def logit_attribution(model: nn.Module, inputs: torch.Tensor, *, answer: int, wrong: int | None = None,
                      position: int = -1, kwargs: Mapping[str, Any] | None = None) -> LogitAttribution:
    """Split a logit (or the difference ``logit[answer] - logit[wrong]``) at ``position`` into what
    each component wrote into the last residual stream: the token (and position) embedding, each head
    (its ``z`` through its rows of the output projection), the output projection's bias, each MLP's
    output (its bias included), and after the stream the final norm's and the unembedding's biases.
    Each term goes through the final norm with the scale it had on this run, frozen, so the terms sum
    to the logit exactly. A LayerNorm also centres: each term is centred (its mean over the width
    taken out, as the norm takes the stream's), and ``centring`` says how much that took from their raw
    sum; an RMSNorm takes nothing. Where a norm follows the attention (Gemma2, OLMo2) its output is one
    term, ``blocks.i.attn_out``; for Gemma2 the logit is the one before the final soft cap.

    Args:
        model: a decoder of a family :func:`hookscope.components` knows, with its language-model head.
        inputs: one sequence of token ids, ``[pos]`` or ``[1, pos]``.
        answer: the token whose logit is explained.
        wrong: explain ``logit[answer] - logit[wrong]`` instead.
        position: the position explained (default: the last).
        kwargs: the model's keyword inputs.

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> dla = hookscope.logit_attribution(lm, torch.tensor([1, 2, 3]), answer=4, wrong=5)
        >>> abs(dla.total - dla.logit) < 1e-5, [r.name for r in dla.rows][:4]
        (True, ['embed', 'pos_embed', 'blocks.0.head.0', 'blocks.0.head.1'])
    """
    d = decoder(model, "logit_attribution")
    ids = token_ids(inputs)
    vocab = int(getattr(d.module("unembed"), "out_features", 0) or unembedding(d)[0].shape[0])
    for what, t in (("answer", answer), ("wrong", wrong)):
        if t is not None and not (isinstance(t, int) and 0 <= t < vocab):
            raise HookscopeError(f"{what}={t!r} is not a token id of the vocabulary of {vocab}")
    pos = range(ids.shape[1])[position] if -ids.shape[1] <= position < ids.shape[1] else None
    if pos is None:
        raise HookscopeError(f"position={position} is outside the {ids.shape[1]} positions of the inputs")
    last = f"blocks.{d.blocks - 1}.resid_post"
    names = ["embed", *(["pos_embed"] if d.has("pos_embed") else []), "blocks.0.resid_pre", last, "unembed"]
    for i in range(d.blocks):
        names += [f"blocks.{i}.{n}" for n in ("attn.z", "attn_out", "mlp_out")]
    got, _ = read(d, ids, names, kwargs=kwargs)
    terms = _terms(d, got, pos)
    stream = got[last][0, pos].double()
    norm = frozen(d.module("final_norm"), got[last][0, pos])
    weight, ubias = unembedding(d)
    u = weight[answer] - (weight[wrong] if wrong is not None else 0)
    ub = float(ubias[answer] - (ubias[wrong] if wrong is not None else 0))
    rows = [DlaRow(n, layer, h, float(norm.linear(t) @ u)) for n, layer, h, t in terms]
    written = torch.stack([t for *_, t in terms]).sum(0)
    if not torch.allclose(written, stream, atol=1e-5 * max(1.0, float(stream.abs().max()))):
        raise SelectionError(f"the terms of {type(model).__name__}'s stream do not sum to its last resid_post (largest "
                             f"error {float((written - stream).abs().max()):.2e}): its blocks add something else")
    rows += [DlaRow("final_norm.bias", d.blocks, -1, float(norm.bias @ u)), DlaRow("unembed.bias", d.blocks, -1, ub)]
    raw = sum(float((t / norm.scale * norm.gain) @ u) for *_, t in terms)
    centring = raw - sum(r.value for r in rows[:-2])
    logits = got["unembed"][0, pos].double()
    logit = float(logits[answer] - (logits[wrong] if wrong is not None else 0))
    return LogitAttribution(type(model).__name__, answer, wrong, pos, rows, logit, centring,
                            "LayerNorm" if norm.centre else "RMSNorm", d.cap is not None)
