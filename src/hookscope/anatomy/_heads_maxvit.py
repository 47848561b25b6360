"""torchvision's MaxViT attention (``RelativePositionalMultiHeadAttention``) with fewer heads than its
input width: torchvision's forward reshapes the heads' outputs to the input's channels ``D``, so a
layer whose heads were removed runs this forward instead, which reshapes them to
``n_heads * head_dim``. The arithmetic is torchvision's, operation for operation (its
``scale_factor``, the input width to the power -1/2 applied to the keys, stays as it was);
parameters, buffers and ``state_dict`` keys are those of the layer it was. Imported only when such a
layer is compacted (torchvision is optional). Must not import: analysis, ``loading``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.models.maxvit import RelativePositionalMultiHeadAttention

__all__ = ["HeadPrunedRelativePositionalMultiHeadAttention"]


class HeadPrunedRelativePositionalMultiHeadAttention(RelativePositionalMultiHeadAttention):  # type: ignore[misc]
    """A MaxViT attention that kept ``n_heads`` of its heads at ``head_dim`` channels each.

    Example:
        >>> m = RelativePositionalMultiHeadAttention(8, 4, 4).eval()
        >>> x = torch.randn(1, 2, 4, 8); ref = m(x)
        >>> m.__class__ = HeadPrunedRelativePositionalMultiHeadAttention
        >>> bool(torch.allclose(m(x), ref))
        True
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention within each of the ``G`` partitions of ``x`` (``B x G x P x D``)."""
        B, G, P, _ = x.shape
        H, DH = int(self.n_heads), int(self.head_dim)
        q, k, v = (t.reshape(B, G, P, H, DH).permute(0, 1, 3, 2, 4) for t in torch.chunk(self.to_qkv(x), 3, dim=-1))
        k = k * self.scale_factor
        dot_prod = torch.einsum("B G H I D, B G H J D -> B G H I J", q, k)
        dot_prod = F.softmax(dot_prod + self.get_relative_positional_bias(), dim=-1)
        heads = torch.einsum("B G H I J, B G H J D -> B G H I D", dot_prod, v)
        out: torch.Tensor = self.merge(heads.permute(0, 1, 3, 2, 4).reshape(B, G, P, H * DH))
        return out
