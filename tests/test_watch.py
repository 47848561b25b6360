import json
from collections import OrderedDict
import math

import pytest
import torch
from helpers import no_hooks
from torch import nn

import hookscope.analysis.watch as watch_module
from hookscope import HookscopeError
from hookscope.analysis.gradflow import gradient_flow
from hookscope.analysis.trace import trace
from hookscope.analysis.watch import NonFiniteError, watch
from hookscope.errors import ForwardError
from hookscope.cli import main


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


def param_hooks(model: nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {})
               for p in model.parameters())


def eye_linear(n: int = 4, scale: float = 1.0) -> nn.Linear:
    lin = nn.Linear(n, n)
    with torch.no_grad():
        lin.weight.copy_(scale * torch.eye(n))
        lin.bias.zero_()
    return lin


def log_model(k: int = 6, n_layers: int = 10) -> nn.Sequential:
    """Ten layers; layer k takes the log of -1, so it and everything after it is NaN."""
    layers = [eye_linear() for _ in range(n_layers)]
    layers[k] = Log()
    return nn.Sequential(*layers)


def sqrt_model() -> nn.Sequential:
    """lin1 makes [1, 0]; sqrt(0) is finite forward, but its gradient 1 / (2 sqrt(0)) is Inf."""
    lin1, lin2 = nn.Linear(2, 2), nn.Linear(2, 1)
    with torch.no_grad():
        lin1.weight.copy_(torch.eye(2))
        lin1.bias.copy_(torch.tensor([0.0, -2.0]))
        lin2.weight.fill_(1.0)
        lin2.bias.zero_()
    return nn.Sequential(lin1, nn.ReLU(), Sqrt(), lin2)


# --- a log of a negative number in layer k ---------------------------------------------------------
def test_log_of_a_negative_number_names_layer_k_not_k_plus_1():
    m = log_model(k=6)
    with watch(m) as w:
        m(-torch.ones(2, 4))
    c = w.culprit
    assert (c.module, c.phase, c.which, c.call) == ("6", "forward", "output", 0)
    assert (c.nan, c.inf, c.numel) == (8, 0, 8)
    assert [r.module for r in w.before] == ["1", "2", "3", "4", "5"]  # the last 5, all finite
    assert all(r.finite and r.mean == -1.0 and r.std == 0.0 for r in w.before)
    assert not w.finite and no_hooks(m)
    report = w.table()
    assert report.startswith("first non-finite value: '6' call 0, forward output output 2x4: 8 NaN, 0 Inf of 8 values")


def test_a_block_is_not_blamed_before_the_layer_inside_it():
    m = nn.Sequential(nn.Linear(4, 4), log_model(k=3))
    with torch.no_grad():
        m[0].weight.copy_(-torch.eye(4))
        m[0].bias.zero_()
    with watch(m, last=2) as w:
        m(torch.ones(1, 4))
    assert w.culprit.module == "1.3" and [r.module for r in w.before] == ["1.1", "1.2"]


def test_raise_mode_stops_at_the_culprit():
    m = log_model(k=6)
    ran = []
    m[8].register_forward_hook(lambda *a: ran.append(8))  # a user's own hook, later layer
    with pytest.raises(NonFiniteError, match=r"'6' call 0, forward output.*8 NaN") as err:
        with watch(m, raise_on_nonfinite=True, last=3):
            m(-torch.ones(2, 4))
    assert err.value.row.module == "6" and [r.module for r in err.value.before] == ["3", "4", "5"]
    assert ran == []  # layer 8 never ran
    m[8]._forward_hooks.clear()
    assert no_hooks(m)


# --- a backward-only blow-up: sqrt at 0 --------------------------------------------------------------
def test_sqrt_at_zero_is_finite_forward_and_named_in_the_backward():
    m = sqrt_model()
    x = torch.tensor([[1.0, 2.0]])
    with watch(m) as w:
        m(x).sum().backward()
    c = w.culprit
    assert (c.module, c.phase, c.which, c.path) == ("2", "backward", "grad_input", "input[0]")
    assert (c.inf, c.nan, c.max) == (1, 0, math.inf)  # 1 / (2 sqrt(0)) * 1; the other is 1 / 2
    # before it: the gradient reaching sqrt (the culprit's own call), then the 5 calls before that:
    # four forward calls and lin2's backward (its gradients and its parameters' .grad)
    assert [(r.module, r.which, r.path) for r in w.before] == [
        ("0", "output", "output"), ("1", "output", "output"), ("2", "output", "output"),
        ("3", "output", "output"), ("3", "grad_output", "output"), ("3", "grad_param", "bias"),
        ("3", "grad_param", "weight"), ("3", "grad_input", "input[0]"), ("2", "grad_output", "output")]
    assert "the 9 records before it (the last 5 calls and the culprit's own call, all finite):" in w.table()
    assert no_hooks(m) and param_hooks(m) == 0


