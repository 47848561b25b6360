"""The tuned lens: one affine translator per residual stream, ``h + W h + b``, trained so that the stream
read through the translator, the final norm and the unembedding gives the model's final distribution
(the KL divergence from the final distribution, summed over the streams, minimised); the last stream
has none. Started at the identity (``W = 0``, ``b = 0``: the logit lens) and trained as the tuned-lens
reference trains it: SGD with Nesterov momentum, the rate decayed linearly to 0, the gradients' norm
clipped, weight decay towards the identity. Saved as a one-shard store (nothing pickled).

Must not import another analysis.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...core.result import Result, missing
from ...core.state import restored
from ...core.text import table
from ...errors import HookscopeError, checked
from ...store import load_tensors, read_manifest, save_tensors, weights_hash
from ._model import Decoder, decoder, read

__all__ = ["TunedRow", "TunedLens", "tune_lens", "load_lens", "lens_streams"]

KIND = "tuned_lens"


@dataclass(frozen=True)
class TunedRow:
    """One stream's translator: ``kl_before``, the KL divergence (nats, mean over tokens) from the final
    distribution to the plain logit lens's on the first batch, ``kl_after`` the tuned lens's on the same
    batch, and the size of what the translator adds: ``weight`` (``||W||``, Frobenius) and ``bias``
    (``||b||``). The last stream's row is all zeros: it has no translator."""

    stream: str
    kl_before: float
    kl_after: float
    weight: float
    bias: float


def lens_streams(d: Decoder) -> list[str]:
    """The streams a lens reads: the embeddings (``blocks.0.resid_pre``), then each block's ``resid_post``."""
    return ["blocks.0.resid_pre", *[f"blocks.{i}.resid_post" for i in range(d.blocks)]]


def head_hash(d: Decoder) -> str:
    """sha256 over the final norm's and the unembedding's weights: what a lens decodes through."""
    parts = (weights_hash(d.module("final_norm")), weights_hash(d.module("unembed")))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


class TunedLens(Result):
    """A tuned lens of one model: ``streams`` (the logit lens's), ``weight`` ``[stream, width, width]``
    and ``bias`` ``[stream, width]`` of each stream's translator but the last's (float32),
    ``history`` ``[step, stream]`` (each step's KL divergence per stream, before that step's update)
    and ``rows``, one :class:`TunedRow` per stream. ``lens[stream]`` is that stream's row.
    :func:`hookscope.logit_lens` reads through it with ``tuned=lens``; :meth:`save` writes it,
    :func:`hookscope.load_lens` reads it back."""

    def __init__(self, model: str, streams: list[str], weight: torch.Tensor, bias: torch.Tensor, head: str,
                 history: torch.Tensor, rows: Sequence[TunedRow]) -> None:
        self.model, self.streams, self.head = model, streams, head
        self.weight, self.bias, self.history = weight, bias, history
        self.rows = list(rows)

    def translate(self, stream: str, h: torch.Tensor) -> torch.Tensor:
        """``stream``'s values ``h`` (``[..., width]``) through its translator (the last stream as it is)."""
        i = self.streams.index(stream) if stream in self.streams else None
        if i is None:
            raise missing(stream, "stream", self.streams)
        if i == len(self.streams) - 1:
            return h
        return translated(h, self.weight[i], self.bias[i])

    def check(self, d: Decoder) -> None:
        """Refuse, in one line, a model this lens was not tuned for."""
        streams, width = lens_streams(d), self.weight.shape[-1]
        got = _width(d)
        if streams != self.streams or got != width:
            raise HookscopeError(f"this tuned lens reads {len(self.streams)} streams of width {width}; "
                                 f"{type(d.model).__name__} has {len(streams)} of width {got}: tune a lens for it "
                                 "with hookscope.tune_lens")
        if head_hash(d) != self.head:
            raise HookscopeError(f"this tuned lens was tuned on a model ({self.model}) whose final norm and "
                                 "unembedding differ from this one's; tune a lens for this model with "
                                 "hookscope.tune_lens")

    def __getitem__(self, stream: str) -> TunedRow:
        for r in self.rows:
            if r.stream == stream:
                return r
        raise missing(stream, "stream", self.streams)

    def __contains__(self, stream: object) -> bool:
        return stream in self.streams

    def table(self) -> str:
        """One row per stream: the KL divergence to the final distribution through the plain logit lens and
        through the tuned one, and the size of the translator."""
        body = [[r.stream, f"{r.kl_before:.4f}", f"{r.kl_after:.4f}", f"{r.weight:.3f}", f"{r.bias:.3f}"]
                for r in self.rows]
        title = f"tuned lens of {self.model}: {self.history.shape[0]} steps"
        return "\n".join([title, *table(["stream", "KL logit lens", "KL tuned", "|W|", "|b|"], body, left={0})])

    def to_dict(self) -> dict[str, Any]:
        """``{model, streams, steps, rows}``."""
        return {"model": self.model, "streams": self.streams, "steps": int(self.history.shape[0]), "rows": self.rows}

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the lens into the folder ``path`` (a one-shard store: safetensors and a JSON manifest);
        returns the folder. :func:`hookscope.load_lens` reads it back."""
        tensors = {"weight": self.weight.detach().cpu(), "bias": self.bias.detach().cpu(),
                   "history": self.history.detach().cpu()}
        info = {"kind": KIND, "model": self.model, "streams": self.streams, "head": self.head,
                "rows": [[r.stream, r.kl_before, r.kl_after, r.weight, r.bias] for r in self.rows]}
        return save_tensors(path, tensors, info, overwrite=overwrite)


def translated(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h + W h + b`` in float32, back in ``h``'s dtype."""
    x = h.float()
    return (x + x @ w.to(h.device).t() + b.to(h.device)).to(h.dtype)


