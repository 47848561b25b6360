"""Hostile writes into recorded tensors: the promise of ``capture(copy=...)`` under attack.

The promise (docs/guide/in-place-trap.md, "What is guaranteed, and its limits"): a record holds the values the layer produced, even
if a later op writes into that memory. ``copy="auto"`` and ``copy="always"`` must return those
values; ``copy="never"`` may instead raise :class:`hookscope.MutationError` when the memory was
overwritten. No policy may ever return a wrong value, and the capture must never change what the
model computes.

Every test compares with a reference computed without hookscope, bit for bit. Tensors come in two
sizes on either side of ``COPY_BELOW`` (1 MiB): "small" ones are copied at once under
``copy="auto"``, "large" ones are watched through the ``Guarded`` alias. This file therefore
switches off the conftest fixture that watches every size.

Failure messages start with a tag, so failures group by cause:
``[wrong value]`` the record silently differs from the truth, ``[MutationError]`` auto/always
raised instead of keeping the values, ``[model output]`` the capture changed the model's result,
``[forward raised]`` the model failed only under the capture.

Where the write goes through a plain reference hookscope never handed out (the parent's own
variable, ``as_subclass``, ``DisableTorchFunctionSubclass``, TorchScript), ``copy="auto"`` may
raise ``MutationError`` too: the version counter is the only witness. Two paths make aliases that
PyTorch reports to no Python code and that have their own version counter (``Tensor.set_`` with a
recorded source, ``torch.utils.dlpack.to_dlpack``), and under ``copy="never"`` a numpy write into
memory handed back to the caller is unseen: these are documented limits, marked ``xfail(strict)``
so that a fix shows.

The core write paths (methods, augmented assignment, setitem, out=, bypasses) are checked on both
the output record of the layer before the writer and the writer's own input record; the larger
families (views, functional, modules, complex, int) on the output record only, to stay fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils.dlpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import hookscope
from hookscope import MutationError
from hookscope.records.retention import COPY_BELOW

POLICIES = ("auto", "always", "never")
ROWS = 4
SIZES = {"small": (ROWS, 8), "large": (ROWS, 75_000)}  # 128 B and 1.2 MB of float32
RECORDS = ("output", "input")  # the output of the layer before the writer, or the writer's input
Write = Callable[[torch.Tensor], Any]


@pytest.fixture(autouse=True)
def _watch_every_size() -> None:
    """Overrides conftest's fixture of the same name: the real 1 MiB threshold applies here."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Thousands of tiny ops: one thread is ~3x faster than two on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {name: torch.randn(shape, generator=g) for name, shape in SIZES.items()}


INPUTS = _inputs()


def gen(seed: int = 3) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- the tiny models -----------------------------------------------------------------------------
class Source(nn.Module):
    """Produces the recorded tensor: fresh memory, negative and positive values, no NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.5 - 0.25


class ComplexSource(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x * 1.5, x - 0.25)


class IntSource(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 100).to(torch.int32)


class Writer(nn.Module):
    """A later layer that writes into the tensor it receives, then hands on a copy of it."""

    def __init__(self, write: Write) -> None:
        super().__init__()
        self.write = write

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.write(h)
        return h.clone()


class Passthrough(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.seen = h
        return h.clone()


# --- checking ------------------------------------------------------------------------------------
def same(a: Any, b: Any) -> bool:
    """Bit-exact equality of two tensors (dtype, shape and every byte)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = _BITS[a.element_size()]  # compare bit patterns: NaN == NaN, -0.0 != 0.0
    return torch.equal(a.detach().as_subclass(torch.Tensor).view(bits), b.detach().view(bits))


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def diff(got: Any, want: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    ne = (got.detach().as_subclass(torch.Tensor) != want).sum().item()
    return f"{ne} of {want.numel()} elements differ"


# Write paths through references hookscope never handed out: the version counter is the witness.
UNSEEN_BUT_COUNTED = ("as_subclass_plain_then_mul_", "disable_torch_function_subclass", "jit_scripted_fn")
# Documented limits (docs/guide/in-place-trap.md, "What is guaranteed, and its limits"): no Python code sees these aliases being made.
LIMITS = {
    "utils_dlpack_roundtrip": "torch.utils.dlpack.to_dlpack is a C function no __torch_function__ "
                              "sees, and the imported tensor has its own version counter",
    "set_tensor_then_mul_": "Tensor.set_ does not dispatch __torch_function__ for its source, and the "
                            "alias it makes has its own version counter",
}
_raise_ok = False


@pytest.fixture(autouse=True)
def _contract(request: pytest.FixtureRequest) -> Iterator[None]:
    """Per test id: allow MutationError under auto where only the version counter can see the
    write, and mark the documented limits xfail(strict) so that a fix is noticed."""
    global _raise_ok
    name = request.node.name
    for key, reason in LIMITS.items():  # copies made at once (small, always) are safe from them
        if key in name and ("-auto-large" in name or "-never-" in name):
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    if "test_user_writes_after_the_model_returns" in name and "-numpy-" in name and "-never-" in name:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "copy='never' keeps no copy of memory handed to the caller; numpy writes bump no counter")))
    _raise_ok = any(k in name for k in UNSEEN_BUT_COUNTED) or (
        "test_parent_writes_through_its_own_reference" in name and "-input-" in name
    ) or "test_write_through_a_view_taken_inside_the_recorded_module" in name
    yield
    _raise_ok = False


def record_problem(read: Callable[[], Any], truth: torch.Tensor, policy: str, what: str = "record",
                   overwritten: bool = True) -> str | None:
    """None when reading the record keeps the promise; else a tagged one-line reason.

    ``overwritten``: the record's memory was written to, so copy="never" may raise instead.
    """
    try:
        got = read()
    except MutationError as e:
        if (policy == "never" or (policy == "auto" and _raise_ok)) and overwritten:
            return None
        return f"[MutationError] {what}: copy={policy!r} raised instead of keeping the values: {e}"
    if same(got, truth):
        return None
    return f"[wrong value] {what}: copy={policy!r} returned a wrong value silently ({diff(got, truth)})"


def output_problem(out: Any, expected: Any) -> str | None:
    if isinstance(expected, tuple):
        bad = [i for i, (o, e) in enumerate(zip(out, expected)) if not same(o, e)]
        return f"[model output] the capture changed output(s) {bad}" if bad else None
    if same(out, expected):
        return None
    return f"[model output] the capture changed what the model computes ({diff(out, expected)})"


def report(problems: list[str | None]) -> None:
    problems = [p for p in problems if p]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def changes(write: Write, h: torch.Tensor) -> bool:
    """Self-check of a write path without hookscope: does it change the tensor it is given?"""
    before = h.clone()
    torch.manual_seed(7)
    write(h)
    return not same(h, before)


def run_forward(model: nn.Module, x: torch.Tensor) -> tuple[Any, str | None]:
    torch.manual_seed(7)
    try:
        return model(x), None
    except MutationError:
        raise
    except Exception as e:  # the model runs fine without hookscope (checked by the reference)
        return None, f"[forward raised] the model fails only under the capture: {type(e).__name__}: {e}"


