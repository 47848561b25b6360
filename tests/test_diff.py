import copy
import json
import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from conftest import Net, Structured, no_hooks
from torch import nn

from hookscope import HookscopeError, MutationError, RecordError
from hookscope.errors import ForwardError
from hookscope.analysis.diff import ATOL, RTOL, diff, settings
from hookscope.cli import main
from hookscope.zoo import TinyResNet


def ten_linear() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(10)])


class Twice(nn.Module):
    """``lin`` is called twice, with ``mid`` between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.mid = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.mid(self.lin(x)))


# --- the first divergence -----------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 4, 9])
def test_single_perturbed_weight_in_layer_k_is_the_first_divergence(k):
    a = ten_linear()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[k].weight[2, 4] += 0.5
    x = torch.randn(3, 6)
    d = diff(a, b, x)
    assert [r.name for r in d.rows] == [str(i) for i in range(10)] + [""]
    assert d.first is not None and d.first.name == str(k)
    for r in d.rows[:k]:
        assert r.max_abs == 0 and r.max_rel == 0 and r.cosine == 1 and r.status == "ok"
    # by hand: only output column 2 moves, by 0.5 * (the input's column 4)
    with torch.no_grad():
        h = a[:k](x) if k else x
    row = d[str(k)][0]
    assert math.isclose(row.max_abs, 0.5 * h[:, 4].abs().max().item(), rel_tol=1e-5)
    assert row.mismatched == 3 and row.numel == 18 and row.status == "differs"
    assert all(r.diverges for r in d.rows[k:])
    assert d.unmatched.a_only == () and d.unmatched.b_only == ()
    assert no_hooks(a) and no_hooks(b)


def test_identical_models_give_all_zero_errors():
    a = ten_linear()
    d = diff(a, copy.deepcopy(a), torch.randn(4, 6))
    assert d.first is None and len(d) == 11
    assert all(r.max_abs == 0 and r.max_rel == 0 and r.cosine == 1 and r.mismatched == 0 for r in d)
    assert "no divergence" in d.table()
    assert no_hooks(a)


def test_relative_error_and_cosine_worked_out_by_hand():
    a = nn.Sequential(nn.Linear(2, 2))
    with torch.no_grad():
        a[0].weight.copy_(torch.eye(2))
        a[0].bias.zero_()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[0].bias.copy_(torch.tensor([1.0, 0.0]))
    d = diff(a, b, torch.tensor([[1.0, 2.0]]))
    row = d["0"][0]
    # a = [1, 2], b = [2, 2]: max|a-b| = 1, max|b| = 2, cos = 6 / (sqrt(5) sqrt(8))
    assert row.max_abs == 1 and row.max_rel == 0.5
    assert math.isclose(row.cosine, 6 / math.sqrt(40), rel_tol=1e-7)
    assert row.mismatched == 1 and row.shape_a == (1, 2) and row.dtype_b == "float32"
    expected = "\n".join([
        "run A: Sequential, as given",
        "run B: Sequential, as given",
        "2 outputs compared; tolerance |a - b| <= 1e-05 + 1.3e-06 * |b|",
        "",
        "layer    shape  dtype     max abs   max rel    cosine  status",
        "-------  -----  -------  --------  --------  --------  -------------",
        "0        1x2    float32  1.00e+00  5.00e-01  0.948683  DIFFERS (1/2)",
        "(model)  1x2    float32  1.00e+00  5.00e-01  0.948683  DIFFERS (1/2)",
        "",
        "first divergence: 0 (call 0): 1 of 2 elements beyond tolerance, max abs 1.000e+00",
    ])
    assert d.table() == expected


def test_zero_reference_gives_infinite_relative_error_and_json_says_so():
    a = nn.Sequential(nn.Linear(2, 2))
    b = copy.deepcopy(a)
    with torch.no_grad():
        a[0].weight.zero_(), a[0].bias.fill_(1.0)
        b[0].weight.zero_(), b[0].bias.zero_()
    d = diff(a, b, torch.ones(1, 2))
    row = d["0"][0]
    assert row.max_abs == 1 and row.max_rel == math.inf and row.cosine == 0
    data = json.loads(d.to_json())
    assert data["first"]["name"] == "0" and data["first"]["max_rel"] == "inf"


class Const(nn.Module):
    """Outputs fixed values, whatever the input."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.register_buffer("v", torch.tensor(values))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.v.clone()


