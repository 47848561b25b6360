"""The perturbation methods' runs: copies of the inputs (or of one layer's output) changed feature by feature
and scored without gradients, in passes of ``batch_size`` copies or as many as ``memory=`` holds; and
the methods of one feature at a time: occlusion, feature ablation, feature permutation and Shapley
value sampling. KernelSHAP and LIME, which fit a model to the scores, are ``_surrogate``'s.

At a layer, a copy of the layer's output is what is perturbed: where the model is a chain of
``nn.Sequential`` down to the layer, only the modules after it run; elsewhere the whole model runs
with the layer's output replaced (the engine's stand-in), which gives the same scores.
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...errors import HookscopeError
from ...selection import unwrap
from .._targets import call_model, scores_of
from ._engine import Job, Pass, run
from ._features import baseline_like, feature_labels, windows

__all__ = ["Space", "expand", "feature_ablation", "feature_permutation", "generator", "occlusion", "shapley_value_sampling",
           "tail_of", "what_of"]

Made = tuple[torch.Tensor, torch.Tensor | None, int]
Build = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # rows lo:hi -> (the copies, their samples)


class _Peak(TorchDispatchMode):
    """The bytes of the tensors a forward pass makes, alive at once at its peak (views not counted twice)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors alive on it]
        self.now = self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, fresh=not aliases)
        return out

    def _track(self, t: torch.Tensor, fresh: bool) -> None:
        try:
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            return
        if key in self.live:
            self.live[key][1] += 1
        elif fresh and key:
            self.live[key] = [size, 1]
            self.now += size
            self.peak = max(self.peak, self.now)
        else:
            return
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                del self.live[key]


class _Bar:
    """A progress bar on stderr: tqdm when installed, else a one-line counter."""

    def __init__(self, name: str, total: int, done: int) -> None:
        self.name, self.total, self.done, self.bar = name, total, done, None
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm is optional
            self._print()
        else:
            self.bar = tqdm(total=total, initial=done, desc=name, unit="pass")

    def _print(self) -> None:
        end = "" if self.done < self.total else "\n"
        print(f"\r{self.name}: {self.done}/{self.total} passes", end=end, file=sys.stderr, flush=True)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        else:
            self._print()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


_SHOW_AFTER = 5.0  # seconds: a run the first pass says will take longer gets a bar


def tail_of(model: nn.Module, name: str) -> nn.Module | None:
    """The modules after layer ``name``, as one module, where the model is a chain of plain ``nn.Sequential``
    down to it (running them on the layer's output gives the model's output); ``None`` elsewhere."""
    if "::" in name:
        return None
    node, rest = unwrap(model)[0], []
    for part in name.split("."):
        if type(node) is not nn.Sequential or part not in node._modules:
            return None
        names = list(node._modules)
        rest.append([m for m in list(node._modules.values())[names.index(part) + 1:] if m is not None])
        node = node._modules[part]
    return nn.Sequential(*[m for level in reversed(rest) for m in level])


