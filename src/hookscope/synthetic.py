"""A synthetic image set hookscope draws itself: coloured shapes on textured backgrounds, with masks.

Every image holds one shape of one of :data:`CLASSES`, at a random place, size and colour, on a
background of noise, stripes or a colour gradient. The background's kind and colours are drawn
independently of the class, so only the shape tells the class; the mask of each image is the set of
the shape's pixels, which is what a saliency map should point at. The demo model
(:func:`hookscope.zoo.demo_model`) is trained on these images.

Everything is drawn by one CPU ``torch.Generator`` seeded by ``seed`` and vectorised over the
whole batch (no loop over pixels or images), so a seed gives the same images on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import HookscopeError

__all__ = ["CLASSES", "ShapeSet", "shapes"]

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "ring", "diamond")

# Sizes as fractions of the image side: the shape's half-extent (its "radius") is drawn in this range.
_RADIUS = (0.16, 0.3)
_TEXTURE = 0.15  # the background strays up to this far from its base colour
_GRAIN = 0.03  # sensor-like noise over the whole picture, shape included


@dataclass(frozen=True)
class ShapeSet:
    """Images of shapes, their classes and their masks (what :func:`shapes` returns).

    Attributes:
        images: ``N x 3 x S x S`` float32 pictures in [0, 1].
        labels: ``N`` int64 class indices into ``classes``.
        masks: ``N x S x S`` bool, True on the pixels of each image's shape.
        classes: the class names, :data:`CLASSES`.
        backgrounds: ``N x 3 x S x S``, the same pictures without their shapes (grain included), or
            ``None``. Where ``masks`` is True, ``images`` shows the shape and ``backgrounds`` what
            it hides: the baseline that truly removes a shape, e.g.
            ``hookscope.metrics.deletion(model, x, maps, baseline=data.backgrounds)``.

    Example:
        >>> data = shapes(2, seed=1)
        >>> data.images.shape, data.masks.shape, [data.classes[i] for i in data.labels.tolist()]
        (torch.Size([2, 3, 64, 64]), torch.Size([2, 64, 64]), ['square', 'diamond'])
    """

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor
    classes: tuple[str, ...]
    backgrounds: torch.Tensor | None = None

    def __len__(self) -> int:
        """The number of images.

        Example:
            >>> len(shapes(3))
            3
        """
        return int(self.labels.shape[0])


def shapes(n: int, *, seed: int = 0, size: int = 64) -> ShapeSet:
    """Draw ``n`` images of coloured shapes on textured backgrounds, with their labels and masks.

    Classes are drawn uniformly at random; each shape gets a random centre (fully inside the
    picture), half-extent (16% to 30% of the side) and colour; each background is noise, stripes
    or a gradient, in colours that contrast with the shape. 200 images of 64 x 64 take about
    0.1 s.

    Args:
        n: how many images (0 is allowed).
        seed: the seed of the CPU generator that draws everything: the same ``n`` and seed give
            the same images on every machine. The whole batch is drawn at once, so image ``i``
            depends on ``n`` too: ``shapes(4, seed=0)`` are not the first four of
            ``shapes(400, seed=0)`` (slice one large set when you need that).
        size: the side ``S`` of the square images, at least 16.

    Returns:
        A :class:`ShapeSet`.

    Raises:
        HookscopeError: ``n`` is negative or ``size`` below 16.

    Example:
        >>> a, b = shapes(4, seed=0), shapes(4, seed=0)
        >>> torch.equal(a.images, b.images), a.images.dtype, bool(a.masks.flatten(1).any(1).all())
        (True, torch.float32, True)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise HookscopeError(f"n={n!r} must be a number of images >= 0, for example shapes(200)")
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise HookscopeError(f"size={size!r} is too small to draw shapes in; use size >= 16, for example 64")
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(len(CLASSES), (n,), generator=g)
    masks = _shape_masks(labels, size, g)
    shape_colour = torch.rand(n, 3, 1, 1, generator=g)
    # The background's base colour sits across the colour wheel from the shape's (0.3 to 0.7 away,
    # mod 1, in every channel), then inside [0.15, 0.85] to leave the texture room: each channel
    # keeps at least 0.15 of contrast, so no shape melts into its background.
    base = torch.remainder(shape_colour + 0.5 + (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.4, 1.0)
    base = base.clamp(_TEXTURE, 1.0 - _TEXTURE)
    background = base + _TEXTURE * _textures(n, size, g)
    grain = _GRAIN * torch.randn(n, 3, size, size, generator=g)
    images = torch.where(masks.unsqueeze(1), shape_colour, background) + grain
    return ShapeSet(images=images.clamp(0.0, 1.0), labels=labels, masks=masks, classes=CLASSES,
                    backgrounds=(background + grain).clamp(0.0, 1.0))


def _shape_masks(labels: torch.Tensor, size: int, g: torch.Generator) -> torch.Tensor:
    """``N x S x S`` masks: each image's shape, centred and scaled at random, fully inside."""
    n = labels.shape[0]
    radius = (_RADIUS[0] + (_RADIUS[1] - _RADIUS[0]) * torch.rand(n, generator=g)) * size
    free = (size - 1) - 2 * radius  # room left for the centre so the shape stays inside
    cy = radius + free * torch.rand(n, generator=g)
    cx = radius + free * torch.rand(n, generator=g)
    grid = torch.arange(size, dtype=torch.float32)
    # coordinates relative to each shape's centre, in units of its radius (the shape fits in
    # [-1, 1]^2); rows N x S x 1 and columns N x 1 x S, broadcast to N x S x S by the drawing
    v = (grid.view(1, -1, 1) - cy.view(-1, 1, 1)) / radius.view(-1, 1, 1)
    u = (grid.view(1, 1, -1) - cx.view(-1, 1, 1)) / radius.view(-1, 1, 1)
    masks = torch.empty(n, size, size, dtype=torch.bool)
    for k, draw in enumerate(_SHAPES.values()):  # one vectorised pass per class, over its images only
        mine = (labels == k).nonzero().view(-1)
        masks[mine] = draw(u[mine], v[mine]).expand(len(mine), size, size)
    return masks


def _circle(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u * u + v * v <= 1.0


def _square(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.maximum(u.abs(), v.abs()) <= 0.85  # about the circle's area


def _triangle(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (v <= 0.8) & (u.abs() <= (v + 1.0) / 1.8)  # apex up at v = -1, base at v = 0.8


def _cross(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    a, b = u.abs(), v.abs()
    return ((a <= 0.3) & (b <= 1.0)) | ((b <= 0.3) & (a <= 1.0))


def _ring(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r2 = u * u + v * v
    return (r2 <= 1.0) & (r2 >= 0.55 * 0.55)


def _diamond(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u.abs() + v.abs() <= 1.1


_SHAPES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "circle": _circle, "square": _square, "triangle": _triangle, "cross": _cross, "ring": _ring,
    "diamond": _diamond,
}
assert tuple(_SHAPES) == CLASSES  # the label of a shape is its position in both


def _textures(n: int, size: int, g: torch.Generator) -> torch.Tensor:
    """``N x 3 x S x S`` textures in [-1, 1]: each image gets noise, stripes or a gradient at random."""
    kind = torch.randint(3, (n,), generator=g)
    tint = torch.rand(n, 3, 1, 1, generator=g) * 2 - 1  # how strongly each channel follows the pattern
    coarse = torch.rand(n, 3, 8, 8, generator=g) * 2 - 1
    angle = torch.rand(n, 1, 1, 1, generator=g) * math.pi
    period = 4.0 + 12.0 * torch.rand(n, 1, 1, 1, generator=g)  # pixels per stripe
    phase = torch.rand(n, 1, 1, 1, generator=g) * 2 * math.pi
    grid = torch.arange(size, dtype=torch.float32) / (size - 1)
    out = torch.empty(n, 3, size, size)
    # blotchy noise: a coarse random field upsampled, so it has structure at the shapes' scale too
    mine = (kind == 0).nonzero().view(-1)
    out[mine] = F.interpolate(coarse[mine], size=(size, size), mode="bilinear", align_corners=False)
    mine = (kind != 0).nonzero().view(-1)
    along = grid.view(1, 1, 1, -1) * torch.cos(angle[mine]) + grid.view(1, 1, -1, 1) * torch.sin(angle[mine])
    stripes = torch.sin(2 * math.pi * along * (size - 1) / period[mine] + phase[mine])
    lo = along.amin((2, 3), keepdim=True)
    gradient = (along - lo) / (along.amax((2, 3), keepdim=True) - lo) * 2 - 1
    out[mine] = torch.where((kind[mine] == 1).view(-1, 1, 1, 1), stripes, gradient) * tint[mine]
    return out
