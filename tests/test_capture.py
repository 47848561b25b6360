import threading
import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers import ConvReLU, FakeModelOutput, Net, Pair, Structured, no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError, MutationError, RecordError
from hookscope.core.guard import Guarded


# --- story 3: keep a layer's input and output, forward and backward -----------------------------
def test_story3_save_values_forward_and_backward():
    net = Net()
    x = torch.randn(3, 2)
    cap = hookscope.capture(net, "l1", "l2", keep="all")
    with pytest.raises(RecordError, match="never called"):
        cap["l1"]  # nothing is stored before the forward pass
    with cap as rec:
        y = net(x)
        F.l1_loss(y, torch.ones(3, 10)).backward()
    h = net.l1(x)
    assert torch.equal(rec["l1"].input, x) and torch.equal(rec["l1"].output, h)
    assert torch.equal(rec["l2"].input, h) and torch.equal(rec["l2"].output, net.l2(h))
    # gradients equal what autograd gives for the same graph
    hh = net.l1(x)
    yy = net.l2(hh)
    g_y, g_h = torch.autograd.grad(F.l1_loss(yy, torch.ones(3, 10)), (yy, hh))
    assert torch.allclose(rec["l2"].grad_output, g_y)
    assert torch.allclose(rec["l2"].grad_input, g_h)
    assert torch.allclose(rec["l1"].grad_output, g_h)
    assert rec["l1"].grad_input is None  # x needs no gradient, as register_full_backward_hook says
    # removing the hooks stops the recording
    net(x)
    assert len(rec.calls) == 2 and no_hooks(net)


def test_records_hold_no_graph_and_no_model():
    net = Net()
    with hookscope.capture(net, "l1") as rec:
        net(torch.randn(2, 2, requires_grad=True))
    assert rec["l1"].output.grad_fn is None and not rec["l1"].output.requires_grad
    ref = weakref.ref(net)
    del net
    assert ref() is None  # the recording does not keep the model alive


def test_detach_false_keeps_the_graph():
    net = Net()
    x = torch.randn(2, 2, requires_grad=True)
    with hookscope.capture(net, "l1", detach=False) as rec:
        net(x)
    (g,) = torch.autograd.grad(rec["l1"].output.sum(), x)
    assert torch.allclose(g, net.l1.weight.sum(0).expand(2, 2))


# --- the in-place trap ---------------------------------------------------------------------------
@pytest.mark.parametrize("functional", [False, True])
def test_inplace_relu_after_captured_conv(functional):
    m = ConvReLU(functional).eval()
    x = torch.randn(2, 3, 8, 8)
    with hookscope.capture(m, "conv") as rec:
        y = m(x)
    ref = m.conv(x)
    assert (ref < 0).any()
    assert torch.equal(rec["conv"].output, ref)
    assert torch.equal(y, ref.relu()) and type(y) is torch.Tensor


def test_no_copy_when_nothing_writes():
    net = Net()
    x = torch.randn(2, 2)
    with hookscope.capture(net, "l1") as rec:
        y = net(x)
    kept = rec["l1"].output
    # the record shares memory with what the model produced: no copy was made
    with torch.no_grad():
        assert kept.untyped_storage().data_ptr() != 0
        assert torch.equal(net.l2(kept), y)


def test_writes_through_views_and_setitem_are_caught():
    class ViewWriter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            qkv = self.lin(x)
            q = qkv[:, :2]  # a view of the recorded tensor
            q.mul_(10)
            qkv[:, 5] = 0
            qkv.t().add_(1)
            return qkv

    m = ViewWriter()
    x = torch.randn(3, 4)
    with hookscope.capture(m, "lin") as rec:
        m(x)
    assert torch.equal(rec["lin"].output, m.lin(x))


def test_copy_always_and_never():
    m = ConvReLU()
    x = torch.randn(1, 3, 5, 5)
    with hookscope.capture(m, "conv", copy="always") as rec:
        m(x)
    assert torch.equal(rec["conv"].output, m.conv(x))
    with hookscope.capture(m, "conv", copy="never") as rec:
        m(x)
    with pytest.raises(MutationError, match="'conv'.*copy='auto'"):
        rec["conv"].output
    net = Net()  # nothing writes: never-copy reads fine
    with hookscope.capture(net, "l1", copy="never") as rec:
        net(x[0, 0, :, :2])
    assert rec["l1"].output.shape == (5, 5)


