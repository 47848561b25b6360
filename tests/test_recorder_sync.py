"""The statistics engine never waits on the host inside a hook, and its memory stays flat.

Host synchronisations are counted by a stub: a ``TorchDispatchMode`` counting
``aten._local_scalar_dense`` (what ``.item()``, ``float()``, ``bool()`` and ``int()`` of a tensor
call) and the ops whose output size depends on the data (``nonzero``, ``masked_select``, ...), plus
counters on ``torch.Tensor.tolist``, ``.cpu``, ``.numpy`` and ``.item``. Patching
``_reduce.HOST_TYPES`` to ``frozenset()`` sends CPU tensors through the accelerator path, so the
accelerator's rule (no synchronisation until the rows are read, then one transfer per device) is
checked on any machine; on CUDA it is checked again with ``torch.cuda.set_sync_debug_mode("error")``.

Memory: a ``TorchDispatchMode`` records the size of every storage an op creates (an output that
shares no storage with the op's inputs); views and writes into existing buffers create none.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import hookscope
import hookscope.analysis._recorder  # noqa: F401 - the engine, imported for the patches below
import hookscope.analysis._reduce as _reduce
import hookscope.analysis._rows  # noqa: F401
from hookscope.analysis._reduce import STATS, Scratch, tensor_stats

from helpers import torch_threads

watch_module = sys.modules[hookscope.watch.__module__]  # hookscope.analysis.watch, the module

aten = torch.ops.aten
_SCALAR = {aten._local_scalar_dense}
# ops whose output size is the data's: a synchronisation on an accelerator, silent on the CPU
_DATA_DEPENDENT = {aten.nonzero, aten.masked_select, aten.equal, aten.is_nonzero, aten.allclose,
                   aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.repeat_interleave}
_METHODS = ("tolist", "cpu", "numpy", "item")


@dataclasses.dataclass
class Reads:
    """What a block did that waits on, or copies to, the host."""

    scalar: int = 0  # aten._local_scalar_dense: .item(), float(t), bool(t), int(t)
    data_dependent: int = 0  # nonzero, masked_select, boolean-mask indexing, ...
    tolist: int = 0
    cpu: int = 0
    numpy: int = 0
    item: int = 0

    @property
    def transfers(self) -> int:
        """Reads that bring numbers to the host (``.item()`` also shows as ``scalar``)."""
        return self.scalar + self.tolist + self.numpy


class _SyncCounter(TorchDispatchMode):
    def __init__(self, reads: Reads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _SCALAR:
            self.reads.scalar += 1
        elif packet in _DATA_DEPENDENT or (packet is aten.index and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_leaves(args[1:]))):
            self.reads.data_dependent += 1
        return func(*args, **kwargs)


@contextmanager
def host_reads() -> Iterator[Reads]:
    """Count the host synchronisations and transfers of the block (every patch restored after)."""
    reads = Reads()
    saved = {name: torch.Tensor.__dict__.get(name) for name in _METHODS}

    def counted(name: str) -> Callable[..., Any]:
        original = getattr(torch.Tensor, name)

        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            setattr(reads, name, getattr(reads, name) + 1)
            return original(self, *args, **kwargs)

        return method

    for name in _METHODS:
        setattr(torch.Tensor, name, counted(name))
    try:
        with _SyncCounter(reads):
            yield reads
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(torch.Tensor, name)  # inherited from torch._C.TensorBase
            else:
                setattr(torch.Tensor, name, original)


class SmallCNN(nn.Module):
    """Conv, batch norm, in-place ReLU, a residual ``+=``, pooling, flatten and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        out = self.bn(self.conv(y))
        out += y
        return self.fc(torch.flatten(self.pool(self.act(out)), 1))


