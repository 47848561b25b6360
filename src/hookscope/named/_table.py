"""One vocabulary of component names for every supported transformers family: ``embed``,
``blocks.3.attn.z``, ``unembed`` ... resolved from the families table (``_families``) to a module, a
field (its input or output) and a :class:`~hookscope.named.View`, and checked (``_check``) on one
short pass: the stream read back through the names recomputes the model's logits. Works on the
model inside any wrapper (``hookscope.components`` unwraps it and puts the wrapper's prefix on).

Must not import: ``selection`` (which resolves component names through this package), capture, edit,
analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..core.result import Result, missing
from ..core.text import table
from ..errors import RecordError, SelectionError, closest
from ._check import verify
from ._families import FAMILIES, Family, Site, family_of_type, heads_of
from ._views import View

__all__ = ["BLOCK_NAMES", "HEAD_PARTS", "Component", "Components", "resolve", "READ_ONLY"]

BLOCK_NAMES = ("resid_pre", "attn.q", "attn.k", "attn.v", "attn.pattern", "attn.z", "attn_out", "resid_mid", "mlp_in",
               "mlp.hidden", "mlp_out", "resid_post")
"""The names of each block, ``blocks.{i}.`` before them, in the order the stream meets them."""
HEAD_PARTS = ("q", "k", "v", "z", "pattern")
"""The per-head components: ``blocks.{i}.attn.head.{h}.{part}`` is head ``h`` of ``blocks.{i}.attn.{part}``."""
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")
_HEAD = re.compile(r"(blocks\.\d+)\.attn\.head\.(\d+)\.(q|k|v|z|pattern)")
READ_ONLY = ("the attention returns its weights after applying them, so a value written there changes nothing the "
             "model computes; edit attn.q or attn.k (the scores), or attn.z (what the weights made)")


@dataclass(frozen=True)
class Component:
    """One named component: the ``module`` (its qualified name, as ``named_modules()`` gives it),
    which ``field`` of it (``"input"``: its first argument; ``"output"``), and the ``view`` that
    reads the component from that value (an element of a tuple, the heads taken apart); ``note``
    says what a family's component holds where it is worth saying; ``head``: the one head a per-head
    name (``blocks.0.attn.head.1.z``) reads of the view's heads (``None``: all of them).

    Example:
        >>> c = Component("blocks.0.attn.z", "transformer.h.0.attn.c_proj", "input", View(heads=2, d_head=4))
        >>> c.field
        'input'
    """

    name: str
    module: str
    field: str
    view: View
    note: str = ""
    head: int | None = None

    @property
    def is_pattern(self) -> bool:
        """Whether this is the attention's weights (``attn.pattern``, or one head's).

        Example:
            >>> Component("blocks.0.attn.head.1.pattern", "h.0.attn", "output", View(element=1), head=1).is_pattern
            True
        """
        part = "pattern" if self.head is not None else "attn.pattern"
        return self.name.endswith("." + part)

    @property
    def read_only(self) -> str:
        """Why the component cannot be written (``""``: it can): an edit there would change nothing
        the model computes.

        Example:
            >>> Component("blocks.0.attn.pattern", "h.0.attn", "output", View(element=1)).read_only[:30]
            'the attention returns its weig'
        """
        return READ_ONLY if self.is_pattern else ""


class Components(Result, Mapping[str, Component]):
    """The component names of one model, resolved: ``comps["blocks.0.attn.z"]`` is its
    :class:`Component`; ``family`` is the row of the table it was resolved with, ``blocks`` the number
    of blocks, ``errors`` the largest error of each identity the check measured (empty: not checked).
    One head's name (``comps["blocks.0.attn.head.1.z"]``) gives that component with its ``head`` set,
    though iterating gives the whole components only. A name the family does not have (``resid_mid``
    where attention and the MLP run in parallel), or a head out of range, is refused with the reason."""

    def __init__(self, family: str, model: str, rows: list[Component], absent: Mapping[str, str], blocks: int,
                 errors: Mapping[str, float]) -> None:
        self.family, self.model, self.rows, self.blocks = family, model, rows, blocks
        self.absent, self.errors = dict(absent), dict(errors)
        self._by_name = {r.name: r for r in rows}

    def prefixed(self, prefix: str) -> Components:
        """The same names with ``prefix`` (a wrapper's, ``module.``) before each module's name."""
        rows = [dataclasses.replace(r, module=prefix + r.module) for r in self.rows]
        return Components(self.family, self.model, rows, self.absent, self.blocks, self.errors)

    def __getitem__(self, name: str) -> Component:
        if isinstance(name, str) and name in self._by_name:
            return self._by_name[name]
        head = _HEAD.fullmatch(name) if isinstance(name, str) else None
        if head is not None:
            return self._head(name, head.group(1), int(head.group(2)), head.group(3))
        if isinstance(name, str) and name in self.absent:
            raise RecordError(f"no component {name!r} in this {self.model}: {self.absent[name]}")
        block = _BLOCK.fullmatch(name) if isinstance(name, str) else None
        if block and int(block.group(1)) >= self.blocks and f"blocks.0.{block.group(2)}" in self._by_name:
            raise RecordError(f"no component {name!r}: this {self.model} has {self.blocks} blocks, "
                              f"blocks.0 to blocks.{self.blocks - 1}")
        raise missing(name, "component", self._by_name)

    def _head(self, name: str, block: str, head: int, part: str) -> Component:
        """Head ``head`` of ``block``'s ``part``: key/value heads for k and v, query heads otherwise."""
        whole = self[f"{block}.attn.{part}"]
        n = self[f"{block}.attn.{'z' if part == 'pattern' else part}"].view.heads
        if head >= n:
            kind = "key/value" if part in ("k", "v") else "query"
            raise RecordError(f"no component {name!r}: {block}.attn.{part} of this {self.model} holds {n} {kind} "
                              f"heads, head.0 to head.{n - 1}")
        return dataclasses.replace(whole, name=name, head=head)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def table(self) -> str:
        """A title line (the family, the blocks, what the check measured), then one row per name."""
        checked = ", ".join(f"{k} {v:.1e}" for k, v in self.errors.items())
        title = (f"{self.family} components of {self.model} ({self.blocks} blocks; "
                 f"{'checked: largest error ' + checked if checked else 'not checked'})")
        body = [[r.name, r.module, r.field, str(r.view), r.note] for r in self.rows]
        return "\n".join([title, *table(["name", "module", "field", "view", "note"], body, left={0, 1, 2, 3, 4},
                                        pad_last=False)])

    def to_dict(self) -> dict[str, Any]:
        """``{family, model, blocks, errors, absent, components: {name: {module, field, view, note}}}``."""
        return {"family": self.family, "model": self.model, "blocks": self.blocks, "errors": self.errors,
                "absent": self.absent,
                "components": {r.name: {"module": r.module, "field": r.field, "view": str(r.view), "note": r.note}
                               for r in self.rows}}


def _view(recipe: str, heads: tuple[int, int, int]) -> View:
    """A site's recipe (``heads:q``, ``concat:k`` ...) as a view, for ``heads`` (query, key/value, d_head)."""
    h, kv, d = heads
    kind, _, part = recipe.partition(":")
    if kind in ("tensor", "main"):
        return View()
    if kind == "element":
        return View(element=int(part))
    n = h if part == "q" else kv
    if kind == "heads":
        return View(heads=n, d_head=d, head_stride=d, width=n * d)
    if kind == "concat":  # q, k, v side by side: GPT-2's c_attn, Phi-3's qkv_proj, Falcon's multi-query
        offset = {"q": 0, "k": h * d, "v": (h + kv) * d}[part]
        return View(heads=n, d_head=d, offset=offset, head_stride=d, width=(h + 2 * kv) * d)
    if kind == "per_head":  # each head's q, k, v side by side: GPT-NeoX, Falcon's classic layout
        return View(heads=h, d_head=d, offset="qkv".index(part) * d, head_stride=3 * d, width=3 * h * d)
    g = h // kv  # grouped: each key/value group's g queries, then its key, then its value (Falcon's new layout)
    if part == "q":
        return View(heads=h, d_head=d, head_stride=d, group=g, group_stride=(g + 2) * d, width=kv * (g + 2) * d)
    return View(heads=kv, d_head=d, offset=(g + "kv".index(part)) * d, head_stride=(g + 2) * d,
                width=kv * (g + 2) * d)


def _family(model: nn.Module) -> tuple[Family, Any]:
    """The row of ``model``'s family (its config's variant), or the one-line refusal."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    supported = ", ".join(f.name for f in FAMILIES)
    if not isinstance(model_type, str):
        raise SelectionError(f"{type(model).__name__} is not a transformers model (no config.model_type): component "
                             f"names are known for the transformers families {supported}")
    row = family_of_type(model_type)
    if row is None:
        near = closest(model_type, [t for f in FAMILIES for t in f.model_types], n=1)
        hint = (f"the closest supported family is {family_of_type(near[0]).name} ({near[0]!r})"  # type: ignore[union-attr]
                if near else f"supported: {supported}")
        raise SelectionError(f"component names do not know {model_type!r} models ({type(model).__name__}): {hint}; "
                             "its layers may be laid out otherwise, so no names are guessed")
    return (row.variant(row, config) if row.variant else row), config


def _prefix(model: nn.Module) -> str:
    """Where the base model sits in ``model``: ``"transformer."`` in GPT2LMHeadModel, ``""`` in GPT2Model."""
    base = getattr(model, "base_model_prefix", "")
    return f"{base}." if base and isinstance(getattr(model, base, None), nn.Module) else ""


def _rows(family: Family, config: Any, model: nn.Module) -> tuple[list[Component], dict[str, str], int]:
    """Every name's component, the names refused (with why) and the number of blocks."""
    base, known = _prefix(model), dict(model.named_modules())
    stack = known.get(base + family.stack)
    if not isinstance(stack, (nn.ModuleList, nn.Sequential)):
        raise SelectionError(f"{type(model).__name__} has no block list {base + family.stack!r}, where the "
                             f"{family.name} row expects it: its layout differs from the table")
    heads = heads_of(family, config)
    absent = {k.format(family=family.name): v.format(family=family.name) for k, v in family.absent.items()}
    if not base:
        absent["unembed"] = (f"{type(model).__name__} is a base model with no unembedding: use the model with its "
                             "language-model head, or read final_norm")

    def site(name: str, path: str, field: str, view: View) -> Component:
        if path not in known:
            raise SelectionError(f"the {family.name} row puts {name} in {path!r}, which this {type(model).__name__} "
                                 "does not have: its layout differs from the table")
        return Component(name, path, field, view, family.notes.get(name.split(".", 2)[-1] if name.startswith(
            "blocks.") else name, ""))

    rows = [site("embed", base + family.embed, "output", View())]
    if family.pos_embed:
        rows.append(site("pos_embed", base + family.pos_embed, "output", View()))
    for i in range(len(stack)):
        block = f"{base}{family.stack}.{i}"
        sites = {"resid_pre": Site("", "input"), **family.sites, "resid_post": Site("", "output", "main")}
        for short in (n for n in BLOCK_NAMES if n in sites):
            s = sites[short]
            rows.append(site(f"blocks.{i}.{short}", f"{block}.{s.module}" if s.module else block, s.field,
                             _view(s.recipe, heads)))
        absent.update({f"blocks.{i}.{n}": absent[n] for n in BLOCK_NAMES if n in absent})
    for short in BLOCK_NAMES:
        absent.pop(short, None)
    if family.final_norm and "final_norm" not in absent:
        rows.append(site("final_norm", base + family.final_norm, "output", View()))
    if family.unembed and "unembed" not in absent:
        rows.append(site("unembed", family.unembed, "output", View()))
    return rows, absent, len(stack)


def resolve(model: nn.Module, inputs: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
            check: bool = True) -> Components:
    """The component names of ``model`` (unwrapped: no DataParallel or ``torch.compile`` around it),
    checked on one pass with ``inputs`` (its own short input where empty) unless ``check=False``.

    Example:
        >>> import transformers
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))
        >>> resolve(lm, check=False)["unembed"].module
        'lm_head'
    """
    family, config = _family(model)
    rows, absent, blocks = _rows(family, config, model)
    errors = verify(model, family, config, rows, inputs, kwargs) if check else {}
    return Components(family.name, type(model).__name__, rows, absent, blocks, errors)
