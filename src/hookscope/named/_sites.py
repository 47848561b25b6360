"""Component names as layers: :class:`ComponentSite`, a module to hook that stands for one named
component (``blocks.3.attn.z``, one head ``blocks.3.attn.head.5.z``), and the selector resolution
that makes one from a name or a glob (``blocks.*.mlp_out``).

A hook registered on a site runs when the module holding the component runs: its forward hook gets
the component's value as the view reads it (as ``output``; the site has no inputs), and what it
returns is written back through :meth:`View.write` into the module's input or output. So capture,
edit and every analysis that hooks modules take component names unchanged.

Must not import: ``selection`` (which resolves names through this package), capture, edit, analysis,
``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

import fnmatch
import inspect
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..errors import HookscopeError, SelectionError, did_you_mean
from ._memo import resolved
from ._table import HEAD_PARTS, Component, Components
from ._views import first_argument

__all__ = ["ComponentSite", "HEAD_PARTS", "component_sites", "check_writable", "is_component_name"]

_TOP = ("embed", "pos_embed", "final_norm", "unembed", "blocks")
_GLOB = set("*?[")


class ComponentSite(nn.Module):
    """One named component of a transformers model, as a module to hook: ``component`` (its row),
    ``module`` (the model's module that holds it, a plain reference) and ``head`` (one head's slice,
    or ``None``). Forward hooks get the value (``[batch, pos, heads, d_head]`` for ``attn.z``,
    ``[batch, pos, d_head]`` for one head) and may return a replacement of the same shape and dtype.

    Example:
        >>> import transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))
        >>> [(n, s.head) for n, s in component_sites(lm, "blocks.0.attn.head.1.z")]
        [('blocks.0.attn.head.1.z', 1)]
    """

    module: nn.Module

    def __init__(self, name: str, component: Component, module: nn.Module, head: int | None = None,
                 rank: int = 0) -> None:
        super().__init__()
        self.__dict__["module"] = module  # a plain reference: not a child module of the site
        self.site_name, self.component, self.head, self.rank = name, component, head, rank
        self.__dict__["attached"] = []  # the hooks on ``module`` that run this site's
        self.__dict__["users"] = 0
        self.__dict__["lock"] = threading.Lock()

    @property
    def host_name(self) -> str:
        """The qualified name of the module holding the component."""
        return self.component.module

    @property
    def read_only(self) -> str:
        """Why the component cannot be written (``""``: it can)."""
        return self.component.read_only

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise HookscopeError(f"{self.site_name!r} is a component of the model, not a module to call; run the model")

    def extra_repr(self) -> str:
        return repr(self.site_name)

    # the value -------------------------------------------------------------------------------
    def _head_dim(self, full: torch.Tensor) -> int:
        return 1 if self.component.is_pattern else full.dim() - 2

    def read(self, raw: Any) -> torch.Tensor:
        """The component's value in ``raw`` (the module's first input or its output)."""
        view = self.component.view
        if self.component.is_pattern and view.element is not None and isinstance(
                raw, (tuple, list)) and (len(raw) <= view.element or raw[view.element] is None):
            raise HookscopeError(f"{self.site_name!r} holds nothing on this pass: only eager attention returns its "
                                 "weights; build the model with attn_implementation='eager', or read them with "
                                 "hookscope.attention")
        full = view.read(raw)
        return full if self.head is None else full.select(self._head_dim(full), self.head)

    def write(self, raw: Any, new: Any, old: torch.Tensor) -> Any:
        """``raw`` with the component replaced by ``new`` (checked against ``old``, the value read)."""
        if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype:
            got = f"{new.dtype} of shape {tuple(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
            raise HookscopeError(f"the change of {self.site_name!r} returned {got} for a component holding "
                                 f"{old.dtype} of shape {tuple(old.shape)}; return a tensor of that shape and dtype")
        view = self.component.view
        if self.head is not None:
            full = view.read(raw)
            dim = self._head_dim(full)
            at = torch.tensor([self.head], device=full.device)
            new = full.index_copy(dim, at, new.unsqueeze(dim))  # out of place: the other heads as they are
        return view.write(raw, new)

    def _begin(self) -> None:
        """The site's pre-hooks, as the holding module begins (the site has no inputs to change)."""
        for pre_id, pre in list(self._forward_pre_hooks.items()):
            pre(self, (), {}) if pre_id in self._forward_pre_hooks_with_kwargs else pre(self, ())

    def _rewrite(self, raw: Any) -> tuple[bool, Any]:
        """Run this site's forward hooks on the value in ``raw``: (whether to write back, ``raw`` written)."""
        value = self.read(raw)
        version, got_any = value._version, False
        new = value
        for hook_id, hook in list(self._forward_hooks.items()):
            got = hook(self, (), {}, new) if hook_id in self._forward_hooks_with_kwargs else hook(self, (), new)
            if got is not None:
                new, got_any = got, True
        got_any = got_any or value._version != version  # changed in place: a head's slice may be a copy
        # a view that takes the heads apart reads a new tensor (or a view the model does not go on
        # with): gradients reach it only where the model goes on with it
        grads = (self.head is not None or self.component.view.heads) and value.requires_grad \
            and torch.is_grad_enabled()
        if not (got_any or grads):
            return False, raw
        return True, self.write(raw, new, value)

    # hooks -------------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Any, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        # own hook: the caller's hook, kept on the site; the holding module's hooks run it
        return self._attach(super().register_forward_pre_hook(hook, prepend=prepend, with_kwargs=with_kwargs))

    def register_forward_hook(self, hook: Any, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        # own hook: as above
        return self._attach(super().register_forward_hook(hook, prepend=prepend, with_kwargs=with_kwargs,
                                                          always_call=always_call))

    def register_full_backward_hook(self, hook: Any, prepend: bool = False) -> RemovableHandle:
        raise HookscopeError(f"{self.site_name!r} is a component; its gradients are read with "
                             "capture(keep='grad_output') or edited with edit(grad_output=...), not backward hooks")

    def _attach(self, handle: RemovableHandle) -> RemovableHandle:
        with self.__dict__["lock"]:
            self.__dict__["users"] += 1
            if not self.__dict__["attached"]:
                self.__dict__["attached"] = self._drive()
        handle.__class__ = _SiteHandle
        handle.site = self  # type: ignore[attr-defined]
        return handle

    def _detach(self) -> None:
        with self.__dict__["lock"]:
            self.__dict__["users"] -= 1
            if self.__dict__["users"] > 0:
                return
            attached, self.__dict__["attached"] = self.__dict__["attached"], []
        for h in attached:
            h.remove()

    def _drive(self) -> list[RemovableHandle]:
        """The hooks on the holding module that run this site's own hooks on the component's value."""
        if self.component.field == "input":
            def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                self._begin()
                write, new = self._rewrite(first_argument(module, args, kwargs))
                if not write:
                    return None
                if args:
                    return (new, *args[1:]), kwargs
                first = next(iter(inspect.signature(module.forward).parameters))  # given by keyword
                return args, {**kwargs, first: new}

            # own hook: a component read from the module's first input runs its site's hooks there
            return [self.module.register_forward_pre_hook(before, with_kwargs=True)]

        def start(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._begin()

        def after(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if output is None:  # the module raised: only the hooks that asked to hear of it
                for hook_id, hook in list(self._forward_hooks.items()):
                    if hook_id in self._forward_hooks_always_called:
                        hook(self, (), {}, None) if hook_id in self._forward_hooks_with_kwargs else hook(self, (), None)
                return None
            write, new = self._rewrite(output)
            return new if write else None

        # own hook: a component read from the module's output runs its site's hooks there
        return [self.module.register_forward_pre_hook(start, with_kwargs=True),
                self.module.register_forward_hook(after, always_call=True)]


class _SiteHandle(RemovableHandle):
    """A hook handle of a :class:`ComponentSite`: the last one removed takes the site's hooks off the model."""

    site: ComponentSite | None

    def remove(self) -> None:
        super().remove()
        site, self.site = getattr(self, "site", None), None
        if site is not None:
            site._detach()


def is_component_name(selector: object) -> bool:
    """Whether ``selector`` is spelt as a component name or a glob of them (``embed``, ``blocks.*.mlp_out``).

    Example:
        >>> is_component_name("blocks.3.attn.z"), is_component_name("transformer.h.3")
        (True, False)
    """
    return isinstance(selector, str) and selector.split(".", 1)[0] in _TOP and not selector.startswith("re:")


def _names(comps: Components, heads: bool) -> Iterable[str]:
    """Every name a glob may match; the heads' names only where it asks for heads."""
    for name in comps:
        yield name
        block, _, part = name.partition(".attn.")
        if heads and part in HEAD_PARTS:
            yield from (f"{block}.attn.head.{h}.{part}" for h in range(_head_count(comps, block, part)))


def _head_count(comps: Components, block: str, part: str) -> int:
    """How many heads ``part`` of ``block`` holds: key/value heads for k and v, query heads otherwise."""
    view = comps[f"{block}.attn.{'z' if part == 'pattern' else part}"].view
    return view.heads


def _site(comps: Components, name: str, modules: dict[str, nn.Module], rank: dict[str, int]) -> ComponentSite:
    c = _lookup(comps, name)  # one head's name: the whole component's row, its head set
    whole = name if c.head is None else name.replace(f".attn.head.{c.head}.", ".attn.")
    return ComponentSite(name, c, modules[c.module], c.head, rank.get(whole, 0))


def _lookup(comps: Components, name: str) -> Component:
    """``comps[name]``, its one-line refusal as a selection error."""
    try:
        return comps[name]
    except HookscopeError as e:  # the table's words, said of the model the selector was given
        raise SelectionError(str(e).replace(" in this result.", f" of this {comps.model}.")) from None


def component_sites(model: nn.Module, selector: object) -> list[tuple[str, ComponentSite]] | None:
    """The sites a component name or glob selects in ``model`` (unwrapped), in the stream's order;
    ``None`` where ``selector`` is not spelt as a component name or ``model`` is no transformers
    model (then it is no component name at all). A name the family lacks, a block or head out of
    range, an unsupported family: one line.

    Example:
        >>> import transformers
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=20))
        >>> [n for n, _ in component_sites(lm, "blocks.*.mlp_out")]
        ['blocks.0.mlp_out', 'blocks.1.mlp_out']
    """
    if not is_component_name(selector) or not isinstance(getattr(getattr(model, "config", None), "model_type",
                                                                  None), str):
        return None
    assert isinstance(selector, str)
    comps = resolved(model)
    rank = {n: i for i, n in enumerate(comps)}
    if _GLOB & set(selector):
        names = [n for n in _names(comps, "head" in selector) if fnmatch.fnmatchcase(n, selector)]
        if not names:
            raise SelectionError(f"the glob {selector!r} matches no component name of this {comps.model}."
                                 f"{did_you_mean(selector, list(comps))} List them with hookscope.components(model)")
    else:
        names = [selector]
    modules = dict(model.named_modules())
    return [(n, _site(comps, n, modules, rank)) for n in names]


def check_writable(selected: Sequence[tuple[str, nn.Module]], inputs: bool = False) -> None:
    """Refuse, before any hook, an edit of a component that cannot be written (``attn.pattern``), and
    one of a component's inputs (``inputs``: the edit changes inputs or their gradients): a component
    is one value, which the change receives as the output.

    Example:
        >>> check_writable([("fc", nn.Linear(1, 1))], inputs=True)
    """
    for name, site in selected:
        if isinstance(site, ComponentSite) and site.read_only:
            raise HookscopeError(f"{name!r} cannot be edited: {site.read_only}")
        if isinstance(site, ComponentSite) and inputs:
            raise HookscopeError(f"{name!r} is a component, one value that a change receives as its output; edit it "
                                 "with output= or grad_output=, not input=, inputs= or grad_input=")