class SmallTransformer(nn.Module):
    """A projection, one ``nn.TransformerEncoderLayer`` (attention, feed-forward, norms) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.encoder = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.proj(x)))


def cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SmallCNN().eval(), torch.randn(2, 3, 8, 8)


def transformer() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SmallTransformer().eval(), torch.randn(2, 5, 6)


MODELS = {"cnn": cnn, "transformer": transformer}


def step(model: nn.Module, x: torch.Tensor) -> None:
    """One forward and backward pass (grad enabled, the model in eval mode)."""
    model(x).sum().backward()


def same_rows(got: list[hookscope.StatRow], want: list[hookscope.StatRow]) -> None:
    """The same records with the same numbers: counts and extremes exactly, mean and std to float32."""
    assert [(r.module, r.call, r.phase, r.which, r.path, r.shape) for r in got] == \
        [(r.module, r.call, r.phase, r.which, r.path, r.shape) for r in want]
    for g, w in zip(got, want):
        assert (g.min, g.max, g.absmax, g.zero_frac, g.nan, g.inf) == (w.min, w.max, w.absmax, w.zero_frac, w.nan, w.inf)
        assert math.isclose(g.mean, w.mean, rel_tol=1e-4, abs_tol=1e-6)
        assert math.isclose(g.std, w.std, rel_tol=1e-4, abs_tol=1e-6)


def close_rows(got: list[hookscope.StatRow], want: list[hookscope.StatRow]) -> None:
    """The same records, numbers close (another device computed the model: its values differ a little)."""
    assert [(r.module, r.call, r.phase, r.which, r.path, r.shape) for r in got] == \
        [(r.module, r.call, r.phase, r.which, r.path, r.shape) for r in want]
    for g, w in zip(got, want):
        assert (g.nan, g.inf) == (w.nan, w.inf) == (0, 0)
        for k in ("mean", "std", "min", "max", "absmax"):
            assert math.isclose(getattr(g, k), getattr(w, k), rel_tol=1e-3, abs_tol=1e-4), (g, k)
        assert math.isclose(g.zero_frac, w.zero_frac, abs_tol=0.02)


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors take the accelerator path (reduced on the device, no branching on values)."""
    monkeypatch.setattr(_reduce, "HOST_TYPES", frozenset())


# ---------------------------------------------------------------------------------------------
# the stub itself


def test_the_stub_counts_every_kind_of_host_read() -> None:
    t = torch.tensor([1.0, 0.0, 2.0])
    with host_reads() as r:
        t.sum().item()
        float(t[0]), int(t[2]), bool(t[0])
        t.tolist()
        t.cpu()
        t.numpy()
        t.nonzero()
        t[t > 0]
    assert r == Reads(scalar=4, data_dependent=2, tolist=1, cpu=1, numpy=1, item=1)
    assert "tolist" not in torch.Tensor.__dict__ and "cpu" not in torch.Tensor.__dict__  # restored


def test_the_stub_sees_a_read_inside_a_backward_hook() -> None:
    w = torch.ones(3, requires_grad=True)
    y = w * 2
    y.register_hook(lambda g: g.sum().item() and None)
    with host_reads() as r:
        y.sum().backward()
    assert r.scalar == 1 and r.item == 1


@pytest.mark.parametrize("name", MODELS)
def test_the_models_themselves_never_read_back(name: str) -> None:
    """What the tests below count is hookscope's: the plain passes read nothing back."""
    model, x = MODELS[name]()
    with host_reads() as r:
        step(model, x)
    assert r == Reads()


# ---------------------------------------------------------------------------------------------
# the accelerator path, on the CPU


