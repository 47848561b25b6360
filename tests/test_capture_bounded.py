"""capture(last=N) keeps the last N calls of each module; capture(on_call=fn) keeps nothing.

Both stay flat over long loops: dropped calls release what they kept (guard registrations, gradient
hooks), and a record the user held after it was dropped refuses to be read.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc

import pytest
import torch
import torch.nn.functional as F
from helpers import Net, no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError, RecordError
from hookscope.core import guard


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def _kept_slots(rec: hookscope.Capture) -> int:
    return sum(len(v) for v in rec._call_slots.values())


def _python_growth(run: object, calls: int) -> int:
    """Bytes of Python memory still held after ``calls`` more calls of ``run`` (tracemalloc)."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(calls):
        run()  # type: ignore[operator]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


# --- last=N ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", None])
def test_last_must_be_a_positive_int(bad):
    net = Net()
    if bad is None:
        hookscope.capture(net, last=None)  # None: keep everything, as before
        return
    with pytest.raises(HookscopeError, match=r"last=.* int >= 1") as e:
        hookscope.capture(net, "l1", last=bad)
    assert "\n" not in str(e.value) and no_hooks(net)


def test_last_keeps_the_last_calls_with_their_global_index_and_true_values():
    net = Net()
    xs = [torch.randn(2, 2) for _ in range(5)]
    with hookscope.capture(net, "l1", "l2", keep="io", last=2) as rec:
        for x in xs:
            net(x)
    # calls began l1, l2, l1, l2, ...: index 2k is l1 of input k, 2k + 1 is l2 of input k
    assert [c.index for c in rec["l1"].calls] == [6, 8] and [c.index for c in rec["l2"].calls] == [7, 9]
    assert [c.index for c in rec.calls] == [6, 7, 8, 9]
    for call, x in zip(rec["l1"].calls, xs[3:]):
        assert torch.equal(call.input, x) and torch.equal(call.output, net.l1(x))
    for call, x in zip(rec["l2"].calls, xs[3:]):
        assert torch.equal(call.output, net(x))
    assert [r.index for r in rec.rows] == [6, 7, 8, 9] and no_hooks(net)


def test_shared_module_called_twice_per_forward_with_last_1():
    lin = nn.Linear(3, 3)
    net = nn.Sequential(lin, nn.ReLU(), lin)  # "0" and "2" are one module
    xs = [torch.randn(2, 3) for _ in range(4)]
    hidden = [torch.relu(lin(x)) for x in xs]  # outside the block: a call of lin inside would be recorded
    with hookscope.capture(net, "0", keep="io", last=1) as rec:
        for x, h in zip(xs, hidden):
            y = net(x)
            (only,) = rec["0"].calls
            assert torch.equal(only.output, y)  # the second use, whose output is the model's
            assert torch.equal(only.input, h)
    assert rec["2"].calls[0].index == 7 and len(rec.calls) == 1 and no_hooks(net)


def test_a_dropped_record_refuses_every_field():
    net = Net()
    with hookscope.capture(net, "l1", keep="all", last=1) as rec:
        net(torch.randn(2, 2)).sum().backward()
        first = rec["l1"].calls[0]
        assert first.grad_output is not None
        net(torch.randn(2, 2))
    assert first.dropped and not rec["l1"].calls[0].dropped
    for field in ("output", "input", "args", "kwargs", "grad_output", "grad_input"):
        with pytest.raises(RecordError, match=r"call 0 of 'l1' was dropped: capture\(last=1\)"):
            getattr(first, field)