@functools.lru_cache(maxsize=4)  # tests run path by path, the size varying fastest
def reference(write: Write, size: str, source: type, inference: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Without hookscope: the true record, the model's output, and whether the write changes it."""
    x = INPUTS[size]
    truth = source()(x.clone())
    torch.manual_seed(7)
    expected = nn.Sequential(source(), Writer(write))(x.clone())
    return truth, expected, changes(write, source()(x.clone()))


def check_later_write(write: Write, record: str, policy: str, size: str, source: type = Source,
                      expect_write: bool = True) -> None:
    """Sequential(source, Writer(write)): record source's output or Writer's input, then compare."""
    x = INPUTS[size]
    truth, expected, wrote = reference(write, size, source, torch.is_inference_mode_enabled())
    assert wrote is expect_write, "test bug: the write path does not do what it says"

    model = nn.Sequential(source(), Writer(write))
    layer, keep = ("0", "output") if record == "output" else ("1", "input")
    with hookscope.capture(model, layer, keep=keep, copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    if raised:
        report([raised])
    read = (lambda: rec[layer].output) if record == "output" else (lambda: rec[layer].input)
    report([record_problem(read, truth, policy, overwritten=expect_write), output_problem(out, expected)])


def idx(*i: int) -> torch.Tensor:
    return torch.tensor(i)


# --- 1. in-place methods -------------------------------------------------------------------------
@torch.library.custom_op("hookscope_hostile::scale_", mutates_args={"x"})
def _custom_scale_(x: torch.Tensor) -> None:
    x.mul_(3.0)


def _resize_then_write(h: torch.Tensor) -> None:
    n = h.numel()
    h.resize_(n + 64)  # grows the storage shared with the record (its data pointer moves)
    h[n:] = 0  # the grown tail is uninitialised memory
    h.mul_(3.0)


def _share_memory_then_write(h: torch.Tensor) -> None:
    h.share_memory_()  # moves the storage into shared memory (its data pointer moves)
    h.mul_(3.0)


INPLACE_METHODS: dict[str, Write] = {
    "relu_": lambda h: h.relu_(),
    "add_": lambda h: h.add_(1.0),
    "add_tensor_alpha": lambda h: h.add_(torch.ones_like(h), alpha=2),
    "mul_": lambda h: h.mul_(-2.0),
    "clamp_": lambda h: h.clamp_(min=0.0),
    "zero_": lambda h: h.zero_(),
    "fill_": lambda h: h.fill_(3.0),
    "fill_tensor": lambda h: h.fill_(torch.tensor(3.0)),
    "copy_": lambda h: h.copy_(torch.zeros_like(h)),
    "copy_broadcast": lambda h: h.copy_(torch.arange(h.shape[-1], dtype=h.dtype)),
    "masked_fill_": lambda h: h.masked_fill_(h > 0, 0.0),
    "masked_scatter_": lambda h: h.masked_scatter_(h > 0, torch.zeros_like(h)),
    "index_fill_": lambda h: h.index_fill_(1, idx(0, 2), -1.0),
    "index_add_": lambda h: h.index_add_(0, idx(1), torch.ones(1, h.shape[1])),
    "index_copy_": lambda h: h.index_copy_(0, idx(3), torch.zeros(1, h.shape[1])),
    "index_put_": lambda h: h.index_put_((idx(0, 1), idx(1, 2)), torch.tensor(7.0)),
    "index_put_accumulate": lambda h: h.index_put_((idx(0, 1), idx(1, 2)), torch.tensor(7.0), accumulate=True),
    "put_": lambda h: h.put_(idx(0, 5), torch.tensor([1.0, 2.0])),
    "scatter_": lambda h: h.scatter_(1, torch.zeros(ROWS, 1, dtype=torch.long), 9.0),
    "scatter_add_": lambda h: h.scatter_add_(1, torch.zeros(ROWS, 1, dtype=torch.long), torch.ones(ROWS, 1)),
    "scatter_reduce_": lambda h: h.scatter_reduce_(1, torch.zeros(ROWS, 1, dtype=torch.long),
                                                   torch.full((ROWS, 1), 50.0), reduce="amax"),
    "addcmul_": lambda h: h.addcmul_(h, h, value=0.5),
    "addcdiv_": lambda h: h.addcdiv_(h, torch.full_like(h, 2.0)),
    "lerp_": lambda h: h.lerp_(torch.zeros_like(h), 0.5),
    "uniform_generator": lambda h: h.uniform_(generator=gen()),
    "normal_generator": lambda h: h.normal_(generator=gen()),
    "bernoulli_generator": lambda h: h.bernoulli_(0.5, generator=gen()),
    "random_generator": lambda h: h.random_(0, 10, generator=gen()),
    "apply_python_fn": lambda h: h.apply_(lambda v: v * 2.0),
    "aten_op_mul_": lambda h: torch.ops.aten.mul_.Scalar(h, -2.0),
    "unbound_method_mul_": lambda h: torch.Tensor.mul_(h, -2.0),
    "foreach_mul_": lambda h: torch._foreach_mul_([h], -2.0),
    "foreach_add_list": lambda h: torch._foreach_add_([h], [torch.ones_like(h)]),
    "nn_init_zeros_": lambda h: nn.init.zeros_(h),
    "nn_init_constant_": lambda h: nn.init.constant_(h, 0.3),
    "nn_init_normal_generator": lambda h: nn.init.normal_(h, generator=gen()),
    "nn_init_kaiming_uniform_generator": lambda h: nn.init.kaiming_uniform_(h, generator=gen()),
    "custom_op_mutates_args": lambda h: _custom_scale_(h),
    "resize_grow_then_mul_": _resize_then_write,
    "share_memory_then_mul_": _share_memory_then_write,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", INPLACE_METHODS)
def test_inplace_method(path, record, policy, size):
    check_later_write(INPLACE_METHODS[path], record, policy, size)


# --- 2. augmented assignment ---------------------------------------------------------------------
def _iadd(h):
    h += 1.0


def _isub(h):
    h -= 0.5


def _imul(h):
    h *= -2.0


def _imul_tensor(h):
    h *= torch.arange(h.shape[-1], dtype=h.dtype)


def _itruediv(h):
    h /= 3.0


def _ifloordiv(h):
    h //= 0.5


def _imod(h):
    h %= 0.3


def _ipow(h):
    h **= 2


def _iadd_on_view(h):
    v = h[1:]
    v += 5.0


AUGMENTED: dict[str, Write] = {
    "iadd": _iadd, "isub": _isub, "imul": _imul, "imul_tensor": _imul_tensor, "itruediv": _itruediv,
    "ifloordiv": _ifloordiv, "imod": _imod, "ipow": _ipow, "iadd_on_view": _iadd_on_view,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", AUGMENTED)
def test_augmented_assignment(path, record, policy, size):
    check_later_write(AUGMENTED[path], record, policy, size)


def _imatmul(h):
    v = h[:, :ROWS]
    v @= torch.full((ROWS, ROWS), 0.5)  # torch.Tensor has no __imatmul__: this rebinds v


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
def test_imatmul_is_not_a_write(record, policy, size):
    """``v @= m`` is ``v = v @ m`` for tensors: nothing is overwritten, even copy="never" reads fine."""
    assert not hasattr(torch.Tensor, "__imatmul__")
    check_later_write(_imatmul, record, policy, size, expect_write=False)


# --- 3. __setitem__ ------------------------------------------------------------------------------
def setter(key: Callable[[torch.Tensor], Any], value: Callable[[torch.Tensor], Any]) -> Write:
    def write(h: torch.Tensor) -> None:
        h[key(h)] = value(h)

    return write


SETITEM: dict[str, Write] = {
    "int": setter(lambda h: 0, lambda h: 5.0),
    "int_pair_negative": setter(lambda h: (-1, -1), lambda h: 42.0),
    "slice": setter(lambda h: slice(1, 3), lambda h: 0.0),
    "step_slice": setter(lambda h: (slice(None), slice(None, None, 2)), lambda h: 1.0),
    "bool_mask": setter(lambda h: h > 0, lambda h: 0.0),
    "bool_row_mask": setter(lambda h: torch.tensor([True, False, True, False]), lambda h: 2.0),
    "index_tensor": setter(lambda h: idx(0, 2), lambda h: -1.0),
    "index_lists": setter(lambda h: ([0, 2], [1, 3]), lambda h: 9.0),
    "index_tensor_and_slice": setter(lambda h: (idx(1), slice(2, None)), lambda h: 5.0),
    "scalar_tensor_index": setter(lambda h: torch.tensor(1), lambda h: 3.0),
    "ellipsis": setter(lambda h: Ellipsis, lambda h: 0.0),
    "ellipsis_then_int": setter(lambda h: (Ellipsis, 0), lambda h: 0.0),
    "none_then_int": setter(lambda h: (None, 0), lambda h: 1.0),
    "tensor_value": setter(lambda h: 0, lambda h: torch.arange(h.shape[-1], dtype=h.dtype)),
    "self_flipped_value": setter(lambda h: slice(None), lambda h: h.flip(1)),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", SETITEM)
def test_setitem(path, record, policy, size):
    check_later_write(SETITEM[path], record, policy, size)


# --- 4. functional inplace=True and in-place modules ---------------------------------------------
FUNCTIONAL: dict[str, Write] = {
    "relu": lambda h: F.relu(h, inplace=True),
    "relu_": lambda h: F.relu_(h),
    "dropout_train": lambda h: F.dropout(h, 0.5, training=True, inplace=True),
    "dropout1d_train": lambda h: F.dropout1d(h, 0.5, training=True, inplace=True),
    "alpha_dropout_train": lambda h: F.alpha_dropout(h, 0.5, training=True, inplace=True),
    "leaky_relu": lambda h: F.leaky_relu(h, 0.1, inplace=True),
    "leaky_relu_": lambda h: F.leaky_relu_(h, 0.1),
    "hardtanh": lambda h: F.hardtanh(h, -0.5, 0.5, inplace=True),
    "hardtanh_": lambda h: F.hardtanh_(h, -0.5, 0.5),
    "relu6": lambda h: F.relu6(h, inplace=True),
    "elu": lambda h: F.elu(h, inplace=True),
    "elu_": lambda h: F.elu_(h),
    "selu": lambda h: F.selu(h, inplace=True),
    "celu": lambda h: F.celu(h, inplace=True),
    "rrelu_eval": lambda h: F.rrelu(h, training=False, inplace=True),
    "rrelu_train": lambda h: F.rrelu(h, training=True, inplace=True),
    "silu": lambda h: F.silu(h, inplace=True),
    "mish": lambda h: F.mish(h, inplace=True),
    "hardswish": lambda h: F.hardswish(h, inplace=True),
    "hardsigmoid": lambda h: F.hardsigmoid(h, inplace=True),
    "threshold": lambda h: F.threshold(h, 0.1, 20.0, inplace=True),
    "threshold_": lambda h: F.threshold_(h, 0.1, 20.0),
}

MODULES: dict[str, Callable[[], nn.Module]] = {
    "ReLU": lambda: nn.ReLU(inplace=True),
    "Dropout_train": lambda: nn.Dropout(0.5, inplace=True),
    "Dropout1d_train": lambda: nn.Dropout1d(0.5, inplace=True),
    "LeakyReLU": lambda: nn.LeakyReLU(0.1, inplace=True),
    "Hardtanh": lambda: nn.Hardtanh(-0.5, 0.5, inplace=True),
    "ReLU6": lambda: nn.ReLU6(inplace=True),
    "ELU": lambda: nn.ELU(inplace=True),
    "SELU": lambda: nn.SELU(inplace=True),
    "CELU": lambda: nn.CELU(inplace=True),
    "SiLU": lambda: nn.SiLU(inplace=True),
    "Mish": lambda: nn.Mish(inplace=True),
    "Hardswish": lambda: nn.Hardswish(inplace=True),
    "Hardsigmoid": lambda: nn.Hardsigmoid(inplace=True),
    "Threshold": lambda: nn.Threshold(0.1, 20.0, inplace=True),
    "RReLU_train": lambda: nn.RReLU(inplace=True),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", FUNCTIONAL)
def test_functional_inplace(path, policy, size):
    check_later_write(FUNCTIONAL[path], "output", policy, size)


MODULE_WRITES: dict[str, Write] = {k: (lambda h, make=make: make()(h)) for k, make in MODULES.items()}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", MODULES)
def test_inplace_module(path, policy, size):
    """The writer is an in-place module (train mode) called by the next layer."""
    check_later_write(MODULE_WRITES[path], "output", policy, size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", MODULES)
def test_inplace_module_as_next_layer(path, policy, size):
    """nn.Sequential(layer, ReLU(inplace=True)): the classic trap, the module itself is the writer."""
    x = INPUTS[size]
    truth = Source()(x.clone())
    torch.manual_seed(7)
    expected = nn.Sequential(Source(), MODULES[path]())(x.clone())
    model = nn.Sequential(Source(), MODULES[path]())
    with hookscope.capture(model, "0", "1", keep="io", copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    report([raised] if raised else [
        record_problem(lambda: rec["0"].output, truth, policy, "output of '0'"),
        record_problem(lambda: rec["1"].input, truth, policy, "input of '1'"),
        record_problem(lambda: rec["1"].output, expected, policy, "output of '1'"),
        output_problem(out, expected),
    ])


# --- 5. out= -------------------------------------------------------------------------------------
def _sort_out(h):
    values = torch.arange(h.numel(), dtype=h.dtype).view(h.shape).flip(1)
    torch.sort(values, dim=1, out=(h, torch.empty(h.shape, dtype=torch.long)))


def _max_out_view(h):
    torch.max(torch.ones(ROWS, 3), 1, out=(h[:, 0], torch.empty(ROWS, dtype=torch.long)))


def _frexp_out(h):
    torch.frexp(torch.full(h.shape, 10.0), out=(h, torch.empty(h.shape, dtype=torch.int32)))


OUT: dict[str, Write] = {
    "add_out_self": lambda h: torch.add(h, 1.0, out=h),
    "add_out_other_inputs": lambda h: torch.add(torch.ones(h.shape), 2.0, out=h),
    "mul_out": lambda h: torch.mul(torch.ones(h.shape), -2.0, out=h),
    "cat_out": lambda h: torch.cat([torch.zeros(2, h.shape[1]), torch.ones(2, h.shape[1])], 0, out=h),
    "clamp_out_self": lambda h: torch.clamp(h, min=0.0, out=h),
    "clamp_out_other": lambda h: torch.clamp(torch.full(h.shape, -3.0), min=0.0, out=h),
    "exp_out_self": lambda h: torch.exp(h, out=h),
    "where_out": lambda h: torch.where(torch.ones(h.shape, dtype=torch.bool), torch.zeros(h.shape),
                                       torch.ones(h.shape), out=h),
    "cumsum_out": lambda h: torch.cumsum(torch.ones(h.shape), 1, out=h),
    "normalize_out": lambda h: F.normalize(torch.ones(h.shape), dim=1, out=h),
    "sort_out_tuple": _sort_out,
    "frexp_out_tuple": _frexp_out,
    "out_view_rows": lambda h: torch.add(torch.zeros(2, h.shape[1]), 1.0, out=h[:2]),
    "out_view_select": lambda h: torch.mul(torch.ones(h.shape[1]), -2.0, out=h[1]),
    "out_view_flat": lambda h: torch.add(torch.zeros(h.numel()), 1.0, out=h.view(-1)),
    "out_view_t": lambda h: torch.neg(torch.ones(h.shape[1], ROWS), out=h.t()),
    "out_view_matmul": lambda h: torch.matmul(torch.ones(ROWS, 3), torch.ones(3, ROWS), out=h[:, :ROWS]),
    "out_view_max_tuple": _max_out_view,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", OUT)
def test_out_argument(path, record, policy, size):
    check_later_write(OUT[path], record, policy, size)


# --- 6. writes through views ---------------------------------------------------------------------
def _complex(h):
    return torch.view_as_complex(h.view(ROWS, -1, 2))


VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "view_flat": lambda h: h.view(-1),
    "view_2d": lambda h: h.view(2, -1),
    "view_as": lambda h: h.view_as(h),
    "view_dtype_int32": lambda h: h.view(torch.int32),
    "view_dtype_uint8": lambda h: h.view(torch.uint8),
    "reshape_is_view": lambda h: h.reshape(-1),
    "reshape_as": lambda h: h.reshape_as(h),
    "getitem_slice": lambda h: h[1:3],
    "getitem_step": lambda h: h[:, ::2],
    "getitem_int": lambda h: h[0],
    "getitem_ellipsis": lambda h: h[...],
    "getitem_none": lambda h: h[None],
    "t": lambda h: h.t(),
    "T": lambda h: h.T,
    "mT": lambda h: h.mT,
    "H": lambda h: h.H,
    "adjoint": lambda h: h.adjoint(),
    "transpose": lambda h: h.transpose(0, 1),
    "swapaxes": lambda h: h.swapaxes(0, 1),
    "swapdims": lambda h: h.swapdims(0, 1),
    "permute": lambda h: h.permute(1, 0),
    "movedim": lambda h: h.movedim(0, 1),
    "moveaxis": lambda h: torch.moveaxis(h, 0, 1),
    "expand_same_shape": lambda h: h.expand(ROWS, h.shape[1]),
    "expand_as": lambda h: h.expand_as(h),
    "broadcast_to_same_shape": lambda h: torch.broadcast_to(h, h.shape),
    "narrow": lambda h: h.narrow(1, 1, 3),
    "select": lambda h: h.select(0, 1),
    "unfold": lambda h: h.unfold(1, 2, 2),
    "diagonal": lambda h: h.diagonal(),
    "diagonal_offset": lambda h: torch.diagonal(h, 1),
    "as_strided": lambda h: h.as_strided((2, 3), (h.shape[1], 1), 1),
    "torch_as_strided": lambda h: torch.as_strided(h, (ROWS,), (h.shape[1],), 2),
    "squeeze": lambda h: h.unsqueeze(0).squeeze(0),
    "squeeze_noop": lambda h: h.squeeze(),
    "unsqueeze": lambda h: h.unsqueeze(1),
    "flatten": lambda h: h.flatten(),
    "ravel": lambda h: h.ravel(),
    "unflatten": lambda h: h.unflatten(1, (2, -1)),
    "view_as_complex": _complex,
    "complex_real": lambda h: _complex(h).real,
    "complex_imag": lambda h: _complex(h).imag,
    "view_as_real_of_complex": lambda h: torch.view_as_real(_complex(h)),
    "real_of_real": lambda h: h.real,
    "chunk": lambda h: h.chunk(2, 1)[1],
    "split": lambda h: h.split(2, 0)[1],
    "split_sizes": lambda h: h.split([1, 3], 0)[1],
    "unbind": lambda h: h.unbind(0)[2],
    "tensor_split": lambda h: h.tensor_split(3, 1)[1],
    "hsplit": lambda h: h.hsplit(2)[0],
    "vsplit": lambda h: h.vsplit(2)[1],
    "detach": lambda h: h.detach(),
    "data": lambda h: h.data,
    "aten_alias": lambda h: torch.ops.aten.alias(h),
    "contiguous_returns_self": lambda h: h.contiguous(),
    "float_returns_self": lambda h: h.float(),
    "to_returns_self": lambda h: h.to(torch.float32),
    "cpu_returns_self": lambda h: h.cpu(),
    "view_of_view_flat_step": lambda h: h.view(-1)[::3],
    "t_slice_unsqueeze_select": lambda h: h.t()[1:].unsqueeze(0).select(0, 0),
    "T_T": lambda h: h.T.T,
    "diagonal_unsqueeze": lambda h: h.diagonal().unsqueeze(0),
    "detach_view": lambda h: h.detach().view(-1),
    "data_t": lambda h: h.data.t(),
    "chunk_of_t": lambda h: h.t().chunk(2, 0)[1],
    "unbind_of_view": lambda h: h.view(2, 2, -1).unbind(1)[0],
    "split_of_detach": lambda h: h.detach().split(1, 0)[3],
}


def _view_mul(view):
    return lambda h: view(h).mul_(3)


VIEW_WRITES: dict[str, Write] = {k: _view_mul(view) for k, view in VIEWS.items()}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("view", VIEWS)
def test_write_through_view(view, policy, size):
    """``view(h).mul_(3)``; other writes through random chains of views: the property test below."""
    check_later_write(VIEW_WRITES[view], "output", policy, size)


# --- 7. writes that bypass PyTorch's Python layer ------------------------------------------------
def _numpy_slice(h):
    h.numpy()[:] = 0


def _numpy_ufunc_out(h):
    a = h.numpy()
    np.multiply(a, 3, out=a)


def _np_asarray(h):
    np.asarray(h)[0] = 1


def _np_from_dlpack(h):
    np.from_dlpack(h)[...] = 0


def _data_setitem(h):
    h.data[...] = 0


def _storage_setitem(h):
    h.untyped_storage()[0:16] = 0


def _ctypes_memset(h):
    ctypes.memset(h.data_ptr(), 0, h.numel() * h.element_size())


def _disable_torch_function(h):
    with torch._C.DisableTorchFunctionSubclass():
        h.mul_(3)


def _scripted_mul_(x: torch.Tensor) -> None:
    x.mul_(3.0)


_scripted: list[Any] = []


def _jit_scripted(h):
    if not _scripted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            _scripted.append(torch.jit.script(_scripted_mul_))
    _scripted[0](h)


def _embedding_max_norm(h):
    F.embedding(idx(0, 1, 2, 3), h, max_norm=1.0)  # renormalises the rows of its *weight* in place


def _batch_norm_running_stats(h):
    F.batch_norm(torch.randn(2, h.shape[1], generator=gen()), h[0], h[1], training=True, momentum=0.5)


BYPASS: dict[str, Write] = {
    "numpy_slice_assign": _numpy_slice,
    "numpy_ufunc_out": _numpy_ufunc_out,
    "np_asarray_setitem": _np_asarray,
    "from_numpy_roundtrip": lambda h: torch.from_numpy(h.numpy()).mul_(3),
    "np_from_dlpack": _np_from_dlpack,
    "torch_from_dlpack": lambda h: torch.from_dlpack(h).mul_(3),
    "utils_dlpack_roundtrip": lambda h: torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(h)).mul_(3),
    "untyped_storage_fill_": lambda h: h.untyped_storage().fill_(0),
    "untyped_storage_copy_": lambda h: h.untyped_storage().copy_(torch.zeros_like(h).untyped_storage()),
    "untyped_storage_setitem": _storage_setitem,
    "set_storage_then_mul_": lambda h: torch.empty(0).set_(h.untyped_storage(), h.storage_offset(), h.shape,
                                                           h.stride()).mul_(3),
    "set_tensor_then_mul_": lambda h: torch.empty(0).set_(h).mul_(3),
    "as_subclass_plain_then_mul_": lambda h: h.as_subclass(torch.Tensor).mul_(3),
    "data_mul_": lambda h: h.data.mul_(3),
    "data_setitem": _data_setitem,
    "ctypes_memset": _ctypes_memset,
    "disable_torch_function_subclass": _disable_torch_function,
    "jit_scripted_fn": _jit_scripted,
    "embedding_max_norm_renorms_weight": _embedding_max_norm,
    "batch_norm_running_stats_are_views": _batch_norm_running_stats,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", BYPASS)
def test_write_bypassing_python(path, record, policy, size):
    check_later_write(BYPASS[path], record, policy, size)


# --- 8. other dtypes: complex and integer records ------------------------------------------------
def _ior(h):
    h |= 8


def _iand(h):
    h &= 3


def _ixor(h):
    h ^= 5


def _ilshift(h):
    h <<= 1


def _irshift(h):
    h >>= 1


def _ifloordiv_int(h):
    h //= 3


def _imod_int(h):
    h %= 7


def _complex_setitem(h):
    h[0] = 1 + 1j


COMPLEX_WRITES: dict[str, Write] = {
    "view_as_real_mul_": lambda h: torch.view_as_real(h).mul_(3),
    "real_zero_": lambda h: h.real.zero_(),
    "imag_fill_": lambda h: h.imag.fill_(1),
    "mul_1j": lambda h: h.mul_(1j),
    "conj_view_mul_": lambda h: h.conj().mul_(2j),
    "conj_physical_": lambda h: h.conj_physical_(),
    "setitem": _complex_setitem,
    "view_float32_mul_": lambda h: h.view(torch.float32).mul_(3),
    "numpy": _numpy_slice,
}

INT_WRITES: dict[str, Write] = {
    "ior": _ior, "iand": _iand, "ixor": _ixor, "ilshift": _ilshift, "irshift": _irshift,
    "ifloordiv": _ifloordiv_int, "imod": _imod_int,
    "bitwise_not_": lambda h: h.bitwise_not_(),
    "random_generator": lambda h: h.random_(0, 10, generator=gen()),
    "view_float32_mul_": lambda h: h.view(torch.float32).mul_(3),
    "numpy": _numpy_slice,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", COMPLEX_WRITES)
def test_complex_record(path, policy, size):
    check_later_write(COMPLEX_WRITES[path], "output", policy, size, source=ComplexSource)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", INT_WRITES)
def test_int_record(path, policy, size):
    check_later_write(INT_WRITES[path], "output", policy, size, source=IntSource)


# --- 9. under inference_mode (inference tensors have no version counter) ------------------------
INFERENCE_PATHS = {
    "mul_": INPLACE_METHODS["mul_"],
    "setitem_bool_mask": SETITEM["bool_mask"],
    "relu_module": lambda h: nn.ReLU(inplace=True)(h),
    "add_out_self": OUT["add_out_self"],
    "t_then_mul_": VIEW_WRITES["t"],
    "chunk_then_mul_": VIEW_WRITES["chunk"],
    "numpy_slice_assign": BYPASS["numpy_slice_assign"],
    "data_mul_": BYPASS["data_mul_"],
    "torch_from_dlpack": BYPASS["torch_from_dlpack"],
    "untyped_storage_fill_": BYPASS["untyped_storage_fill_"],
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("path", INFERENCE_PATHS)
def test_under_inference_mode(path, record, policy, size):
    with torch.inference_mode():
        check_later_write(INFERENCE_PATHS[path], record, policy, size)


# --- 10. where the write happens: hooks of the same module, hookscope.edit, after the model -------
@contextlib.contextmanager
def oracle(model: nn.Module, layer: str, field: str) -> Iterator[list[torch.Tensor]]:
    """The truth: a plain hook that clones what the capture would record, at the same moment."""
    got: list[torch.Tensor] = []
    m = model.get_submodule(layer)
    if field == "output":
        handle = m.register_forward_hook(lambda mod, a, o: got.append(o.clone()))
    else:
        handle = m.register_forward_pre_hook(lambda mod, a: got.append(a[0].clone()))
    try:
        yield got
    finally:
        handle.remove()


def _fwd_hook_same_module(model):
    @contextlib.contextmanager
    def cm():
        h = model[0].register_forward_hook(lambda m, a, o: o.mul_(3))  # returns None: in place
        try:
            yield
        finally:
            h.remove()

    return cm()


def _fwd_hook_same_module_numpy(model):
    @contextlib.contextmanager
    def cm():
        def hook(m, a, o):
            o.numpy()[:] = 0

        h = model[0].register_forward_hook(hook)
        try:
            yield
        finally:
            h.remove()

    return cm()


def _pre_hook_next_module(model):
    @contextlib.contextmanager
    def cm():
        def hook(m, a):
            a[0].mul_(3)  # returns None: in place

        h = model[1].register_forward_pre_hook(hook)
        try:
            yield
        finally:
            h.remove()

    return cm()


HOOK_WRITERS: dict[str, Callable[[nn.Module], Any]] = {
    "forward_hook_same_module_mul_": _fwd_hook_same_module,
    "forward_hook_same_module_numpy": _fwd_hook_same_module_numpy,
    "edit_output_inplace_same_module": lambda model: hookscope.edit(model, "0", output=lambda t: t.mul_(3)),
    "edit_output_relu_inplace_same_module": lambda model: hookscope.edit(model, "0", output=lambda t: F.relu_(t)),
    "forward_pre_hook_next_module": _pre_hook_next_module,
    "edit_input_inplace_next_module": lambda model: hookscope.edit(model, "1", input=lambda t: t.mul_(3)),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("hook", HOOK_WRITERS)
def test_write_in_a_hook_entered_after_the_capture(hook, record, policy, size):
    """Another hook (plain, or a hookscope.edit) registered after the capture writes in place."""
    x = INPUTS[size]
    layer, field = ("0", "output") if record == "output" else ("1", "input")
    model = nn.Sequential(Source(), Passthrough())
    with oracle(model, layer, field) as truth, HOOK_WRITERS[hook](model):
        expected = model(x.clone())
    with hookscope.capture(model, layer, keep=field, copy=policy) as rec, HOOK_WRITERS[hook](model):
        out, raised = run_forward(model, x.clone())
    read = (lambda: rec[layer].output) if field == "output" else (lambda: rec[layer].input)
    report([raised] if raised else [record_problem(read, truth[0], policy), output_problem(out, expected)])


class SliceView(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, 1:]


# scenario -> (model, recorded layer, field, what the user writes: "y" model output / "x" input)
AFTER_SCENARIOS: dict[str, Callable[[], tuple[nn.Module, str, str, str]]] = {
    "model_returns_the_record": lambda: (nn.Sequential(Source()), "0", "output", "y"),
    "model_returns_a_view_of_the_record": lambda: (nn.Sequential(Source(), SliceView()), "0", "output", "y"),
    "model_returns_its_last_input_record": lambda: (nn.Sequential(Source(), nn.Identity()), "1", "input", "y"),
    "user_mutates_x_input_record": lambda: (nn.Sequential(Source()), "0", "input", "x"),
    "user_mutates_x_identity_output_record": lambda: (nn.Sequential(nn.Identity(), Source()), "0", "output", "x"),
}


def _user_setitem(t):
    t[0] = 0


AFTER_WRITES: dict[str, Write] = {
    "mul_": lambda t: t.mul_(3),
    "numpy": _numpy_slice,
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("when", ["inside_block", "after_block"])
@pytest.mark.parametrize("write", AFTER_WRITES)
@pytest.mark.parametrize("scenario", AFTER_SCENARIOS)
def test_user_writes_after_the_model_returns(scenario, write, when, policy, size):
    """The user's own code writes into the model's output (or input) once the forward is done."""
    x = INPUTS[size].clone()
    model, layer, field, target = AFTER_SCENARIOS[scenario]()
    with oracle(model, layer, field) as truth:
        expected = model(x.clone())
    with hookscope.capture(model, layer, keep=field, copy=policy) as rec:
        y, raised = run_forward(model, x)
        if raised:
            report([raised])
        problems = [output_problem(y, expected)]
        if when == "inside_block":
            AFTER_WRITES[write](y if target == "y" else x)
    if when == "after_block":
        AFTER_WRITES[write](y if target == "y" else x)
    read = (lambda: rec[layer].output) if field == "output" else (lambda: rec[layer].input)
    report([record_problem(read, truth[0], policy)] + problems)


class QueryEmbed(nn.Module):
    """Returns its own parameter, as DETR-style learned queries do."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(shape, generator=gen()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.query


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_step_after_forward_updates_a_recorded_parameter(foreach, policy, size):
    model = nn.Sequential(QueryEmbed(SIZES[size]))
    truth = model[0].query.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, foreach=foreach)
    with hookscope.capture(model, "0", copy=policy) as rec:
        y = model(INPUTS[size])
        y.sum().backward()
        opt.step()
    assert not same(model[0].query.detach(), truth), "test bug: the step changed nothing"
    report([record_problem(lambda: rec["0"].output, truth, policy)])


# --- 11. state kept across calls -----------------------------------------------------------------
class Buffered(nn.Module):
    """Writes each result into one preallocated buffer and returns the buffer (or a view of it)."""

    def __init__(self, shape: tuple[int, ...], view: bool) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(shape))
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.copy_(x * 1.5 - 0.25)
        return self.buf[:] if self.view else self.buf


class GrowingCache(nn.Module):
    """A KV-cache: call i writes its columns into a preallocated cache and returns the filled prefix."""

    def __init__(self, shape: tuple[int, ...], calls: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(shape[0], shape[1] * calls))
        self.width, self.pos = shape[1], 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache[:, self.pos:self.pos + self.width] = x * 1.5 - 0.25
        self.pos += self.width
        return self.cache[:, :self.pos]


class WritesLastCallsInput(nn.Module):
    """Keeps the tensor it received and writes into it on its next call (a lazily updated state)."""

    def __init__(self) -> None:
        super().__init__()
        self.prev: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.prev.mul_(0.5)
        self.prev = h
        return h.clone()


STATEFUL = ("buffer_returned", "buffer_view_returned", "growing_kv_cache", "writes_last_calls_input")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", STATEFUL)
def test_state_written_by_a_later_call(kind, policy, size):
    """The same model runs twice in one capture; the second call writes into the first's record."""
    shape = SIZES[size]
    xs = [INPUTS[size].clone(), INPUTS[size].flip(1).clone()]

    def build() -> nn.Module:
        if kind == "buffer_returned":
            return nn.Sequential(Buffered(shape, view=False))
        if kind == "buffer_view_returned":
            return nn.Sequential(Buffered(shape, view=True))
        if kind == "growing_kv_cache":
            return nn.Sequential(GrowingCache(shape, calls=2))
        return nn.Sequential(Source(), WritesLastCallsInput())

    ref = build()
    with oracle(ref, "0", "output") as truth:
        expected = [ref(x).clone() for x in xs]
    model = build()
    with hookscope.capture(model, "0", copy=policy) as rec:
        outs = []
        for x in xs:
            y, raised = run_forward(model, x)
            if raised:
                report([raised])
            outs.append(y.clone())
    report([record_problem(lambda: rec["0"].calls[i].output, truth[i], policy, f"call {i}") for i in range(2)]
           + [output_problem(o, e) for o, e in zip(outs, expected)])


# --- 12. the model keeps its own plain reference to recorded memory ------------------------------
class ViewModule(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.view(-1)


class DetachModule(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.detach()


ALIAS_MODULES: dict[str, Callable[[], nn.Module]] = {
    "Identity": nn.Identity,
    "Dropout_eval": lambda: nn.Dropout(0.5).eval(),
    "Flatten": lambda: nn.Flatten(0),
    "Unflatten": lambda: nn.Unflatten(1, (2, -1)),
    "view_module": ViewModule,
    "slice_module": SliceView,
    "detach_module": DetachModule,
}


class Parent(nn.Module):
    """h = src(x); y = alias(h) (recorded: shares h's memory); then the parent writes through h."""

    def __init__(self, alias: nn.Module, write: Write) -> None:
        super().__init__()
        self.src, self.alias, self.write = Source(), alias, write

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.src(x)
        y = self.alias(h)
        self.write(h)
        return h.clone(), y.clone()


PARENT_WRITES: dict[str, Write] = {
    "mul_": lambda h: h.mul_(3),
    "relu_module": lambda h: nn.ReLU(inplace=True)(h),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("write", PARENT_WRITES)
@pytest.mark.parametrize("alias", ALIAS_MODULES)
def test_parent_writes_through_its_own_reference(alias, write, record, policy, size):
    """A recorded module returns (or receives) an alias of a tensor its parent holds and later writes."""
    x = INPUTS[size]

    def build() -> nn.Module:
        return Parent(ALIAS_MODULES[alias](), PARENT_WRITES[write])

    ref = build()
    with oracle(ref, "alias", record) as truth:
        expected = ref(x.clone())
    model = build()
    with hookscope.capture(model, "alias", keep=record, copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    read = (lambda: rec["alias"].output) if record == "output" else (lambda: rec["alias"].input)
    report([raised] if raised else [record_problem(read, truth[0], policy), output_problem(out, expected)])


class KeepsAView(nn.Module):
    """Keeps a plain view of its own output before returning it (a cache, a debug handle...)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * 1.5 - 0.25
        self.saved = out[:, :2]
        return out


class UsesSavedView(nn.Module):
    def __init__(self, owner: KeepsAView) -> None:
        super().__init__()
        self.owner = [owner]  # not a submodule

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.owner[0].saved.fill_(0)
        return h.clone()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_write_through_a_view_taken_inside_the_recorded_module(policy, size):
    x = INPUTS[size]

    def build() -> nn.Module:
        src = KeepsAView()
        return nn.Sequential(src, UsesSavedView(src))

    truth = Source()(x)
    torch.manual_seed(7)
    expected = build()(x.clone())
    model = build()
    with hookscope.capture(model, "0", copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    report([raised] if raised else [record_problem(lambda: rec["0"].output, truth, policy),
                                    output_problem(out, expected)])


# --- 13. several records on the same memory ------------------------------------------------------
MULTI_WRITES: dict[str, Write] = {
    "mul_": lambda h: h.mul_(3),
    "setitem_row": _user_setitem,
    "relu_module": lambda h: nn.ReLU(inplace=True)(h),
    "t_chunk_mul_": lambda h: h.t().chunk(2, 0)[0].mul_(3),
    "out_view": OUT["out_view_rows"],
    "numpy": _numpy_slice,
    "data_mul_": BYPASS["data_mul_"],
}


def _check_multi(build: Callable[[], nn.Module], fields: list[tuple[str, str]], policy: str, size: str,
                 capture_args: tuple[str, ...], keep: str) -> None:
    x = INPUTS[size]
    ref = build()
    with contextlib.ExitStack() as stack:
        truths = [stack.enter_context(oracle(ref, layer, field)) for layer, field in fields]
        torch.manual_seed(7)
        expected = ref(x.clone())
    model = build()
    with hookscope.capture(model, *capture_args, keep=keep, copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    if raised:
        report([raised])
    report([record_problem((lambda L=layer, f=field: getattr(rec[L], f)), truth[0], policy, f"{field} of {layer!r}")
            for (layer, field), truth in zip(fields, truths)] + [output_problem(out, expected)])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("write", MULTI_WRITES)
def test_module_and_its_parent_record_the_same_tensor(write, policy, size):
    build = lambda: nn.Sequential(nn.Sequential(Source()), Writer(MULTI_WRITES[write]))  # noqa: E731
    _check_multi(build, [("0", "output"), ("0.0", "output")], policy, size, ("0", "0.0"), "output")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("write", MULTI_WRITES)
def test_keep_io_output_is_next_input(write, policy, size):
    build = lambda: nn.Sequential(Source(), nn.ReLU(inplace=True), Writer(MULTI_WRITES[write]))  # noqa: E731
    fields = [("0", "input"), ("0", "output"), ("1", "input"), ("1", "output"), ("2", "input"), ("2", "output")]
    _check_multi(build, fields, policy, size, ("0", "1", "2"), "io")


class ViewChain(nn.Module):
    """Two recorded layers whose outputs are views of each other, then a write."""

    def __init__(self, write: Write) -> None:
        super().__init__()
        self.src, self.part, self.write = Source(), SliceView(), write

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.src(x)
        v = self.part(h)
        self.write(h)
        return h.clone(), v.clone()


def _write_only_column_0(h):
    h[:, 0] = 0  # outside the recorded view h[:, 1:]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("write", {**MULTI_WRITES, "outside_the_view": _write_only_column_0})
def test_records_that_are_views_of_each_other(write, policy, size):
    w = {**MULTI_WRITES, "outside_the_view": _write_only_column_0}[write]
    _check_multi(lambda: ViewChain(w), [("src", "output"), ("part", "output")], policy, size, ("src", "part"),
                 "output")


class TwoViews(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * 1.5 - 0.25
        return h, h.t()


class WritesSecond(nn.Module):
    def __init__(self, write: Write) -> None:
        super().__init__()
        self.write = write

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.write(pair[1].t())
        return pair[0].clone()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("write", MULTI_WRITES)
def test_tuple_output_of_two_views_of_one_tensor(write, policy, size):
    x = INPUTS[size]
    h = Source()(x)
    build = lambda: nn.Sequential(TwoViews(), WritesSecond(MULTI_WRITES[write]))  # noqa: E731
    torch.manual_seed(7)
    expected = build()(x.clone())
    model = build()
    with hookscope.capture(model, "0", copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    if raised:
        report([raised])

    def first():
        return rec["0"].output[0]

    def second():
        return rec["0"].output[1]

    report([record_problem(first, h, policy, "output[0]"), record_problem(second, h.t(), policy, "output[1]"),
            output_problem(out, expected)])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("inner", POLICIES)
@pytest.mark.parametrize("outer", POLICIES)
@pytest.mark.parametrize("write", ["mul_", "numpy"])
def test_two_nested_captures_of_one_layer(write, outer, inner, size):
    x = INPUTS[size]
    truth = Source()(x)
    build = lambda: nn.Sequential(Source(), Writer(MULTI_WRITES[write]))  # noqa: E731
    torch.manual_seed(7)
    expected = build()(x.clone())
    model = build()
    with hookscope.capture(model, "0", copy=outer) as rec_o, hookscope.capture(model, "0", copy=inner) as rec_i:
        out, raised = run_forward(model, x.clone())
    report([raised] if raised else [
        record_problem(lambda: rec_o["0"].output, truth, outer, "outer capture"),
        record_problem(lambda: rec_i["0"].output, truth, inner, "inner capture"),
        output_problem(out, expected),
    ])


# --- 14. the size threshold itself ---------------------------------------------------------------
def test_sizes_straddle_the_copy_threshold():
    """Small records are copied at once; large ones are kept by reference (no copy while unwritten)."""
    nbytes = {k: v.numel() * v.element_size() for k, v in INPUTS.items()}
    assert nbytes["small"] < COPY_BELOW <= nbytes["large"]
    for size, shared in (("small", False), ("large", True)):
        model = nn.Sequential(Source(), Passthrough())
        with hookscope.capture(model, "0") as rec:
            model(INPUTS[size])
        kept = rec["0"].output
        assert (kept.data_ptr() == model[1].seen.data_ptr()) is shared, f"{size}: not the path this file tests"
        assert same(kept, Source()(INPUTS[size]))


# --- 15. torch.compile'd writer ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_submodule_writes_into_its_input(policy, size):
    torch._dynamo.reset()
    x = INPUTS[size]
    truth = Source()(x)

    def build() -> nn.Module:
        return nn.Sequential(Source(), torch.compile(Writer(lambda h: h.mul_(3)), backend="aot_eager"))

    expected = build()(x.clone())
    model = build()
    with hookscope.capture(model, "0", copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    report([raised] if raised else [record_problem(lambda: rec["0"].output, truth, policy),
                                    output_problem(out, expected)])


# --- 16. property: random chains of views, then a write ------------------------------------------
def _step_complex(v):
    if v.dtype != torch.float32 or v.dim() == 0 or v.shape[-1] % 2 or v.stride(-1) != 1:
        return None
    if any(s % 2 for s in v.stride()[:-1]) or v.storage_offset() % 2:
        return None
    return torch.view_as_complex(v.unflatten(-1, (-1, 2)))


VIEW_STEPS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "t": lambda v: v.t() if v.dim() == 2 else None,
    "mT": lambda v: v.mT if v.dim() >= 2 else None,
    "transpose": lambda v: v.transpose(0, -1),
    "permute_reverse": lambda v: v.permute(*reversed(range(v.dim()))),
    "slice0": lambda v: v[1:] if v.shape[0] > 1 else None,
    "step_last": lambda v: v[..., ::2] if v.shape[-1] > 1 else None,
    "select0": lambda v: v[0] if v.dim() >= 2 else None,
    "narrow_last": lambda v: v.narrow(-1, 1, v.shape[-1] - 1) if v.shape[-1] > 1 else None,
    "unsqueeze0": lambda v: v.unsqueeze(0),
    "squeeze": lambda v: v.squeeze() if v.squeeze().dim() >= 1 else None,
    "flatten": lambda v: v.flatten(),
    "view_flat": lambda v: v.view(-1) if v.is_contiguous() else None,
    "reshape_flat": lambda v: v.reshape(-1),
    "unflatten_last": lambda v: v.unflatten(-1, (2, -1)) if v.shape[-1] % 2 == 0 else None,
    "chunk_last": lambda v: v.chunk(2, -1)[-1],
    "split0": lambda v: v.split(1, 0)[0],
    "unbind0": lambda v: v.unbind(0)[-1] if v.dim() >= 2 else None,
    "tensor_split_last": lambda v: v.tensor_split(2, -1)[0] if v.shape[-1] >= 2 else None,
    "diagonal": lambda v: v.diagonal() if v.dim() >= 2 else None,
    "unfold_last": lambda v: v.unfold(-1, 2, 2) if v.shape[-1] >= 2 else None,
    "movedim": lambda v: v.movedim(0, -1) if v.dim() >= 2 else None,
    "detach": lambda v: v.detach(),
    "data": lambda v: v.data,
    "expand_as": lambda v: v.expand_as(v),
    "as_strided_same": lambda v: v.as_strided(v.shape, v.stride(), v.storage_offset()),
    "view_int32": lambda v: v.view(torch.int32) if v.dtype == torch.float32 else None,
    "view_float32": lambda v: v.view(torch.float32) if v.dtype == torch.int32 else None,
    "view_as_complex": _step_complex,
    "real": lambda v: v.real if v.is_complex() else None,
    "imag": lambda v: v.imag if v.is_complex() else None,
    "view_as_real": lambda v: torch.view_as_real(v) if v.is_complex() else None,
}


def _chain_setitem(v):
    v[...] = 1


CHAIN_WRITES: dict[str, Write] = {
    "mul_": lambda v: v.mul_(3),
    "fill_": lambda v: v.fill_(1),
    "setitem_ellipsis": _chain_setitem,
    "add_out_self": lambda v: torch.add(v, 1, out=v),
    "numpy": lambda v: v.numpy().__setitem__(Ellipsis, 1),
    "data_mul_": lambda v: v.data.mul_(3),
}


def _apply_chain(h: torch.Tensor, steps: list[str]) -> tuple[torch.Tensor, list[str]]:
    """Apply the applicable steps; return the view and the steps actually applied."""
    v, applied = h, []
    for name in steps:
        try:
            nxt = VIEW_STEPS[name](v)
        except RuntimeError:
            nxt = None
        if nxt is not None and nxt.numel() > 0:
            v, applied = nxt, applied + [name]
    return v, applied


class ChainWriter(nn.Module):
    def __init__(self, steps: list[str], write: str) -> None:
        super().__init__()
        self.steps, self.write = steps, write

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        v = h
        for name in self.steps:  # already known to apply: no try here, so hookscope's errors surface
            v = VIEW_STEPS[name](v)
        CHAIN_WRITES[self.write](v)
        return h.clone()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("policy", POLICIES)
@settings(derandomize=True, database=None, max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(sorted(VIEW_STEPS)), max_size=5),
       write=st.sampled_from(sorted(CHAIN_WRITES)), record=st.sampled_from(RECORDS))
def test_random_view_chain_then_write(policy, size, steps, write, record):
    x = INPUTS[size]
    _, applied = _apply_chain(Source()(x), steps)
    build = lambda: nn.Sequential(Source(), ChainWriter(applied, write))  # noqa: E731
    truth = Source()(x)
    expected = build()(x.clone())
    model = build()
    layer, keep = ("0", "output") if record == "output" else ("1", "input")
    with hookscope.capture(model, layer, keep=keep, copy=policy) as rec:
        out, raised = run_forward(model, x.clone())
    read = (lambda: rec[layer].output) if record == "output" else (lambda: rec[layer].input)
    report([raised] if raised else [record_problem(read, truth, policy, f"record after {applied} + {write}"),
                                    output_problem(out, expected)])
