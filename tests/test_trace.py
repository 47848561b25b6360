import csv
import gc
import io
import json
import math
import subprocess
import sys
import threading
import weakref

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

import pytest
import torch
from cli_batch import Batch
from helpers import ConvReLU, Net, Structured, no_hooks
from torch import nn

from hookscope import HookscopeError, RecordError
from hookscope.analysis.gradflow import gradient_flow
from hookscope.analysis._reduce import STATS, tensor_stats
from hookscope.analysis.trace import trace
from hookscope.errors import ForwardError
from hookscope.analysis.watch import watch
from hookscope.cli import main
from hookscope.zoo import TinyResNet


def stats(t):
    return dict(zip(STATS, tensor_stats(t).tolist()))


# --- the statistics of one tensor, worked out by hand --------------------------------------------
def test_tensor_stats_by_hand():
    s = stats(torch.tensor([[-2.0, 0.0], [0.0, 4.0]]))
    # mean 0.5; deviations -2.5, -0.5, -0.5, 3.5 -> population variance 19/4
    assert s == pytest.approx({"mean": 0.5, "std": math.sqrt(4.75), "min": -2.0, "max": 4.0,
                               "absmax": 4.0, "zeros": 2, "nan": 0, "inf": 0})
    assert tensor_stats(torch.ones(3)).dtype == torch.float64


def test_non_finite_values_are_counted_and_spoil_the_moments():
    s = stats(torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0]))
    assert (s["zeros"], s["nan"], s["inf"]) == (1, 1, 2)
    assert math.isnan(s["mean"]) and math.isnan(s["min"])  # as torch gives them: documented
    s = stats(torch.tensor([1.0, -float("inf")]))
    assert s["min"] == -math.inf and s["absmax"] == math.inf and (s["nan"], s["inf"]) == (0, 1)


def test_integer_bool_half_and_empty_tensors():
    assert stats(torch.tensor([1, 2, 3, 0])) == pytest.approx(
        {"mean": 1.5, "std": math.sqrt(1.25), "min": 0, "max": 3, "absmax": 3, "zeros": 1, "nan": 0, "inf": 0})
    b = stats(torch.tensor([True, False, False, False]))
    assert (b["mean"], b["std"], b["zeros"]) == pytest.approx((0.25, math.sqrt(0.1875), 3))
    h = stats(torch.full((1000,), 60000.0, dtype=torch.float16))  # a float16 sum would overflow
    assert (h["mean"], h["std"], h["inf"]) == (60000.0, 0.0, 0)
    e = stats(torch.zeros(0, 3))
    assert math.isnan(e["mean"]) and (e["zeros"], e["nan"], e["inf"]) == (0, 0, 0)


# --- a hand-set model, forward and backward -----------------------------------------------------
def hand_model():
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [-1.0, 0.0]]))
        lin.bias.copy_(torch.tensor([0.0, 1.0]))
    return nn.Sequential(lin, nn.ReLU())


def test_forward_and_backward_rows_worked_out_by_hand():
    m = hand_model()
    x = torch.tensor([[1.0, 1.0], [2.0, -1.0]], requires_grad=True)
    with trace(m, keep="all") as t:
        m(x).sum().backward()
    got = [(r.module, r.phase, r.which, r.path) for r in t.rows]
    assert got == [
        ("0", "forward", "input", "input[0]"), ("0", "forward", "output", "output"),
        ("1", "forward", "input", "input[0]"), ("1", "forward", "output", "output"),
        ("1", "backward", "grad_output", "output"), ("1", "backward", "grad_input", "input[0]"),
        ("0", "backward", "grad_output", "output"), ("0", "backward", "grad_input", "input[0]"),
    ]
    r = t.rows
    assert [row.index for row in r] == list(range(8)) and all(row.call == 0 for row in r)
    # linear output [[3, 0], [0, -1]]: mean 0.5, deviations 2.5, -.5, -.5, -1.5 -> std 1.5
    assert (r[1].mean, r[1].std, r[1].min, r[1].max, r[1].absmax, r[1].zero_frac) == (0.5, 1.5, -1, 3, 3, 0.5)
    assert r[2].mean == r[1].mean and r[2].min == -1  # the ReLU's input is that same tensor
    # ReLU output [[3, 0], [0, 0]]: mean .75, variance (2.25^2 + 3 * .75^2) / 4
    assert (r[3].mean, r[3].zero_frac, r[3].min) == (0.75, 0.75, 0)
    assert r[3].std == pytest.approx(math.sqrt(6.75 / 4))
    # d sum / d relu output = ones; through the ReLU [[1, 0], [0, 0]]; to x: that @ W = [[1, 2], [0, 0]]
    assert (r[4].mean, r[4].std, r[4].zero_frac) == (1.0, 0.0, 0.0)
    assert (r[5].mean, r[5].max, r[5].zero_frac) == (0.25, 1.0, 0.75)
    assert (r[6].mean, r[6].zero_frac) == (0.25, 0.75)
    assert (r[7].mean, r[7].min, r[7].max, r[7].zero_frac) == (0.75, 0.0, 2.0, 0.5)
    assert r[7].norm == pytest.approx(math.sqrt(5))
    assert {(row.shape, row.dtype, row.device, row.numel) for row in r} == {((2, 2), "float32", "cpu", 4)}
    assert all(row.finite for row in r) and no_hooks(m)


def test_table_for_people():
    # input [[1, 1], [2, -1]]: mean .75, variance (.25^2 + .25^2 + 1.25^2 + 1.75^2) / 4 = 1.1875
    m = hand_model()
    with trace(m, "0") as t:
        m(torch.tensor([[1.0, 1.0], [2.0, -1.0]]))
    assert t.table() == (
        "#  module  call  what    path      shape  dtype    mean   std  min  max  |max|  zeros  nan  inf\n"
        "-----------------------------------------------------------------------------------------------\n"
        "0  0          0  input   input[0]    2x2  float32  0.75  1.09   -1    2      2   0.0%    0    0\n"
        "1  0          0  output  output      2x2  float32   0.5   1.5   -1    3      3  50.0%    0    0"
    )
    assert t.table(max_rows=1).endswith("... 1 more rows (to_csv() or to_json() has them all)")


