"""The component names of each model, resolved once: a memo keyed weakly on the model (it goes when
the model goes) and dropped when the model's modules or parameter shapes change, so that a capture
or an edit of a component name runs the check's pass once per model, not once per block.

Must not import: ``selection``, capture, edit, analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from ._table import Components, resolve

__all__ = ["remembered", "resolved"]

Layout = tuple[tuple[tuple[str, int], ...], tuple[tuple[str, tuple[int, ...]], ...]]

_lock = threading.Lock()
_memo: weakref.WeakKeyDictionary[nn.Module, tuple[Layout, Components]] = weakref.WeakKeyDictionary()


def _layout(model: nn.Module) -> Layout:
    """What the names depend on: which module sits at each name, and each parameter's shape (a
    replaced layer, a pruned head, a resized embedding change it)."""
    return (tuple((n, id(m)) for n, m in model.named_modules()),
            tuple((n, tuple(p.shape)) for n, p in model.named_parameters()))


def remembered(model: nn.Module, inputs: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
               check: bool = True) -> Components:
    """Resolve ``model``'s names now (checked with ``inputs`` unless ``check=False``) and remember them
    for the names used as layers.

    Example:
        >>> import transformers
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))
        >>> remembered(lm).errors["logits"] < 1e-5
        True
    """
    comps = resolve(model, inputs, kwargs, check)
    with _lock:
        _memo[model] = (_layout(model), comps)
    return comps


def resolved(model: nn.Module) -> Components:
    """``model``'s names as last resolved, where its layout is still the one they were resolved for;
    else resolved and checked now on the model's own short input (one pass).

    Example:
        >>> import transformers
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))
        >>> resolved(lm) is resolved(lm)
        True
    """
    layout = _layout(model)
    with _lock:
        found = _memo.get(model)
    if found is not None and found[0] == layout:
        return found[1]
    return remembered(model)
