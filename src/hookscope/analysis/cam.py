"""Class activation maps for a batch in one call: CAM, Grad-CAM, ++, XGrad, HiRes, Layer, Score, Eigen.

One forward pass with forward hooks (a :class:`~hookscope.core.hooks.HookGroup`, removed in
``finally``) keeps each target layer's activation with its autograd graph; gradient methods then
call ``torch.autograd.grad`` on those activations only. No ``.backward()``, no parameter ``.grad``
written, no ``zero_grad``; every train/eval flag put back as it was; works on frozen models and
under an outer ``torch.no_grad()`` or ``torch.inference_mode()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from .._tree import first_tensor, tensors, tree_map
from ..core.compiled import HookRefresh, eager, is_compiled
from ..core.hooks import HookGroup
from ..core.inputs import model_kwargs, private
from ..core.result import Result, jsonable, missing
from ..core.state import kept_rng, restored
from ..core.text import dtype_text, first_line, num, shape_text, table
from ..errors import HookscopeError, did_you_mean
from ..selection import Selector, check_hookable, named_modules, unwrap
from ..selection import layers as select
from ._layout import LayoutProbe, fits, grid_of_tokens, prefix_tokens
from ._cam_methods import GRADIENT_METHODS, cam_map, eigen_map, gradient_map, score_weights
from ._targets import (Target, anchored, batch_coupled, call_model, class_targets, for_rows, is_function,
                       per_sample, read_logits, rows_of, user_scores)

__all__ = ["METHODS", "CamMaps", "CamRow", "cam", "channels_first", "channels_last", "tokens_to_grid"]

METHODS = ("cam", "gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "scorecam", "eigencam")

V = TypeVar("V")


class _ByLayer(dict[str, V]):
    """A dict keyed by layer name: a name it does not hold raises :class:`~hookscope.RecordError`
    naming the closest ones (``in`` agrees: it is a dict)."""

    def __missing__(self, name: str) -> V:
        raise missing(name, "layer", self)


@dataclass(frozen=True)
class CamRow:
    """One image of a :class:`CamMaps` (a row of ``res.rows``).

    Attributes:
        image: the image's index in the batch.
        target: the class explained (``None`` for a target function, or Eigen-CAM without logits).
        score: the target's score (``None`` where no score was read).
        peak: ``(y, x)`` of the map's maximum at the input's resolution (the first in row-major order).
        layers: the layers whose maps were fused.
    """

    image: int
    target: int | None
    score: float | None
    peak: tuple[int, int]
    layers: tuple[str, ...]


def _shape_and_dtype(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": dtype_text(t.dtype)}


@dataclass
class CamMaps(Result):
    """What :func:`cam` returns: the maps, one row per image, and how they were made.

    Speaks hookscope's result protocol: ``rows`` (one :class:`CamRow` per image), ``table()``
    (also ``str(res)``), ``to_dict()`` (tensors as they are), ``to_json()`` (the maps summarised
    as their shape and dtype unless ``maps=True``); ``res.raw["name"]`` and ``res.layouts["name"]``
    raise :class:`~hookscope.RecordError` with the closest names for a layer they do not hold.

    Attributes:
        maps: ``B x H x W``, upsampled (bilinear) to the input's spatial size, min-max normalised
            per image to [0, 1] (several layers: fused, then normalised again).
        raw: per layer name, the ``B x h x w`` map before upsampling and normalisation (after ReLU
            where the method has one).
        targets: ``B`` long tensor of the class indices used (``None`` when target is a function,
            or for Eigen-CAM on a model whose output holds no logits).
        scores: ``B`` scores of the targets (the model's output read through ``output``), detached;
            ``None`` where ``targets`` is ``None`` for want of logits.
        layers: qualified names of the layers used (names of the unwrapped model).
        method: the method's name, as in :data:`METHODS`.
        forwards: how many times the model was called (Score-CAM: the first pass plus one call per
            batch of masked inputs).
        masked: how many masked inputs Score-CAM evaluated (channels with equal masks share one).
        layouts: per layer name, how its activation was read: ``"BCHW"`` (as it came),
            ``"BHWC"`` (channels last, as Swin stages: permuted to ``B x C x h x w`` first),
            ``"tokens(k=1, 14x14)"`` (``B x (k + h*w) x C`` tokens: the ``k`` prefix tokens dropped, the
            rest laid out row by row) or ``"reshape="`` (your function).
        chosen: with ``layers=None``, the layer chosen and why, e.g. ``"blocks.11.norm1 (the last block's
            first norm, before the last attention 'blocks.11.attn')"``; ``None`` when you chose.
        notes: what makes maps say less than they seem to, one line each, also given as warnings:
            a sample whose score's gradient at a layer is exactly zero (its map is all zero), or whose
            Score-CAM masked inputs all score the same (its channels all weigh the same).
    """

    maps: torch.Tensor
    raw: dict[str, torch.Tensor]
    targets: torch.Tensor | None
    scores: torch.Tensor | None
    layers: list[str]
    method: str
    forwards: int = 1
    masked: int = 0
    layouts: dict[str, str] = field(default_factory=dict)
    chosen: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw = _ByLayer(self.raw)
        self.layouts = _ByLayer(self.layouts)

    @property
    def rows(self) -> list[CamRow]:
        """One row per image: the class explained, its score, where the map peaks, the layers."""
        b, width = self.maps.shape[0], self.maps.shape[-1]
        peaks = self.maps.flatten(1).argmax(1).tolist() if self.maps.numel() else [0] * b
        targets = self.targets.tolist() if self.targets is not None else [None] * b
        scores = self.scores.float().tolist() if self.scores is not None else [None] * b
        return [CamRow(i, targets[i], scores[i], divmod(peaks[i], width), tuple(self.layers)) for i in range(b)]

    def table(self) -> str:
        """The maps as text: how they were made, then one line per image (also ``str(res)``).

        Example:
            >>> import torch, hookscope.zoo
            >>> res = cam(hookscope.zoo.TinyResNet().eval(), torch.ones(2, 3, 32, 32), layers="layer2", target=3)
            >>> print(res)  # doctest: +ELLIPSIS
            gradcam on layer2: 2 maps of 32x32, 1 forward pass
            image  target...score  peak (y, x)
            -----...
                0       3...)
                1       3...)
        """
        size = shape_text(tuple(self.maps.shape[1:]))
        counted = f"{self.forwards} forward pass{'es' if self.forwards != 1 else ''}"
        if self.masked:
            counted += f" ({self.masked} masked inputs)"
        turned = [f"{n} {lay}" for n, lay in self.layouts.items() if lay != "BCHW"]
        head = (f"{self.method} on {', '.join(self.layers)}{' (' + ', '.join(turned) + ')' if turned else ''}: "
                f"{self.maps.shape[0]} map{'s' if self.maps.shape[0] != 1 else ''} of {size}, {counted}")
        body = [[str(r.image), "-" if r.target is None else str(r.target), num(r.score), f"{r.peak}"]
                for r in self.rows]
        said = ([f"layer chosen automatically: {self.chosen}"] if self.chosen else []) + [
            f"note: {n}" for n in self.notes]
        return "\n".join([head, *said, *table(["image", "target", "score", "peak (y, x)"], body, left={3})])

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python data, tensors kept as tensors (``maps``, ``raw``, ``targets``,
        ``scores``), and the rows as dicts.

        Example:
            >>> import torch, hookscope.zoo
            >>> res = cam(hookscope.zoo.TinyResNet().eval(), torch.ones(1, 3, 32, 32), layers="layer2")
            >>> d = res.to_dict()
            >>> d["maps"].shape, d["raw"]["layer2"].shape, d["rows"][0]["layers"]
            (torch.Size([1, 32, 32]), torch.Size([1, 16, 16]), ('layer2',))
        """
        return {
            "method": self.method,
            "layers": list(self.layers),
            "layouts": dict(self.layouts),
            "chosen": self.chosen,
            "notes": list(self.notes),
            "forwards": self.forwards,
            "masked": self.masked,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "targets": self.targets,
            "scores": self.scores,
            "maps": self.maps,
            "raw": dict(self.raw),
        }

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON text. The maps (``B x H x W`` floats, 50k numbers for one
        224 x 224 image) are written as ``{"shape": ..., "dtype": ...}`` unless ``maps=True``, which
        writes them, and ``raw``, as nested lists.

        Example:
            >>> import json, torch, hookscope.zoo
            >>> res = cam(hookscope.zoo.TinyResNet().eval(), torch.ones(1, 3, 32, 32), layers="layer2")
            >>> data = json.loads(res.to_json())
            >>> data["maps"], data["raw"]["layer2"]["shape"], data["rows"][0]["peak"] == list(res.rows[0].peak)
            ({'shape': [1, 32, 32], 'dtype': 'float32'}, [1, 16, 16], True)
            >>> len(json.loads(res.to_json(maps=True))["maps"][0])
            32
        """
        data = self.to_dict()
        if not maps:
            data["maps"] = _shape_and_dtype(self.maps)
            data["raw"] = {n: _shape_and_dtype(t) for n, t in self.raw.items()}
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)


def tokens_to_grid(skip: int = 1, grid: tuple[int, int] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``reshape=`` for transformer layers: ``B x (skip + h*w) x C`` tokens -> ``B x C x h x w``.

    The first ``skip`` tokens (a ViT's class token: 1; DeiT's class and distillation tokens: 2) are
    dropped and the rest laid out row by row on an ``h x w`` grid (square unless ``grid`` says).
    For a ``B x h x w x C`` activation (Swin) see :func:`channels_last`.

    Example:
        >>> tokens_to_grid(skip=1)(torch.zeros(2, 1 + 14 * 14, 768)).shape
        torch.Size([2, 768, 14, 14])
    """
    def reshape(t: torch.Tensor) -> torch.Tensor:
        if t.ndim != 3:
            raise ValueError(f"expected B x tokens x C, got {t.ndim} dimensions; a layer of tokens needs it")
        n = t.shape[1] - skip
        h, w = grid if grid is not None else (math.isqrt(max(n, 0)), math.isqrt(max(n, 0)))
        if h * w != n:
            raise ValueError(f"{n} tokens after skipping {skip} do not fill a {h} x {w} grid; pass grid=(h, w) or skip=")
        return grid_of_tokens(t, skip, h, w)

    return reshape


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """A ``reshape=`` for a ``B x h x w x C`` activation (Swin stages, ConvNeXt blocks inside): ``B x C x h x w``.

    :func:`cam` does this by itself when the modules around the layer say the channels are last.

    Example:
        >>> channels_last(torch.zeros(2, 7, 7, 768)).shape
        torch.Size([2, 768, 7, 7])
    """
    if t.ndim != 4:
        raise ValueError(f"expected B x h x w x C, got {t.ndim} dimensions")
    return t.permute(0, 3, 1, 2)