def test_json_and_csv_give_the_same_numbers(tmp_path):
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with trace(m) as t:
        m(torch.tensor([[1.0, float("nan"), 2.0]]))
    rows = json.loads(t.to_json())["rows"]
    assert len(rows) == 4 and rows[1]["mean"] == "nan" and rows[1]["nan"] == 3 and rows[0]["nan"] == 1
    assert rows[0]["shape"] == [1, 3] and rows[0]["module"] == "0"
    path = tmp_path / "t.csv"
    text = t.to_csv(str(path))
    assert path.read_text() == text
    back = list(csv.DictReader(io.StringIO(text)))
    assert [b["which"] for b in back] == ["input", "output", "input", "output"]
    assert back[0]["shape"] == "1x3" and back[0]["max"] == "nan" and back[0]["zero_frac"] == "0.0"
    assert int(back[3]["nan"]) == 3


# --- correctness traps -----------------------------------------------------------------------------
@pytest.mark.parametrize("functional", [False, True])
def test_statistics_are_taken_before_an_inplace_relu_rewrites_the_output(functional):
    m = ConvReLU(functional).eval()
    x = torch.randn(2, 3, 8, 8)
    ref = m.conv(x)
    with torch.no_grad(), trace(m) as t:
        m(x)
    conv_out = next(r for r in t.rows if r.module == "conv" and r.which == "output")
    assert conv_out.min == pytest.approx(ref.min().item()) and conv_out.min < 0
    assert conv_out.mean == pytest.approx(ref.mean().item(), abs=1e-6)
    if not functional:  # the ReLU's input (same tensor, before) and output (rewritten in place)
        relu_in, relu_out = [r for r in t.rows if r.module == "act"]
        assert relu_in.min == conv_out.min and relu_out.min == 0.0
        assert relu_out.mean == pytest.approx(ref.relu().mean().item(), abs=1e-6)


def test_residual_add_in_place_is_seen_with_its_new_values():
    m = TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), trace(m, "layer1.0.bn2", "layer1.0.relu", "layer1.0") as t:
        m(x)
    relu_calls = [r for r in t.rows if r.module == "layer1.0.relu"]
    assert [r.call for r in relu_calls] == [0, 0, 1, 1]
    with torch.no_grad():
        block_in = m.stem(x)
        b = m.layer1[0]
        bn2 = b.bn2(b.conv2(b.relu(b.bn1(b.conv1(block_in)))))
    bn2_row = next(r for r in t.rows if r.module == "layer1.0.bn2" and r.which == "output")
    assert bn2_row.mean == pytest.approx(bn2.mean().item(), abs=1e-5)
    # the second ReLU call receives bn2 + identity (written in place), not the stale bn2 statistics
    assert relu_calls[2].mean == pytest.approx((bn2 + block_in).mean().item(), abs=1e-5)
    assert relu_calls[3].min == 0.0 and no_hooks(m)


@pytest.mark.parametrize("kind, paths", [
    ("dict", ["output.y", "output.twice[0]"]),
    ("dataclass", ["output.main", "output.aux[0]"]),
    ("modeloutput", ["output.logits", "output.hidden"]),
    ("namedtuple", ["output[0]", "output[1]"]),
])
def test_nested_outputs_have_paths(kind, paths):
    m = Structured(kind)
    with trace(m, "") as t:
        m(torch.randn(2, 3))
    assert [r.path for r in t.rows if r.which == "output"] == paths and no_hooks(m)


def test_keyword_inputs_repeated_calls_and_integer_outputs():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x, *, scale):
            for _ in range(3):
                x = self.lin(x) * scale
            return x.argmax(dim=1)

    m = Shared()
    with trace(m, "", "lin") as t:
        m(torch.randn(4, 2), scale=torch.tensor(0.5))
    root = [r for r in t.rows if r.module == ""]
    assert [(r.which, r.path) for r in root] == [("input", "input[0]"), ("input", "input.scale"),
                                                ("output", "output")]
    assert root[1].mean == 0.5 and root[1].shape == () and root[2].dtype == "int64"
    assert [r.call for r in t.rows if r.module == "lin" and r.which == "output"] == [0, 1, 2]


def test_models_without_children_parameters_or_tensor_outputs():
    class Words(nn.Module):
        def forward(self, x):
            return f"{x.shape[0]} rows"

    for m in (nn.ReLU(), Words(), nn.Identity()):
        with trace(m) as t:
            m(torch.tensor([[-1.0, 2.0]]))
        assert [r.module for r in t.rows][0] == "" and t.rows[0].mean == 0.5 and no_hooks(m)
    assert len(t.rows) == 2  # Identity: its output too


def test_wrapped_models_are_traced_under_their_own_names():
    net = Net()
    with trace(nn.DataParallel(net), "module.l1") as t:
        net(torch.randn(3, 2))
    assert {r.module for r in t.rows} == {"l1"}


def test_no_backward_rows_without_grads_or_under_no_grad_and_inference_mode():
    net = Net()
    x = torch.randn(3, 2, requires_grad=True)
    with trace(net) as t:
        net(x).sum().backward()
    assert {r.phase for r in t.rows} == {"forward"}
    with torch.no_grad(), trace(net, keep="all") as t:
        net(x)
    with torch.inference_mode(), trace(net, keep="all") as t2:
        net(x)
    assert len(t.rows) == len(t2.rows) == 4 and [r.mean for r in t.rows] == [r.mean for r in t2.rows]
    assert no_hooks(net)


# --- bad input --------------------------------------------------------------------------------
def test_wrong_input_shape_names_the_module_and_the_shapes():
    m = TinyResNet().eval()
    with pytest.raises(ForwardError) as err:
        with trace(m) as t:
            m(torch.randn(1, 1, 32, 32))
    msg = str(err.value)
    assert "'stem.0' (Conv2d)" in msg and "input[0] 1x1x32x32 float32" in msg and "3 channels" in msg
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, HookscopeError)
    assert "\n" not in msg and no_hooks(m) and t.rows[0].module == "stem"


def test_wrong_dtype_names_the_module_after_the_last_one_that_ran():
    m = Net()
    with pytest.raises(ForwardError, match=r"'l2' \(Linear\), which received input\[0\] 3x5 float64, after 'l1'"):
        with trace(m):
            m.l1.double()
            m(torch.randn(3, 2, dtype=torch.float64))
    assert no_hooks(m)


def test_other_errors_pass_through_and_nothing_is_left():
    m = Net()
    with pytest.raises(KeyError):
        with trace(m):
            m(torch.randn(3, 2))
            raise KeyError("mine")
    t = trace(m)
    with t:
        pass
    with pytest.raises(HookscopeError, match="already run"):
        t.__enter__()
    assert no_hooks(m)