@pytest.mark.parametrize(
    ("b", "max_abs", "mismatched"),
    [
        ([1.0, math.inf, -math.inf, 2.0], 0.0, 0),  # equal infinities agree
        ([1.0, 5.0, -math.inf, 2.0], math.inf, 1),  # an infinity against a finite value does not
        ([1.0, math.inf, -math.inf, 2.5], 0.5, 1),
    ],
)
def test_infinities_follow_isclose(b, max_abs, mismatched):
    d = diff(Const([1.0, math.inf, -math.inf, 2.0]), Const(b), torch.zeros(1))
    (row,) = d.rows
    assert row.max_abs == max_abs and row.mismatched == mismatched and row.diverges == (mismatched > 0)


def test_nan_agrees_only_at_the_same_places():
    # issue 9: NaN at the same places in both runs is equal (counted), elsewhere a mismatch
    d = diff(Const([1.0, math.nan]), Const([1.0, math.nan]), torch.zeros(1))
    (row,) = d.rows
    assert row.max_abs == 0 and row.mismatched == 0 and row.nan == 1 and d.first is None
    d = diff(Const([1.0, math.nan]), Const([math.nan, 1.0]), torch.zeros(1))
    (row,) = d.rows
    assert row.mismatched == 2 and (row.nan_a_only, row.nan_b_only) == (1, 1) and d.first is row
    assert json.loads(d.to_json())["first"]["max_abs"] == 0.0


# --- one model under two settings ---------------------------------------------------------------
def test_float32_against_bfloat16_autocast():
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    d = diff(net, net, x, b=settings(autocast=torch.bfloat16))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = net[0](x)
    with torch.no_grad():
        exact = net[0](x)
    row = d["0"][0]
    assert (row.dtype_a, row.dtype_b) == ("float32", "bfloat16")
    assert row.max_abs == pytest.approx((ref.double() - exact.double()).abs().max().item(), rel=1e-9)
    for name in ("0", "2"):
        r = d[name][0]
        assert 0 < r.max_rel < 0.05 and r.cosine > 0.999
    # bfloat16's own tolerance by default (see test_diff_dtypes.py); float32's when asked for
    assert d.first is None and {r.tolerance for r in d} == {"bfloat16"}
    assert diff(net, net, x, b=settings(autocast=torch.bfloat16), rtol=RTOL, atol=ATOL).first.name == "0"
    assert "autocast bfloat16" in d.run_b and no_hooks(net)


class BnDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.bn(self.lin(x))))


def test_eval_against_train_restores_flags_buffers_and_rng():
    net = BnDrop().eval()
    x = torch.randn(5, 4)
    rng = torch.get_rng_state()
    d = diff(net, net, x, b=settings(train=True))
    assert torch.equal(torch.get_rng_state(), rng)
    assert not any(m.training for m in net.modules())
    assert torch.equal(net.bn.running_mean, torch.zeros(8)) and int(net.bn.num_batches_tracked) == 0
    assert d["lin"][0].max_abs == 0 and d.first.name == "bn"
    with torch.no_grad():  # by hand: running statistics (0, 1) against the batch's own
        h = net.lin(x)
        eval_out = h / math.sqrt(1 + 1e-5)
        train_out = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-5)
    assert d["bn"][0].max_abs == pytest.approx((eval_out - train_out).abs().max().item(), rel=1e-4)
    assert no_hooks(net)


def test_dropout_in_both_runs_draws_the_same_masks_unless_seed_is_none():
    net = BnDrop()
    x = torch.randn(5, 4)
    same = diff(net, net, x, a=settings(train=True), b=settings(train=True))
    assert same.first is None and net.training
    other = diff(net, net, x, a=settings(train=True), b=settings(train=True), seed=None)
    assert other.first is not None and other.first.name == "drop"
    assert no_hooks(net)


def test_seed_none_draws_on_from_the_callers_stream():
    # both runs draw after each other from the caller's generator, which stays advanced
    net = nn.Sequential(nn.Dropout(0.5))
    x = torch.ones(3, 8)
    torch.manual_seed(5)
    diff(net, net, x, a=settings(train=True), b=settings(train=True), seed=None)
    after = torch.rand(4)
    torch.manual_seed(5)
    with torch.no_grad():
        net.train()(x), net(x)
    net.eval()
    assert torch.equal(after, torch.rand(4))


def test_an_unknown_keyword_is_a_one_line_error():
    net = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="unexpected keyword argument 'layer'") as info:
        diff(net, net, torch.ones(1, 2), layer="0")
    assert "\n" not in str(info.value)