def channels_first(t: torch.Tensor) -> torch.Tensor:
    """A ``reshape=`` that says a 4-D activation is ``B x C x h x w`` already (it is returned as it is).

    Example:
        >>> channels_first(torch.zeros(2, 8, 8, 8)).shape
        torch.Size([2, 8, 8, 8])
    """
    if t.ndim != 4:
        raise ValueError(f"expected B x C x h x w, got {t.ndim} dimensions")
    return t


class _Pass:
    """What one hooked forward pass left behind."""

    def __init__(self, keep: list[tuple[str, nn.Module]]) -> None:
        self.output: Any = None
        self.kept: dict[str, list[torch.Tensor | None]] = {n: [] for n, _ in keep}
        self.watched: list[tuple[str, torch.Tensor, int]] = []  # (name, output, its version), in finish order
        self.order: list[tuple[bool, str, nn.Module, Any]] = []  # (started?, name, module, output): every call
        self.head: tuple[str, nn.Module, Any, Any] | None = None  # the last nn.Linear call
        self.probe = LayoutProbe([n for n, _ in keep])  # what tells a kept 4-D output's layout
        self.probed = False  # the probe was attached
        self.modules: dict[str, nn.Module] = {}  # of the watched layers, by name


def _keeper(p: _Pass, name: str) -> Any:
    store = p.kept[name]

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        t = first_tensor(output)
        if t is None:
            store.append(None)
            return None
        a = t if t.requires_grad else t.detach().requires_grad_()  # integer inputs (token ids) give no graph
        store.append(a)
        # Keep `a`, hand the model a copy: a later in-place op (ReLU(inplace=True), out += identity)
        # would rewrite the kept values and move `a`'s autograd history past it (pytorch/pytorch#61519).
        copy = a.clone()
        p.probe.hand(name, copy)
        return tree_map(lambda u: copy if u is t else u, output)

    return hook