# --- command line -------------------------------------------------------------------------------
def test_cli_trace_csv_with_backward(capsys):
    assert main(["trace", "tiny", "--layers", "fc", "pool", "--backward", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["module"], r["which"]) for r in rows] == [
        ("pool", "input"), ("pool", "output"), ("fc", "input"), ("fc", "output"),
        ("fc", "grad_output"), ("fc", "grad_input"), ("pool", "grad_output"), ("pool", "grad_input")]
    # loss = logsumexp(logits).sum(): its gradient is the softmax, which sums to 1 over 10 classes
    assert float(rows[4]["mean"]) == pytest.approx(0.1) and rows[4]["shape"] == "1x10"


def test_cli_trace_table_json_and_grad_flow(tmp_path, capsys):
    assert main(["trace", "tiny", "--no-inputs"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0.conv1" in out and "input[0]" not in out
    dest = tmp_path / "t.json"
    assert main(["trace", "tiny", "--format", "json", "--out", str(dest)]) == 0
    # 27 modules, 30 calls (each block's ReLU runs twice), an input and an output each
    assert len(json.loads(dest.read_text())["rows"]) == 2 * 30
    assert main(["trace", "tiny", "--grad-flow"]) == 0
    out = capsys.readouterr().out
    assert "|grad params|" in out and "vanishing (< 1e-07): none" in out


@pytest.mark.slow  # a fresh interpreter imports torch: about 5 s here
def test_cli_bad_input_shape_is_one_line_naming_the_module():
    res = subprocess.run([sys.executable, "-m", "hookscope", "trace", "tiny", "--input", "1x1x32x32"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "'stem.0' (Conv2d)" in lines[0] and "1x1x32x32" in lines[0]


# --- a failure in the model's own forward, outside every traced module --------------------------
class Flat(nn.Module):
    """a gives 4 values per row; the forward's own view(-1, 3) fails for a 1x5 input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 4)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        return self.b(self.a(x).view(-1, 3))


class Pick(nn.Module):
    """Indexes its input out of range: an IndexError, not a RuntimeError."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 4)

    def forward(self, x):
        return self.a(x)[7]


@pytest.mark.parametrize("selectors", [(), ("b",), ("",), ("a", "")])
def test_a_failure_in_the_root_forward_names_the_root_and_what_reached_it(selectors):
    m = Flat()
    with pytest.raises(ForwardError) as err:
        with trace(m, *selectors):
            m(torch.randn(1, 5))
    msg = str(err.value)
    assert msg.startswith("the forward pass failed in Flat's own forward, which received input[0] 1x5 "
                          "float32, ")
    assert ("before any other module had finished" in msg) == ("a" not in selectors and bool(selectors))
    assert "shape '[-1, 3]' is invalid for input of size 4" in msg and "\n" not in msg
    assert ("after 'a' had run" in msg) == ("a" in selectors or not selectors)
    assert no_hooks(m)


def test_what_ran_before_is_counted_from_the_start_of_each_forward_pass():
    m = Net()
    with pytest.raises(ForwardError, match=r"'l1' \(Linear\), which received input\[0\] 3x7 float32, "
                                           r"before any other module had finished"):
        with trace(m):
            m(torch.randn(3, 2))  # a good pass first: l2 ran last, but not before the failure
            m(torch.randn(3, 7))
    assert no_hooks(m)


def test_any_exception_from_a_forward_becomes_a_forward_error_chained_to_it():
    m = Pick()
    with pytest.raises(ForwardError) as err:
        with trace(m):
            m(torch.randn(1, 5))
    assert str(err.value).startswith("the forward pass failed in Pick's own forward, which received input[0] "
                                     "1x5 float32, after 'a' had run: IndexError: index 7")
    assert isinstance(err.value.__cause__, IndexError) and no_hooks(m)


def test_an_error_inside_hookscope_hooks_is_not_blamed_on_the_model(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr("hookscope.analysis._recorder.tensor_stats", broken)
    m = Net()
    t = trace(m)
    with pytest.raises(RuntimeError, match="a bug of ours") as err:
        with t:
            m(torch.randn(3, 2))
    assert not isinstance(err.value, HookscopeError) and t.forward_error(err.value) is None
    assert no_hooks(m)


def test_cli_names_the_root_forward_and_non_runtime_errors_in_one_line(tmp_path, capsys):
    src = tmp_path / "models.py"
    src.write_text(
        "import torch\n"
        "class Flat(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a, self.b = torch.nn.Linear(5, 4), torch.nn.Linear(3, 2)\n"
        "    def forward(self, x):\n"
        "        return self.b(self.a(x).view(-1, 3))\n"
        "class Pick(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a = torch.nn.Linear(5, 4)\n"
        "    def forward(self, x):\n"
        "        return self.a(x)[7]\n"
    )
    for command in ("trace", "watch"):
        assert main([command, f"{src}:Flat", "--input", "1x5"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(
            f"hookscope {command}: error: the forward pass failed in Flat's own forward, "
            "which received input[0] 1x5 float32, after 'a' had run: RuntimeError: shape '[-1, 3]' is invalid")
        assert main([command, f"{src}:Pick", "--input", "1x5", "--backward"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "failed in Pick's own forward, which received input[0] 1x5" in err[0]
        assert "IndexError: index 7 is out of bounds for dimension 0 with size 1" in err[0]


# --- parameter gradients (param_grads=True) ------------------------------------------------------
def param_hooks(model: nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {})
               for p in model.parameters())


def test_parameter_gradient_rows_worked_out_by_hand():
    m = hand_model()
    x = torch.tensor([[1.0, 1.0], [2.0, -1.0]])
    with trace(m, param_grads=True, keep="output") as t:
        for _ in range(2):  # two backward passes: .grad accumulates, call counts them
            m(x).sum().backward()
        assert param_hooks(m) == 2
    rows = [r for r in t.rows if r.which == "grad_param"]
    assert sorted((r.module, r.call, r.path, r.phase) for r in rows) == [
        ("0", 0, "bias", "backward"), ("0", 0, "weight", "backward"),
        ("0", 1, "bias", "backward"), ("0", 1, "weight", "backward")]
    # through the ReLU only [0, 0] passes (linear output [[3, 0], [0, -1]]): d bias = [1, 0],
    # d weight = [[1, 1], [0, 0]]; the second pass accumulates twice that
    weight = [r for r in rows if r.path == "weight"]
    assert [(r.mean, r.max, r.shape) for r in weight] == [(0.5, 1.0, (2, 2)), (1.0, 2.0, (2, 2))]
    assert param_hooks(m) == 0 and no_hooks(m)


def test_parameter_gradients_of_selected_modules_are_named_after_their_owner():
    m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1, bias=False)))
    m[1][0].requires_grad_(False)
    with trace(m, "1", param_grads=True, keep="output") as t:
        m(torch.ones(1, 2)).sum().backward()
    assert [(r.module, r.path) for r in t.rows if r.which == "grad_param"] == [("1.1", "weight")]
    with pytest.raises(KeyError), trace(m, param_grads=True):
        raise KeyError("mine")
    assert param_hooks(m) == 0 and no_hooks(m)


# --- threads: a block ended while another thread is inside the model ------------------------------
class Wait(nn.Module):
    """Doubles its input; in the thread named "B", once ``block`` is set, waits for ``go`` first."""

    def __init__(self) -> None:
        super().__init__()
        self.block = False
        self.inside, self.go = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block and threading.current_thread().name == "B":
            self.inside.set()
            assert self.go.wait(30)
        return x * 2


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.wait, self.l2 = nn.Linear(4, 4), Wait(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.wait(self.l1(x)))


def in_thread_b(fn):
    """Run ``fn`` in a thread named "B"; the list receives its result or the exception it raised."""
    result: list = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            result.append(e)

    thread = threading.Thread(target=run, name="B")
    thread.start()
    return thread, result


@pytest.mark.parametrize("kind", ["trace", "watch"])
def test_a_block_ended_while_another_thread_is_between_pre_hooks_breaks_nothing(kind):
    # PyTorch decides whether a pre-hook takes kwargs when it calls it: one removed in between
    # used to be called without them, so the other thread's forward raised TypeError
    net, x = Gated(), torch.randn(3, 4)
    expected = net(x)
    at_gate, go = threading.Event(), threading.Event()

    def gate(module, args):
        if threading.current_thread().name == "B":
            at_gate.set()
            assert go.wait(30)

    handle = net.l2.register_forward_pre_hook(gate)  # runs before hookscope's own pre-hook on l2
    make = trace if kind == "trace" else watch
    with make(net) as block:
        thread, result = in_thread_b(lambda: net(x))
        assert at_gate.wait(30)
    go.set()
    thread.join(30)
    handle.remove()
    assert not thread.is_alive()
    assert isinstance(result[0], torch.Tensor), result[0]
    assert torch.equal(result[0], expected)
    if kind == "trace":  # what ran before the block ended; nothing of l2, whose call began later
        assert [(r.module, r.which) for r in block.rows] == [
            ("l1", "input"), ("l1", "output"), ("wait", "input"), ("wait", "output")]
        assert block.rows[1].mean == pytest.approx(net.l1(x).mean().item(), rel=1e-6)
    else:
        assert block.finite and block.checked == 2  # the outputs of l1 and wait
    assert no_hooks(net)


def test_a_trace_closed_while_another_thread_is_mid_forward_keeps_nothing_alive():
    net = Gated()
    net.wait.block = True
    inputs: list = []

    def forward():
        x = torch.randn(3, 4, requires_grad=True)
        inputs.append(weakref.ref(x))
        out = net(x)
        out.sum().backward()  # after the block: no hook of the trace may fire
        return out.detach()

    with trace(net, keep="all", param_grads=True) as t:
        thread, result = in_thread_b(forward)
        assert net.wait.inside.wait(30)
    net.wait.go.set()
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(result[0], torch.Tensor), result[0]
    assert [(r.module, r.which) for r in t.rows] == [("l1", "input"), ("l1", "output"), ("wait", "input")]
    result.clear()
    gc.collect()
    # the input's alias, kept for the call of 'wait' that never returned to the trace, is gone
    assert inputs[0]() is None
    assert no_hooks(net) and all(not p._post_accumulate_grad_hooks for p in net.parameters())
    assert len(t.rows) == 3


# --- torch.compile: hooks run eagerly between graph pieces, and take effect after compilation -----
def _comparable(rows):
    """Forward rows in order; backward rows in any order (a compiled backward accumulates the
    gradients of a module's parameters in another order)."""
    key = [(r.module, r.call, r.phase, r.which, r.path, r.shape, r.dtype) for r in rows]
    values = [(r.mean, r.std, r.min, r.max, r.absmax, r.zero_frac, r.nan, r.inf) for r in rows]
    forward = [(k, v) for k, v in zip(key, values) if k[2] == "forward"]
    backward = sorted((k, v) for k, v in zip(key, values) if k[2] == "backward")
    return forward + backward


def _traced(model, x, flows=None):
    with trace(model, keep="all", param_grads=True) as t:
        model(x).sum().backward()
    if flows is not None:  # gradient_flow reads the .grad of the parameters and the trace's rows
        flows.extend((r.module, r.type, r.param_norm, r.act_norm, r.flag)
                     for r in gradient_flow(model, trace=t).rows)
    for p in model.parameters():
        p.grad = None
    return _comparable(t.rows)


@pytest.mark.slow
@pytest.mark.parametrize("ran_before", [False, True], ids=["not-run-yet", "already-ran"])
def test_trace_of_a_compiled_model_gives_the_eager_rows(ran_before):
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(2, 8)
    eager_flows: list = []
    eager = _traced(net, x, eager_flows)
    compiled = torch.compile(net, backend="aot_eager")
    if ran_before:  # its graph was compiled without hooks: Dynamo does not re-check them by itself
        compiled(x).sum().backward()
        net.zero_grad(set_to_none=True)
    flows: list = []
    rows = _traced(compiled, x, flows)
    assert len(rows) == len(eager) == 15
    for (key, values), (eager_key, eager_values) in zip(rows, eager):
        assert key == eager_key
        assert values == pytest.approx(eager_values, rel=1e-5, abs=1e-6)
    assert [f[:2] + f[4:] for f in flows] == [f[:2] + f[4:] for f in eager_flows]
    for got, want in zip(flows, eager_flows):  # norms: None for a module without parameters
        assert [v is None for v in got[2:4]] == [v is None for v in want[2:4]]
        norms = [v for v in got[2:4] if v is not None]
        assert norms == pytest.approx([v for v in want[2:4] if v is not None], rel=1e-5)
    assert all(f[3] is not None for f in flows)  # activation norms came from the compiled trace
    assert no_hooks(compiled)
    # after the block the compiled model runs as before and still agrees with the eager one
    assert torch.allclose(compiled(x), net(x), atol=1e-6)
    again = _traced(compiled, x)  # a second block on the same compiled model sees every call again
    assert [key for key, _ in again] == [key for key, _ in eager]
    assert no_hooks(compiled)


COMPILED_MODEL = """
import torch
from torch import nn


def eager():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def compiled():
    return torch.compile(eager())
"""


def _limit_memory() -> None:  # in the child: Dynamo tracing a hook once grew past 19 GB
    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))


@pytest.mark.slow
@pytest.mark.skipif(resource is None, reason="resource limits are POSIX only")
def test_the_cli_on_a_compiled_model_stays_within_memory_and_matches_eager(tmp_path):
    (tmp_path / "cmodel.py").write_text(COMPILED_MODEL)
    batch = Batch(preexec_fn=_limit_memory)  # one process runs the six command lines
    commands = (["trace", "--backward", "--format", "json"], ["watch", "--backward"], ["summary", "--json"])
    runs = {(c[0], kind): batch.add(c[0], f"cmodel.py:{kind}", *c[1:], "--input", "2x8", cwd=tmp_path)
            for c in commands for kind in ("eager", "compiled")}

    def run(command: str, kind: str) -> str:
        res = batch[runs[command, kind]]
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout

    for command, *_ in commands:
        eager, compiled = run(command, "eager"), run(command, "compiled")
        if command != "trace":
            assert compiled == eager  # the same summary, the same "all finite: 12 ... checked"
            continue
        got, want = _json_rows(compiled), _json_rows(eager)
        assert len(want) == 11  # 6 forward, 3 grad_output and 2 grad_input rows
        assert [r[:4] for r in got] == [r[:4] for r in want]
        for a, b in zip(got, want):
            assert a[4:] == pytest.approx(b[4:], rel=1e-5, abs=1e-6)


def _json_rows(text):
    rows = json.loads(text)["rows"]
    return sorted((r["module"], r["phase"], r["which"], r["path"], r["mean"], r["std"], r["min"], r["max"])
                  for r in rows)


# --- one vocabulary (keep=), one result protocol, the engine apart from trace ------------
def _kinds(t):
    return [(r.module, r.which) for r in t.rows]


@pytest.mark.parametrize(("fn", "flag"), [(trace, {"inputs": False}), (trace, {"grads": True}),
                                          (watch, {"inputs": True})])
def test_keep_is_the_only_way_to_say_what_is_recorded(fn, flag):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        fn(hand_model(), **flag)


def test_keep_takes_each_field_on_its_own():
    m, x = hand_model(), torch.tensor([[1.0, 1.0], [2.0, -1.0]], requires_grad=True)
    with trace(m, keep="grad_input") as t:
        m(x).sum().backward()
    assert _kinds(t) == [("1", "grad_input"), ("0", "grad_input")]
    with trace(m, keep=["input", "grad_output"]) as t:
        m(x).sum().backward()
    assert _kinds(t) == [("0", "input"), ("1", "input"), ("1", "grad_output"), ("0", "grad_output")]
    with trace(m, keep="input") as t:  # no output rows, yet what ran before a failure is still known
        m(x)
    assert _kinds(t) == [("0", "input"), ("1", "input")] and no_hooks(m)


def test_a_wrong_keep_is_one_line_before_any_hook():
    m = hand_model()
    with pytest.raises(HookscopeError, match="keep='ouput'.*Did you mean 'output'"):
        trace(m, keep="ouput")
    with pytest.raises(HookscopeError, match="keep= is empty; name at least one of"):
        trace(m, keep=())
    with pytest.raises(TypeError, match="dpeth"):
        trace(m, dpeth=2)  # type: ignore[call-arg]
    assert no_hooks(m)


def test_trace_speaks_the_result_protocol():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with trace(m) as t:
        m(torch.tensor([[1.0, float("nan"), 2.0]]))
    assert str(t) == t.table() and "0" in t and "1" in t and "2" not in t and 0 not in t
    assert [r.which for r in t["1"]] == ["input", "output"] and all(r.module == "1" for r in t["1"])
    with pytest.raises(KeyError) as err:
        t["O"]
    assert isinstance(err.value, RecordError) and "no module 'O'" in str(err.value) and "\n" not in str(err.value)
    data = t.to_dict()
    assert [d["which"] for d in data["rows"]] == ["input", "output", "input", "output"]
    assert data["rows"][1]["shape"] == (1, 3) and math.isnan(data["rows"][1]["mean"])
    for indent in (None, 2):
        assert json.loads(t.to_json(indent=indent)) == json.loads(t.to_json())
    assert "\n" in t.to_json(2) and json.loads(t.to_json())["rows"][1]["mean"] == "nan"


def test_an_exception_caught_inside_the_block_can_be_reported_as_one_forward_error_line():
    m = Pick()
    t = trace(m)
    with t:
        with pytest.raises(IndexError) as err:
            m(torch.randn(1, 5))
        e = t.forward_error(err.value)
    assert isinstance(e, ForwardError) and str(e) == (
        "the forward pass failed in Pick's own forward, which received input[0] 1x5 float32, after 'a' "
        "had run: IndexError: index 7 is out of bounds for dimension 0 with size 1; check the example "
        "input's shape and dtype")
    assert t.forward_error(KeyError("elsewhere")) is None


# --- operations as selections: 'module::op' -----------------------------------------------------
class HandNorm(nn.Module):
    """A hand-written LayerNorm: mean, centre, variance, then a division by its square root."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 2.0))

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        var = centred.pow(2).mean(-1, keepdim=True)
        return self.weight * (centred / torch.sqrt(var))


def norm_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), HandNorm(4))


def same_stats(row, t):
    """The row's statistics are those of ``t``, worked out here."""
    t = t.detach().double()
    assert row.shape == tuple(t.shape)
    # float32 sums (the torch-operations path, without the native kernel) are exact to ~1e-7 of the
    # values' scale, not of a mean that cancels to ~0
    scale = t.abs().max().item()
    assert (row.mean, row.std, row.min, row.max, row.absmax) == pytest.approx(
        (t.mean().item(), t.std(unbiased=False).item(), t.min().item(), t.max().item(), scale),
        rel=1e-6, abs=1e-6 * scale)
    assert row.zero_frac == (t == 0).double().mean().item() and row.finite


def test_trace_of_operations_one_row_per_call_with_true_values():
    net = norm_net()
    x = torch.randn(3, 4)
    with trace(net, "*::*", keep="output") as t:
        net(x)
    h = net[0](x)
    centred = h - h.mean(-1, keepdim=True)
    var = centred.pow(2).mean(-1, keepdim=True)
    want = {"0::linear": h, "1::mean": h.mean(-1, keepdim=True), "1::sub": centred, "1::pow": centred.pow(2),
            "1::mean.1": var, "1::sqrt": var.sqrt(), "1::div": centred / var.sqrt(),
            "1::mul": net[1].weight * (centred / var.sqrt())}
    assert [r.module for r in t.rows] == list(want)  # each under the operation that ran, in order
    for row in t.rows:
        same_stats(row, want[row.module])
    assert "forward" not in vars(net[0]) and "forward" not in vars(net[1]) and no_hooks(net)
    assert torch._C._len_torch_function_stack() == 0


def test_operations_interleave_with_modules_and_leave_the_module_rows_as_they_were():
    net = norm_net()
    x = torch.randn(3, 4)
    with trace(net) as plain:
        net(x)
    with trace(net, "*", "1::*", "1::div") as t:  # "1::div" twice over: still one row per call
        net(x)
        net(x)
    names = [(r.module, r.call, r.which) for r in t.rows if r.module in ("1", "1::sqrt", "1::div")]
    assert names[:6] == [("1", 0, "input"), ("1::sqrt", 0, "input"), ("1::sqrt", 0, "output"),
                         ("1::div", 0, "input"), ("1::div", 0, "input"), ("1::div", 0, "output")]
    assert names[6:8] == [("1", 0, "output"), ("1", 1, "input")]
    assert [r.call for r in t["1::mean.1"]] == [0, 0, 1, 1]  # its input and output, in each forward
    modules = [r for r in t.rows if "::" not in r.module and r.module]
    fields = ("module", "call", "phase", "which", "path", "shape", "mean", "std", "min", "max", "zero_frac")
    first = [tuple(getattr(r, f) for f in fields) for r in modules if r.call == 0]
    assert first == [tuple(getattr(r, f) for f in fields) for r in plain.rows]


def test_gradient_rows_of_an_operation_and_none_under_no_grad():
    class Scaled(nn.Module):
        def forward(self, x):
            with torch.no_grad():
                top = x.abs().amax()          # no autograd here: no gradient row
            return torch.exp(x) / top

    net = nn.Sequential(Scaled())
    x = torch.randn(2, 3, requires_grad=True)
    with trace(net, "0::*", keep="all") as t:
        net(x).pow(2).sum().backward()
    e = torch.exp(x.detach()).requires_grad_()
    out = e / x.detach().abs().amax()
    out.pow(2).sum().backward()
    grads = {(r.module, r.which): r for r in t.rows if r.phase == "backward"}
    same_stats(grads[("0::exp", "grad_output")], e.grad)
    same_stats(grads[("0::div", "grad_output")], 2 * out)
    assert {m for m, _ in grads} == {"0::exp", "0::div"}  # abs and amax ran under no_grad
    assert [r.module for r in t.rows if r.phase == "forward" and r.which == "output"] == [
        "0::abs", "0::amax", "0::exp", "0::div"]


def test_a_misspelt_operation_gets_the_closest_that_ran():
    net = norm_net()
    with trace(net, "1::sqr") as t:
        net(torch.randn(2, 4))
    assert len(t) == 0
    with pytest.raises(RecordError, match=r"no operation '1::sqr' in this result\. Did you mean '1::sqrt'"):
        t["1::sqr"]
    assert "1::sqrt" not in t and no_hooks(net) and "forward" not in vars(net[1])


def test_an_operation_that_raises_is_named_itself_and_leaves_nothing_open():
    class Bad(nn.Module):
        def forward(self, x):
            return x @ torch.ones(5, 5)

    net = nn.Sequential(nn.Linear(4, 4), Bad())
    with pytest.raises(ForwardError, match=r"failed in '1::matmul' \(matmul\).*after '1::ones' had run"):
        with trace(net, "*", "*::*"):
            net(torch.randn(2, 4))
    assert "forward" not in vars(net[1]) and no_hooks(net) and torch._C._len_torch_function_stack() == 0


def test_in_place_operations_traced_with_gradients_change_nothing_the_model_computes():
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x) + x
            y += 1                            # add.1, in place
            z = (y * 3).mul_(2)               # mul, then mul.1 in place
            z[:, 0] = 0                       # setitem
            return z.sum(-1)

    torch.manual_seed(0)
    net = InPlace()
    x = torch.randn(3, 4, requires_grad=True)
    want = net(x)
    want.sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    net.zero_grad(); x.grad = None
    with trace(net, "*", "::*", keep="all") as t:
        got = net(x)
        got.sum().backward()
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip([p.grad for p in net.parameters()] + [x.grad], grads))
    y = net.fc(x).detach() + x.detach()
    outputs = {r.module: r for r in t.rows if r.which == "output"}
    same_stats(outputs["::add"], y)          # before the in-place add rewrote it
    same_stats(outputs["::add.1"], y + 1)
    same_stats(outputs["::mul"], (y + 1) * 3)      # before mul_ rewrote it
    same_stats(outputs["::mul.1"], (y + 1) * 6)
    assert "::setitem" in t and "forward" not in vars(net) and no_hooks(net)


# --- in a loop: rows streamed (on_row=) and a bounded trace (last=) -------------------------------------
def _step_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def _steps(net, n, g=None):
    g = g if g is not None else torch.Generator().manual_seed(3)
    for _ in range(n):
        net(torch.randn(2, 3, generator=g)).sum().backward()


def _held(t) -> int:
    """Rows and events a trace holds now, read from its repr (reading rows would gather them)."""
    return int(repr(t).split(", ")[1].split()[0])


def test_a_bounded_trace_keeps_the_last_rows_and_streams_every_row_an_unbounded_trace_keeps():
    from hookscope.analysis.trace import GATHER_EVERY
    net = _step_net()
    with trace(net, keep="all", param_grads=True) as full:
        _steps(net, 40)
    streamed, held = [], []
    net.zero_grad(set_to_none=True)  # the same gradients accumulate as in the first run
    g = torch.Generator().manual_seed(3)
    with trace(net, keep="all", param_grads=True, on_row=streamed.append, last=5) as t:
        for _ in range(40):
            _steps(net, 1, g)
            held.append(_held(t))
    assert len(full.rows) == 40 * 15 and streamed == full.rows  # every row, in order, numbered alike
    assert t.rows == full.rows[-5:] and len(t) == 5 and [r.index for r in t.rows] == list(range(595, 600))
    assert max(held) <= 5 + 15 < GATHER_EVERY  # the last rows and at most one step's events
    assert no_hooks(net)


def test_memory_stays_bounded_over_many_passes_with_last_zero_and_on_row():
    net = _step_net()
    seen = [0]
    held = []

    def count(row):
        seen[0] += 1

    with torch.no_grad(), trace(net, on_row=count, last=0) as t:
        for i in range(3000):
            net(torch.ones(1, 3))
            if i % 100 == 0:
                held.append(_held(t))
    assert seen[0] == 3000 * 6 and t.rows == [] and max(held) <= 6
    assert no_hooks(net)


def test_rows_reach_on_row_by_the_next_pass_and_all_of_them_by_the_end_of_the_block():
    net = _step_net()
    got = []
    with torch.no_grad(), trace(net, keep="output", on_row=got.append) as t:
        net(torch.ones(1, 3))
        assert got == []  # gathered when the next pass starts: one host synchronisation per pass
        net(torch.ones(1, 3))
        assert [r.module for r in got] == ["0", "1", "2"]
        net(torch.ones(1, 3))
    assert [r.index for r in got] == list(range(9)) and got == t.rows  # last=None keeps every row too
    assert no_hooks(net)


def test_on_row_may_read_the_trace_and_clear_hands_over_what_it_forgets():
    net = _step_net()
    sizes, got = [], []

    def look(row):
        got.append(row)
        sizes.append(len(t.rows))

    with torch.no_grad(), trace(net, keep="output", on_row=look, last=2) as t:
        net(torch.ones(1, 3))
        t.clear()
        net(torch.ones(1, 3))
    assert [r.index for r in got] == [0, 1, 2, 0, 1, 2] and sizes == [1, 2, 2, 1, 2, 2]
    assert no_hooks(net)


@pytest.mark.parametrize("kw, said", [
    (dict(last=-1), "last=-1 must be a whole number of rows, 0 or more"),
    (dict(last=True), "last=True must be a whole number of rows, 0 or more"),
    (dict(last=2.5), "last=2.5 must be a whole number of rows, 0 or more"),
    (dict(on_row="print"), "on_row='print' must be a function taking each row"),
])
def test_bad_streaming_arguments_are_refused_in_one_line(kw, said):
    net = _step_net()
    with pytest.raises(HookscopeError) as e:
        trace(net, **kw)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)


