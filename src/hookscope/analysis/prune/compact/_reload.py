"""Whether a compacted transformers model comes back from the folder ``save_pretrained`` writes.

Two ways back: ``from_pretrained`` builds the model's class from the config alone, so the config must
say every new size (and transformers must accept it: LLaMA refuses a hidden size that is not a
multiple of the head count); ``load_pretrained`` builds the original architecture from the config and
fits it to the saved shapes. :func:`settle_config` checks the first on a twin built from the compacted
config; where that twin is not the compacted model (shapes, a size a module derives itself, an epsilon
two kinds of norm read from one field, a buffer computed from the config), the config is put back as
the original model's, and the second way is checked on a twin fitted to the compacted tensors; where
neither gives the compacted model back, compaction is refused. The twins are built on the meta device
(nothing allocated or initialised), take the compacted model's own tensors and run once on the
example input.

Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from ....anatomy import fit_to
from ....core.inputs import private
from ....core.text import first_line
from ....errors import HookscopeError
from ..graph import traced_mode
from ._verify import output_gap

__all__ = ["settle_config", "reload_gap"]

_EXACT = 1e-6
"""A twin runs the same arithmetic on the same tensors: anything above rounding is another model."""


def _run(model: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    args, kwargs = private((inputs, kw))
    with traced_mode(model), torch.no_grad():
        return model(*args, **kwargs)


def _is_pretrained(model: nn.Module) -> bool:
    return hasattr(type(model), "config_class") and callable(getattr(model, "save_pretrained", None)) \
        and getattr(model, "config", None) is not None


def _scalars(m: nn.Module) -> dict[str, int | float]:
    return {k: v for k, v in vars(m).items() if type(v) in (int, float) and not k.startswith("_")}


def _module_gap(work: nn.Module, twin: nn.Module) -> str | None:
    """The first module of ``twin`` that is not ``work``'s: its class, a size or epsilon it holds, or a
    buffer it computed from the config."""
    theirs = dict(twin.named_modules())
    for q, m in work.named_modules():
        t = theirs.get(q)
        where = q or "the model"
        if t is None or type(t) is not type(m):
            return f"{where} is {type(t).__name__ if t is not None else 'missing'}, not {type(m).__name__}"
        mine, other = _scalars(m), _scalars(t)
        for k, v in mine.items():
            if other.get(k, v) != v:
                return f"{where}.{k} is {other[k]!r} instead of {v!r}"
        for k, b in m._buffers.items():
            tb = t._buffers.get(k)
            if b is None or tb is None or k not in m._non_persistent_buffers_set:
                continue
            # built on the meta device, a buffer has its shape only (the sizes and scales it is computed
            # from are compared above); a buffer rounded by the user's casts (half, then float) is the
            # model's own, while one computed from another size is another model
            if tb.shape != b.shape or (not tb.is_meta and not torch.allclose(
                    tb.to(device=b.device, dtype=torch.float64), b.double(), rtol=1e-2, atol=1e-6)):
                return f"{where}.{k} (computed from the config) differs"
            t._buffers[k] = b  # then the pass below compares what the saved tensors compute
    return None


def _twin(work: nn.Module, cfg: Any, fit: bool) -> nn.Module | str:
    """``work``'s class built from ``cfg`` (fitted to ``work``'s shapes with ``fit``) holding ``work``'s own
    tensors, or why it cannot be."""
    state = work.state_dict()
    try:
        with torch.device("meta"):  # nothing allocated or initialised: the tensors are work's
            twin: nn.Module = type(work)(cfg)
        if fit:
            fit_to(twin, state)
    except Exception as e:  # the class refuses the config, or the shapes do not fit
        return f"{type(e).__name__}: {first_line(e, 140)}"
    shapes = {k: tuple(v.shape) for k, v in twin.state_dict().items()}
    for k, v in state.items():
        if shapes.get(k, tuple(v.shape)) != tuple(v.shape):
            return f"{k} would be {'x'.join(map(str, shapes[k]))}, not {'x'.join(map(str, v.shape))}"
    missing, unexpected = twin.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        return f"its tensors are not the compacted model's ({', '.join([*missing, *unexpected][:2])})"
    return twin


def reload_gap(work: nn.Module, cfg: Any, inputs: tuple[Any, ...], kw: dict[str, Any], *, fit: bool) -> str | None:
    """Why ``work``'s class built from ``cfg`` (and, with ``fit``, fitted to ``work``'s shapes as
    ``load_pretrained`` does) is not ``work``; ``None`` when it is, on the example input too.

    Example:
        >>> reload_gap(nn.Linear(2, 2), None, (), {}, fit=False)
        'Linear is not a transformers model'
    """
    if not _is_pretrained(work):
        return f"{type(work).__name__} is not a transformers model"
    validate = getattr(cfg, "validate", None)
    try:
        if callable(validate):
            validate()  # what save_pretrained checks
    except Exception as e:  # transformers' own check of the config
        return " ".join(str(e).split()).rsplit("ValueError: ", 1)[-1][:160]
    twin = _twin(work, cfg, fit)
    if isinstance(twin, str):
        return twin
    why = _module_gap(work, twin)
    if why is not None:
        return why
    left = [k for k, t in (*twin.named_parameters(), *twin.named_buffers()) if t.is_meta]
    if left:
        return f"{left[0]} is not among the compacted model's tensors"
    gap, problem = output_gap(_run(work, inputs, kw), _run(twin, inputs, kw), _EXACT)
    return f"its {problem}" if problem else None


def _built_from(model: nn.Module, cfg: Any) -> bool:
    """Whether ``model``'s class is built from ``cfg`` alone (on the meta device: nothing allocated)."""
    try:
        with torch.device("meta"):
            type(model)(copy.deepcopy(cfg))
    except Exception:  # a constructor that wants more than the config
        return False
    return True


