"""How alike two batches of maps are, per sample: Spearman's rank correlation (ties ranked by their
mean rank, as ``scipy.stats.spearmanr``), of the maps and of their absolute values, and the SSIM of
the maps as pictures (Wang et al. 2004), the measures Adebayo et al. (2018) report. Must not import
any analysis.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["SSIM_WINDOW", "pictures", "ranks", "spearman", "ssim"]

SSIM_WINDOW, _SIGMA, _K1, _K2 = 11, 1.5, 0.01, 0.03  # Wang et al.'s Gaussian window and constants


def ranks(values: torch.Tensor) -> torch.Tensor:
    """``B x N`` ranks from 1 along each row, tied values given the mean of their ranks.

    Example:
        >>> ranks(torch.tensor([[3.0, 1.0, 3.0, 2.0]])).tolist()
        [[3.5, 1.0, 3.5, 2.0]]
    """
    b, n = values.shape
    ordered, where = values.sort(dim=1, stable=True)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = first.long().cumsum(1) - 1
    position = torch.arange(n, device=values.device, dtype=torch.float64).expand(b, n)
    start = torch.full((b, n), float(n), dtype=torch.float64, device=values.device)
    end = torch.zeros((b, n), dtype=torch.float64, device=values.device)
    start.scatter_reduce_(1, group, position, "amin")
    end.scatter_reduce_(1, group, position, "amax")
    mean = (start.gather(1, group) + end.gather(1, group)) / 2 + 1
    return torch.empty_like(mean).scatter_(1, where, mean)


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``B`` rank correlations of the rows of ``a`` and ``b`` (any shape with ``B`` rows, flattened);
    NaN for a constant row, whose ranks do not vary.

    Example:
        >>> spearman(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[10.0, 20.0, 15.0]])).tolist()
        [0.5]
    """
    ra, rb = ranks(a.flatten(1).double()), ranks(b.flatten(1).double())
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return ((ra * rb).sum(1) / ((ra * ra).sum(1) * (rb * rb).sum(1)).sqrt()).float()


def pictures(maps: torch.Tensor) -> torch.Tensor | None:
    """``B x H x W`` maps in [0, 1] (absolute values summed over channels, then each scaled by its
    own range), or ``None`` where the maps are not pictures (``B x L``, or smaller than the window).

    Example:
        >>> pictures(torch.tensor([[[-2.0, 1.0], [0.0, 0.0]]])).tolist()
        [[[1.0, 0.5], [0.0, 0.0]]]
    """
    if maps.dim() not in (3, 4):
        return None
    flat = maps.abs().sum(1) if maps.dim() == 4 else maps.abs()
    flat = flat.double()
    low = flat.flatten(1).amin(1).view(-1, 1, 1)
    span = flat.flatten(1).amax(1).view(-1, 1, 1) - low
    return torch.where(span > 0, (flat - low) / torch.where(span > 0, span, 1.0), torch.zeros_like(flat))


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``B`` mean SSIMs of ``B x H x W`` pictures in [0, 1]: Wang et al.'s 11 x 11 Gaussian window of
    sigma 1.5, ``K1 = 0.01``, ``K2 = 0.03``, over the windows that lie inside the picture
    (scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1)``).

    Example:
        >>> x = torch.rand(1, 16, 16, dtype=torch.float64)
        >>> round(ssim(x, x).item(), 6), bool(ssim(x, 1 - x) < 0)
        (1.0, True)
    """
    x = torch.arange(SSIM_WINDOW, dtype=torch.float64, device=a.device) - (SSIM_WINDOW - 1) / 2
    g = torch.exp(-(x**2) / (2 * _SIGMA**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).view(1, 1, SSIM_WINDOW, SSIM_WINDOW)

    def mean(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t.double().unsqueeze(1), window)

    mu_a, mu_b = mean(a), mean(b)
    var_a, var_b = mean(a * a) - mu_a**2, mean(b * b) - mu_b**2
    cov = mean(a * b) - mu_a * mu_b
    c1, c2 = _K1**2, _K2**2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.flatten(1).mean(1).float()