def test_watch_stays_bounded_over_many_passes():
    from hookscope.analysis.watch import RESOLVE_EVERY
    net = _step_net()
    held = []
    with watch(net, last=2) as w:
        for i in range(1500):
            _steps(net, 1)
            if i % 50 == 0:
                held.append((len(w._pending), len(w._recent), len(w._contexts)))
    assert w.finite and w.checked == 1500 * 12
    assert max(p for p, _, _ in held) < RESOLVE_EVERY and max(r for _, r, _ in held) <= 3
    assert max(c for _, _, c in held) < RESOLVE_EVERY
    assert len(w.rows) <= 3 * 6
    assert no_hooks(net)


def test_an_exception_in_on_row_comes_out_of_the_model_call_and_the_rows_stay_whole():
    net = _step_net()
    got = []

    def full(row):
        got.append(row.index)
        if row.index == 1:
            raise ValueError("the sink is full")

    with torch.no_grad(), trace(net, keep="output", on_row=full) as t:
        net(torch.ones(1, 3))
        with pytest.raises(ValueError, match="the sink is full"):
            net(torch.ones(1, 3))  # the first pass's rows are handed over as this one begins
    assert got == [0, 1] and [r.index for r in t.rows] == [0, 1, 2]
    assert no_hooks(net)


