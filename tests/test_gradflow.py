import json
import math

import pytest
import torch
from conftest import no_hooks
from torch import nn

from hookscope import HookscopeError, RecordError
from hookscope.analysis.gradflow import gradient_flow
from hookscope.analysis.trace import trace


def chain() -> nn.Sequential:
    """y = W3 W2 W1 x, no biases, with W1 = I, W2 = [3e-12, 4e-12], W3 = [1]."""
    m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False), nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(2))
        m[1].weight.copy_(torch.tensor([[3e-12, 4e-12]]))
        m[2].weight.fill_(1.0)
    return m


def test_parameter_gradient_norms_worked_out_by_hand():
    m = chain()
    m(torch.tensor([[2000.0, 0.0]])).sum().backward()
    flow = gradient_flow(m)
    # dW3 = W2 W1 x = 6e-9; dW2 = W3 (W1 x)^T = [2000, 0]; dW1 = (W3 W2)^T x^T = [[6e-9, 0], [8e-9, 0]]
    norms = [r.param_norm for r in flow.rows]
    assert norms == pytest.approx([1e-8, 2000.0, 6e-9], rel=1e-5)
    assert [r.flag for r in flow.rows] == ["vanishing", "exploding", "vanishing"]
    assert flow.vanishing == ["0", "2"] and flow.exploding == ["1"]
    assert [(r.module, r.type, r.params, r.act_norm) for r in flow.rows] == [
        ("0", "Linear", 4, None), ("1", "Linear", 2, None), ("2", "Linear", 1, None)]
    tight = gradient_flow(m, vanish=1e-9, explode=1e4)
    assert [r.flag for r in tight.rows] == ["ok", "ok", "ok"]


def test_activation_gradient_norms_from_a_trace():
    m = chain()
    with trace(m, keep="all") as t:
        m(torch.tensor([[2000.0, 0.0]])).sum().backward()
    flow = gradient_flow(m, trace=t)
    # gradients reaching the outputs: 1 at layer 2, W3 = 1 at layer 1, W2^T W3^T = [3e-12, 4e-12] at 0
    assert [r.act_norm for r in flow.rows] == pytest.approx([5e-12, 1.0, 1.0], rel=1e-5)
    # a layer is vanishing only if every norm it has is small
    assert [r.flag for r in flow.rows] == ["vanishing", "exploding", "ok"]
    assert no_hooks(m)


def test_table_and_json():
    m = chain()
    m(torch.tensor([[2000.0, 0.0]])).sum().backward()
    flow = gradient_flow(m)
    lines = flow.table().splitlines()
    assert lines[0].split() == ["module", "type", "params", "|grad", "params|", "|grad", "output|", "flag"]
    assert lines[3].split() == ["1", "Linear", "2", "2000", "-", "exploding"]
    assert lines[-1] == "vanishing (< 1e-07): 0, 2; exploding (> 1000): 1"
    data = json.loads(flow.to_json())
    assert data["vanish"] == 1e-7 and data["layers"][1]["param_norm"] == pytest.approx(2000.0)


def test_result_protocol_lookups_and_non_finite_json():
    # issue 10: one result protocol (table/str, to_dict, to_json round-trip) and checked lookups
    m = chain()
    m(torch.tensor([[2000.0, 0.0]])).sum().backward()
    flow = gradient_flow(m, explode=math.inf)
    assert str(flow) == flow.table() and flow["1"].param_norm == pytest.approx(2000.0)
    assert "1" in flow and "" not in flow and 1 not in flow
    with pytest.raises(RecordError, match=r"no layer '01' in this result. Did you mean") as info:
        flow["01"]
    assert isinstance(info.value, KeyError)
    data = json.loads(flow.to_json())
    assert data["explode"] == "inf" and data["layers"] == json.loads(flow.to_json(indent=2))["layers"]
    assert data["layers"][1] == {"module": "1", "type": "Linear", "params": 2,
                                 "param_norm": pytest.approx(2000.0), "act_norm": None, "flag": "ok"}
    with torch.no_grad():
        m[0].weight.grad[0, 0] = math.nan
    flow = gradient_flow(m)
    assert json.loads(flow.to_json())["layers"][0]["param_norm"] == "nan"
    assert flow.table().splitlines()[2].split() == ["0", "Linear", "4", "nan", "-", "non-finite"]


