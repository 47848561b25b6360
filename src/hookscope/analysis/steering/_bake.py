"""A steering edit written into the weights: an addition into a bias (one added where the module
has none), a projection (ablate, scale) into the output projection's weights and bias, checked to
give the hooked model's logits and greedy tokens."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ...anatomy import components
from ...core.inputs import model_args, model_kwargs, private
from ...core.state import restored
from ...errors import HookscopeError, checked
from ._steer import Steering

__all__ = ["bake"]

_LOOSE = {torch.float16: 5e-2, torch.bfloat16: 5e-2}  # the rounding of a half-precision weight


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): ``x @ weight + bias``, ``weight`` of ``[in, out]``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _writer(model: nn.Module, name: str, module: nn.Module) -> tuple[str, nn.Module]:
    """The module whose bias an addition to ``name``'s output goes into: itself where it is a
    Linear, Conv1D or Embedding; a block's MLP output projection where ``name`` is a block."""
    if isinstance(module, (nn.Linear, nn.Embedding)) or _is_conv1d(module):
        return name, module
    try:
        comps = components(model, check=False)
    except HookscopeError:
        comps = None
    if comps is not None:
        for i in range(comps.blocks):
            if comps[f"blocks.{i}.resid_post"].module == name and f"blocks.{i}.mlp.hidden" in comps:
                proj = comps[f"blocks.{i}.mlp.hidden"].module  # its input is the hidden units: it writes the stream
                return proj, dict(model.named_modules())[proj]
            if f"blocks.{i}.attn.z" in comps and comps[f"blocks.{i}.attn_out"].module == name:
                proj = comps[f"blocks.{i}.attn.z"].module
                return proj, dict(model.named_modules())[proj]
    raise HookscopeError(f"an addition to {name!r} ({type(module).__name__}) cannot be written into weights: bake "
                         "writes into a Linear's or Conv1D's bias, an Embedding's rows, or a block's MLP output "
                         "projection; steer one of those")


def _param(module: nn.Module, name: str) -> torch.Tensor | None:
    found = getattr(module, name, None)
    return found if isinstance(found, torch.Tensor) else None


def _weight(module: nn.Module) -> torch.Tensor:
    w = _param(module, "weight")
    assert w is not None  # a Linear, Conv1D or Embedding
    return w


def _untie(model: nn.Module, module: nn.Module) -> None:
    """Give ``module`` its own weight where another module shares it (GPT-2's lm_head and wte)."""
    weight = _weight(module)
    if any(p is weight for n, m in model.named_modules() if m is not module for p in m.parameters(recurse=False)):
        module.weight = nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
        config = getattr(model, "config", None)
        if config is not None and getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False  # save_pretrained must not tie them back


def _add(model: nn.Module, module: nn.Module, v: torch.Tensor) -> None:
    if isinstance(module, nn.Embedding):
        _untie(model, module)
        if v.shape[0] != module.weight.shape[1]:
            raise HookscopeError(f"the direction has width {v.shape[0]} but the embedding's rows {module.weight.shape[1]}; "
                                 "compute the direction at the layer you steer")
        with torch.no_grad():
            module.weight.add_(v.to(module.weight))
        return
    weight = _weight(module)
    width = int(weight.shape[1] if _is_conv1d(module) else weight.shape[0])
    if v.shape[0] != width:
        raise HookscopeError(f"the direction has width {v.shape[0]} but the output projection writes {width}; "
                             "compute the direction at the layer you steer")
    bias = _param(module, "bias")
    if bias is None:  # LLaMA's o_proj / down_proj: a bias holding the addition
        bias = nn.Parameter(torch.zeros(width, dtype=weight.dtype, device=weight.device))
        module.bias = bias
    with torch.no_grad():
        bias.add_(v.to(bias))


def _project(model: nn.Module, name: str, module: nn.Module, u: torch.Tensor, factor: float) -> None:
    """``W <- P W``, ``b <- P b`` with ``P = I + (factor - 1) u u^T`` (``factor`` 0 projects ``u`` out)."""
    if not (isinstance(module, (nn.Linear, nn.Embedding)) or _is_conv1d(module)):
        raise HookscopeError(f"a projection of {name!r}'s output ({type(module).__name__}) cannot be written into "
                             "weights: it also reaches the residual stream the block passes on; ablate or scale at "
                             "the modules that write the stream (embeddings, attention and MLP output projections)")
    if isinstance(module, nn.Embedding):
        _untie(model, module)
    w = _weight(module)
    u = u.to(device=w.device, dtype=torch.float64)
    with torch.no_grad():
        w64 = w.double()
        # rows of an Embedding and columns of a Conv1D are output vectors; a Linear's output is W x
        new = w64 + (factor - 1) * ((w64 @ u)[:, None] * u if isinstance(module, nn.Embedding) or _is_conv1d(module)
                                    else u[:, None] * (u @ w64)[None])
        w.copy_(new.to(w.dtype))
        bias = _param(module, "bias")
        if bias is not None:
            b64 = bias.double()
            bias.copy_((b64 + (factor - 1) * (b64 @ u) * u).to(bias.dtype))


