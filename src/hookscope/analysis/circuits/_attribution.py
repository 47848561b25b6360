"""Attribution patching: each cell of a patching sweep estimated to first order, the gradient of the
metric with respect to the activation dotted with the activation's change (source minus base), from
one forward and one backward pass of the base prompt; with ``steps``, the gradients averaged along the
straight path from the base prompt's embeddings to the source prompt's (EAP-IG).

The gradient with respect to each component is read through a zero tensor added to it (a probe): the
component stays in the graph, so a gradient reaches earlier components through later ones too.

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...core.state import restored
from ...errors import HookscopeError, checked
from .._targets import call_model
from ._cells import HEAD_KINDS, Cell
from ._model import Decoder, device_of, logits_of
from ._patching import Setting, result, setting
from ._result import Patching
from ._runs import edited, needed, source_run, stacked_kwargs

__all__ = ["attribution_patching"]

FIRST = "blocks.0.resid_pre"


def _keeper(v: Any, key: str, seen: dict[str, torch.Tensor]) -> Callable[[Any], None]:
    """An edit that changes nothing and keeps what ``v``'s view reads (a pattern's gradient needs ``v``)."""
    def keep(old: Any) -> None:
        seen[key] = v.view.read(old)
    return keep


def _probes(d: Decoder, names: Sequence[str], probes: dict[str, torch.Tensor],
            seen: dict[str, torch.Tensor]) -> list[tuple[str, str, Callable[[Any], Any]]]:
    """Edits adding a zero probe to each component (a pattern's: to its block's ``z``, keeping ``v``)."""
    changes: list[tuple[str, str, Callable[[Any], Any]]] = []
    for name in names:
        if name.endswith(".attn.pattern"):
            block = name.rsplit(".attn.", 1)[0]
            v = d[f"{block}.attn.v"]
            changes.append((v.module, v.field, _keeper(v, name, seen)))
            target, key = f"{block}.attn.z", name
        else:
            target, key = name, name
        c = d[target]

        def change(old: Any, c: Any = c, key: str = key) -> Any:
            t = c.view.read(old)
            probe = torch.zeros_like(t, requires_grad=True)
            probes[key] = probe
            return c.view.write(old, t + probe)
        changes.append((c.module, c.field, change))
    return changes


def _path(d: Decoder, start: torch.Tensor, end: torch.Tensor, alphas: torch.Tensor) -> tuple[str, str, Any]:
    """The edit that makes the first block's input ``start + alpha (end - start)``, one alpha a row."""
    c = d[FIRST]

    def change(old: Any) -> Any:
        t = c.view.read(old)
        a = alphas.to(t)[:, None, None]
        return c.view.write(old, start.to(t) + a * (end - start).to(t))
    return c.module, c.field, change


