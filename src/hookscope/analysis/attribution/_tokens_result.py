"""What :func:`hookscope.attribute_tokens` returns: :class:`TokenAttributions`, one row of per-token
scores for each token explained (the next token, or each token of a continuation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.result import Result
from ...core.text import num, table
from ...errors import HookscopeError

__all__ = ["TokenAttributions", "TokenRow"]


@dataclass
class TokenRow:
    """The scores of every token before one explained token.

    Attributes:
        sample: which sequence of the batch.
        step: 0 for the token after the prompt, ``k`` for the ``k``-th token of a continuation.
        position: where the logits explained are read (the last token of the prefix for the next token).
        target: the token id explained, ``None`` for a target function.
        text: that token as text (with a tokenizer), else ``None``.
        logit: the target's score on the tokens, ``f(x)``.
        delta: integrated gradients' ``f(x) - f(baseline) - scores.sum()``, ``None`` for the other methods.
        scores: one score per token of the prefix, the attribution summed over the hidden dimension.
    """

    sample: int
    step: int
    position: int
    target: int | None
    text: str | None
    logit: float
    delta: float | None
    scores: torch.Tensor


def _shown(token: int | None, text: str | None) -> str:
    if token is None:
        return "target"
    return repr(text) if text is not None else f"#{token}"


@dataclass
class TokenAttributions(Result):
    """What :func:`hookscope.attribute_tokens` returns: per-token scores for each token explained.

    Speaks hookscope's result protocol: ``rows`` (one :class:`TokenRow` per token explained),
    ``table()`` (also ``str(res)``: one line per token explained, its strongest tokens first),
    ``to_dict()`` and ``to_json()`` (the scores as lists).

    Attributes:
        rows: one :class:`TokenRow` per token explained, sample by sample, step by step.
        tokens: each sample's token ids, the prompt then the continuation.
        texts: the same tokens as text (with a tokenizer), else ``None``.
        prompt: how many tokens of each sample were given (the rest were generated).
        method: the attribution method.
        layer: the layer attributed at (the token embedding unless told otherwise).
        settings: the method's settings (``steps``, ``rule``, ``baseline``), where it has some.
        forwards: how many times the model was called (generation not counted).
    """

    rows: list[TokenRow]
    tokens: list[list[int]]
    texts: list[list[str]] | None
    prompt: int
    method: str
    layer: str
    settings: dict[str, Any] | None = None
    forwards: int = 0

    @property
    def scores(self) -> torch.Tensor:
        """Every row's scores as one ``rows x tokens`` tensor, NaN where a token comes after the one explained.

        Example:
            >>> import torch
            >>> row = TokenRow(0, 0, 1, 3, None, 1.0, None, torch.tensor([0.5, 0.5]))
            >>> TokenAttributions([row], [[1, 2]], None, 2, "gradient", "embed").scores
            tensor([[0.5000, 0.5000]])
        """
        width = max((len(t) for t in self.tokens), default=0)
        out = torch.full((len(self.rows), width), float("nan"))
        for i, r in enumerate(self.rows):
            out[i, : len(r.scores)] = r.scores.float()
        return out

    def matrix(self, sample: int = 0) -> torch.Tensor:
        """``prompt tokens x tokens written`` for one sample: column ``k`` holds the prompt's scores for the
        ``k``-th token written (with ``continuation=``, for its log-probability); pads hold 0.

        Example:
            >>> import torch
            >>> rows = [TokenRow(0, k, 1 + k, 3, None, -1.0, None, torch.tensor([0.5, 0.25, 1.0][: 2 + k])) for k in (0, 1)]
            >>> TokenAttributions(rows, [[1, 2, 3, 3]], None, 2, "gradient", "embed").matrix()
            tensor([[0.5000, 0.5000],
                    [0.2500, 0.2500]])
        """
        rows = [r for r in self.rows if r.sample == sample]
        if not rows:
            held = sorted({r.sample for r in self.rows})
            raise HookscopeError(f"no token of sample {sample} was explained; the rows hold samples {held}")
        return torch.stack([r.scores[: self.prompt].float() for r in rows], 1)

    def totals(self, sample: int = 0) -> torch.Tensor:
        """Each prompt token's score for the whole continuation of one sample: :meth:`matrix` summed over the
        tokens written (with ``continuation=``, for the continuation's log-probability).

        Example:
            >>> import torch
            >>> rows = [TokenRow(0, k, 1 + k, 3, None, -1.0, None, torch.tensor([0.5, 0.25, 1.0][: 2 + k])) for k in (0, 1)]
            >>> TokenAttributions(rows, [[1, 2, 3, 3]], None, 2, "gradient", "embed").totals()
            tensor([1.0000, 0.5000])
        """
        return self.matrix(sample).sum(1)

    def token_text(self, sample: int, index: int) -> str:
        """Token ``index`` of ``sample`` as text, or ``#id`` without a tokenizer.

        Example:
            >>> import torch
            >>> TokenAttributions([], [[7, 8]], None, 2, "gradient", "embed").token_text(0, 1)
            '#8'
        """
        return self.texts[sample][index] if self.texts is not None else f"#{self.tokens[sample][index]}"

    def table(self, top: int = 5) -> str:
        """One line per token explained: its score and the ``top`` tokens of largest ``|score|`` (position:token
        score, signed).

        Example:
            >>> import torch
            >>> row = TokenRow(0, 0, 1, 3, "c", 1.5, 0.0, torch.tensor([0.25, -1.0]))
            >>> print(TokenAttributions([row], [[1, 2]], [["a", "b"]], 2, "integrated_gradients", "embed", forwards=3))
            integrated_gradients at layer 'embed': 1 token explained, 3 forward passes
            sample  step  token  logit    sum  delta  strongest tokens
            ----------------------------------------------------------
                 0     0    'c'    1.5  -0.75      0  1:'b' -1, 0:'a' +0.25
        """
        said = ", ".join(f"{k}={v}" for k, v in (self.settings or {}).items())
        n = len(self.rows)
        head = (f"{self.method}{' (' + said + ')' if said else ''} at layer {self.layer!r}: {n} token"
                f"{'s' if n != 1 else ''} explained, {self.forwards} forward pass{'es' if self.forwards != 1 else ''}")
        body = []
        for r in self.rows:
            order = r.scores.abs().argsort(descending=True, stable=True)[:top].tolist()
            strongest = ", ".join(f"{j}:{_shown(self.tokens[r.sample][j], self.texts[r.sample][j] if self.texts else None)}"
                                  f" {'+' if float(r.scores[j]) > 0 else ''}{num(float(r.scores[j]), 3)}" for j in order)
            body.append([str(r.sample), str(r.step), _shown(r.target, r.text), num(r.logit), num(float(r.scores.sum())),
                         num(r.delta), strongest])
        return "\n".join([head, *table(["sample", "step", "token", "logit", "sum", "delta", "strongest tokens"], body,
                                       pad_last=False)])

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python data, each row's scores as a list.

        Example:
            >>> import torch
            >>> row = TokenRow(0, 0, 1, 3, None, 1.0, None, torch.tensor([0.5, 0.5]))
            >>> TokenAttributions([row], [[1, 2]], None, 2, "gradient", "embed").to_dict()["rows"][0]["scores"]
            [0.5, 0.5]
        """
        rows = [{"sample": r.sample, "step": r.step, "position": r.position, "target": r.target, "text": r.text,
                 "logit": r.logit, "delta": r.delta, "scores": [float(v) for v in r.scores.tolist()]} for r in self.rows]
        return {"method": self.method, "layer": self.layer, "settings": dict(self.settings or {}),
                "forwards": self.forwards, "prompt": self.prompt, "tokens": self.tokens, "texts": self.texts,
                "rows": rows}
