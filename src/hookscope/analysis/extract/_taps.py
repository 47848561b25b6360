"""The hooks of an extract: each reduces its layer's tensor on the device and copies the rows into the
shard buffers the engine points it at; the forward stops once every selected layer has run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..._tree import tensors
from ...core.failure import forward_error, received
from ...core.hooks import HookGroup
from ...core.text import dtype_text, first_line, shape_text
from ...errors import ExtractOverflowError, HookscopeError, StopForward
from ._reduce import Reducer
from ._source import model_call

__all__ = ["Segment", "Taps"]


@dataclass(frozen=True)
class Segment:
    """Rows ``lo:hi`` of the batch go to rows ``at:at + hi - lo`` of ``arrays`` (a shard buffer's)."""

    arrays: dict[str, torch.Tensor]
    at: int
    lo: int
    hi: int


@dataclass
class _Forward:
    rows: int = 0
    seen: set[str] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)
    probe: bool = False


class Taps:
    """Hooks on the selected layers, registered on entry and removed on exit (also on errors).

    After a probe (:meth:`run` with ``probe=True``: the whole forward, so that a layer running twice is
    seen) ``found`` holds each layer's per-sample shape and dtype; later runs check every batch against them
    and stop the forward after the last selected layer.

    Example:
        >>> from hookscope.analysis.extract._reduce import reducer
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
        >>> with Taps([("0", net[0])], {"0": reducer(None)}, "output") as taps:
        ...     taps.run(net, torch.ones(4, 2), torch.device("cpu"), 4, [], probe=True)
        >>> taps.found["0"]
        ((3,), torch.float32)
    """

    def __init__(self, selected: list[tuple[str, nn.Module]], reducers: dict[str, Reducer], keep: str) -> None:
        self.selected = selected
        self.reducers = reducers
        self.keep = keep
        self.found: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.limits: dict[str, tuple[float, torch.dtype]] = {}  # (magnitude that becomes inf, stored dtype)
        self._peaks: dict[str, torch.Tensor] = {}  # the largest finite magnitude seen, kept on the device
        self._now = _Forward()
        self._group = HookGroup()

    def __enter__(self) -> Taps:
        try:
            for name, module in self.selected:
                if self.keep == "input":
                    # own hook: reduces on the device into the shard buffers and stops the pass; capture would keep tensors
                    self._group.add(module.register_forward_pre_hook(self._pre(name), with_kwargs=True))
                else:
                    # own hook: as above, for the layer's output
                    self._group.add(module.register_forward_hook(self._post(name)))
        except BaseException:
            self._group.remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._group.remove()

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not any(True for _ in tensors(args)) and any(True for _ in tensors(kwargs)):
                raise HookscopeError(f"{name!r} receives its tensors as keyword arguments only ({', '.join(kwargs)}), "
                                     "so it has no one input to store; store the output of the layer before it")
            self._take(name, args)

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self._take(name, output)

        return hook

    def _take(self, name: str, value: Any) -> None:
        now = self._now
        if name in now.seen:
            raise HookscopeError(f"{name!r} runs more than once in one forward pass, so it has no single value per "
                                 "sample; select a module that runs once per forward, or use hookscope.capture")
        now.seen.add(name)
        main = next(iter(tensors(value)), None)
        if main is None:
            raise HookscopeError(f"the {self.keep} of {name!r} holds no tensor; select a module whose {self.keep} "
                                 "is a tensor")
        with torch.no_grad():
            try:
                v = self.reducers[name](main.detach())
            except HookscopeError:
                raise
            except Exception as e:  # the reduction's failure, not the model's
                raise HookscopeError(f"the reduction {self.reducers[name].text} of {name!r} raised {type(e).__name__}: "
                                     f"{first_line(e)}; fix it for a tensor of shape {tuple(main.shape)}") from e
        self._check(name, v, now)
        if name in self.limits or (now.probe and v.is_floating_point()):
            self._peak(name, v)
        for s in now.segments:
            s.arrays[name][s.at:s.at + s.hi - s.lo].copy_(v[s.lo:s.hi], non_blocking=True)
        if len(now.seen) == len(self.selected) and not now.probe:
            raise StopForward(self)  # nothing after the last selected layer is computed

    def _check(self, name: str, v: Any, now: _Forward) -> None:
        text = self.reducers[name].text
        if isinstance(v, torch.Tensor) and v.dim() == 0 and text == "none":
            raise HookscopeError(f"the {self.keep} of {name!r} is a single number for the whole batch, not a row per "
                                 "sample; select a layer whose tensor has the samples as dimension 0")
        if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != now.rows:
            got = f"shape {shape_text(tuple(v.shape))}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise HookscopeError(f"the reduction {text} of {name!r} gave {got} for a batch of {now.rows}; a reduction "
                                 "must keep the samples as dimension 0 (e.g. 'mean' gives N x C)")
        shape = tuple(v.shape[1:])
        if now.probe:
            self.found[name] = (shape, v.dtype)
            return
        want = self.found[name][0]
        if shape != want:
            hint = "" if text != "none" else ": samples of different sizes need a reduction, e.g. reduce='mean'"
            raise HookscopeError(f"{name!r} gives {shape_text(shape)} per sample in this batch but {shape_text(want)} "
                                 f"for the first sample{hint or ' (the reduction ' + text + ' keeps sizes apart)'}")

    def _peak(self, name: str, v: torch.Tensor) -> None:
        """Fold the largest finite magnitude of ``v`` into the layer's peak, on the device (no host sync):
        inf and NaN are the model's own values, stored as they are."""
        if not v.numel():
            return
        low, high = torch.aminmax(torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0))  # faster than a norm
        top = torch.maximum(high, -low)
        before = self._peaks.get(name)
        self._peaks[name] = top if before is None else torch.maximum(before, top)

    def watch(self, limits: dict[str, tuple[float, torch.dtype]]) -> None:
        """From now on keep the peak of the layers stored in a narrower dtype; check the probe's values."""
        self.limits = dict(limits)
        self.check_range()
        self._peaks = {}

    def check_range(self) -> None:
        """Raise :class:`~hookscope.errors.ExtractOverflowError` naming the first layer whose values reached its limit (one host sync)."""
        names = [n for n in self._peaks if n in self.limits]
        if not names:
            return
        peaks = torch.stack([self._peaks[n].double() for n in names]).tolist()
        for name, peak in zip(names, peaks):
            limit, kept = self.limits[name]
            if peak >= limit:
                raise ExtractOverflowError(f"{name!r} gives values up to {peak:.6g}, beyond {dtype_text(kept)}'s range (largest "
                               f"finite {torch.finfo(kept).max:.6g}), so they would be stored as inf; store them "
                               f"as {_wider(kept)}")

    def run(self, model: nn.Module, inputs: Any, device: torch.device, rows: int, segments: list[Segment], *,
            probe: bool = False, own: bool = False) -> None:
        """One forward of a batch of ``rows`` samples, copying each layer's rows as ``segments`` say; ``own``:
        the inputs are the run's own tensors, which the model may write into (else it gets a copy)."""
        self._now = _Forward(rows, set(), segments, probe)
        try:
            model_call(model, inputs, device, own=own)
        except StopForward as e:
            if e.owner is not self:
                raise
        except HookscopeError:
            raise
        except Exception as e:  # the model's own failure, in one line (the cause stays chained)
            raise forward_error(e, f"the model ({type(model).__name__})", after=None,
                                got=received(*((), inputs) if isinstance(inputs, dict) else ((inputs,),))) from e
        missing = [n for n, _ in self.selected if n not in self._now.seen]
        if missing:
            raise HookscopeError(f"{missing[0]!r} did not run in the forward pass, so it has no value to store; "
                                 "select layers the model's forward reaches")


def _wider(kept: torch.dtype) -> str:
    """The dtypes that hold what ``kept`` cannot, as the argument and the CLI flag."""
    if torch.finfo(kept).max < torch.finfo(torch.bfloat16).max:
        return "bfloat16 or float32 (dtype=torch.bfloat16, --dtype bfloat16)"
    return "they are given (no dtype=, no --dtype)"