def test_never_copy_under_inference_mode_still_detects_writes():
    m = ConvReLU()
    with torch.inference_mode():
        x = torch.randn(1, 3, 5, 5)
        with hookscope.capture(m, "conv", copy="never") as rec:
            m(x)
        with pytest.raises(MutationError, match="relu"):
            rec["conv"].output
        with hookscope.capture(m, "conv") as rec:
            m(x)
        assert torch.equal(rec["conv"].output, m.conv(x))


def test_device_and_dtype_retention():
    m = ConvReLU()
    x = torch.randn(1, 3, 5, 5)
    with hookscope.capture(m, "conv", to="cpu", dtype=torch.float16) as rec:
        m(x)
    out = rec["conv"].output
    assert out.dtype == torch.float16 and out.device.type == "cpu"
    assert torch.allclose(out.float(), m.conv(x), atol=1e-2)


def test_write_after_the_context_keeps_the_record_or_is_reported_not_hidden():
    net = Net()
    x = torch.randn(2, 2)
    with hookscope.capture(net, "l2") as rec:
        y = net(x)
    true = y.detach().clone()
    y.add_(1)  # the user's own in-place op on the model's output, after the block
    assert torch.equal(rec["l2"].output, true)  # copied as the output was handed back
    with hookscope.capture(net, "l2", copy="never") as rec:
        y = net(x)
    y.add_(1)
    with pytest.raises(MutationError, match="output of 'l2'"):
        rec["l2"].output


# --- calls, structures, inputs -------------------------------------------------------------------
def test_module_called_three_times_has_three_records_in_order():
    lin = nn.Linear(3, 3)

    class Thrice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(self.lin(self.lin(x)))

    m = Thrice()
    x = torch.randn(2, 3)
    with hookscope.capture(m, "lin", keep="io") as rec:
        m(x)
    calls = rec["lin"].calls
    assert len(calls) == 3 and [c.index for c in calls] == [0, 1, 2]
    assert torch.equal(calls[0].input, x) and torch.equal(calls[1].input, calls[0].output)
    assert torch.equal(calls[2].output, lin(lin(lin(x))))
    with pytest.raises(RecordError, match="called 3 times"):
        rec["lin"].output
    assert len(rec.to_dict(all_calls=True)["lin"]) == 3


def test_weight_tied_modules_are_recorded_separately():
    emb = nn.Linear(4, 4, bias=False)
    head = nn.Linear(4, 4, bias=False)
    head.weight = emb.weight
    m = nn.Sequential(emb, nn.Tanh(), head)
    x = torch.randn(2, 4)
    with hookscope.capture(m, "0", "2") as rec:
        m(x)
    assert torch.equal(rec["0"].output, emb(x))
    assert torch.equal(rec["2"].output, head(torch.tanh(emb(x))))


@pytest.mark.parametrize("kind", ["dict", "dataclass", "modeloutput", "namedtuple"])
def test_structured_outputs_keep_their_structure(kind):
    m = Structured(kind)
    x = torch.randn(2, 3)
    with hookscope.capture(m, "", keep="output") as rec:
        out = m(x)
    got = rec[""].output
    y = m.lin(x)
    assert type(got) is type(out)
    if kind == "dict":
        assert torch.equal(got["y"], y) and got["twice"][1] is None and torch.equal(got["twice"][0], y * 2)
    elif kind == "dataclass":
        assert isinstance(got, Pair) and torch.equal(got.main, y) and torch.equal(got.aux[0], y + 1)
    elif kind == "modeloutput":
        assert isinstance(got, FakeModelOutput) and torch.equal(got.logits, y) and torch.equal(got["hidden"], y * 3)
    else:
        assert torch.equal(got.values, y.max(1).values) and got.indices.dtype == torch.int64
    for t in (out.values() if isinstance(out, dict) else []):
        assert not isinstance(t, Guarded)


def test_keyword_only_inputs_are_recorded():
    class Scaled(nn.Module):
        def forward(self, x, *, scale, bias=None):
            return x * scale

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Scaled()

        def forward(self, x):
            return self.inner(x, scale=torch.tensor(3.0))

    m = Outer()
    x = torch.randn(2)
    with hookscope.capture(m, "inner", keep="input") as rec:
        m(x)
    assert torch.equal(rec["inner"].input, x)
    assert float(rec["inner"].kwargs["scale"]) == 3.0
    with pytest.raises(RecordError, match="keep=\\('output'"):
        rec["inner"].output