def _watcher(name: str, p: _Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.ndim == 4:
            p.watched.append((name, output, output._version))
        p.order.append((False, name, module, output if isinstance(output, torch.Tensor) else None))

    return hook


def _starts(name: str, p: _Pass) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        p.order.append((True, name, module, None))

    return hook


def _head_watcher(name: str, p: _Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        p.head = (name, module, args[0] if args else None, output)

    return hook


def _hooked_forward(model: nn.Module, x: torch.Tensor, kw: dict[str, Any], keep: list[tuple[str, nn.Module]],
                    watch: list[tuple[str, nn.Module]], heads: list[tuple[str, nn.Module]],
                    probe: nn.Module | None = None) -> _Pass:
    p = _Pass(keep)
    group = HookGroup()
    refresh = HookRefresh(model)  # a compiled model: traced anew with the hooks, which run eagerly between pieces
    hook: Callable[[Any], Any] = eager if is_compiled(model) else (lambda f: f)
    try:
        for name, module in keep:
            group.add(module.register_forward_hook(hook(_keeper(p, name))))
        if probe is not None:  # after the keepers, so that they see the copies handed on
            p.probe.attach(probe, keep, group, wrap=hook)
            p.probed = True
        for name, module in watch:
            group.add(module.register_forward_pre_hook(hook(_starts(name, p))))
            group.add(module.register_forward_hook(hook(_watcher(name, p))))
        for name, module in heads:
            group.add(module.register_forward_hook(hook(_head_watcher(name, p))))
        refresh.open()
        p.output = call_model(model, (x,), private(kw))  # a failure names where it failed
    finally:
        group.remove()
        refresh.close()
        p.probe.release()  # the readers are known now: keep no extra tensor alive
    return p


def _shapers(acts: dict[str, torch.Tensor], p: _Pass, reshape: Callable[[torch.Tensor], torch.Tensor] | None,
             prefix: int | None, size: tuple[int, int]
             ) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor] | None], dict[str, str]]:
    """Per layer, what turns its activation (and gradient) into ``B x C x h x w``, and its layout's name.

    ``prefix``: the model's own count of tokens before the patches (``None``: it does not say).
    """
    shapers: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {}
    layouts: dict[str, str] = {}
    for n, a in acts.items():
        if reshape is not None:
            shapers[n], layouts[n] = reshape, "reshape="
        elif p.probed and a.ndim == 3:
            k, h, w = p.probe.tokens(n, a, size, prefix)
            shapers[n], layouts[n] = tokens_to_grid(k, (h, w)), f"tokens(k={k}, {h}x{w})"
        elif p.probed and a.ndim == 4 and p.probe.layout(n, a, size) == "last":
            shapers[n], layouts[n] = channels_last, "BHWC"
        else:  # a layer found by cam() itself is a Conv2d's output or the map the head pools
            shapers[n], layouts[n] = None, "BCHW"
    return shapers, layouts


def _work(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 (float64 kept): half-precision models get their formulas in full precision."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``allclose`` within the rounding of the less precise of the two dtypes."""
    eps = max(torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0 for t in (a, b))
    tol = max(1e-4, 8 * eps)
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol if eps > 1e-6 else 1e-5)


def _of_type(inner: nn.Module, kind: type[nn.Module]) -> list[tuple[str, nn.Module]]:
    seen: set[int] = set()
    out: list[tuple[str, nn.Module]] = []
    for n, m in named_modules(inner):
        if n and isinstance(m, kind) and id(m) not in seen:
            seen.add(id(m))
            out.append((n, m))
    return out


def _gap_source(p: _Pass, model_name: str) -> str:
    """The last layer whose global average is what the linear head received (CAM's feature map)."""
    if p.head is None:
        raise HookscopeError(f"method='cam' needs a global-average-pool + nn.Linear head, and no nn.Linear "
                             f"ran in {model_name}'s forward pass; use method='gradcam'")
    hname, _, hin, _ = p.head
    for name, t, _ in reversed(p.watched):
        if (isinstance(hin, torch.Tensor) and t.shape[2] * t.shape[3] > 1 and hin.shape == t.shape[:2]
                and _close(t.mean((2, 3)), hin)):
            return name
    raise HookscopeError(f"method='cam' needs a global-average-pool + linear head, but the input of "
                         f"{hname!r} is not the spatial mean of any layer's output; use method='gradcam'")


