"""The layer :func:`hookscope.cam` explains when none is given, found in a first watched pass."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...errors import HookscopeError
from ...selection import named_modules
from .._layout import fits
from ._hooked import Pass, hooked_forward
from ._shape import close

__all__ = ["hooked_pass", "of_type"]

def of_type(inner: nn.Module, kind: type[nn.Module]) -> list[tuple[str, nn.Module]]:
    seen: set[int] = set()
    out: list[tuple[str, nn.Module]] = []
    for n, m in named_modules(inner):
        if n and isinstance(m, kind) and id(m) not in seen:
            seen.add(id(m))
            out.append((n, m))
    return out


CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}  # the convolution of each spatial rank of the input


def _positions(t: torch.Tensor) -> int:
    return int(torch.Size(t.shape[2:]).numel())


def gap_source(p: Pass, model_name: str, rank: int = 2) -> str:
    """The last layer whose global average is what the linear head received (CAM's feature map)."""
    if p.head is None:
        raise HookscopeError(f"method='cam' needs a global-average-pool + nn.Linear head, and no nn.Linear "
                             f"ran in {model_name}'s forward pass; use method='gradcam'")
    hname, _, hin, _ = p.head
    for name, t, _ in reversed(p.watched):
        if (isinstance(hin, torch.Tensor) and t.ndim == rank + 2 and _positions(t) > 1 and hin.shape == t.shape[:2]
                and close(t.mean(tuple(range(2, t.ndim))), hin)):
            return name
    raise HookscopeError(f"method='cam' needs a global-average-pool + linear head, but the input of "
                         f"{hname!r} is not the spatial mean of any layer's output; use method='gradcam'")


def depthwise(m: nn.Module | None, rank: int = 2) -> bool:
    return isinstance(m, CONVS[rank]) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


def last_conv(p: Pass, model_name: str, rank: int = 2) -> tuple[str, str]:
    """The last ``nn.Conv2d`` to run with an ``h x w > 1`` output (a squeeze-excitation 1 x 1 has no map), and why.

    In a ConvNeXt block the last convolution (depthwise, or the 1 x 1 ``fc2`` of timm's ``conv_mlp``)
    sits inside the residual branch: the layer scale (1e-6 at initialisation) and the skip path come
    after it, so its map leaves out nearly all of the block's output. The rule: take the innermost
    module that contains the last convolution (an ancestor) and returned the pass's last spatial map
    as it is now; if that block is the innermost module holding both that convolution and a depthwise
    ``Conv2d`` that ran (or that convolution is the depthwise one) and its output has the
    convolution's channels and ``h x w``, take the block's output (the last stage's output that
    torchcam and pytorch-grad-cam use). ResNet, VGG, DenseNet, MobileNet and EfficientNet end in a
    block without a depthwise convolution (or none contains the last one) and keep their last convolution.
    """
    conv = CONVS[rank]
    maps = [(n, t, v) for n, t, v in p.watched if t.ndim == rank + 2 and _positions(t) > 1]
    spatial = [(n, t) for n, t, _ in maps if isinstance(p.modules.get(n), conv)]
    if not spatial:
        raise HookscopeError(f"no nn.{conv.__name__} with a spatial output (more than one position) ran in "
                             f"{model_name}'s forward pass; pass layers= (see hookscope.names(model) or "
                             "`hookscope layers MODEL`)")
    name, out = spatial[-1]
    calls = sum(1 for n, _ in spatial if n == name)
    if calls > 1:
        raise HookscopeError(f"the last convolution {name!r} ran {calls} times in the forward pass; CAM needs one "
                             "output per layer, so pass layers= a layer that runs once")
    keep = name, f"the last {conv.__name__} with a spatial output"
    last, now = [(t, v) for _, t, v in maps][-1]
    # the innermost ancestor of the convolution that returned it as it is now: not torchvision's
    # StochasticDepth, whose output the block then adds its input to in place, nor a pooling branch
    block = next((n for n, t, v in maps if t is last and v == now and name.startswith(n + ".")), None)
    if block is None or last.shape[1:] != out.shape[1:] or sum(1 for n, _, _ in maps if n == block) > 1:
        return keep
    dw = next((n for n, _, _ in reversed(maps) if n.startswith(block + ".") and depthwise(p.modules.get(n), rank)),
              None)
    # the block is the innermost module holding both (MaxViT's MBConv, inside a layer that attends after it, is not)
    if dw is None or (dw != name and os.path.commonprefix([dw.split("."), name.split(".")]) != block.split(".")):
        return keep
    if dw == name:
        return block, f"the last block's output: the last Conv2d, {name!r}, is depthwise, inside that block"
    return block, (f"the last block's output: the last Conv2d, {name!r}, is inside that block, in the residual "
                   f"branch of its depthwise Conv2d {dw!r} (ConvNeXt)")


_ATTENTION_ENDS = ("MHSA", "GPSA")  # ConViT's


_NOT_ATTENTION_ENDS = ("Layer", "Stage")  # a block holding an attention, as CaiT's LayerScaleBlockClassAttn


def is_attention(m: nn.Module) -> bool:
    """A token-mixing attention: ``nn.MultiheadAttention``, or a class named like one (``...Attention``,
    ``...Attn``: CaiT's ``TalkingHeadAttn``, ``ClassAttn``; ConViT's ``MHSA``, ``GPSA``), not a block holding one."""
    kind = type(m).__name__
    if isinstance(m, nn.MultiheadAttention):
        return True
    named = "Attention" in kind or "Attn" in kind or kind.endswith(_ATTENTION_ENDS)
    return named and "Block" not in kind and not kind.endswith(_NOT_ATTENTION_ENDS)


def in_blocks(name: str, modules: dict[str, nn.Module]) -> bool:
    """Does module ``name`` sit in a repeated block: a child of an ``nn.ModuleList``, or of an ``nn.Sequential``
    whose children are all of one class (not, say, a pooling head's attention after the encoder)?"""
    parts = name.split(".")
    for i in range(1, len(parts)):
        box = modules.get(".".join(parts[:i]))
        if isinstance(box, nn.ModuleList) or (
                isinstance(box, nn.Sequential) and len({type(c) for c in box.children()}) == 1):
            return True
    return False


def attentions(p: Pass) -> list[tuple[int, str, str]]:
    """``(index in p.order, outermost name, innermost name)`` of every attention that ran, in order: the index
    of the last start of the innermost attention in it; those in repeated blocks only, if any are (SigLIP's
    pooling head runs one after the encoder)."""
    starts = [(i, n) for i, (start, n, m, _) in enumerate(p.order) if start and is_attention(m)]
    ran = {n for _, n in starts}
    last: dict[str, tuple[int, str]] = {}
    for i, inner in starts:  # an attention inside an attention (HF's SelfAttention, MaxViT's partition)
        att = inner
        while "." in att and att.rsplit(".", 1)[0] in ran:
            att = att.rsplit(".", 1)[0]
        last[att] = (i, inner)
    found = sorted((i, n, inner) for n, (i, inner) in last.items())
    inside = [a for a in found if in_blocks(a[1], p.modules)]
    return inside or found


def before_attention(p: Pass, size: tuple[int, int]) -> tuple[str | None, str]:
    """The norm that ran last before the last attention-like module, in the same block, and why; ``None``
    and why not when no attention ran or that norm's output is no grid of the input (MaxViT's windows).

    The last attention in repeated blocks (a module list) counts; with none there, the last one that has a
    norm before it in its block. No such norm before the last attention of the blocks (post-norm: Swin V2,
    torch's ``norm_first=False``) is refused."""
    atts = attentions(p)
    if not atts:
        return None, ""
    blocks = in_blocks(atts[-1][1], p.modules)
    norm, att = None, atts[-1][1]
    for i, att, inner in reversed(atts if not blocks else atts[-1:]):
        block = att.rsplit(".", 1)[0] + "." if "." in att else ""
        norm = next(((n, out) for start, n, m, out in reversed(p.order[:i]) if not start and "Norm" in type(m).__name__
                     and n.startswith(block) and not n.startswith(inner + ".")), None)
        if norm is not None:
            break
    if norm is None:
        raise HookscopeError(f"the last attention {atts[-1][1]!r} has no norm before it in its block (a post-norm "
                             "transformer?); pass layers= the input of the last token mixing (`hookscope layers MODEL`)")
    name, out = norm
    if isinstance(out, torch.Tensor) and out.ndim == 4 and not (
            fits(out.shape[1], out.shape[2], size) or fits(out.shape[2], out.shape[3], size)):
        return None, f"; the norm before the last attention, {name!r}, gives {tuple(out.shape)}: no grid of the input"
    return name, f"the last block's first norm, before the last attention {att!r}"


def hooked_pass(model: nn.Module, inner: nn.Module, fresh: Callable[[], torch.Tensor], kw: dict[str, Any],
         chosen: list[tuple[str, nn.Module]] | None, method: str, probe: bool,
         size: tuple[int, ...]) -> tuple[Pass, list[tuple[str, nn.Module]], int, str | None]:
    """The hooked forward pass; finds the layer when none was chosen. Returns (pass, layers, model calls, why
    the layer was chosen: ``None`` when it was given).

    ``probe``: also record what tells the chosen layers' layouts (see :class:`._layout.LayoutProbe`).
    """
    heads = of_type(inner, nn.Linear) if method == "cam" else []
    if chosen is not None:
        return hooked_forward(model, fresh(), kw, chosen, [], heads, inner if probe else None), chosen, 1, None
    # Watch without copying, then use the layer's output as it is if nothing rewrote it in place.
    watch = of_type(inner, nn.Module)
    p = hooked_forward(model, fresh(), kw, [], watch, heads)
    p.modules = dict(watch)
    rank = len(size)
    # the transformer rule reads token grids of images; signals and volumes have their convolutions
    norm, why = (None, "") if method == "cam" or rank != 2 else before_attention(p, (size[0], size[1]))
    if norm is not None:  # its layout (tokens, channels last) is probed in a pass that keeps it
        found = [(norm, p.modules[norm])]
        return hooked_forward(model, fresh(), kw, found, [], heads, inner), found, 2, f"{norm} ({why})"
    if method == "cam":
        name, why = gap_source(p, type(inner).__name__, rank), "the layer the head pools"
    else:
        name, conv = last_conv(p, type(inner).__name__, rank)
        why = conv + why
    found = [(name, p.modules[name])]
    _, t, version = next(w for w in reversed(p.watched) if w[0] == name)
    p.order, p.watched = [], []  # hold no other layer's output any longer
    if t._version == version:
        p.kept = {name: [t]}
        return p, found, 1, f"{name} ({why})"
    # an in-place op rewrote that output after the layer ran: run again, keeping a copy of it
    return hooked_forward(model, fresh(), kw, found, [], heads), found, 2, f"{name} ({why})"
