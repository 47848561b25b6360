"""Class activation maps for a batch in one call: CAM, Grad-CAM, ++, XGrad, HiRes, Layer, Score, Eigen.

One forward pass with forward hooks (a :class:`~hookscope.core.hooks.HookGroup`, removed in
``finally``) keeps each target layer's activation with its autograd graph; gradient methods then
call ``torch.autograd.grad`` on those activations only. No ``.backward()``, no parameter ``.grad``
written, no ``zero_grad``; train/eval flags untouched; works on frozen models and under an outer
``torch.no_grad()`` or ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._tree import first_tensor, tree_map
from ..capture import check_hookable
from ..core.hooks import HookGroup
from ..errors import HookscopeError, did_you_mean
from ..selection import Selector, layers, unwrap
from ._cam_methods import GRADIENT_METHODS, cam_map, eigen_map, gradient_map, score_weights

__all__ = ["METHODS", "CamResult", "cam"]

METHODS = ("cam", "gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "scorecam", "eigencam")

Target = int | Sequence[int] | torch.Tensor | Callable[[Any], torch.Tensor] | None


@dataclass
class CamResult:
    """What :func:`cam` returns.

    Attributes:
        maps: ``B x H x W``, upsampled (bilinear) to the input's spatial size, min-max normalised
            per image to [0, 1] (several layers: fused, then normalised again).
        raw: per layer name, the ``B x h x w`` map before upsampling and normalisation (after ReLU
            where the method has one).
        targets: ``B`` long tensor of the class indices used (``None`` when target is a callable).
        scores: ``B`` scores of the targets (the model's output read through ``output``), detached.
        layers: qualified names of the layers used (names of the unwrapped model).
        method: the method's name, as in :data:`METHODS`.
        forwards: how many forward passes of the model were run (Score-CAM: 1 + its masked inputs).
    """

    maps: torch.Tensor
    raw: dict[str, torch.Tensor]
    targets: torch.Tensor | None
    scores: torch.Tensor
    layers: list[str]
    method: str
    forwards: int = 1


class _Pass:
    """What one hooked forward pass left behind."""

    def __init__(self, keep: list[tuple[str, nn.Module]]) -> None:
        self.output: Any = None
        self.kept: dict[str, list[torch.Tensor | None]] = {n: [] for n, _ in keep}
        self.watched: list[tuple[str, torch.Tensor, int]] = []  # (name, output, its version), in finish order
        self.head: tuple[str, nn.Module, Any, Any] | None = None  # the last nn.Linear call


def _keeper(store: list[torch.Tensor | None], make_leaf: bool) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        t = first_tensor(output)
        if t is None:
            store.append(None)
            return None
        a = t.detach().requires_grad_() if make_leaf and not t.requires_grad else t
        store.append(a)
        # Keep `a`, hand the model a copy: a later in-place op (ReLU(inplace=True), out += identity)
        # would rewrite the kept values and move `a`'s autograd history past it (pytorch/pytorch#61519).
        copy = a.clone()
        return tree_map(lambda u: copy if u is t else u, output)

    return hook


def _watcher(name: str, p: _Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.ndim == 4:
            p.watched.append((name, output, output._version))

    return hook


def _head_watcher(name: str, p: _Pass) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        p.head = (name, module, args[0] if args else None, output)

    return hook


def _hooked_forward(model: nn.Module, x: torch.Tensor, keep: list[tuple[str, nn.Module]],
                    watch: list[tuple[str, nn.Module]], heads: list[tuple[str, nn.Module]],
                    make_leaf: bool) -> _Pass:
    p = _Pass(keep)
    group = HookGroup()
    try:
        for name, module in keep:
            group.add(module.register_forward_hook(_keeper(p.kept[name], make_leaf)))
        for name, module in watch:
            group.add(module.register_forward_hook(_watcher(name, p)))
        for name, module in heads:
            group.add(module.register_forward_hook(_head_watcher(name, p)))
        p.output = model(x)
    finally:
        group.remove()
    return p


def _of_type(inner: nn.Module, kind: type) -> list[tuple[str, nn.Module]]:
    seen: set[int] = set()
    out = []
    for n, m in inner.named_modules():
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
                and torch.allclose(t.mean((2, 3)), hin, rtol=1e-4, atol=1e-5)):
            return name
    raise HookscopeError(f"method='cam' needs a global-average-pool + linear head, but the input of "
                         f"{hname!r} is not the spatial mean of any layer's output; use method='gradcam'")


def _run(model: nn.Module, inner: nn.Module, x: torch.Tensor, chosen: list[tuple[str, nn.Module]] | None,
         method: str, grad: bool) -> tuple[_Pass, list[tuple[str, nn.Module]], int]:
    """The hooked forward pass; finds the layer when none was chosen. Returns (pass, layers, forwards)."""
    heads = _of_type(inner, nn.Linear) if method == "cam" else []
    if chosen is not None:
        return _hooked_forward(model, x, chosen, [], heads, grad), chosen, 1
    # Watch without copying, then use the layer's output as it is if nothing rewrote it in place.
    watch = _of_type(inner, nn.Module if method == "cam" else nn.Conv2d)
    p = _hooked_forward(model, x, [], watch, heads, False)
    if method == "cam":
        name = _gap_source(p, type(inner).__name__)
    elif p.watched:
        name = p.watched[-1][0]
    else:
        raise HookscopeError(f"no nn.Conv2d ran in {type(inner).__name__}'s forward pass; "
                             "pass layer= (see hookscope.names(model))")
    found = [(name, dict(watch)[name])]
    _, t, version = next(w for w in reversed(p.watched) if w[0] == name)
    if t._version == version:
        p.kept = {name: [t]}
        return p, found, 1
    # an in-place op rewrote that output after the layer ran: run again, keeping a copy of it
    return _hooked_forward(model, x, found, [], heads, grad), found, 2


def _depends_on(t: torch.Tensor, leaf: torch.Tensor) -> bool:
    """Does ``t``'s autograd graph reach ``leaf``?"""
    seen: dict[int, Any] = {}  # keeps nodes alive so their ids stay unique
    stack = [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if getattr(node, "variable", None) is leaf:
            return True
        stack.extend(n for n, _ in node.next_functions)
    return False


def _read_logits(output: Callable[[Any], torch.Tensor] | None, out: Any, B: int) -> torch.Tensor:
    if output is None:
        if not isinstance(out, torch.Tensor):
            raise HookscopeError(f"the model returns a {type(out).__name__}, not a logits tensor; pass "
                                 "output= a function that picks B x classes logits, e.g. output=lambda o: o.logits")
        logits = out
    else:
        try:
            logits = output(out)
        except (AttributeError, KeyError, IndexError, TypeError) as e:
            raise HookscopeError(f"output= could not read the model's {type(out).__name__} output "
                                 f"({type(e).__name__}: {e}); fix the output= function") from None
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != B:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise HookscopeError(f"class targets need B x classes logits (B={B}), got {shape}; pass output= "
                             "that returns them, or a callable target that returns one score per sample")
    return logits


def _class_targets(target: Target, logits: torch.Tensor) -> torch.Tensor:
    B, C = logits.shape
    if target is None:
        return logits.argmax(1)
    try:  # ints, lists, tensors, numpy integers and arrays
        if isinstance(target, (bool, str, bytes)):
            raise TypeError
        t = torch.as_tensor(target, device=logits.device)
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"target={target!r} is not a class index, a list of them, a tensor or a function") from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise HookscopeError(f"target must hold integer class indices, got dtype {t.dtype}")
    t = t.long().expand(B) if t.ndim == 0 else t.long().flatten()
    if t.shape[0] != B:
        raise HookscopeError(f"target has {t.shape[0]} class indices for a batch of {B}; give one per sample or one int")
    bad = (t < 0) | (t >= C)
    if bool(bad.any()):
        raise HookscopeError(f"target class {int(t[bad][0])} is out of range: the model has {C} classes (0..{C - 1})")
    return t


def _as_4d(name: str, t: torch.Tensor, reshape: Callable[[torch.Tensor], torch.Tensor] | None, B: int) -> torch.Tensor:
    if reshape is not None:
        try:
            t = reshape(t)
        except Exception as e:
            raise HookscopeError(f"reshape= failed on layer {name!r}'s output of shape {tuple(t.shape)}: "
                                 f"{type(e).__name__}: {e}") from None
    if not isinstance(t, torch.Tensor) or t.ndim != 4 or t.shape[0] != B:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        fix = "make reshape= return" if reshape is not None else "pass reshape= a function to"
        raise HookscopeError(f"layer {name!r} gives an activation of shape {shape}, not B x C x h x w (B={B}); "
                             f"{fix} B x C x h x w, e.g. reshape=lambda t: t[:, 1:].transpose(1, 2)"
                             ".reshape(t.shape[0], -1, 14, 14) for ViT tokens")
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
    if callable(target) and not isinstance(target, torch.Tensor) and method in ("cam", "scorecam"):
        raise HookscopeError(f"method={method!r} needs class-index targets (int, list or None), not a "
                             "function; use a gradient method such as 'gradcam' for a callable target")
    if method == "scorecam" and not inputs.is_floating_point():
        raise HookscopeError(f"scorecam multiplies the inputs by masks, so they must be floating point, not {inputs.dtype}")
    training_bn = next((n for n, m in inner.named_modules()
                        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training), None)
    if training_bn is not None:
        raise HookscopeError(f"batch norm {training_bn!r} is in training mode: it would mix the samples' "
                             "gradients and update its running statistics; call model.eval() first")
    return inner


def cam(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    layer: Selector | Sequence[Selector] | None = None,
    method: str = "gradcam",
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    reshape: Callable[[torch.Tensor], torch.Tensor] | None = None,
    fuse: str = "mean",
    batch_size: int = 16,  # 224x224 chunks of 16 beat 64 on the CPU (bench/RESULTS.md)
    progress: bool | None = None,
) -> CamResult:
    """Class activation maps of a batch, one per image, in one forward pass (Score-CAM: plus its masked inputs).

    With ``A_k`` the layer's activation channels and ``g = d score / d A`` (gradient methods):

    ====================  ==============================================================================
    ``"cam"``             Zhou et al. 2016: ``sum_k W[c, k] A_k``, ``W`` the linear head after a global
                          average pool (checked: the head's input must be the layer's spatial mean);
                          no ReLU, as in the paper. ``layer=None`` finds the layer the head pools.
    ``"gradcam"``         Selvaraju et al. 2017: ``relu(sum_k mean_ij(g_k) A_k)``.
    ``"gradcam++"``       Chattopadhay et al. 2018 (eq. 19): ``alpha = g^2 / (2 g^2 + sum_ab A_kab g^3)``,
                          ``w_k = sum_ij alpha relu(g)``, ``relu(sum_k w_k A_k)``. Neither peer
                          follows eq. 19 exactly (bench/RESULTS.md): pytorch-grad-cam adds 1e-6 to
                          the denominator, not small next to ``g^2`` (~2.6e-7 on resnet18
                          ``layer4``), 4.6e-2 apart; torchcam's alpha stays ``g^2``, 6.1e-2 apart.
    ``"xgradcam"``        Fu et al. 2020: ``w_k = sum_ij(A_k g_k) / sum_ij A_k``, ``relu(sum_k w_k A_k)``.
    ``"hirescam"``        Draelos & Carin 2020: ``relu(sum_k g_k * A_k)``.
    ``"layercam"``        Jiang et al. 2021: ``relu(sum_k relu(g_k) * A_k)``.
    ``"scorecam"``        Wang et al. 2020: masks ``H_k = minmax(upsample(A_k))`` (bilinear,
                          align_corners=True as pytorch-grad-cam), ``w = softmax_k(logit_c(X * H_k))``,
                          ``relu(sum_k w_k A_k)``. Masked inputs run in ``batch_size`` chunks under
                          ``no_grad``; channels with equal masks share one forward, constant channels
                          (zero masks) share one forward of a zero image.
    ``"eigencam"``        Muhammad & Yeasin 2020: ``relu`` of the projection of the channel-centred
                          activations on their first principal component, sign fixed so the loadings
                          sum to >= 0. Needs no gradient and no target.
    ====================  ==============================================================================

    The score of sample ``b`` is ``logits[b, target_b]``; gradients come from one
    ``torch.autograd.grad(score.sum(), activations)``, which gives each sample's own gradient because
    samples do not interact in eval mode (a batch norm in training mode is refused). Maps are
    upsampled bilinearly (align_corners=False) to the input's ``H x W`` and normalised per image as
    ``(m - min) / (max - min)``; a constant map becomes all zeros.

    Args:
        model: any ``nn.Module`` in eval mode (wrappers such as DataParallel are seen through).
        inputs: ``B x C x H x W`` batch (detached and copied; your tensor is not touched).
        layer: a layer selector (name, glob, type, module...) or a list of them; several layers give
            maps that are upsampled, normalised and fused. ``None``: the last ``nn.Conv2d`` in
            execution order (``"cam"``: the layer the head pools).
        method: one of :data:`METHODS` (``"Grad-CAM++"`` and ``"grad_cam"`` spellings accepted).
        target: ``None`` (each sample's predicted class, from the same forward pass), a class index
            for all, one index per sample, or a function of the model's output (through ``output``
            if given) returning ``B`` scores, e.g. a segmentation region's summed logit.
        output: picks ``B x classes`` logits from the model's output, e.g. ``lambda o: o.logits``.
        reshape: turns a non-4-D activation (``B x tokens x C``) into ``B x C x h x w``; applied to
            the activation and to its gradient.
        fuse: ``"mean"`` or ``"max"`` over layers.
        batch_size: Score-CAM's masked inputs per forward.
        progress: Score-CAM progress bar (tqdm if installed); ``None``: only beyond 50 batches.

    Returns:
        A :class:`CamResult`.

    Example:
        >>> import torch, hookscope.zoo
        >>> net = hookscope.zoo.TinyResNet().eval()
        >>> res = cam(net, torch.randn(2, 3, 32, 32), layer="layer2", method="gradcam")
        >>> res.maps.shape, res.raw["layer2"].shape, res.layers
        (torch.Size([2, 32, 32]), torch.Size([2, 16, 16]), ['layer2'])
    """
    method = _check_method(method)
    inner = _check_call(model, inputs, method, target, fuse, batch_size)
    chosen = None if layer is None else layers(model, layer)
    if chosen is not None:
        check_hookable(chosen)
    grad = method in GRADIENT_METHODS
    B, size = inputs.shape[0], (inputs.shape[-2], inputs.shape[-1])
    by_function = callable(target) and not isinstance(target, torch.Tensor)
    with torch.inference_mode(False), (torch.enable_grad() if grad else torch.no_grad()):
        x = inputs.clone() if inputs.is_inference() else inputs.detach()
        leaf = x.requires_grad_() if grad and x.is_floating_point() else None
        if leaf is not None:
            x = leaf.clone()  # the model may write into its input; ours, not the caller's
        p, chosen, forwards = _run(model, inner, x, chosen, method, grad)
        acts: dict[str, torch.Tensor] = {}
        for name, _ in chosen:
            got = p.kept[name]
            if len(got) != 1 or got[0] is None:
                what = "did not run" if not got else f"ran {len(got)} times" if len(got) > 1 else "returned no tensor"
                raise HookscopeError(f"layer {name!r} {what} in the forward pass; CAM needs one tensor "
                                     "output per layer, so pick a layer that runs once")
            acts[name] = got[0]
        A = {n: _as_4d(n, a.detach(), reshape, B) for n, a in acts.items()}
        if by_function:
            score = target(p.output if output is None else output(p.output))  # type: ignore[operator]
            if not isinstance(score, torch.Tensor) or score.shape != (B,):
                got_shape = tuple(score.shape) if isinstance(score, torch.Tensor) else type(score).__name__
                raise HookscopeError(f"the target function returned {got_shape}; it must return one score per sample, shape ({B},)")
            targets = None
        else:
            logits = _read_logits(output, p.output, B)
            targets = _class_targets(target, logits)
            score = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
        raw: dict[str, torch.Tensor] = {}
        if grad:
            for n, a in acts.items():
                if leaf is not None and not _depends_on(a, leaf):
                    raise HookscopeError(f"layer {n!r}'s output does not depend on the input, so its map says "
                                         "nothing about the image; pick a layer on the path from input to output")
            names = list(acts)
            grads = (torch.autograd.grad(score.sum(), [acts[n] for n in names], allow_unused=True)
                     if score.requires_grad else [None] * len(names))
            for n, g in zip(names, grads):
                if g is None:
                    raise HookscopeError(f"layer {n!r}'s output does not reach the target score (no gradient "
                                         "flows back to it); pick a layer the score depends on")
                raw[n] = gradient_map(method, A[n], _as_4d(n, g, reshape, B))
        elif method == "eigencam":
            raw = {n: eigen_map(a) for n, a in A.items()}
        elif method == "cam":
            raw = {n: _cam(n, a, p, logits, targets) for n, a in A.items()}  # type: ignore[arg-type]
        else:
            def forward(batch: torch.Tensor) -> torch.Tensor:
                return _read_logits(output, model(batch), batch.shape[0])

            for n, a in A.items():
                weights, runs = score_weights(forward, x, a, targets, batch_size=batch_size, progress=progress)  # type: ignore[arg-type]
                raw[n] = torch.einsum("bk,bkhw->bhw", weights, a).clamp(min=0)
                forwards += runs
    ups = [_normalise(F.interpolate(r.unsqueeze(1), size=size, mode="bilinear", align_corners=False).squeeze(1))
           for r in raw.values()]
    stacked = torch.stack(ups)
    fused = stacked.mean(0) if fuse == "mean" else stacked.amax(0)
    return CamResult(maps=_normalise(fused), raw=raw, targets=targets, scores=score.detach(),
                     layers=list(raw), method=method, forwards=forwards)


def _cam(name: str, A: torch.Tensor, p: _Pass, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CAM's map after checking that the model ends in GAP + the linear head whose rows it uses."""
    if p.head is None:
        raise HookscopeError("method='cam' needs a global-average-pool + nn.Linear head, and no nn.Linear "
                             "ran in the forward pass; use method='gradcam'")
    hname, head, hin, hout = p.head
    pooled = A.mean((2, 3))
    if not (isinstance(hin, torch.Tensor) and hin.shape == pooled.shape
            and torch.allclose(hin.to(pooled.dtype), pooled, rtol=1e-4, atol=1e-5)):
        raise HookscopeError(f"method='cam' needs the head {hname!r} to read the global average of layer "
                             f"{name!r}, and it does not; pick the layer the head pools, or use method='gradcam'")
    if not (hout is logits or (isinstance(hout, torch.Tensor) and hout.shape == logits.shape
                               and torch.allclose(hout, logits))):
        raise HookscopeError(f"method='cam' uses the rows of {hname!r}, but the logits are not that layer's "
                             "output; pass output= that returns it, or use method='gradcam'")
    return cam_map(head.weight.detach()[targets], A)  # type: ignore[index]
