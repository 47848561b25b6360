"""One streaming pass of the model over calibration batches, reducing each site's output in its hook.

The forward hooks reduce each call to per-channel sums on the device (no host sync, nothing kept
per call). Gradient kinds read each site's output as its module returned it and the gradient with
respect to that value, also where the model rewrites the output in place later (``out += identity``
after a BatchNorm, ``F.relu(x, inplace=True)``): a :func:`hookscope.capture` of the sites keeps both
for the batch (a copy of each site's output, made as its module returns), and
``torch.autograd.grad`` of the loss with respect to the sites' gradient edges, taken when each module
returned, drives the backward through them only, so the parameters' ``.grad`` stay untouched.
"""

from __future__ import annotations

import contextlib
import difflib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from ...._tree import first_tensor, tree_map
from ....capture import capture
from ....core.hooks import HookGroup
from ....core.inputs import private
from ....core.state import restored
from ....core.text import first_line
from ....errors import ForwardError, HookscopeError
from ....records import CallRecord, Recording
from ..._targets import call_model, logits_of
from ._kinds import Kind, accumulator_dtype, channels_first
from ._sites import Site, output_dim

__all__ = ["Accumulator", "SiteCalls", "Batch", "Loss", "split_batch", "batches_of", "calibrate", "batch_to", "loss_of",
           "plain_passes", "check_kind", "check_share"]

Loss = Callable[[Any, Any], torch.Tensor]
_LOCK = threading.Lock()


@dataclass
class Accumulator:
    """Running per-channel sums of one site, on its device: ``sums / count`` is the mean.

    Example:
        >>> acc = Accumulator()
        >>> acc.add(torch.tensor([2., 4.]), 2); acc.add(torch.tensor([0., 2.]), 2)
        >>> (acc.sums / acc.count).tolist(), acc.calls
        ([0.5, 1.5], 2)
    """

    sums: torch.Tensor | None = None
    count: int = 0
    calls: int = 0
    dim: int | None = None
    ndim: int = 0

    def add(self, sums: torch.Tensor, count: int) -> None:
        with _LOCK:  # DataParallel runs the hooks of its replicas in threads, on their own devices
            self.sums = (sums.to(accumulator_dtype(sums.device)) if self.sums is None
                         else self.sums + sums.to(self.sums.device, non_blocking=True))
            self.count += count
            self.calls += 1


@dataclass
class SiteCalls:
    """The accumulators of one site, one per call number within a forward pass (a module called
    several times per forward, such as a ResNet block's shared ReLU, gets one per call, each of its
    own size), and how many times the site ran in each forward.

    The call counter restarts at :meth:`start` (once per batch) and counts per device (DataParallel's
    replicas each run the module on their own chunk).

    Example:
        >>> sc = SiteCalls()
        >>> sc.start()
        >>> for n in (2, 3):
        ...     k, acc = sc.next(torch.device("cpu")); acc.add(torch.ones(n), 1)
        >>> sc.start(); k, [a.sums.tolist() for a in sc.per_call], sc.per_forward
        (1, [[1.0, 1.0], [1.0, 1.0, 1.0]], {2})
    """

    per_call: list[Accumulator] = field(default_factory=list)
    per_forward: set[int] = field(default_factory=set)
    counter: dict[torch.device, int] = field(default_factory=dict)
    started: bool = False

    def start(self) -> None:
        """End the previous forward pass (recording its calls), start counting the next one."""
        with _LOCK:
            if self.started:
                self.per_forward.add(max(self.counter.values(), default=0))
            self.counter, self.started = {}, True

    def next(self, device: torch.device) -> tuple[int, Accumulator]:
        """This call's number within the forward pass (on ``device``) and its accumulator."""
        with _LOCK:
            k = self.counter.get(device, 0)
            self.counter[device] = k + 1
            while len(self.per_call) <= k:
                self.per_call.append(Accumulator())
            return k, self.per_call[k]

    @property
    def calls(self) -> int:
        """Every call over the calibration data."""
        return sum(a.calls for a in self.per_call)


