"""Class activation maps for a batch in one call: seventeen methods (CAM, Grad-CAM and its kin, Score-, Ablation-,
Eigen-, KPCA-, Shapley-, Finer-CAM, FEM, FullGrad ...) on images, signals and volumes.

One forward pass with forward hooks (a :class:`~hookscope.core.hooks.HookGroup`, removed in
``finally``) keeps each target layer's activation with its autograd graph; gradient methods then
call ``torch.autograd.grad`` on those activations only. No ``.backward()``, no parameter ``.grad``
written, no ``zero_grad``; every train/eval flag put back as it was; works on frozen models and
under an outer ``torch.no_grad()`` or ``torch.inference_mode()``.

Collect (``_hooked``: the pass, ``_choose``: the layer when none is given), compute (``_methods``: one table
of methods over ``_formulas``, ``_scorecam``, ``_ablation``, ``_second`` and ``_fullgrad``, with ``_settings``),
result (``_result``); ``_api`` holds :func:`cam` itself.
"""

from ._api import METHODS, cam
from ._methods import readers
from ._result import CamMaps, CamRow
from ._shape import channels_first, channels_last, tokens_to_grid

__all__ = ["METHODS", "CamMaps", "CamRow", "cam", "channels_first", "channels_last", "readers", "tokens_to_grid"]