def test_a_plain_context_factory_is_a_setting():
    net = nn.Sequential(nn.Linear(4, 4))
    d = diff(net, net, torch.randn(2, 4), b=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert d["0"][0].dtype_b == "bfloat16" and d["0"][0].tolerance == "bfloat16" and d.first is None


@pytest.mark.slow
def test_eager_against_torch_compile():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    d = diff(net, torch.compile(net), x, atol=1e-5)
    assert [r.name for r in d.rows] == ["0", "1", "2", ""]
    assert all(r.max_abs < 1e-5 for r in d) and d.first is None
    assert "(compiled)" in d.run_b and no_hooks(net)


# --- matching names and calls -------------------------------------------------------------------
def test_unmatched_names_are_listed():
    torch.manual_seed(0)
    a = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), b=nn.ReLU(), c=nn.Linear(3, 3)))
    b = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), b=nn.ReLU(), d=nn.Linear(3, 3)))
    b.a.load_state_dict(a.a.state_dict())
    d = diff(a, b, torch.randn(2, 3))
    assert d.unmatched.a_only == ("c",) and d.unmatched.b_only == ("d",)
    assert [r.name for r in d.rows] == ["a", "b", ""]
    assert d["a"][0].max_abs == 0
    assert "only in A (1, not compared): c" in d.table() and "only in B (1, not compared): d" in d.table()
    assert no_hooks(a) and no_hooks(b)


def test_selected_layers_only_and_names_in_one_model():
    torch.manual_seed(0)
    a = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), r=nn.ReLU()))
    b = nn.Sequential(OrderedDict(a=nn.Linear(3, 3), r=nn.ReLU(), extra=nn.Linear(3, 3)))
    d = diff(a, b, torch.randn(2, 3), layers=nn.Linear)
    assert [r.name for r in d.rows] == ["a"] and d.unmatched.b_only == ("extra",)
    with pytest.raises(HookscopeError, match="'nope'"):
        diff(a, b, torch.randn(2, 3), layers="nope")
    assert no_hooks(a) and no_hooks(b)


def test_no_common_layer_name_is_an_error():
    with pytest.raises(HookscopeError, match=r"share no layer name.*'l1', 'l2'.*'0', '1'"):
        diff(Net(), nn.Sequential(nn.Linear(2, 5), nn.Linear(5, 10)), torch.randn(1, 2))


def test_models_without_children_compare_their_outputs():
    a = nn.Linear(3, 2)
    d = diff(a, copy.deepcopy(a), torch.randn(2, 3))
    assert [r.name for r in d.rows] == [""] and d.first is None


def test_a_module_called_twice_is_compared_call_by_call():
    a = Twice()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.mid.bias += 1.0
    d = diff(a, b, torch.randn(4, 3))
    assert [(r.name, r.call) for r in d.rows] == [("lin", 0), ("mid", 0), ("lin", 1), ("", 0)]
    first, second = d["lin"]
    assert first.max_abs == 0 and second.diverges
    # by hand: lin's second input moves by (1, 1, 1), so its output by lin.weight.sum(1)
    assert second.max_abs == pytest.approx(a.lin.weight.sum(1).abs().max().item(), rel=1e-5)
    assert d.first.name == "mid"
    assert "lin#1" in d.table()
    assert no_hooks(a) and no_hooks(b)


def test_nested_outputs_are_compared_tensor_by_tensor():
    a = Structured("dict")
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.lin.bias += 0.25
    d = diff(a, b, torch.randn(2, 3))
    y, twice = d[""]  # {"y": y, "twice": [y * 2, None]}
    assert (y.part, twice.part) == (0, 1)
    assert y.max_abs == pytest.approx(0.25, abs=1e-6) and twice.max_abs == pytest.approx(0.5, abs=1e-6)
    assert "(model)[1]" in d.table()
    nt = Structured("namedtuple")  # torch.return_types.max: float values and int64 indices
    d = diff(nt, copy.deepcopy(nt), torch.randn(2, 3))
    assert [(r.part, r.dtype_a) for r in d[""]] == [(0, "float32"), (1, "int64")] and d.first is None
    assert no_hooks(a) and no_hooks(nt)


def test_shape_mismatch_is_reported_as_such():
    a = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    b = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
    d = diff(a, b, torch.randn(2, 3))
    assert d.first.name == "0" and d.first.status == "shape"
    assert (d.first.shape_a, d.first.shape_b) == ((2, 4), (2, 5))
    assert "2x4 / 2x5" in d.table()


