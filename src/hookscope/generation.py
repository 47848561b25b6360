"""Token positions that mean the same thing at every step of ``generate()``: the prompt's tokens,
the positions that write the continuation, step ``k``, absolute position ``p``.

With the KV cache on, each forward of a decoding step sees only the newest token, so ``at[:, -1]``
or "position 5" means something else at every step. A :class:`TokenPositions` selector is resolved
at each forward of the model from the model's own keyword inputs: the attention mask (the
sequence's own tokens, left padding excluded), else the cache's length and the input's length. A
record of "the residual at position p" is then the same tensor whether generation used the cache
or not, and an edit at position p changes the same computation either way.

One file past 500 lines: the frame of a forward, the selectors resolved on it and the records read
back by step and position are one contract, and a third of the file is its documented examples.

Must not import: capture, edit, grads, records, analysis, viz, report, cli.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._tree import tree_map
from .core.hooks import HookGroup
from .core.result import Result, missing
from .core.text import table
from .errors import HookscopeError, checked, checked_init
from .selection import At, unwrap

__all__ = ["TokenPositions", "TokenIndex", "tokens", "StepRow", "StepRecord", "StepRecords", "Frame",
           "frame_of", "FollowedPositions", "Taken"]

_KINDS = ("prompt", "generated", "step", "position")


@dataclass(frozen=True)
class Frame:
    """What one forward of the model computes: ``positions[b, t]`` is the absolute position of
    column ``t`` of row ``b`` (its own tokens counted, pads excluded; ``-1`` for a pad), ``prompt[b]``
    the prompt's length of row ``b``, ``step`` the decoding step (0: the forward over the prompt),
    ``fresh`` how many of the last columns are computed for the first time in this sequence (all of
    them with the cache; the newest one at a later step without it), ``sequence`` which sequence of
    the block this is (a new ``generate()`` call, or a forward that does not continue the last)."""

    positions: torch.Tensor
    prompt: torch.Tensor
    step: int
    fresh: int
    sequence: int
    length: int  # columns of the whole sequence so far (the attention mask's width), pads included
    cached: bool


def _past_length(kwargs: Mapping[str, Any]) -> int:
    """How many positions the cache already holds, from ``cache_position`` or the cache itself."""
    cache_position = kwargs.get("cache_position")
    if isinstance(cache_position, torch.Tensor) and cache_position.numel():
        return int(cache_position.reshape(-1)[0])
    cache = kwargs.get("past_key_values")
    if cache is None:
        return 0
    length = getattr(cache, "get_seq_length", None)
    if callable(length):
        return int(length())
    if isinstance(cache, (tuple, list)) and cache and isinstance(cache[0], (tuple, list)) and cache[0]:
        return int(cache[0][0].shape[-2])  # the legacy tuple of (key, value) per layer
    return 0


def _main_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    ids = kwargs.get("input_ids", args[0] if args else None)
    x = ids if isinstance(ids, torch.Tensor) else kwargs.get("inputs_embeds")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise HookscopeError("token positions follow a language model's forward: the model received neither "
                             "input_ids nor inputs_embeds of batch x tokens; call it as generate() does")
    return x


def frame_of(args: tuple[Any, ...], kwargs: Mapping[str, Any], before: Frame | None,
             before_ids: torch.Tensor | None = None, new: bool = False) -> Frame:
    """The :class:`Frame` of one forward, from the model's inputs; ``before`` is the last forward's
    (``new``: this forward starts a sequence whatever its inputs, as a new ``generate()`` call does).

    Example:
        >>> f = frame_of((), {"input_ids": torch.tensor([[0, 5, 6]]), "attention_mask": torch.tensor([[0, 1, 1]])}, None)
        >>> f.positions.tolist(), f.prompt.tolist(), f.step
        ([[-1, 0, 1]], [2], 0)
    """
    x = _main_input(args, kwargs)
    batch, width = int(x.shape[0]), int(x.shape[1])
    past = _past_length(kwargs)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        m = mask.detach().to("cpu", torch.long)  # one copy per forward: the selectors index on the host
        if m.shape[0] != batch or m.shape[1] < width:
            raise HookscopeError(f"the attention mask has shape {tuple(m.shape)} for {batch} x {width} tokens; "
                                 "token positions need a 2-D mask of batch x (cached + new) tokens")
        every = torch.where(m.bool(), m.cumsum(1) - 1, -1)
        length, counts = int(m.shape[1]), m.sum(1)
    elif isinstance(mask, torch.Tensor) and mask.dim() == 4:
        raise HookscopeError(f"the model received a 4-D attention mask {tuple(mask.shape)} (a static cache, "
                             "cache_implementation='static', builds one), which does not say where each row's own "
                             "tokens start; generate with the default dynamic cache for token positions")
    elif mask is not None:
        got = f"a mask of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise HookscopeError(f"token positions read a 2-D attention mask (batch x tokens); the model received {got}")
    else:
        length = past + width
        every = torch.arange(length).expand(batch, length)
        counts = torch.full((batch,), length)
    positions = every[:, length - width:]
    go_on = not new and before is not None and before.positions.shape[0] == batch and length == before.length + 1 and (
        past == before.length if past else (width == length and not before.cached and (
            before_ids is None or _same_prefix(x, before_ids))))
    if go_on and before is not None:
        return Frame(positions, before.prompt, before.step + 1, width if past else 1, before.sequence, length,
                     bool(past))
    sequence = 0 if before is None else before.sequence + 1
    return Frame(positions, counts, 0, width, sequence, length, bool(past))


def _same_prefix(x: torch.Tensor, before: torch.Tensor) -> bool:
    return x.dim() == 2 and before.dim() == 2 and x.shape[1] == before.shape[1] + 1 and bool(
        torch.equal(x[:, :-1].to(before.device), before))


def _ints(values: Any, what: str) -> tuple[int, ...]:
    try:
        items = [values] if not isinstance(values, (Iterable, torch.Tensor)) or (
            isinstance(values, torch.Tensor) and values.dim() == 0) else list(values)
        if any(isinstance(v, bool) for v in items):
            raise TypeError
        out = tuple(operator.index(v) for v in items)
    except TypeError:
        raise HookscopeError(f"tokens.{what}({values!r}): give an int or a list of ints, such as "
                             f"tokens.{what}(3)") from None
    if not out:
        raise HookscopeError(f"tokens.{what}() names no {what}; give at least one, such as tokens.{what}(0)")
    bad = [v for v in out if v < 0]
    if bad:
        raise HookscopeError(f"tokens.{what}({bad[0]}) is negative; {what}s count from 0 (the sequence's first "
                             "token, pads excluded)" if what == "position" else
                             f"tokens.step({bad[0]}) is negative; steps count from 0, the forward over the prompt")
    return out


@checked_init
class TokenPositions(At):
    """Positions of a language model's tokens that mean the same at every step of ``generate()``.

    Build them from :data:`tokens`: ``tokens.prompt``, ``tokens.generated``, ``tokens.step(k)``,
    ``tokens.position(p)``; pass them as ``at=`` to :func:`~hookscope.capture` or
    :func:`~hookscope.edit`. Positions count the sequence's own tokens from 0 (left padding
    excluded, read from the attention mask). A capture records each selected position once, at the
    step whose forward first computes it (a generation without the cache computes earlier
    positions again at every step: equal values under the causal mask, not recorded twice); an
    edit changes a selected position in every forward that computes it, so the cached and the
    uncached generation run the same edited computation. The change receives the selected
    positions as one ``[n, features]`` tensor (row by row, in order of position) and returns one of
    the same shape and dtype.

    Example:
        >>> tokens.step(2)
        tokens.step(2)
    """

    __slots__ = ("kind", "values")

    def __init__(self, kind: str, values: tuple[int, ...] = ()) -> None:
        if kind not in _KINDS:
            raise HookscopeError(f"no token positions {kind!r}; use one of {', '.join(_KINDS)}")
        super().__init__(None)  # no fixed index: resolved on each forward
        self.kind, self.values = kind, values

    def __repr__(self) -> str:
        if self.kind in ("prompt", "generated"):
            return f"tokens.{self.kind}"
        shown = str(self.values[0]) if len(self.values) == 1 else str(list(self.values))
        return f"tokens.{self.kind}({shown})"

    def wanted(self, frame: Frame) -> torch.Tensor:
        """``[batch, tokens]``: which columns of ``frame`` these positions select."""
        pos, prompt = frame.positions, frame.prompt[:, None]
        real = pos >= 0
        if self.kind == "prompt":
            return real & (pos < prompt)
        if self.kind == "generated":
            return real & (pos >= prompt - 1)
        base = prompt - 1 if self.kind == "step" else torch.zeros_like(prompt)
        hit = torch.zeros_like(real)
        for v in self.values:
            hit |= pos == base + v
        return real & hit

    def follow(self, model: nn.Module, group: HookGroup) -> FollowedPositions:
        """These positions bound to ``model``'s forwards, their hooks added to ``group``."""
        followed = FollowedPositions(self.kind, self.values)
        followed.attach(model, group)
        return followed

    def take(self, output: object, name: str) -> torch.Tensor:
        raise HookscopeError(f"{self!r} follows the model's forwards: pass it as at= to hookscope.capture or "
                             "hookscope.edit, which resolve it at every step")

    def put(self, output: object, change: Callable[[torch.Tensor], object], name: str) -> object:
        return self.take(output, name)