def test_an_empty_trace_has_the_columns_of_its_rows():
    net = _step_net()
    with trace(net, last=3) as t:
        pass
    df = t.to_pandas()
    assert len(df) == 0 and list(df.columns)[:3] == ["index", "module", "call"] and "zero_frac" in df.columns
    page = t._repr_html_()
    assert "<caption>Trace: 0 rows</caption>" in page and ">zero_frac</th>" in page and "<img" not in page


@pytest.mark.parametrize("native", ["1", "0"])
def test_notes_say_how_the_cpu_statistics_were_computed(native, monkeypatch):
    from hookscope import _native

    monkeypatch.setenv("HOOKSCOPE_NATIVE", native)
    net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    with trace(net) as t:
        net(torch.ones(1, 3))
    kernel = _native.stats_kernel()
    assert (kernel is None) == (native == "0" or _native.describe().startswith("torch"))
    want = (f"CPU statistics: C kernel ({kernel.name}," if kernel is not None
            else "CPU statistics: torch operations (")
    assert len(t.notes) == 1 and t.notes[0].startswith(want)
    if native == "0":
        assert t.notes == ["CPU statistics: torch operations (HOOKSCOPE_NATIVE=0)"]
    assert no_hooks(net)


def test_notes_are_empty_without_cpu_rows():
    net = nn.Sequential(nn.Linear(3, 2))
    with trace(net) as t:
        pass
    assert t.notes == []
    assert no_hooks(net)