def test_in_place_op_on_the_input_does_not_reach_the_other_run():
    class Bump(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.add_(1.0)
            return self.lin(x)

    m = Bump()
    x = torch.zeros(2, 3)
    d = diff(m, m, x)
    assert d.first is None and torch.equal(x, torch.zeros(2, 3))


def test_a_failing_forward_names_the_module_and_shapes():
    # issue 10: a ForwardError (a HookscopeError) in the one wording every analysis uses
    net = Net()
    with pytest.raises(ForwardError, match=r"^run A: the forward pass failed in 'l1' \(Linear\), "
                                           r"which received input\[0\] 3x4 float32, before any other") as info:
        diff(net, net, torch.randn(3, 4))
    assert "\n" not in str(info.value) and isinstance(info.value.__cause__, RuntimeError)
    assert no_hooks(net) and net.training


def test_a_failure_in_run_b_or_in_the_model_own_code_is_named():
    class Flat(nn.Module):  # fails in its own forward, after its child ran
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x).view(3, 7)

    with pytest.raises(ForwardError, match=r"^run A: .* failed in Flat's own forward, which received "
                                           r"input\[0\] 2x4 float32, after 'a' had run: RuntimeError"):
        diff(Flat(), Flat(), torch.randn(2, 4))
    # the root not selected: still named, with the model's own inputs
    with pytest.raises(ForwardError, match=r"failed in Flat's own forward, which received input\[0\] 2x4"):
        diff(Flat(), Flat(), torch.randn(2, 4), layers="a")
    wide = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    narrow = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 4))
    with pytest.raises(ForwardError, match=r"^run B: the forward pass failed in '1' \(Linear\), which "
                                           r"received input\[0\] 2x4 float32, after '0' had run"):
        diff(wide, narrow, torch.randn(2, 4))
    assert no_hooks(wide) and no_hooks(narrow)


def test_lookups_and_membership_agree():
    # issue 10: "0" in d was False while d["0"] worked; a miss is a RecordError (a KeyError)
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    d = diff(net, net, torch.ones(1, 2))
    assert "0" in d and "" in d and "1" in d and d["0"][0].name == "0"
    assert "2" not in d and 0 not in d and d.rows[0] not in d
    with pytest.raises(RecordError, match=r"no layer '2' in this result") as info:
        d["2"]
    assert isinstance(info.value, KeyError) and isinstance(info.value, HookscopeError)
    with pytest.raises(KeyError, match="Did you mean"):
        diff(TinyResNet(), TinyResNet(), torch.randn(1, 3, 32, 32), layers="stem.*")["stem.00"]


def test_result_protocol():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    d = diff(net, net, torch.ones(1, 2), b=settings(autocast=torch.bfloat16))
    assert str(d) == d.table() and d.rows[0].name == "0"
    assert json.loads(d.to_json()) == d.to_dict() == json.loads(d.to_json(indent=2))
    assert "\n" not in d.to_json() and "\n" in d.to_json(2)
    assert d.to_dict()["rows"][0]["dtype_b"] == "bfloat16"


def test_bad_arguments():
    net = Net()
    with pytest.raises(HookscopeError, match="not an nn.Module"):
        diff(net, torch.randn(1, 2))
    with pytest.raises(HookscopeError, match="inputs"):
        diff(net, net)
    with pytest.raises(HookscopeError, match="not a run setting"):
        diff(net, net, torch.randn(1, 2), b="train")
    with pytest.raises(HookscopeError, match="floating-point"):
        settings(autocast=torch.int8)


