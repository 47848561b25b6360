"""Feature maps as pictures: a grid of channel tiles, channel reductions, and the in-place trap's comparison.

Takes :class:`~hookscope.analysis.features.FeatureMaps` (or a ``B x C x h x w`` tensor) and
:class:`~hookscope.analysis.features.ReferenceComparison`; nothing here registers a hook. A grid
is built as one array with tensor and numpy operations (no loop over pixels or channels) and
drawn with one ``imshow`` per image, so a 512-channel layer renders in a fraction of a second.
Figures are built on their own Agg canvas, without pyplot. matplotlib and Pillow come from the viz
extra and are imported when a picture is drawn or saved.

Tile geometry (every grid here): ``K`` tiles of ``h x w`` laid out row by row, ``columns`` per row
(default ``ceil(sqrt(K))``), with ``pad`` pixels of gap between tiles and around the grid; tile
``j`` has its top-left pixel at ``(pad + (j // columns) * (h + pad), pad + (j % columns) * (w + pad))``.

One job per module: ``_tiles`` (which channels, how values become colours), ``_arrays`` (grids as
arrays, frames, blending over the picture), ``_grid`` (:func:`feature_grid`), ``_canvas`` (what the
figures share: layout in inches, labels, colour bar), ``_maps`` (:func:`plot_feature_maps`),
``_comparison`` (:func:`comparison_grid`, :func:`plot_reference_comparison`) and ``_save``
(:func:`save_feature_maps`).
"""

from ._comparison import comparison_grid, plot_reference_comparison
from ._grid import feature_grid
from ._maps import plot_feature_maps
from ._save import save_feature_maps
from ._tiles import NON_FINITE, REDUCTIONS, SCALES

__all__ = ["NON_FINITE", "REDUCTIONS", "SCALES", "comparison_grid", "feature_grid", "plot_feature_maps",
           "plot_reference_comparison", "save_feature_maps"]
