"""step_memory: what one training step holds, per module, counted against hand-written hooks."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookscope
from hookscope.core import hook_count

from helpers import no_hooks


def _model_storages(model: nn.Module) -> set[int]:
    return {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}


def hand_count(model: nn.Module, *inputs: torch.Tensor, loss=None) -> tuple[int, int]:
    """(activation bytes, parameter and buffer bytes) autograd saves in one forward + loss: each
    distinct storage once, counted by a plain saved_tensors_hooks pair, on a copy of the model."""
    model = copy.deepcopy(model)
    mine = _model_storages(model)
    seen: dict[int, int] = {}
    keep = []  # hold every saved tensor, so no storage address is reused while counting

    def pack(t):
        keep.append(t)
        seen.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*[x.clone() for x in inputs])
        value = loss(out) if loss else out.sum()
    value.backward()  # a reentrant checkpoint's recomputation is backward's, not the forward's
    return (sum(v for k, v in seen.items() if k not in mine), sum(v for k, v in seen.items() if k in mine))


class Reused(nn.Module):
    """torchinfo #144's model: one Linear applied 100 times (there 1024 wide, on 10240 rows)."""

    def __init__(self, width: int = 64, times: int = 100) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.times = times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.times):
            x = self.linear(x)
        return x


def test_resnet18_saved_bytes_equal_the_distinct_storages_a_hand_written_hook_counts():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    activations, params_saved = hand_count(net, x)
    m = hookscope.step_memory(net, x)
    assert m.totals.saved == activations and m.totals.params_saved == params_saved
    assert sum(r.saved for r in m.rows) + m.totals.saved_outside == activations
    assert m[""].saved_total == activations - m.totals.saved_outside
    assert m["layer1"].saved_total == sum(m[n].saved for n in m._by_name if n.startswith("layer1."))
    assert m.totals.params == sum(t.nbytes for t in (*net.parameters(), *net.buffers()))
    assert m.totals.grads == sum(p.nbytes for p in net.parameters())
    assert m.totals.peak == m.totals.saved_peak + m.totals.params + m.totals.grads
    assert m.totals.saved_peak == activations  # nothing saved dies before backward
    assert no_hooks(net)


def test_a_module_reused_100_times_counts_its_100_calls():
    net, x = Reused(), torch.randn(32, 64)
    m = hookscope.step_memory(net, x)
    row = m["linear"]
    assert row.calls == 100
    assert row.saved == 100 * 32 * 64 * 4  # every call's input: 100 activations, not one
    assert row.params_saved == 64 * 64 * 4  # the weight, for the gradient of calls 2..100's inputs
    assert m.totals.saved == hand_count(net, x)[0]
    assert no_hooks(net)