def test_sqrt_at_zero_raises_inside_backward():
    m = sqrt_model()
    with pytest.raises(NonFiniteError, match="'2' call 0, backward grad_input input\\[0\\] 1x2: 0 NaN, 1 Inf"):
        with watch(m, raise_on_nonfinite=True):
            m(torch.tensor([[1.0, 2.0]])).sum().backward()
    assert no_hooks(m)


# --- the rest ----------------------------------------------------------------------------------------
def test_all_finite_report_and_arguments():
    m = sqrt_model()
    with watch(m) as w:
        m(torch.tensor([[1.0, 3.0]])).sum().backward()
    assert w.finite and w.culprit is None
    # 4 outputs, 4 grad_outputs, 3 grad_inputs (lin1's input needs no gradient), 4 parameters' .grad
    assert w.table() == "all finite: 15 outputs and gradients checked, no NaN and no Inf"
    for bad in (-1, 1.5, True):
        with pytest.raises(HookscopeError, match="whole number of module calls"):
            watch(m, last=bad)
    assert no_hooks(m)


def test_a_non_finite_model_input_is_told_apart_with_inputs():
    m = log_model(k=6)
    x = torch.full((1, 4), float("inf"))
    with watch(m, keep="all") as w:
        m(x)
    assert (w.culprit.module, w.culprit.which, w.culprit.inf) == ("0", "input", 4)


def test_periodic_resolution_keeps_memory_bounded_and_finds_the_same_culprit(monkeypatch):
    monkeypatch.setattr(watch_module, "RESOLVE_EVERY", 3)
    m = log_model(k=6)
    with watch(m, last=2) as w:
        for _ in range(2):
            m(-torch.ones(2, 4))
        assert len(w._pending) < 3
    assert (w.culprit.module, w.culprit.call) == ("6", 0) and [r.module for r in w.before] == ["4", "5"]


# --- story 10: debug without editing forward -------------------------------------------------------
def test_story10_record_everything_then_find_what_went_wrong():
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), Log(), nn.Linear(4, 4), nn.ReLU())
    with torch.no_grad():
        m[0].weight.fill_(-1.0)
        m[0].bias.zero_()
    x = torch.ones(2, 4)
    with trace(m, keep="all") as t:  # what went in and out of every layer, forward and backward
        m(x).sum().backward()
    fwd = [(r.module, r.which, r.shape, r.dtype) for r in t.rows if r.phase == "forward"]
    assert fwd[:4] == [("0", "input", (2, 4), "float32"), ("0", "output", (2, 4), "float32"),
                       ("1", "input", (2, 4), "float32"), ("1", "output", (2, 4), "float32")]
    assert len(fwd) == 10 and {r.module for r in t.rows if r.phase == "backward"} == {"0", "1", "2", "3", "4"}
    tanh_out = t.rows[3]
    assert tanh_out.mean == pytest.approx(math.tanh(-4.0)) and tanh_out.std == pytest.approx(0, abs=1e-6)  # one float32 ulp
    first = next(r for r in t.rows if not r.finite)
    assert (first.module, first.which, first.nan) == ("2", "output", 8)
    with watch(m) as w:  # the same answer, without keeping every row
        m(x).sum().backward()
    assert (w.culprit.module, w.culprit.which) == ("2", "output")
    # backward, log(x) sends back g / x (finite); only the weight gradient of layer 3 sees the NaN
    assert all(r.finite for r in t.rows if r.phase == "backward")
    flow = gradient_flow(m, trace=t)
    assert flow.exploding == ["3"] and [r.flag for r in flow.rows if r.module == "3"] == ["non-finite"]
    assert no_hooks(m)


