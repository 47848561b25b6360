"""Channel importance from the model at work: one score per output channel of each site, low = prune first.

Kinds (one table, :mod:`._kinds`): ``"l1"`` / ``"l2"`` (norm of the site's weight rows, no
data), ``"activation"`` (mean |activation|), ``"apoz"`` (1 - fraction of zeros, after a ReLU) and
``"taylor"`` (first-order Taylor, activation x gradient). Data kinds run the model once per batch
(Taylor: one forward and one ``torch.autograd.grad`` per batch), streaming: per-channel sums stay on
the device, so memory is flat in the number of batches. Collect (:mod:`._run`), result
and render (here).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ....core.result import Result, missing
from ....core.text import num, table
from ....errors import HookscopeError, checked
from ....selection import Layers, Selector, unwrap
from ._kinds import Kind, get_kind
from ._run import Loss, SiteCalls, calibrate
from ._sites import Site, resolve_sites, weight_rows

__all__ = ["CallScores", "ChannelImportance", "ImportanceRow", "Scores", "channel_importance"]


@dataclass(frozen=True)
class ImportanceRow:
    """One site of an :class:`ChannelImportance` (a row of ``res.rows``), or one call of a site whose calls
    per forward carry different channel counts.

    Attributes:
        site: the module's qualified name.
        dim: the channel dim of its output (``None`` for weight kinds, which read weight rows).
        channels: how many channels were scored.
        calls: the module's calls over the calibration set (a shared module counts every call).
        min, mean, max: of its scores.
        lowest: up to 3 channels with the lowest scores, lowest first (pruned first).
        call: ``None`` for every call together, else the call number within a forward pass.
    """

    site: str
    dim: int | None
    channels: int
    calls: int
    min: float
    mean: float
    max: float
    lowest: tuple[int, ...]
    call: int | None = None


@dataclass(frozen=True)
class CallScores:
    """The scores of one call number of a site within a forward pass (``ChannelImportance.per_call``).

    Attributes:
        scores: ``C`` scores of that call, float64 on the CPU.
        dim: the channel dim of that call's output (non-negative).
        ndim: the number of dims of that call's output.
        calls: how many times it ran (once per batch, per device).

    Example:
        >>> CallScores(torch.ones(2, dtype=torch.float64), 1, 4, 3).scores.shape
        torch.Size([2])
    """

    scores: torch.Tensor
    dim: int
    ndim: int
    calls: int


class Scores(dict[str, torch.Tensor]):
    """``ChannelImportance.scores``: site -> scores of every call together; a site whose calls per forward
    carry different channel counts has none, and reading it says to read one call.

    Example:
        >>> s = Scores({"a": torch.ones(1)}, mixed={"relu": (64, 256)})
        >>> s["relu"]
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: 'relu' carries 64, 256 channels on its 2 calls per forward, which cannot be scored together; read one call with take('relu', call=k)
    """

    def __init__(self, scores: Mapping[str, torch.Tensor] | None = None, *,
                 mixed: Mapping[str, tuple[int, ...]] | None = None) -> None:
        super().__init__(scores or {})
        self.mixed = dict(mixed or {})

    def __missing__(self, site: str) -> torch.Tensor:
        if site in self.mixed:
            counts = self.mixed[site]
            raise HookscopeError(f"{site!r} carries {', '.join(map(str, counts))} channels on its {len(counts)} "
                                 "calls per forward, which cannot be scored together; read one call with "
                                 f"take({site!r}, call=k)")
        raise KeyError(site)


@dataclass
class ChannelImportance(Result):
    """What :func:`channel_importance` returns: a score per output channel of each site, low = prune first.

    Attributes:
        kind: the importance kind.
        scores: site -> ``C`` scores, float64 on the CPU, every call of the site together;
            ``scores[site][positions]`` scores the channels at those positions of the site's channel
            dim. A site whose calls per forward carry different channel counts has none (reading it
            raises, naming ``take(site, call=k)``).
        dims: site -> the channel dim of its output (non-negative; its first call's), ``None`` for
            weight kinds.
        calls: site -> how many times the module ran (every call is accumulated).
        batches, samples: how much calibration data was read (0 for weight kinds).
        ndims: site -> the number of dims of its output (to read a negative ``dim`` in :meth:`take`).
        per_call: site -> one :class:`CallScores` per call number within a forward pass, in
            execution order (data kinds).
        calls_per_forward: site -> how many times it ran in each forward pass; a site whose count
            differed between batches is missing (its calls cannot be read one by one).
        uneven: site -> the different counts of calls per forward seen, for such a site.

    Example:
        >>> res = ChannelImportance("l1", {"fc": torch.tensor([3., 1., 2.], dtype=torch.float64)}, {"fc": None})
        >>> res.order("fc"), res.rows[0].lowest
        ([1, 2, 0], (1, 2, 0))
    """

    kind: str
    scores: dict[str, torch.Tensor]
    dims: dict[str, int | None]
    calls: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    samples: int = 0
    ndims: dict[str, int] = field(default_factory=dict)
    per_call: dict[str, list[CallScores]] = field(default_factory=dict)
    calls_per_forward: dict[str, int] = field(default_factory=dict)
    uneven: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __getitem__(self, site: str) -> torch.Tensor:
        if site not in self.scores and site not in self.per_call:
            raise missing(site, "site", self.dims)
        return self.scores[site]

    def __contains__(self, site: object) -> bool:
        return site in self.scores or site in self.per_call

    def take(self, site: str, positions: Sequence[int] | torch.Tensor | None = None, *,
             dim: int | None = None, call: int | None = None) -> torch.Tensor:
        """The scores of ``site`` at ``positions`` along its channel dim (all of them without), checking,
        when ``dim`` is given, that the channels were scored along that dim of the site's output (a
        channel group's ``(site, dim, positions)`` reads its scores so). ``call=k`` reads the k-th
        call (0-based, in execution order) of the site within each forward pass only, as a module
        called several times per forward (a ResNet block's ReLU) carries different channels on each.

        Example:
            >>> res = ChannelImportance("activation", {"act": torch.tensor([3., 1., 2.], dtype=torch.float64)},
            ...                  {"act": 2}, ndims={"act": 3})
            >>> res.take("act", [2, 0], dim=-1).tolist()
            [2.0, 3.0]
            >>> res.take("act", [0], dim=1)
            Traceback (most recent call last):
            ...
            hookscope.errors.HookscopeError: 'act' was scored along dim 2 of its 3-D output, not dim 1; measure it with sites={'act': 1}
        """
        if call is None:
            scores = self[site]
            layouts = ([(c.dim, c.ndim) for c in self.per_call[site]] if site in self.per_call
                       else [(self.dims.get(site), self.ndims.get(site, 0))])
        else:
            one = self._call(site, call)
            scores, layouts = one.scores, [(one.dim, one.ndim)]
        for scored, ndim in layouts:
            if dim is not None and scored is not None and ndim and (dim % ndim) != scored:
                raise HookscopeError(f"{site!r} was scored along dim {scored} of its {ndim}-D output, not dim "
                                     f"{dim}; measure it with sites={{{site!r}: {dim}}}")
        if positions is None:
            return scores
        return scores[torch.as_tensor(positions, dtype=torch.long)]

    def _call(self, site: str, call: object) -> CallScores:
        if site not in self:
            raise missing(site, "site", self.dims)
        if site not in self.per_call:
            raise HookscopeError(f"importance={self.kind!r} reads the weights, not calls of {site!r}; drop call=")
        if site in self.uneven:
            raise HookscopeError(f"{site!r} ran {' or '.join(map(str, self.uneven[site]))} times per forward over "
                                 "the calibration batches, so its calls cannot be read one by one; drop call= "
                                 "(every call together) or give batches that run it the same way")
        n = self.calls_per_forward[site]
        if isinstance(call, bool) or not isinstance(call, int) or not 0 <= call < n:
            raise HookscopeError(f"call={call!r}: {site!r} ran {n} time{'s' if n != 1 else ''} per forward, so "
                                 f"call is one of 0..{n - 1}")
        return self.per_call[site][call]

    def order(self, site: str, *, call: int | None = None) -> list[int]:
        """The channels of ``site`` (of its call ``call`` only, if given) from least to most important
        (ties: lower index first)."""
        found: list[int] = torch.sort(self.take(site, call=call), stable=True).indices.tolist()
        return found

    def _row(self, site: str, s: torch.Tensor, dim: int | None, calls: int, call: int | None) -> ImportanceRow:
        lowest = tuple(torch.sort(s, stable=True).indices[:3].tolist())
        lo, mid, hi = (float(f(s)) if s.numel() else float("nan") for f in (torch.min, torch.mean, torch.max))
        return ImportanceRow(site, dim, s.numel(), calls, lo, mid, hi, lowest, call)

    @property
    def rows(self) -> list[ImportanceRow]:
        """One row per site, in the model's order; one per call for a site whose calls per forward carry
        different channel counts."""
        rows = []
        for name in self.dims:
            if name in self.scores:
                rows.append(self._row(name, self.scores[name], self.dims.get(name), self.calls.get(name, 0), None))
            else:
                rows += [self._row(name, c.scores, c.dim, c.calls, k) for k, c in enumerate(self.per_call[name])]
        return rows

    def table(self) -> str:
        """A heading, then one line per site (also ``str(res)``); a ``call`` column when a site's calls
        carry different channel counts.

        Example:
            >>> print(ChannelImportance("l2", {"fc": torch.tensor([3., 4.], dtype=torch.float64)}, {"fc": None}))
            channel importance (l2, low = prune first), from the weights
            site  dim  channels  calls  min  mean  max  lowest
            --------------------------------------------------
            fc      -         2      0    3   3.5    4  0, 1
        """
        data = (f"over {self.samples} samples in {self.batches} batch{'es' if self.batches != 1 else ''}"
                if self.batches else "from the weights")
        rows = self.rows
        by_call = any(r.call is not None for r in rows)
        body = [[r.site, *([("all" if r.call is None else str(r.call))] if by_call else []),
                 "-" if r.dim is None else str(r.dim), str(r.channels), str(r.calls), num(r.min),
                 num(r.mean), num(r.max), ", ".join(map(str, r.lowest))] for r in rows]
        head = ["site", *(["call"] if by_call else []), "dim", "channels", "calls", "min", "mean", "max", "lowest"]
        return "\n".join([f"channel importance ({self.kind}, low = prune first), {data}",
                          *table(head, body, left={0, len(head) - 1})])

    def to_dict(self) -> dict[str, Any]:
        """Plain Python data; ``scores`` as lists of floats, ``call_scores`` one list per call number for
        the sites run several times per forward.

        Example:
            >>> ChannelImportance("l1", {"fc": torch.ones(2, dtype=torch.float64)}, {"fc": None}).to_dict()["scores"]
            {'fc': [1.0, 1.0]}
        """
        return {"kind": self.kind, "batches": self.batches, "samples": self.samples,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "scores": {k: v.tolist() for k, v in self.scores.items()},
                "calls_per_forward": dict(self.calls_per_forward),
                "call_scores": {k: [c.scores.tolist() for c in v] for k, v in self.per_call.items() if len(v) > 1}}


def _weight_scores(sites: list[Site], kind: Kind) -> ChannelImportance:
    scores = {s.name: kind.finish(kind.reduce(weight_rows(s), None)[0]).cpu() for s in sites}
    return ChannelImportance(kind.name, scores, {s.name: None for s in sites})


def _per_call(kind: Kind, calls: SiteCalls) -> list[CallScores]:
    sums = [a.sums for a in calls.per_call]
    means = torch.cat([s / a.count for s, a in zip(sums, calls.per_call) if s is not None])  # one transfer
    scores = kind.finish(means).to("cpu", torch.float64).split([len(s) for s in sums if s is not None])
    return [CallScores(v, a.dim, a.ndim, a.calls) for v, a in zip(scores, calls.per_call) if a.dim is not None]


def _together(kind: Kind, calls: SiteCalls) -> torch.Tensor:
    """Every call of the site as one: the channel sums of all its calls over all their counts."""
    sums = [a.sums for a in calls.per_call if a.sums is not None]
    total = torch.stack([t.to(sums[0].device) for t in sums]).sum(0)
    return kind.finish(total / sum(a.count for a in calls.per_call)).to("cpu", torch.float64)


def _collected(sites: list[Site], kind: Kind, accs: dict[str, SiteCalls], batches: int, samples: int) -> ChannelImportance:
    """The result of a data pass: per-call scores, and every call together where the channels agree."""
    res = ChannelImportance(kind.name, Scores(), {}, batches=batches, samples=samples)
    for s in sites:
        calls = accs[s.name]
        if not calls.per_call or any(a.sums is None for a in calls.per_call):
            raise HookscopeError(f"site {s.name!r} never ran over the calibration data; choose a module the "
                                 "forward pass calls (hookscope.trace(model, x) lists them)")
        per = res.per_call[s.name] = _per_call(kind, calls)
        res.dims[s.name], res.ndims[s.name], res.calls[s.name] = per[0].dim, per[0].ndim, calls.calls
        counts = tuple(len(c.scores) for c in per)
        if len(set(counts)) == 1:
            res.scores[s.name] = per[0].scores if len(per) == 1 else _together(kind, calls)
        else:
            res.scores.mixed[s.name] = counts  # type: ignore[attr-defined]
        if len(calls.per_forward) == 1:
            res.calls_per_forward[s.name] = next(iter(calls.per_forward))
        else:
            res.uneven[s.name] = tuple(sorted(calls.per_forward))
        if kind.name == "apoz" and all(bool((c.scores == 1).all()) for c in per):
            warnings.warn(f"apoz at {s.name!r}: not one exact zero in its output, so APoZ cannot rank its "
                          "channels (it is not after a ReLU-like op); use importance='activation' or a ReLU site",
                          stacklevel=4)
    return res


def _check_args(kind: Kind, data: Any, loss: Any, max_batches: Any) -> None:
    if loss is not None and not callable(loss):
        raise HookscopeError(f"loss={type(loss).__name__} is not callable; pass loss=lambda output, batch: ...")
    if loss is not None and kind.reads != "gradient":
        raise HookscopeError(f"loss= is read by importance='taylor' only, not importance={kind.name!r}; drop loss=")
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int)
                                    or max_batches < 1):
        raise HookscopeError(f"max_batches={max_batches!r} must be a whole number >= 1, or None for every batch")
    if data is None and kind.reads != "weight":
        raise HookscopeError(f"importance={kind.name!r} measures the model on data, and data=None; pass calibration "
                             "batches, or use importance='l1' / 'l2', which read the weights")


def _device(model: nn.Module, device: torch.device | str | None) -> torch.device | None:
    if device is not None:
        return torch.device(device)
    first = next(iter([*model.parameters(), *model.buffers()]), None)
    return None if first is None else first.device


@checked
def channel_importance(
    model: nn.Module,
    data: Any,
    *,
    layers: Layers | Mapping[str, int],
    importance: str = "activation",
    loss: Loss | None = None,
    device: torch.device | str | None = None,
    max_batches: int | None = None,
    train: bool = False,
) -> ChannelImportance:
    """Score every output channel of each site over calibration data; low = prune first.

    Importances: ``"l1"`` / ``"l2"``: norm of the site module's weight rows (``weight[c]`` flattened; no
    data, ``data`` may be ``None``). ``"activation"``: mean |activation| over samples and positions.
    ``"apoz"``: 1 - the fraction of exact zeros (Hu et al. 2016), meaningful after a ReLU-like op;
    elsewhere exact zeros are rare, every channel scores about 1, and a site with no zero at all
    warns. ``"taylor"``: per sample, |mean over positions of a * dL/da| (Molchanov et al. 2017),
    averaged over samples; ``L`` is ``loss(output, batch)`` (a scalar, or one loss per sample, summed)
    or, by default, the cross entropy of the logits (``output`` or ``output.logits``) against the
    labels of ``(inputs, labels)`` batches, summed over samples so that each sample's gradient is its
    own (a mean-reduced ``loss=`` scales batch ``b``'s scores by ``1 / B_b``).

    Weighting: every sample weighs the same, whatever the batch sizes (activation and APoZ: every
    value of the output; Taylor: every sample). A module called several times per forward (shared)
    accumulates every call, each call's samples counted. The model runs once per batch, in eval mode
    unless ``train=True`` (batch statistics; BatchNorm's running statistics are put back either way),
    with every flag, ``requires_grad`` and grad mode restored and every hook removed, also on errors;
    parameters' ``.grad`` are never touched (``torch.autograd.grad`` on the sites' outputs only).
    Every kind reads a site's output as its module returned it, also where the model rewrites it in
    place afterwards (``out += identity`` after a BatchNorm, ``F.relu(x, inplace=True)``); Taylor then
    takes the gradient with respect to that value (keeping a copy of each site's output per batch).
    The model runs on a private copy of each batch: it may write into its inputs.

    Args:
        model: the model (wrappers such as DataParallel are seen through for names).
        data: calibration batches: a tensor, ``(inputs, labels)`` or a dict of keyword inputs (one
            batch), or a list / DataLoader / iterable of them.
        layers: the sites scored: ``{qualname: channel dim of its output}`` (``{"layer1.0.relu": 1, "blocks.0.mlp.act": -1}``),
            or selectors, whose dim follows from the module type (see :mod:`._sites`).
        importance: one of ``"l1"``, ``"l2"``, ``"activation"``, ``"apoz"``, ``"taylor"``.
        loss: for ``"taylor"``, ``(output, batch) -> loss``.
        device: where batches are moved (default: the model's first parameter's device).
        max_batches: read at most this many batches.
        train: run in training mode (batch statistics) instead of eval mode.

    Returns:
        A :class:`ChannelImportance`.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.tensor([[1., 0.], [0., 1.], [-1., 0.]])), net[0].bias.zero_()
        >>> res = channel_importance(net, torch.tensor([[1., 2.], [3., 0.]]), layers="1")
        >>> res.scores["1"].tolist(), res.order("1"), res.samples
        ([2.0, 1.0, 0.0], [2, 1, 0], 2)
    """
    k = get_kind(importance)
    _check_args(k, data, loss, max_batches)
    inner, _ = unwrap(model)
    resolved = resolve_sites(model, layers)
    if k.reads == "weight":
        return _weight_scores(resolved, k)
    accs, batches, samples = calibrate(model, inner, data, resolved, k, loss=loss, device=_device(inner, device),
                                       max_batches=max_batches, train=train)
    if batches == 0:
        raise HookscopeError("data= gave no batch; pass at least one calibration batch")
    return _collected(resolved, k, accs, batches, samples)
