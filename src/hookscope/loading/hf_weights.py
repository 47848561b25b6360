"""How well the weights of an ``hf:`` model's folder fit the model transformers built: a one-line
error when they fit poorly (renamed, most of them missing, a tensor of another shape), else the keys
left random (whole new modules: a task head) as a note.

Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading.voice``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..core.text import shape_text
from ..errors import LoadError
from .voice import terms

__all__ = ["loading_notes"]


def _tied_names(model: nn.Module) -> dict[str, set[str]]:
    """For each parameter held under several names (tied weights), every name of it."""
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    return {n: group for group in names.values() if len(group) > 1 for n in group}


def _ignored(model: nn.Module, attr: str, keys: set[str]) -> set[str]:
    """The keys transformers itself expects to be missing / unexpected (the class's regex lists)."""
    patterns = [p for p in (getattr(model, attr, None) or ()) if isinstance(p, str)]
    return {k for k in keys if any(re.search(p, k) for p in patterns)}


def _top(key: str, body: str | None) -> str:
    """The module a key belongs to at the level heads live: ``score`` or ``bert.pooler``."""
    parts = key.split(".")
    return ".".join(parts[:2]) if body is not None and parts[0] == body and len(parts) > 2 else parts[0]


def loading_notes(model: nn.Module, info: Mapping[str, Any], spec: str, path: str) -> list[str]:
    """What transformers' loading report ``info`` means: a one-line error when the weights fit poorly,
    else the keys left random (whole new modules: a task head) as a note.

    Example:
        >>> loading_notes(nn.Linear(2, 2), {"missing_keys": []}, "hf:base", "folder")
        []
    """
    where = f"{terms().option('config')} {path}"
    saved_as = getattr(getattr(model, "config", None), "architectures", None)
    said = f" (its config.json says {', '.join(map(str, saved_as))})" if saved_as else ""
    fix = f"give the class or task the folder was saved from{said}, or save the weights again with " \
          "model.save_pretrained(folder)"
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        key, saved, wanted = mismatched[0]
        more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
        raise LoadError(f"the weights in {where} do not fit {type(model).__name__}: {key} is "
                        f"{shape_text(tuple(saved))} in the file but {shape_text(tuple(wanted))} in the model"
                        f"{more}; {fix}")
    errors = [str(m) for m in info.get("error_msgs") or ()]
    if errors:
        raise LoadError(f"transformers cannot load the weights in {where}: {errors[0].splitlines()[0]}; {fix}")
    missing, unexpected = _missing_keys(model, info)
    if not missing:
        return []
    _check_match(model, missing, unexpected, f"the weights in {where} fit {type(model).__name__} poorly", fix)
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return [f"{spec}: {shown} {'is' if len(missing) == 1 else 'are'} not in the folder's weights: random "
            f"(a new head; its outputs mean nothing until trained)"]


def _missing_keys(model: nn.Module, info: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys that count: not tied to a loaded one, not expected by transformers."""
    raw = {str(k) for k in info.get("missing_keys") or ()}
    tied = _tied_names(model)
    loaded_tie = {k for k in raw if any(other not in raw for other in tied.get(k, ()) if other != k)}
    missing = raw - loaded_tie - _ignored(model, "_keys_to_ignore_on_load_missing", raw)
    unexpected = {str(k) for k in info.get("unexpected_keys") or ()}
    unexpected -= _ignored(model, "_keys_to_ignore_on_load_unexpected", unexpected)
    return sorted(missing), sorted(unexpected)


def _check_match(model: nn.Module, missing: list[str], unexpected: list[str], what: str, fix: str) -> None:
    """Raise when the missing keys are not whole new modules: most values missing, keys renamed, or
    part of a module that is otherwise loaded."""
    state = model.state_dict()
    tied = _tied_names(model)
    total = sum(t.numel() for t in state.values()) or 1
    lost = sum(state[k].numel() for k in missing if k in state)
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    body = prefix if prefix and isinstance(getattr(model, prefix, None), nn.Module) else None
    gone = set(missing)
    partial = [k for k in missing if any(s not in gone and s not in tied and _top(s, body) == _top(k, body)
                                         for s in state)]
    renamed = _renamed(missing, unexpected, body)
    if 2 * lost <= total and not partial and not renamed:
        return
    why = (f"{len(missing)} of its {len(state)} tensors {'is' if len(missing) == 1 else 'are'} not in them "
           f"({100 * lost / total:.0f}% of its values: "
           f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if unexpected:
        why += f" and {len(unexpected)} of theirs are not the model's ({', '.join(unexpected[:3])}"
        why += ", ...)" if len(unexpected) > 3 else ")"
    raise LoadError(f"{what}: {why}; {fix}")


def _renamed(missing: list[str], unexpected: list[str], body: str | None) -> bool:
    """Whether saved keys look like the model's under another name: a module of two tensors or more
    whose names past the module's are those of a saved module, or a saved key that is a model key
    with a prefix."""
    def groups(keys: list[str]) -> dict[str, frozenset[str]]:
        found: dict[str, set[str]] = {}
        for k in keys:
            top = _top(k, body)
            found.setdefault(top, set()).add(k[len(top) + 1:])
        return {top: frozenset(rest) for top, rest in found.items()}

    saved = set(groups(unexpected).values())
    if any(len(rest) > 1 and rest in saved for rest in groups(missing).values()):
        return True
    return any(u.endswith("." + k) or k.endswith("." + u) for u in unexpected for k in missing)
