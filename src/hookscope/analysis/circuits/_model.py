"""The decoder a circuit analysis reads: its component names resolved (``anatomy.components``), the
streams and activations of one pass read through them with ``capture``, and the model's own final norm
and unembedding applied to any stream (the norm's scale recomputed for that stream), or, for direct
logit attribution, the final norm as the affine map it is with its scale frozen at one run.

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...anatomy import FAMILIES, Component, Components, components, is_layer_norm, is_rms_norm
from ...capture import capture
from ...core.state import restored
from ...errors import HookscopeError, SelectionError
from .._targets import call_model

__all__ = ["Decoder", "FrozenNorm", "decoder", "token_ids", "logits_of", "read"]


@dataclass
class Decoder:
    """A language model's components, resolved once: ``names[name]`` is its :class:`Component`,
    ``modules`` the model's modules by qualified name, ``blocks`` how many blocks, ``cap`` the soft
    cap on the final logits (Gemma2's ``final_logit_softcapping``) or ``None``."""

    model: nn.Module
    names: Components
    modules: dict[str, nn.Module]
    blocks: int
    cap: float | None

    def __getitem__(self, name: str) -> Component:
        return self.names[name]

    def has(self, name: str) -> bool:
        return name in self.names

    def module(self, name: str) -> nn.Module:
        return self.modules[self.names[name].module]

    def unembed(self, stream: torch.Tensor) -> torch.Tensor:
        """The logits the model would give for ``stream`` as its last residual stream: the final norm
        (its scale computed on ``stream`` itself), the unembedding, and the model's soft cap."""
        logits: torch.Tensor = self.module("unembed")(self.module("final_norm")(stream))
        return torch.tanh(logits / self.cap) * self.cap if self.cap else logits


def decoder(model: nn.Module, what: str) -> Decoder:
    """``model``'s components, or one line saying why ``what`` cannot read this model."""
    names = components(model)
    for needed in ("final_norm", "unembed"):
        if needed not in names:
            why = names.absent.get(needed, f"the {names.family} family has no {needed}")
            raise SelectionError(f"{what} reads the stream through the final norm and the unembedding: {why}")
    family = next(f for f in FAMILIES if f.name == names.family)
    if family.form == "post_norm":
        raise SelectionError(f"{what} reads a decoder's residual stream; {names.model} ({names.family}) puts a norm "
                             "after every sum, so its stream is no running sum of what the layers write")
    if family.flat_mlp:
        raise SelectionError(f"{what} reads [batch, pos, ...] streams; {names.model} ({names.family}) flattens batch "
                             "and position before its MLP")
    config = getattr(model, "config", None)
    cap = getattr(config, family.logit_cap, None) if family.logit_cap else None
    return Decoder(model, names, dict(model.named_modules()), names.blocks, float(cap) if cap else None)


def token_ids(inputs: Any, what: str = "inputs") -> torch.Tensor:
    """One sequence of token ids as ``[1, pos]`` (``[pos]`` is taken too), or the one-line refusal."""
    if not isinstance(inputs, torch.Tensor) or inputs.dtype not in (torch.long, torch.int32, torch.int64):
        got = f"a {inputs.dtype} tensor" if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"{what} must be token ids, a [pos] or [1, pos] integer tensor, not {got}; "
                             "tokenize the text first (hookscope.tokenize)")
    ids = inputs.reshape(1, -1) if inputs.dim() == 1 else inputs
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise HookscopeError(f"{what} must be one sequence of token ids, [pos] or [1, pos], not "
                             f"{list(inputs.shape)}; run one prompt at a time")
    return ids.long()


def logits_of(out: Any) -> torch.Tensor:
    """The logits in a model's output (``.logits``, else its first element)."""
    found = getattr(out, "logits", None)
    found = found if isinstance(found, torch.Tensor) else out if isinstance(out, torch.Tensor) else out[0]
    if not isinstance(found, torch.Tensor):
        raise HookscopeError(f"the model's output {type(out).__name__} holds no logits tensor")
    return found


