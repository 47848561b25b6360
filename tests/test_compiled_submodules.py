"""Hooks inside a compiled submodule that has already run: true values or a clear error.

A submodule compiled in place (``model[1].compile()``) or wrapped (``model[1] = torch.compile(...)``)
keeps running the graphs Dynamo traced before any hook existed unless hookscope re-traces it; every
test compares with the same model run eagerly and ends with a check that no hook is left.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hookscope
from hookscope import HookscopeError
from hookscope.selection import layers, names

from helpers import no_hooks

HOW = ("in place", "wrapper")


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Counting:
    """A Dynamo backend that runs the captured graphs as they are and counts compiles and runs."""

    def __init__(self) -> None:
        self.compiles = 0
        self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        self.compiles += 1

        def run(*args):
            self.runs += 1
            return gm.forward(*args)

        return run


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's caches are per code object and every test compiles ``Inner.forward`` anew: start
    each test below the recompile limit, so that what is counted is this test's compiles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pair(how: str, backend="eager", *, no_grad: bool = False):
    """An eager model, its twin with submodule ``1`` compiled ``how`` and already run, and an input."""
    plain = nn.Sequential(nn.Linear(4, 4), Inner(), nn.Linear(4, 2)).eval()
    model = copy.deepcopy(plain)
    if how == "in place":
        model[1].compile(backend=backend)
    else:
        model[1] = torch.compile(model[1], backend=backend)
    x = torch.randn(3, 4)
    with torch.no_grad() if no_grad else torch.enable_grad():
        model(x)  # compiled now, without any hook
    return plain, model, x


def _entry(model: nn.Sequential):
    """The compiled entry of submodule ``1``, whichever way it was compiled."""
    sub = model[1]
    return sub.__dict__["forward"] if "forward" in sub.__dict__ else sub._compiled_call_impl


def _eager_values(plain: nn.Sequential, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        h0 = plain[0](x)
        a = plain[1].a(h0)
        b = plain[1].b(torch.relu(a))
        return {"0": h0, "1.a": a, "1.b": b, "1": b, "2": plain[2](b)}


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_capture_of_children_of_a_compiled_submodule_that_ran_records_eager_values(how):
    plain, model, x = _pair(how)
    with hookscope.capture(model, "1.a", "1.b", "1", "2") as rec:
        y = model(x)
    want = _eager_values(plain, x)
    assert list(rec) == ["1", "1.a", "1.b", "2"]
    for name in rec:
        assert len(rec[name].calls) == 1
        assert torch.allclose(rec[name].output, want[name], atol=1e-6), name
    assert torch.allclose(y, want["2"], atol=1e-6) and no_hooks(model)


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_edit_of_a_child_changes_the_output_exactly_as_on_the_eager_model(how):
    plain, model, x = _pair(how, no_grad=True)
    with torch.no_grad():
        before = model(x)
        with hookscope.edit(plain, "1.a", output=hookscope.scale(0.0)):
            expected = plain(x)
        with hookscope.edit(model, "1.a", output=hookscope.scale(0.0)) as e:
            edited = model(x)
    # 1.a zeroed: what is left is the biases of 1.b and 2
    assert torch.allclose(expected, plain[2](plain[1].b(torch.zeros(3, 4))), atol=1e-6)
    assert e.counts == {"1.a": 1}
    assert torch.allclose(edited, expected, atol=1e-6) and not torch.allclose(edited, before)
    assert no_hooks(model) and no_hooks(plain)


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_after_the_blocks_the_compiled_submodule_runs_its_own_graphs_again(how):
    backend = Counting()
    plain, model, x = _pair(how, backend)
    original = _entry(model)
    with hookscope.capture(model, "1.a"), hookscope.edit(model, "1.b", output=hookscope.scale(2.0)):
        model(x)
    compiles, runs = backend.compiles, backend.runs
    y = model(x)  # in the grad mode of the first run, so that its graphs' guards pass
    # the graphs compiled before any hook run again: no new compile, no hook, no edit
    assert backend.compiles == compiles and backend.runs > runs
    assert _entry(model) is original and no_hooks(model)
    assert torch.allclose(y.detach(), _eager_values(plain, x)["2"], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["in place", "wrapper"])
def test_diff_after_a_no_grad_first_run_reports_every_layer_ok(how):
    plain, model, x = _pair(how, "aot_eager", no_grad=True)
    d = hookscope.diff(plain, model, x)
    compared = {r.name for r in d.rows}
    assert {"0", "1", "1.a", "1.b", "2"} <= compared
    assert all(r.status == "ok" for r in d.rows), d.table()
    assert not d.unmatched.a_only and not d.unmatched.b_only
    assert no_hooks(model) and no_hooks(plain)


@pytest.mark.slow
def test_hooks_outside_a_compiled_submodule_do_not_recompile_it():
    backend = Counting()
    plain, model, x = _pair("in place", backend)
    compiles = backend.compiles
    with hookscope.capture(model, "0", "2") as rec:
        model(x)
    want = _eager_values(plain, x)
    assert backend.compiles == compiles  # nothing hooked inside it: its graphs stay valid
    assert torch.allclose(rec["0"].output, want["0"]) and torch.allclose(rec["2"].output, want["2"])
    assert no_hooks(model)


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_nested_blocks_inside_a_compiled_submodule_each_see_their_own_hooks(how):
    plain, model, x = _pair(how)
    with hookscope.capture(model, "1.a") as outer:
        with hookscope.capture(model, "1.b") as inner:
            model(x)
        model(x)  # the inner capture is gone: only the outer one records
    model(x)
    want = _eager_values(plain, x)
    assert len(outer["1.a"].calls) == 2 and len(inner["1.b"].calls) == 1
    assert all(torch.allclose(c.output, want["1.a"], atol=1e-6) for c in outer["1.a"].calls)
    assert torch.allclose(inner["1.b"].output, want["1.b"], atol=1e-6) and no_hooks(model)


@pytest.mark.slow
def test_blocks_past_dynamos_recompile_limit_still_give_true_values():
    backend = Counting()
    plain, model, x = _pair("in place", backend)
    original = _entry(model)
    for k in range(10):  # more than torch._dynamo.config's default limit of 8 graphs per code
        with torch.no_grad():
            with hookscope.edit(plain, "1.b", output=hookscope.scale(float(k))):
                expected = plain(x)
            with hookscope.edit(model, "1.b", output=hookscope.scale(float(k))):
                got = model(x)
        assert torch.allclose(got, expected, atol=1e-5), k
    runs = backend.runs
    model(x)
    assert backend.runs > runs and _entry(model) is original and no_hooks(model)


@pytest.mark.slow
def test_forward_replaced_by_a_compiled_function_sees_hooks_on_children():
    plain = nn.Sequential(nn.Linear(4, 4), Inner(), nn.Linear(4, 2)).eval()
    model = copy.deepcopy(plain)
    compiled_forward = torch.compile(model[1].forward, backend="eager")
    model[1].forward = compiled_forward
    x = torch.randn(3, 4)
    model(x)
    with hookscope.capture(model, "1.a") as rec:
        model(x)
    assert torch.allclose(rec["1.a"].output, _eager_values(plain, x)["1.a"], atol=1e-6)
    assert model[1].forward is compiled_forward and no_hooks(model)


@pytest.mark.slow
def test_inductor_compiled_submodule_edit_and_capture_match_eager():
    plain, model, x = _pair("in place", "inductor", no_grad=True)
    with torch.no_grad():
        with hookscope.edit(plain, "1.a", output=hookscope.scale(0.5)):
            expected = plain(x)
        with hookscope.capture(model, "1.a") as rec:
            with hookscope.edit(model, "1.b", output=hookscope.scale(3.0)):
                model(x)
        with hookscope.edit(model, "1.a", output=hookscope.scale(0.5)):
            edited = model(x)
    want = _eager_values(plain, x)
    assert torch.allclose(rec["1.a"].output, want["1.a"], atol=1e-5)
    assert torch.allclose(edited, expected, atol=1e-5) and no_hooks(model)


def test_selection_sees_through_a_compile_wrapper_at_any_depth():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(Inner()))
    inner = model[1][0]
    model[1][0] = torch.compile(inner)  # lazy: nothing is compiled until it is called
    assert names(model) == ["0", "1", "1.0", "1.0.a", "1.0.b"]
    chosen = layers(model, "1.0.a", "1.0._orig_mod.b", Inner, model[1][0])
    assert chosen == [("1.0", inner), ("1.0.a", inner.a), ("1.0.b", inner.b)]
    assert hookscope.unwrap(torch.compile(model))[1] == "_orig_mod."
    with pytest.raises(HookscopeError, match=r"'1\.0\.a'") as err:
        layers(model, "1.0.c")
    assert "_orig_mod" not in str(err.value)


@pytest.mark.slow
def test_records_of_a_wrapped_submodule_are_keyed_by_unwrapped_names():
    plain, model, x = _pair("wrapper")
    with hookscope.capture(model, "1._orig_mod.a") as rec:
        model(x)
    assert list(rec) == ["1.a"]
    assert rec["1._orig_mod.a"] is rec["1.a"]
    assert torch.allclose(rec["1.a"].output, _eager_values(plain, x)["1.a"], atol=1e-6)


def test_an_unreachable_compile_context_is_a_one_line_error_before_the_forward():
    model = nn.Sequential(nn.Linear(4, 4), Inner())
    ran = []

    def not_dynamo(*args, **kwargs):  # looks compiled to hookscope, but no Dynamo context is reachable
        ran.append(1)
        return model[1]._call_impl(*args, **kwargs)

    model[1]._compiled_call_impl = not_dynamo
    with pytest.raises(HookscopeError) as err:
        with hookscope.capture(model, "1.a"):
            model(torch.randn(1, 4))
    assert "\n" not in str(err.value) and "Inner" in str(err.value)
    assert not ran and no_hooks(model)