def _gradients(s: Setting, names: Sequence[str], path: tuple[torch.Tensor, torch.Tensor] | None, steps: int,
               batch_size: int, kwargs: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """The metric's gradient with respect to each component, averaged over the points of the path (a
    pattern's: with respect to its ``[heads, q, k]`` probabilities)."""
    alphas = torch.arange(1, steps + 1, dtype=torch.float64) / steps if steps else torch.zeros(1, dtype=torch.float64)
    total: dict[str, torch.Tensor] = {}
    device = device_of(s.d.model)
    with restored(s.d.model, train=False), torch.enable_grad():
        for start in range(0, len(alphas), batch_size):
            chunk = alphas[start:start + batch_size]
            probes: dict[str, torch.Tensor] = {}
            seen: dict[str, torch.Tensor] = {}
            changes = ([_path(s.d, *path, chunk)] if path is not None and steps else []) + _probes(s.d, names, probes,
                                                                                                   seen)
            with edited(s.d, changes):
                out = call_model(s.d.model, (s.base.to(device).expand(len(chunk), -1),),
                                 stacked_kwargs(kwargs, len(chunk)))
                value = s.metric(logits_of(out)).sum()
            keys = list(probes)
            grads = torch.autograd.grad(value, [probes[k] for k in keys], allow_unused=True)
            for k, g in zip(keys, grads):
                g = torch.zeros_like(probes[k]) if g is None else g
                if k in seen:  # d metric / d pattern[h, q, k] = sum_d dz[q, h, d] v[k, h, d]
                    v = seen[k].repeat_interleave(g.shape[-2] // seen[k].shape[-2], dim=-2)
                    g = torch.einsum("bqhd,bkhd->hqk", g.double(), v.detach().double())[None]
                else:
                    g = g.double().sum(0, keepdim=True)
                total[k] = total.get(k, 0) + g.detach()
    return {k: v / len(alphas) for k, v in total.items()}


def _estimate(cell: Cell, product: torch.Tensor) -> float:
    """A cell's first-order change: the product of gradient and change summed over what the cell patches
    (``product``: ``[pos, width]``, ``[pos, heads, d_head]``, or a pattern's ``[heads, q, k]``)."""
    if cell.name.endswith(".attn.pattern"):
        return float(product[cell.head].sum() if cell.head is not None else product.sum())
    if cell.name.split(".", 2)[-1] in HEAD_KINDS:
        return float(product[:, cell.head].sum() if cell.head is not None else product.sum())
    return float(product[cell.pos].sum() if cell.pos is not None else product.sum())


@checked
def attribution_patching(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, *,
                         answer: int | None = None, wrong: int | None = None,
                         metric: str | Callable[[torch.Tensor], Any] = "logit_diff",
                         component: str | Sequence[str] = "resid_pre", per: str | None = None, direction: str = "denoise",
                         steps: int = 0, position: int = -1, batch_size: int = 64,
                         kwargs: Mapping[str, Any] | None = None) -> Patching:
    """Estimate every cell of :func:`activation_patching`'s sweep at once, to first order: the metric's
    gradient with respect to each activation, on the run patched into, dotted with the activation's
    change (the source run's minus that run's), plus the base run's metric. One forward and one backward
    pass; with ``steps`` (EAP-IG), the gradients are averaged over ``steps`` points on the straight path
    from the base prompt's embeddings (``blocks.0.resid_pre``) to the source prompt's (``k / steps``,
    ``k = 1 .. steps``; ``batch_size`` points a pass). The arguments are :func:`activation_patching`'s; the
    result is a :class:`Patching` of the same grid, whose :meth:`Patching.correlation` with the real
    sweep says how far the estimate can be trusted.

    Example:
        >>> import torch, transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> a, b = torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3])
        >>> est = hookscope.attribution_patching(lm, a, b, answer=4, wrong=6, component="attn.z")
        >>> est.method, est.values.shape
        ('attribution', torch.Size([2, 2]))
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise HookscopeError(f"steps={steps!r} must be 0 (the gradient at the base run) or more (EAP-IG's points)")
    if batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size} must be 1 or more (points of the path per forward pass)")
    s = setting(model, clean, corrupted, "attribution_patching", answer=answer, wrong=wrong, metric=metric, component=component,
                per=per, direction=direction, position=position)
    names = needed(s.grid.cells)
    read = list(dict.fromkeys([*names, FIRST]))
    got_clean, logits_clean = source_run(s.d, s.clean, read, kwargs)
    got_corrupted, logits_corrupted = source_run(s.d, s.corrupted, read, kwargs)
    src, base = (got_clean, got_corrupted) if direction == "denoise" else (got_corrupted, got_clean)
    grads = _gradients(s, names, (base[FIRST], src[FIRST]), steps, batch_size, kwargs)
    products = {n: (grads[n] * (src[n].double() - base[n].double()))[0] for n in names}
    clean_m, corrupted_m = float(s.metric(logits_clean)[0]), float(s.metric(logits_corrupted)[0])
    start = corrupted_m if direction == "denoise" else clean_m
    values = torch.tensor([start + _estimate(c, products[c.name]) for c in s.grid.cells], dtype=torch.float64)
    return result(s, values, clean_m, corrupted_m, "eap-ig" if steps else "attribution", steps)
