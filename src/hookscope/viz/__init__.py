"""Pictures of what hookscope recorded. Takes tensors and results, never registers a hook itself.

matplotlib and pillow come from the viz extra (``pip install 'hookscope[viz]'``) and are imported
only when a picture is drawn, so ``import hookscope.viz`` works without them.

Example:
    >>> import torch
    >>> from hookscope.viz import overlay
    >>> overlay(torch.zeros(3, 2, 2), torch.zeros(2, 2), alpha=0.0).abs().sum().item()
    0.0
"""

from .overlay import as_image, overlay, save_overlay
from .features import comparison_grid, feature_grid, plot_feature_maps, plot_reference_comparison, save_feature_maps
from .plots import plot_cams, plot_diff, plot_gradient_flow, plot_trace, save_figure
from .runs import plot_run
from .cam_signals import plot_cam_curves, plot_cam_slices
from . import _pictures  # noqa: F401 - registers the pictures results show in notebooks
from .checks import plot_randomisation, plot_road  # registers the checks' pictures too

__all__ = ["as_image", "overlay", "save_overlay", "plot_cams", "plot_diff", "plot_gradient_flow", "plot_trace",
           "plot_run", "save_figure", "comparison_grid", "feature_grid", "plot_feature_maps", "plot_reference_comparison",
           "save_feature_maps", "plot_randomisation", "plot_road", "plot_cam_curves", "plot_cam_slices"]