def test_to_dict_and_mapping_interface():
    net = Net()
    with hookscope.capture(net, nn.Linear) as rec:
        net(torch.randn(1, 2))
    d = rec.to_dict()
    assert list(d) == ["l1", "l2"] and all(type(v) is torch.Tensor for v in d.values())
    assert "l1" in rec and "nope" not in rec and len(rec) == 2


def test_unknown_and_uncalled_keys_say_what_to_do():
    m = Net()
    m.unused = nn.Linear(2, 2)  # registered, never called by forward
    with hookscope.capture(m, "l1", "unused") as rec:
        m(torch.randn(1, 2))
    with pytest.raises(RecordError, match="'unused' was selected but never called"):
        rec["unused"]
    with pytest.raises(RecordError, match="'l2' was not selected"):
        rec["l2"]


# --- gradients -----------------------------------------------------------------------------------
def test_grad_output_with_inplace_op_after_the_module():
    m = ConvReLU()
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    with hookscope.capture(m, "conv", keep=("output", "grad_output")) as rec:
        m(x).square().sum().backward()
    out = rec["conv"].output
    expected = 2 * out.relu() * (out > 0)  # d/dy sum(relu(y)^2)
    assert torch.allclose(rec["conv"].grad_output, expected)


def test_grad_input_when_the_module_writes_its_input_in_place_is_explained():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True))
    with hookscope.capture(m, "1", keep="grad_input") as rec:
        m(torch.randn(2, 3)).sum().backward()
    with pytest.raises(RecordError, match="modifies its input in place"):
        rec["1"].grad_input


def test_gradients_not_reaching_the_loss_are_none():
    m = Structured("dict")
    with hookscope.capture(m, "", keep="grad_output") as rec:
        out = m(torch.randn(2, 3))
        out["y"].sum().backward()
    g = rec[""].grad_output
    assert torch.equal(g["y"], torch.ones(2, 3)) and g["twice"][0] is None


# --- early stop ----------------------------------------------------------------------------------
class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x


def test_stop_skips_the_rest_of_the_model():
    tail = Counting()
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), tail)
    with hookscope.capture(m, "0", stop=True) as rec:
        assert rec.run(torch.randn(1, 2)) is None
    assert tail.calls == 0 and rec.stopped and rec["0"].output.shape == (1, 2)
    with hookscope.capture(m, "0", stop=True) as rec:
        m(torch.randn(1, 2))
        pytest.fail("the block goes on after the stop")  # pragma: no cover
    assert tail.calls == 0 and no_hooks(m)


def test_stop_swallows_only_its_own_signal():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(ValueError):
        with hookscope.capture(m, "0", stop=True):
            raise ValueError("mine")
    with hookscope.capture(m, "0", stop=True) as outer:
        with hookscope.capture(m, "1"):
            m(torch.randn(1, 2))
    assert outer.stopped and no_hooks(m)


def test_stop_with_gradients_is_refused():
    with pytest.raises(HookscopeError, match="stop=True"):
        hookscope.capture(Net(), "l1", keep="grads", stop=True)


# --- lifecycle -----------------------------------------------------------------------------------
def test_no_hook_left_after_a_thousand_contexts():
    net = Net()
    x = torch.randn(1, 2)
    for _ in range(1000):
        with hookscope.capture(net, "l1", keep="all") as rec:
            net(x).sum().backward()
    assert no_hooks(net) and len(rec.calls) == 1


def test_no_hook_left_after_exceptions_in_forward():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.lin(x)
            raise KeyboardInterrupt

    m = Boom()
    with pytest.raises(KeyboardInterrupt):
        with hookscope.capture(m, "lin", keep="all"):
            m(torch.randn(1, 2))
    assert no_hooks(m)
    with pytest.raises(hookscope.SelectionError):
        with hookscope.capture(m, "lin", "nope"):
            pass
    assert no_hooks(m)


def test_two_captures_at_once_do_not_interfere():
    m = ConvReLU()
    x = torch.randn(1, 3, 6, 6)
    with hookscope.capture(m, "conv") as a, hookscope.capture(m, "conv", keep="io") as b:
        y = m(x)
    ref = m.conv(x)
    assert torch.equal(a["conv"].output, ref) and torch.equal(b["conv"].output, ref)
    assert torch.equal(b["conv"].input, x) and type(y) is torch.Tensor and no_hooks(m)