# --- at= token positions during generate() ------------------------------------------------------------
def _tiny_lm(family):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=64)
        return transformers.GPT2LMHeadModel(cfg).eval(), "transformer.h.1"
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=32, vocab_size=40)
    return transformers.LlamaForCausalLM(cfg).eval(), "model.layers.1"


GEN_IDS = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 3]])  # row 0 left-padded: its own tokens are 5, 6
GEN_MASK = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])


def _generate_tokens(lm, use_cache, sample=False, new=5, **kw):
    torch.manual_seed(1)
    return lm.generate(GEN_IDS, attention_mask=GEN_MASK, max_new_tokens=new, do_sample=sample, use_cache=use_cache,
                       pad_token_id=0, top_k=0, **kw)


def _traced_generation(lm, name, at, use_cache, sample=False, **kw):
    with trace(lm, name, keep="output", at=at, **kw) as t:
        out = _generate_tokens(lm, use_cache, sample)
    assert no_hooks(lm)
    return t, out


def _expected_at(lm, name, out, row, position):
    """The statistics of the no-cache forward over the whole final sequence at (row, absolute position), by hand."""
    mask = torch.cat([GEN_MASK, torch.ones(2, out.shape[1] - 4, dtype=GEN_MASK.dtype)], 1)
    found = {}

    def keep(module, args, output):
        found["h"] = output[0] if isinstance(output, tuple) else output

    handle = dict(lm.named_modules())[name].register_forward_hook(keep)
    try:
        with torch.no_grad():
            lm(out, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    finally:
        handle.remove()
    col = int((mask[row].cumsum(0) - 1 == position).logical_and(mask[row].bool()).nonzero()[0])
    x = found["h"][row, col].double()
    return [float(x.mean()), float(x.std(unbiased=False)), float(x.min()), float(x.max()), float(x.abs().max())]


def _position_stats(r):
    return [r.mean, r.std, r.min, r.max, r.absmax]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_trace_at_generated_positions_equals_the_full_forward_with_and_without_cache(family, sample):
    lm, name = _tiny_lm(family)
    (cached, out), (plain, out2) = (_traced_generation(lm, name, hookscope_tokens().generated, uc, sample) for uc in (True, False))
    assert torch.equal(out, out2)
    keys = [(r.sequence, r.step, r.row, r.position) for r in cached.rows]
    # one row per step and sequence row: the prompt's last position, then every token fed back
    assert keys == [(0, k, b, p0 + k) for k in range(5) for b, p0 in ((0, 1), (1, 3))]
    assert [(r.sequence, r.step, r.row, r.position) for r in plain.rows] == keys  # no position twice without the cache
    for a, b in zip(cached.rows, plain.rows):
        want = _expected_at(lm, name, out, a.row, a.position)
        assert a.shape == (16,) and a.which == "output" and a.call == a.step
        assert max(abs(x - y) for x, y in zip(_position_stats(a), want)) < 1e-5
        assert max(abs(x - y) for x, y in zip(_position_stats(b), want)) < 1e-5
    assert no_hooks(lm)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_trace_at_a_step_and_a_position_keeps_those_positions_once(family, use_cache):
    tokens = hookscope_tokens()
    lm, name = _tiny_lm(family)
    t, out = _traced_generation(lm, name, tokens.step([0, 3]), use_cache)
    assert [(r.step, r.row, r.position) for r in t.rows] == [(0, 0, 1), (0, 1, 3), (3, 0, 4), (3, 1, 6)]
    for r in t.rows:
        assert max(abs(x - y) for x, y in zip(_position_stats(r), _expected_at(lm, name, out, r.row, r.position))) < 1e-5
    t, out = _traced_generation(lm, name, tokens.position(4), use_cache)
    # position 4 is the first token fed back in row 1 (a prompt of 4), the fourth in row 0 (a prompt of 2)
    assert [(r.step, r.row, r.position) for r in t.rows] == [(1, 1, 4), (3, 0, 4)]
    for r in t.rows:
        assert max(abs(x - y) for x, y in zip(_position_stats(r), _expected_at(lm, name, out, r.row, r.position))) < 1e-5


def hookscope_tokens():
    import hookscope

    return hookscope.tokens


def test_trace_at_the_prompt_without_cache_keeps_each_prompt_token_once_at_step_0():
    lm, name = _tiny_lm("gpt2")
    t, out = _traced_generation(lm, name, hookscope_tokens().prompt, False)  # the prompt is computed again at every step
    assert [(r.step, r.row, r.position) for r in t.rows] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (0, 1, 2),
                                                             (0, 1, 3)]
    for r in t.rows:
        assert max(abs(x - y) for x, y in zip(_position_stats(r), _expected_at(lm, name, out, r.row, r.position))) < 1e-5


