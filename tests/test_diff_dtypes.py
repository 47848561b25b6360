"""diff's tolerances follow the dtypes compared: bfloat16 and float16 runs are judged by their own
precision (torch.testing's rtol/atol for the dtype, against the tensor's scale, grown with depth),
float32 keeps its element-wise default, and the user's rtol/atol always win."""

import copy
import math

import pytest
import torch
from helpers import no_hooks
from torch import nn

from hookscope.analysis.diff import ATOL, RTOL, diff, settings
from hookscope.analysis.diff._tolerance import depths
from hookscope.zoo import TinyResNet

BF16 = settings(autocast=torch.bfloat16)


def ten_linear() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(10)]).eval()


class Out(nn.Module):
    """Returns a fixed tensor, whatever it is given."""

    def __init__(self, t: torch.Tensor) -> None:
        super().__init__()
        self.t = t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.t.clone()


class Cast(nn.Module):
    """Runs ``net`` on its input cast to ``dtype``: a float16 copy of a float32 model."""

    def __init__(self, net: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.net, self.dtype = net, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(self.dtype))


class BackToFloat(nn.Module):
    """A linear layer whose (autocast bfloat16) output is cast back to float32, then an argmax."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x).float()
        return y, y.argmax(-1)


# --- a model against itself under bfloat16 autocast ---------------------------------------------------
@pytest.mark.parametrize("build", ["tiny", "mlp"])
def test_a_model_against_itself_under_bfloat16_is_within_bfloat16_tolerance(build):
    torch.manual_seed(0)
    if build == "tiny":
        net, x = TinyResNet().eval(), torch.randn(2, 3, 32, 32)
    else:
        net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU())])
        x = torch.randn(4, 32)
    d = diff(net, net, x, b=BF16)
    assert d.first is None and len(d.rows) > 20
    depth = depths(net)
    for r in d:
        assert (r.status, r.tolerance, r.dtype_b) == ("ok", "bfloat16", "bfloat16")
        assert r.rtol == pytest.approx(1.6e-2 * math.sqrt(depth[r.name]), rel=1e-12) and r.atol == 1e-5
        assert 0 < r.max_rel <= r.rtol  # not equal: rounding is real, and within the bound
    text = d.table()
    body = [line for line in text.splitlines() if "float32 / bfloat16" in line]
    assert len(body) == len(d.rows) and all(line.endswith("ok, within bfloat16 tolerance") for line in body)
    assert text.splitlines()[-1] == (f"no divergence: every compared output is within tolerance ({len(d.rows)} "
                                     "within bfloat16 tolerance: rtol 1.6e-2 x sqrt(depth), atol 1e-5)")
    assert (f"{len(d.rows)} of them computed in bfloat16 follow bfloat16 tolerance (rtol 1.6e-2, atol 1e-5): "
            "|a - b| <= atol + rtol * sqrt(depth) * max|b|") in text
    assert no_hooks(net)


def test_float32_tolerance_finds_every_bfloat16_layer():
    """The old verdict, kept when asked for: float32's element-wise tolerance."""
    torch.manual_seed(0)
    net, x = TinyResNet().eval(), torch.randn(1, 3, 32, 32)
    d = diff(net, net, x, b=BF16, rtol=RTOL, atol=ATOL)
    assert d.first is d.rows[0] and all(r.tolerance == "" and r.rtol == RTOL for r in d)
    assert sum(r.diverges for r in d) >= len(d.rows) - 2


# --- a real change is still found ------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 4, 9])
@pytest.mark.parametrize("change", ["layer by 10%", "one weight"])
def test_a_real_change_is_still_the_first_divergence_under_bfloat16(k, change):
    a = ten_linear()
    b = copy.deepcopy(a)
    with torch.no_grad():
        if change == "layer by 10%":
            b[k].weight.mul_(1.1)
            b[k].bias.mul_(1.1)
        else:
            b[k].weight[2, 4] += 0.5
    torch.manual_seed(1)
    x = torch.randn(3, 6)
    d = diff(a, b, x, b=BF16)
    assert d.first is not None and d.first.name == str(k) and d.first.tolerance == "bfloat16"
    assert all(r.status == "ok" and r.tolerance == "bfloat16" for r in d.rows[:k])
    # the bound by hand: |a - b| <= 1e-5 + 1.6e-2 * sqrt(k + 1) * max|b|, element by element
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out_b = b[: k + 1](x).double()
    with torch.no_grad():
        out_a = a[: k + 1](x).double()
    bound = 1e-5 + 1.6e-2 * math.sqrt(k + 1) * out_b.abs().max().item()
    assert d.first.mismatched == int(((out_a - out_b).abs() > bound).sum()) > 0
    assert f"first divergence: {k} (call 0): " in d.table()
    assert "beyond bfloat16 tolerance (rtol " in d.table().splitlines()[-1]
    assert no_hooks(a) and no_hooks(b)