def read(d: Decoder, ids: torch.Tensor, names: Sequence[str], *,
         kwargs: Mapping[str, Any] | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The named components on one pass of ``ids`` (detached copies) and the model's logits."""
    chosen = [d[n] for n in names]
    modules = list(dict.fromkeys(c.module for c in chosen))
    with restored(d.model, train=False), torch.no_grad():
        with capture(d.model, *modules, keep="io", copy="always") as rec:
            out = call_model(d.model, (ids.to(device_of(d.model)),), dict(kwargs or {}))
    got = {}
    for c in chosen:
        call = rec[c.module][0]
        got[c.name] = c.view.read(call.input if c.field == "input" else call.output).detach().clone()
    return got, logits_of(out).detach()


def device_of(model: nn.Module) -> torch.device:
    return next(iter(model.parameters()), torch.zeros(0)).device


@dataclass
class FrozenNorm:
    """A LayerNorm or RMSNorm as the affine map it is once its scale is frozen at one stream:
    ``norm(t) = (t - mean(t) if centre else t) / scale * gain + bias`` for any term ``t`` of that stream.
    ``scale`` is ``[..., 1]`` (one per position), ``gain`` and ``bias`` ``[width]``."""

    centre: bool
    scale: torch.Tensor
    gain: torch.Tensor
    bias: torch.Tensor

    def linear(self, term: torch.Tensor) -> torch.Tensor:
        """A term of the stream through the frozen norm, without the bias."""
        t = term - term.mean(-1, keepdim=True) if self.centre else term
        return t / self.scale * self.gain


def _eps(norm: nn.Module) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    eps = getattr(norm, "eps", None) if eps is None else eps
    return float(eps) if eps is not None else float(torch.finfo(torch.float32).eps)


def frozen(norm: nn.Module, stream: torch.Tensor) -> FrozenNorm:
    """``norm`` frozen at ``stream`` (``[..., width]``), checked to give ``norm(stream)`` (fp32 1e-5), or the
    one-line refusal for a norm whose form is not a LayerNorm's or an RMSNorm's."""
    x = stream.double()
    width = x.shape[-1]
    weight = getattr(norm, "weight", None)
    weight = weight.detach().double() if isinstance(weight, torch.Tensor) else torch.ones(width, dtype=x.dtype,
                                                                                        device=x.device)
    bias = getattr(norm, "bias", None)
    bias = bias.detach().double() if isinstance(bias, torch.Tensor) else torch.zeros_like(weight)
    if is_layer_norm(norm) or isinstance(norm, nn.LayerNorm):
        forms = [(True, x.var(-1, unbiased=False, keepdim=True), weight, bias)]
    elif is_rms_norm(norm) or "RMSNorm" in type(norm).__name__:
        # Gemma's RMSNorm multiplies by 1 + weight: both forms tried, the one the module computes kept
        ms = x.pow(2).mean(-1, keepdim=True)
        forms = [(False, ms, weight, bias), (False, ms, 1 + weight, bias)]
    else:
        forms = []
    with torch.no_grad():
        want = norm(stream).double()
    for centre, var, gain, b in forms:
        f = FrozenNorm(centre, (var + _eps(norm)).sqrt(), gain, b)
        got = f.linear(x) + b
        if float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max())):
            return f
    raise SelectionError(f"the final norm {type(norm).__name__} does not compute as a LayerNorm or an RMSNorm "
                         "does, so its scale cannot be frozen: direct logit attribution needs one of them")


def unembedding(d: Decoder) -> tuple[torch.Tensor, torch.Tensor]:
    """The unembedding's ``[vocab, width]`` weight and ``[vocab]`` bias (zeros where it has none), fp64."""
    head = d.module("unembed")
    w = getattr(head, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise SelectionError(f"the unembedding {type(head).__name__} has no [vocab, width] weight")
    b = getattr(head, "bias", None)
    bias = b.detach().double() if isinstance(b, torch.Tensor) else torch.zeros(w.shape[0], dtype=torch.float64,
                                                                              device=w.device)
    return w.detach().double(), bias


def out_weight(proj: nn.Module, heads: int, d_head: int) -> torch.Tensor:
    """An output projection's weight as ``[heads, d_head, out]`` (Linear keeps ``[out, in]``, GPT-2's Conv1D
    ``[in, out]``), fp64."""
    w = getattr(proj, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or heads * d_head not in w.shape:
        raise SelectionError(f"the output projection {type(proj).__name__} has no [{heads * d_head}, out] weight to "
                             "split into heads")
    w_in_out = w.t() if isinstance(proj, nn.Linear) else w
    return w_in_out.detach().double().reshape(heads, d_head, -1)
