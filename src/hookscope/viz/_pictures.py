"""The pictures a notebook shows under a result's table, registered with the result protocol.

The protocol (``core.result``) sits below this layer and cannot import it; importing ``hookscope.viz``
(``import hookscope`` does) tells it, through :func:`~hookscope.core.result.register_picture`, which
figure each kind of result has. matplotlib stays optional: without it a result shows its table only.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ..analysis.attribution import Attributions, SegmentAttributions, TokenAttributions
from ..analysis.cam import CamMaps
from ..analysis.circuits import LogitAttribution, LogitLens, Patching
from ..analysis.diff import Diff
from ..analysis.features import FeatureMaps, ReferenceComparison
from ..analysis.gradflow import GradientFlow
from ..analysis.monitor import Run
from ..analysis.trace import Trace
from ..core.result import register_picture
from .attribution import plot_image_attribution, plot_segment_attribution, plot_token_attribution
from .cam_signals import plot_cam_curves, plot_cam_slices
from .circuits import plot_logit_attribution, plot_logit_lens, plot_patching
from .features import plot_feature_maps, plot_reference_comparison
from .plots import plot_diff, plot_gradient_flow, plot_trace
from .runs import plot_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_MAPS", "png"]

MAX_MAPS = 8
"""A notebook draws the maps of at most this many images of a batch."""


def png(fig: Figure) -> bytes:
    """A figure as PNG bytes, at the figure's own resolution.

    Example:
        >>> from hookscope.viz.plots import plot_diff
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> png(plot_diff(hookscope.diff(net, net, torch.ones(1, 2))))[:4]
        b'\\x89PNG'
    """
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=fig.dpi)
    return out.getvalue()


def _maps(result: Any) -> bytes | None:
    maps = result.maps[:MAX_MAPS]
    if maps.ndim not in (3, 4) or maps.shape[-1] < 2 or maps.shape[-2] < 2:  # not pictures: the table says it
        return None
    return png(plot_image_attribution(maps, method=result.method))


def _cam(result: Any) -> bytes | None:
    """A signal's maps as heat strips, a volume's as slices, an image's as attribution maps."""
    if result.maps.ndim == 2 and result.maps.shape[0]:
        return png(plot_cam_curves(None, [result]))
    if result.maps.ndim == 4 and result.maps.shape[0]:
        return png(plot_cam_slices(None, [result]))
    return _maps(result)


def _trace(t: Trace) -> bytes | None:
    return png(plot_trace(t)) if any(r.which == "output" for r in t.rows) else None


def _rows(draw: Any) -> Any:
    return lambda result: png(draw(result)) if result.rows else None


register_picture(CamMaps, _cam)
register_picture(Attributions, _maps)
register_picture(Trace, _trace)
register_picture(GradientFlow, _rows(plot_gradient_flow))
register_picture(Diff, _rows(plot_diff))
register_picture(Run, lambda run: png(plot_run(run)) if run.steps else None)
register_picture(FeatureMaps, _rows(plot_feature_maps))
register_picture(ReferenceComparison, _rows(plot_reference_comparison))
register_picture(TokenAttributions, lambda result: png(plot_token_attribution(result)) if result.rows else None)
register_picture(Patching, _rows(plot_patching))
register_picture(LogitLens, _rows(plot_logit_lens))
register_picture(LogitAttribution, _rows(plot_logit_attribution))
register_picture(SegmentAttributions, lambda result: png(plot_segment_attribution(result)) if result.rows else None)