@dataclass
class Batch:
    """One calibration batch split into the model's inputs and its labels.

    Example:
        >>> b = split_batch((torch.zeros(3, 2), torch.tensor([0, 1, 1])), 0)
        >>> len(b.args), b.size, b.labels.tolist()
        (1, 3, [0, 1, 1])
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    labels: Any
    size: int
    raw: Any = field(repr=False, default=None)


def _inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}


def split_batch(batch: Any, index: int) -> Batch:
    """A batch as the model's inputs: a tensor, ``(inputs, labels)`` (inputs a tensor, a tuple of
    positional inputs or a dict of keyword inputs), or a dict of keyword inputs (its ``"labels"``
    are the labels, and reach the model too).

    Example:
        >>> split_batch({"x": torch.zeros(4, 2)}, 0).size
        4
    """
    if isinstance(batch, (tuple, list)):
        if len(batch) != 2:
            raise HookscopeError(f"calibration batch {index} is a {type(batch).__name__} of {len(batch)}; give "
                                 "a tensor, (inputs, labels), or a dict of the model's keyword inputs")
        (args, kwargs), labels = _inputs(batch[0]), batch[1]
    else:
        (args, kwargs), labels = _inputs(batch), None
        labels = kwargs.get("labels")
    first = first_tensor((args, kwargs))
    if first is None or first.ndim == 0:
        raise HookscopeError(f"calibration batch {index} holds no input tensor with a batch dim; give a "
                             "tensor, (inputs, labels), or a dict of the model's keyword inputs")
    return Batch(args, kwargs, labels, int(first.shape[0]), batch)


def batches_of(data: Any) -> Iterable[Any]:
    """The batches of ``data``: a tensor, a tuple ``(inputs, labels)`` or a dict is one batch; a list,
    a DataLoader or any other iterable gives its items.

    Example:
        >>> len(list(batches_of(torch.zeros(5, 2)))), len(list(batches_of([torch.zeros(1), torch.zeros(2)])))
        (1, 2)
    """
    if isinstance(data, (torch.Tensor, tuple, Mapping)):
        return [data]
    if data is None or isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise HookscopeError(f"data={type(data).__name__} is not calibration data; pass a tensor, (inputs, "
                             "labels), a dict of keyword inputs, or a list / DataLoader of them")
    return data


def batch_to(batch: Batch, device: torch.device | None) -> Batch:
    """The batch for one run: the model's inputs a private copy (on ``device``), so a model writing into
    its input changes neither the caller's batch nor a later run; labels and ``raw`` moved only."""
    args, kwargs = private((batch.args, batch.kwargs), device)
    if device is None:
        return Batch(args, kwargs, batch.labels, batch.size, batch.raw)
    move = lambda t: t.to(device)  # noqa: E731
    return Batch(args, kwargs, tree_map(move, batch.labels), batch.size, tree_map(move, batch.raw))