def _width(d: Decoder) -> int:
    w = getattr(d.module("unembed"), "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise HookscopeError(f"the unembedding {type(d.module('unembed')).__name__} has no [vocab, width] weight; "
                             "a tuned lens needs the stream's width")
    return int(w.shape[1])


@checked
def load_lens(path: str | os.PathLike[str]) -> TunedLens:
    """Read back a lens :meth:`TunedLens.save` wrote (nothing unpickled: safetensors and JSON).

    Example:
        >>> import tempfile, torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
        >>> lens = hookscope.tune_lens(lm, torch.randint(0, 20, (4, 6)), steps=2)
        >>> again = hookscope.load_lens(lens.save(tempfile.mkdtemp() + "/lens"))
        >>> again.streams == lens.streams, torch.equal(again.weight, lens.weight)
        (True, True)
    """
    folder = Path(path)
    if not (folder / "manifest.json").is_file():
        raise HookscopeError(f"{folder} holds no saved lens (no manifest.json); give the folder TunedLens.save wrote")
    kind = read_manifest(folder).get("kind")
    if kind != KIND:
        raise HookscopeError(f"{folder} holds a store of kind {kind!r}, not a tuned lens; give the folder "
                             "TunedLens.save wrote")
    tensors, info = load_tensors(folder)
    try:
        rows = [TunedRow(str(s), float(a), float(b), float(w), float(c)) for s, a, b, w, c in info["rows"]]
        return TunedLens(str(info["model"]), [str(s) for s in info["streams"]], tensors["weight"], tensors["bias"],
                         str(info["head"]), tensors["history"], rows)
    except (KeyError, TypeError, ValueError) as e:
        raise HookscopeError(f"{folder}/manifest.json does not describe a tuned lens ({type(e).__name__}: {e}); "
                             "save the lens again") from None


def _batches(data: Any, batch_size: int, steps: int) -> list[torch.Tensor]:
    """The token batches, ``[n, pos]`` each: a tensor's rows ``batch_size`` at a time, or the first ``steps``
    batches an iterable gives (a tensor each, or a mapping holding ``input_ids``, as a tokenizer's)."""
    if isinstance(data, torch.Tensor):
        items: list[Any] = list(data.reshape(1, -1).split(batch_size) if data.dim() == 1 else data.split(batch_size))
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        items = list(itertools.islice(data, max(steps, 1)))
    else:
        items = [data]
    if not items:
        raise HookscopeError("data= gave no batch; give token ids: a [n, pos] integer tensor or batches of them")
    out = []
    for i, t in enumerate(items):
        t = t.get("input_ids") if isinstance(t, Mapping) else t
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            got = f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise HookscopeError(f"data= batch {i} is {got}, not token ids: give a [n, pos] integer tensor or "
                                 "batches of them (tokenize the text first: hookscope.tokenize)")
        t = t.reshape(1, -1) if t.dim() == 1 else t
        if t.dim() != 2 or 0 in t.shape:
            raise HookscopeError(f"data= batch {i} has shape {list(t.shape)}; give [n, pos] token ids")
        out.append(t.long())
    return out


def _settings(steps: int, batch_size: int, lr: float, momentum: float, weight_decay: float, clip: float) -> None:
    if steps < 0 or batch_size < 1:
        raise HookscopeError(f"steps={steps} and batch_size={batch_size}: give steps >= 0 and batch_size >= 1")
    if not (lr > 0 and 0 <= momentum < 1 and weight_decay >= 0 and clip > 0 and math.isfinite(lr + clip)):
        raise HookscopeError(f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, clip={clip}: give lr > 0, "
                             "0 <= momentum < 1, weight_decay >= 0 and clip > 0")


