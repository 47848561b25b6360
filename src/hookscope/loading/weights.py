"""Weights fitted onto a built model: a ``state_dict`` file (or a checkpoint holding one) loaded
strictly, with what does not fit named in one line; the file of a compacted model resizes the
model's layers to it.

Must not import: anything of hookscope but ``errors``, ``core.text``, ``anatomy`` (resizing,
imported when a file needs it) and ``loading``'s ``voice``, ``files`` and ``origin``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..core.text import first_line, shape_text
from ..errors import HookscopeError, LoadError, checked
from .files import read_weights_file
from .origin import WeightsOrigin, record_origin
from .voice import tell, terms

__all__ = ["load_weights", "mismatches", "state_dict_of", "unwrapped"]


def _few(items: Sequence[str], one: str, many: str) -> str:
    """``2 missing keys: a, b`` / ``5 missing keys: a, b, c, ... (2 more)``."""
    shown = ", ".join(items[:3]) + (f", ... ({len(items) - 3} more)" if len(items) > 3 else "")
    return f"{len(items)} {one if len(items) == 1 else many}: {shown}"


def state_dict_of(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """The state_dict in what a weights file held: itself, a training checkpoint's ``"state_dict"`` or
    ``"model"``, or a whole model's (unpickled with ``trust_pickle``).

    Example:
        >>> sorted(state_dict_of({"epoch": 3, "model": nn.Linear(2, 1).state_dict()}, "ckpt.pt"))
        ['bias', 'weight']
    """
    if isinstance(obj, Mapping) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = [obj[k] for k in ("state_dict", "model") if isinstance(obj.get(k), (Mapping, nn.Module))]
        obj = inner[0] if inner else obj
    if isinstance(obj, nn.Module):  # a whole model, unpickled with trust_pickle
        obj = obj.state_dict()
    if isinstance(obj, Mapping) and obj and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in obj.items()):
        return dict(obj)
    held = (f"a dict of {_few([str(k) for k in obj], 'key', 'keys')}" if isinstance(obj, Mapping) and obj
            else f"an empty {type(obj).__name__}" if isinstance(obj, Mapping) else f"a {type(obj).__name__}")
    raise LoadError(f"{terms().option('weights')} {path} holds {held}, not a state_dict: give tensors by parameter "
                    "name (torch.save(model.state_dict(), path)), or a checkpoint holding them under "
                    "'state_dict' or 'model'")


def unwrapped(state: dict[str, torch.Tensor], expected: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``state`` without the key prefix a ``(Distributed)DataParallel`` (``module.``) or a
    ``torch.compile``'d model (``_orig_mod.``) saved it with, when ``expected`` has none.

    Example:
        >>> list(unwrapped({"module.weight": torch.zeros(1)}, {"weight": None}))
        ['weight']
    """
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def mismatches(expected: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> list[str]:
    """What keeps ``state`` from loading where ``expected`` is: missing and unexpected keys, tensors of
    another shape; empty when it fits.

    Example:
        >>> mismatches(nn.Linear(2, 2).state_dict(), nn.Linear(2, 3).state_dict())
        ['2 shape mismatches: weight (file 3x2, model 2x2), bias (file 3, model 2)']
    """
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} (file {shape_text(tuple(state[k].shape))}, model {shape_text(tuple(expected[k].shape))})"
              for k in expected if k in state and isinstance(expected[k], torch.Tensor)
              and tuple(state[k].shape) != tuple(expected[k].shape)]
    parts = [(missing, "missing key", "missing keys"), (unexpected, "unexpected key", "unexpected keys"),
             (shapes, "shape mismatch", "shape mismatches")]
    return [_few(items, one, many) for items, one, many in parts if items]


