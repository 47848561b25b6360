"""What pruning did, as a before/after table: parameters, zeros, multiply-adds, CPU latency, file size.

Collect (:func:`compare_models` runs both models: one counted pass each, then timed passes
interleaved), result (:class:`ModelComparison`, :class:`CompareRow`), render (:meth:`ModelComparison.table`).
Zeros come from the shared ``analysis._sparsity`` (a masked weight is ``<name>_orig * <name>_mask``),
mult-adds from the shared ``analysis._macs``. Must not import: any other analysis, ``cli``, ``viz``.
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ....core.inputs import model_args
from ...._tree import tensors
from ....core.failure import forward_error, received
from ....core.hooks import HookGroup
from ....core.inputs import model_kwargs, private
from ....core.result import Result, missing
from ....core.state import restored
from ....core.text import table
from ....errors import HookscopeError, checked
from ..._macs import ProductCounter, has_rule, own_macs
from ..._sparsity import effective, masked, model_zeros, zeros_in
from ._quality import Batch, batches, score

__all__ = ["CompareRow", "ModelComparison", "compare_models"]

_SPARSE_RULED = (nn.modules.conv._ConvNd, nn.Linear)  # each weight element takes part in equally many products


@dataclass(frozen=True)
class CompareRow:
    """One measure before and after; ``before`` is ``None`` where only the pair has a value
    (the output difference). ``ratio`` is ``after / before`` (``None`` without a nonzero ``before``).

    Example:
        >>> CompareRow("parameters", 100, 70, "").ratio
        0.7
    """

    name: str
    before: float | None
    after: float | None
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """``after / before``, or ``None`` when either is missing or ``before`` is 0."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data, ``ratio`` included."""
        return {**asdict(self), "ratio": self.ratio}


def _number(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v:.3f} ms"
    if unit == "":
        return f"{v:.3g}" if isinstance(v, float) else f"{v:,}"
    return f"{v:,} {unit}"