def _depthwise(m: nn.Module | None) -> bool:
    return isinstance(m, nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


def _last_conv(p: _Pass, model_name: str) -> tuple[str, str]:
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
    spatial = [(n, t) for n, t, _ in p.watched if isinstance(p.modules.get(n), nn.Conv2d) and t.shape[2] * t.shape[3] > 1]
    if not spatial:
        raise HookscopeError(f"no nn.Conv2d with a spatial output (h x w > 1) ran in {model_name}'s forward "
                             "pass; pass layers= (see hookscope.names(model) or `hookscope layers MODEL`)")
    name, out = spatial[-1]
    calls = sum(1 for n, _ in spatial if n == name)
    if calls > 1:
        raise HookscopeError(f"the last convolution {name!r} ran {calls} times in the forward pass; CAM needs one "
                             "output per layer, so pass layers= a layer that runs once")
    keep = name, "the last Conv2d with a spatial output"
    last, now = [(t, v) for _, t, v in p.watched if t.shape[2] * t.shape[3] > 1][-1]
    # the innermost ancestor of the convolution that returned it as it is now: not torchvision's
    # StochasticDepth, whose output the block then adds its input to in place, nor a pooling branch
    block = next((n for n, t, v in p.watched if t is last and v == now and name.startswith(n + ".")), None)
    if block is None or last.shape[1:] != out.shape[1:] or sum(1 for n, _, _ in p.watched if n == block) > 1:
        return keep
    dw = next((n for n, _, _ in reversed(p.watched) if n.startswith(block + ".") and _depthwise(p.modules.get(n))),
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


def _is_attention(m: nn.Module) -> bool:
    """A token-mixing attention: ``nn.MultiheadAttention``, or a class named like one (``...Attention``,
    ``...Attn``: CaiT's ``TalkingHeadAttn``, ``ClassAttn``; ConViT's ``MHSA``, ``GPSA``), not a block holding one."""
    kind = type(m).__name__
    if isinstance(m, nn.MultiheadAttention):
        return True
    named = "Attention" in kind or "Attn" in kind or kind.endswith(_ATTENTION_ENDS)
    return named and "Block" not in kind and not kind.endswith(_NOT_ATTENTION_ENDS)


def _in_blocks(name: str, modules: dict[str, nn.Module]) -> bool:
    """Does module ``name`` sit in a repeated block: a child of an ``nn.ModuleList``, or of an ``nn.Sequential``
    whose children are all of one class (not, say, a pooling head's attention after the encoder)?"""
    parts = name.split(".")
    for i in range(1, len(parts)):
        box = modules.get(".".join(parts[:i]))
        if isinstance(box, nn.ModuleList) or (
                isinstance(box, nn.Sequential) and len({type(c) for c in box.children()}) == 1):
            return True
    return False


def _attentions(p: _Pass) -> list[tuple[int, str, str]]:
    """``(index in p.order, outermost name, innermost name)`` of every attention that ran, in order: the index
    of the last start of the innermost attention in it; those in repeated blocks only, if any are (SigLIP's
    pooling head runs one after the encoder)."""
    starts = [(i, n) for i, (start, n, m, _) in enumerate(p.order) if start and _is_attention(m)]
    ran = {n for _, n in starts}
    last: dict[str, tuple[int, str]] = {}
    for i, inner in starts:  # an attention inside an attention (HF's SelfAttention, MaxViT's partition)
        att = inner
        while "." in att and att.rsplit(".", 1)[0] in ran:
            att = att.rsplit(".", 1)[0]
        last[att] = (i, inner)
    found = sorted((i, n, inner) for n, (i, inner) in last.items())
    inside = [a for a in found if _in_blocks(a[1], p.modules)]
    return inside or found


def _before_attention(p: _Pass, size: tuple[int, int]) -> tuple[str | None, str]:
    """The norm that ran last before the last attention-like module, in the same block, and why; ``None``
    and why not when no attention ran or that norm's output is no grid of the input (MaxViT's windows).

    The last attention in repeated blocks (a module list) counts; with none there, the last one that has a
    norm before it in its block. No such norm before the last attention of the blocks (post-norm: Swin V2,
    torch's ``norm_first=False``) is refused."""
    atts = _attentions(p)
    if not atts:
        return None, ""
    blocks = _in_blocks(atts[-1][1], p.modules)
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


def _run(model: nn.Module, inner: nn.Module, fresh: Callable[[], torch.Tensor], kw: dict[str, Any],
         chosen: list[tuple[str, nn.Module]] | None, method: str, probe: bool,
         size: tuple[int, int]) -> tuple[_Pass, list[tuple[str, nn.Module]], int, str | None]:
    """The hooked forward pass; finds the layer when none was chosen. Returns (pass, layers, model calls, why
    the layer was chosen: ``None`` when it was given).

    ``probe``: also record what tells the chosen layers' layouts (see :class:`._layout.LayoutProbe`).
    """
    heads = _of_type(inner, nn.Linear) if method == "cam" else []
    if chosen is not None:
        return _hooked_forward(model, fresh(), kw, chosen, [], heads, inner if probe else None), chosen, 1, None
    # Watch without copying, then use the layer's output as it is if nothing rewrote it in place.
    watch = _of_type(inner, nn.Module)
    p = _hooked_forward(model, fresh(), kw, [], watch, heads)
    p.modules = dict(watch)
    norm, why = (None, "") if method == "cam" else _before_attention(p, size)
    if norm is not None:  # its layout (tokens, channels last) is probed in a pass that keeps it
        found = [(norm, p.modules[norm])]
        return _hooked_forward(model, fresh(), kw, found, [], heads, inner), found, 2, f"{norm} ({why})"
    if method == "cam":
        name, why = _gap_source(p, type(inner).__name__), "the layer the head pools"
    else:
        name, conv = _last_conv(p, type(inner).__name__)
        why = conv + why
    found = [(name, p.modules[name])]
    _, t, version = next(w for w in reversed(p.watched) if w[0] == name)
    p.order, p.watched = [], []  # hold no other layer's output any longer
    if t._version == version:
        p.kept = {name: [t]}
        return p, found, 1, f"{name} ({why})"
    # an in-place op rewrote that output after the layer ran: run again, keeping a copy of it
    return _hooked_forward(model, fresh(), kw, found, [], heads), found, 2, f"{name} ({why})"


def _reaches(t: torch.Tensor, target: torch.Tensor) -> bool:
    """Does ``t``'s autograd graph reach the tensor ``target`` (its graph node, or itself as a leaf)?"""
    node = target.grad_fn
    seen: dict[int, Any] = {}  # keeps nodes alive so their ids stay unique
    stack = [t.grad_fn]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen[id(n)] = n
        if n is node or getattr(n, "variable", None) is target:
            return True
        stack.extend(m for m, _ in n.next_functions)
    return False


def _as_4d(name: str, t: torch.Tensor, reshape: Callable[[torch.Tensor], torch.Tensor] | None, B: int) -> torch.Tensor:
    if reshape is not None:
        try:
            t = reshape(t)
        except Exception as e:
            raise HookscopeError(f"reshape= failed on layer {name!r}'s output of shape {tuple(t.shape)}: "
                                 f"{type(e).__name__}: {first_line(e)}") from None
    if not isinstance(t, torch.Tensor) or t.ndim != 4 or t.shape[0] != B:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        fix = "make reshape= return" if reshape is not None else "pass reshape= a function to"
        raise HookscopeError(f"layer {name!r} gives an activation of shape {shape}, not B x C x h x w (B={B}); "
                             f"{fix} B x C x h x w, e.g. reshape=hookscope.tokens_to_grid(skip=1) "
                             "for ViT tokens (CLI: --tokens 1)")
    return t


def _normalise(m: torch.Tensor) -> torch.Tensor:
    """Min-max per image; a constant map becomes all zeros."""
    flat = m.flatten(1)
    lo = flat.amin(1).view(-1, 1, 1)
    span = flat.amax(1).view(-1, 1, 1) - lo
    return (m - lo) / torch.where(span > 0, span, torch.ones_like(span))


def _check_method(method: str) -> str:
    key = method.lower().replace("-", "").replace("_", "") if isinstance(method, str) else ""
    if key not in METHODS:
        raise HookscopeError(f"method={method!r} is not a CAM method.{did_you_mean(str(method), METHODS)} "
                             f"Use one of {', '.join(METHODS)}")
    return key


def _check_call(model: nn.Module, inputs: Any, method: str, target: Target, fuse: str, batch_size: int) -> nn.Module:
    inner, _ = unwrap(model)
    if fuse not in ("mean", "max"):
        raise HookscopeError(f"fuse={fuse!r} is not a fusion; use 'mean' or 'max'")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size!r} must be a positive int")
    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 3:
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"inputs of shape {shape} have no spatial size; pass a B x C x H x W batch")
    if is_function(target) and method == "cam":
        raise HookscopeError("method='cam' weighs channels by the head's row of a class, so it needs class-index "
                             "targets (int, list or None), not a function; use 'gradcam' for a target function")
    if method == "scorecam" and not inputs.is_floating_point():
        raise HookscopeError(f"scorecam multiplies the inputs by masks, so they must be floating point, not {inputs.dtype}")
    coupled = batch_coupled(inner)
    if method == "scorecam" and coupled is not None and (inputs.shape[0] > 1 or batch_size > 1):
        raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so a masked "
                             "input's score would depend on the others in its batch; pass one image with "
                             "batch_size=1, or use a gradient method")
    return inner