def test_remove_is_idempotent_and_capture_runs_once():
    net = Net()
    cap = hookscope.capture(net, "l1")
    with cap:
        cap.remove()
        cap.remove()
        net(torch.randn(1, 2))
    assert no_hooks(net) and len(cap.calls) == 0
    with pytest.raises(HookscopeError, match="already run"):
        with cap:
            pass


def test_hooks_running_in_threads_record_every_call():
    net = Net()
    with hookscope.capture(net, "l1") as rec:
        threads = [threading.Thread(target=lambda: net(torch.randn(1, 2))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(rec["l1"].calls) == 8 and sorted(c.index for c in rec.calls) == list(range(8))


def test_outputs_are_bit_identical_with_and_without_capture():
    m = ConvReLU()
    x = torch.randn(2, 3, 6, 6)
    ref = m(x)
    with hookscope.capture(m, keep="all") as rec:
        y = m(x)
    assert torch.equal(y, ref) and type(y) is torch.Tensor and len(rec.calls) == 2


def test_story10_find_the_first_layer_that_goes_non_finite():
    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x)

    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), Log(), nn.Linear(4, 4), nn.ReLU())
    with torch.no_grad():
        m[0].weight.fill_(-1.0)
        m[0].bias.zero_()
    with hookscope.capture(m, keep="io") as rec:
        m(torch.ones(2, 4))
    first = next(c for c in rec.calls if not torch.isfinite(c.output).all())
    assert first.name == "2" and torch.isfinite(first.input).all()


def test_auto_copies_small_tensors_at_once_and_watches_large_ones(monkeypatch):
    monkeypatch.setattr("hookscope.records.retention.COPY_BELOW", 1 << 20)
    small, large = nn.Linear(4, 4), nn.Linear(4, 1 << 16)  # 64 B and 256 KiB x 4 rows = 1 MiB
    m = nn.Sequential(small, large, nn.ReLU())  # the model's own output is copied as it is handed back
    x = torch.randn(4, 4)
    with hookscope.capture(m, "0", "1") as rec:
        m(x)
    s, big = rec["0"].output, rec["1"].output
    assert torch.equal(s, small(x)) and torch.equal(big, large(small(x)))
    slots = {c.name: c._output for c in rec.calls}
    assert slots["0"].policy == "copied" and slots["1"].policy == "auto"


def test_aten_overloads_that_write_are_caught_by_their_schema():
    class AtenWriter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            y = self.lin(x)
            torch.ops.aten.relu_.default(y)
            return y

    m = AtenWriter()
    x = torch.randn(3, 4)
    with hookscope.capture(m, "lin") as rec:
        m(x)
    assert torch.equal(rec["lin"].output, m.lin(x))


def test_a_write_the_guard_cannot_see_is_an_error_naming_the_fix():
    net = Net()
    with hookscope.capture(net, "l1") as rec:
        net(torch.randn(2, 2))
    rec.calls[0]._output.value.add_(1)  # a plain alias: no guard sees it, as with a C++ extension
    with pytest.raises(MutationError, match="copy='always'$"):
        rec["l1"].output


@pytest.mark.slow
def test_capture_of_a_compiled_model_whose_record_feeds_a_matmul():
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = torch.compile(net)
    x = torch.randn(64, 8)
    with torch.no_grad(), hookscope.capture(compiled, "1") as rec:
        compiled(x)
    assert torch.allclose(rec["1"].output, net[1](net[0](x))) and no_hooks(net)