def test_cli_watch_names_the_culprit(tmp_path, capsys):
    src = tmp_path / "bad.py"
    src.write_text(
        "import torch\n"
        "class Log(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.log(x - 10)\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.ReLU(), Log(), torch.nn.Linear(3, 2))\n"
    )
    assert main(["watch", f"{src}:build", "--input", "2x3", "--backward", "--last", "1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("first non-finite value: '1' call 0, forward output output 2x3: 6 NaN")
    assert "the 1 records before it (the last 1 call, all finite)" in out
    assert main(["watch", "tiny", "--backward"]) == 0
    assert capsys.readouterr().out.startswith("all finite: ")


# --- last=N counts module calls -------------------------------------------------------------------
def test_last_counts_calls_with_all_their_records():
    m = log_model(k=6)
    with watch(m, keep="all", last=2) as w:
        m(-torch.ones(2, 4))
    assert (w.culprit.module, w.culprit.which) == ("6", "output")
    # calls 4 and 5 (input and output each), and the culprit's own input
    assert [(r.module, r.which) for r in w.before] == [
        ("4", "input"), ("4", "output"), ("5", "input"), ("5", "output"), ("6", "input")]
    with watch(m, keep="all", last=0) as w:
        m(-torch.ones(2, 4))
    assert [(r.module, r.which) for r in w.before] == [("6", "input")]
    assert "the 1 records before it (the last 0 calls and the culprit's own call" in w.table()


def test_last_keeps_the_records_of_a_block_around_its_children():
    m = nn.Sequential(nn.Linear(4, 4), log_model(k=1, n_layers=3))
    with watch(m, keep="all", last=1) as w:
        m(-torch.ones(1, 4))
    # the block "1" started before its child "1.0" ran; its input is one of its call's records
    assert (w.culprit.module, w.culprit.which) == ("1.1", "output")
    assert [(r.module, r.which) for r in w.before] == [("1.0", "input"), ("1.0", "output"), ("1.1", "input")]


# --- parameter gradients ------------------------------------------------------------------------
def overflowing_weight_grad() -> tuple[nn.Sequential, torch.Tensor]:
    """Layer 0 (weight 1e19) maps 1e19 to 1e38, still finite; layer 1's weight gradient sums four
    of them, 4e38, beyond float32: inf. Every activation and activation gradient stays finite."""
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        m[0].weight.fill_(1e19)
        m[1].weight.fill_(1.0)
    return m, torch.full((4, 1), 1e19)


def test_a_non_finite_parameter_gradient_names_the_module_and_the_parameter():
    m, x = overflowing_weight_grad()
    with watch(m) as w:
        m(x).sum().backward()
    assert torch.isinf(m[1].weight.grad).all() and torch.isfinite(m[0].weight.grad).all()
    c = w.culprit
    assert (c.module, c.phase, c.which, c.path, c.call, c.inf) == ("1", "backward", "grad_param", "weight", 0, 1)
    assert "'1' call 0, backward grad_param weight 1x1: 0 NaN, 1 Inf of 1 values" in w.table()
    assert param_hooks(m) == 0 and no_hooks(m)
    m.zero_grad()
    with watch(m, param_grads=False) as w:
        m(x).sum().backward()
    assert w.finite


def test_a_non_finite_parameter_gradient_raises_inside_backward_and_leaves_no_hook():
    m, x = overflowing_weight_grad()
    with pytest.raises(NonFiniteError, match="grad_param weight"):
        with watch(m, raise_on_nonfinite=True):
            m(x).sum().backward()
    assert param_hooks(m) == 0 and no_hooks(m)


def test_only_the_parameters_of_watched_modules_are_checked():
    m, x = overflowing_weight_grad()
    with watch(m, "0") as w:
        m(x).sum().backward()
    assert w.finite and param_hooks(m) == 0


def test_sparse_parameter_gradients_are_checked_by_their_values():
    m = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1))
    with watch(m) as w:
        m(torch.tensor([1, 1, 4])).sum().backward()
    assert w.finite and param_hooks(m) == 0
    with torch.no_grad():
        m[1].weight.copy_(torch.tensor([[1.0, float("inf"), 2.0]]))
    m.zero_grad()
    with trace(m, "0", param_grads=True, keep="output") as t:
        m(torch.tensor([1, 1, 4])).sum().backward()
    # the gradient rows of indices 1 (twice, summed) and 4: 2 stored rows of 3, each [1, inf, 2]
    row = t.rows[-1]
    assert (row.module, row.which, row.path, row.shape, row.inf, row.max) == (
        "0", "grad_param", "weight", (2, 3), 2, math.inf)
    assert param_hooks(m) == 0


