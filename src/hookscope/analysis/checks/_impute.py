"""ROAD's noisy linear imputation (Rong et al. 2022): each removed pixel becomes the weighted mean of
its eight neighbours (1/6 for the four sides, 1/12 for the corners), kept pixels fixed, plus noise.

The equations of every removed pixel, for every image, channel and percentile at once, form one
sparse symmetric system per image and channel (a graph Laplacian with the kept pixels as its
boundary), solved here by conjugate gradients on a 3 x 3 stencil in float64 on the images' device,
so no sparse solver is needed. Must not import any analysis.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import HookscopeError

__all__ = ["impute"]

_TOLERANCE = 1e-12  # relative residual: far below float32, so the float32 images are the exact solution's


def _neighbours(z: torch.Tensor) -> torch.Tensor:
    """The weighted sum of each pixel's eight neighbours inside the image (zero beyond its borders).

    The stencil is separable but for its centre: ``[1, 2, 1] x [1, 2, 1] / 12`` less the pixel's own
    third, so two passes of shifted sums replace a 3 x 3 convolution (float64 convolutions are slow
    on the CPU)."""
    rows = F.pad(z, (0, 0, 1, 1))
    rows = rows[..., :-2, :] + 2 * rows[..., 1:-1, :] + rows[..., 2:, :]
    cols = F.pad(rows, (1, 1))
    cols = cols[..., :-2] + 2 * cols[..., 1:-1] + cols[..., 2:]
    return cols / 12 - z / 3


def impute(images: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """``images`` (``N x C x H x W``) with the pixels where ``removed`` (``N x H x W``, bool) is true
    replaced by the linear imputation, without noise; every image must keep at least one pixel.

    Example:
        >>> x = torch.tensor([[[[0.0, 0.0, 6.0]]]])
        >>> impute(x, torch.tensor([[[False, True, False]]])).tolist()  # the mean of its two sides
        [[[[0.0, 3.0, 6.0]]]]
    """
    x = images.to(torch.float64)
    hole = removed.to(torch.float64).unsqueeze(1)
    kept = 1.0 - hole
    degree = _neighbours(torch.ones_like(hole)) * hole  # the weights of the neighbours inside the image
    rhs = _neighbours(x * kept) * hole

    def apply(z: torch.Tensor) -> torch.Tensor:
        return degree * z - _neighbours(z) * hole

    inverse = torch.where(hole > 0, 1.0 / degree.clamp_min(1e-300), torch.zeros_like(degree))
    z = torch.zeros_like(rhs)
    r = rhs.clone()
    p = r * inverse
    rz = (r * p).sum(dim=(2, 3), keepdim=True)
    limit = _TOLERANCE**2 * (rhs * rhs).sum(dim=(2, 3), keepdim=True)
    for _ in range(20 * max(images.shape[2], images.shape[3]) + 100):  # a 220 x 220 hole takes 573
        if not bool(((r * r).sum(dim=(2, 3), keepdim=True) > limit).any()):
            break
        ap = apply(p)
        pap = (p * ap).sum(dim=(2, 3), keepdim=True)
        alpha = torch.where(pap > 0, rz / pap.clamp_min(1e-300), torch.zeros_like(pap))
        z = z + alpha * p
        r = r - alpha * ap
        s = r * inverse
        rz_next = (r * s).sum(dim=(2, 3), keepdim=True)
        beta = torch.where(rz > 0, rz_next / rz.clamp_min(1e-300), torch.zeros_like(rz))
        p = s + beta * p
        rz = rz_next
    else:
        if bool(((r * r).sum(dim=(2, 3), keepdim=True) > limit * 1e8).any()):  # not even to 1e-8
            raise HookscopeError("ROAD's imputation did not converge to 1e-8 of its right-hand side; this is a bug "
                                 "worth reporting, with the images' size and the share removed")
    return torch.where(hole > 0, z, x).to(images.dtype)
