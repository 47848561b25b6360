"""LayerNorms of a masked hidden width: each normalises over the kept channels only.

A LayerNorm's mean and variance over the full width ``D`` have no exact form with fewer channels,
so masking a LayerNorm stream changes what its norms compute: while the width is masked, each
LayerNorm on the stream takes its mean and variance over the ``k`` kept channels (same ``eps``, its
weight and bias zero on the dropped ones). A plain ``LayerNorm(k)`` with ``weight[keep]``,
``bias[keep]`` and the same ``eps`` then computes exactly that, which is what ``compact`` builds.

The kept channels are read from the norm's weight mask when it runs (the model's mask state, saved
in its ``state_dict``; once masks are made permanent, from its zero weight and bias), by a forward hook of a module-level class (the masked model pickles and
deep-copies). Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..masks import mask_of

__all__ = ["KeptNormHook", "hold_norm", "release_norm", "holds_norm", "rms_offset"]


def rms_offset(m: nn.Module) -> float | None:
    """What an RMSNorm adds to its weight before scaling: ``0.0`` for ``weight * x / rms(x)`` (LLaMA),
    ``1.0`` for ``(1 + weight) * x / rms(x)`` (Gemma), ``None`` for anything else. Read off one call on a
    fixed vector (the module's own arithmetic, whatever its class says).

    Example:
        >>> rms_offset(nn.RMSNorm(4, eps=1e-6))
        0.0
    """
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.device.type == "meta":
        return None
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    if eps is None:  # torch's RMSNorm without eps uses its input's machine epsilon
        eps = torch.finfo(w.dtype).eps
    x = torch.linspace(-1.5, 2.0, w.shape[0], dtype=torch.float64, device=w.device).unsqueeze(0)
    with torch.no_grad():
        y = m(x.to(w.dtype))
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            return None
        base = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(eps))
        weight = getattr(m, "weight").detach().double()  # masked: as the call read it
        tol = 1e-2 if w.dtype in (torch.float16, torch.bfloat16) else 1e-4
        for offset in (0.0, 1.0):
            if torch.allclose(y.double(), base * (weight + offset), rtol=tol, atol=tol):
                return offset
    return None


class KeptNormHook:
    """The forward hook of a LayerNorm on a masked stream: its output recomputed with the mean and
    variance over the channels its weight mask keeps (no host synchronisation: the mask weighs the
    sums; half precision computed in float32, as ``F.layer_norm`` does). With the masks made
    permanent, the kept channels are those whose weight or bias is not zero.

    Example:
        >>> from hookscope.analysis.prune.masks._hooks import apply_mask
        >>> ln = nn.LayerNorm(4); apply_mask(ln, "weight", torch.tensor([1.0, 1.0, 1.0, 0.0]))
        >>> hold_norm(ln)
        >>> x = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
        >>> y = ln(x).detach(); torch.allclose(y[:, :3], nn.LayerNorm(3)(x[:, :3])), float(y[0, 3])
        (True, 0.0)
    """

    __slots__ = ()

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if not args or not isinstance(args[0], torch.Tensor) or not isinstance(output, torch.Tensor):
            return None
        weight, bias = getattr(module, "weight"), getattr(module, "bias")
        mask = mask_of(module, "weight")
        # masks made permanent (remove()): the dropped channels are those whose weight and bias are zero
        kept = mask.ne(0) if mask is not None else weight.ne(0) | bias.ne(0)
        x = args[0]
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # as F.layer_norm does
        keep = kept.to(dtype=work, device=x.device)
        xw = x.to(work)
        k = keep.sum()
        mean = (xw * keep).sum(-1, keepdim=True) / k
        centred = (xw - mean) * keep
        var = centred.pow(2).sum(-1, keepdim=True) / k
        eps = float(getattr(module, "eps", 1e-5))
        return (centred * torch.rsqrt(var + eps) * weight.to(work) + bias.to(work)).to(output.dtype)

    def __repr__(self) -> str:
        return "KeptNormHook()"


def holds_norm(m: nn.Module) -> bool:
    """Whether ``m`` carries a :class:`KeptNormHook`.

    Example:
        >>> holds_norm(nn.LayerNorm(2))
        False
    """
    return any(isinstance(h, KeptNormHook) for h in m._forward_hooks.values())


def hold_norm(m: nn.Module) -> None:
    """Give LayerNorm ``m`` the kept-channel statistics of a masked stream (once; a second call adds nothing).

    Example:
        >>> ln = nn.LayerNorm(2); hold_norm(ln); hold_norm(ln); holds_norm(ln)
        True
    """
    if not holds_norm(m):
        # own hook: the norm of a masked stream stays on the model after this returns, as the masks do
        m.register_forward_hook(KeptNormHook())


def release_norm(m: nn.Module) -> None:
    """Remove the :class:`KeptNormHook` of ``m`` (a compacted norm of ``k`` channels is a plain LayerNorm);
    removing twice is harmless.

    Example:
        >>> ln = nn.LayerNorm(2); hold_norm(ln); release_norm(ln); release_norm(ln); holds_norm(ln)
        False
    """
    for key in [k for k, h in m._forward_hooks.items() if isinstance(h, KeptNormHook)]:
        del m._forward_hooks[key]