def _ten_thousand_calls(net: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """Run 10,000 forwards; the live tensors after the first 500, and the Python memory grown over the last 2,000."""
    for _ in range(500):
        net(x)
    tensors_before = _live_tensors()
    for _ in range(7500):
        net(x)
    return tensors_before, _python_growth(lambda: net(x), 2000)


def test_last_stays_flat_over_10000_forward_calls():
    net = Net()
    x = torch.randn(1, 2)
    with hookscope.capture(net, keep="output", last=3) as rec:
        tensors_before, grown = _ten_thousand_calls(net, x)
        assert len(rec.calls) == 6 and all(len(rec[n].calls) == 3 for n in ("l1", "l2"))
        assert _kept_slots(rec) == 6  # one output slot per kept call
        assert len(guard._registry) <= 6
        assert _live_tensors() <= tensors_before
        assert grown < 64 * 1024, f"python memory grew by {grown} bytes over 2,000 calls"
    assert rec.calls[-1].index == 2 * 10000 - 1 and not guard._registry and no_hooks(net)


def test_last_with_gradients_in_a_training_loop():
    net = Net()
    with hookscope.capture(net, "l1", "l2", keep="all", last=1) as rec:
        for step in range(200):
            if step == 1:
                handles = len(rec._group)  # module hooks: from now on nothing is added per call
            x = torch.randn(4, 2)
            y = net(x)
            y.pow(2).mean().backward()
            w2 = net.l2.weight.detach().clone()  # as the backward pass used it
            with torch.no_grad():  # a plain SGD step (torch.optim's first step imports dynamo: slow)
                for p in net.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
        assert sum(len(h) for h in rec._call_hooks.values()) <= 4  # only the kept calls' gradient hooks
        assert len(rec._group) == handles == 5  # 2 x (pre, post) + the root's
        g_y = 2 * y.detach() / y.numel()
    assert [c.index for c in rec.calls] == [398, 399]
    assert torch.allclose(rec["l2"].grad_output, g_y)
    assert torch.allclose(rec["l2"].grad_input, g_y @ w2)
    assert torch.allclose(rec["l1"].grad_output, g_y @ w2)
    assert no_hooks(net)


def test_a_gradient_arriving_for_a_dropped_call_is_not_kept_and_does_not_crash():
    net = Net()
    with hookscope.capture(net, "l2", keep="grad_output", last=1) as rec:
        y1 = net(torch.randn(2, 2))
        old = rec["l2"].calls[0]
        y2 = net(torch.randn(2, 2))  # drops old; y1's graph is still alive
        (y1 * 3).sum().backward()  # old's gradient would arrive now
        assert rec["l2"].grad_output is None  # the kept call has had no backward yet
        with pytest.raises(RecordError, match="dropped"):
            old.grad_output
        y2.sum().backward()
        assert torch.equal(rec["l2"].grad_output, torch.ones(2, 10))
    assert len(rec.calls) == 1 and no_hooks(net)


def test_last_sees_through_data_parallel_on_cpu():
    net = Net()
    dp = nn.DataParallel(net)
    xs = [torch.randn(3, 2) for _ in range(3)]
    with hookscope.capture(dp, "l1", last=1) as rec:
        for x in xs:
            dp(x)
    assert len(rec["module.l1"].calls) == 1 and torch.equal(rec["l1"].output, net.l1(xs[-1]))
    assert no_hooks(dp)


def test_last_from_many_threads_keeps_true_records():
    net = Net()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(50):
                net(torch.randn(2, 2, generator=g))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with hookscope.capture(net, "l1", "l2", keep="io", last=3) as rec:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for name, layer in (("l1", net.l1), ("l2", net.l2)):
        assert len(rec[name].calls) == 3
        for call in rec[name].calls:
            assert torch.allclose(call.output, layer(call.input))
    indices = [c.index for c in rec.calls]
    assert len(set(indices)) == 6 and max(indices) == 4 * 50 * 2 - 1
    assert _kept_slots(rec) == 0 and not guard._registry and no_hooks(net)


# --- on_call=fn --------------------------------------------------------------------------------------
def test_on_call_hands_each_record_and_keeps_nothing():
    net = Net()
    seen: list[tuple[str, int, torch.Tensor]] = []
    xs = [torch.randn(2, 2) for _ in range(3)]
    with hookscope.capture(net, "l1", "l2", on_call=lambda c: seen.append((c.name, c.index, c.output))) as rec:
        for x in xs:
            net(x)
            assert _kept_slots(rec) == 0 and len(rec.calls) == 0
    assert [(n, i) for n, i, _ in seen] == [("l1", 0), ("l2", 1), ("l1", 2), ("l2", 3), ("l1", 4), ("l2", 5)]
    for k, x in enumerate(xs):
        assert torch.equal(seen[2 * k][2], net.l1(x)) and torch.equal(seen[2 * k + 1][2], net(x))
    assert len(rec.calls) == 0 and not guard._registry and no_hooks(net)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv(x))  # rewrites conv's output in place
        out += x  # rewrites relu's output in place, after the module returned
        return out


def test_on_call_values_are_copies_the_model_cannot_rewrite():
    net = _Residual()
    x = torch.randn(2, 3, 8, 8)
    kept: dict[str, torch.Tensor] = {}
    with hookscope.capture(net, "conv", "relu", on_call=lambda c: kept.__setitem__(c.name, c.output)):
        y = net(x)
    conv = F.conv2d(x, net.conv.weight, net.conv.bias, padding=1)
    assert torch.equal(kept["conv"], conv) and bool((kept["conv"] < 0).any())
    assert torch.equal(kept["relu"], torch.relu(conv))
    assert torch.equal(y, torch.relu(conv) + x) and no_hooks(net)