# --- the user's numbers win ------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [dict(rtol=0.5), dict(atol=0.0), dict(rtol=0, atol=0), dict(rtol=0.2, atol=0.1)])
def test_explicit_rtol_or_atol_is_used_element_by_element(given):
    torch.manual_seed(0)
    net, x = ten_linear(), torch.randn(3, 6)
    d = diff(net, net, x, b=BF16, **given)
    rtol, atol = given.get("rtol", RTOL), given.get("atol", ATOL)
    assert (d.rtol, d.atol) == (rtol, atol)
    with torch.no_grad():
        out_a = net[0](x).double()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out_b = net[0](x).double()
    row = d["0"][0]
    assert (row.rtol, row.atol, row.tolerance) == (rtol, atol, "")
    assert row.mismatched == int(((out_a - out_b).abs() > atol + rtol * out_b.abs()).sum())
    assert "follow bfloat16 tolerance" not in d.table()


def test_the_scaled_bound_counted_by_hand_with_nan_and_inf():
    b = torch.tensor([10.0, 0.01, -3.0, 0.0, math.nan, 5.0])
    a = torch.tensor([10.1, 0.12, -3.0, 0.0, math.nan, 5.2]).to(torch.bfloat16)
    d = diff(Out(a), Out(b), torch.zeros(1))
    (row,) = d.rows
    assert (row.tolerance, row.rtol, row.atol) == ("bfloat16", 1.6e-2, 1e-5)  # one leaf: depth 1
    gap = (a.double() - b.double()).abs()
    bound = 1e-5 + 1.6e-2 * 10.0  # max|b| over the finite places
    beyond = int((gap[[0, 1, 2, 3, 5]] > bound).sum())  # only 5.0 -> 5.1875 in bfloat16
    assert beyond == 1 and row.mismatched == beyond and row.nan == 1 and row.status == "differs"
    # an infinity in one run only is beyond any bound
    (row,) = diff(Out(torch.tensor([1.0, math.inf]).half()), Out(torch.tensor([1.0, 2.0])), torch.zeros(1)).rows
    assert row.tolerance == "float16" and row.mismatched == 1


# --- which outputs follow a low precision -----------------------------------------------------------------------
def test_float16_model_against_float32_uses_float16_tolerance():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    a, b = Cast(net, torch.float32), Cast(copy.deepcopy(net).half(), torch.float16)
    x = torch.randn(4, 16)
    d = diff(a, b, x)
    assert d.first is None
    for r in d:
        assert (r.dtype_a, r.dtype_b, r.tolerance) == ("float32", "float16", "float16")
        assert r.rtol == pytest.approx(1e-3 * math.sqrt(depths(a)[r.name]), rel=1e-12)
    assert d["net.4"][0].rtol == pytest.approx(1e-3 * math.sqrt(5))
    assert "within float16 tolerance: rtol 1e-3 x sqrt(depth), atol 1e-5" in d.table()
    # float16 is stricter than bfloat16: the same model in bfloat16 is beyond float16's bound
    c = Cast(copy.deepcopy(net).to(torch.bfloat16), torch.bfloat16)
    assert max(r.max_rel / (1e-3 * math.sqrt(depths(a)[r.name])) for r in diff(a, c, x)) > 1


def test_an_output_cast_back_to_float32_under_autocast_still_follows_bfloat16():
    torch.manual_seed(0)
    net = BackToFloat()
    d = diff(net, net, torch.randn(4, 8), b=BF16)
    y, idx = d[""]
    assert (y.dtype_a, y.dtype_b, y.tolerance, y.status) == ("float32", "float32", "bfloat16", "ok")
    assert (idx.dtype_b, idx.tolerance, idx.rtol) == ("int64", "", RTOL)  # integers stay exact
    # a context factory with autocast in it is seen too, and run A's autocast counts as B's
    d = diff(net, net, torch.randn(4, 8), b=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert d[""][0].tolerance == "bfloat16"
    d = diff(net, net, torch.randn(4, 8), a=BF16)
    assert d[""][0].tolerance == d["lin"][0].tolerance == "bfloat16" and d.first is None


def test_float32_against_float32_keeps_the_element_wise_default():
    net = ten_linear()
    b = copy.deepcopy(net)
    with torch.no_grad():
        b[3].bias[0] += 1e-3
    d = diff(net, b, torch.randn(3, 6))
    assert all(r.tolerance == "" and (r.rtol, r.atol) == (RTOL, ATOL) for r in d)
    assert d.first.name == "3" and "follow" not in d.table()