class _Collector:
    """The forward hooks of one pass: one accumulator per site, and for gradient kinds the calls of the
    batch waiting for their gradients (the site, its accumulator, its device and its gradient edge)."""

    def __init__(self, sites: list[Site], kind: Kind) -> None:
        self.sites, self.kind = sites, kind
        self.accs = {s.name: SiteCalls() for s in sites}
        self.pending: list[tuple[Site, Accumulator, torch.device, GradientEdge]] = []

    def start(self) -> None:
        """A new forward pass: every site's call counter restarts."""
        for calls in self.accs.values():
            calls.start()

    def hook(self, site: Site) -> Callable[[nn.Module, Any, Any], None]:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, torch.Tensor):
                raise HookscopeError(f"site {site.name!r} ({type(module).__name__}) returns a "
                                     f"{type(output).__name__}, not a tensor; choose a module that returns one")
            call, acc = self.accs[site.name].next(output.device)
            if acc.dim is None:
                acc.dim, acc.ndim = output_dim(site, output), output.ndim
            if acc.sums is not None and (output.ndim != acc.ndim or output.shape[acc.dim] != acc.sums.shape[0]):
                raise HookscopeError(f"site {site.name!r} gave {acc.sums.shape[0]} channels on one call and an "
                                     f"output of shape {tuple(output.shape)} on another (call {call} of "
                                     "a forward pass); score sites whose channels stay the same")
            if self.kind.reads == "gradient":
                if not output.requires_grad:
                    raise HookscopeError(f"taylor: no gradient reaches {site.name!r}: its output depends on no "
                                         "parameter; choose a site after a layer with weights")
                # the edge of the value as returned: a later in-place op gives the tensor a new one
                self.pending.append((site, acc, output.device, get_gradient_edge(output)))
                return
            acc.add(*self.kind.reduce(channels_first(output, acc.dim), None))

        return record

    def backward(self, loss: torch.Tensor) -> None:
        """Run the backward pass from ``loss`` through every waiting call's output (as it was returned),
        no further: the capture's gradient hooks on those outputs record ``dL/da``."""
        if not self.pending:
            return
        if not loss.requires_grad:
            raise HookscopeError("taylor: the loss does not depend on the model's output (detached?); "
                                 "return a loss computed from the output in loss=")
        torch.autograd.grad(loss, [edge for *_, edge in self.pending], allow_unused=True)

    def reduce(self, rec: Recording) -> None:
        """Reduce ``a * dL/da`` of every waiting call from the capture's record of it, then forget them."""
        pending, self.pending = self.pending, []
        queues: dict[tuple[str, torch.device], deque[CallRecord]] = {}
        for call in rec.calls:
            queues.setdefault((call.name, _read(call, "output").device), deque()).append(call)
        for site, acc, device, _ in pending:
            assert acc.dim is not None
            call = queues[(site.name, device)].popleft()  # calls of one site on one device come in order
            a = _read(call, "output")
            g = _read(call, "grad_output")
            g = torch.zeros_like(a) if g is None else g  # the site does not reach the loss
            acc.add(*self.kind.reduce(channels_first(a, acc.dim), channels_first(g, acc.dim)))


def _read(call: CallRecord, field: str) -> Any:
    """A field of a captured call, or one line saying why taylor cannot have its true value."""
    try:
        return getattr(call, field)
    except HookscopeError as e:
        raise HookscopeError(f"taylor at {call.name!r}: {e}") from None


def loss_of(loss: Loss | None, out: Any, batch: Batch, index: int) -> torch.Tensor:
    """The scalar whose gradient Taylor reads: ``loss(output, batch)`` (per-sample values are summed),
    or the summed cross entropy of the logits against the batch's labels."""
    try:
        if loss is not None:
            value = loss(out, batch.raw)
        else:
            logits = out if isinstance(out, torch.Tensor) else logits_of(out)
            if logits is None:
                raise HookscopeError(f"taylor's default loss needs logits, and the model returns a "
                                     f"{type(out).__name__}; pass loss=lambda output, batch: ...")
            labels = batch.labels
            value = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum")
    except HookscopeError:
        raise
    except Exception as e:
        what = "loss=" if loss is not None else "the default cross-entropy loss"
        raise HookscopeError(f"{what} failed on calibration batch {index} ({type(e).__name__}: "
                             f"{first_line(e)}); fix loss= or the batch's labels") from e
    if not isinstance(value, torch.Tensor) or value.ndim > 1:
        raise HookscopeError(f"loss= returned {type(value).__name__} for calibration batch {index}; "
                             "return a scalar tensor (or one loss per sample)")
    return value.sum()