def test_trace_at_positions_streams_and_speaks_the_protocol():
    lm, name = _tiny_lm("gpt2")
    seen = []
    t, _ = _traced_generation(lm, name, hookscope_tokens().generated, True, on_row=seen.append, last=3)
    assert len(seen) == 10 and [r.index for r in t.rows] == [7, 8, 9]
    assert [(r.step, r.position) for r in seen if r.row == 1] == [(k, 3 + k) for k in range(5)]
    head = t.table().splitlines()[0].split()
    assert head[:6] == ["#", "module", "seq", "step", "row", "position"]
    assert t.to_csv().splitlines()[0].endswith(",sequence,step,row,position")
    assert t.to_dict()["rows"][0]["position"] == seen[7].position and json.loads(t.to_json())["rows"][2]["step"] == 4
    assert [r.module for r in t[name]] == [name] * 3


def test_trace_at_positions_leaves_nothing_hooked_when_generate_raises():
    lm, name = _tiny_lm("gpt2")

    def boom(ids, scores, **kw):
        if ids.shape[1] > 6:
            raise RuntimeError("boom")
        return torch.zeros(ids.shape[0], dtype=torch.bool)

    with pytest.raises(RuntimeError, match="boom"):
        with trace(lm, name, keep="output", at=hookscope_tokens().generated) as t:
            _generate_tokens(lm, True, stopping_criteria=[boom])
    assert no_hooks(lm) and [r.step for r in t.rows if r.row == 0] == [0, 1, 2]


@pytest.mark.parametrize(("how", "said"), [
    (dict(at="step 9"), "tokens.step(9) never ran: the generation ran steps 0..4"),
    (dict(at="keep io"), "trace(at=tokens.generated) reads positions of each output's main tensor, so it works with "
                         "keep='output' alone (got ['input', 'output']); pass keep='output'"),
    (dict(at="slice"), "trace(at=at[:, -1]) takes token positions"),
    (dict(at="beams"), "beam search (num_beams > 1) reorders the rows between steps"),
])
def test_trace_at_positions_refuses_what_it_cannot_follow_in_one_line(how, said):
    import hookscope

    lm, name = _tiny_lm("gpt2")
    tokens, kind = hookscope.tokens, how["at"]
    with pytest.raises(HookscopeError) as caught:
        if kind == "keep io":
            trace(lm, name, at=tokens.generated)
        elif kind == "slice":
            trace(lm, name, keep="output", at=hookscope.at[:, -1])
        else:
            with trace(lm, name, keep="output", at=tokens.step(9) if kind == "step 9" else tokens.generated):
                _generate_tokens(lm, True, **({"num_beams": 2} if kind == "beams" else {}))
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)
    assert no_hooks(lm)