# decoding loops of transformers' GenerationMixin whose rows or steps the forward's inputs do not show
_REFUSED = {
    "_beam_search": "beam search (num_beams > 1) reorders the rows between steps, which the forward's inputs do not "
                    "show; generate with num_beams=1 for token positions",
    "_group_beam_search": "beam search (num_beams > 1) reorders the rows between steps, which the forward's inputs do "
                          "not show; generate with num_beams=1 for token positions",
    "_constrained_beam_search": "beam search (num_beams > 1) reorders the rows between steps, which the forward's "
                                "inputs do not show; generate with num_beams=1 for token positions",
    "_assisted_decoding": "assisted decoding (assistant_model= or prompt_lookup_num_tokens=) verifies several tokens "
                          "per forward and rolls the cache back, so a forward is not one step; generate without it "
                          "for token positions",
}
_LOOPS = frozenset(_REFUSED) | {"_sample"}


def decoding_loop(model: nn.Module) -> dict[str, Any] | None:
    """The locals of the transformers decoding loop calling ``model`` now (``None`` outside one); refuse, in one
    line, the loops whose rows or steps the forward's inputs do not show."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(48):  # generate() sits a few frames above the forward: a bounded walk, once per forward
        if frame is None:
            return None
        name = frame.f_code.co_name
        if name in _LOOPS and frame.f_locals.get("self") is model:
            if name in _REFUSED:
                raise HookscopeError(_REFUSED[name])
            return frame.f_locals
        frame = frame.f_back
    return None


def _finished_rows(frame: Frame, ended: dict[int, int], loop: Mapping[str, Any] | None) -> Frame:
    """``frame`` with the positions of rows already ended (fed pads after their end token) marked ``-1``;
    ``ended`` maps each such row to its first pad's position, kept across the steps of one sequence."""
    unfinished = None if loop is None else loop.get("unfinished_sequences")
    if isinstance(unfinished, torch.Tensor) and unfinished.shape == (frame.positions.shape[0],) and frame.step:
        for b in (unfinished == 0).nonzero().flatten().tolist():
            ended.setdefault(b, int(frame.positions[b, -1]))
    if not ended:
        return frame
    positions = frame.positions.clone()
    for b, first_pad in ended.items():
        positions[b][positions[b] >= first_pad] = -1
    return dataclasses.replace(frame, positions=positions)