class ModelComparison(Result):
    """The result of :func:`compare_models`: ``rows`` (:class:`CompareRow`), ``c["parameters"]``, text, JSON.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(4, 2)
        >>> c = compare_models(net, net, torch.zeros(1, 4), repeats=1, warmup=0)
        >>> c["parameters"].before, c["parameters"].ratio, c["max abs output diff"].after
        (10, 1.0, 0.0)
    """

    def __init__(self, rows: list[CompareRow], *, before: str, after: str, repeats: int, threads: int) -> None:
        self.rows = rows
        self.before = before
        self.after = after
        self.repeats = repeats
        self.threads = threads
        self._by_name = {r.name: r for r in rows}

    def __getitem__(self, name: str) -> CompareRow:
        """The row named ``name`` (``"parameters"``, ``"CPU latency"``...)."""
        if name not in self._by_name:
            raise missing(name, "row", self._by_name)
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[CompareRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def table(self) -> str:
        """Before, after and their ratio, a row per measure, then what the numbers mean."""
        body = [[r.name, _number(r.before, r.unit), _number(r.after, r.unit),
                 "-" if r.ratio is None else f"{r.ratio:.3f}x", r.note] for r in self.rows]
        lines = table(("Measure", f"Before ({self.before})", f"After ({self.after})", "After/before", "Note"),
                      body, left={0, 4}, pad_last=False)
        lines.append(f"Latency: median of {self.repeats} runs each, before and after interleaved, "
                     f"torch.no_grad(), eval mode, {self.threads} CPU thread(s)")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the rows and how latency was measured."""
        return {"before": self.before, "after": self.after, "repeats": self.repeats, "threads": self.threads,
                "rows": [r.to_dict() for r in self.rows]}

    def __repr__(self) -> str:
        return f"ModelComparison({self.before} -> {self.after}, {len(self.rows)} rows)"


class _Macs:
    """Mult-adds of one pass: the rule of each ruled module, the products of functions called elsewhere."""

    def __init__(self) -> None:
        self.dense = 0
        self.inside = 0  # ruled modules running: the products they compute are counted by their rule
        self.uncounted: dict[str, None] = {}
        self.sparse: list[tuple[nn.Module, int]] = []  # (conv / linear, its mult-adds) per call

    def product(self, op: str, macs: int | None) -> None:
        if self.inside:
            return
        if macs is None:
            self.uncounted[op] = None
        else:
            self.dense += macs

    def register(self, model: nn.Module, group: HookGroup) -> None:
        for m in dict.fromkeys(model.modules()):
            if has_rule(m):
                # own hook: counts each ruled module's mult-adds as it runs; keeps no tensor
                group.add(m.register_forward_pre_hook(self._pre))
                group.add(m.register_forward_hook(self._post, with_kwargs=True))

    def _pre(self, module: nn.Module, args: Any) -> None:
        self.inside += 1

    def _post(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self.inside -= 1
        macs = own_macs(module, args, kwargs, output)
        self.dense += macs
        self.sparse.append((module, macs))

    def nonzero(self) -> int:
        """Mult-adds whose weight is not zero: each conv / linear call scaled by its weight's nonzero share."""
        total = self.dense
        for module, macs in self.sparse:
            if not isinstance(module, _SPARSE_RULED):
                continue
            weight = effective(module, "weight") if "weight" in masked(module) else module._parameters.get("weight")
            zeros = zeros_in(weight) if isinstance(weight, torch.Tensor) and weight.numel() else None
            if weight is not None and zeros is not None:
                total -= round(macs * zeros / weight.numel())
        return total


def _counted(model: nn.Module, args: tuple[Any, ...], kw: dict[str, Any], side: str) -> tuple[Any, _Macs]:
    """One pass of ``model`` on its own copy of the inputs, its mult-adds counted (hooks removed on exit,
    also on errors)."""
    counter, group = _Macs(), HookGroup()
    args, kw = private((args, kw))
    try:
        counter.register(model, group)
        with ProductCounter(counter.product):
            out = model(*args, **kw)
    except HookscopeError:
        raise
    except Exception as e:
        raise forward_error(e, f"the {side} model ({type(model).__name__})", got=received(args, kw),
                            after=None, run=f"{side}: ") from e
    finally:
        group.remove()
    return out, counter


def _file_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: a masked weight saves ``_orig`` and ``_mask`` both."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def _max_abs_diff(a: Any, b: Any) -> tuple[float | None, str]:
    """Largest ``|a - b|`` over every tensor of two (nested) outputs; ``None`` and why where they do not pair."""
    ta, tb = list(tensors(a)), list(tensors(b))
    if len(ta) != len(tb):
        return None, f"outputs hold {len(ta)} and {len(tb)} tensors: not compared"
    worst = 0.0
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x.shape != y.shape:
            return None, f"output tensor {i} is {tuple(x.shape)} before, {tuple(y.shape)} after: not compared"
        if x.numel():
            worst = max(worst, float((x.detach().double() - y.detach().double()).abs().max()))
    return worst, "same inputs, eval mode"


def _timed(model: nn.Module, args: tuple[Any, ...], kw: dict[str, Any]) -> float:
    """Milliseconds of one call on a private copy of the inputs, made before the clock starts."""
    args, kw = private((args, kw))
    start = time.perf_counter()
    model(*args, **kw)
    return (time.perf_counter() - start) * 1e3


def _latencies(models: tuple[nn.Module, nn.Module], args: tuple[Any, ...], kw: dict[str, Any],
               repeats: int, warmup: int) -> tuple[float, float]:
    """Median ms of each model, runs interleaved (and which goes first alternating) so load hits both."""
    runs: tuple[list[float], list[float]] = ([], [])
    for i in range(warmup + repeats):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for k in order:
            ms = _timed(models[k], args, kw)
            if i >= warmup:
                runs[k].append(ms)
    return statistics.median(runs[0]), statistics.median(runs[1])


def _check(models: tuple[Any, Any], repeats: Any, warmup: Any) -> None:
    for side, m in zip(("before", "after"), models):
        if not isinstance(m, nn.Module):
            raise HookscopeError(f"compare_models: {side} is a {type(m).__name__}, not an nn.Module; "
                                 "pass the two models, then the example inputs")
        where = {t.device.type for t in (*m.parameters(), *m.buffers())} - {"cpu"}
        if where:
            raise HookscopeError(f"compare_models measures CPU latency and the {side} model is on "
                                 f"{', '.join(sorted(where))}; pass model.cpu() (or a copy of it)")
    for name, v, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise HookscopeError(f"compare_models: {name}={v!r} is not a count; pass an int >= {low}")


def _measured(before: nn.Module, after: nn.Module, args: tuple[Any, ...], kw: dict[str, Any],
              repeats: int, warmup: int) -> list[CompareRow]:
    """Every row, the two models in eval mode under ``torch.no_grad()`` (put back by the caller)."""
    out_a, macs_a = _counted(before, args, kw, "before")
    out_b, macs_b = _counted(after, args, kw, "after")
    diff, how = _max_abs_diff(out_a, out_b)
    zeros_a, zeros_b = model_zeros(before), model_zeros(after)
    ms_a, ms_b = _latencies((before, after), args, kw, repeats, warmup)
    partial = " (lower bound: " + ", ".join({**macs_a.uncounted, **macs_b.uncounted}) + " not counted)" \
        if macs_a.uncounted or macs_b.uncounted else ""
    return [
        CompareRow("parameters", zeros_a.elements, zeros_b.elements, "",
                   "each tensor once; a masked weight counts once (<name>_orig)"),
        CompareRow("nonzero parameters", _nonzero(zeros_a.elements, zeros_a.zeros),
                   _nonzero(zeros_b.elements, zeros_b.zeros), "", "masks applied"),
        CompareRow("multiply-adds", macs_a.dense, macs_b.dense, "",
                   "as dense kernels compute them: a mask saves none" + partial),
        CompareRow("nonzero-weight multiply-adds", macs_a.nonzero(), macs_b.nonzero(), "",
                   "conv / linear products with a zero weight left out: what sparse kernels could skip"),
        CompareRow("CPU latency", ms_a, ms_b, "ms", f"median of {repeats}"),
        CompareRow("file size", _file_bytes(before), _file_bytes(after), "B",
                   "torch.save(state_dict): a masked weight saves <name>_orig and <name>_mask"),
        CompareRow("max abs output diff", None, diff, "", how),
    ]


def _quality_row(models: tuple[nn.Module, nn.Module], kind: str, data: list[Batch]) -> CompareRow:
    """Perplexity or accuracy of both models on the same batches."""
    a, b = score(models[0], kind, data, "before"), score(models[1], kind, data, "after")
    what = (f"exp(mean next-token NLL) over {a.count:,} tokens" if kind == "perplexity"
            else f"top-1, share of {a.count:,} samples")
    return CompareRow(kind, a.value, b.value, "", f"{what} in {len(data)} batch(es); lower is better"
                      if kind == "perplexity" else f"{what} in {len(data)} batch(es)")


def _nonzero(elements: int, zeros: int | None) -> int | None:
    return None if zeros is None else elements - zeros


@checked
def compare_models(
    before: nn.Module,
    after: nn.Module,
    inputs: Any = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    repeats: int = 10,
    warmup: int = 2,
    data: Any = None,
    quality: str | None = None,
) -> ModelComparison:
    """Measure two models (an original and its pruned version) side by side on the same inputs.

    Rows: ``"parameters"`` (each tensor once; a masked weight once, as ``<name>_orig``),
    ``"nonzero parameters"`` (masks applied), ``"multiply-adds"`` (as dense kernels compute them:
    masking saves none, removing channels does), ``"nonzero-weight multiply-adds"`` (convolution and
    linear products whose weight is zero left out: what a sparse kernel could skip at best),
    ``"CPU latency"`` (median ms of ``repeats`` runs after ``warmup`` runs, before and after
    interleaved, alternating which runs first, so background load falls on both), ``"file size"``
    (bytes of ``torch.save(model.state_dict())``: a masked weight saves both ``<name>_orig`` and
    ``<name>_mask``, bigger than the original) and ``"max abs output diff"`` (over every output tensor).
    With ``data``, one more row scores both models on it: ``"perplexity"`` for a language model
    (``exp`` of the mean negative log-likelihood of each next token: the logits at position ``t``
    scored against token ``t + 1``, as Hugging Face shifts its labels; labels ``-100`` and padding
    where ``attention_mask`` is 0 are skipped) or ``"accuracy"`` for a classifier (the share of
    samples whose highest score is the label).

    Every run (each model's counted pass, each timed and warm-up call) gets its own copy of the
    inputs, made outside the timed region: a model that writes into its input changes neither the
    caller's tensors nor what the other model or a later run sees.
    Both models run in eval mode under ``torch.no_grad()``; every module's train/eval flag, the
    buffers and the random generators are put back, and the hooks counting mult-adds are removed,
    also on errors (pruning masks, being the model's own pre-hooks, stay).

    Args:
        before, after: the two models, on the CPU; the same model twice is allowed.
        inputs: the example positional inputs, given to both.
        kwargs: the example keyword inputs, given to both.
        repeats: timed runs per model (>= 1).
        warmup: untimed runs per model first (>= 0).
        data: batches to score both models on (a list, read once, or one batch): token ids
            ``[batch, tokens]``, dicts of model keyword inputs holding ``input_ids`` (and optionally
            ``labels``), or ``(input_ids, labels)`` pairs for perplexity; ``(inputs, labels)`` pairs with
            ``labels`` a 1-D tensor of class indices for accuracy. The model's scores are its output
            tensor, its ``.logits``, or the first tensor of a tuple. Without example ``inputs`` the
            first batch's inputs are timed and counted.
        quality: ``"perplexity"``, ``"accuracy"``, or ``None`` to take it from the batches' form
            (token ids: perplexity; ``(inputs, labels)`` with 1-D labels: accuracy).

    Returns:
        A :class:`ModelComparison`: ``print(c)`` shows the table; ``c["file size"].ratio``, ``c.to_json()``.

    Raises:
        HookscopeError: a model that is not an ``nn.Module`` or not on the CPU, a bad count, data that
            is not batches of the measure's form, a model output without scores of the right shape.
        ForwardError: a model's forward pass failed on the inputs.

    Example:
        >>> import torch
        >>> from torch.nn.utils import prune
        >>> net = torch.nn.Linear(8, 4)
        >>> pruned = torch.nn.Linear(8, 4)
        >>> _ = pruned.load_state_dict(net.state_dict())
        >>> _ = prune.l1_unstructured(pruned, "weight", amount=16)
        >>> c = compare_models(net, pruned, torch.randn(2, 8), repeats=2)
        >>> c["parameters"].after, c["nonzero parameters"].after, c["multiply-adds"].after
        (36, 20, 64)
        >>> c["nonzero-weight multiply-adds"].after, c["file size"].ratio > 1
        (32, True)
        >>> labelled = [(torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0]))]
        >>> c = compare_models(net, pruned, data=labelled, repeats=1)   # accuracy, from the batches' form
        >>> 0 <= c["accuracy"].before <= 1
        True
    """
    inputs = model_args(inputs)
    _check((before, after), repeats, warmup)
    kw = model_kwargs(kwargs)
    kind, scored = batches(data, quality) if data is not None else (None, [])
    if quality is not None and data is None:
        raise HookscopeError(f"compare_models: quality={quality!r} needs data=, the batches to score both "
                             "models on")
    if not inputs and not kw and scored:
        inputs, kw = scored[0].args, scored[0].kwargs
    if not inputs and not kw:
        raise HookscopeError("compare_models runs both models and needs an example input: "
                             "compare_models(model, pruned, torch.randn(1, 3, 224, 224))")
    with restored(before, train=False), restored(after, train=False), torch.no_grad():
        rows = _measured(before, after, inputs, kw, repeats, warmup)
        if kind is not None:
            rows.append(_quality_row((before, after), kind, scored))
    return ModelComparison(rows, before=type(before).__name__, after=type(after).__name__, repeats=repeats,
                      threads=torch.get_num_threads())