def _kls(d: Decoder, streams: list[str], ids: torch.Tensor, kwargs: Mapping[str, Any] | None,
         params: list[tuple[torch.Tensor, torch.Tensor]], train: bool = False) -> list[float]:
    """Each stream's KL divergence on ``ids`` through the translators ``params``; with ``train`` their
    gradients written, one stream at a time (one stream's logits held at once)."""
    got, final = read(d, ids, streams[:-1], kwargs=kwargs)
    target = final.float().log_softmax(-1)
    p = target.exp()
    out = []
    for (w, b), s in zip(params, streams[:-1]):
        with torch.set_grad_enabled(train):
            logp = d.unembed(translated(got[s], w, b)).float().log_softmax(-1)
            kl = (p * (target - logp)).sum(-1).mean()
        value = float(kl.detach())
        if not math.isfinite(value):
            raise HookscopeError(f"the KL divergence through {s}'s translator is {value} on a batch of shape "
                                 f"{list(ids.shape)}: the model's logits or that stream hold NaN or Inf there; "
                                 "check the model on that batch (hookscope.watch names where it appears)")
        if train:
            w.grad, b.grad = torch.autograd.grad(kl, (w, b))
        out.append(value)
    return out


@checked
def tune_lens(model: nn.Module, data: Any, *, steps: int = 250, batch_size: int = 64, lr: float = 1.0,
              momentum: float = 0.9, weight_decay: float = 1e-3, clip: float = 1.0,
              kwargs: Mapping[str, Any] | None = None) -> TunedLens:
    """Train a tuned lens: per residual stream but the last, an affine translator ``h + W h + b`` (started
    at the identity) such that the translated stream read through the final norm and the unembedding
    gives the model's final distribution at each position (the KL divergence from it minimised).

    Trained as the tuned-lens reference does: SGD with Nesterov ``momentum``, the rate ``lr x (1 -
    momentum)`` decayed linearly to 0 over ``steps``, the gradients' norm clipped at ``clip``, and
    ``weight_decay`` (towards the identity). One step a batch, the batches taken in turn (again from
    the first when there are fewer than ``steps``). The model is not changed: run in eval mode, no
    gradient of its own is written.

    Args:
        model: a decoder of a family :func:`hookscope.components` knows, with its language-model head.
        data: token ids: a ``[n, pos]`` integer tensor (``batch_size`` rows a step), or batches of them
            (a list, a ``DataLoader``, any iterable: one batch a step, a batch a tensor or a mapping
            holding ``input_ids``; only the first ``steps`` are read).
        steps: the optimizer steps (0: the identity, the plain logit lens).
        batch_size: the rows of ``data`` a step, when ``data`` is one tensor.
        lr: the rate before the momentum's ``(1 - momentum)``; the reference's default is 1.
        momentum: SGD's Nesterov momentum.
        weight_decay: SGD's weight decay (pulls each translator towards the identity).
        clip: the largest norm of all the translators' gradients together.
        kwargs: the model's keyword inputs for every batch.

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> lens = hookscope.tune_lens(lm, torch.randint(0, 50, (16, 8)), steps=20)
        >>> lens.streams
        ['blocks.0.resid_pre', 'blocks.0.resid_post', 'blocks.1.resid_post']
        >>> lens["blocks.0.resid_post"].kl_after < lens["blocks.0.resid_post"].kl_before
        True
    """
    _settings(steps, batch_size, lr, momentum, weight_decay, clip)
    d = decoder(model, "tune_lens")
    batches = _batches(data, batch_size, steps)
    streams, width = lens_streams(d), _width(d)
    device = next(iter(model.parameters()), torch.zeros(0)).device
    params = [(torch.zeros(width, width, device=device, requires_grad=True),
               torch.zeros(width, device=device, requires_grad=True)) for _ in streams[:-1]]
    flat = [t for pair in params for t in pair]
    opt = torch.optim.SGD(flat, lr=lr * (1 - momentum), momentum=momentum, nesterov=momentum > 0,
                          weight_decay=weight_decay)
    history = []
    with restored(model, train=False):
        before = _kls(d, streams, batches[0], kwargs, params)
        for step in range(steps):
            history.append(_kls(d, streams, batches[step % len(batches)], kwargs, params, train=True))
            torch.nn.utils.clip_grad_norm_(flat, clip)
            opt.param_groups[0]["lr"] = lr * (1 - momentum) * (steps - step) / steps
            opt.step()
        after = _kls(d, streams, batches[0], kwargs, params)
    weight = torch.stack([w.detach() for w, _ in params]).float().cpu()
    bias = torch.stack([b.detach() for _, b in params]).float().cpu()
    rows = [TunedRow(s, before[i], after[i], float(weight[i].norm()), float(bias[i].norm()))
            for i, s in enumerate(streams[:-1])]
    return TunedLens(type(model).__name__, streams, weight, bias, head_hash(d),
                     torch.tensor(history, dtype=torch.float32).reshape(steps, len(streams) - 1),
                     [*rows, TunedRow(streams[-1], 0.0, 0.0, 0.0, 0.0)])