def test_a_failure_in_the_root_forward_is_named_under_watch():
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(5, 4)

        def forward(self, x):
            return self.a(x).view(-1, 3)

    m = Flat()
    with pytest.raises(ForwardError, match=r"failed in Flat's own forward, which received input\[0\] 1x5 "
                                           r"float32, after 'a' had run: RuntimeError: shape '\[-1, 3\]' is invalid"):
        with watch(m):
            m(torch.randn(1, 5))
    assert no_hooks(m) and param_hooks(m) == 0


@pytest.mark.slow
@pytest.mark.parametrize("ran_before", [False, True], ids=["not-run-yet", "already-ran"])
def test_watch_of_a_compiled_model_names_the_same_culprit(ran_before):
    torch._dynamo.reset()
    m, x = log_model(k=6), -torch.ones(1, 4)
    with watch(m) as eager:
        m(x)
    compiled = torch.compile(m, backend="aot_eager")
    if ran_before:  # compiled without hooks: they must still take effect
        compiled(x)
    with watch(compiled) as w:
        compiled(x)
    assert (w.culprit.module, w.culprit.which, w.culprit.nan) == ("6", "output", 4)
    assert (w.culprit.index, w.culprit.describe()) == (eager.culprit.index, eager.culprit.describe())
    assert [(r.module, r.mean) for r in w.before] == [(r.module, r.mean) for r in eager.before]
    assert no_hooks(compiled) and param_hooks(compiled) == 0


# --- one result protocol, one vocabulary ------------------------------------------------
def test_watch_speaks_the_result_protocol():
    m = log_model(k=6)
    with watch(m, last=2) as w:
        m(-torch.ones(2, 4))
    assert str(w) == w.table() and w.table().startswith("first non-finite value: '6' call 0")
    assert w.rows == [*w.before, w.culprit] and [r.module for r in w.rows] == ["4", "5", "6"]
    data = json.loads(w.to_json(indent=2))
    assert data == json.loads(w.to_json()) == json.loads(json.dumps(w.to_dict(), default=str).replace("NaN", '"nan"'))
    assert data["finite"] is False and data["culprit"]["module"] == "6" and data["culprit"]["mean"] == "nan"
    assert [r["module"] for r in data["rows"]] == ["4", "5", "6"] and data["checked"] == 7
    with watch(m, last=1) as ok:
        m(torch.ones(2, 4))
    assert ok.finite and str(ok) == ok.table() == f"all finite: {ok.checked} outputs and gradients checked, no NaN and no Inf"
    assert [r.module for r in ok.rows] == ["8", "9"]  # the last last + 1 calls
    assert json.loads(ok.to_json())["culprit"] is None and no_hooks(m)


def test_keep_all_also_checks_inputs_and_output_only_skips_gradients():
    m = log_model(k=6)
    with watch(m, keep="all") as new:
        m(-torch.ones(1, 4))
    assert (new.culprit.module, new.culprit.which) == ("6", "output")
    assert {r.which for r in new.before} >= {"input", "output"}
    with watch(m, keep="output") as out:  # forward only: no gradient is watched
        m(-torch.ones(1, 4, requires_grad=True)).sum().backward()
    assert {r.phase for r in out.before} == {"forward"} and no_hooks(m)


def test_a_failure_after_the_culprit_still_says_what_the_module_received():
    m = nn.Sequential(Log(), nn.Linear(3, 2))  # NaN from the Log first, then a shape error
    with pytest.raises(ForwardError, match=r"'1' \(Linear\), which received input\[0\] 1x4 float32, after '0'"):
        with watch(m):
            m(-torch.ones(1, 4))
    assert no_hooks(m)


# --- operations as selections: the first non-finite value named as the operation that made it ---
class HandNorm(nn.Module):
    """A hand-written LayerNorm: divides by the square root of the variance, 0 for a constant row."""

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True))


def constant_rows():
    """A model whose Linear makes every row constant: the norm divides 0 by 0."""
    fc = nn.Linear(3, 3)
    with torch.no_grad():
        fc.weight.zero_()
        fc.bias.fill_(0.5)
    return nn.Sequential(OrderedDict(fc=fc, norm=HandNorm()))


