"""The statistics of ``ReLU(inplace=True)``'s output, told from the pass over its input.

trace and watch do not read what a torch ``ReLU(inplace=True)`` wrote when its input is reduced in
the ReLU's own pre-hook (an input row, or watch's check of an input the parent's code made) by a
pass that also sums the input's positive part: the rows must be, bit for bit, the rows of an engine
that reads every output. Each case runs twice, the second time with the ReLU not recognised
(``inplace_relu`` patched to say no: every output read), and the rows, down to the sign of a zero,
must be equal. The cases try to make the told statistics wrong: writes between the two hooks (also
through ``.data``, which no version counter sees, from a hook of the user's), a ReLU that is not
torch's (subclass, instance forward, ``F.relu`` or ``torch.relu_`` replaced, function and dispatch
modes), -0.0 next to negative values, NaN, a variance that cancels, layouts, dtypes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import hookscope
import hookscope.analysis._recorder as recorder
import hookscope.analysis._relu_shortcut as shortcut
from hookscope._native import stats_kernel

# CI builds the kernel (.ci/run); elsewhere, in an install made without a C compiler, every output is
# read (the rest of the suite tests that) and these cases, which need the kernel's pass, are skipped
pytestmark = pytest.mark.skipif(stats_kernel() is None and not os.environ.get("CI"),
                                reason="the kernel that tells ReLU's statistics was not built with this install")

Run = Callable[[nn.Module, torch.Tensor], list[Any]]


def _rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    # repr keeps the sign of a zero and tells NaN apart; every field of every row
    return [tuple((k, repr(v)) for k, v in vars(r).items()) for r in rows]


def _trace(keep: str) -> Run:
    def run(model: nn.Module, x: torch.Tensor) -> list[Any]:
        with hookscope.trace(model, keep=keep) as t:
            out = model(x)
            if keep == "all":
                out.float().sum().backward()
        return list(t.rows)
    return run


def _watch(model: nn.Module, x: torch.Tensor) -> list[Any]:
    with hookscope.watch(model, last=1000) as w:
        model(x)
    return list(w.rows)


RUNS = {"io": _trace("io"), "output": _trace("output"), "all": _trace("all"), "watch": _watch}


def _both(run: Run, make: Callable[[], tuple[nn.Module, torch.Tensor]], monkeypatch: pytest.MonkeyPatch,
          spared: bool | None = True) -> tuple[list[Any], list[Any]]:
    """Rows with ReLU's statistics told, and rows with every output read, from identical copies;
    asserts that telling them spared reading a tensor (else the case tests nothing), or with
    ``spared=False`` that nothing could be told (``None``: not counted)."""
    reads: list[int] = []
    rows = []
    for recognised in (True, False):
        model, x = make()
        with monkeypatch.context() as m:
            if not recognised:
                m.setattr(recorder, "inplace_relu", lambda module: False)
            seen = _counting(m)
            rows.append(_rows(run(model, x.clone())))
        reads.append(len(seen))
    if spared is not None:
        assert reads[0] < reads[1] if spared else reads[0] == reads[1], reads
    return rows[0], rows[1]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    for name in ("tensor_stats", "stats_and_relu", "_finite"):  # _finite: watch's check of a received input
        original = getattr(recorder, name)

        def count(t: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(t.numel())
            return _original(t, *args, **kwargs)

        monkeypatch.setattr(recorder, name, count)
    return seen


class Block(nn.Module):
    """conv -> bn -> relu_, twice, and a residual added in place before the last relu_: the
    torchvision ResNet pattern (the output of bn goes straight into the ReLU; the sum is the
    ReLU's input only)."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


def _blocks(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(Block(), Block(), Block()).eval().to(dtype)
    return model, torch.randn(2, 4, 9, 9, dtype=dtype)


@pytest.mark.parametrize("kind", list(RUNS))
def test_rows_are_those_read_from_the_output(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the ReLU after the residual sum is told (an input row; watch checks what the block's code
    # made); the one after bn1 reads its input's row from the memo, so its output is read
    told, read = _both(RUNS[kind], _blocks, monkeypatch, spared=kind != "output")
    assert told == read and len(told) > 10


_BUILT: dict[str, tuple[nn.Module, torch.Tensor]] = {}


def _torchvision(name: str) -> tuple[nn.Module, torch.Tensor]:
    """torchvision's ``name`` (seed 0, eval mode) and the input drawn right after it, built once per module and
    handed out as copies: the same weights and input as building it again."""
    if name not in _BUILT:
        torch.manual_seed(0)
        _BUILT[name] = getattr(torchvision.models, name)(weights=None).eval(), torch.randn(1, 3, 64, 64)
    model, x = _BUILT[name]
    return copy.deepcopy(model), x.clone()


@pytest.mark.parametrize("kind", ["io", "output", "watch"])
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "densenet121", "mobilenet_v2"])
def test_torchvision_rows_bit_for_bit(name: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def make() -> tuple[nn.Module, torch.Tensor]:
        return _torchvision(name)

    # the resnets' ReLU after each residual sum is told; densenet's ReLUs follow a BatchNorm (memo)
    # and mobilenet_v2 has ReLU6: nothing to tell there
    spared = name.startswith("resnet") and kind != "output"
    with torch.no_grad():
        told, read = _both(RUNS[kind], make, monkeypatch, spared=spared)
    assert told == read


def test_fewer_tensors_are_read_on_resnet50(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = _torchvision("resnet50")
    reads = []
    for recognised in (True, False):
        with monkeypatch.context() as m:
            if not recognised:
                m.setattr(recorder, "inplace_relu", lambda module: False)
            seen = _counting(m)
            with torch.no_grad():
                _trace("io")(model, x)
            reads.append(len(seen))
    # per bottleneck, the ReLU output after the residual sum is not read (its input is a row)
    assert reads[1] == 175 and reads[0] == 175 - 16


def _with_hook(write: str) -> Callable[[], tuple[nn.Module, torch.Tensor]]:
    """Blocks whose ReLU gets a forward hook of the user's (registered before trace's, so it runs
    before trace's post-hook) that negates the output in place, visibly or through ``.data``."""
    def negate(module: nn.Module, args: Any, out: torch.Tensor) -> None:
        (out if write == "tensor" else out.data).mul_(-2.0)

    def make() -> tuple[nn.Module, torch.Tensor]:
        model, x = _blocks()
        for block in model:
            block.relu.register_forward_hook(negate)
        return model, x
    return make


@pytest.mark.parametrize("write", ["tensor", ".data"])
@pytest.mark.parametrize("kind", ["io", "output", "watch"])
def test_a_users_forward_hook_writing_into_the_output(kind: str, write: str, monkeypatch: pytest.MonkeyPatch) -> None:
    told, read = _both(RUNS[kind], _with_hook(write), monkeypatch, spared=False)
    assert told == read
    relus = [dict(r) for r in told if dict(r)["module"].endswith("relu'") and dict(r)["which"] == "'output'"]
    assert relus and all(float(r["max"]) <= 0 < -float(r["min"]) for r in relus)  # the negated values


@pytest.mark.parametrize("kind", ["io", "watch"])
def test_a_global_forward_hook_turns_it_off(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, out: None)
    try:
        told, read = _both(RUNS[kind], _blocks, monkeypatch, spared=False)
    finally:
        handle.remove()
    assert told == read


def test_a_users_pre_hook_added_inside_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # registered after trace's pre-hook, it runs between trace's pre-hook and the ReLU
    def run(model: nn.Module, x: torch.Tensor) -> list[Any]:
        with hookscope.trace(model) as t:
            handles = [b.relu.register_forward_pre_hook(lambda m, a: a[0].data.sub_(0.5)) for b in model]
            model(x)
            for h in handles:
                h.remove()
        return list(t.rows)

    told, read = _both(run, _blocks, monkeypatch, spared=False)
    assert told == read


class OwnReLU(nn.ReLU):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input.clamp_(min=0.5)


def _replaced(how: str) -> Callable[[], tuple[nn.Module, torch.Tensor]]:
    def make() -> tuple[nn.Module, torch.Tensor]:
        model, x = _blocks()
        for block in model:
            if how == "subclass":
                block.relu = OwnReLU(inplace=True)
            else:
                relu = block.relu
                relu.forward = lambda input: input.clamp_(min=0.5)  # type: ignore[method-assign]
        return model, x
    return make


@pytest.mark.parametrize("how", ["subclass", "instance forward"])
def test_a_relu_that_is_not_torchs_is_read(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    told, read = _both(RUNS["io"], _replaced(how), monkeypatch, spared=False)
    assert told == read
    assert not shortcut.inplace_relu(_replaced(how)()[0][0].relu)


class Floor(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.relu_.default:
            return torch.ops.aten.clamp_min_.default(args[0], 0.25)
        return func(*args, **(kwargs or {}))


class Leaky(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.relu_, F.relu):
            return args[0].mul_(0.5)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["io", "watch"])
@pytest.mark.parametrize("how", ["F.relu", "torch.relu_", "dispatch mode", "function mode"])
def test_what_relu_runs_replaced(how: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(model: nn.Module, x: torch.Tensor) -> list[Any]:
        with monkeypatch.context() as m:
            if how == "F.relu":
                m.setattr(F, "relu", lambda input, inplace=False: input.clamp_(min=0.5))
            elif how == "torch.relu_":
                m.setattr(torch, "relu_", lambda input: input.clamp_(min=0.5))
            if how.endswith("mode"):
                with Floor() if how == "dispatch mode" else Leaky():
                    return RUNS[kind](model, x)
            return RUNS[kind](model, x)

    told, read = _both(run, _blocks, monkeypatch, spared=False)
    assert told == read


class Feed(nn.Module):
    """A ReLU(inplace=True) fed what ``values`` says, in a layout of ``layout``'s choosing."""

    def __init__(self, values: torch.Tensor, layout: str) -> None:
        super().__init__()
        self.values, self.layout = values, layout
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.values.clone() + 0 * x.sum().to(self.values.dtype)  # made by the parent's own code
        if self.layout == "transposed":
            v = v.t()
        elif self.layout == "slice":
            v = v[:, ::2]
        elif self.layout == "channels_last":
            v = v.view(2, 3, 4, -1).contiguous(memory_format=torch.channels_last)
        return self.relu(v)


def _values(case: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    v = torch.randn(12, 10, generator=g, dtype=torch.float64)
    if case == "zeros and negatives":
        v[0, :5] = 0.0
        v[1, :5] = -0.0
    elif case == "negative zeros only":
        v = v.abs()
        v[0, :5] = -0.0
    elif case == "all negative":
        v = -v.abs() - 1
    elif case == "nan":
        v[3, 3] = float("nan")
    elif case == "cancelling":  # large mean, tiny spread, a few negatives: the centred pass
        v = 1e4 + v * 1e-3
        v[0, 0] = -1.0
    elif case == "inf":
        v[2, 2] = float("-inf")
    return v.to(dtype)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "slice", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("case", ["plain", "zeros and negatives", "negative zeros only", "all negative",
                                  "nan", "inf", "cancelling"])
def test_values_and_layouts(case: str, dtype: torch.dtype, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def make() -> tuple[nn.Module, torch.Tensor]:
        values = _values(case, dtype)
        return nn.Sequential(Feed(values, layout), Feed(values, layout)), torch.zeros(1, dtype=dtype)

    told_here = (dtype != torch.float16 and layout != "slice"
                 and case in ("plain", "negative zeros only", "all negative"))
    for kind in ("io", "output", "watch"):  # an input row, or checked by watch; never in trace output
        spared = told_here and kind != "output"
        if case in ("nan", "inf") and kind == "watch":  # checked once more on the way to the culprit
            spared = None
        told, read = _both(RUNS[kind], make, monkeypatch, spared=spared)
        assert told == read, kind


def test_the_same_relu_twice_on_one_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn, self.relu = nn.BatchNorm1d(6).eval(), nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.relu(self.bn(x))
            y.sub_(0.3)
            return self.relu(self.relu(y))

    def make() -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(3)
        return nn.Sequential(Twice(), Twice()), torch.randn(5, 6)

    for kind in ("io", "output", "watch"):  # relu_ twice on what autograd saved: no backward
        told, read = _both(RUNS[kind], make, monkeypatch, spared=kind != "output")
        assert told == read, kind


class Between(nn.Module):
    """A write through ``.data`` (which no version counter sees) between a module and the ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.bn, self.relu = nn.BatchNorm1d(6).eval(), nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(x)
        y.data.mul_(-1)
        return self.relu(y)


@pytest.mark.parametrize("kind", ["output", "watch"])
def test_a_data_write_between_a_module_and_the_relu(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the ReLU's input is the BatchNorm's output, reduced before the write: nothing is told from it
    def make() -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(4)
        return nn.Sequential(Between(), Between()), torch.randn(5, 6)

    told, read = _both(RUNS[kind], make, monkeypatch, spared=False)
    assert told == read
