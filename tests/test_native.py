"""The optional C kernel of the CPU statistics (hookscope._native): its answers, switched off, and a
wrong answer never used (its build at install time and the other ways of not having it:
test_native_build.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import hookscope._native as native
from hookscope.analysis._reduce import tensor_stats

KERNEL = native.stats_kernel()
# CI installs a C compiler before `pip install -e .` (.ci/run), which builds the kernel; elsewhere, in an
# install made without one, these tests are skipped (the fallback is what runs then, and the rest of the
# suite tests it)
pytestmark = pytest.mark.skipif(KERNEL is None and not os.environ.get("CI"),
                                reason="the statistics kernel was not built with this install")


def test_the_kernel_is_built_here() -> None:
    assert KERNEL is not None


def _exact(v: torch.Tensor) -> tuple[float, float, float, float, int]:
    d = v.double()
    return d.sum().item(), (d * d).sum().item(), v.min().item(), v.max().item(), int((v == 0).sum())


@pytest.mark.parametrize("n", [1, 7, 8, 9, 511, 513, 65535, 65536, 65537, 3 * 65536 + 5, 2_000_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_extremes_and_zeros_against_float64(n: int, dtype: torch.dtype) -> None:
    assert KERNEL is not None
    g = torch.Generator().manual_seed(n)
    v = torch.randn(n, generator=g, dtype=dtype) * 3 + 0.5
    v[torch.rand(n, generator=g) < 0.2] = 0.0
    v[::17] = -0.0
    s, q, lo, hi, zeros = KERNEL.stats(v)
    es, eq, elo, ehi, ezeros = _exact(v)
    assert (lo, hi, zeros) == (elo, ehi, ezeros)
    # float32 values are summed in float32 lanes over blocks of 512 (64 per lane), then in float64:
    # at most ~64 roundings of 6e-8 each; float64 values in float64 throughout
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert math.isclose(s, es, rel_tol=tol, abs_tol=tol * math.sqrt(eq * n))
    assert math.isclose(q, eq, rel_tol=tol)


@pytest.mark.parametrize("n", [1, 9, 513, 65537, 3 * 65536 + 5, 2_000_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_positive_part_is_what_relu_gives_bit_for_bit(n: int, dtype: torch.dtype) -> None:
    # what trace reports for ReLU(inplace=True)'s output without reading it must be what reading
    # it would give: the same bits, every -0.0, 0.0 and negative value included
    assert KERNEL is not None
    g = torch.Generator().manual_seed(n)
    v = torch.randn(n, generator=g, dtype=dtype)
    v[torch.rand(n, generator=g) < 0.1] = 0.0
    v[::13] = -0.0
    stats, (psum, psq, negative) = KERNEL.stats_relu(v)
    assert stats == KERNEL.stats(v)
    s, q, _, _, zeros = KERNEL.stats(v.relu())
    assert (psum, psq, negative + stats[4]) == (s, q, zeros)
    assert negative == int((v < 0).sum())


def test_unaligned_memory_and_offsets() -> None:
    assert KERNEL is not None
    base = torch.randn(100_003)
    for start in range(1, 9):  # every alignment of the first element
        v = base[start:]
        assert KERNEL.stats(v)[2:] == _exact(v)[2:]


def _runtimes() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {f[5] for f in map(str.split, maps)
                if len(f) >= 6 and os.path.basename(f[5]).startswith(("libgomp", "libiomp5"))}


_ONE_RUNTIME = """
import os, torch
from hookscope._native import stats_kernel
def runtimes():
    with open("/proc/self/maps") as maps:
        return sorted({f[5] for f in map(str.split, maps)
                       if len(f) >= 6 and os.path.basename(f[5]).startswith(("libgomp", "libiomp5"))})
