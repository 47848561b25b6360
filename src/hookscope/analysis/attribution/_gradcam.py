"""Guided Grad-CAM (Selvaraju et al. 2017): the guided-backpropagation map times Grad-CAM's, upsampled.

The definition is captum's ``GuidedGradCam``: Grad-CAM at one layer's output ``A`` (``B x C x h x
w``), ``relu(sum_c mean_hw(dS/dA)[c] * A[c])``, not normalised, upsampled to the inputs' ``H x W``
(bilinearly, ``align_corners=False``: the paper's choice, captum's ``interpolate_mode="bilinear"``)
and multiplied into every channel of the guided-backpropagation map.

With no layer given, the layer is the last ``nn.Conv2d`` to run with a spatial output, as
:func:`hookscope.cam` picks it for ordinary CNNs (ResNet, VGG, DenseNet, MobileNet, EfficientNet); where
that convolution is depthwise (ConvNeXt), cam explains the block holding it, which is then asked for by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...core.compiled import eager, is_compiled
from ...core.hooks import HookGroup
from ...core.text import shape_text
from ...errors import HookscopeError
from ...selection import named_modules, unwrap
from ._engine import Job, Pass, grad, leaf, probe, run
from ._guided import guided_backprop

__all__ = ["grad_cam", "guided_gradcam"]

_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}  # the layer's dims -> its upsampling


def guided_gradcam(job: Job, p: Pass, s: object) -> tuple[torch.Tensor, None, int]:
    """Guided backpropagation's map times Grad-CAM's at ``job.layer`` (found when ``None``), upsampled."""
    if not job.x.is_floating_point():
        raise HookscopeError(f"method='guided_gradcam' takes images, not inputs of dtype {job.x.dtype}: guided "
                             "backpropagation differentiates at the inputs; pass float inputs")
    forwards = 1
    if job.layer is None:  # the first pass ran without a stand-in: find the layer, then run with one there
        job = dataclasses.replace(job, layer=_last_conv(job))
        p = probe(job, leaf, count=False)
        forwards += 2
    assert job.layer is not None and p.scores is not None
    act = p.kept[0]
    if act.ndim != job.x.ndim or act.ndim not in _MODES or act.shape[2:].numel() < 2:
        raise HookscopeError(f"layer {job.layer[0]!r} gives {shape_text(tuple(act.shape))}, not channels over a "
                             f"grid like the inputs' {shape_text(tuple(job.x.shape))}, so Grad-CAM has no map to "
                             f"upsample; pass layers= {_a_conv(job.model)}")
    cam = grad_cam(act.detach(), grad(job, p.scores, act))
    guided, _, more = guided_backprop(job, p, s)
    maps = _wide(guided) * F.interpolate(cam, size=tuple(job.x.shape[2:]), mode=_MODES[cam.ndim],
                                         align_corners=False)
    return maps, None, forwards + more


def grad_cam(act: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``B x 1 x h x w`` Grad-CAM of a layer's output ``act`` (``B x C x h x w``) and its gradient ``g``:
    ``relu(sum_c mean_hw(g)[c] * act[c])``, in at least float32, not normalised (as captum's ``LayerGradCam``).

    Example:
        >>> act = torch.arange(8.0).view(1, 2, 2, 2)
        >>> g = torch.tensor([1.0, -0.5]).view(1, 2, 1, 1).expand(1, 2, 2, 2)
        >>> grad_cam(act, g).flatten().tolist()
        [0.0, 0.0, 0.0, 0.0]
        >>> grad_cam(act, g.abs()).flatten().tolist()
        [2.0, 3.5, 5.0, 6.5]
    """
    act, g = _wide(act), _wide(g)
    weights = g.mean(dim=tuple(range(2, g.ndim)), keepdim=True)  # each channel's mean gradient
    return (weights * act).sum(dim=1, keepdim=True).clamp(min=0)


def _a_conv(model: nn.Module) -> str:
    """The last ``nn.Conv2d`` of the model, in module order, as a layer to name in an error."""
    convs = [n for n, m in named_modules(unwrap(model)[0]) if isinstance(m, nn.Conv2d)]
    return f"a convolution, e.g. layers={convs[-1]!r}" if convs else "a layer whose output is B x C x h x w"


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _last_conv(job: Job) -> tuple[str, nn.Module]:
    """The last ``nn.Conv2d`` to run with an ``h x w > 1`` output, found in a forward pass without gradients."""
    inner = unwrap(job.model)[0]
    ran: list[tuple[str, nn.Module, tuple[int, ...]]] = []
    group, sees = HookGroup(), job.scope.sees

    def noted(n: str, mod: nn.Module, out: Any) -> None:
        if sees():  # not another thread's call on the same model
            ran.append((n, mod, tuple(out.shape)))

    if is_compiled(job.model):  # the thread check is Python state Dynamo cannot trace
        noted = eager(noted)

    try:
        for n, m in named_modules(inner):
            if isinstance(m, nn.Conv2d):
                # own hook: only the output's shape is read, in the order the convolutions run (capture keeps tensors)
                group.add(m.register_forward_hook(lambda mod, a, out, n=n: noted(n, mod, out)))
        with torch.no_grad():
            run(dataclasses.replace(job, layer=None), job.x, torch.arange(job.batch, device=job.x.device), None)
    finally:
        group.remove()
    spatial = [(n, m) for n, m, shape in ran if len(shape) == 4 and shape[2] * shape[3] > 1]
    if not spatial:
        raise HookscopeError(f"no nn.Conv2d with a spatial output (h x w > 1) ran in {type(inner).__name__}'s "
                             "forward pass; pass layers= the layer to take Grad-CAM at (see hookscope.names(model))")
    name, conv = spatial[-1]
    if sum(1 for n, _ in spatial if n == name) > 1:
        raise HookscopeError(f"the last convolution {name!r} ran more than once in the forward pass; Grad-CAM needs "
                             "one output, so pass layers= a layer that runs once")
    if isinstance(conv, nn.Conv2d) and conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels:
        raise HookscopeError(f"the last convolution {name!r} is depthwise (ConvNeXt-like): Grad-CAM should explain "
                             "the block holding it; pass layers= that block, as hookscope.cam(model, x).layers names it")
    return name, conv
