"""What to explain beyond a class: a segmented region, a detected box, the similarity of an embedding,
the next token of a language model: ``hookscope.targets.Segmentation(...)``.

The same classes as ``hookscope.analysis._target_classes``, where they live beside the analyses that
score them; each is documented below.

Example:
    >>> import torch
    >>> from hookscope.targets import Class
    >>> Class(1)(torch.tensor([[0.5, 2.0, 1.0]])).tolist()
    [2.0]
"""

# one list of names, kept where they live; mypy reads this import as the list of what is exported
from .analysis._target_classes import __all__ as __all__
from .analysis._target_classes import Class, Detection, Segmentation, Similarity, Token
