"""The layers a steering edit reads or changes: selectors, or component names that are a module's output."""

from __future__ import annotations

from torch import nn

from ...anatomy import component
from ...errors import HookscopeError, SelectionError
from ...selection import Selector, layers

__all__ = ["resolve"]


def resolve(model: nn.Module, selectors: tuple[Selector, ...]) -> list[tuple[str, nn.Module]]:
    """Modules by selector, or by component name (``"blocks.3.resid_post"``) where the component is
    a module's whole output."""
    found: list[tuple[str, nn.Module]] = []
    names = {n for n, _ in model.named_modules()}
    for sel in selectors:
        named = isinstance(sel, str) and (sel.startswith("blocks.") or sel in ("embed", "pos_embed"))
        if not named or sel in names:  # a component name goes to its module: bake() writes that module's weights
            try:
                found += layers(model, sel)
                continue
            except SelectionError:
                if not named:
                    raise
        assert isinstance(sel, str)
        comp = component(model, sel, check=False)
        if comp.field != "output" or comp.view.heads or comp.view.element not in (None, 0):
            raise HookscopeError(f"steering changes a module's whole output, and {sel!r} is {comp.field} "
                                 f"{comp.view} of {comp.module!r}; steer the output of the block before it, or a "
                                 "component that is a module's output (blocks.N.resid_post, attn_out, mlp_out)")
        found += layers(model, comp.module)
    return found