@dataclass
class Space:
    """What is perturbed (the inputs, or the layer's output on them), and how copies of it are scored."""

    job: Job
    value: torch.Tensor  # B x ...
    f0: torch.Tensor  # the target's score on the value itself, B
    name: str
    chunk: int
    progress: bool | None
    tail: nn.Module | None = None
    forwards: int = 1
    spent: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, job: Job, p: Pass, method: Any, name: str) -> Space:
        at = p.kept[0].detach() if job.layer is not None else job.x
        assert p.scores is not None
        tail = tail_of(job.model, job.layer[0]) if job.layer is not None and not job.kw else None
        space = cls(job, at, p.scores.detach(), name, method.batch_size, method.progress, tail)
        if method.memory is not None:
            space.chunk = space.fitted(method.batch_size, method.memory)
        return space

    def baseline(self, given: Any) -> torch.Tensor:
        what = "inputs" if self.job.layer is None else f"layer {self.job.layer[0]!r}'s output"
        return baseline_like(given, self.value, what)

    def _score(self, copies: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        job = self.job
        if job.layer is None:
            p = run(job, copies, rows, None)
        elif self.tail is not None:
            p = Pass(output=call_model(self.tail, (copies,), {}))
            p.scores = scores_of(job.target, p.output, rows)
        else:
            p = run(job, job.x[rows], rows, _standing(copies))
        assert p.scores is not None
        return p.scores.detach()

    def fitted(self, batch_size: int, memory: int) -> int:
        """Copies per pass within ``memory`` bytes: the peak bytes of a pass of one copy and of two measured,
        the copies themselves (and their masks) counted on top."""
        peaks = []
        for n in (1, 2):
            rows = torch.zeros(n, dtype=torch.long, device=self.value.device)
            copies = self.value[rows].clone()
            with _Peak() as peak:
                self._score(copies, rows)
            peaks.append(peak.peak)
            self.forwards += 1
        row = max(peaks[1] - peaks[0], 1) + 2 * self.value[:1].numel() * self.value.element_size()
        fixed = max(peaks[0] - row, 0)
        if memory < fixed + row:
            raise HookscopeError(f"memory={memory} bytes cannot hold a forward pass of one perturbed copy, which "
                                 f"holds about {fixed + row} bytes at its peak; pass memory >= {fixed + row}, or "
                                 "None for batch_size copies a pass")
        return int(max(1, min(batch_size, (memory - fixed) // row)))

    def scores(self, n: int, build: Build) -> torch.Tensor:
        """The scores of ``n`` copies, ``build(lo, hi)`` making copies ``lo:hi`` and naming their samples."""
        out = torch.empty(n, dtype=torch.float64, device=self.value.device)
        passes = math.ceil(n / self.chunk)
        bar: _Bar | None = None
        started = time.perf_counter()
        try:
            for i, lo in enumerate(range(0, n, self.chunk)):
                hi = min(lo + self.chunk, n)
                copies, rows = build(lo, hi)
                out[lo:hi] = self._score(copies, rows).to(torch.float64)
                self.forwards += 1
                if bar is not None:
                    bar.step()
                elif self.progress or (self.progress is None and sys.stderr.isatty()  # no bar in logs and pipes
                                       and (time.perf_counter() - started) / (i + 1) * passes > _SHOW_AFTER):
                    bar = _Bar(self.name, passes, i + 1)
        finally:
            if bar is not None:
                bar.close()
        return out


def _standing(copies: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A stand-in that is ``copies`` whatever the layer computed (checked to have its shape)."""
    def make(t: torch.Tensor) -> torch.Tensor:
        if t.shape != copies.shape:
            raise RuntimeError(f"the layer's output changed shape between passes ({tuple(t.shape)} after "
                               f"{tuple(copies.shape)})")
        return copies.to(t.dtype)

    return make


def generator(seed: int) -> torch.Generator:
    """A CPU generator: the same draws as ``torch.manual_seed(seed)`` gives the global one (captum's)."""
    return torch.Generator().manual_seed(seed)


def _spread(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` (one value per row) shaped to broadcast against rows of ``like``."""
    return t.view(-1, *[1] * (like.dim() - 1))


def occlusion(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "occlusion")
    V, B = space.value, space.value.shape[0]
    base = space.baseline(method.baseline)
    wins = windows(tuple(V.shape[1:]), method.window, method.stride)

    def build(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(lo, hi)
        w, b = (idx // B).tolist(), (idx % B).to(V.device)
        copies = V[b].clone()
        for i, (j, at) in enumerate(zip(w, b.tolist())):
            copies[(i, *wins[j])] = base[(at, *wins[j])]
        return copies, b

    diff = space.f0.to(torch.float64).repeat(len(wins)) - space.scores(len(wins) * B, build)
    total = torch.zeros(V.shape, dtype=torch.float64, device=V.device)
    count = torch.zeros(V.shape[1:], dtype=torch.float64, device=V.device)
    for j, sl in enumerate(wins):
        total[(slice(None), *sl)] += _spread(diff[j * B:(j + 1) * B], V)
        count[sl] += 1
    return (total / count).to(_wide(V.dtype)), None, space.forwards


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def expand(per: torch.Tensor, labels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Each feature's attribution given to every value of its feature (``B x K`` -> ``like``'s shape)."""
    return per.gather(1, labels.reshape(labels.shape[0], -1)).view(like.shape).to(_wide(like.dtype))


def feature_ablation(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "feature_ablation")
    V, B = space.value, space.value.shape[0]
    base = space.baseline(method.baseline)
    labels, counts = feature_labels(method.features, V, what_of(job))
    pairs = torch.tensor([(k, b) for k in range(max(counts)) for b in range(B) if k < counts[b]],
                         dtype=torch.long).view(-1, 2).to(V.device)

    def build(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, b = pairs[lo:hi, 0], pairs[lo:hi, 1]
        return torch.where(labels[b] == _spread(k, V), base[b], V[b]), b

    scores = space.scores(len(pairs), build)
    per = torch.zeros(B, max(counts), dtype=torch.float64, device=V.device)
    per[pairs[:, 1], pairs[:, 0]] = space.f0.to(torch.float64)[pairs[:, 1]] - scores
    return expand(per, labels, V), None, space.forwards


def feature_permutation(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "feature_permutation")
    V, B = space.value, space.value.shape[0]
    if B < 2:
        raise HookscopeError("feature permutation shuffles each feature across the samples of the batch, and a "
                             "batch of 1 has nothing to shuffle with; pass 2 or more samples, or use "
                             "method='feature_ablation'")
    labels, counts = feature_labels(method.features, V, what_of(job))
    K, g = max(counts), generator(method.seed)
    perms = []
    for _ in range(K):  # captum's draw: one shuffle a feature, never the identity
        perm = torch.randperm(B, generator=g)
        while bool((perm == torch.arange(B)).all()):
            perm = torch.randperm(B, generator=g)
        perms.append(perm)
    order = torch.stack(perms).to(V.device)  # K x B: the sample each sample takes feature k from

    def build(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(lo, hi, device=V.device)
        k, b = idx // B, idx % B
        return torch.where(labels[b] == _spread(k, V), V[order[k, b]], V[b]), b

    scores = space.scores(K * B, build).view(K, B)
    per = (space.f0.to(torch.float64).unsqueeze(0) - scores).T
    return expand(per, labels, V), None, space.forwards


def shapley_value_sampling(job: Job, p: Pass, s: Any) -> Made:
    method = s.method
    space = Space.of(job, p, method, "shapley_value_sampling")
    V, B = space.value, space.value.shape[0]
    base = space.baseline(method.baseline)
    labels, counts = feature_labels(method.features, V, what_of(job))
    K, n, g = max(counts), method.samples, generator(method.seed)
    orders = torch.stack([torch.randperm(K, generator=g) for _ in range(n)]).to(V.device)  # captum's draw
    rank = torch.empty_like(orders).scatter_(1, orders, torch.arange(K, device=V.device).expand(n, K))
    f_base = space.scores(B, lambda lo, hi: (base[lo:hi], torch.arange(lo, hi, device=V.device)))

    def build(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(lo, hi, device=V.device)
        b, t, o = idx % B, (idx // B) % K, idx // (B * K)
        kept = rank[o].gather(1, labels[b].reshape(hi - lo, -1)).view(labels[b].shape) <= _spread(t, V)
        return torch.where(kept, V[b], base[b]), b

    scores = space.scores(n * K * B, build).view(n, K, B)
    before = torch.cat([f_base.view(1, 1, B).expand(n, 1, B), scores[:, :-1]], 1)
    gains = (scores - before).permute(2, 0, 1).reshape(B, -1)  # B x (n K): the gain of order o's t-th feature
    per = torch.zeros(B, K, dtype=torch.float64, device=V.device)
    per.index_add_(1, orders.reshape(-1), gains)
    per /= n
    delta = space.f0.to(torch.float64) - f_base - per.sum(1)
    return expand(per, labels, V), delta, space.forwards


def what_of(job: Job) -> str:
    return "inputs" if job.layer is None else f"layer {job.layer[0]!r}'s output"