k = stats_kernel()
before = runtimes()
k.stats(torch.randn(3_000_000))
print(k.parallel, before == runtimes(), len(before))
"""


def test_large_tensors_share_torchs_own_openmp_workers() -> None:
    assert KERNEL is not None and KERNEL.parallel  # Linux, torch built with OpenMP
    before = _runtimes()
    KERNEL.stats(torch.randn(3_000_000))
    assert _runtimes() == before  # the kernel loads no OpenMP runtime of its own
    # a process of torch and hookscope alone holds exactly one (here other packages, scikit-learn's
    # and sentencepiece's wheels, may have brought theirs)
    out = subprocess.run([sys.executable, "-c", _ONE_RUNTIME], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "1"], out.stdout + out.stderr


def test_the_answer_does_not_depend_on_the_number_of_threads() -> None:
    assert KERNEL is not None
    v = torch.randn(5_000_001)
    before = torch.get_num_threads()
    try:
        answers = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            answers.append((KERNEL.stats(v), KERNEL.centred(v, 0.25)))
    finally:
        torch.set_num_threads(before)
    assert answers[0] == answers[1] == answers[2]


def test_threads_calling_at_once_get_their_own_answers() -> None:
    assert KERNEL is not None
    import threading

    vs = [torch.randn(2_000_000) + i for i in range(4)]
    want = [KERNEL.stats(v) for v in vs]
    got: dict[int, list[tuple[float, float, float, float, int]]] = {i: [] for i in range(4)}

    def run(i: int) -> None:
        for _ in range(5):
            got[i].append(KERNEL.stats(vs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == [want[i]] * 5 for i in range(4))


def test_non_finite_values_reach_the_caller_as_non_finite_sums() -> None:
    assert KERNEL is not None
    for bad in (math.nan, math.inf, -math.inf):
        v = torch.randn(10_000)
        v[1234] = bad
        s, q, *_ = KERNEL.stats(v)
        assert not (math.isfinite(s) and math.isfinite(q))


def test_centred_sums_survive_a_large_mean() -> None:
    assert KERNEL is not None
    v = (torch.randn(1_000_001, dtype=torch.float64) * 1e-3 + 1e4).float().double()  # float32 values
    mean = v.mean().item()
    d, q = KERNEL.centred(v, mean)
    assert abs(d) < 1e-6
    ref = ((v - mean) ** 2).sum().item()
    assert math.isclose(q, ref, rel_tol=1e-9)
    # and the row: std of a shifted tensor, not the cancelled one-pass value
    row = tensor_stats(v.float()).tolist()
    exact = v.float().double().std(correction=0).item()
    assert math.isclose(row[1], exact, rel_tol=1e-6)


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_NATIVE", "0")
    assert native.stats_kernel() is None
    row = tensor_stats(torch.tensor([1.0, -3.0, 0.0])).tolist()
    assert row[2:6] == [-3.0, 1.0, 3.0, 1.0]


def test_a_kernel_with_a_wrong_answer_is_never_used() -> None:
    class Wrong:
        def stats(self, v: torch.Tensor) -> tuple[float, float, float, float, int]:
            return (0.0, 0.0, 0.0, 0.0, 0)

        def centred(self, v: torch.Tensor, mean: float) -> tuple[float, float]:
            return (0.0, 0.0)

    assert not native._answers_right(Wrong())  # type: ignore[arg-type]
    assert KERNEL is not None and native._answers_right(KERNEL)


def _guided_reference(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0).clamp_(min=0)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 65536, 65537, 2_000_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_guided_relu_backward_is_relus_backward_and_a_clamp(n: int, dtype: torch.dtype) -> None:
    assert KERNEL is not None
    g = torch.randn(n, dtype=dtype, generator=torch.Generator().manual_seed(n))
    out = torch.randn(n, dtype=dtype, generator=torch.Generator().manual_seed(n + 1)).relu()
    g[::5], out[::7], g[1::9] = float("nan"), float("nan"), -0.0  # NaN passes on as torch passes it on
    got = KERNEL.guided(g, out)
    assert got is not None and got.dtype == dtype
    assert torch.equal(got.nan_to_num(7.0), _guided_reference(g, out).nan_to_num(7.0))


def test_guided_does_not_depend_on_threads_and_keeps_channels_last() -> None:
    assert KERNEL is not None
    g = torch.randn(4, 32, 40, 40).to(memory_format=torch.channels_last)
    out = torch.randn(4, 32, 40, 40).relu().to(memory_format=torch.channels_last)
    before = torch.get_num_threads()
    try:
        answers = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            answers.append(KERNEL.guided(g, out))
    finally:
        torch.set_num_threads(before)
    assert all(a is not None and torch.equal(a, _guided_reference(g, out)) for a in answers)
    assert answers[0] is not None and answers[0].is_contiguous(memory_format=torch.channels_last)


def test_guided_refuses_what_it_cannot_read_in_step() -> None:
    assert KERNEL is not None
    a, b = torch.randn(6, 4), torch.randn(6, 4).relu()
    assert KERNEL.guided(a.t(), b.t()) is None  # not dense in one layout
    assert KERNEL.guided(a, b.t().contiguous().t()) is None  # two layouts
    assert KERNEL.guided(a.half(), b.half()) is None and KERNEL.guided(a, b.double()) is None
    assert KERNEL.guided(a[:, :2].contiguous(), b) is None  # two shapes
    assert KERNEL.guided(a[::2], b[::2]) is None  # strided views


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_guided_on_no_elements_is_an_empty_answer(dtype: torch.dtype) -> None:
    assert KERNEL is not None
    for shape in ((0,), (0, 3, 8, 8), (2, 0)):
        got = KERNEL.guided(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype))
        assert got is not None and got.shape == shape and got.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 511, 512, 513, 65535, 65536, 65537, 300_001])
def test_squares_copy_and_difference_at_every_block_and_chunk_edge(dtype, n):
    g = torch.Generator().manual_seed(n)
    v, w = torch.randn(n, generator=g, dtype=dtype) * 3, torch.randn(n, generator=g, dtype=dtype)
    into = torch.full_like(v, float("nan"))
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert KERNEL.squares(v, into=into) == pytest.approx(float((v.double() ** 2).sum()), rel=tol, abs=1e-30)
    assert torch.equal(into, v)  # copied bit for bit, tails included
    assert KERNEL.squares(v, minus=w) == pytest.approx(float(((v - w).double() ** 2).sum()), rel=tol, abs=1e-30)
    torch.set_num_threads(1)
    try:
        alone = KERNEL.squares(v, minus=w)
    finally:
        torch.set_num_threads(2)
    assert alone == KERNEL.squares(v, minus=w)  # the same bits on one thread or two


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("offset", [0, 1, 3, 4, 7, 8])
def test_squares_copies_into_memory_at_any_alignment(dtype, offset):
    """The copy is stored past the cache where the destination is aligned, as plain stores where it is
    not: every offset of the source and the destination (and the difference read beside the copy)
    gives the same copy, bit for bit, and the same sums."""
    n = 70_001  # several chunks, each ending off a vector's edge
    g = torch.Generator().manual_seed(offset)
    src = torch.randn(n + 8, generator=g, dtype=dtype)[offset:offset + n]
    base = torch.randn(n + 8, generator=g, dtype=dtype)[8 - offset:8 - offset + n]
    into = torch.full((n + 8,), float("nan"), dtype=dtype)[(offset * 3) % 8:(offset * 3) % 8 + n]
    want = KERNEL.squares(src.clone())
    assert KERNEL.squares(src, into=into) == want and torch.equal(into, src)
    into.fill_(float("nan"))
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    got = KERNEL.squares(src, minus=base, into=into)
    assert torch.equal(into, src)  # the copy is of the source, not of the difference
    assert got == KERNEL.squares(src.clone(), minus=base.clone())
    assert got == pytest.approx(float(((src - base).double() ** 2).sum()), rel=tol)


def test_squares_refuses_what_it_cannot_read_in_step():
    v = torch.randn(4, 4)
    assert KERNEL.squares(v.t()) is None and KERNEL.squares(v, minus=v.double()) is None
    assert KERNEL.squares(v, into=torch.empty(16)) is None and KERNEL.squares(v.half()) is None
    nan = torch.tensor([1.0, float("nan")])
    assert math.isnan(KERNEL.squares(nan))
    assert math.isinf(KERNEL.squares(torch.full((64,), 3e38)))  # past float32's range, as torch's norm gives
