"""diff's tolerances follow the dtypes compared: bfloat16 and float16 runs are judged by their own
precision (the dtype's eps element by element, plus a term against the output's robust scale grown
with depth, whose size is stated as the detection limit), from the call where a run first computed
in it on; float32 keeps its element-wise default, and the user's rtol/atol always win."""

import copy
import math

import pytest
import torch
from helpers import no_hooks
from torch import nn

from hookscope.analysis.diff import ATOL, RTOL, diff, settings
from hookscope.analysis.diff._result import percent
from hookscope.analysis.diff._tolerance import SPREAD, depths
from hookscope.zoo import TinyResNet

BF16 = settings(autocast=torch.bfloat16)
EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def spread_at(dtype: str, depth: int) -> float:
    """The scale term of the bound, worked out from its definition: 6 eps sqrt(depth)."""
    return 6 * EPS[dtype] * math.sqrt(depth)


def rms(t: torch.Tensor) -> float:
    """The scale of an output with no masked values: its root mean square."""
    return t.double().pow(2).mean().sqrt().item()


def beyond(a: torch.Tensor, b: torch.Tensor, dtype: str, depth: int) -> int:
    """How many elements are beyond the low-precision bound, counted by hand."""
    a, b = a.double(), b.double()
    bound = 1e-5 + EPS[dtype] * b.abs() + spread_at(dtype, depth) * rms(b)
    return int(((a - b).abs() > bound).sum())


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
        assert (r.rtol, r.atol) == (2.0**-7, 1e-5) and SPREAD == 6
        assert r.spread == pytest.approx(spread_at("bfloat16", depth[r.name]), rel=1e-12)
        assert r.max_abs <= r.atol + r.rtol * r.max_abs / max(r.max_rel, 1e-30) + r.spread * r.scale
    assert sum(r.max_abs > 0 for r in d) > len(d.rows) // 2  # rounding is real
    # the bound is tight: at the worst output it is at most ~4 times the error seen
    assert max(r.max_abs / (r.spread * r.scale) for r in d if r.scale > 0) > 0.2
    text = d.table()
    body = [line for line in text.splitlines() if "float32 / bfloat16" in line]
    limits = [f"ok, within bfloat16 tolerance (changes below {percent(r.spread)} of scale unseen)" for r in d]
    assert len(body) == len(d.rows) and all(line.endswith(end) for line, end in zip(body, limits))
    deepest = max(d.rows, key=lambda r: r.spread)
    assert text.splitlines()[-2:] == [
        f"no divergence: every compared output is within tolerance ({len(d.rows)} within bfloat16 tolerance)",
        f"changes below {percent(min(r.spread for r in d))} to {percent(deepest.spread)} (at "
        f"{repr(deepest.name) if deepest.name else '(model)'}) of an output's scale cannot be told from bfloat16 "
        "rounding here"]
    assert (f"{len(d.rows)} of them computed in bfloat16 follow bfloat16 tolerance: |a - b| <= atol + eps * |b| "
            "+ spread * scale (eps 7.8e-3, atol 1e-5, spread 4.7e-2 x sqrt(depth), scale: the output's root "
            "mean square, masked values left out)") in text
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
@pytest.mark.parametrize("change", ["layer by 25%", "one weight"])
def test_a_real_change_is_still_the_first_divergence_under_bfloat16(k, change):
    a = ten_linear()
    b = copy.deepcopy(a)
    with torch.no_grad():
        if change == "layer by 25%":
            b[k].weight.mul_(1.25)
            b[k].bias.mul_(1.25)
        else:
            b[k].weight[2, 4] += 0.5
    torch.manual_seed(1)
    x = torch.randn(3, 6)
    d = diff(a, b, x, b=BF16)
    assert d.first is not None and d.first.name == str(k) and d.first.tolerance == "bfloat16"
    assert all(r.status == "ok" and r.tolerance == "bfloat16" for r in d.rows[:k])
    # the bound by hand: |a - b| <= 1e-5 + eps |b| + 6 eps sqrt(k + 1) rms(b), element by element
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out_b = b[: k + 1](x).double()
    with torch.no_grad():
        out_a = a[: k + 1](x).double()
    assert d.first.mismatched == beyond(out_a, out_b, "bfloat16", k + 1) > 0
    assert d.first.scale == pytest.approx(rms(out_b), rel=1e-6)  # summed in float32
    assert f"first divergence: {k} (call 0): " in d.table()
    assert (f"beyond bfloat16 tolerance ({percent(spread_at('bfloat16', k + 1))} of scale "
            f"{rms(out_b):.3g} here)") in d.table()
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
    a = torch.tensor([10.1, 0.3, -3.0, 0.0, math.nan, 5.6]).to(torch.bfloat16)
    d = diff(Out(a), Out(b), torch.zeros(1))
    (row,) = d.rows
    assert (row.tolerance, row.rtol, row.atol) == ("bfloat16", 2**-7, 1e-5)  # one leaf: depth 1
    scale = math.sqrt((100 + 1e-4 + 9 + 25) / 5)  # over the finite places, zero included
    assert row.scale == pytest.approx(scale) and row.spread == 6 * 2**-7
    gap = (a.double() - b.double()).abs()
    bound = 1e-5 + 2**-7 * b.abs() + 6 * 2**-7 * scale
    over = gap[[0, 1, 2, 3, 5]] > bound[[0, 1, 2, 3, 5]]
    assert over.tolist() == [False, True, False, False, True]  # 0.01 -> 0.3, and 5.0 -> 5.59375
    assert row.mismatched == 2 and row.nan == 1 and row.status == "differs"
    # an infinity in one run only is beyond any bound
    (row,) = diff(Out(torch.tensor([1.0, math.inf]).half()), Out(torch.tensor([1.0, 2.0])), torch.zeros(1)).rows
    assert row.tolerance == "float16" and row.mismatched == 1


