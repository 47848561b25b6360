"""Feature-map pictures to PNG files, atomically (:func:`save_feature_maps`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import HookscopeError
from ._canvas import DPI
from ._tiles import need

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["save_feature_maps"]


def save_feature_maps(picture: Figure | np.ndarray, path: str | os.PathLike[str]) -> Path:
    """Write a figure or a grid array as a PNG, atomically (a temporary file, then a rename), readable
    by all (mode 0644), replacing a file already at ``path``.

    Args:
        picture: a figure from :func:`plot_feature_maps` / :func:`plot_reference_comparison`, or an
            array from :func:`feature_grid` / :func:`comparison_grid` (written pixel for pixel).
        path: the PNG file to write; its folder must exist.

    Returns:
        The path written.

    Example:
        >>> import os, tempfile, torch
        >>> from hookscope.viz.features import feature_grid
        >>> path = os.path.join(tempfile.mkdtemp(), "grid.png")
        >>> save_feature_maps(feature_grid(torch.rand(1, 4, 3, 3)), path).name
        'grid.png'
    """
    out = Path(path)
    folder = out.parent
    if not folder.is_dir():
        raise HookscopeError(f"cannot write {out}: the folder {folder} does not exist; create it first")
    if out.is_dir():
        raise HookscopeError(f"cannot write {out}: it is a folder; give a file path such as {out / 'maps.png'}")
    is_array = isinstance(picture, np.ndarray)
    if not is_array and not hasattr(picture, "savefig"):
        raise HookscopeError(f"cannot save a {type(picture).__name__}; pass a Figure or a uint8 array")
    image = need("PIL.Image") if is_array else None
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if image is not None:
                image.fromarray(np.ascontiguousarray(picture)).save(f, format="PNG", compress_level=1)
            else:
                # zlib level 1: a third of level 6's time for a 1100 x 1100 figure, files ~30% larger
                picture.savefig(f, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})  # type: ignore[union-attr]
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: a picture is for sharing, as open() would make it
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out