@contextlib.contextmanager
def _prepared(model: nn.Module, kind: Kind, train: bool) -> Iterator[None]:
    """Modes, buffers and ``requires_grad`` as the pass needs them; all put back after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    with contextlib.ExitStack() as stack:
        stack.enter_context(restored(model, train=train, buffers=True))
        if kind.reads == "gradient":  # also inside a caller's no_grad() or inference_mode()
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
            for p, _ in flags:  # a frozen model still needs a graph to reach the sites
                p.requires_grad_(True)
        else:
            stack.enter_context(torch.no_grad())
        try:
            yield
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)


def _forward(model: nn.Module, batch: Batch, index: int) -> Any:
    try:
        return call_model(model, batch.args, batch.kwargs)
    except ForwardError as e:
        raise ForwardError(f"calibration batch {index}: {e}") from e.__cause__


def _run(model: nn.Module, batch: Batch, index: int, collector: _Collector, loss: Loss | None) -> None:
    if collector.kind.reads != "gradient":
        _forward(model, batch, index)
        return
    if loss is None and batch.labels is None:
        raise HookscopeError(f"taylor needs a loss, and calibration batch {index} has no labels; give "
                             "(inputs, labels) batches or loss=lambda output, batch: ...")
    wanted = {id(s.module): s.name for s in collector.sites}
    # capture's own copy policy: each output as returned, also where the model rewrites it in place later
    with capture(model, lambda name, m: wanted.get(id(m)) == name, keep=("output", "grad_output")) as rec:
        out = _forward(model, batch, index)
        collector.backward(loss_of(loss, out, batch, index))
    collector.reduce(rec)  # after the block: a gradient lost to an in-place op on a view is known by then


def calibrate(model: nn.Module, inner: nn.Module, data: Any, sites: list[Site], kind: Kind, *,
              loss: Loss | None, device: torch.device | None, max_batches: int | None,
              train: bool) -> tuple[dict[str, SiteCalls], int, int]:
    """Run ``model`` once per batch with a hook on each site; ``(accumulators per call, batches, samples)``.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3))
        >>> from ._kinds import get_kind
        >>> from ._sites import resolve_sites
        >>> accs, b, n = calibrate(net, net, [torch.ones(2, 2)], resolve_sites(net, "0"), get_kind("activation"),
        ...                        loss=None, device=None, max_batches=None, train=False)
        >>> b, n, accs["0"].per_call[0].count, accs["0"].per_forward
        (1, 2, 2, {1})
    """
    collector = _Collector(sites, kind)
    batches = samples = 0
    with HookGroup() as group, _prepared(inner, kind, train):
        for s in sites:
            # own hook: folds each call's statistics into running sums on the device, batch after batch; keeps no tensor
            group.add(s.module.register_forward_hook(collector.hook(s)))
        for index, raw in enumerate(batches_of(data)):
            if max_batches is not None and index >= max_batches:
                break
            batch = batch_to(split_batch(raw, index), device)
            collector.start()
            try:
                _run(model, batch, index, collector, loss)
            finally:
                collector.pending = []
            batches, samples = batches + 1, samples + batch.size
        collector.start()  # records the last forward's calls
    return collector.accs, batches, samples


def plain_passes(model: nn.Module, batches: Iterable[Any], device: torch.device | str | None) -> None:
    """Run ``model`` on each ``(args, kwargs)`` batch (a private copy, on ``device``) in eval mode without
    gradients, its flags and buffers put back after: the passes that hooks placed by the caller read.

    Example:
        >>> net = nn.Sequential(nn.BatchNorm1d(2)).train()
        >>> plain_passes(net, [((torch.ones(3, 2),), {})], None)
        >>> net.training, int(net[0].num_batches_tracked)
        (True, 0)
    """
    with restored(model, train=False, buffers=True), torch.no_grad():
        for batch in batches:
            args, kw = private(batch, torch.device(device) if device is not None else None)
            call_model(model, args, kw)


def check_kind(importance: object, known: tuple[str, ...]) -> None:
    """Refuse an importance kind not in ``known``, with the nearest one as a hint.

    Example:
        >>> check_kind("l2", ("output", "l2"))
        >>> check_kind("outptu", ("output", "l2"))
        Traceback (most recent call last):
        hookscope.errors.HookscopeError: importance='outptu' is not known. Did you mean 'output'? Pass one of output, l2
    """
    if importance not in known:
        near = difflib.get_close_matches(str(importance), known, n=1)
        hint = f"Did you mean {near[0]!r}? " if near else ""
        raise HookscopeError(f"importance={importance!r} is not known. {hint}Pass one of {', '.join(known)}")


def check_share(value: object, name: str, what: str, example: str) -> float:
    """``value`` as a float in [0, 1), else one line: ``name=value is not a fraction of what ...``.

    Example:
        >>> check_share(0.5, "amount", "heads", "amount=0.5")
        0.5
        >>> check_share(True, "amount", "heads", "amount=0.5")
        Traceback (most recent call last):
        hookscope.errors.HookscopeError: amount=True is not a fraction of heads in [0, 1); pass e.g. amount=0.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise HookscopeError(f"{name}={value!r} is not a fraction of {what} in [0, 1); pass e.g. {example}")
    return float(value)