def test_a_masked_logit_does_not_set_the_scale():
    """A -1e9 (or finfo.min) mask must not hide a real change: every logit tripled is found."""

    class Head(nn.Module):
        def __init__(self, bug: bool, fill: float | str) -> None:
            super().__init__()
            self.fc, self.bug, self.fill = nn.Linear(8, 5), bug, fill

        def forward(self, x):
            y = self.fc(x) * (3 if self.bug else 1)
            fill = torch.finfo(y.dtype).min if self.fill == "min" else self.fill  # as transformers masks
            return y.masked_fill(torch.arange(5) == 4, fill)

    for fill in (-1e9, "min"):
        torch.manual_seed(0)
        a = nn.Sequential(Head(False, fill))
        b = nn.Sequential(Head(True, fill))
        b.load_state_dict(a.state_dict())
        x = torch.randn(2, 8)
        d = diff(a, b, x, b=BF16)
        assert d["0.fc"][0].status == "ok"
        row = d.first
        assert (row.name, row.status, row.mismatched) == ("0", "differs", 8)  # the 8 logits not masked
        with torch.no_grad():
            logits = a[0].fc(x)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits_b = b[0](x)
        assert row.scale == pytest.approx(rms(logits_b[:, :4]), rel=1e-6)  # the masked ones left out
        assert row.scale < 10 * logits.abs().max().item()
        # the same model against itself under bfloat16 with the mask: within tolerance
        assert diff(a, a, x, b=BF16).first is None


# --- which outputs follow a low precision -----------------------------------------------------------------------
def test_float16_model_against_float32_uses_float16_tolerance():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    a, b = Cast(net, torch.float32), Cast(copy.deepcopy(net).half(), torch.float16)
    x = torch.randn(4, 16)
    d = diff(a, b, x)
    assert d.first is None
    for r in d:
        assert (r.dtype_a, r.dtype_b, r.tolerance, r.rtol) == ("float32", "float16", "float16", 2**-10)
        assert r.spread == pytest.approx(spread_at("float16", depths(a)[r.name]), rel=1e-12)
    assert d["net.4"][0].spread == pytest.approx(6 * 2**-10 * math.sqrt(5))
    assert "within float16 tolerance" in d.table()
    assert "(eps 9.8e-4, atol 1e-5, spread 5.9e-3 x sqrt(depth)" in d.table()
    # float16 is stricter than bfloat16: the same model in bfloat16 is beyond float16's bound
    c = Cast(copy.deepcopy(net).to(torch.bfloat16), torch.bfloat16)
    assert max(r.max_abs / (spread_at("float16", depths(a)[r.name]) * r.scale) for r in diff(a, c, x)) > 1


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