@dataclass
class Taken:
    """What one call of a selected module took at token positions: the ``sequence`` of the block, the
    decoding ``step`` of the forward, and for each row of the tensor taken its batch ``rows[i]`` and its
    absolute ``positions[i]``."""

    sequence: int
    step: int
    rows: list[int]
    positions: list[int]


class FollowedPositions(TokenPositions):
    """:class:`TokenPositions` following one model's forwards inside one capture or edit: the frame
    of the forward running now, and what each selected module's calls selected."""

    __slots__ = ("frame", "log", "_ids", "_running", "_cache", "_last", "_ended", "_loop", "_thread")

    def __init__(self, kind: str, values: tuple[int, ...] = ()) -> None:
        super().__init__(kind, values)
        self.frame: Frame | None = None
        self.log: dict[str, list[Taken]] = {}
        self._ids: torch.Tensor | None = None
        self._running = False
        self._cache: dict[bool, tuple[Frame, tuple[tuple[torch.Tensor, torch.Tensor], list[int], list[int]]]] = {}
        self._last: list[Frame] = []  # the last frame of each sequence: how far each went
        self._ended: dict[int, int] = {}  # rows of the running sequence fed pads after their end token
        self._loop: object = None  # the running generate() call (its generation config), or None
        self._thread: int | None = None  # the one thread whose forwards these positions follow

    def attach(self, model: nn.Module, group: HookGroup) -> None:
        inner = unwrap(model)[0]
        config = getattr(inner, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            raise HookscopeError(f"{self!r} follows a decoder-only language model; {type(inner).__name__} is an "
                                 "encoder-decoder, whose decoder positions its inputs do not give as input_ids and "
                                 "attention_mask; capture or edit it without at=")

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            thread = threading.get_ident()
            if self._thread is None:
                self._thread = thread
            elif thread != self._thread:  # one frame of state: another thread's steps would interleave with these
                raise HookscopeError(f"{self!r} follows the forwards of one thread, and another thread called the "
                                     "model inside the same block; open one capture or edit per thread, one after "
                                     "the other")
            loop = decoding_loop(module)
            key = None if loop is None else loop.get("generation_config", loop)
            frame = frame_of(args, kwargs, self.frame, self._ids, new=key is not self._loop)
            self._loop = key
            if frame.step == 0:
                self._ended = {}
            self.frame = _finished_rows(frame, self._ended, loop)
            x = kwargs.get("input_ids", args[0] if args else None)
            self._ids = x if isinstance(x, torch.Tensor) and not self.frame.cached else None
            if self._last and self._last[-1].sequence == self.frame.sequence:
                self._last[-1] = self.frame
            else:
                self._last.append(self.frame)
            self._running = True

        def post(module: nn.Module, args: Any, output: Any) -> None:
            self._running = False

        # positions are resolved from the whole model's keyword inputs, before any selected module runs:
        # own hook: a pre-hook on the model itself (prepend), and a post-hook marking the forward's end
        group.add(inner.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        group.add(inner.register_forward_hook(post, always_call=True))

    def _index(self, main: torch.Tensor, name: str, fresh_only: bool) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                                              list[int], list[int]]:
        frame = self.frame
        if frame is None or not self._running:
            raise HookscopeError(f"{name!r} ran outside a forward of the model, so {self!r} has no step to follow; "
                                 "call the model (or generate()) inside the block")
        batch, width = frame.positions.shape
        if main.dim() < 2 or main.shape[0] != batch or main.shape[1] != width:
            raise HookscopeError(
                f"{self!r} picks tokens of batch x tokens x ... tensors, but {name!r} gives shape {tuple(main.shape)} "
                f"in a forward of {batch} x {width} tokens; select a module that keeps the token axis")
        cached = self._cache.get(fresh_only)
        if cached is not None and cached[0] is frame and cached[1][0][0].device == main.device:
            return cached[1]
        hit = self.wanted(frame)
        if fresh_only:
            hit[:, : width - frame.fresh] = False
        rows, cols = hit.nonzero(as_tuple=True)
        where = (rows.to(main.device), cols.to(main.device))
        found = (where, rows.tolist(), frame.positions[rows, cols].tolist())
        self._cache[fresh_only] = (frame, found)
        return found

    def take(self, output: object, name: str) -> torch.Tensor:
        return self.take_keyed(output, name)[0]

    def take_keyed(self, output: object, name: str) -> tuple[torch.Tensor, Taken]:
        """The selected positions of ``output``'s main tensor that this forward computes for the first time
        (``[n, ...]``, one row per position), and which step, rows and positions they are."""
        main, _ = self.main(output, name)
        where, rows, positions = self._index(main, name, fresh_only=True)
        assert self.frame is not None
        taken = Taken(self.frame.sequence, self.frame.step, rows, positions)
        self.log.setdefault(name, []).append(taken)
        return main[where], taken

    def put(self, output: object, change: Callable[[torch.Tensor], object], name: str) -> object:
        main, _ = self.main(output, name)
        where, rows, positions = self._index(main, name, fresh_only=False)
        assert self.frame is not None
        self.log.setdefault(name, []).append(Taken(self.frame.sequence, self.frame.step, rows, positions))
        if not rows:
            return output
        old = main[where]
        got = change(old)
        new_part = old if got is None else got
        if not isinstance(new_part, torch.Tensor) or new_part.shape != old.shape or new_part.dtype != old.dtype:
            shown = (f"{new_part.dtype} of shape {tuple(new_part.shape)}" if isinstance(new_part, torch.Tensor)
                     else type(new_part).__name__)
            raise HookscopeError(f"the change of {self!r} in {name!r} returned {shown} for positions holding "
                                 f"{old.dtype} of shape {tuple(old.shape)}; return a tensor of that shape and dtype")
        new = main.index_put(where, new_part)
        if output is main:
            return new
        return tree_map(lambda t: new if t is main else t, output)

    def check(self) -> None:
        """Refuse, in one line, positions that no forward of the block reached."""
        if not self._last or self.kind in ("prompt", "generated"):
            return
        if self.kind == "step":
            ran = max(f.step for f in self._last)
            beyond = [v for v in self.values if v > ran]
            if beyond:
                raise HookscopeError(
                    f"tokens.step({beyond[0]}) never ran: the generation ran steps 0..{ran} (generate() runs "
                    f"max_new_tokens steps, 0 to max_new_tokens - 1, fewer when an end token stops it); pick a "
                    "step inside them or raise max_new_tokens")
            return
        longest = max(int(f.positions.max()) + 1 for f in self._last)
        beyond = [v for v in self.values if v >= longest]
        if beyond:
            raise HookscopeError(
                f"tokens.position({beyond[0]}) is beyond the sequence: the longest held {longest} tokens (pads "
                f"excluded, the last generated token never goes through the model); pick a position below {longest}")


class TokenIndex:
    """The token positions of a language model's sequence (``hookscope.tokens``).

    - ``tokens.prompt``: the prompt's tokens, positions ``0 .. len(prompt) - 1`` of each row.
    - ``tokens.generated``: the positions that write the continuation: the prompt's last token
      (whose output gives the first generated token) and every generated token fed back (whose
      output gives the next). Steering there changes every generated token, the first included.
    - ``tokens.step(k)``: the position that writes generated token ``k`` (step 0: the last prompt
      token), ``len(prompt) - 1 + k`` of each row; ``k`` runs ``0 .. max_new_tokens - 1``.
    - ``tokens.position(p)``: absolute position ``p``, counting the row's own tokens from 0 (left
      padding excluded); several as a list.
    - ``tokens.records(rec)``: a capture's records by step and position (:class:`StepRecords`).

    Example:
        >>> import torch, transformers, hookscope
        >>> from hookscope import tokens
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)).eval()
        >>> with hookscope.capture(lm, "transformer.h.0", at=tokens.generated) as rec:
        ...     out = lm.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
        >>> tokens.records(rec)["transformer.h.0"].tensor().shape   # [batch, steps, d]
        torch.Size([1, 4, 8])
    """

    prompt = TokenPositions("prompt")
    generated = TokenPositions("generated")

    def __repr__(self) -> str:
        return "tokens"

    @staticmethod
    def step(k: int | Iterable[int]) -> TokenPositions:
        """The position that writes generated token ``k`` (or each of several)."""
        return TokenPositions("step", _ints(k, "step"))

    @staticmethod
    def position(p: int | Iterable[int]) -> TokenPositions:
        """Absolute position ``p`` (or each of several), pads excluded."""
        return TokenPositions("position", _ints(p, "position"))

    @staticmethod
    def records(recording: Any) -> StepRecords:
        """A capture's records (made with ``at=`` a token position) by step and absolute position."""
        return _records(recording)


tokens = TokenIndex()
"""The token positions: ``tokens.prompt``, ``tokens.generated``, ``tokens.step(k)``, ``tokens.position(p)``."""


@dataclass(frozen=True)
class StepRow:
    """One recorded position: ``layer``, the ``sequence`` of the block, the ``step`` whose forward
    computed it, the batch ``row``, the absolute ``position`` and the record's ``shape``."""

    layer: str
    sequence: int
    step: int
    row: int
    position: int
    shape: tuple[int, ...]


class StepRecord:
    """One layer's records by position: ``rows`` (:class:`StepRow`), ``values`` (one tensor per row),
    ``tensor()`` as one ``[batch, positions, ...]`` tensor, ``get(row, position)``."""

    def __init__(self, name: str, rows: list[StepRow], values: list[torch.Tensor]) -> None:
        self.name, self.rows, self.values = name, rows, values

    def _of(self, sequence: int | None) -> list[int]:
        seqs = sorted({r.sequence for r in self.rows})
        if sequence is None:
            if len(seqs) > 1:
                raise HookscopeError(f"{self.name!r} holds {len(seqs)} sequences (one per generate() call); pick one "
                                     f"with sequence= (0..{seqs[-1]})")
            sequence = seqs[0] if seqs else 0
        if seqs and sequence not in seqs:
            raise HookscopeError(f"no sequence {sequence} in the records of {self.name!r}; they hold {seqs}")
        return [i for i, r in enumerate(self.rows) if r.sequence == sequence]

    def tensor(self, sequence: int | None = None, fill: float | None = None) -> torch.Tensor:
        """``[batch, positions, ...]``: column ``j`` of row ``b`` is row ``b``'s ``j``-th recorded position (in
        order: positions of ``tokens.prompt``, steps of ``tokens.generated``); rows holding fewer positions
        (prompts of other lengths) are refused unless ``fill=`` gives the value for the missing ones
        (:meth:`positions` says which are real)."""
        picked = self._of(sequence)
        if not picked:
            raise HookscopeError(f"{self.name!r} recorded no position; check the positions passed as at=")
        by_row = self._by_row(picked)
        most = max(len(v) for v in by_row.values())
        if fill is None and any(len(v) != most for v in by_row.values()):
            counts = sorted({len(v) for v in by_row.values()})
            raise HookscopeError(f"the rows of {self.name!r} hold {counts} positions (prompts of different lengths); "
                                 "pass fill=float('nan') for the missing ones, or read get(row, position)")
        first = self.values[picked[0]]
        out = torch.full((max(by_row) + 1, most, *first.shape), float("nan") if fill is None else fill,
                         dtype=first.dtype, device=first.device)
        for b, items in by_row.items():
            for j, i in enumerate(items):
                out[b, j] = self.values[i]
        return out

    def positions(self, sequence: int | None = None) -> torch.Tensor:
        """``[batch, positions]``: the absolute position of each column of :meth:`tensor` (``-1``: filled)."""
        by_row = self._by_row(self._of(sequence))
        most = max((len(v) for v in by_row.values()), default=0)
        out = torch.full((max(by_row, default=-1) + 1, most), -1, dtype=torch.long)
        for b, items in by_row.items():
            out[b, : len(items)] = torch.tensor([self.rows[i].position for i in items])
        return out

    def _by_row(self, picked: list[int]) -> dict[int, list[int]]:
        by_row: dict[int, list[int]] = {}
        for i in sorted(picked, key=lambda i: (self.rows[i].row, self.rows[i].position)):
            by_row.setdefault(self.rows[i].row, []).append(i)
        return by_row

    def get(self, row: int, position: int, sequence: int | None = None) -> torch.Tensor:
        """The record of absolute ``position`` of batch ``row``."""
        for i in self._of(sequence):
            if self.rows[i].row == row and self.rows[i].position == position:
                return self.values[i]
        held = sorted({self.rows[i].position for i in self._of(sequence) if self.rows[i].row == row})
        raise HookscopeError(f"{self.name!r} holds no record of position {position} in row {row}; it holds "
                             f"positions {held[:8]}{' ...' if len(held) > 8 else ''}")


class StepRecords(Result, Mapping[str, StepRecord]):
    """A capture's records by step and absolute position: ``records[name]`` is a layer's
    :class:`StepRecord`; ``rows`` every recorded position of every layer (:class:`StepRow`)."""

    def __init__(self, layers: dict[str, StepRecord]) -> None:
        self._layers = layers
        self.rows = [r for rec in layers.values() for r in rec.rows]

    def __getitem__(self, name: str) -> StepRecord:
        if name not in self._layers:
            raise missing(name, "layer", self._layers)
        return self._layers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layers)

    def __len__(self) -> int:
        return len(self._layers)

    def __contains__(self, name: object) -> bool:
        return name in self._layers

    def table(self) -> str:
        return "\n".join(table(["layer", "sequence", "step", "row", "position", "shape"],
                     [[r.layer, str(r.sequence), str(r.step), str(r.row), str(r.position), "x".join(map(str, r.shape))]
                      for r in self.rows]))

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [dataclasses.asdict(r) for r in self.rows]}


@checked
def _records(recording: Any) -> StepRecords:
    followed = getattr(recording, "at", None)
    if not isinstance(followed, FollowedPositions):
        raise HookscopeError("tokens.records() reads a capture made with at= a token position (at=tokens.generated, "
                             "tokens.prompt, tokens.step(k), tokens.position(p)), after its block ended")
    layers: dict[str, StepRecord] = {}
    for name, entries in followed.log.items():
        calls = [c for c in recording.calls if c.name == name]
        if len(calls) != len(entries) or any(getattr(c, "dropped", False) for c in calls):
            raise HookscopeError(f"the capture kept {len(calls)} of the {len(entries)} calls of {name!r} (last= or "
                                 "on_call= drops calls); capture without them to read records by position")
        rows: list[StepRow] = []
        values: list[torch.Tensor] = []
        for call, entry in zip(calls, entries):
            packed = call.output
            for k, (row, pos) in enumerate(zip(entry.rows, entry.positions)):
                rows.append(StepRow(name, entry.sequence, entry.step, row, pos, tuple(packed.shape[1:])))
                values.append(packed[k])
        layers[name] = StepRecord(name, rows, values)
    return StepRecords(layers)