def _with_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each tied parameter's missing names filled from a name it holds: save_pretrained
    writes a tied weight once (``lm_head.weight`` is ``transformer.wte.weight``)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    filled = dict(state)
    for group in names.values():
        held = next((n for n in group if n in state), None)
        if held is None:
            continue
        for name in group:
            filled.setdefault(name, state[held])
    return filled


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values (NaN where the other has NaN), whatever their dtypes."""
    if a.shape != b.shape:
        return False
    if a.dtype != b.dtype:
        b = b.to(a.dtype)
    return bool(((a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() or a.is_complex() else a == b).all())


def _check_tied(model: nn.Module, state: Mapping[str, torch.Tensor], path: str) -> None:
    """Refuse a file holding different tensors under two names of one tied tensor of ``model``: loading
    would keep one of them and silently drop the other."""
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    for group in names.values():
        held = [n for n in group if n in state]
        first = held[0] if held else None
        other = next((n for n in held[1:] if state[n].shape == state[first].shape  # else: a shape mismatch
                      and not _same(state[n], state[first])), None) if first else None
        if first is not None and other is not None:
            raise LoadError(f"{terms().option('weights')} {path} holds different tensors for {first} and {other}, "
                            f"which are one tensor in the model (tied weights): loading would drop one of them; "
                            "give weights saved from a model with them tied, or build the model with them untied "
                            "(transformers: tie_word_embeddings=False in its config)")


def _fit_compacted(model: nn.Module, expected: Mapping[str, Any], state: Mapping[str, torch.Tensor], path: str,
                   what: str, held: Any) -> bool:
    """A compacted model's file (``hookscope prune --compact --out`` marks it) with the model's keys, whose
    tensors only shrink: resize the model's layers to it (said once, as a note) and return True; False for
    any other misfit (a file of another model with fewer classes is not resized behind the caller's back)."""
    from ..anatomy import fit_to, is_compacted, shrinks

    if not is_compacted(held) or set(expected) != set(state):
        return False
    changed = [k for k, v in expected.items() if isinstance(v, torch.Tensor) and tuple(v.shape) != tuple(state[k].shape)]
    if not all(shrinks(tuple(expected[k].shape), tuple(state[k].shape)) for k in changed):
        return False
    flag = terms().option("weights")
    try:
        resized = fit_to(model, state)
    except HookscopeError as e:
        raise LoadError(f"{flag} {path} holds smaller tensors than {what} (a compacted model?), but {e}") from e
    shown = ", ".join(resized[:3]) + (f", ... ({len(resized) - 3} more)" if len(resized) > 3 else "")
    tell("note", f"{flag} {path} is a compacted {what}: resized {len(resized)} layer{'s' * (len(resized) != 1)} "
                 f"to its shapes ({shown})")
    return True


@checked
def load_weights(model: nn.Module, path: str | os.PathLike[str], *, trust_pickle: bool = False,
                 spec: str | None = None) -> nn.Module:
    """Load a weights file into ``model``, strictly; what does not fit is named in one line.

    The file is a ``state_dict`` (or a checkpoint holding one under ``"state_dict"`` / ``"model"``,
    keys saved from a ``DataParallel`` or compiled model unwrapped), read with
    ``torch.load(weights_only=True)``, or a ``.safetensors`` file (the ``dump`` extra). Pickled
    objects in it are refused unless ``trust_pickle``. A file ``hookscope prune --compact`` wrote
    resizes the model's layers to its smaller tensors (with a warning saying so).

    Args:
        model: the built architecture; changed in place and returned.
        path: the weights file.
        trust_pickle: let the full unpickler read the file (it runs any code the file names).
        spec: how the model was named, for the messages.

    Returns:
        ``model``, holding the file's weights.

    Raises:
        LoadError: the file cannot be read, or does not fit ``model``.
        UntrustedPickleError: the file holds pickled objects and ``trust_pickle`` is False.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save(nn.Linear(2, 3).state_dict(), path)
        >>> load_weights(nn.Linear(2, 3), path).out_features
        3
        >>> load_weights(nn.Linear(2, 2), path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: weights .../w.pt does not fit Linear: 2 shape mismatches: weight (file 3x2, model 2x2), bias (file 3, model 2); ...
    """
    path = os.fspath(path)
    expected = model.state_dict()
    held = read_weights_file(path, trust_pickle=trust_pickle)
    state = unwrapped(state_dict_of(held, path), expected)
    _check_tied(model, state, path)
    state = _with_tied(model, state)
    what = f"{spec} ({type(model).__name__})" if spec else type(model).__name__
    problems = mismatches(expected, state)
    flag = terms().option("weights")
    if problems and not _fit_compacted(model, expected, state, path, what, held):
        raise LoadError(f"{flag} {path} does not fit {what}: {'; '.join(problems)}; give the "
                        "state_dict() of this very architecture")
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as e:
        raise LoadError(f"cannot load {flag} {path} into {what}: {first_line(e)}") from e
    record_origin(model, WeightsOrigin(False, f"the weights file {path}"))
    return model
