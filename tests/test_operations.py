"""``hookscope.operations`` and ``hookscope layers --ops``: what one pass runs, named as selectors take it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import hookscope
from hookscope.cli import main
from hookscope.errors import HookscopeError


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        out += x
        return torch.relu(out) @ torch.ones(4, 2)


def test_rows_name_function_in_place_and_shapes() -> None:
    ops = hookscope.operations(Residual(), torch.ones(3, 4))
    assert list(ops) == ["fc::linear", "::add", "::relu", "::ones", "::matmul"]
    add = ops["::add"][0]
    assert add.in_place and add.function == "Tensor.add_" and add.inputs == ((3, 4), (3, 4)) and add.output == ((3, 4),)
    assert ops["::matmul"][0].output == ((3, 2),) and not ops["::matmul"][0].in_place
    assert json.loads(ops.to_json())["fc::linear"][0]["function"] == "F.linear"
    with pytest.raises(hookscope.RecordError, match="Did you mean '::add'"):
        ops["::ad"]


def test_every_name_listed_selects_that_operation() -> None:
    net = Residual()
    x = torch.randn(2, 4)
    names = list(hookscope.operations(net, x))
    with hookscope.capture(net, *names) as rec:
        net(x)
    assert list(rec) == names
    assert "forward" not in vars(net) and "forward" not in vars(net.fc)


def test_only_module_names_are_taken() -> None:
    with pytest.raises(HookscopeError, match="takes module names or globs"):
        hookscope.operations(Residual(), torch.ones(1, 4), layers=[nn.Linear])


def test_layers_ops_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layers", "--ops", "tiny", "layer1.0"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0::add" in out and "(in place)" in out and "1 operation call(s)" in out
    assert main(["layers", "--ops", "tiny", "*::add*", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["layer1.0::add", "layer1.1::add", "layer2.0::add"]
    assert main(["layers", "--ops", "--no-run", "tiny"]) == 2
    assert "cannot go with --no-run" in capsys.readouterr().err


def test_operations_on_the_command_line_of_trace_and_watch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "tiny", "--layers", "layer1.0::add", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["module"] for r in rows} == {"layer1.0::add"} and len(rows) == 3  # two inputs, one output
    assert main(["trace", "tiny", "--layers", "layer1.0::ad"]) == 2
    assert "'layer1.0::ad' never ran. Did you mean 'layer1.0::add'?" in capsys.readouterr().err
    assert main(["watch", "tiny", "--layers", "*::*"]) == 0
    out = capsys.readouterr().out
    assert "all finite" in out and "never ran" not in out and "matching" not in out


def test_layers_ops_with_an_operation_that_never_ran_is_one_line_with_the_closest(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layers", "--ops", "tiny", "*::ad"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'*::ad' matches no operation" in err and "Did you mean 'layer1.0::add'" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["layers", "--ops", "tiny", "layer1.0::add.1"]) == 2
    assert "Did you mean 'layer1.0::add'?" in capsys.readouterr().err
