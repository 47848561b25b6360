"""The hidden width of a transformer (its residual stream) as the model's own numbers say it: which
norms measure it (RMSNorm, LayerNorm), the embeddings scaled by it, the ``hidden_size`` its layers and
configs hold; and a model whose norms were shrunk to fewer channels told so (``refit_width``), as
pruning's ``compact`` and ``fit_to`` both need it. Must not import: analysis, ``loading``, ``cli``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..selection import named_modules

__all__ = ["TOKENS", "is_layer_norm", "is_rms_norm", "rescale_norm", "embed_scales", "module_widths",
           "write_width_configs", "write_layer_norm_configs", "refit_width"]

# the parameters a ViT keeps at the width without a module of their own (class token, position embeddings)
TOKENS = ("cls_token", "position_embeddings", "mask_token", "distillation_token")


def is_layer_norm(m: nn.Module) -> bool:
    """Whether ``m`` is a LayerNorm over its last dim with a weight and a bias (torch's or a subclass).

    Example:
        >>> is_layer_norm(nn.LayerNorm(4)), is_layer_norm(nn.LayerNorm(4, elementwise_affine=False))
        (True, False)
    """
    return isinstance(m, nn.LayerNorm) and len(m.normalized_shape) == 1 \
        and isinstance(getattr(m, "weight", None), torch.Tensor) and isinstance(getattr(m, "bias", None), torch.Tensor)


def _configs(model: nn.Module) -> list[Any]:
    out: dict[int, Any] = {}
    for _, m in named_modules(model):
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "hidden_size"):
            out.setdefault(id(cfg), cfg)
    return list(out.values())


def is_rms_norm(m: nn.Module) -> bool:
    """Whether ``m`` is an RMSNorm (torch's or a Hugging Face one) whose width hookscope can change.

    Example:
        >>> is_rms_norm(nn.RMSNorm(4)), is_rms_norm(nn.LayerNorm(4))
        (True, False)
    """
    w = getattr(m, "weight", None)
    return "RMSNorm" in type(m).__name__ and isinstance(w, torch.Tensor) and w.dim() == 1 \
        and (hasattr(m, "variance_epsilon") or hasattr(m, "eps"))


def rescale_norm(m: nn.Module, width: int, k: int) -> None:
    attr = "variance_epsilon" if hasattr(m, "variance_epsilon") else "eps"
    eps = getattr(m, attr)
    if eps is None:  # torch's RMSNorm without eps uses its input's machine epsilon
        eps = torch.finfo(getattr(m, "weight").dtype).eps
    setattr(m, attr, eps * width / k)  # rounded as the config's rms_norm_eps is
    if hasattr(m, "normalized_shape"):
        setattr(m, "normalized_shape", (k,))


def embed_scales(embeddings: Sequence[nn.Module], width: int, k: int,
                  heads: Sequence[nn.Module] | None = None) -> bool:
    """Gemma multiplies its token embedding by ``sqrt(hidden_size)``, a buffer built from the config: set
    it to ``sqrt(k)`` as a model built from the compacted config has it, and (``heads`` given: after
    slicing; ``None``: a file's weights, already scaled) multiply the embedding's weight by the old
    scale over the new, so that every token's embedding is what it was. Returns whether such a weight is
    also an LM head's (whose logits then grew by that factor)."""
    tied = False
    for m in embeddings:
        scale, weight = m._buffers.get("embed_scale"), getattr(m, "weight", None)
        if not isinstance(scale, torch.Tensor) or scale.dim() or not isinstance(weight, torch.Tensor):
            continue
        value = getattr(m, "scalar_embed_scale", None) if scale.is_meta else float(scale)  # meta: a twin's
        if not isinstance(value, float) or not math.isclose(value, math.sqrt(width), rel_tol=1e-3):
            continue  # no scale, or one that does not come from the width
        with torch.no_grad():
            if heads is not None:
                weight.mul_(math.sqrt(width) / math.sqrt(k))
                tied |= any(getattr(h, "weight", None) is weight for h in heads)
            scale.fill_(k ** 0.5)
        if hasattr(m, "scalar_embed_scale"):
            setattr(m, "scalar_embed_scale", k ** 0.5)
    return tied


def module_widths(model: nn.Module, width: int, k: int) -> None:
    """The ``hidden_size`` the model's layers keep for themselves (a LLaMA decoder layer's, an MLP's):
    the new width, as a model built from the compacted config holds it."""
    for _, m in named_modules(model):
        if type(vars(m).get("hidden_size")) is int and vars(m)["hidden_size"] == width:
            setattr(m, "hidden_size", k)


def _head_dims(model: nn.Module) -> set[int]:
    return {int(getattr(m, "head_dim")) for _, m in named_modules(model)
            if isinstance(getattr(m, "head_dim", None), int)}


def write_width_configs(model: nn.Module, width: int, k: int) -> None:
    head_dims = _head_dims(model)
    for cfg in _configs(model):
        if getattr(cfg, "hidden_size", None) != width:
            continue
        if len(head_dims) == 1 and getattr(cfg, "head_dim", None) is None:
            cfg.head_dim = next(iter(head_dims))
        cfg.hidden_size = k
        if isinstance(getattr(cfg, "rms_norm_eps", None), float):
            cfg.rms_norm_eps = cfg.rms_norm_eps * width / k


def _rebuilds(model: nn.Module, cfg: Any) -> bool:
    """Whether the model's class built from ``cfg`` (on the meta device) has the model's tensor shapes."""
    try:
        with torch.device("meta"):
            twin = type(model)(cfg)
    except Exception:  # a class that is not built from its config alone: nothing is written
        return False
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes == {k: tuple(v.shape) for k, v in twin.state_dict().items()}


def write_layer_norm_configs(model: nn.Module, width: int, k: int) -> None:
    """The model's config says ``hidden_size = k`` (and ``head_dim``) only when the model's class built
    from it is this model (ViT: its attention reads ``config.head_dim``); GPT-2 and BERT derive their
    head size from ``hidden_size``, so their config keeps describing the original architecture, which
    ``fit_to`` and the compacted ``state_dict`` turn into this model."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "hidden_size", None) != width:
        return
    head_dims = _head_dims(model)
    twin = copy.deepcopy(cfg)
    if len(head_dims) == 1 and getattr(twin, "head_dim", None) is None:
        twin.head_dim = next(iter(head_dims))
    twin.hidden_size = k
    if _rebuilds(model, twin):
        if getattr(twin, "head_dim", None) is not None:
            cfg.head_dim = twin.head_dim
        cfg.hidden_size = k


def refit_width(model: nn.Module, norms: Sequence[tuple[nn.Module, int, int]]) -> None:
    """After :func:`~hookscope.anatomy.fit_to` shrank the norms of the hidden width from ``D`` to ``k`` channels
    (a compacted model's file, whose RMSNorm weights already hold the ``sqrt(D / k)``): an RMSNorm's
    ``eps`` times ``D / k`` and the configs of that width written as :func:`fix_width` does (a
    LayerNorm needs nothing more than its new shape).

    Example:
        >>> n = nn.RMSNorm(2, eps=1e-6); refit_width(n, [(n, 4, 2)]); n.eps
        2e-06
    """
    for m, width, k in norms:
        if not is_layer_norm(m):
            rescale_norm(m, width, k)
    for width, k in {(w, k) for m, w, k in norms if not is_layer_norm(m)}:
        embed_scales([m for _, m in named_modules(model) if isinstance(m, nn.Embedding) and m.embedding_dim == k],
                      width, k)
        module_widths(model, width, k)
        write_width_configs(model, width, k)
    for width, k in {(w, k) for m, w, k in norms if is_layer_norm(m)}:
        module_widths(model, width, k)
        write_layer_norm_configs(model, width, k)