def _scores(target: Target, output: Callable[[Any], torch.Tensor] | None, out: Any, B: int, method: str
            ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(score of each sample, class targets, logits) read from the model's output; None where not read."""
    if is_function(target):
        return user_scores(cast(Callable[[Any], Any], target), output, out, B, f"a batch of {B}"), None, None
    try:
        logits = read_logits(output, out, B)
    except HookscopeError:
        if method == "eigencam" and target is None:  # Eigen-CAM needs no score: none read is fine
            return None, None, None
        raise
    targets = logits.argmax(1) if target is None else class_targets(target, B, logits.shape[1], logits.device)
    return logits.gather(1, targets.unsqueeze(1)).squeeze(1), targets, logits


def _scorer(model: nn.Module, target: Target, output: Callable[[Any], torch.Tensor] | None,
            targets: torch.Tensor | None, kw: dict[str, Any], B: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Score-CAM's scores of a batch of masked inputs; ``rows`` are their samples (one input: every row)."""
    # keyword inputs, or a target's data (hookscope.targets), with a row per sample go with each masked input
    spread = per_sample(kw, B) or callable(getattr(target, "take", None))

    def scores(batch: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if spread and batch.shape[0] != len(rows):  # the zero image differs per sample only by its kwargs
            batch = batch.expand(len(rows), *batch.shape[1:]).contiguous()  # rows the model may write
        out = call_model(model, (batch,), private(rows_of(kw, rows, B) if spread else kw))
        n = batch.shape[0]
        if targets is None:  # a target function, which scores each row on its own
            fn = cast(Callable[[Any], Any], for_rows(target, rows))
            return user_scores(fn, output, out, n, f"a batch of {n} masked inputs").float().expand(len(rows))
        logits = read_logits(output, out, n).float()
        return logits.expand(len(rows), -1).gather(1, targets[rows].unsqueeze(1)).squeeze(1)

    return scores


def _gradient_maps(method: str, acts: dict[str, torch.Tensor], A: dict[str, torch.Tensor], score: torch.Tensor,
                   shapers: dict[str, Callable[[torch.Tensor], torch.Tensor] | None], coupled: str | None,
                   logits: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The maps, and one note per layer where the score's gradient is exactly zero for some sample."""
    G = _layer_grads(acts, score, shapers, coupled)
    notes = [note for n in acts if (note := _blank(n, G[n], logits))]
    return {n: gradient_map(method, A[n], G[n].to(A[n].dtype)) for n in acts}, notes


def _blank(name: str, G: torch.Tensor, logits: torch.Tensor | None) -> str | None:
    """One line when the score's gradient at a layer is exactly zero for a sample: its map is blank, not an answer."""
    dead = (G.flatten(1).abs().amax(1) == 0).nonzero().flatten().tolist()
    if not dead:
        return None
    equal = logits is not None and bool((logits[dead].amax(1) == logits[dead].amin(1)).all())
    cause = ("all logits are equal: an untrained or zero-initialised head (torchvision's ViT with weights=None)?"
             if equal else "the score does not vary with this layer there (a dead or saturated path?)")
    return (f"the score's gradient at layer {name!r} is exactly zero for sample{'s' if len(dead) > 1 else ''} "
            f"{', '.join(map(str, dead))}, so {'their maps are all zero and say' if len(dead) > 1 else 'its map is all zero and says'} "
            f"nothing; {cause}")


def _flat_scores(name: str, weights: torch.Tensor) -> str | None:
    """One line when every masked input of a sample scored the same (softmax weights all equal, exactly): its
    Score-CAM map is then the plain sum of the channels, whatever the target."""
    flat = ((weights.amax(1) == weights.amin(1)) if weights.shape[1] > 1 else torch.zeros(0, dtype=torch.bool))
    dead = flat.nonzero().flatten().tolist()
    if not dead:
        return None
    return (f"every masked input of sample{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} scores the "
            f"same at layer {name!r}, so all channels weigh the same and the map is the sum of the activations, "
            "not the target's; an untrained or zero-initialised head (all logits equal)?")


def _layer_grads(acts: dict[str, torch.Tensor], score: torch.Tensor,
                 shapers: dict[str, Callable[[torch.Tensor], torch.Tensor] | None],
                 coupled: str | None) -> dict[str, torch.Tensor]:
    """``d score_b / d A_b`` per layer, ``B x C x h x w``: one ``autograd.grad`` of the summed scores, or, when
    the samples of a batch interact (``coupled``: a batch norm on batch statistics), one per sample."""
    names, B = list(acts), score.shape[0]
    rounds = [score.sum()] if coupled is None or B == 1 else list(score.unbind())
    out: dict[str, torch.Tensor] = {}
    for b, s in enumerate(rounds):
        grads = (torch.autograd.grad(s, [acts[n] for n in names], allow_unused=True, retain_graph=b + 1 < len(rounds))
                 if score.requires_grad else [None] * len(names))
        for n, g in zip(names, grads):
            if g is None:
                raise HookscopeError(f"layer {n!r}'s output does not reach the target score (no gradient "
                                     "flows back to it); pick a layer the score depends on")
            G = _as_4d(n, g, shapers[n], B)
            rows = slice(None) if len(rounds) == 1 else slice(b, b + 1)
            if shapers[n] is not None:  # a reshape (yours, or the token layout's) may drop tokens
                lost = (G[rows].flatten(1).abs().amax(1) == 0) & (g[rows].flatten(1).abs().amax(1) > 0)
                if bool(lost.any()):
                    raise HookscopeError(
                        f"layer {n!r}: the score's gradient reaches only positions that reshape= drops (sample "
                        f"{int(lost.nonzero()[0, 0]) + (rows.start or 0)}), such as a class token the head "
                        "reads; pick a layer before the last mixing of tokens, e.g. the last block's first norm")
            if len(rounds) == 1:
                out[n] = G
            else:
                out.setdefault(n, torch.zeros_like(G))[b] = G[b]
    return out


def cam(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    layers: Selector | Sequence[Selector] | None = None,
    method: str = "gradcam",
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    reshape: Callable[[torch.Tensor], torch.Tensor] | None = None,
    fuse: str = "mean",
    batch_size: int = 16,  # 224x224 chunks of 16 beat 64 on the CPU (bench/RESULTS.md)
    progress: bool | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> CamMaps:
    """Class activation maps of a batch, one per image, in one forward pass (Score-CAM: plus its masked inputs).

    With ``A_k`` the layer's activation channels and ``g = d score / d A`` (gradient methods):

    ====================  ==============================================================================
    ``"cam"``             Zhou et al. 2016: ``sum_k W[c, k] A_k``, ``W`` the linear head after a global
                          average pool (checked: the head's input must be the layer's spatial mean);
                          no ReLU, as in the paper. ``layers=None`` finds the layer the head pools.
    ``"gradcam"``         Selvaraju et al. 2017: ``relu(sum_k mean_ij(g_k) A_k)``.
    ``"gradcam++"``       Chattopadhay et al. 2018 (eq. 19): ``alpha = g^2 / (2 g^2 + sum_ab A_kab g^3)``,
                          ``w_k = sum_ij alpha relu(g)``, ``relu(sum_k w_k A_k)``. Neither peer
                          follows eq. 19 exactly (bench/RESULTS.md): pytorch-grad-cam adds 1e-6 to
                          the denominator, not small next to ``g^2`` (~2.6e-7 on resnet18
                          ``layer4``), 4.6e-2 apart; torchcam's alpha stays ``g^2``, 6.1e-2 apart.
    ``"xgradcam"``        Fu et al. 2020: ``w_k = sum_ij(A_k g_k) / sum_ij A_k``, ``relu(sum_k w_k A_k)``.
    ``"hirescam"``        Draelos & Carin 2020: ``relu(sum_k g_k * A_k)``.
    ``"layercam"``        Jiang et al. 2021: ``relu(sum_k relu(g_k) * A_k)``.
    ``"scorecam"``        Wang et al. 2020, Algorithm 1 (as pytorch-grad-cam): masks
                          ``H_k = minmax(upsample(A_k))`` (bilinear, align_corners=True),
                          ``w = softmax_k(score(X * H_k))``, ``relu(sum_k w_k A_k)``. Masked inputs run
                          in ``batch_size`` chunks under ``no_grad``; channels with equal masks share
                          one forward, constant channels (zero masks) share one forward of a zero image.
    ``"eigencam"``        Muhammad & Yeasin 2020: ``relu`` of the projection of the channel-centred
                          activations on their first principal component, sign fixed so the loadings
                          sum to >= 0. Needs no gradient and no target.
    ====================  ==============================================================================

    The model runs in eval mode (every module's flag, and the random generator, are put back
    afterwards), so batch norm uses its running statistics, dropout is off, and the samples of a
    batch do not interact: the score of sample ``b`` is ``logits[b, target_b]`` and one
    ``torch.autograd.grad(score.sum(), activations)`` gives each sample's own gradient. Maps are upsampled bilinearly (align_corners=False) to the
    input's ``H x W`` and normalised per image as ``(m - min) / (max - min)``; a constant map becomes
    all zeros. A layer whose output does not depend on the input, or (but for Eigen-CAM) does not
    reach the score, is refused. A batch norm that keeps no running statistics
    (``track_running_stats=False``) mixes the samples even in eval mode: gradient methods then take
    one gradient per sample (``d score_b / d A_b``), and Score-CAM is refused for more than one image.
    Formulas run in float32 (float64 for float64 models), so ``maps`` and ``raw`` are float32 for
    float16 / bfloat16 models.

    A 4-D activation is ``B x C x h x w`` or, as Swin's stages and the inside of ConvNeXt blocks,
    ``B x h x w x C`` (channels last, then permuted first; ``CamMaps.layouts`` says which). Told by
    the modules around the layer: the last one of known layout to run inside it (``Conv2d``,
    ``BatchNorm2d``, pooling: first; ``Linear``, ``LayerNorm`` over the last dimension, torchvision's
    ``Permute``: by their dimensions; for a ReLU-like layer, the one that made its input) and the
    ones that read its output; failing both, the one reading whose ``h x w`` grid has the input's
    aspect ratio. Modules that disagree, or two readings that both fit, give one line asking for
    ``reshape=channels_last`` or ``reshape=channels_first``.

    A 3-D activation ``B x N x C`` (a ViT's, DeiT's or Swin's tokens) is read as ``k`` prefix tokens
    (class, distillation, registers; dropped from the activation and its gradient) then an ``h x w``
    grid row by row, when that is certain: ``k`` from the model (timm's ``num_prefix_tokens``, a
    transformers config, the token parameters) and the grid from the patch embedding's ``Conv2d``
    output seen in the pass or, when no ``Conv2d`` of ``C`` channels ran, the input's ``H x W``
    through one integer stride; else a ``Conv2d``'s grid with ``C`` channels and ``k <= 16``; else
    the one strided reading of a ``Linear``/``LayerNorm``'s output with ``k = 0`` or ``k`` the tokens
    of the model's ``1 x n x C`` parameters. Two readings, or none, a patch embedding's grid no
    reading matches (MAE's masking), or a model that re-orders its tokens (Hiera, ViTMAE) give one
    line asking for ``reshape=hookscope.tokens_to_grid(skip=K)`` (CLI: ``--tokens K``, ``--grid HxW``
    when not square). A 4-D reading the modules tell must also give a grid of the input's aspect
    ratio. A ``torch.compile``'d model runs with the hooks eager between graph pieces. A sample whose score's
    gradient at the layer is exactly zero (all logits equal: an untrained head) gets an all-zero
    map and a warning, kept in ``CamMaps.notes``.

    Args:
        model: any ``nn.Module`` (wrappers such as DataParallel are seen through).
        inputs: ``B x C x H x W`` batch (copied: your tensor is never written to).
        layers: a layer selector (name, glob, type, module...) or a list of them; several layers give
            maps that are upsampled, normalised and fused. ``None``: found in a first pass and stated
            in ``CamMaps.chosen`` (and ``table()``): for a transformer (an ``nn.MultiheadAttention``
            or a class named ``...Attention``, ``...Attn``, ``MHSA``, ``GPSA`` ran), the norm that ran
            last before the last attention of the repeated blocks (a module list; a pooling head's
            attention after them does not count) in its block, i.e. the input of the last token
            mixing, as the CAM literature (ViT ``blocks[-1].norm1``, Swin
            ``layers[-1].blocks[-1].norm1``); a post-norm one (Swin V2) is refused; else the last
            ``nn.Conv2d`` with a spatial output in execution order, or, when it sits in a block with a
            depthwise ``Conv2d`` before the block's residual add (ConvNeXt: the depthwise conv or
            timm's 1 x 1 ``mlp.fc2``), that block's output; ``"cam"``: the layer the head pools.
        method: one of :data:`METHODS` (``"Grad-CAM++"`` and ``"grad_cam"`` spellings accepted).
        target: ``None`` (each sample's predicted class, from the same forward pass), a class index
            for all, one index per sample (also as an object with a ``class_index``, such as
            ``hookscope.targets.Class``), or a function of the model's output (through ``output``
            if given) returning ``B`` scores, e.g. a segmentation region's summed logit or a cosine
            similarity to an embedding. Score-CAM calls the function on the outputs of batches of
            masked inputs too, so it must score each row on its own.
        output: picks ``B x classes`` logits from the model's output, e.g. ``lambda o: o.logits``.
        reshape: turns the activation into ``B x C x h x w``; applied to the activation and to its
            gradient, and no layout is guessed then. :func:`tokens_to_grid` for ``B x tokens x C``,
            :func:`channels_last` / :func:`channels_first` to say what a 4-D layer holds.
        fuse: ``"mean"`` or ``"max"`` over layers.
        batch_size: Score-CAM's masked inputs per forward.
        progress: Score-CAM progress bar (tqdm if installed, else a counter on stderr); ``None``:
            shown when stderr is a terminal and the first batch says the whole run will take over
            5 seconds.
        kwargs: keyword inputs of the model, e.g. ``{"attention_mask": m}``. A tensor with ``B`` rows
            goes with its samples: Score-CAM's masked inputs get the rows of the images they mask.

    Returns:
        A :class:`CamMaps`.

    Raises:
        ForwardError: the model's forward pass failed (one line: the module, what it received).
        HookscopeError: a layer, target, method or argument that cannot work, in one line.

    Example:
        >>> import torch, hookscope.zoo
        >>> net = hookscope.zoo.TinyResNet().eval()
        >>> res = cam(net, torch.randn(2, 3, 32, 32), layers="layer2", method="gradcam")
        >>> res.maps.shape, res.raw["layer2"].shape, res.layers
        (torch.Size([2, 32, 32]), torch.Size([2, 16, 16]), ['layer2'])
    """
    method = _check_method(method)
    index = getattr(target, "class_index", None)  # hookscope.targets.Class: its class, an int or a list of ints
    if isinstance(index, (list, tuple)) and len(index) == 1:  # Class([3]): one row for every sample
        index = index[0]
    target = target if index is None else index
    kw = model_kwargs(kwargs)
    inner = _check_call(model, inputs, method, target, fuse, batch_size)
    chosen = None if layers is None else select(model, cast(Selector, layers))  # lists are flattened there
    if chosen is not None:
        check_hookable(chosen)
    # In eval already, no flag changes: only the random stream is kept, since restored() would write
    # every module's flag back (0.5 ms on resnet50 at batch 1, measured: 0.7% of the forward).
    kept = restored(model, train=False) if any(m.training for m in model.modules()) else kept_rng(([], None))
    with kept, torch.inference_mode(False), torch.enable_grad():
        res = _cam(model, inner, inputs, kw, chosen, method, target, output, reshape, fuse, batch_size, progress)
    for note in res.notes:  # a blank map must not pass for an answer: said here, and kept in res.notes
        warnings.warn(note, UserWarning, stacklevel=2)
    return res


def _activations(p: _Pass, chosen: list[tuple[str, nn.Module]], leaf: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Each chosen layer's one output, checked to depend on the input (``leaf``; ``None``: integer inputs)."""
    acts: dict[str, torch.Tensor] = {}
    for name, _ in chosen:
        got = p.kept[name]
        if len(got) != 1 or got[0] is None:
            what = "did not run" if not got else f"ran {len(got)} times" if len(got) > 1 else "returned no tensor"
            raise HookscopeError(f"layer {name!r} {what} in the forward pass; CAM needs one tensor "
                                 "output per layer, so pick a layer that runs once")
        if leaf is not None and not _reaches(got[0], leaf):
            raise HookscopeError(f"layer {name!r}'s output does not depend on the input, so its map says "
                                 "nothing about the image; pick a layer on the path from input to output")
        acts[name] = got[0]
    return acts


def _cam(model: nn.Module, inner: nn.Module, inputs: torch.Tensor, kw: dict[str, Any],
         chosen: list[tuple[str, nn.Module]] | None, method: str, target: Target,
         output: Callable[[Any], torch.Tensor] | None, reshape: Callable[[torch.Tensor], torch.Tensor] | None,
         fuse: str, batch_size: int, progress: bool | None) -> CamMaps:
    B, size = inputs.shape[0], (inputs.shape[-2], inputs.shape[-1])
    original = inputs.detach().clone()  # what Score-CAM masks, whatever the model writes into its input
    leaf = original.detach().requires_grad_() if original.is_floating_point() else None
    base = leaf if leaf is not None else original

    def fresh() -> torch.Tensor:  # the model may write into its input: ours, never the caller's
        return base.clone()

    probed = chosen is not None and reshape is None
    coupled = batch_coupled(inner)  # samples that interact: gradient methods take one gradient per sample
    p, chosen, forwards, why = _run(model, inner, fresh, kw, chosen, method, probed, size)
    acts = _activations(p, chosen, leaf)
    shapers, layouts = _shapers(acts, p, reshape, prefix_tokens(inner) if p.probed else None, size)
    A = {n: _work(_as_4d(n, a.detach(), shapers[n], B)) for n, a in acts.items()}
    score, targets, logits = _scores(target, output, p.output, B, method)
    if method not in GRADIENT_METHODS:  # gradient methods find out from autograd.grad itself
        ends = [score] if score is not None else [t for t in tensors(p.output) if t.grad_fn is not None]
        for n, a in acts.items():
            if not any(_reaches(e, a) for e in ends):
                what = "the target score" if score is not None else "the model's output"
                raise HookscopeError(f"layer {n!r}'s output does not reach {what}; pick a layer the output depends on")
    masked = 0
    notes: list[str] = []
    if method in GRADIENT_METHODS:
        raw, notes = _gradient_maps(method, acts, A, score, shapers, coupled, logits)  # type: ignore[arg-type]
    elif method == "eigencam":
        raw = {n: eigen_map(a) for n, a in A.items()}
    elif method == "cam":
        raw = {n: _cam_rows(n, a, p, logits, targets) for n, a in A.items()}  # type: ignore[arg-type]
    else:
        raw = {}
        # anchored: a region predicted on the inputs stays put on the masked ones, a box lost there scores 0
        scorer = _scorer(model, anchored(target, output, p.output), output, targets, kw, B)
        for n, a in A.items():
            weights, runs, calls = score_weights(scorer, original, a, batch_size=batch_size, progress=progress)
            raw[n] = torch.einsum("bk,bkhw->bhw", weights, a).clamp(min=0)
            notes += [note] if (note := _flat_scores(n, weights)) else []
            masked, forwards = masked + runs, forwards + calls
    ups = [_normalise(F.interpolate(r.unsqueeze(1), size=size, mode="bilinear", align_corners=False).squeeze(1))
           for r in raw.values()]
    if len(ups) == 1:  # already normalised
        maps = ups[0]
    else:
        stacked = torch.stack(ups)
        maps = _normalise(stacked.mean(0) if fuse == "mean" else stacked.amax(0))
    return CamMaps(maps=maps, raw=raw, targets=targets,
                     scores=None if score is None else score.detach(), layers=list(raw), method=method,
                     forwards=forwards, masked=masked, layouts=layouts, chosen=why, notes=notes)


def _cam_rows(name: str, A: torch.Tensor, p: _Pass, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CAM's map after checking that the model ends in GAP + the linear head whose rows it uses."""
    if p.head is None:
        raise HookscopeError("method='cam' needs a global-average-pool + nn.Linear head, and no nn.Linear "
                             "ran in the forward pass; use method='gradcam'")
    hname, head, hin, hout = p.head
    pooled = A.mean((2, 3))
    if not (isinstance(hin, torch.Tensor) and hin.shape == pooled.shape and _close(hin, pooled)):
        raise HookscopeError(f"method='cam' needs the head {hname!r} to read the global average of layer "
                             f"{name!r}, and it does not; pick the layer the head pools, or use method='gradcam'")
    if not (hout is logits or (isinstance(hout, torch.Tensor) and hout.shape == logits.shape
                               and torch.allclose(hout, logits))):
        raise HookscopeError(f"method='cam' uses the rows of {hname!r}, but the logits are not that layer's "
                             "output; pass output= that returns it, or use method='gradcam'")
    return cam_map(cast(torch.Tensor, head.weight).detach()[targets], A)
