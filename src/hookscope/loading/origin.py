"""Where a model's weights came from, as :func:`~hookscope.load_model` built it: random (seeded), a
weights file, torchvision's named weights, an ``hf:`` folder's weights, the demo model's own, or the
caller's code. Recorded once, when the model is built, and read by everything that tells the caller
about the model (the command line's warnings, a report's banner and ``report.json``).

Kept beside the model, not on it: the caller's module gets no new attribute. A weight changed since
(``load_state_dict``, a training step: torch counts each tensor's in-place writes) makes the record
stale, and then nothing is claimed. Must not import: anything of hookscope but ``errors``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from torch import nn

__all__ = ["WeightsOrigin", "record_origin", "weights_origin"]


@dataclass(frozen=True)
class WeightsOrigin:
    """Where a model's weights came from.

    Attributes:
        random: the weights are random (seeded), not trained: what the model outputs means nothing.
        source: where they came from, in words (``random (seed 0)``, ``the weights file w.pt``).

    Example:
        >>> WeightsOrigin(True, "random (seed 0)").random
        True
    """

    random: bool
    source: str


_Stamp = tuple[tuple[int, int], ...]  # (id, in-place write count) of each parameter and buffer
_origins: weakref.WeakKeyDictionary[nn.Module, tuple[WeightsOrigin, _Stamp]] = weakref.WeakKeyDictionary()


def _stamp(model: nn.Module) -> _Stamp:
    return tuple((id(t), int(t._version)) for t in (*model.parameters(), *model.buffers()))


def record_origin(model: nn.Module, origin: WeightsOrigin) -> None:
    """Say where ``model``'s weights came from (what :func:`weights_origin` gives back).

    Example:
        >>> m = nn.Linear(2, 2)
        >>> record_origin(m, WeightsOrigin(False, "the weights file w.pt"))
        >>> weights_origin(m).source
        'the weights file w.pt'
    """
    _origins[model] = (origin, _stamp(model))


def weights_origin(model: nn.Module) -> WeightsOrigin | None:
    """Where :func:`~hookscope.load_model` (or :func:`~hookscope.load_weights`) got ``model``'s
    weights from; None for a model neither of them made or filled, or whose weights changed since
    (``load_state_dict``, training), of which nothing is known.

    Example:
        >>> import hookscope
        >>> weights_origin(hookscope.load_model("tiny"))
        WeightsOrigin(random=True, source='random (seed 0)')
        >>> weights_origin(nn.Linear(2, 2)) is None
        True
    """
    try:
        held = _origins.get(model)
    except TypeError:  # a module that cannot be weakly referenced or hashed: nothing was recorded
        return None
    if held is None or held[1] != _stamp(model):
        return None
    return held[0]