def test_root_parameters_frozen_unused_and_non_finite_layers():
    class Story9(nn.Module):  # story 9: a module with its own weight and bias, and children
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(5, 10))
            self.bias = nn.Parameter(torch.zeros(5))
            self.submodel_1 = nn.Linear(5, 4)
            self.submodel_2 = nn.Linear(4, 2)
            self.unused = nn.Linear(2, 2)

        def forward(self, x):
            return self.submodel_2(self.submodel_1(x @ self.weight.t() + self.bias))

    m = Story9()
    m.submodel_1.requires_grad_(False)
    m(torch.ones(3, 10)).sum().backward()
    rows = {r.module: r for r in gradient_flow(m).rows}
    assert list(rows) == ["", "submodel_1", "submodel_2", "unused"]
    assert rows[""].params == 55 and rows[""].flag == "ok"
    assert rows["submodel_1"].params == 0 and rows["submodel_1"].flag == "no grad"
    assert rows["unused"].flag == "no grad" and rows["unused"].param_norm is None
    # dL/d bias of submodel_2 = 3 per output (3 rows): norm sqrt(3^2 + 3^2) with the weight's part
    with torch.no_grad():
        h = m.submodel_1(torch.ones(3, 10) @ m.weight.t() + m.bias)
    expected = math.sqrt(2 * 9 + 2 * float((h.sum(0) ** 2).sum()))
    assert rows["submodel_2"].param_norm == pytest.approx(expected, rel=1e-5)
    with torch.no_grad():
        m.weight.grad[0, 0] = float("nan")
    flow = gradient_flow(m, "", "submodel_2")
    assert [r.flag for r in flow.rows] == ["non-finite", "ok"] and flow.exploding == [""]


def test_without_a_backward_pass_says_what_to_do():
    m = chain()
    m(torch.ones(1, 2))
    with pytest.raises(HookscopeError, match=r"call loss.backward\(\) first"):
        gradient_flow(m)
    with pytest.raises(HookscopeError, match="vanish"):
        gradient_flow(m, vanish=10, explode=1)


def test_wrapped_models_use_their_own_names():
    m = chain()
    m(torch.ones(1, 2)).sum().backward()
    assert [r.module for r in gradient_flow(nn.DataParallel(m), "module.1").rows] == ["1"]


# --- precision and layout of the gradients ---------------------------------------------------------
def test_float64_gradients_keep_their_precision():
    m = chain().double()
    m(torch.tensor([[2000.0, 0.0]], dtype=torch.float64)).sum().backward()
    flow = gradient_flow(m)
    # the same hand-worked norms; 1e-8 + 2000 would lose the small one in float32, not in float64
    assert [r.param_norm for r in flow.rows] == pytest.approx([1e-8, 2000.0, 6e-9], rel=1e-12)
    assert [r.flag for r in flow.rows] == ["vanishing", "exploding", "vanishing"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_are_summed_in_float32(dtype):
    lin = nn.Linear(2, 1, bias=False).to(dtype)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    # each d weight = x = 300; squared, 9e4 is beyond float16's largest value (65504)
    lin(torch.full((1, 2), 300.0, dtype=dtype)).sum().backward()
    assert lin.weight.grad.dtype == dtype
    row = gradient_flow(lin).rows[0]
    assert row.param_norm == pytest.approx(300.0 * math.sqrt(2), rel=1e-3) and row.flag == "ok"


def test_sparse_embedding_gradients():
    m = nn.Sequential(nn.Embedding(10, 2, sparse=True), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        m[1].weight.copy_(torch.tensor([[3.0, 4.0]]))
    m(torch.tensor([1, 1, 4])).sum().backward()
    assert m[0].weight.grad.is_sparse
    rows = gradient_flow(m).rows
    # rows 1 (used twice: [6, 8]) and 4 ([3, 4]): norm sqrt(100 + 25)
    assert rows[0].param_norm == pytest.approx(math.sqrt(125)) and rows[0].flag == "ok"
    assert rows[0].params == 20 and rows[1].flag == "ok"