def test_the_saved_bytes_are_what_the_forward_pass_leaves_allocated_on_the_cpu():
    """Measured: the CPU allocator's bytes still held after a plain forward, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    net, x = Reused(), torch.randn(32, 64)
    m = hookscope.step_memory(net, x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = net(x)
    held = sum(e.self_cpu_memory_usage for e in prof.profiler.function_events)
    # what autograd keeps, less the input that was there before, plus the output nothing saves
    assert held == m.totals.saved - x.nbytes + out.nbytes


def test_an_in_place_op_and_the_next_layer_share_one_storage_counted_once():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    m = hookscope.step_memory(net, x)
    # the first Linear keeps its input; relu_ keeps its result (the Linear's output, written in
    # place); the second Linear keeps the same storage as its input: counted once, where first saved
    assert [m[n].saved for n in ("0", "1", "2")] == [3 * 4 * 4, 3 * 8 * 4, 0]
    assert m.totals.saved == hand_count(net, x)[0] == 144
    assert no_hooks(net)


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)  # saves x
        t = torch.tanh(h)  # saves its result t, in the model's own forward
        return self.b(t[:, :4]) + self.c(t[:, 4:]) + self.b(h[:, 4:])  # views of t; a view of h


def test_a_saved_view_counts_its_whole_storage_once():
    torch.manual_seed(0)
    net, x = Views(), torch.randn(3, 4)
    m = hookscope.step_memory(net, x)
    assert m["a"].saved == 3 * 4 * 4
    assert m[""].saved == 3 * 8 * 4  # tanh's result; b and c save views of it: nothing new
    assert m["c"].saved == 0
    assert m["b"].saved == 3 * 8 * 4 and m["b"].calls == 2  # half of h viewed: all of h kept
    assert m.totals.saved == hand_count(net, x)[0]
    assert no_hooks(net)


class Block(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if self.mode == "plain":
            return self.inner(h)
        return checkpoint(self.inner, h, use_reentrant=self.mode == "reentrant")


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_a_checkpointed_block_saves_its_input_and_nothing_inside(mode):
    torch.manual_seed(0)
    plain, x = Block("plain"), torch.randn(4, 8)
    ckpt = copy.deepcopy(plain)
    ckpt.mode = mode
    a, b = hookscope.step_memory(plain, x), hookscope.step_memory(ckpt, x)
    row = 4 * 8 * 4
    assert [a[n].saved for n in ("first", "inner.0", "inner.1", "inner.2")] == [row, row, row, 0]
    assert [b[n].saved for n in ("first", "inner.0", "inner.1", "inner.2")] == [row, 0, 0, 0]
    assert b[""].saved == row  # checkpoint keeps the block's input, saved in the model's own forward
    assert b.totals.saved == hand_count(ckpt, x)[0] == 2 * row < a.totals.saved
    assert b.totals.grads == a.totals.grads == sum(p.nbytes for p in plain.parameters())
    assert no_hooks(ckpt) and all(p.grad is None for p in ckpt.parameters())


class Cast(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def test_mixed_dtypes_count_each_tensor_at_its_own_element_size():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8).double(), Cast(torch.float32), nn.Linear(8, 8),
                        Cast(torch.bfloat16), nn.Linear(8, 2).to(torch.bfloat16))
    x = torch.randn(3, 4, dtype=torch.float64)
    m = hookscope.step_memory(net, x)
    assert [m[n].saved for n in ("0", "1", "2", "3", "4")] == [3 * 4 * 8, 0, 3 * 8 * 4, 0, 3 * 8 * 2]
    assert m["0"].params == (4 * 8 + 8) * 8 and m["4"].grads == (8 * 2 + 2) * 2
    assert m.totals.saved == hand_count(net, x)[0]
    assert no_hooks(net)


def test_under_autocast_the_cast_weights_autograd_keeps_are_counted_as_new_memory():
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = hookscope.step_memory(net, x)
        expected = hand_count(net, x)
    assert m.totals.saved == expected[0] and m.totals.params_saved == expected[1] == 0
    assert m["1"].saved == 2 * 16 * 2  # relu's bfloat16 result, the next Linear's input too
    assert m["2"].saved == 16 * 4 * 2  # the bfloat16 copy of its weight autocast made


def _trained() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    x = torch.randn(6, 4)
    net(x).sum().backward()
    opt.step()
    net(x).pow(2).sum().backward()  # gradients present, not yet stepped
    return net, opt, x


def test_model_gradients_optimizer_and_random_state_are_left_as_they_were():
    net, opt, x = _trained()
    params = [p.detach().clone() for p in net.parameters()]
    grads = [p.grad for p in net.parameters()]
    grad_values = [g.clone() for g in grads]
    state = opt.state
    state_values = copy.deepcopy(opt.state_dict())
    buffers = [b.clone() for b in net.buffers()]
    rng = torch.random.get_rng_state()
    m = hookscope.step_memory(net, x, optimizer=opt)
    assert all(torch.equal(p, v) for p, v in zip(net.parameters(), params))
    assert all(p.grad is g and torch.equal(g, v) for p, g, v in zip(net.parameters(), grads, grad_values))
    assert opt.state is state
    after = opt.state_dict()
    assert after["param_groups"] == state_values["param_groups"]
    assert all(torch.equal(after["state"][i][k], v[k]) for i, v in state_values["state"].items() for k in v)
    assert all(torch.equal(b, v) for b, v in zip(net.buffers(), buffers))
    assert torch.equal(torch.random.get_rng_state(), rng) and net.training
    assert m.totals.grads == sum(p.nbytes for p in net.parameters())  # fresh gradients, measured
    assert no_hooks(net)


def test_the_optimizer_state_is_read_from_its_step_each_storage_once():
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), torch.randn(3, 4)
    adam = hookscope.step_memory(net, x, optimizer=torch.optim.Adam(net.parameters()))
    # exp_avg and exp_avg_sq per parameter, and a float32 step count each
    assert adam["0"].optimizer == 2 * (4 * 8 + 8) * 4 + 2 * 4
    assert adam.totals.optimizer == sum(2 * p.nbytes + 4 for p in net.parameters())
    sgd = hookscope.step_memory(net, x, optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    assert sgd.totals.optimizer == sum(p.nbytes for p in net.parameters())  # one momentum buffer each
    plain = hookscope.step_memory(net, x, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    assert plain.totals.optimizer == 0
    assert adam.optimizer == "Adam" and plain.totals.peak == plain.totals.saved_peak + 2 * plain.totals.params


def test_tied_weights_and_frozen_parameters():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    net = nn.Sequential(emb, nn.Linear(4, 4), head)
    net[1].requires_grad_(False)
    m = hookscope.step_memory(net, torch.tensor([[1, 2, 3]]))
    assert m.totals.params == (10 * 4 + 4 * 4 + 4) * 4  # the tied weight once
    assert m["2"].params == 0 and m["1"].grads == 0
    assert m.totals.grads == 10 * 4 * 4
    assert no_hooks(net)


def test_what_the_loss_saves_is_counted_outside_the_model():
    torch.manual_seed(0)
    net, x, y = nn.Linear(4, 5), torch.randn(3, 4), torch.tensor([0, 1, 2])

    def ce(out):
        return F.cross_entropy(out, y)

    m = hookscope.step_memory(net, x, loss=ce)
    assert m.totals.saved_outside >= 3 * 5 * 4  # log_softmax's result
    assert m.totals.saved == hand_count(net, x, loss=ce)[0] == m.totals.saved_outside + m[""].saved


def test_saved_tensors_that_die_during_forward_leave_the_peak():
    class Branch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre, self.wide, self.out = nn.Linear(8, 8), nn.Linear(8, 64), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.pre(x)
            for _ in range(3):
                t = torch.tanh(self.wide(h))  # not used: each one's graph is freed when the next replaces it
            del t
            return self.out(h)

    torch.manual_seed(0)
    m = hookscope.step_memory(Branch(), torch.randn(4, 8))
    x_bytes, h_bytes, t_bytes = 4 * 8 * 4, 4 * 8 * 4, 4 * 64 * 4
    assert m.totals.saved == x_bytes + h_bytes + 3 * t_bytes
    assert m.totals.saved_peak == x_bytes + h_bytes + 2 * t_bytes  # the old t lives until the new one is made


def test_keyword_inputs_a_dict_output_with_its_loss_and_a_wrapper():
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, mask=None):
            out = self.fc(x * mask)
            return {"logits": out, "loss": out.pow(2).mean()}

    torch.manual_seed(0)
    net = Masked()
    wrapped = nn.DataParallel(net)
    m = hookscope.step_memory(wrapped, torch.randn(3, 4), kwargs={"mask": torch.ones(3, 4)})
    assert "fc" in m and m["fc"].saved == 3 * 4 * 4 and m[""].saved > 0  # the product, pow's input
    assert json.loads(m.to_json())["rows"][1]["name"] == "fc"
    assert no_hooks(net)


def test_the_table_and_the_protocol():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 2)))
    m = hookscope.step_memory(net, torch.randn(3, 4), depth=1)
    assert [r.name for r in m.rows] == ["", "0", "1"] and "1.1" in m and m["1"].saved_total == 3 * 8 * 4
    text = str(m)
    assert "1 (Sequential)" in text and "Peak:" in text and "1.1" not in text
    assert m.to_pandas()["saved_total"].tolist() == [r.saved_total for r in m.rows]
    assert "<table" in m._repr_html_()
    with pytest.raises(KeyError, match="Did you mean"):
        m["1.2"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda net: hookscope.step_memory(net), "needs an example input"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), loss=3), "loss=3 is not a function"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), loss=lambda o: o), "returned a tensor of shape (2, 2)"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), loss=lambda o: 1 / 0), "loss(output) failed: ZeroDivisionError"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), optimizer="adam"), "not a torch.optim.Optimizer"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), optimizer=torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1)),
     "holds none of this model's parameters"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), depth=-1), "depth=-1 is not a depth"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), device="gpu9"), "is not a device PyTorch knows"),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 5)), "the forward pass failed in '0' (Linear)"),
    pytest.param(lambda net: hookscope.step_memory(net, torch.randn(2, 4), device="cuda:0"), "pass a device this machine has",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")),
    (lambda net: hookscope.step_memory(net, torch.randn(2, 4), optimizer=torch.optim.LBFGS(net.parameters())),
     "LBFGS.step() failed"),
    (lambda net: hookscope.step_memory(nn.Linear(4, 2).requires_grad_(False), torch.randn(2, 4)), "needs no gradient"),
    (lambda net: hookscope.step_memory("net", torch.randn(2, 4)), "not an nn.Module"),
])
def test_bad_input_is_one_line_and_leaves_nothing_behind(call, message):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 2))
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(hookscope.HookscopeError) as e:
        call(net)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))


def test_a_saved_tensor_changed_in_place_is_refused_naming_the_module_as_autograd_would():
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.Sigmoid()

        def forward(self, x):
            y = self.act(self.fc(x))  # sigmoid saves its result
            y.mul_(2)  # and the model writes into it
            return y

    net = Writes()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        net(torch.randn(2, 4)).sum().backward()
    net.zero_grad(set_to_none=True)
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.step_memory(net, torch.randn(2, 4))
    assert "saved for backward in 'act'" in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net) and all(p.grad is None for p in net.parameters())
    assert hook_count(net) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_peak_is_measured_too():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).cuda()
    m = hookscope.step_memory(net, torch.randn(8, 3, 64, 64), optimizer=torch.optim.Adam(net.parameters()))
    assert m.device.startswith("cuda") and m.totals.measured_peak is not None
    assert m.totals.measured_peak >= m.totals.params + m.totals.saved_peak


def test_under_no_grad_or_inference_mode_the_step_is_the_same():
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), torch.randn(3, 4)
    expected = hookscope.step_memory(net, x).totals
    with torch.no_grad():
        assert hookscope.step_memory(net, x).totals == expected
    with torch.inference_mode():
        made_here = torch.randn(3, 4)  # an inference tensor: the step runs on a normal copy
        assert hookscope.step_memory(net, made_here).totals == expected
    assert no_hooks(net)


def test_sparse_gradients_count_their_values_and_indices():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
    m = hookscope.step_memory(net, torch.tensor([[1, 2, 3]]), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    assert m["0"].grads == 3 * 4 * 4 + 3 * 8  # three rows of values, their int64 indices
    assert all(p.grad is None for p in net.parameters())


class _FailsBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("no backward here")


def test_a_failing_backward_is_one_line_and_the_gradients_come_back():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return _FailsBackward.apply(self.fc(x))

    net = M()
    old = torch.ones(4, 4)
    net.fc.weight.grad = old
    with pytest.raises(hookscope.HookscopeError, match="the backward pass failed: ValueError: no backward here"):
        hookscope.step_memory(net, torch.randn(2, 4))
    assert net.fc.weight.grad is old and torch.equal(old, torch.ones(4, 4)) and net.fc.bias.grad is None
    assert no_hooks(net)


def test_steps_in_threads_each_count_their_own_model():
    import threading

    found: dict[int, int] = {}

    def run(i: int) -> None:
        torch.manual_seed(i)
        found[i] = hookscope.step_memory(nn.Sequential(nn.Linear(4, 8 * (i + 1)), nn.Tanh()),
                                         torch.randn(3, 4)).totals.saved

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == {i: 3 * 4 * 4 + 3 * 8 * (i + 1) * 4 for i in range(4)}


def test_an_optimizer_over_more_than_the_model_puts_every_parameter_back():
    torch.manual_seed(0)
    net, other = nn.Linear(4, 2), nn.Linear(3, 3)
    other.weight.grad = torch.ones(3, 3)
    opt = torch.optim.SGD([*net.parameters(), *other.parameters()], lr=0.5)
    before = other.weight.detach().clone()
    m = hookscope.step_memory(net, torch.randn(2, 4), optimizer=opt)
    assert torch.equal(other.weight, before) and torch.equal(other.weight.grad, torch.ones(3, 3))
    assert m.totals.grads == sum(p.nbytes for p in net.parameters())


def test_the_command_line_prints_the_step_after_the_summary(capsys):
    from hookscope.cli import main

    assert main(["summary", "tiny", "--step-memory", "--depth", "1"]) == 0
    text = capsys.readouterr().out
    assert "TinyResNet: one training step on cpu, training mode, no optimizer" in text and "Peak:" in text
    assert main(["summary", "tiny", "--step-memory", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    model = hookscope.load_model("tiny", seed=0).train()
    expected = hookscope.step_memory(model, torch.randn(1, 3, 32, 32), loss=lambda out: out.logsumexp(-1).sum())
    assert found["step_memory"]["totals"]["saved"] == expected.totals.saved
    assert found["rows"] and found["step_memory"]["rows"][0]["name"] == ""


def test_saved_tensor_hooks_of_the_callers_are_not_silently_replaced():
    net = nn.Linear(4, 2)
    with torch.autograd.graph.save_on_cpu():
        with pytest.raises(hookscope.HookscopeError, match="'save_on_cpu.__init__.pack_to_cpu'.*outside that block"):
            hookscope.step_memory(net, torch.randn(3, 4))
    with torch.autograd.graph.disable_saved_tensors_hooks("no saved-tensor hooks in this block"):
        with pytest.raises(hookscope.HookscopeError, match=r"disables \(no saved-tensor hooks in this block\)"):
            hookscope.step_memory(net, torch.randn(3, 4))
    assert no_hooks(net) and hookscope.step_memory(net, torch.randn(3, 4)).totals.saved == 48