@pytest.mark.parametrize("name", MODELS)
def test_trace_forward_and_backward_read_nothing_back(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = MODELS[name]()
    with hookscope.trace(model, keep="all") as host:  # the host path, for the numbers
        step(model, x)
    want = host.rows
    monkeypatch.setattr(_reduce, "HOST_TYPES", frozenset())
    model.zero_grad()
    with host_reads() as passes:
        with hookscope.trace(model, keep="all") as t:
            step(model, x)
    assert passes == Reads()
    with host_reads() as read:
        rows = t.rows
    assert read.transfers == 1  # one stacked transfer for the one device
    assert read.cpu <= 1 and read.data_dependent == 0
    assert {r.phase for r in rows} == {"forward", "backward"}
    assert {"input", "output", "grad_input", "grad_output"} <= {r.which for r in rows}
    same_rows(rows, want)
    with host_reads() as again:
        assert t.rows == rows
    assert again == Reads()  # gathered once: read again, nothing moves


@pytest.mark.parametrize("name", MODELS)
def test_watch_forward_and_backward_read_nothing_back(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = MODELS[name]()
    with hookscope.watch(model) as host:
        step(model, x)
    want, checked = host.rows, host.checked
    monkeypatch.setattr(_reduce, "HOST_TYPES", frozenset())
    model.zero_grad()
    with host_reads() as passes:
        with hookscope.watch(model) as w:
            step(model, x)
    assert passes == Reads()  # RESOLVE_EVERY records are more than these models make
    with host_reads() as read:
        finite = w.finite
        rows = w.rows
    assert read.transfers == 1 and read.cpu <= 1 and read.data_dependent == 0
    assert finite and w.checked == checked
    same_rows(rows, want)


def _count_gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of events of each gather watch makes (each one a device-to-host transfer)."""
    sizes: list[int] = []
    original = watch_module.gather

    def counting(pending: list[Any], *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(pending))
        return original(pending, *args, **kwargs)

    monkeypatch.setattr(watch_module, "gather", counting)
    return sizes


def test_watch_reads_back_once_per_resolve_every_records(on_device: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = cnn()
    monkeypatch.setattr(watch_module, "RESOLVE_EVERY", 4)
    sizes = _count_gathers(monkeypatch)
    with host_reads() as passes:
        with hookscope.watch(model, keep="all") as w:
            step(model, x)
    assert len(sizes) >= 3 and set(sizes) == {4}  # every fourth record, never one by one
    assert passes.transfers == len(sizes) and passes.data_dependent == 0
    assert w.finite


def test_watch_raising_at_the_culprit_reads_back_every_record_as_documented(
        on_device: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``raise_on_nonfinite`` synchronises once per record by design (it must raise inside the hook
    that sees the culprit); documented, so not a failure of the no-synchronisation rule."""
    assert "one host synchronisation per record" in " ".join((hookscope.watch.__doc__ or "").split())
    model, x = cnn()
    sizes = _count_gathers(monkeypatch)
    with host_reads() as passes:
        with hookscope.watch(model, raise_on_nonfinite=True) as w:
            step(model, x)
    assert sizes and set(sizes) == {1}  # one record, one transfer
    assert passes.transfers == len(sizes) >= w.checked > 0
    assert passes.data_dependent == 0


# ---------------------------------------------------------------------------------------------
# CUDA: the same with PyTorch's own synchronisation check


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@contextmanager
def no_cuda_sync() -> Iterator[None]:
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@needs_cuda
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kind", ["trace", "watch"])
def test_cuda_passes_never_synchronise(name: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # CPU-close numbers
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model, x = MODELS[name]()
    with hookscope.trace(model, keep="all") if kind == "trace" else hookscope.watch(model) as host:
        step(model, x)
    want = host.rows
    model, x = model.cuda(), x.cuda()
    model.zero_grad()
    step(model, x)  # warm up: lazy CUDA initialisation (cuBLAS handles, ...) may synchronise once
    model.zero_grad()
    with host_reads() as passes, no_cuda_sync():
        with hookscope.trace(model, keep="all") if kind == "trace" else hookscope.watch(model) as t:
            step(model, x)
    assert passes == Reads()
    with host_reads() as read:
        rows = t.rows
    assert read.transfers == 1 and read.data_dependent == 0  # one device, one stacked transfer
    assert {r.device for r in rows} == {str(x.device)}
    close_rows(rows, want)


# ---------------------------------------------------------------------------------------------
# memory stays flat on the CPU host path


class _Allocations(TorchDispatchMode):
    """The size in bytes of every storage an op creates (views and writes into buffers create none)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.sizes.append(t.untyped_storage().nbytes())
        return out


def _allocated(fn: Callable[[], Any]) -> list[int]:
    """Sizes of the storages created by ``fn`` larger than 64 KiB."""
    mode = _Allocations()
    with mode:
        fn()
    return [n for n in mode.sizes if n > SMALL]


SMALL = 64 * 1024
SCRATCH = _reduce._PIECE * 4  # 8 MiB: one piece of float32
N = 1 << 22  # 4M elements: 16 MiB of float32


def _reference(t: torch.Tensor) -> dict[str, float]:
    d = t.detach().double().reshape(-1)
    return {"mean": d.mean().item(), "std": d.std(correction=0).item(), "min": d.min().item(),
            "max": d.max().item(), "absmax": d.abs().max().item(), "zeros": int((d == 0).sum()),
            "nan": 0, "inf": 0}


def _check_values(got: torch.Tensor, t: torch.Tensor) -> None:
    stats = dict(zip(STATS, got.tolist()))
    want = _reference(t)
    for k in ("min", "max", "absmax", "zeros", "nan", "inf"):
        assert stats[k] == want[k], k
    for k in ("mean", "std"):
        assert math.isclose(stats[k], want[k], rel_tol=1e-5, abs_tol=1e-7), k


def _big(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "dense":
        return torch.relu(torch.randn(N, generator=g)).view(1024, 4096)  # half zeros
    if kind == "dense, mean far from zero":
        return (torch.randn(N, generator=g) * 1e-2 + 100).view(1024, 4096)
    if kind == "channels last":
        return torch.randn(16, 64, 64, 64, generator=g).to(memory_format=torch.channels_last)
    if kind == "every other column":
        return torch.randn(2048, 4096, generator=g)[:, ::2]  # 4M elements, not dense: one stride of 2
    if kind == "cropped rows":
        return torch.randn(2048, 2100, generator=g)[:, :2048]  # 4M elements, no 1-D view at all
    if kind == "float16":
        return torch.randn(N, generator=g).to(torch.float16)
    raise AssertionError(kind)


@pytest.fixture(params=["native", "fallback"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The C kernel (where the install built it) or the torch-ops fallback, on 2 threads: the
    fallback sums squares with float32 BLAS, whose rounding (within ``_check_values``' 1e-5) is that of 2."""
    if request.param == "native":
        monkeypatch.delenv("HOOKSCOPE_NATIVE", raising=False)
        from hookscope import _native
        if _native.stats_kernel() is None and not os.environ.get("CI"):
            pytest.skip("the native kernel was not built with this install (CI builds it: .ci/run)")
        assert _native.stats_kernel() is not None, "CI installs a C compiler, but the kernel was not built"
    else:
        monkeypatch.setenv("HOOKSCOPE_NATIVE", "0")
        from hookscope import _native
        assert _native.stats_kernel() is None
    with torch_threads(2):
        yield str(request.param)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "dense, mean far from zero", "channels last"])
def test_a_dense_tensor_is_reduced_without_allocating(path: str, kind: str) -> None:
    t = _big(kind)
    tensor_stats(t[:2, :2] if t.dim() == 2 else t[:1, :1, :1, :1])  # any one-time setup (loading the kernel)
    scratch = Scratch()
    result: list[torch.Tensor] = []
    if path == "fallback" and kind == "dense, mean far from zero":
        # the fallback's one-pass float32 variance would cancel: it takes the exact centred pass
        # over a float64 copy of the tensor (the native kernel accumulates in float64 instead)
        assert _allocated(lambda: result.append(tensor_stats(t, scratch))) == [t.numel() * 8]
        assert _allocated(lambda: tensor_stats(t, scratch)) == []  # the copy is the scratch, reused
    else:
        assert _allocated(lambda: result.append(tensor_stats(t, scratch))) == []
    _check_values(result[0], t)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["every other column", "cropped rows", "float16"])
def test_scratch_is_bounded_and_reused(path: str, kind: str) -> None:
    t = _big(kind)
    scratch = Scratch()
    result: list[torch.Tensor] = []
    first = _allocated(lambda: result.append(tensor_stats(t, scratch)))
    if path == "fallback":
        # the fallback copies a strided or half-precision tensor whole (as float32) into one buffer,
        # reused: BLAS would sum a strided vector serially in float32
        assert first == [t.numel() * 4]
        assert _allocated(lambda: tensor_stats(t, scratch)) == []
    else:
        assert sum(first) <= SCRATCH, first  # at most one piece of float32, never the tensor's size
        assert _allocated(lambda: tensor_stats(t, scratch)) == []  # the second call reuses it
    _check_values(result[0], t)