def _logits(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise HookscopeError(f"bake checks the model's logits, and the model returned {type(out).__name__}; "
                         "give a model that returns logits (or a ModelOutput with .logits)")


def _verify(steering: Steering, baked: nn.Module, args: tuple[Any, ...], kw: dict[str, Any], atol: float) -> None:
    model = steering.model
    with torch.no_grad(), restored(model), restored(baked):
        with steering:
            hooked = _logits(model(*private(args), **private(kw))).float()
        mine = _logits(baked(*private(args), **private(kw))).float()
    if hooked.shape != mine.shape:
        raise HookscopeError(f"the baked model's logits have shape {tuple(mine.shape)}, the hooked model's "
                             f"{tuple(hooked.shape)}; the edit cannot be baked")
    diff = float((hooked - mine).abs().max())
    limit = atol * max(1.0, float(hooked.abs().max()))
    if not diff <= limit:
        raise HookscopeError(f"the baked model's logits differ from the hooked model's by {diff:.3g} (more than "
                             f"{limit:.3g}): {', '.join(steering.names)} do not write into the output the way the edit "
                             "assumes; steer the output projections themselves")
    top2 = hooked.topk(2, dim=-1).values if hooked.shape[-1] > 1 else None
    clear = (top2[..., 0] - top2[..., 1] > 2 * diff) if top2 is not None else torch.ones_like(hooked[..., 0]).bool()
    if not torch.equal(hooked.argmax(-1)[clear], mine.argmax(-1)[clear]):
        raise HookscopeError("the baked model's greedy tokens differ from the hooked model's; the edit cannot be baked")


@checked
def bake(steering: Steering, inputs: Any, *, kwargs: Mapping[str, Any] | None = None,
         atol: float | None = None) -> nn.Module:
    """A NEW model with ``steering`` written into its weights, checked on ``inputs`` to give the
    hooked model's logits (max abs difference at most ``atol`` times the logits' scale, at least 1;
    default ``1e-5``, ``5e-2`` in half precision) and greedy tokens (wherever the hooked model's two
    best tokens are further apart than that difference). The steered model is never touched.

    What weights can express, at every position (``at=None``):

    - ``op="add"`` at a Linear or Conv1D: into its bias (a bias is added to a module that has none,
      LLaMA's ``down_proj``); at an Embedding: into every row (a tied output layer keeps the old
      weights: the two are untied); at a block (its output, ``blocks.N.resid_post``): into the bias
      of its MLP's output projection (of its attention's, for ``attn_out``).
    - ``op="ablate"`` or ``"scale"`` at a Linear, Conv1D or Embedding: ``W <- (I + (s - 1) u u^T) W``
      and the same on the bias (``s = 0`` projects ``u`` out).

    Refused in one line: ``op="clamp"`` (not linear), positions (``at=``: weights act at every
    position), a projection at a block's output (it would reach the whole residual stream).

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False))
        >>> s = hookscope.steer(net, "0", direction=hookscope.Direction(torch.ones(3)), scale=0.5)
        >>> baked = hookscope.bake(s, torch.randn(4, 2))
        >>> baked[0].bias.tolist()
        [0.5, 0.5, 0.5]
    """
    if not isinstance(steering, Steering):
        raise HookscopeError(f"bake() takes what hookscope.steer(...) returns, not {type(steering).__name__}")
    if steering.op == "clamp":
        raise HookscopeError("a clamp cannot be baked: it is not linear in the activations, so no weights "
                             "express it; keep it as a steering edit")
    if steering.at is not None:
        raise HookscopeError(f"an edit at {steering.at!r} cannot be baked: weights act at every position; steer "
                             "with at=None to bake, or keep the edit as a hook")
    args, kw = model_args(inputs), model_kwargs(kwargs)
    baked = copy.deepcopy(steering.model)
    mods = dict(baked.named_modules())
    d = steering.direction
    for name, _ in steering.selected:
        if steering.op == "add":
            _, writer = _writer(baked, name, mods[name])
            _add(baked, writer, steering.scale * d.vector)
        else:
            _project(baked, name, mods[name], d.unit, 0.0 if steering.op == "ablate" else steering.scale)
    dtype = next((p.dtype for p in baked.parameters()), torch.float32)
    _verify(steering, baked, args, kw, atol if atol is not None else _LOOSE.get(dtype, 1e-5))
    return baked
