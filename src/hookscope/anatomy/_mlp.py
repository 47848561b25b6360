"""The MLP width a Hugging Face config says (``intermediate_size``; GPT-2: ``n_inner``), written once
the MLPs are narrower (after :func:`compact`, or after ``fit_to``) and every MLP under the config keeps
the same number of hidden units, so that ``save_pretrained`` then ``from_pretrained`` rebuild them.

Must not import: analysis, ``loading``, ``cli``, ``viz``.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["write_mlp_configs"]


def _hidden_units(q: str, m: nn.Module) -> int | None:
    """The hidden units of the MLP that ``m`` opens or closes: LLaMA-style ``mlp.down_proj`` (its
    inputs), BERT-style ``intermediate.dense`` and ViT's or CLIP's ``mlp.fc1`` (their outputs), GPT-2's ``mlp.c_fc`` (a
    ``Conv1D``, weight ``in x out``)."""
    if q.endswith("mlp.down_proj") and isinstance(m, nn.Linear):
        return m.in_features
    if q.endswith(("intermediate.dense", "mlp.fc1")) and isinstance(m, nn.Linear):
        return m.out_features
    weight = getattr(m, "weight", None)
    if q.endswith("mlp.c_fc") and type(m).__name__ == "Conv1D" and weight is not None and weight.dim() == 2:
        return int(weight.shape[1])
    return None


def _field(cfg: Any) -> tuple[str, int | None] | None:
    """The config's MLP-width field and the width it gives (GPT-2's ``n_inner=None`` means 4 x width)."""
    if hasattr(cfg, "n_inner") and hasattr(cfg, "n_embd"):
        return "n_inner", cfg.n_inner if cfg.n_inner is not None else 4 * int(cfg.n_embd)
    size = getattr(cfg, "intermediate_size", None)
    return ("intermediate_size", size) if isinstance(size, int) and not isinstance(size, bool) else None


def write_mlp_configs(model: nn.Module) -> list[str]:
    """Write the MLP width into every Hugging Face config of ``model`` whose MLPs all keep the same
    number of hidden units, different from what the config says (MLPs left with different widths leave
    it as it was, with a warning: a config holds one width). Each MLP module's own ``intermediate_size`` follows.
    Returns the fields written.

    Example:
        >>> write_mlp_configs(nn.Linear(2, 2))
        []
    """
    owners: dict[int, tuple[str, Any]] = {}
    for q, m in model.named_modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and id(cfg) not in owners:
            owners[id(cfg)] = (q, cfg)
    written = []
    for prefix, cfg in owners.values():
        field = _field(cfg)
        units = {q: n for q, m in model.named_modules() if (not prefix or q.startswith(prefix + "."))
                 and (n := _hidden_units(q, m)) is not None}
        widths = set(units.values())
        if field is not None and len(widths) > 1:
            warnings.warn(f"the model's config keeps {field[0]}={field[1]}: its MLPs now keep {sorted(widths)} hidden "
                          "units, and a config holds one width (load the saved folder with load_pretrained)",
                          stacklevel=3)
        if field is None or len(widths) != 1 or field[1] in widths:
            continue
        width = widths.pop()
        setattr(cfg, field[0], width)
        written.append(field[0])
        for q in units:
            parent = model.get_submodule(q.rsplit(".", 1)[0]) if "." in q else model
            if isinstance(getattr(parent, "intermediate_size", None), int):
                setattr(parent, "intermediate_size", width)
    return written
