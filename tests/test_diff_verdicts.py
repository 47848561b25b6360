"""diff and gradient_flow "correct by default": verdicts a hostile user cannot fool.

Compiled models that already ran, NaN/Inf placement, argument validation, and odd outputs
(dicts in another key order, None in other places, Python numbers, integers, complex, empty).
"""

import copy
import json
import math
from dataclasses import dataclass

import pytest
import torch
from conftest import no_hooks
from torch import nn

from hookscope import HookscopeError
from hookscope.analysis.diff import diff
from hookscope.analysis.gradflow import gradient_flow
from hookscope.cli import main


class Const(nn.Module):
    """Outputs fixed values, whatever the input; ``fn`` builds the output from them."""

    def __init__(self, values, fn=None) -> None:
        super().__init__()
        self.register_buffer("v", torch.tensor(values))
        self.fn = fn

    def forward(self, x):
        v = self.v.clone()
        return self.fn(v) if self.fn is not None else v


class Counted(nn.Module):
    """A Linear that counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# --- (2) a compiled model that has already run ---------------------------------------------------
@pytest.mark.slow
def test_compiled_model_that_already_ran_is_compared_layer_by_layer():
    net = mlp()
    x = torch.randn(3, 8)
    compiled = torch.compile(net)
    with torch.no_grad():  # the graph diff would use is compiled before diff registers any hook
        before = compiled(x)
    for a, b in ((net, compiled), (compiled, net)):
        d = diff(a, b, x)
        assert [r.name for r in d.rows] == ["0", "1", "2", ""]
        assert [r.status for r in d.rows] == ["ok"] * 4 and d.first is None
        assert all(r.max_abs < 1e-5 and r.numel > 0 for r in d.rows)
        assert d["2"][0].shape_a == d["2"][0].shape_b == (3, 4)
    assert "(compiled)" in diff(net, compiled, x).run_b
    # afterwards the compiled model runs its own code again, hook-free, with the same result
    assert no_hooks(net) and no_hooks(compiled)
    with torch.no_grad():
        assert torch.equal(compiled(x), before)
    # and a real difference is still found in the compiled run
    other = copy.deepcopy(net)
    with torch.no_grad():
        other[2].bias += 1.0
    d = diff(other, compiled, x)
    assert d.first is not None and d.first.name == "2" and d["2"][0].max_abs == pytest.approx(1.0, abs=1e-5)
    assert no_hooks(net) and no_hooks(other)


@pytest.mark.slow
def test_a_compiled_submodule_that_already_ran_is_compared():
    plain = mlp()
    net = mlp()
    net[0].compile()
    x = torch.randn(3, 8)
    with torch.no_grad():
        net(x)
    d = diff(plain, net, x)
    assert [r.name for r in d.rows] == ["0", "1", "2", ""] and d.first is None
    assert all(r.status == "ok" and r.max_abs < 1e-5 for r in d.rows)
    assert "(compiled)" in d.run_b and no_hooks(net)


# --- (9) NaN and Inf are matched by place ---------------------------------------------------------
def test_nan_and_inf_at_the_same_places_are_equal_and_counted():
    values = [1.0, math.nan, math.inf, -math.inf, 2.0, math.nan]
    d = diff(Const(values), Const(values), torch.zeros(1))
    (row,) = d.rows
    assert row.status == "ok" and d.first is None
    assert (row.nan, row.inf, row.nan_a_only, row.nan_b_only, row.mismatched) == (2, 2, 0, 0, 0)
    assert (row.max_abs, row.max_rel, row.cosine) == (0.0, 0.0, 1.0)
    table = d.table()
    assert "ok; 2 NaN and 2 Inf at the same places" in table and "no divergence" in table
    data = json.loads(d.to_json())
    assert data["first"] is None and data["rows"][0]["nan"] == 2 and data["rows"][0]["inf"] == 2


def test_agreeing_non_finite_values_are_left_out_of_the_numbers():
    # the finite parts: a = [3, 4], b = [3, 4.5]; the NaN and the Inf agree
    a = Const([3.0, math.nan, math.inf, 4.0])
    b = Const([3.0, math.nan, math.inf, 4.5])
    (row,) = diff(a, b, torch.zeros(1)).rows
    assert row.max_abs == 0.5 and row.max_rel == pytest.approx(0.5 / 4.5)
    assert row.cosine == pytest.approx((9 + 18) / (5 * math.sqrt(9 + 20.25)), rel=1e-12)
    assert math.isfinite(row.cosine) and row.mismatched == 1 and row.status == "differs"
    assert (row.nan, row.inf) == (1, 1)


def test_nan_in_different_places_differs_and_says_so():
    a = Const([1.0, math.nan, 3.0, 2.0])
    b = Const([1.0, 5.0, math.nan, 2.5])
    d = diff(a, b, torch.zeros(1))
    (row,) = d.rows
    assert row.status == "differs" and d.first is row
    assert (row.nan, row.nan_a_only, row.nan_b_only) == (0, 1, 1)
    assert row.mismatched == 3  # the two NaN places and 2 against 2.5
    assert row.max_abs == 0.5 and math.isfinite(row.max_rel) and math.isfinite(row.cosine)
    assert "NaN in different places (1 in A only, 1 in B only)" in d.table().splitlines()[-1]
    # a NaN against a number with everything else equal is still a divergence
    (row,) = diff(Const([1.0, math.nan]), Const([1.0, 2.0]), torch.zeros(1)).rows
    assert row.status == "differs" and row.mismatched == 1 and (row.nan_a_only, row.nan_b_only) == (1, 0)


def test_an_infinity_against_a_number_or_the_other_sign_differs():
    (row,) = diff(Const([1.0, math.inf]), Const([1.0, -math.inf]), torch.zeros(1)).rows
    assert row.status == "differs" and row.mismatched == 1 and row.max_abs == math.inf and row.inf == 0
    (row,) = diff(Const([1.0, math.inf]), Const([1.0, math.nan]), torch.zeros(1)).rows
    assert row.status == "differs" and row.nan_b_only == 1 and row.inf == 0


def test_complex_and_all_nan_outputs():
    z = [1 + 1j, complex(math.nan, 0.0), complex(0.0, math.inf)]
    (row,) = diff(Const(z), Const(z), torch.zeros(1)).rows
    assert row.status == "ok" and (row.nan, row.inf, row.max_abs) == (1, 1, 0.0)
    (row,) = diff(Const([math.nan] * 3), Const([math.nan] * 3), torch.zeros(1)).rows
    assert row.status == "ok" and row.nan == 3 and (row.max_abs, row.max_rel, row.cosine) == (0.0, 0.0, 1.0)


NAN_MODEL = '''
import math
import torch
from torch import nn


class NanNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) * torch.tensor([math.nan, 1.0, math.inf])
'''


def test_cli_identical_runs_with_nan_are_the_same(tmp_path, capsys):
    path = tmp_path / "nan_model.py"
    path.write_text(NAN_MODEL)
    assert main(["diff", f"{path}:NanNet", "--input", "2x4"]) == 0
    out = capsys.readouterr().out
    assert "no divergence" in out and "2 NaN and 2 Inf at the same places" in out
    assert main(["diff", f"{path}:NanNet", "--input", "2x4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(r for r in data["rows"] if r["name"] == "")
    assert data["first"] is None and (row["nan"], row["inf"], row["max_abs"]) == (2, 2, 0.0)


# --- (15) every argument is checked up front --------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(atol="x"), "atol='x' is not a number"),
        (dict(rtol=[1e-3]), "rtol=[0.001] is not a number"),  # None is the default now
        (dict(rtol=True), "rtol=True is not a number"),
        (dict(atol=-1e-3), "atol=-0.001 is not a finite number >= 0"),
        (dict(rtol=math.nan), "rtol=nan is not a finite number >= 0"),
        (dict(atol=math.inf), "atol=inf is not a finite number >= 0"),
        (dict(seed="x"), "seed='x' is not an int"),
        (dict(seed=1.5), "seed=1.5 is not an int"),
        (dict(no_grad="yes"), "no_grad='yes' is not True or False"),
        (dict(copy="bogus"), "copy='bogus' is not a copy policy"),
        (dict(to="gpu0"), "to='gpu0' is not a torch device"),
        (dict(device="gpu0"), "device='gpu0' is not a torch device"),
        (dict(kwargs=[1]), "kwargs=[1] is not a mapping"),
        (dict(b="train"), "b='train' is not a run setting"),
    ],
)
def test_bad_diff_arguments_fail_before_anything_runs(kwargs, words):
    net = Counted()
    with pytest.raises(HookscopeError) as info:
        diff(net, net, torch.randn(2, 4), **kwargs)
    msg = str(info.value)
    assert words in msg and "\n" not in msg
    assert net.calls == 0 and no_hooks(net)


def test_bad_settings_and_models_fail_before_anything_runs():
    from hookscope.analysis.diff import settings

    with pytest.raises(HookscopeError, match=r"train='yes' is not True, False or None"):
        settings(train="yes")
    with pytest.raises(HookscopeError, match=r"device_type='gpu0' is not a device type"):
        settings(device_type="gpu0")
    assert settings(device_type="cuda:0").device_type == "cuda"
    net = Counted()
    with torch.device("meta"):
        empty = Counted()
    with pytest.raises(HookscopeError, match=r"model_b has tensors on the meta device.*load_state_dict"):
        diff(net, empty, torch.randn(2, 4))
    assert net.calls == 0 and no_hooks(net) and no_hooks(empty)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(vanish="x"), "vanish='x' is not a number"),
        (dict(explode=None), "explode=None is not a number"),
        (dict(explode=True), "explode=True is not a number"),
        (dict(vanish=-1.0), "vanish=-1.0 is not a number >= 0"),
        (dict(vanish=math.nan), "vanish=nan is not a number >= 0"),
        (dict(vanish=1.0, explode=1.0), "vanish=1 must be below explode=1"),
        (dict(vanish=10.0, explode=1.0), "vanish=10 must be below explode=1"),
        (dict(trace=[1, 2]), "trace=list is not a finished hookscope trace"),
    ],
)
def test_bad_gradient_flow_arguments(kwargs, words):
    net = nn.Sequential(nn.Linear(2, 1))
    net(torch.ones(1, 2)).sum().backward()
    with pytest.raises(HookscopeError) as info:
        gradient_flow(net, **kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(HookscopeError, match="model is of type int, not an nn.Module"):
        gradient_flow(3)
    assert gradient_flow(net, explode=math.inf).rows[0].flag == "ok"  # never exploding: allowed


# --- odd outputs ------------------------------------------------------------------------------------
def test_dict_outputs_are_paired_by_key_not_by_order():
    a = Const([1.0, 2.0], lambda v: {"x": v, "y": v * 2})
    b = Const([1.0, 2.0], lambda v: {"y": v * 2, "x": v})
    d = diff(a, b, torch.zeros(1))
    assert [(r.path, r.status, r.max_abs) for r in d.rows] == [("['x']", "ok", 0.0), ("['y']", "ok", 0.0)]
    assert d.first is None


def test_none_in_other_places_is_a_structure_difference():
    a = Const([1.0, 2.0], lambda v: (v, None))
    b = Const([1.0, 2.0], lambda v: (None, v))
    d = diff(a, b, torch.zeros(1))
    (row,) = d.rows
    assert row.status == "structure" and d.first is row
    assert row.note == "output[0] is a tensor in A, None in B"
    assert "structure: output[0] is a tensor in A, None in B" in d.table()
    same = diff(a, copy.deepcopy(a), torch.zeros(1))
    assert [(r.path, r.status) for r in same.rows] == [("[0]", "ok")]


def test_python_numbers_in_an_output_are_compared():
    a = Const([1.0, 2.0], lambda v: (v, 3, 0.5))
    b = Const([1.0, 2.0], lambda v: (v, 4, 0.5))
    d = diff(a, b, torch.zeros(1))
    assert [(r.path, r.dtype_a, r.status, r.max_abs) for r in d.rows] == [
        ("[0]", "float32", "ok", 0.0), ("[1]", "int", "differs", 1.0), ("[2]", "float", "ok", 0.0)]
    assert d.first.path == "[1]"


def test_integers_are_compared_exactly_beyond_2_to_the_53():
    big = 2**53
    a = Const([big + 1, 7], lambda v: v)
    b = Const([big, 7], lambda v: v)
    (row,) = diff(a, b, torch.zeros(1), rtol=0, atol=0).rows
    assert row.status == "differs" and row.mismatched == 1 and row.max_abs == 1.0
    (row,) = diff(a, copy.deepcopy(a), torch.zeros(1), rtol=0, atol=0).rows
    assert row.status == "ok" and row.max_abs == 0.0


def test_bool_and_empty_outputs():
    (row,) = diff(Const([1.0, 2.0, 3.0], lambda v: v > 1), Const([1.0, 2.0, 3.0], lambda v: v > 2),
                  torch.zeros(1)).rows
    assert (row.dtype_a, row.status, row.mismatched, row.max_abs) == ("bool", "differs", 1, 1.0)
    assert row.cosine == pytest.approx(1 / math.sqrt(2))
    (row,) = diff(Const([1.0], lambda v: v[:0]), Const([1.0], lambda v: v[:0]), torch.zeros(1)).rows
    assert (row.status, row.numel, row.max_abs, row.shape_a) == ("ok", 0, 0.0, (0,))


def test_large_float32_values_keep_finite_cosine_and_true_errors():
    # squares of 1e20 overflow float32: the cosine must not become NaN
    (row,) = diff(Const([1e20, 1e20]), Const([1e20, 1.001e20]), torch.zeros(1)).rows
    assert row.cosine == pytest.approx((1 + 1.001) / math.sqrt(2 * (1 + 1.001**2)), rel=1e-9)
    assert row.max_abs == pytest.approx(1e17, rel=1e-3)
    # a gap beyond float32's range is still a finite number
    (row,) = diff(Const([3e38]), Const([-3e38]), torch.zeros(1)).rows
    assert row.max_abs == pytest.approx(6e38, rel=1e-6) and row.max_rel == pytest.approx(2.0)
    assert row.cosine == -1.0


def test_equal_outputs_never_report_negative_zero():
    a = Const([1.0, 2.0], lambda v: v.half())
    b = Const([1.0, 2.0])
    (row,) = diff(a, b, torch.zeros(1)).rows
    assert row.max_abs == 0.0 and math.copysign(1.0, row.max_abs) == 1.0
    assert '"max_abs": 0.0' in diff(a, b, torch.zeros(1)).to_json()


@dataclass
class Out:
    logits: torch.Tensor
    extra: torch.Tensor | None


def test_dataclass_outputs_name_their_fields():
    a = Const([1.0, 2.0], lambda v: Out(v, v + 1))
    b = Const([1.0, 2.0], lambda v: Out(v, None))
    d = diff(a, b, torch.zeros(1))
    assert d.first.status == "structure" and d.first.note == "output.extra is a tensor in A, None in B"
    d = diff(a, copy.deepcopy(a), torch.zeros(1))
    assert [r.path for r in d.rows] == [".logits", ".extra"] and d.first is None


# --- calls, wrappers, devices -------------------------------------------------------------------------
class Repeat(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.n = n

    def forward(self, x):
        for _ in range(self.n):
            x = self.lin(x)
        return x


def test_a_module_called_more_often_in_one_run():
    x = torch.randn(2, 4)
    d = diff(Repeat(2), Repeat(1), x)
    assert [(r.name, r.call, r.status) for r in d.rows] == [
        ("lin", 0, "ok"), ("lin", 1, "missing in B"), ("", 0, "differs")]
    assert d.first.name == "lin" and d.first.call == 1
    d = diff(Repeat(1), Repeat(2), x)
    assert [(r.name, r.call, r.status) for r in d.rows] == [
        ("lin", 0, "ok"), ("", 0, "differs"), ("lin", 1, "missing in A")]


def test_data_parallel_against_the_plain_model():
    net = mlp()
    wrapped = nn.DataParallel(copy.deepcopy(net))  # on a CPU-only machine it calls the module
    x = torch.randn(3, 8)
    for a, b in ((wrapped, net), (net, wrapped)):
        d = diff(a, b, x)
        assert [r.name for r in d.rows] == ["0", "1", "2", ""]
        assert d.first is None and all(r.max_abs == 0 for r in d.rows)
    assert no_hooks(net) and no_hooks(wrapped)


def test_inputs_follow_each_model_to_its_device():
    from hookscope.analysis.diff._run import fresh_inputs as _fresh_inputs

    x = torch.randn(2, 4, requires_grad=True)
    with torch.device("meta"):
        on_meta = nn.Linear(4, 4)
    (moved, kw), dev = _fresh_inputs(on_meta, ((x,), {"mask": torch.ones(2)}))
    assert dev == torch.device("meta") and moved[0].is_meta and kw["mask"].is_meta
    assert moved[0].requires_grad and moved[0].shape == (2, 4)
    (same, _), dev = _fresh_inputs(nn.Linear(4, 4), ((x,), {}))
    assert dev == torch.device("cpu") and torch.equal(same[0], x) and same[0] is not x
    assert same[0].data_ptr() != x.data_ptr()  # a copy per run


# --- gradient_flow ---------------------------------------------------------------------------------------
def test_gradient_flow_empty_activation_gradient_is_zero_not_non_finite():
    import hookscope

    class Empty(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def forward(self, x):
            return self.a(x).sum() + self.b(x[:0]).sum()

    m = Empty()
    with hookscope.trace(m, keep="all") as t:
        m(torch.ones(3, 2)).backward()
    rows = {r.module: r for r in gradient_flow(m, trace=t).rows}
    assert rows["b"].act_norm == 0.0 and rows["b"].flag == "vanishing"
    assert rows["a"].act_norm == pytest.approx(math.sqrt(6)) and rows["a"].flag == "ok"
    assert no_hooks(m)


def test_gradient_flow_overflowing_float32_norm_is_exploding_not_non_finite():
    net = nn.Sequential(nn.Linear(2, 1, bias=False))
    net(torch.ones(1, 2)).sum().backward()
    net[0].weight.grad.fill_(1e20)  # finite, but its float32 sum of squares overflows
    (row,) = gradient_flow(net).rows
    assert row.flag == "exploding" and row.param_norm == pytest.approx(math.sqrt(2) * 1e20, rel=1e-6)
    net[0].weight.grad[0, 0] = math.inf
    (row,) = gradient_flow(net).rows
    assert row.flag == "non-finite" and row.param_norm == math.inf


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized and nested tensors warn they are old/new
def test_sparse_quantized_and_nested_outputs_are_compared_by_value():
    sparse = diff(Const([1.0, 0.0], lambda v: v.to_sparse()), Const([1.0, 0.5], lambda v: v.to_sparse()),
                  torch.zeros(1))
    assert [(r.status, r.max_abs, r.mismatched, r.numel) for r in sparse.rows] == [("differs", 0.5, 1, 2)]

    def quant(v):
        return torch.quantize_per_tensor(v, 0.25, 0, torch.qint8)

    (row,) = diff(Const([1.0, 0.0], quant), Const([1.0, 0.5], quant), torch.zeros(1)).rows
    assert (row.dtype_a, row.status, row.max_abs) == ("qint8", "differs", 0.5)

    def nested(v):
        return torch.nested.nested_tensor([v, v[:1]])

    d = diff(Const([1.0, 2.0], nested), Const([1.0, 2.5], nested), torch.zeros(1))
    assert [(r.path, r.status, r.max_abs, r.numel) for r in d.rows] == [
        ("[0]", "differs", 0.5, 2), ("[1]", "ok", 0.0, 1)]


def test_python_ints_beyond_int64_are_compared_exactly():
    big = 2**70
    (row,) = diff(Const([1.0], lambda v: big), Const([1.0], lambda v: big + 1), torch.zeros(1),
                  rtol=0, atol=0).rows
    assert (row.status, row.max_abs, row.mismatched) == ("differs", 1.0, 1)
    (row,) = diff(Const([1.0], lambda v: big), Const([1.0], lambda v: big), torch.zeros(1), rtol=0, atol=0).rows
    assert (row.status, row.max_abs) == ("ok", 0.0)


def test_nothing_compared_is_not_called_agreement(tmp_path, capsys):
    d = diff(Const([1.0], lambda v: "text"), Const([1.0], lambda v: None), torch.zeros(1))
    assert len(d) == 0 and "nothing compared" in d.table() and "no divergence" not in d.table()
    path = tmp_path / "quiet.py"
    path.write_text("import torch\n\n\nclass Quiet(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return None\n")
    assert main(["diff", f"{path}:Quiet", "--input", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was compared" in err[0]


def test_cli_bad_tolerance_is_one_line_and_status_2(capsys):
    assert main(["diff", "tiny", "--rtol", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rtol=nan is not a finite number >= 0" in err[0]
    assert main(["diff", "tiny", "--atol", "-1"]) == 2
    assert "atol=-1.0 is not a finite number >= 0" in capsys.readouterr().err
