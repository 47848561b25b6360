"""Masks made fast where hardware makes them fast: 2:4 weights exported to PyTorch's semi-structured
sparse tensors (``_semi``: ``to_semi_structured``), on CUDA only. Must not import: the other pruning
families but ``masks``, any other analysis module, ``cli``, ``viz``.
"""

from ._semi import semi_structured_layers, to_semi_structured

__all__ = ["to_semi_structured", "semi_structured_layers"]