def _restore(cfg: Any, original: Any) -> None:
    """Put ``original``'s fields back into ``cfg`` (the object every module of the model holds)."""
    fields = vars(cfg)
    fields.clear()
    fields.update(copy.deepcopy(vars(original)))


def settle_config(inner: nn.Module, work: nn.Module, inputs: tuple[Any, ...], kw: dict[str, Any]) -> bool:
    """Make sure the compacted transformers model ``work`` comes back from the folder ``save_pretrained``
    writes: with its config as compacted (``from_pretrained``), else with ``inner``'s config put back
    (``load_pretrained``, a warning says so); refused in one line when neither rebuilds it. Returns
    whether the config was put back (the caller checks ``work`` again).

    Example:
        >>> settle_config(nn.Linear(2, 2), nn.Linear(2, 2), (), {})
        False
    """
    cfg, original = getattr(work, "config", None), getattr(inner, "config", None)
    if not _is_pretrained(work) or original is None or not _built_from(inner, original):
        return False  # a class that is not built from its config alone: no folder to check
    own = reload_gap(work, copy.deepcopy(cfg), inputs, kw, fit=False)
    if own is None:
        return False
    name = type(work).__name__
    _restore(cfg, original)
    fitted = reload_gap(work, copy.deepcopy(cfg), inputs, kw, fit=True)
    if fitted is not None:
        raise HookscopeError(f"compaction refused: the compacted {name} could not be loaded back from the folder "
                             f"save_pretrained writes: its config cannot say the new sizes ({own}), and the "
                             f"original architecture fitted to them differs ({fitted}); your model is unchanged "
                             "(prune its heads or its hidden width alone, or other amounts)")
    warnings.warn(f"the compacted {name}'s config cannot say its new sizes ({own}), so it keeps the original "
                  "model's: from_pretrained refuses the folder save_pretrained writes, and "
                  "hookscope.analysis.prune.load_pretrained(folder) loads it", stacklevel=4)
    return True