# --- low precision is followed from the call where a run first computed in it, and sticks -----------------
class HalfBody(nn.Module):
    """A body that runs in bfloat16 (its weights cast, no autocast), then a float32 head on ``h.float()``."""

    def __init__(self, low: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.body, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.low = low
        if low:
            self.body.to(torch.bfloat16)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = self.body(h.to(torch.bfloat16) if self.low else h)
        return self.head(h.float())


def test_outputs_after_a_low_precision_output_cast_back_keep_its_tolerance():
    torch.manual_seed(1)
    x = torch.randn(4, 6)
    d = diff(HalfBody(False), HalfBody(True), x)
    assert d.first is None
    assert [(r.name, r.dtype_b, r.tolerance) for r in d] == [
        ("stem", "float32", ""), ("body", "bfloat16", "bfloat16"), ("head", "float32", "bfloat16"),
        ("", "float32", "bfloat16")]
    head = d["head"][0]
    assert head.spread == pytest.approx(spread_at("bfloat16", 3)) and head.rtol == 2**-7
    # the head's float32 output carries the body's bfloat16 error: beyond float32's tolerance, within bfloat16's
    with torch.no_grad():
        want = HalfBody(False)(x).double()
        got = HalfBody(True)(x).double()
    assert ((want - got).abs() > ATOL + RTOL * got.abs()).any()
    assert beyond(want, got, "bfloat16", 3) == 0
    # and either way round (the low-precision run as A)
    assert [r.tolerance for r in diff(HalfBody(True), HalfBody(False), x)] == ["", "bfloat16", "bfloat16", "bfloat16"]


class LateAutocast(nn.Module):
    """float32 stem and body, then only the head under bfloat16 autocast."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.body, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.body(torch.relu(self.stem(x)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.head(h).float()


@pytest.mark.parametrize("buggy", ["a", "b"])
def test_a_float32_bug_before_a_runs_autocast_region_is_judged_by_float32(buggy):
    good, bad = LateAutocast().eval(), LateAutocast().eval()
    with torch.no_grad():
        bad.stem.weight[0] += 0.002  # small, but far beyond float32 rounding
    torch.manual_seed(2)
    x = torch.randn(4, 16)
    a, b = (bad, good) if buggy == "a" else (good, bad)
    d = diff(a, b, x)
    assert [(r.name, r.tolerance) for r in d] == [("stem", ""), ("body", ""), ("head", "bfloat16"), ("", "bfloat16")]
    assert (d.first.name, d.first.rtol, d.first.atol) == ("stem", RTOL, ATOL)
    with torch.no_grad():
        gap = (a.stem(x) - b.stem(x)).abs()
    assert d.first.mismatched == int((gap > ATOL + RTOL * b.stem(x).abs()).sum()) > 0
    assert no_hooks(a) and no_hooks(b)


# --- what the bound lets pass is stated ------------------------------------------------------------------------
@pytest.mark.slow
def test_resnet18_fc_change_below_the_detection_limit_is_stated_and_a_larger_one_found():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(1, 3, 64, 64)
    depth = depths(m)["fc"]
    assert depth == 52 and percent(spread_at("bfloat16", 52)) == "34%"
    for factor in (1.1, 1.5):
        m2 = copy.deepcopy(m)
        with torch.no_grad():
            m2.fc.weight.mul_(factor)
        d = diff(m, m2, x, b=BF16)
        fc = d["fc"][0]
        with torch.no_grad():
            want = m(x).double()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = m2(x).double()
        change = (want - got).abs().max().item() / rms(got)
        assert fc.scale == pytest.approx(rms(got), rel=1e-6)
        if factor == 1.1:  # 18% of the logits' scale: below the 34% that bfloat16 rounding may reach here
            assert 0.1 < change < fc.spread and d.first is None and fc.status == "ok"
            line = next(line for line in d.table().splitlines() if line.startswith("fc "))
            assert line.endswith("ok, within bfloat16 tolerance (changes below 34% of scale unseen)")
            assert d.table().splitlines()[-1] == (
                "changes below 4.7% to 34% (at 'fc') of an output's scale cannot be told from bfloat16 rounding here")
        else:  # 88%: found where it was made
            assert change > fc.spread and d.first is fc
            assert fc.mismatched == beyond(want, got, "bfloat16", depth) > 0


# --- the user's one number, and the one filled in ---------------------------------------------------------------
@pytest.mark.parametrize("given, words", [
    (dict(rtol=1e-2), "(rtol given; atol not given: torch.testing's float32 default 1e-05 used)"),
    (dict(atol=1e-2), "(atol given; rtol not given: torch.testing's float32 default 1.3e-06 used)"),
    (dict(rtol=1e-2, atol=1e-2), ""),
    (dict(), ""),
])
def test_the_table_says_which_tolerance_was_filled_in(given, words):
    net = ten_linear()
    d = diff(net, net, torch.randn(3, 6), b=BF16, **given)
    line = d.table().splitlines()[2]
    assert line == (f"{len(d.rows)} outputs compared; tolerance |a - b| <= {d.atol:g} + {d.rtol:g} * |b|"
                    + (f" {words}" if words else ""))
    assert d.filled == words.strip("()")


def test_a_periodic_mask_in_a_large_output_does_not_set_the_scale():
    """Beyond 4096 elements the median is taken over a sample: a mask every 5th column (or half of
    the elements) must not line up with it."""
    torch.manual_seed(0)
    b = torch.randn(200, 50)
    for masked in (torch.arange(50) % 5 == 0, torch.arange(50) < 25):
        ref = b.masked_fill(masked, -1e9)
        same = ref.to(torch.bfloat16)
        (row,) = diff(Out(same), Out(ref), torch.zeros(1)).rows
        kept = b[:, ~masked]
        assert row.status == "ok" and row.scale == pytest.approx(rms(kept), rel=1e-6)
        off = (b * 1.3).masked_fill(masked, -1e9).to(torch.bfloat16)  # a 30% change where not masked
        (row,) = diff(Out(off), Out(ref), torch.zeros(1)).rows
        bound = 1e-5 + 2**-7 * ref.double().abs() + 6 * 2**-7 * rms(kept)  # the scale without the mask
        assert row.status == "differs" and row.mismatched == int(((off.double() - ref).abs() > bound).sum()) > 0