@pytest.mark.parametrize("copy", ["auto", "always", "never"])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_guards_says_what_keep_hands_the_model(copy, device):
    from hookscope.core.guard import Guarded, release
    from hookscope.records import Retention
    from hookscope.records.retention import COPY_BELOW

    ret = Retention(copy=copy, to=device)
    with torch.inference_mode():
        inference = torch.randn(COPY_BELOW // 4 + 1)
    big = COPY_BELOW // 4 + 1
    slots = []
    for t in (torch.randn(4), torch.randn(big), torch.randn(0), torch.randn(big).double(), inference):
        slot, alias = ret.keep(t, "x")
        slots.append(slot)
        assert ret.guards(t) == (type(alias) is Guarded)
    release(slots)


# --- a module that returns the alias it was handed ------------------------------------------------------------
class _IdentityThenInPlace(nn.Module):
    """``bn -> Dropout (eval: returns its input itself) -> += h``: the dropout hands on what capture gave it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn, self.drop, self.w = nn.BatchNorm1d(4), nn.Dropout(0.5), torch.randn(3, 4)

    def forward(self, h):
        y = self.drop(self.bn(h))
        y += h
        return (y * self.w).sum()


@pytest.mark.parametrize("copy", ["auto", "always"])
def test_grad_output_of_a_module_returning_its_input_survives_an_in_place_op_after_it(copy):
    model = _IdentityThenInPlace().eval()
    h = torch.randn(3, 4, requires_grad=True)
    with hookscope.capture(model, "bn", "drop", keep=("output", "grad_output"), copy=copy) as rec:
        model(h).backward()
    for name in ("bn", "drop"):  # d(sum(w * (y + h)))/dy = w, whatever the += did afterwards
        torch.testing.assert_close(rec[name].grad_output, model.w, rtol=0, atol=0)
    torch.testing.assert_close(rec["drop"].output, model.bn(h.detach()), rtol=0, atol=0)
    assert no_hooks(model)


# --- to= keeps records; device=, its former name, still works with a FutureWarning ------------------
def test_capture_device_is_the_former_name_of_to_and_warns_once_naming_it():
    net = nn.Sequential(nn.Linear(2, 2))
    x = torch.ones(1, 2)
    with hookscope.capture(net, "0", to="cpu", dtype=torch.float16) as new:
        net(x)
    with pytest.warns(FutureWarning) as caught:
        with hookscope.capture(net, "0", device="cpu", dtype=torch.float16) as old:
            net(x)
    assert len(caught) == 1 and caught[0].filename == __file__  # the warning points at the caller's line
    msg = str(caught[0].message)
    assert "to=" in msg and "capture(device=)" in msg and "\n" not in msg
    assert old.retention == new.retention and old.retention.to == torch.device("cpu")
    assert torch.equal(old["0"].output, new["0"].output) and old["0"].output.dtype == torch.float16
    with pytest.raises(RecordError, match="drop device="):
        hookscope.capture(net, "0", device="cpu", to="cpu")
    assert no_hooks(net)


def test_retention_device_is_the_former_name_of_to():
    from hookscope import Retention
    with pytest.warns(FutureWarning, match=r"Retention\(device=\) is now Retention\(to=\)") as caught:
        old = Retention(copy="always", device="cpu")
    assert caught[0].filename == __file__
    assert old == Retention(copy="always", to="cpu") and old.to == torch.device("cpu")
    assert Retention("always", True, "cpu") == old  # the third positional field keeps its meaning


def test_capture_copy_defaults_to_auto_and_on_call_still_hands_copies():
    import inspect
    assert inspect.signature(hookscope.capture).parameters["copy"].default == "auto"
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    kept = []
    with hookscope.capture(net, "0", on_call=lambda call: kept.append(call.output)) as rec:
        y = net(-torch.ones(1, 2) * 5)
    assert rec.retention.copy == "always"
    assert (kept[0] < 0).any() and torch.equal(y, kept[0].clamp(min=0))  # not rewritten by the in-place ReLU
    assert no_hooks(net)


def _tiny_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=64, vocab_size=50)
    return transformers.LlamaForCausalLM(config).eval()


def test_a_component_name_is_recorded_under_its_name_with_stop_and_at_as_for_a_module():
    lm = _tiny_llama()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad(), hookscope.capture(lm, "model.layers.0", "blocks.0.resid_post", "blocks.0.attn.z") as rec:
        lm(ids)
    block = rec["model.layers.0"].output
    assert torch.equal(rec["blocks.0.resid_post"].output, block if isinstance(block, torch.Tensor) else block[0])
    assert rec["blocks.0.attn.z"].output.shape == (1, 5, 4, 8)  # [batch, pos, head, d_head]
    with torch.no_grad(), hookscope.capture(lm, "blocks.0.resid_post", stop=True) as first:
        assert first.run(ids) is None  # the rest of the model never ran
    assert torch.equal(first["blocks.0.resid_post"].output, rec["blocks.0.resid_post"].output)
    with torch.no_grad(), hookscope.capture(lm, "blocks.0.attn.z", at=hookscope.at[:, -1]) as last:
        lm(ids)
    assert torch.equal(last["blocks.0.attn.z"].output, rec["blocks.0.attn.z"].output[:, -1])
    assert no_hooks(lm)
