"""The CPU fast path of tensor_stats against a float64 reference written out plainly."""

import math

import pytest
import torch

from hookscope.analysis import _reduce
from hookscope.analysis._reduce import STATS, Scratch, flat, tensor_stats

NAN, INF = math.nan, math.inf


def reference(t):
    d = t.detach().double().reshape(-1)
    finite = bool(torch.isfinite(d).all())
    return {"mean": d.mean().item(), "std": d.std(correction=0).item() if finite else NAN,
            "min": d.min().item(), "max": d.max().item(), "absmax": d.abs().max().item(),
            "zeros": int((d == 0).sum()), "nan": int(d.isnan().sum()), "inf": int(d.isinf().sum())}


def same(got, want):
    return all((math.isnan(got[k]) and math.isnan(want[k]))
               or math.isclose(got[k], want[k], rel_tol=1e-5, abs_tol=1e-9) for k in STATS)


g = torch.Generator().manual_seed(0)
CASES = {
    "relu": torch.relu(torch.randn(1000, generator=g)),
    "all negative": -torch.rand(1000, generator=g) - 0.1,
    "all positive": torch.rand(1000, generator=g) + 1,
    "mixed": torch.randn(1000, generator=g),
    "-0.0 among negatives": torch.tensor([-0.0, -1.0, -2.0]),
    "-0.0 among positives": torch.tensor([-0.0, 0.0, 3.0]),
    "-0.0 in a mixed tensor": torch.tensor([-0.0, 1.0, -2.0, 0.0]),
    "only -0.0": torch.full((5,), -0.0),
    "only +0.0": torch.zeros(7),
    "constant": torch.full((10,), 3.0),
    "mean far from zero": torch.randn(1000, generator=g) * 1e-3 + 100,
    "finite, sum of squares overflows float32": torch.tensor([3e38, 3e38, -1e38]),
    "denormal": torch.tensor([1e-45, 0.0]),
    "+inf": torch.tensor([1.0, INF]),
    "-inf": torch.tensor([-1.0, -INF]),
    "-inf and zero": torch.tensor([1.0, -INF, 0.0]),
    "nan": torch.tensor([1.0, NAN, 0.0]),
    "negative nan": torch.tensor([1.0, -NAN]),
    "negative nan among negatives": torch.tensor([-1.0, -NAN]),
    "float64 mixed": torch.randn(100, dtype=torch.float64, generator=g),
    "float64 relu": torch.relu(torch.randn(100, dtype=torch.float64, generator=g)),
    "float64 -0.0": torch.tensor([-0.0, -1.0], dtype=torch.float64),
    "channels last": torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
    "transposed": torch.randn(30, 40, generator=g).t(),
    "expanded": torch.randn(1, 3, generator=g).expand(4, 3),
    "bfloat16": torch.randn(100, generator=g).to(torch.bfloat16),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_a_float64_reference(name):
    t = CASES[name]
    assert same(dict(zip(STATS, tensor_stats(t).tolist())), reference(t))


@pytest.mark.parametrize("name", ["relu", "mixed", "-0.0 in a mixed tensor", "all negative", "nan", "-inf"])
def test_pieces_combine_to_the_whole(monkeypatch, name):
    t = CASES[name].repeat(7)
    monkeypatch.setattr(_reduce, "_PIECE", 3)  # many pieces, the last one short
    assert same(dict(zip(STATS, tensor_stats(t).tolist())), reference(t))


def test_one_pass_variance_falls_back_where_it_would_cancel():
    # mean 1e4, std 1e-2: E[x^2] - mean^2 in float32 sums would be pure rounding noise
    t = torch.tensor([1e4 - 1e-2, 1e4 + 1e-2] * 500, dtype=torch.float64).float()
    s = dict(zip(STATS, tensor_stats(t).tolist()))
    assert s["std"] == pytest.approx(reference(t)["std"], rel=1e-6)


def test_a_negative_zero_is_a_zero_wherever_it_sits():
    # -0.0 is the sign bit alone: the fast bit count alone would miss it
    for values, zeros in (([0.0, -0.0, 1.0], 2), ([-0.0, -3.0], 1), ([-0.0, 2.0, -1.0], 1)):
        assert tensor_stats(torch.tensor(values))[5].item() == zeros


def test_flat_is_a_view_of_dense_memory():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert flat(x).data_ptr() == x.data_ptr() and flat(x).numel() == x.numel()
    assert flat(torch.randn(3, 4)).is_contiguous()


def test_scratch_is_reused_and_grows():
    s = Scratch()
    a = s.get(10, torch.float64)
    assert s.get(5, torch.float64).data_ptr() == a.data_ptr()
    assert s.get(100, torch.float64).numel() == 100


def test_a_lazily_negated_tensor():
    # torch.fft output's .conj().imag carries the neg bit: it cannot be viewed as its bits
    t = torch.fft.rfft(torch.randn(4, 16, generator=torch.Generator().manual_seed(1))).conj().imag
    assert t.is_neg()
    assert same(dict(zip(STATS, tensor_stats(t).tolist())), reference(t))


def test_constant_and_barely_varying_tensors_are_exact():
    s = dict(zip(STATS, tensor_stats(torch.full((5000,), 0.1)).tolist()))
    assert s["std"] == 0.0 and s["mean"] == pytest.approx(0.1, rel=1e-7)
    t = torch.tensor([1.0, 1.0 + 2**-23])  # the centred pass must not round the deviations
    assert tensor_stats(t)[1].item() == pytest.approx(2**-24, rel=1e-9)
    big = torch.tensor([3.4e38, 3.4e38, -3.4e38])
    assert tensor_stats(big)[1].item() == pytest.approx(reference(big)["std"], rel=1e-6)
