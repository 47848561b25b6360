"""The passes a patching sweep makes: the clean and corrupted runs read through the component names,
and batches of the base run, one cell per row (the base prompt stacked along the batch), each row's
component replaced from the source run with ``edit``; or, for attribution patching, each component
replaced by a leaf tensor whose gradient the metric gives.

Must not import another analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from ...core.state import restored
from ...edit import edit
from ...errors import HookscopeError, SelectionError
from .._targets import call_model
from ._cells import HEAD_KINDS, Cell
from ._model import Decoder, device_of, logits_of, read

__all__ = ["needed", "source_run", "patched", "stacked_kwargs", "edited"]


def needed(cells: Sequence[Cell]) -> list[str]:
    """The components the cells read from the source run (a pattern cell: the pattern)."""
    return list(dict.fromkeys(c.name for c in cells))


def source_run(d: Decoder, ids: torch.Tensor, names: Sequence[str],
               kwargs: Mapping[str, Any] | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The named components on one pass, and its logits; a pattern needs eager attention, said in one line."""
    try:
        return read(d, ids, names, kwargs=kwargs)
    except SelectionError as e:
        if any(n.endswith("attn.pattern") for n in names):
            raise SelectionError("patching attn.pattern reads the attention probabilities, which only eager attention "
                                 "returns: build the model with attn_implementation='eager'") from e
        raise


def stacked_kwargs(kwargs: Mapping[str, Any] | None, rows: int) -> dict[str, Any]:
    """The model's keyword inputs for ``rows`` copies of one prompt (tensors of batch 1 expanded)."""
    return {k: v.expand(rows, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == 1 else v
            for k, v in (kwargs or {}).items()}


def _masks(cells: Sequence[Cell], heads: Mapping[str, int], length: int) -> dict[str, torch.Tensor]:
    """For each component, which rows patch which positions (``[rows, pos]``) or heads (``[rows, heads]``)."""
    out: dict[str, torch.Tensor] = {}
    for r, c in enumerate(cells):
        per_head = c.name.split(".", 2)[-1] in HEAD_KINDS
        m = out.setdefault(c.name, torch.zeros(len(cells), heads[c.name] if per_head else length, dtype=torch.bool))
        if per_head and c.head is not None:
            m[r, c.head] = True
        elif c.pos is not None:
            m[r, c.pos] = True
        else:
            m[r] = True
    return out


def _replace(d: Decoder, name: str, src: torch.Tensor, mask: torch.Tensor) -> Callable[[Any], Any]:
    view = d[name].view
    per_head = view.heads > 0

    def change(old: Any) -> Any:
        t = view.read(old)
        m = mask.to(t.device)
        m = m[:, None, :, None] if per_head else m.reshape(m.shape + (1,) * (t.dim() - 2))
        return view.write(old, torch.where(m, src.to(t), t))
    return change


def _pattern(d: Decoder, block: str, pattern: torch.Tensor, mask: torch.Tensor) -> list[tuple[str, str, Any]]:
    """Patching a head's pattern: its ``z`` made the source pattern applied to this run's ``v`` (``z`` is
    ``pattern @ v``, which the component check verifies on eager attention)."""
    z, v = d[f"{block}.attn.z"], d[f"{block}.attn.v"]
    seen: dict[str, torch.Tensor] = {}

    def keep_v(old: Any) -> None:
        seen["v"] = v.view.read(old)

    def change(old: Any) -> Any:
        t = z.view.read(old)
        values = seen["v"].repeat_interleave(t.shape[-2] // seen["v"].shape[-2], dim=-2)
        mixed = torch.einsum("hqk,bkhd->bqhd", pattern[0].to(t), values.to(t))
        return z.view.write(old, torch.where(mask.to(t.device)[:, None, :, None], mixed, t))
    return [(v.module, v.field, keep_v), (z.module, z.field, change)]


@contextmanager
def edited(d: Decoder, changes: Sequence[tuple[str, str, Callable[[Any], Any]]]) -> Iterator[None]:
    """Every change entered as one ``edit`` of its module's input or output, in order."""
    with ExitStack() as stack:
        for module, field, fn in changes:
            stack.enter_context(edit(d.model, module, input=fn) if field == "input" else edit(d.model, module, output=fn))
        yield


def changes_for(d: Decoder, cells: Sequence[Cell], source: Mapping[str, torch.Tensor],
                length: int) -> list[tuple[str, str, Any]]:
    """The edits that patch each row's cell from ``source``."""
    heads = {n: d[n.replace("attn.pattern", "attn.z")].view.heads for n in needed(cells)}
    changes: list[tuple[str, str, Any]] = []
    for name, mask in _masks(cells, heads, length).items():
        if name.endswith(".attn.pattern"):
            changes += _pattern(d, name.rsplit(".attn.", 1)[0], source[name], mask)
        else:
            changes.append((d[name].module, d[name].field, _replace(d, name, source[name], mask)))
    return changes


def patched(d: Decoder, base: torch.Tensor, cells: Sequence[Cell], source: Mapping[str, torch.Tensor],
            metric: Callable[[torch.Tensor], torch.Tensor], batch_size: int,
            kwargs: Mapping[str, Any] | None) -> torch.Tensor:
    """The metric with each cell patched from ``source`` into the ``base`` prompt, ``batch_size`` cells a pass."""
    if batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size} must be 1 or more (cells patched per forward pass)")
    values = []
    device = device_of(d.model)
    with restored(d.model, train=False), torch.no_grad():
        for start in range(0, len(cells), batch_size):
            chunk = cells[start:start + batch_size]
            ids = base.to(device).expand(len(chunk), -1)
            with edited(d, changes_for(d, chunk, source, base.shape[1])):
                out = call_model(d.model, (ids,), stacked_kwargs(kwargs, len(chunk)))
            values.append(metric(logits_of(out)).detach().cpu())
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