def test_on_call_with_an_explicit_copy_policy_hands_the_record_as_it_is():
    net = _Residual()
    x = torch.randn(2, 3, 8, 8)
    read: dict[str, torch.Tensor] = {}
    with hookscope.capture(net, "conv", copy="auto",
                           on_call=lambda c: read.__setitem__("now", c.output.clone())):
        net(x)
    assert torch.equal(read["now"], F.conv2d(x, net.conv.weight, net.conv.bias, padding=1))


def test_on_call_inputs():
    net = Net()
    x = torch.randn(2, 2)
    got: list[torch.Tensor] = []
    with hookscope.capture(net, "l2", keep="input", on_call=lambda c: got.append(c.input)):
        net(x)
    assert len(got) == 1 and torch.equal(got[0], net.l1(x))


@pytest.mark.parametrize("keep", ["grad_output", "grads", "all", ("output", "grad_input")])
def test_on_call_refuses_gradients(keep):
    net = Net()
    with pytest.raises(HookscopeError, match="on_call= hands each record") as e:
        hookscope.capture(net, keep=keep, on_call=print)
    assert "\n" not in str(e.value) and no_hooks(net)


def test_on_call_refusals():
    with pytest.raises(HookscopeError, match="not callable"):
        hookscope.capture(Net(), on_call=3)  # type: ignore[arg-type]
    with pytest.raises(HookscopeError, match="pass one of them"):
        hookscope.capture(Net(), on_call=print, last=2)


def test_an_exception_in_on_call_propagates_and_removes_the_hooks():
    net = Net()

    def fn(call: hookscope.CallRecord) -> None:
        if call.index == 3:
            raise ValueError("from fn")

    with pytest.raises(ValueError, match="from fn"):
        with hookscope.capture(net, "l1", "l2", on_call=fn) as rec:
            net(torch.randn(1, 2))
            net(torch.randn(1, 2))
    assert len(rec.calls) == 0 and _kept_slots(rec) == 0 and not guard._registry and no_hooks(net)


def test_on_call_with_stop_and_at():
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 3))
    x = torch.randn(5, 2)
    got: list[torch.Tensor] = []
    ran: list[int] = []
    net[2].register_forward_hook(lambda m, i, o: ran.append(1))
    with hookscope.capture(net, "0", stop=True, at=hookscope.at[:, -1], on_call=lambda c: got.append(c.output)) as rec:
        assert rec.run(x) is None
    assert rec.stopped and not ran and len(rec.calls) == 0
    assert len(got) == 1 and torch.equal(got[0], net[0](x)[:, -1])


def test_a_record_read_after_on_call_returned_refuses():
    net = Net()
    calls: list[hookscope.CallRecord] = []
    with hookscope.capture(net, "l1", on_call=calls.append):
        net(torch.randn(1, 2))
    with pytest.raises(RecordError, match="handed to on_call and not kept"):
        calls[0].output


def test_on_call_stays_flat_over_10000_forward_calls():
    net = Net()
    x = torch.randn(1, 2)
    total = torch.zeros(())

    def fn(call: hookscope.CallRecord) -> None:
        total.add_(call.output.sum())

    with hookscope.capture(net, "l1", "l2", on_call=fn) as rec:
        tensors_before, grown = _ten_thousand_calls(net, x)
        assert _kept_slots(rec) == 0 and len(rec.calls) == 0 and not guard._registry
        assert _live_tensors() <= tensors_before
        assert grown < 64 * 1024, f"python memory grew by {grown} bytes over 2,000 calls"
    expected = 10000 * (net.l1(x).sum() + net(x).sum())
    assert torch.allclose(total, expected, rtol=1e-4) and no_hooks(net)


def test_last_with_at_and_on_call_through_data_parallel():
    net = nn.Sequential(nn.Linear(2, 6), nn.ReLU())
    dp = nn.DataParallel(net)
    xs = [torch.randn(3, 2) for _ in range(4)]
    with hookscope.capture(dp, "0", at=hookscope.at[:, -1], last=2) as rec:
        for x in xs:
            dp(x)
    assert [c.index for c in rec.calls] == [2, 3]
    assert torch.equal(rec["0"].calls[0].output, net[0](xs[2])[:, -1])
    got: list[torch.Tensor] = []
    with hookscope.capture(dp, "module.1", on_call=lambda c: got.append(c.output)):
        for x in xs:
            dp(x)
    assert all(torch.equal(g, torch.relu(net[0](x))) for g, x in zip(got, xs)) and no_hooks(dp)