def test_the_division_by_zero_variance_is_named_not_the_norm_around_it():
    net = constant_rows()
    with watch(net) as modules_only:
        net(torch.randn(2, 3))
    assert modules_only.culprit.module == "norm"
    with watch(net, "*", "*::*", last=3) as w:
        net(torch.randn(2, 3))
    row = w.culprit
    assert (row.module, row.call, row.which, row.nan) == ("norm::div", 0, "output", 6)
    assert [(r.module, r.which) for r in w.before] == [
        ("norm::pow", "output"), ("norm::mean.1", "output"), ("norm::sqrt", "output")]
    assert (w.before[-1].min, w.before[-1].max) == (0.0, 0.0)  # the zero it divided by, seen
    assert "'norm::div' call 0, forward output" in w.table()
    for m in net.modules():
        assert "forward" not in vars(m)
    assert no_hooks(net) and torch._C._len_torch_function_stack() == 0


def test_a_log_of_zero_inside_a_forward_is_named_by_a_glob_and_raises_there():
    class LogProb(nn.Module):
        def forward(self, x):
            return torch.log(x.relu()) + 1

    net = nn.Sequential(nn.Identity(), LogProb())
    with pytest.raises(NonFiniteError, match=r"first non-finite value: '1::log' call 0") as err:
        with watch(net, "1::*", raise_on_nonfinite=True):
            net(torch.tensor([[1.0, -1.0]]))
    assert (err.value.row.inf, err.value.row.min) == (1, -math.inf)
    assert [r.module for r in err.value.before] == ["1::relu"]
    assert "forward" not in vars(net[1]) and no_hooks(net)


def test_sqrt_at_zero_is_named_in_the_backward_pass_and_no_grad_ops_have_no_gradient():
    class Root(nn.Module):
        def forward(self, x):
            with torch.no_grad():
                scale = x.abs().amax() + 1    # under no_grad: no gradient record
            return torch.sqrt(x) * scale

    net = nn.Sequential(Root())
    x = torch.tensor([[0.0, 4.0]], requires_grad=True)
    with watch(net, "0::*", last=10) as w:
        net(x).sum().backward()
    assert (w.culprit.module, w.culprit.phase, w.culprit.which, w.culprit.inf) == ("0::sqrt", "backward", "grad_input", 1)
    assert {r.module for r in w.rows if r.phase == "backward"} == {"0::mul", "0::sqrt"}
    assert [r.module for r in w.rows if r.phase == "forward"] == ["0::abs", "0::amax", "0::add", "0::sqrt", "0::mul"]


def test_a_misspelt_operation_gets_the_closest_that_ran_under_watch():
    net = constant_rows()
    with watch(net, "norm::dvi") as w:
        net(torch.randn(2, 3))
    assert w.finite  # nothing of its own was watched
    assert "no NaN and no Inf; 'norm::dvi' never ran. Did you mean 'norm::div'," in w.table()
    with watch(net, "norm::*", "norm::dvi", "norm::div") as both:  # one site: the misspelt part is told
        net(torch.randn(2, 3))
    assert [line.split(".")[0] for line in both.never_ran()] == ["'norm::dvi' never ran"]
    with pytest.raises(HookscopeError, match=r"no operation 'norm::dvi' in this result\. Did you mean 'norm::div'"):
        w["norm::dvi"]
    assert "forward" not in vars(net.norm) and no_hooks(net)


def test_last_larger_than_the_calls_at_hand_keeps_them_all():
    net = nn.Sequential(*[nn.Identity() for _ in range(6)], Log())
    with watch(net, last=10) as w:  # 6 calls before the culprit, fewer than 10: every one
        net(torch.zeros(1))
    assert [r.module for r in w.before] == ["0", "1", "2", "3", "4", "5"]


def test_a_non_finite_parameter_is_named_by_the_operation_that_used_it():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.tensor([1.0, float("inf")]))

        def forward(self, x):
            return (x + 1) * self.gain

    net = nn.Sequential(nn.Identity(), Scale())
    with watch(net, "*", "*::*", param_grads=False) as w:
        net(torch.ones(1, 2))
    assert (w.culprit.module, w.culprit.which, w.culprit.inf) == ("1::mul", "output", 1)
