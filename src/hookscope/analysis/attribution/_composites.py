"""Which LRP rule each layer gets: zennit's composites by layer type (and the first layer), or the
user's mapping of layer names, globs and types to rules.

Every composite shares a base: average pools get the norm rule, activations pass relevance on
(:mod:`._activations`), a sum of two computed values splits it in proportion, batch norms are merged
into the layer before them. Max pools, dropout and the rest keep their gradient.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from torch import nn

from ...errors import HookscopeError, did_you_mean
from ._lrp_rules import WEIGHTED, LRPRule, parse_rule

__all__ = ["COMPOSITES", "CONVS", "LINEARS", "POOLS", "assign"]

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
LINEARS = CONVS + (nn.Linear,)
POOLS = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)

# name -> (rule of convolutions, rule of nn.Linear, (types of the first layer, its rule) or None)
COMPOSITES: dict[str, tuple[str, str, tuple[tuple[type[nn.Module], ...], str] | None]] = {
    "epsilon_plus": ("zplus", "epsilon", None),
    "epsilon_plus_flat": ("zplus", "epsilon", (LINEARS, "flat")),
    "epsilon_gamma_box": ("gamma", "epsilon", (CONVS, "zbox")),
    "epsilon_alpha2_beta1": ("alpha_beta:2:1", "epsilon", None),
}

Key = str | type
Chosen = dict[str, tuple[nn.Module, LRPRule]]  # qualified name -> (layer, rule)


def _by_composite(model: nn.Module, name: str) -> Chosen:
    conv, linear, first = COMPOSITES[name]
    out: Chosen = {}
    for qual, m in model.named_modules():
        if first is not None and isinstance(m, first[0]):
            out[qual] = (m, parse_rule(first[1]))
            first = None
        elif isinstance(m, CONVS):
            out[qual] = (m, parse_rule(conv))
        elif isinstance(m, nn.Linear):
            out[qual] = (m, parse_rule(linear))
        elif isinstance(m, POOLS):
            out[qual] = (m, LRPRule("norm"))
    return out


def _by_mapping(model: nn.Module, mapping: Mapping[Any, Any]) -> Chosen:
    rules = {k: parse_rule(v) for k, v in mapping.items()}
    names = [n for n, _ in model.named_modules() if n]
    for k in rules:
        if isinstance(k, str) and not any(fnmatch.fnmatchcase(n, k) for n in names):
            raise HookscopeError(f"composite= names layer {k!r}, which the model does not have."
                                 f"{did_you_mean(k, names)} Use a qualified name from model.named_modules()")
        if not isinstance(k, (str, type)):
            raise HookscopeError(f"composite= has a key {k!r}; keys are layer names (globs allowed) or module types")
    out: Chosen = {}
    for qual, m in model.named_modules():
        rule = next((r for k, r in rules.items() if isinstance(k, str) and fnmatch.fnmatchcase(qual, k)
                     and (k == qual or r.name not in WEIGHTED or isinstance(m, LINEARS))), None)  # a glob: fitting layers
        rule = rule or next((r for k, r in rules.items() if isinstance(k, type) and isinstance(m, k)), None)
        if rule is None:
            rule = LRPRule("epsilon") if isinstance(m, LINEARS) else LRPRule("norm") if isinstance(m, POOLS) else None
        if rule is not None:
            out[qual] = (m, rule)
    return out


def assign(model: nn.Module, composite: Any) -> Chosen:
    """Each layer's rule: ``composite`` a composite's name or a mapping ``{name or glob or type: rule}``
    (layers with weights it does not name get ``epsilon``, average pools ``norm``).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
        >>> {k: r.name for k, (m, r) in assign(net, "epsilon_plus_flat").items()}
        {'0': 'flat', '3': 'epsilon'}
    """
    if isinstance(composite, Mapping):
        chosen = _by_mapping(model, composite)
    else:
        chosen = _by_composite(model, composite_name(composite))
    for qual, (m, rule) in chosen.items():
        if rule.name in WEIGHTED and not isinstance(m, LINEARS):
            raise HookscopeError(f"rule {rule.name!r} on layer {qual!r} ({type(m).__name__}): it needs the weight and "
                                 "bias of a Linear or Conv layer; give that layer 'norm', 'pass' or 'gradient'")
    return {k: v for k, v in chosen.items() if v[1].name != "gradient"}


def composite_name(composite: Any) -> str:
    """The composite's name, checked (``-`` and case forgiven)."""
    key = composite.lower().replace("-", "_") if isinstance(composite, str) else ""
    if key not in COMPOSITES:
        hint = did_you_mean(str(composite), COMPOSITES)
        raise HookscopeError(f"composite={composite!r} is not an LRP composite.{hint}"
                             f" Use one of {', '.join(COMPOSITES)}, or a mapping {{layer name or type: rule}}")
    return key
