"""hookscope.monitor: every number it logs against a hand computation from plain hooks in the same run,
the hooks present only on sampled steps, the schedule, flat memory, and one-line errors."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.monitor import Schedule, Writer, histogram, scalars
from hookscope.core import hook_count

from helpers import no_hooks


class Steps(Writer):
    """A writer that keeps every step it is handed (the tests' own record of what was written)."""

    def __init__(self) -> None:
        self.seen: list[hookscope.Telemetry] = []
        self.closed = False

    def write(self, telemetry: hookscope.Telemetry) -> None:
        self.seen.append(telemetry)

    def close(self) -> None:
        self.closed = True


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        net[0].bias[:3] = -50.0  # three units below zero for every input: dead after the ReLU
    return net


class Plain:
    """Plain forward hooks and tensor hooks, written here, keeping the tensors of the step."""

    def __init__(self, net: nn.Module, names: list[str]) -> None:
        self.seen: dict[str, dict[str, list[torch.Tensor]]] = {}
        self.handles = [net.get_submodule(n).register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            kept = self.seen.setdefault(name, {"input": [], "output": [], "grad_output": []})
            kept["input"].append(args[0].detach().clone())
            kept["output"].append(output.detach().clone())
            output.register_hook(lambda g: kept["grad_output"].append(g.detach().clone()))
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _stats(t: torch.Tensor) -> dict[str, float]:
    t = t.double()
    return {"mean": t.mean().item(), "std": t.std(correction=0).item(), "min": t.min().item(), "max": t.max().item(),
            "rms": t.pow(2).mean().sqrt().item(), "zeros": (t == 0).double().mean().item(), "nan": 0, "inf": 0}


def _close(row: hookscope.TelemetryRow, want: dict[str, float]) -> None:
    for k, v in want.items():
        got = getattr(row, k)
        assert got == pytest.approx(v, rel=1e-5, abs=1e-7), (row.layer, row.what, k, got, v)


def test_every_logged_statistic_equals_a_hand_computation_from_plain_hooks():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(6, 4), torch.randn(6, 3)
    names = ["0", "1", "2"]
    steps = Steps()
    checked = 0
    with hookscope.monitor(net, every=4, optimizer=opt, log=steps) as mon:
        for step in range(10):
            plain = Plain(net, names)
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            mon.note(loss=loss)
            before = {n: p.detach().clone() for n, p in net.named_parameters()}
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
            lr = opt.param_groups[0]["lr"]
            opt.step()
            plain.remove()
            if step % 4:
                continue
            t = mon.last
            assert t.step == step and steps.seen[-1] is t
            assert t.rows[0].what == "step" and t.rows[0].loss == pytest.approx(loss.item()) and t.rows[0].lr == lr
            for n in names:
                rows = {r.what: r for r in t[n] if r.what != "param"}
                for what in ("input", "output", "grad_output"):
                    _close(rows[what], _stats(plain.seen[n][what][0]))
                    assert rows[what].numel == plain.seen[n][what][0].numel() and rows[what].calls == 1
                out = plain.seen[n]["output"][0]
                assert rows["output"].dead == pytest.approx((out == 0).all(dim=0).double().mean().item())
            assert t["1"][1].dead >= 3 / 8  # at least the three units biased far below zero
            for r in (r for r in t.rows if r.what == "param"):
                full = f"{r.layer}.{r.path}"
                after = dict(net.named_parameters())[full].detach()
                _close(r, {**_stats(grads[full]), "norm": before[full].norm().item(),
                           "grad_norm": grads[full].norm().item(),
                           "update_norm": (after - before[full]).norm().item(),
                           "update_ratio": ((after - before[full]).norm() / before[full].norm()).item()})
                checked += 1
            assert no_hooks(net)  # the sampled step's hooks went as it ended
    assert checked == 3 * 4 and [s.step for s in steps.seen] == [0, 4, 8] and steps.closed
    assert no_hooks(net)


def test_scalars_are_grouped_by_statistic_then_layer_and_agree_with_the_rows():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=1, optimizer=opt) as mon:
        opt.zero_grad()
        loss = net(torch.randn(5, 4)).pow(2).mean()
        loss.backward()
        mon.note(loss=loss)
        opt.step()
    found = scalars(mon.last)
    weight, bias = (r for r in mon.last["0"] if r.what == "param")
    assert found["grad_norm/0"] == pytest.approx(math.hypot(weight.grad_norm, bias.grad_norm))
    assert found["param_norm/0"] == pytest.approx(math.hypot(weight.norm, bias.norm))
    assert found["update_ratio/0"] == pytest.approx(math.hypot(weight.update_norm, bias.update_norm)
                                                    / math.hypot(weight.norm, bias.norm))
    assert found["dead/1"] == mon.last["1"][1].dead >= 3 / 8 and found["loss"] == pytest.approx(loss.item())
    assert found["output_mean/2"] == mon.last["2"][1].mean and "grad_norm/1" not in found  # a ReLU has no parameters
    assert mon.last.scalar("grad_norm/2") == found["grad_norm/2"]
    with pytest.raises(KeyError, match="grad_norm/2"):
        mon.last.scalar("grad_norm/3")


def test_between_sampled_steps_the_model_holds_no_hook():
    net = _net()
    opt = torch.optim.Adam(net.parameters())
    counts = []
    with hookscope.monitor(net, every=5, steps=[7], optimizer=opt) as mon:
        for step in range(12):
            counts.append((mon.step_number, mon.sampled(), hook_count(net)))
            opt.zero_grad()
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
    assert [s for s, sampled, _ in counts if sampled] == [0, 5, 7, 10]
    assert all((n > 0) == sampled for _, sampled, n in counts), counts
    assert no_hooks(net) and not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


@pytest.mark.parametrize(("every", "steps", "want"), [
    (4, None, [0, 4, 8]),
    (None, range(3), [0, 1, 2]),  # the first three
    (5, [1, 2, 11], [0, 1, 2, 5, 10, 11]),
    (None, lambda n: n % 3 == 2, [2, 5, 8, 11]),
])
def test_sampled_steps_follow_every_and_steps(every, steps, want):
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    seen = Steps()
    with hookscope.monitor(net, every=every, steps=steps, optimizer=opt, log=[seen]):
        for _ in range(12):
            net(torch.randn(1, 4)).sum().backward()
            opt.step()
    assert [t.step for t in seen.seen] == want
    assert Schedule(every, steps).sampled(want[-1])


def test_calls_of_a_layer_in_one_step_are_merged_as_if_one_tensor():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    with hookscope.monitor(net, "0", every=1, optimizer=opt) as mon:
        opt.zero_grad()
        (net(a).sum() + net(b).sum()).backward()  # two micro-batches, one step
        opt.step()
    rows = {r.what: r for r in mon.last["0"] if r.what != "param"}
    _close(rows["input"], _stats(torch.cat([a, b])))
    assert rows["output"].calls == 2 and rows["output"].numel == 8 * 8


def test_without_an_optimizer_mon_step_ends_the_step_and_measures_the_manual_update():
    net = _net()
    with hookscope.monitor(net, "2", every=2) as mon:
        for step in range(3):
            net.zero_grad()
            loss = net(torch.randn(4, 4)).pow(2).mean()
            loss.backward()
            before = net[2].weight.detach().clone()
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.1 * p.grad
            mon.step(loss=loss, lr=0.1)
            if step == 2:
                w = next(r for r in mon.last["2"] if r.path == "weight")
                assert w.update_ratio == pytest.approx(((net[2].weight - before).norm() / before.norm()).item(), rel=1e-5)
                assert mon.last.rows[0].lr == 0.1 and mon.last.rows[0].loss == pytest.approx(loss.item())
    assert mon.last.step == 2 and no_hooks(net)


def test_histograms_count_every_value_as_torch_histc_plus_the_non_finite_ones():
    x = torch.tensor([0.5, -2.0, 3.0, float("nan"), float("inf"), float("-inf"), float("inf"), 1.0, 1.0])
    edges, counts, nan, posinf, neginf, below, above = histogram(x, 4)
    finite = x[torch.isfinite(x)]
    assert counts == torch.histc(finite, 4, min=-2.0, max=3.0).long().tolist()
    assert (nan, posinf, neginf, below, above) == (1, 2, 1, 0, 0) and sum(counts) + 4 == x.numel()
    assert edges == pytest.approx([-2.0, -0.75, 0.5, 1.75, 3.0])
    fixed = histogram(x, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    assert fixed[1:] == ([1, 2], 1, 2, 1, 1, 1)  # [0,1): 0.5; [1,2]: 1, 1; below: -2; above: 3


class Plant(nn.Module):
    """Writes NaN, +Inf and -Inf into its output (with a gradient that stays finite)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        marks = torch.zeros_like(x)
        marks[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
        return x + marks.detach()


def test_a_sampled_step_histograms_the_outputs_with_nan_and_inf_counted():
    net = nn.Sequential(nn.Linear(4, 6), Plant(), nn.Linear(6, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    plain = Plain(net, ["1"])
    with hookscope.monitor(net, every=1, optimizer=opt, histograms=5, nonfinite="log") as mon:
        opt.zero_grad()
        net(torch.randn(3, 4)).sum().backward()
        opt.step()
    plain.remove()
    out = plain.seen["1"]["output"][0]
    finite = out[torch.isfinite(out)]
    hist = next(h for h in mon.last.histograms if h.layer == "1" and h.of == "output")
    assert hist.counts == torch.histc(finite, 5, min=finite.min().item(), max=finite.max().item()).long().tolist()
    assert (hist.nan, hist.posinf, hist.neginf) == (1, 1, 1) and hist.total == out.numel() == 18
    row = next(r for r in mon.last["1"] if r.what == "output")
    assert (row.nan, row.inf) == (1, 2) and math.isnan(row.mean)
    assert mon.flagged == 1 and mon.nonfinite.module == "1" and mon.nonfinite.phase == "forward"  # named on a sampled step
    assert no_hooks(net)


def _size(obj: Any, seen: set[int] | None = None) -> int:
    """Containers and their items, deeply, as the monitor's own state holds them (tensors by their bytes)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (nn.Module, torch.optim.Optimizer, type)) or callable(obj) and not isinstance(obj, Writer):
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(_size(k, seen) + _size(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(_size(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return size + _size(vars(obj), seen)
    return size


def test_the_monitor_keeps_bounded_state_over_many_steps():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    sizes = {}
    x = torch.randn(2, 2)
    with hookscope.monitor(net, every=10, optimizer=opt, nonfinite="log") as mon:
        for step in range(2000):
            opt.zero_grad()
            loss = net(x).sum()
            loss.backward()
            mon.note(loss=loss)
            opt.step()
            if step in (199, 1999):  # just after a sampled step's end: its rows are the last kept
                sizes[step] = _size(mon)
    assert sizes[1999] == sizes[199] and len(mon.last.rows) == 1 + 3 * 2 + 2


@pytest.mark.parametrize(("call", "words"), [
    (lambda net, opt, tmp: hookscope.monitor(net, "layer9"), "layer9"),
    (lambda net, opt, tmp: hookscope.monitor(net, every=0), "every=0"),
    (lambda net, opt, tmp: hookscope.monitor(net, every=None), "every=None and steps=None"),
    (lambda net, opt, tmp: hookscope.monitor(net, steps=[-1]), "steps="),
    (lambda net, opt, tmp: hookscope.monitor(net, log=tmp / "file.txt"), "is a file, not a folder"),
    (lambda net, opt, tmp: hookscope.monitor(net, optimizer=object()), "cannot be hooked"),
    (lambda net, opt, tmp: hookscope.monitor(net, optimizer=torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1)),
     "holds none of"),
    (lambda net, opt, tmp: hookscope.monitor(net, stats=["outputs"]), "Did you mean 'output'"),
    (lambda net, opt, tmp: hookscope.monitor(net, nonfinite="rasie"), "Did you mean 'raise'"),
    (lambda net, opt, tmp: hookscope.monitor(net, nonfinite="skip"), "needs optimizer="),
    (lambda net, opt, tmp: hookscope.monitor(net, histograms=0), "histograms=0"),
    (lambda net, opt, tmp: hookscope.monitor(net, histograms=[1, 0]), "increasing"),
    (lambda net, opt, tmp: hookscope.monitor(net, replay=3), "replay="),
    (lambda net, opt, tmp: hookscope.monitor(net, log=3), "log= takes a folder or writers"),
])
def test_bad_input_is_refused_in_one_line_naming_the_fix(tmp_path, call, words):
    net = _net()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(hookscope.HookscopeError) as e:
        call(net, torch.optim.SGD(net.parameters(), lr=1), tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)


def test_two_monitors_on_one_model_are_refused_and_the_first_goes_on():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=1, optimizer=opt) as mon:
        with pytest.raises(hookscope.HookscopeError, match="already has a monitor running") as e:
            with hookscope.monitor(net, "0", every=1):
                pass
        assert "\n" not in str(e.value)
        net(torch.ones(1, 4)).sum().backward()
        opt.step()
    assert mon.last.step == 0 and no_hooks(net)
    with hookscope.monitor(net, every=1) as again:  # the first one's block ended: a new one may start
        again.step()
    with pytest.raises(hookscope.HookscopeError, match="already run"):
        again.__enter__()


def test_a_misused_step_call_is_refused_in_one_line():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mon = hookscope.monitor(net, optimizer=opt)
    with pytest.raises(hookscope.HookscopeError, match="inside"):
        mon.step()
    with mon, pytest.raises(hookscope.HookscopeError, match="counts the optimizer's steps"):
        mon.step()
    assert no_hooks(net)


def test_a_writer_whose_extra_is_missing_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(hookscope.HookscopeError, match=r"pip install 'hookscope\[tensorboard\]'") as e:
        hookscope.TensorBoardWriter(tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(hookscope.HookscopeError, match=r"pip install 'hookscope\[wandb\]'"):
        hookscope.WandbWriter(dir=tmp_path)


def test_an_error_in_the_loop_removes_every_hook_and_closes_the_writers():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = Steps()
    with pytest.raises(RuntimeError, match="shapes"):
        with hookscope.monitor(net, every=1, optimizer=opt, log=seen):
            net(torch.ones(1, 5))
    assert no_hooks(net) and seen.closed and not opt._optimizer_step_pre_hooks


def test_a_validation_pass_under_paused_leaves_no_rows_in_the_next_sampled_step():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, val = torch.randn(4, 4), torch.randn(100, 4)
    with hookscope.monitor(net, "0", every=2, optimizer=opt) as mon:
        for _ in range(3):
            with mon.paused(), torch.no_grad():
                net(val)  # between steps: step 2 is sampled and its hooks are on
            opt.zero_grad()
            net(x).sum().backward()
            opt.step()
    rows = {r.what: r for r in mon.last["0"] if r.what != "param"}
    assert mon.last.step == 2 and rows["input"].numel == 4 * 4 and rows["output"].calls == 1
    _close(rows["input"], _stats(x))


def test_an_optimizer_step_with_a_closure_is_checked_after_the_closure_ran():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 4)
    grads = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = net(x).pow(2).mean()
        loss.backward()
        grads.append(net[2].weight.grad.clone())
        return loss

    with hookscope.monitor(net, every=1, optimizer=opt, nonfinite="log") as mon:
        for step in range(3):
            loss = opt.step(closure)
            weight = next(r for r in mon.last["2"] if r.path == "weight")
            assert weight.grad_norm == pytest.approx(grads[-1].norm().item(), rel=1e-5)
            assert mon.last.rows[0].loss == pytest.approx(loss.item())  # the closure's loss, noted by itself
        x[0, 0] = float("nan")
        opt.step(closure=closure)
    assert mon.flagged == 1 and mon.nonfinite.step == 3 and mon.nonfinite.module == "0"
    assert no_hooks(net)


def test_a_layer_with_several_outputs_names_its_first_without_a_path_and_the_rest_with_one():
    class Rnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.fc = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(x)
            return self.fc(out[:, -1])

    net = Rnn()
    opt = torch.optim.Adam(net.parameters())
    with hookscope.monitor(net, every=1, optimizer=opt) as mon:
        net(torch.randn(2, 5, 3)).sum().backward()
        opt.step()
    found = scalars(mon.last)
    paths = [r.path for r in mon.last["lstm"] if r.what == "output"]
    assert paths == ["output[0]", "output[1][0]", "output[1][1]"]
    assert found["output_mean/lstm"] == mon.last["lstm"][1].mean and "output_mean/lstm/output[1][0]" in found
    assert "dead/lstm" in found and "grad_norm/lstm" in found and no_hooks(net)


def test_before_and_after_update_split_a_step_for_a_trainer_that_steps_by_itself():
    net = _net()
    with hookscope.monitor(net, "2", every=1) as mon:
        net(torch.randn(3, 4)).sum().backward()
        with torch.no_grad():
            net[2].weight.clamp_(-0.1, 0.1)  # a change before the update: not part of it
        mon.before_update()
        before = net[2].weight.detach().clone()
        with torch.no_grad():
            net[2].weight -= 0.5 * net[2].weight.grad
        mon.after_update()
    w = next(r for r in mon.last["2"] if r.path == "weight")
    assert w.update_ratio == pytest.approx(((net[2].weight - before).norm() / before.norm()).item(), rel=1e-5)
    assert mon.step_number == 1 and no_hooks(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, optimizer=opt) as mon, pytest.raises(hookscope.HookscopeError, match="before_update"):
        mon.before_update()


def test_an_empty_batch_on_a_sampled_step_gives_rows_and_no_dead_fraction():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=1, optimizer=opt, histograms=3) as mon:
        net(torch.zeros(0, 4)).sum().backward()
        opt.step()
    out = next(r for r in mon.last["1"] if r.what == "output")
    assert out.numel == 0 and out.dead is None and math.isnan(out.mean)
    assert all(h.total == 0 for h in mon.last.histograms if h.of == "output") and no_hooks(net)


def test_a_loss_of_many_numbers_is_refused_in_one_line():
    net = _net()
    with hookscope.monitor(net) as mon, pytest.raises(hookscope.HookscopeError, match=r"loss.mean\(\)") as e:
        mon.note(loss=torch.ones(3))
    assert "\n" not in str(e.value) and no_hooks(net)


def _alive_by_mask(t: torch.Tensor) -> torch.Tensor:
    """The definition: a unit is alive if some value of it is not 0 (channels of 4-D/5-D, else the last dim)."""
    axis = 1 if t.dim() in (4, 5) else t.dim() - 1
    return t.movedim(axis, 0).reshape(t.shape[axis], -1).ne(0).any(dim=1)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "2-D", "5-D", "sliced", "1-D"])
@pytest.mark.parametrize("told", [False, True])
def test_alive_units_equal_the_mask_of_nonzeros_whatever_the_layout_and_the_statistics_told(layout, told):
    from hookscope.analysis._reduce import tensor_stats
    from hookscope.analysis.monitor._probe import alive_units

    torch.manual_seed(3)
    shape = {"2-D": (5, 7), "5-D": (2, 4, 3, 2, 2), "1-D": (9,)}.get(layout, (3, 6, 4, 5))
    for kind in ("relu", "mixed", "zeros", "nonzero"):
        t = torch.randn(shape)
        t = {"relu": t.relu(), "mixed": t * (t.abs() > 0.8), "zeros": t * 0, "nonzero": t.abs() + 1}[kind]
        if t.dim() > 1:
            t.select(1 if t.dim() in (4, 5) else t.dim() - 1, 0).zero_()  # one unit dead everywhere
            if kind == "mixed":
                t.select(1 if t.dim() in (4, 5) else t.dim() - 1, 1).mul_(0).add_(-0.0)  # -0.0 is 0 too
        if layout == "channels_last":
            t = t.contiguous(memory_format=torch.channels_last)
        if layout == "sliced":
            t = torch.cat([t, t], dim=3)[..., ::2]
        stats = tensor_stats(t) if told else None
        assert torch.equal(alive_units(t, stats), _alive_by_mask(t)), (kind, layout)
    nan = torch.zeros(shape)
    nan.view(-1)[-1] = float("nan")  # a NaN is not 0: its unit is alive
    assert torch.equal(alive_units(nan, tensor_stats(nan) if told else None), _alive_by_mask(nan))


class _Odd(nn.Module):
    """Parameters of every layout the parameter side meets: float64, a transposed (non-contiguous)
    one, a channels-last convolution weight, one shared by two layers, and one left untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.wide = nn.Linear(4, 4).double()
        self.turned = nn.Linear(4, 4)
        self.turned.weight = nn.Parameter(torch.randn(4, 4).t())  # a transposed view: not contiguous
        self.tied = nn.Linear(4, 4)
        self.again = nn.Linear(4, 4)
        self.again.weight = self.tied.weight
        self.frozen = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.to(memory_format=torch.channels_last)).mean((2, 3))
        h = self.wide(h.double()).float()
        return self.again(self.tied(self.turned(h))).sum() + 0 * self.frozen.bias.sum()


@pytest.mark.parametrize("native", ["1", "0"])
def test_norms_and_update_ratios_of_every_parameter_layout_equal_the_hand_computed_ones(monkeypatch, native):
    monkeypatch.setenv("HOOKSCOPE_NATIVE", native)  # the C kernel's one-pass copy and difference, and torch's
    torch.manual_seed(0)
    net = _Odd()
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    x = torch.randn(2, 3, 6, 6)
    with hookscope.monitor(net, every=1, optimizer=opt, stats=["params", "update"]) as mon:
        for _ in range(3):
            opt.zero_grad()
            net(x).backward()
            before = {n: p.detach().clone().double() for n, p in net.named_parameters()}
            opt.step()
            rows = {(r.layer, r.path): r for r in mon.last.rows if r.what == "param"}
            for (layer, path), r in rows.items():
                name = f"{layer}.{path}" if f"{layer}.{path}" in before else f"tied.{path}"
                w0, w1 = before[name], dict(net.named_parameters())[name].detach().double()
                assert r.norm == pytest.approx(w0.norm().item(), rel=1e-6)
                assert r.update_norm == pytest.approx((w1 - w0).norm().item(), rel=1e-5, abs=1e-7)
                assert r.update_ratio == pytest.approx(((w1 - w0).norm() / w0.norm()).item(), rel=1e-5, abs=1e-7)
    assert rows[("again", "weight")].update_norm == rows[("tied", "weight")].update_norm > 0
    assert rows[("frozen", "weight")].update_norm == 0.0 and rows[("turned", "weight")].update_norm > 0
