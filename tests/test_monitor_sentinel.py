"""The monitor's non-finite sentinel: a NaN planted at step 37 is reported at step 37 in the module that
made it (forward and backward), and raise / skip / log do what they say."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.monitor import scalars
from hookscope.errors import NonFiniteStepError

from helpers import no_hooks

AT = 37


class Log(nn.Module):
    """``log(x)``: NaN where the batch holds a negative value (the forward case)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Root(nn.Module):
    """``sqrt(|x|)``: finite forward, NaN gradient where ``x`` is exactly 0 (the backward case)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x.abs())


def _batches(kind: str, n: int = 45) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(n):
        x, y = torch.rand(8, 4, generator=g) + 0.5, torch.randn(8, 1, generator=g)
        if step == AT:
            x = x.clone()
            if kind == "forward":
                x[3, 2] = -1.0
            else:
                x[:] = 0.0
        out.append((x, y))
    return out


def _net(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "forward":
        return nn.Sequential(Log(), nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    return nn.Sequential(nn.Linear(4, 6, bias=False), Root(), nn.Linear(6, 1))


def _train(net: nn.Module, opt: torch.optim.Optimizer, mon: hookscope.Monitor | None, kind: str,
           watch: list[int] | None = None) -> None:
    x = y = torch.empty(0)

    def loss_fn() -> torch.Tensor:
        return nn.functional.mse_loss(net(x), y)

    if mon is not None:
        mon.replay = loss_fn  # the late-binding closure sees each step's batch
    for step, (x, y) in enumerate(_batches(kind)):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        if mon is not None:
            mon.note(loss=loss)
        opt.step()
        if watch is not None and not mon.sampled():
            watch.append(hookscope.core.hook_count(net))


@pytest.mark.parametrize(("kind", "module", "phase", "which"), [
    ("forward", "0", "forward", "output"),      # log of a negative value, in Log
    ("backward", "1", "backward", "grad_input"),  # sqrt's gradient at 0, sent back by Root
])
def test_a_nan_planted_at_step_37_is_reported_at_step_37_in_the_module_that_made_it(kind, module, phase, which):
    net = _net(kind)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    hooks: list[int] = []
    with pytest.raises(hookscope.NonFiniteError) as e:
        with hookscope.monitor(net, every=10, optimizer=opt) as mon:
            _train(net, opt, mon, kind, hooks)
    err = e.value
    assert isinstance(err, NonFiniteStepError) and err.step == AT == mon.nonfinite.step
    assert (err.row.module, err.row.phase, err.row.which) == (module, phase, which), err
    assert f"step {AT}" in str(err) and repr(module) in str(err) and "\n" not in str(err)
    assert set(hooks) == {0} and len(hooks) == AT - 3  # no hook between sampled steps (0, 10, 20, 30 were)
    assert no_hooks(net)


def test_raise_leaves_the_weights_as_they_were_before_the_bad_step():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    twin, twin_opt = copy.deepcopy(net), None
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    with pytest.raises(hookscope.NonFiniteError):
        with hookscope.monitor(net, every=10, optimizer=opt) as mon:
            _train(net, opt, mon, "forward")
    for x, y in _batches("forward")[:AT]:
        twin_opt.zero_grad()
        nn.functional.mse_loss(twin(x), y).backward()
        twin_opt.step()
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_skip_leaves_weights_and_momentum_untouched_and_goes_on():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    seen: dict[str, list[torch.Tensor]] = {}

    def snap(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        step = len(seen.get("w", []))
        seen.setdefault("w", []).append([p.detach().clone() for p in net.parameters()])
        seen.setdefault("m", []).append([opt.state[p]["momentum_buffer"].clone() if p in opt.state else None
                                         for p in net.parameters()])
        del step

    handle = opt.register_step_post_hook(snap)
    with hookscope.monitor(net, every=10, optimizer=opt, nonfinite="skip") as mon:
        _train(net, opt, mon, "forward")
    handle.remove()
    before, after = seen["w"][AT - 1], seen["w"][AT]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.equal(a, b) for a, b in zip(seen["m"][AT - 1], seen["m"][AT]))  # momentum untouched
    assert not all(torch.equal(a, b) for a, b in zip(seen["w"][AT], seen["w"][AT + 1]))  # training went on
    assert mon.flagged == 1 and mon.nonfinite.step == AT and mon.nonfinite.module == "0"
    assert all(torch.isfinite(p).all() for p in net.parameters()) and no_hooks(net)


def test_log_records_the_step_writes_it_and_goes_on():
    net = _net("backward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    written: list[hookscope.Telemetry] = []

    class Keep(hookscope.Writer):
        def write(self, telemetry: hookscope.Telemetry) -> None:
            written.append(telemetry)

    with hookscope.monitor(net, every=10, optimizer=opt, nonfinite="log", log=Keep()) as mon:
        _train(net, opt, mon, "backward")
    # the weights are NaN from then on: every later step is flagged too
    assert [t.step for t in written] == [0, 10, 20, 30, *range(AT, 45)]
    assert mon.flagged == 45 - AT and mon.nonfinite.step == AT and mon.last_nonfinite.step == 44
    flagged = written[4]
    row = next(r for r in flagged.rows if r.what == "nonfinite")
    assert row.layer == "1" and row.path == "backward grad_input input[0]" and f"step {AT}" in row.note
    assert flagged.rows[0].what == "step" and flagged.scalar("nonfinite") == 1.0
    assert mon.last.step == 40 and mon.step_number == 45 and written[-4].step == 41 and no_hooks(net)


def test_the_replay_puts_back_the_random_stream_gradients_and_buffers():
    def run(monitored: bool) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        net = nn.Sequential(Log(), nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        mon = hookscope.monitor(net, every=1000, optimizer=opt, nonfinite="log") if monitored else None
        grads = []

        def keep(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
            grads.append(net[1].weight.grad.clone())

        opt.register_step_pre_hook(keep)
        if mon is not None:
            with mon:
                _train(net, opt, mon, "forward")
            assert mon.nonfinite.step == AT and mon.nonfinite.module == "0" and mon.nonfinite.replayed
        else:
            _train(net, opt, None, "forward")
        return grads, net[2].running_mean.clone(), torch.rand(3)

    (g1, mean1, r1), (g2, mean2, r2) = run(True), run(False)
    assert len(g1) == len(g2) and all(torch.equal(a, b, ) or (a.isnan().any() and b.isnan().any()) for a, b in zip(g1, g2))
    assert torch.equal(r1, r2)  # the caller's random stream as if no replay ran
    assert torch.equal(mean1.nan_to_num(), mean2.nan_to_num())


def test_without_replay_the_step_and_the_bad_gradients_are_named():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with pytest.raises(hookscope.NonFiniteError, match=f"step {AT}: the loss and gradients are not finite") as e:
        with hookscope.monitor(net, every=10, optimizer=opt) as mon:
            for x, y in _batches("forward"):
                opt.zero_grad()
                loss = nn.functional.mse_loss(net(x), y)
                loss.backward()
                mon.note(loss=loss)
                opt.step()
    assert "1.weight" in str(e.value) and "pass replay=" in str(e.value) and e.value.row is None
    assert no_hooks(net)


def test_on_a_sampled_step_the_module_is_named_without_a_replay():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with pytest.raises(hookscope.NonFiniteError) as e:
        with hookscope.monitor(net, every=10, steps=[AT], optimizer=opt):
            for x, y in _batches("forward"):
                opt.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()
                opt.step()
    assert e.value.step == AT and e.value.row.module == "0" and e.value.row.which == "output"


def test_the_sentinel_sees_a_non_finite_loss_noted_without_a_bad_gradient():
    net = nn.Sequential(nn.Linear(2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with hookscope.monitor(net, every=100, optimizer=opt, nonfinite="log") as mon:
        for step in range(3):
            opt.zero_grad()
            net(torch.ones(1, 2)).sum().backward()
            mon.note(loss=float("inf") if step == 1 else 1.0)
            opt.step()
    assert mon.flagged == 1 and mon.nonfinite.step == 1 and mon.nonfinite.found == ("loss",)


def test_a_half_precision_gradient_whose_norm_overflows_is_not_flagged():
    net = nn.Linear(4, 1).half()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with hookscope.monitor(net, every=100, optimizer=opt) as mon:
        for p in net.parameters():
            p.grad = torch.full_like(p, 60000.0)  # each finite; the norm of the weight's is past 65504
        opt.step()
    assert mon.flagged == 0 and mon.step_number == 1


@pytest.mark.parametrize("name, grads, finite", [
    ("float32 values whose sum overflows", [torch.full((4,), 3e38), torch.full((2,), 3e38)], True),
    ("+inf and -inf that would cancel", [torch.tensor([float("inf"), 1.0]), torch.tensor([float("-inf")])], False),
    ("a NaN in a complex gradient's imaginary part", [torch.tensor([1 + 0j, complex(0.0, float("nan"))])], False),
    ("a NaN among half-precision gradients", [torch.ones(8, dtype=torch.bfloat16), torch.tensor([1.0, float("nan")]).half()], False),
    ("half precision summing past 65504", [torch.full((1000,), 600.0, dtype=torch.float16)], True),
    ("float64 beside float32", [torch.ones(3, dtype=torch.float64), torch.full((2,), 1e300, dtype=torch.float64)], True),
    ("one Inf among a million", [torch.zeros(1_000_000).index_fill_(0, torch.tensor([777_777]), float("inf"))], False),
])
def test_the_sentinel_check_is_exact_where_a_sum_could_mislead(name, grads, finite):
    from hookscope.analysis.monitor._params import all_finite

    assert all_finite(grads, None) is finite, name
    assert all_finite(grads, torch.tensor(float("nan"))) is False


def test_nonfinite_off_reads_no_gradient_between_sampled_steps_and_flags_nothing(monkeypatch):
    from hookscope.analysis.monitor import _monitor

    reads = []
    real = _monitor.all_finite
    monkeypatch.setattr(_monitor, "all_finite", lambda grads, loss: reads.append(len(grads)) or real(grads, loss))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    fresh = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with hookscope.monitor(net, every=4, optimizer=opt, nonfinite="off") as mon:
        for step in range(6):
            opt.zero_grad()
            x = torch.tensor([[float("nan"), 1.0]]) if step in (3, 4) else torch.ones(1, 2)
            loss = net(x).sum()
            loss.backward()
            mon.note(loss=loss)
            opt.step()  # step 3 (not sampled) and step 4 (sampled): NaN everywhere, and no error
    assert reads == [] and mon.flagged == 0 and mon.nonfinite is None and mon.step_number == 6
    assert mon.last.step == 4
    grads = [r for r in mon.last.rows if r.what == "param" and r.path == "weight"]
    assert len(grads) == 2 and all(r.nan > 0 for r in grads)  # the sampled step's rows still count them
    opt = torch.optim.SGD(fresh.parameters(), lr=0.0)
    with hookscope.monitor(fresh, every=4, optimizer=opt) as mon:  # the default reads every step
        for _ in range(3):
            opt.zero_grad()
            fresh(torch.ones(1, 2)).sum().backward()
            opt.step()
    assert reads == [0, 4, 4]  # step 0, sampled, counted the 4 gradients' NaN itself: only its loss is read


def test_a_replay_that_raises_is_said_and_the_step_still_flagged():
    net = nn.Sequential(nn.Linear(2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def replay() -> torch.Tensor:
        raise ValueError("no batch here")

    with hookscope.monitor(net, every=100, steps=[], optimizer=opt, nonfinite="log", replay=replay) as mon:
        opt.step()  # step 0, sampled
        net(torch.tensor([[float("nan"), 1.0]])).sum().backward()
        opt.step()
    assert mon.nonfinite.step == 1 and mon.nonfinite.replay_error == "ValueError: no batch here"
    assert "the replay= function raised ValueError: no batch here" in mon.nonfinite.describe()
    assert no_hooks(net)


def test_a_non_finite_model_input_names_the_first_layer_that_outputs_it():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=1, optimizer=opt, nonfinite="log") as mon:
        net(torch.tensor([[float("inf"), 1.0]])).sum().backward()
        opt.step()
    assert (mon.nonfinite.module, mon.nonfinite.which) == ("0", "output")


def test_sparse_gradients_are_checked_and_described_by_their_stored_values():
    net = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookscope.monitor(net, every=1, optimizer=opt, histograms=4, nonfinite="log") as mon:
        net(torch.tensor([[1, 2, 2]])).sum().backward()
        grad = net[0].weight.grad.coalesce()
        opt.step()
        assert mon.flagged == 0
        row = next(r for r in mon.last["0"] if r.what == "param")
        assert row.grad_norm == pytest.approx(grad.values().norm().item()) and row.numel == 30
        net[0].weight.grad = None
        with torch.no_grad():
            net[1].weight[0, 0] = float("nan")
        net(torch.tensor([[3]])).sum().backward()
        opt.step()
    assert mon.flagged == 1 and no_hooks(net)


@pytest.mark.parametrize("make", [lambda ps: torch.optim.Adam(ps, lr=0.01), lambda ps: torch.optim.AdamW(ps, lr=0.01),
                                  lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5)])
def test_skip_leaves_the_state_of_other_optimizers_untouched(make):
    net = _net("forward")
    opt = make(net.parameters())
    states: list[dict] = []

    def snap(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        states.append(copy.deepcopy(optimizer.state_dict()["state"]))

    opt.register_step_post_hook(snap)
    with hookscope.monitor(net, every=10, optimizer=opt, nonfinite="skip") as mon:
        _train(net, opt, mon, "forward")
    for key, value in states[AT - 1].items():
        for name, t in value.items():
            assert torch.equal(torch.as_tensor(t), torch.as_tensor(states[AT][key][name])), (key, name)
    assert mon.flagged == 1 and all(torch.isfinite(p).all() for p in net.parameters())


class Parent(nn.Module):
    """Its own forward takes the log of its input before its child runs."""

    def __init__(self, log: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1)
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.log(x) if self.log else x * 2)


@pytest.mark.parametrize(("x", "log", "module", "which"), [
    ([[float("inf"), 1.0]], False, "0.fc", "output"),  # the caller's input: the first module outputting it
    ([[-1.0, 1.0]], True, "0", "own_forward"),         # made by the parent's own code, between its children
])
def test_the_replay_names_the_maker_as_watch_does(x, log, module, which):
    net = nn.Sequential(Parent(log))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    batch = torch.tensor(x)
    with hookscope.monitor(net, every=100, steps=[], optimizer=opt, nonfinite="log",
                           replay=lambda: net(batch).sum()) as mon:
        opt.step()  # step 0, the sampled one
        net(batch).sum().backward()
        opt.step()
    assert (mon.nonfinite.step, mon.nonfinite.module, mon.nonfinite.which) == (1, module, which)
    with hookscope.watch(net) as w:
        net(batch).sum().backward()
    assert (w.culprit.module, w.culprit.which) == (module, which)  # as watch names it
    assert no_hooks(net)


def test_a_loop_that_catches_the_error_goes_on_with_the_next_step():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    caught = []
    with hookscope.monitor(net, every=10, optimizer=opt) as mon:
        for x, y in _batches("forward"):
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            try:
                opt.step()
            except hookscope.NonFiniteError as e:
                caught.append(e.step)
    assert caught == [AT] and mon.step_number == 45 and mon.last.step == 40
    assert all(torch.isfinite(p).all() for p in net.parameters()) and no_hooks(net)


def test_a_loss_that_overflows_from_finite_outputs_is_named_as_the_loss():
    net = nn.Sequential(nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        net[0].weight.fill_(1e20)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.ones(2, 1), torch.zeros(2, 1)
    with pytest.raises(hookscope.NonFiniteError, match="first non-finite in the loss, computed from finite") as e:
        with hookscope.monitor(net, every=100, steps=[], optimizer=opt,
                               replay=lambda: nn.functional.mse_loss(net(x), y)) as mon:
            opt.step()  # step 0, sampled
            loss = nn.functional.mse_loss(net(x), y)  # (1e20)^2 overflows float32
            loss.backward()
            mon.note(loss=loss)
            opt.step()
    assert e.value.step == 1 and e.value.row.which == "loss" and mon.nonfinite.module == ""
    assert no_hooks(net)


class _Kept(hookscope.Writer):
    def __init__(self) -> None:
        self.seen: list[hookscope.Telemetry] = []

    def write(self, telemetry: hookscope.Telemetry) -> None:
        self.seen.append(telemetry)


def test_a_step_the_grad_scaler_skips_is_a_step_marked_skipped_named_and_not_raised():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    kept, grads, moved = _Kept(), {}, {}
    with hookscope.monitor(net, every=1, optimizer=opt, scaler=scaler, log=kept) as mon:  # nonfinite="raise"
        for step in range(4):
            opt.zero_grad()
            out = net(x * 1e38 if step == 2 else x)  # step 2: an overflow, as AMP meets them
            scale = scaler.get_scale()
            out.register_hook(lambda g, step=step, scale=scale: grads.__setitem__(step, g / scale))
            loss = nn.functional.mse_loss(out, y)
            before = [p.detach().clone() for p in net.parameters()]
            scaler.scale(loss).backward()
            mon.note(loss=loss)
            scaler.step(opt)
            scaler.update()
            moved[step] = [(p.detach() - b).norm().item() / b.norm().item() for p, b in zip(net.parameters(), before)]
    assert [t.step for t in kept.seen] == [0, 1, 2, 3] and mon.step_number == 4
    assert moved[2] == [0.0] * 4 and scaler.get_scale() < 2.0 ** 4  # the scaler did skip step 2, and backed off
    steps = [t.rows[0] for t in kept.seen]
    assert [r.skipped for r in steps] == [False, False, True, False]
    assert "GradScaler" in steps[2].note and kept.seen[2].scalar("skipped") == 1.0
    skipped = [r for r in kept.seen[2].rows if r.what == "param"]
    assert len(skipped) == 4 and all(r.update_ratio is None and r.update_norm is None for r in skipped)
    assert "update_ratio/0" not in scalars(kept.seen[2]) and "grad_norm/0" in scalars(kept.seen[2])
    assert mon.flagged == 1 and mon.nonfinite.step == 2 and "gradients" in mon.nonfinite.found
    assert any(r.what == "nonfinite" for r in kept.seen[2].rows)
    for step in (0, 1, 3):  # stepped: the update ratio is the one measured by hand, the output gradient unscaled
        ratios = [r.update_ratio for r in kept.seen[step].rows if r.what == "param"]
        assert ratios == pytest.approx(moved[step], rel=1e-4)
        row = next(r for r in kept.seen[step].rows if r.layer == "2" and r.what == "grad_output")
        g = grads[step].double()
        assert (row.mean, row.std, row.min, row.max) == pytest.approx(
            (g.mean().item(), g.std(correction=0).item(), g.min().item(), g.max().item()), rel=1e-5)
    assert no_hooks(net) and "update" not in vars(scaler)


def test_a_step_the_sentinel_raised_on_is_written_as_skipped():
    net = _net("forward")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    kept = _Kept()
    with pytest.raises(hookscope.NonFiniteError):
        with hookscope.monitor(net, every=1, optimizer=opt, log=kept) as mon:
            _train(net, opt, mon, "forward")
    last = kept.seen[-1]
    assert last.step == AT and last.rows[0].skipped and "raised" in last.rows[0].note
    assert all(r.update_ratio is None for r in last.rows if r.what == "param")
    assert not any(t.rows[0].skipped for t in kept.seen[:-1])


def test_scaler_needs_the_optimizer_and_a_grad_scaler():
    net = nn.Linear(2, 1)
    with pytest.raises(hookscope.HookscopeError, match="optimizer="):
        hookscope.monitor(net, scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(hookscope.HookscopeError, match="not a torch.amp.GradScaler"):
        hookscope.monitor(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), scaler=object())


def test_the_sentinel_sums_on_the_cpu_and_takes_one_fused_norm_on_another_device(monkeypatch):
    from hookscope.analysis.monitor import _params

    norms = []
    real = torch.nn.utils.get_total_norm
    monkeypatch.setattr(torch.nn.utils, "get_total_norm", lambda grads: norms.append(len(grads)) or real(grads))
    parts = _params._sums([torch.ones(3), torch.ones(2, device="meta"), torch.ones(4, device="meta"), torch.ones(1)])
    assert [p.device.type for p in parts] == ["cpu", "meta"] and norms == [2]  # both meta gradients in one norm
    assert float(parts[0]) == 4.0