# --- command line -------------------------------------------------------------------------------
def test_cli_same_model_twice_agrees(capsys):
    assert main(["diff", "tiny", "tiny"]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_cli_settings_and_seeds(capsys):
    assert main(["diff", "tiny", "--b-train", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["first"]["name"] == "stem.1" and data["rows"][0]["max_abs"] == 0  # the BatchNorm
    assert main(["diff", "tiny", "tiny", "--b-seed", "1", "--only-diverging"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: stem.0 (call 0)" in out
    assert main(["diff", "tiny", "--b-autocast", "bfloat16", "--layers", "stem.0", "fc"]) == 0
    out = capsys.readouterr().out
    assert "within bfloat16 tolerance" in out and "layer1" not in out
    assert main(["diff", "tiny", "--b-autocast", "bfloat16", "--layers", "stem.0", "fc", "--rtol", "1.3e-6"]) == 1


def test_cli_bad_layer_is_one_line_and_status_2(hookscope_process):
    res = hookscope_process.run("diff", "tiny", "--layers", "stem.9", cwd=Path.cwd())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "stem.9" in lines[0]


def test_tiny_resnet_against_itself_covers_every_module():
    m = TinyResNet()
    d = diff(m, m, torch.randn(2, 3, 32, 32))
    called = {n for n, _ in m.named_modules()}
    assert {r.name for r in d} == called and d.first is None
    # relu modules are called twice per block (and once in the stem): compared per call
    assert len(d["layer1.0.relu"]) == 2
    assert no_hooks(m)


# --- the CPU fast path against the general one ----------------------------------------------------
@pytest.mark.parametrize("spread", [0.0, 0.05])
@pytest.mark.parametrize("case", ["noise", "bfloat16", "near", "layouts", "float64", "int", "empty"])
def test_cpu_fast_comparison_equals_the_general_one(case, spread):
    from hookscope.analysis.diff._compare import _device_stats, _host_stats
    from hookscope._memory import Scratch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, 5, 6, generator=g)
    b = {"noise": a + 0.1 * torch.randn(a.shape, generator=g),
         "bfloat16": a.to(torch.bfloat16),
         "near": a + 1e-6 * torch.randn(a.shape, generator=g),
         "layouts": (a + 0.01).contiguous(memory_format=torch.channels_last),
         "float64": a.double() + 1e-3,
         "int": a.round().int(),
         "empty": a[:0]}[case]
    a = a[:0] if case == "empty" else a
    host = _host_stats(a, b, 1e-3, 1e-4, Scratch(), spread=spread)
    want = _device_stats(a, b, 1e-3, 1e-4, spread=spread).tolist()
    if case == "empty":
        assert host is None
        return
    assert host == pytest.approx(want, rel=1e-5, abs=1e-7, nan_ok=True)  # the scale: NaN without spread
    if case == "near":
        assert host[5] == a.numel()  # all within tolerance
    if case == "noise":
        assert 0 < host[5] < a.numel()


# --- run B is compared in its hooks: it must behave as run A, and its errors stay its own --------
class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(64, 64)
        self.att = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x):
        h = self.inp(x)  # over 1 MiB: run A's capture hands the attention a guarded alias
        return self.att(h, h, h, need_weights=False)[0]


def test_both_runs_take_the_same_code_paths():
    # a plain tensor would send run B down the native fused attention: a 4e-8 "divergence"
    m = Attention().eval()
    d = diff(m, m, torch.randn(4, 1200, 64))
    assert d.first is None and all(r.max_abs == 0 for r in d.rows)
    assert no_hooks(m)


def test_an_error_of_the_comparison_is_raised_as_itself():
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Linear(64, 8)).eval()
    with pytest.raises(MutationError, match="copy='auto'"):
        diff(m, m, torch.randn(4096, 64), copy="never")
    assert no_hooks(m)


def test_the_comparison_is_not_changed_by_run_b_context():
    rounded = (torch.nn.functional.linear, torch.tanh, torch.Tensor.tanh, torch.sub, torch.Tensor.sub, torch.dot)

    class Rounding(torch.overrides.TorchFunctionMode):
        """Rounds linear, tanh, sub and dot through bfloat16 (sub and dot are what a comparison uses)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in rounded and isinstance(out, torch.Tensor):
                out = out.to(torch.bfloat16).to(out.dtype)
            return out

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 32), nn.Tanh()).eval()
    x = torch.randn(64, 32)
    d = diff(m, m, x, b=Rounding)
    with torch.no_grad():
        a = m[0](x)
        with Rounding():
            b = m[0](x)
    want = (a.double() - b.double()).abs().max().item()  # the comparison itself, outside the mode
    assert want > 0 and d["0"][0].max_abs == pytest.approx(want, rel=1e-6)


class PositionalEncoding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pe", torch.randn(1, 4096, 128))  # 2 MiB

    def forward(self, x):
        return self.pe[:, : x.shape[1]]  # a view of the buffer is the output


class WithPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = PositionalEncoding()
        self.head = nn.Linear(128, 4)

    def forward(self, x):
        return self.head(x + self.pos(x))


def test_a_module_returning_a_slice_of_a_large_buffer():
    # restoring the buffers after run A must not write into them when nothing changed: that
    # would bump the version of run A's record of `pos`, a view of the buffer
    m = WithPositions().eval()
    d = diff(m, m, torch.randn(2, 4096, 128))
    assert d.first is None and d["pos"][0].max_abs == 0 and no_hooks(m)


class SlicedAttention(Attention):
    def forward(self, x):
        h = self.inp(x)[:, :1100]  # a view of the guarded alias must stay guarded in both runs
        return self.att(h, h, h, need_weights=False)[0]


def test_views_of_large_outputs_take_the_same_code_paths_in_both_runs():
    m = SlicedAttention().eval()
    d = diff(m, m, torch.randn(4, 1200, 64), rtol=0, atol=0)
    assert d.first is None and all(r.max_abs == 0 for r in d.rows)


class MemoryBank(nn.Module):
    """Writes its buffer in place and returns it (a KV cache, a memory bank)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mem", torch.zeros(4096, 128))  # 2 MiB

    def forward(self, x):
        self.mem.mul_(0.9).add_(0.1 * x)
        return self.mem


def test_an_output_that_is_a_buffer_written_in_place():
    m = nn.Sequential(MemoryBank(), nn.Linear(128, 4)).eval()
    d = diff(m, m, torch.randn(4096, 128))
    assert d.first is None and d["0"][0].max_abs == 0
    assert m[0].mem.abs().max().item() == 0  # put back afterwards


class Reader(nn.Module):
    """Returns a buffer of another module that it reaches through a plain dict."""

    def __init__(self, source: dict) -> None:
        super().__init__()
        self.source = source

    def forward(self, x):
        return self.source["mem"]


class SharedBank(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mem", torch.zeros(4096, 128))  # 2 MiB
        self.read = Reader({})
        self.head = nn.Linear(128, 4)

    def forward(self, x):
        self.mem.mul_(0.9).add_(0.1 * x)
        self.read.source["mem"] = self.mem
        return self.head(self.read(x))


def test_an_output_that_is_another_modules_buffer():
    # run A's record of `read` is the parent's buffer itself: putting the buffer back, and run B,
    # write there, so the record gets its own copy before run A's capture closes
    m = SharedBank().eval()
    d = diff(m, m, torch.randn(4096, 128))
    assert d.first is None and d["read"][0].max_abs == 0
    assert m.mem.abs().max().item() == 0 and no_hooks(m)


class Picky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.dim() != 2:
            raise ValueError("2-D only")
        return self.lin(x)


class TriesFirst(nn.Module):
    """Tries one layout, catches the error, falls back: a call of `p` raises inside the run."""

    def __init__(self) -> None:
        super().__init__()
        self.p = Picky()

    def forward(self, x):
        try:
            return self.p(x.unsqueeze(0))
        except ValueError:
            return self.p(x)


def test_a_call_that_raises_and_is_caught_by_the_model():
    m = TriesFirst().eval()
    d = diff(m, m, torch.randn(4, 8))
    assert d.first is None and [r.name for r in d.rows] == ["p.lin", "p", ""]


def test_rng_helper_shared_with_summary():
    from hookscope.core.state import kept_rng, rng_devices

    if not torch.cuda.is_initialized():  # then every CUDA generator is kept too
        assert rng_devices([torch.zeros(1), torch.zeros(1, device="meta")]) == ([], None)
    state = torch.get_rng_state()
    with kept_rng(([], None), seed=3):
        drawn = torch.rand(2)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(2), drawn)


# --- the vocabulary: inputs is one argument, to= keeps run A's records, device= moves the inputs ---------
def test_diff_takes_several_inputs_as_one_tuple_and_refuses_them_one_by_one():
    torch.manual_seed(0)
    bil = nn.Bilinear(3, 4, 2)
    a, b = torch.randn(5, 3), torch.randn(5, 4)
    d = diff(bil, bil, (a, b))
    assert [r.max_abs for r in d[""]] == [0.0]
    with pytest.raises(TypeError, match=r"diff\(\) takes the model's positional inputs as one argument") as e:
        diff(bil, bil, a, b)
    assert isinstance(e.value, HookscopeError) and "\n" not in str(e.value)
    assert no_hooks(bil)


def test_diff_to_keeps_records_and_device_moves_the_inputs_where_the_models_are():
    net = Net().eval()
    x = torch.randn(2, 2)
    base = diff(net, net, x)
    kept = diff(net, net, x, to="cpu", device="cpu")
    assert [(r.name, r.max_abs) for r in kept.rows] == [(r.name, r.max_abs) for r in base.rows]
    with pytest.raises(HookscopeError, match=r"diff\(device='meta'\) moves the inputs .* model_a is on cpu.*to='meta'"):
        diff(net, net, x, device="meta")
    assert no_hooks(net)
