"""Pictures of what hookscope recorded. Takes tensors and records, never registers a hook.

matplotlib and pillow come from the viz extra (``pip install 'hookscope[viz]'``) and are imported
only when a picture is drawn, so ``import hookscope.viz`` works without them.

Example:
    >>> import torch
    >>> from hookscope.viz import overlay
    >>> overlay(torch.zeros(3, 2, 2), torch.zeros(2, 2), alpha=0.0).abs().sum().item()
    0.0
"""

from .overlay import as_image, overlay, save_overlay

__all__ = ["as_image", "overlay", "save_overlay"]
