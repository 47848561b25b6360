"""The core (capture, edit, grads, selection, records) tried as a hostile user would.

Each test is written from the defect's description and asserts values, not only "no error".
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch import nn

import hookscope
from hookscope import HookscopeError, MutationError
from hookscope.core.guard import Guarded

from helpers import no_hooks

BIG = 40_000  # features: a 10 x BIG float32 output is 1.6 MB, over the 1 MiB copy-at-once line


class Writes(nn.Module):
    """Runs ``how(x)`` on its input (a later part of the model writing into a recorded tensor)."""

    def __init__(self, how) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.how(x)
        return x * 1


def _writer_model(how) -> nn.Sequential:
    return nn.Sequential(nn.Linear(10, BIG), Writes(how)).requires_grad_(False)


def _read(copy: str, how) -> str:
    m = _writer_model(how)
    x = torch.randn(10, 10)
    true = m[0](x).clone()
    plain_out = m(x.clone())
    with hookscope.capture(m, "0", copy=copy) as rec:
        out = m(x)
    assert torch.equal(out, plain_out) and no_hooks(m)
    try:
        return "true" if torch.equal(rec["0"].output, true) else "WRONG"
    except MutationError:
        return "MutationError"


# ---- 1. edit and capture on a compiled model that has already run ---------------------------
@pytest.mark.slow
def test_edit_and_capture_take_effect_on_a_compiled_model_that_already_ran():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.randn(3, 4)
    cm = torch.compile(m)
    plain = cm(x)  # compiled without hooks
    with hookscope.edit(cm, "0", output=hookscope.ablate([0, 1, 2, 3])):
        edited = cm(x)
    expected = m[2](m[1](torch.zeros(3, 4)))
    assert torch.allclose(edited, expected, atol=1e-6) and not torch.allclose(edited, plain)
    with hookscope.capture(cm, "0", "2") as rec:
        y = cm(x)
    assert torch.allclose(rec["0"].output, m[0](x), atol=1e-6)
    assert torch.allclose(rec["2"].output, y) and len(rec.calls) == 2
    # after the blocks, the graph compiled without hooks runs again: no edit, nothing recorded
    again = cm(x)
    assert torch.allclose(again, plain, atol=1e-6) and len(rec.calls) == 2 and no_hooks(m)
    assert cm.__dict__["forward"] is not None


@pytest.mark.slow
def test_nested_blocks_on_a_compiled_model_each_see_their_own_hooks():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    cm = torch.compile(m)
    x = torch.randn(3, 4)
    cm(x)
    with hookscope.capture(cm, "0") as outer:
        with hookscope.capture(cm, "2") as inner:
            cm(x)
        cm(x)  # the inner capture is gone: only the outer records
    cm(x)
    assert len(outer["0"].calls) == 2 and len(inner["2"].calls) == 1 and no_hooks(m)


# ---- 3. grads() keeps the gradient as it arrived ---------------------------------------------
def test_grads_of_a_leaf_survive_accumulation_clipping_and_zero_grad():
    w = torch.tensor([1.0], requires_grad=True)
    with hookscope.grads(w=w) as g:
        (w * 2).sum().backward()
        (w * 3).sum().backward()  # accumulates into w.grad in place
    assert g["w"].grads[0].item() == 2.0 and g["w"].grads[1].item() == 3.0
    assert w.grad.item() == 5.0

    p = nn.Parameter(torch.tensor([10.0]))
    with hookscope.grads(p=p) as g:
        (p * 1).sum().backward()
    torch.nn.utils.clip_grad_norm_([p], 0.0316)
    assert g["p"].grad.item() == 1.0 and p.grad.item() == pytest.approx(0.0316, rel=1e-3)

    q = nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([q], lr=0.1)
    with hookscope.grads(q=q) as g:
        (q * 5).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert g["q"].grad.item() == 5.0 and q.grad.item() == 0.0


def test_grads_with_fn_records_the_returned_gradient_even_after_accumulation():
    w = torch.tensor([1.0], requires_grad=True)
    with hookscope.grads(w=w, fn=lambda g: g * 3) as g:
        (w * 2).sum().backward()
        (w * 2).sum().backward()
    assert [t.item() for t in g["w"].grads] == [6.0, 6.0] and w.grad.item() == 12.0


def test_capture_grad_output_of_a_leaf_like_parameter_path_is_not_rewritten():
    lin = nn.Linear(3, 3)
    x = torch.ones(1, 3, requires_grad=True)
    with hookscope.capture(lin, "", keep=("grad_input", "grad_output")) as rec:
        lin(x).sum().backward()
        lin(x).sum().backward()  # x.grad accumulates
    first = rec[""].calls[0].grad_input
    assert torch.equal(first, lin.weight.sum(0, keepdim=True)) and torch.equal(x.grad, 2 * first)


# ---- 4, 5. writes through .data, numpy, and multi-view functions -----------------------------
WRITES = {
    ".data": lambda x: x.data.mul_(0),
    "numpy": lambda x: x.numpy().__setitem__(slice(None), 0),
    "chunk": lambda x: x.chunk(2)[0].mul_(0),
    "split": lambda x: torch.split(x, 1)[0].zero_(),
    "unbind": lambda x: x.unbind(0)[1].zero_(),
    "tensor_split": lambda x: x.tensor_split(3, dim=1)[1].zero_(),
    "dlpack": lambda x: torch.from_dlpack(x).zero_(),
    "detach": lambda x: x.detach().add_(1),
}


@pytest.mark.parametrize("how", list(WRITES), ids=list(WRITES))
def test_writes_that_bypass_the_version_counter_or_return_several_views(how):
    assert _read("auto", WRITES[how]) == "true"
    assert _read("always", WRITES[how]) == "true"
    assert _read("never", WRITES[how]) == "MutationError"


def test_numpy_read_only_use_under_never_is_refused_not_guessed():
    assert _read("never", lambda x: float(x.numpy().sum())) == "MutationError"
    assert _read("auto", lambda x: float(x.numpy().sum())) == "true"


# ---- 8. the default capture is transparent ----------------------------------------------------
def test_transformer_fast_path_is_kept_under_a_default_capture():
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    enc = nn.Sequential(nn.Linear(64, 64), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    enc.eval()
    x = torch.randn(64, 80, 64)  # the Linear's output is 1.3 MB: watched, not copied at once
    with torch.no_grad():
        ref = enc(x)
        with hookscope.capture(enc) as rec:
            y = enc(x)
    assert torch.equal(y, ref)  # bit-identical: the native fast path ran as without hookscope
    assert torch.equal(rec["0"].output, enc[0](x).detach()) and no_hooks(enc)


def test_a_tensor_the_model_stores_on_itself_is_plain_after_the_block():
    class Keeps(nn.Module):
        def forward(self, x):
            self.saved = x
            self.view = x[:, :5]
            return x + 1

    m = nn.Sequential(nn.Linear(10, BIG), Keeps())
    with hookscope.capture(m, "0") as rec:
        m(torch.randn(10, 10))
        assert type(m[1].saved) is Guarded  # inside the block it is watched
    assert type(m[1].saved) is torch.Tensor and type(m[1].view) is torch.Tensor
    assert torch.equal(rec["0"].output, m[1].saved.detach())


# ---- 12. a compiled submodule downstream of a captured layer ---------------------------------
@pytest.mark.slow
def test_capture_before_an_inductor_compiled_submodule():
    m = nn.Sequential(nn.Linear(64, 8000), nn.ReLU(), nn.Linear(8000, 10))
    m[2] = torch.compile(m[2])
    x = torch.randn(64, 64)
    ref = m(x)
    with hookscope.capture(m, "0", "1") as rec:
        y = m(x)
    assert torch.equal(y, ref)
    assert torch.equal(rec["0"].output, m[0](x).detach()) and no_hooks(m)


# ---- 13. threads -------------------------------------------------------------------------------
def test_captures_in_two_threads_record_only_their_own_calls():
    net = nn.Sequential(nn.Linear(2, 2))
    both_open, done = threading.Barrier(2), threading.Barrier(2)
    counts: dict[str, int] = {}

    def worker(tag: str, n: int) -> None:
        with hookscope.capture(net, "0") as rec:
            both_open.wait()
            for _ in range(n):
                net(torch.randn(1, 2))
            done.wait()
        counts[tag] = len(rec["0"].calls)

    threads = [threading.Thread(target=worker, args=(t, n)) for t, n in (("a", 3), ("b", 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {"a": 3, "b": 5} and no_hooks(net)


def test_an_edit_in_one_thread_does_not_change_another_threads_forward():
    net = nn.Sequential(nn.Linear(2, 2))
    x = torch.randn(1, 2)
    ref = net(x)
    opened, ran = threading.Event(), threading.Event()
    seen: list[torch.Tensor] = []

    def other() -> None:
        opened.wait()
        seen.append(net(x))
        ran.set()

    t = threading.Thread(target=other)
    t.start()
    with hookscope.edit(net, "0", output=hookscope.scale(0.0)):
        opened.set()
        ran.wait()
        assert torch.equal(net(x), torch.zeros(1, 2))
    t.join()
    assert torch.equal(seen[0], ref) and no_hooks(net)


def test_a_capture_closed_while_another_thread_is_in_its_hooks_leaks_nothing():
    from hookscope.core import guard

    entered, closed = threading.Event(), threading.Event()

    class Slow(nn.Module):
        def forward(self, x):
            entered.set()
            closed.wait(5)
            return x * 2

    m = nn.Sequential(Slow(), nn.Linear(BIG, 2))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            m(torch.randn(10, BIG))
        except BaseException as e:  # pragma: no cover - the failure being tested
            errors.append(e)

    with hookscope.capture(m, "0", keep="io") as rec:
        t = threading.Thread(target=run)  # started inside the block: its calls are recorded
        t.start()
        entered.wait(5)
    closed.set()
    t.join()
    assert not errors and no_hooks(m)
    assert not guard._registry, "slots kept after the capture closed"
    assert len(rec.calls) == 1  # the call began inside the block


def test_pre_hooks_removed_mid_call_do_not_break_the_forward():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x):
            return self.a(x)

    m = Two()
    blocks = [hookscope.capture(m, "a", keep="input"), hookscope.edit(m, "a", inputs={0: lambda t: t})]
    for b in blocks:
        b.__enter__()

    def remove_all(module, args):  # runs first: removes the later pre-hooks mid-call
        for b in blocks:
            b.remove()

    h = m.a.register_forward_pre_hook(remove_all, prepend=True)
    y = m(torch.ones(1, 2))
    h.remove()
    assert torch.equal(y, m.a(torch.ones(1, 2))) and no_hooks(m)


# ---- 15. late argument errors -----------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "float16"}, "dtype='float16' is not a torch.dtype"),
    ({"to": "gpu"}, "to='gpu' is not a device"),
    ({"to": "cuda:7"} if not torch.cuda.is_available() else {"to": "cuda:99"}, "CUDA"),
    ({"copy": "sometimes"}, "copy='sometimes'"),
    ({"detach": "no"}, "detach='no'"),
], ids=["dtype", "device", "cuda", "copy", "detach"])
def test_capture_arguments_are_checked_before_any_hook(kwargs, match):
    net = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(HookscopeError, match=match):
        hookscope.capture(net, "0", **kwargs)
    assert no_hooks(net)


def test_reentering_an_edit_or_a_grads_block_is_an_error_not_an_assert():
    net = nn.Sequential(nn.Linear(2, 2))
    e = hookscope.edit(net, "0", output=hookscope.scale(2.0))
    with e:
        pass
    with pytest.raises(HookscopeError, match="already run"):
        e.__enter__()
    w = torch.ones(1, requires_grad=True)
    g = hookscope.grads(w=w * 2)
    with g:
        pass
    with pytest.raises(HookscopeError, match="already run"):
        g.__enter__()
    assert no_hooks(net)


def test_ablate_checks_its_channels():
    with pytest.raises(HookscopeError, match="names no channel"):
        hookscope.ablate([])
    with pytest.raises(HookscopeError, match="int or a list of ints"):
        hookscope.ablate([1.5])
    net = nn.Sequential(nn.Conv2d(1, 64, 1))
    with pytest.raises(HookscopeError, match="channel 64 is out of range .* 0..63"):
        with hookscope.edit(net, "0", output=hookscope.ablate([64])):
            net(torch.ones(1, 1, 2, 2))
    assert no_hooks(net)
    out = hookscope.ablate([-1])(torch.ones(1, 3, 1, 1))
    assert out.flatten().tolist() == [1.0, 1.0, 0.0]


# ---- 16. a module registered under two names ---------------------------------------------------
def test_a_shared_module_selected_by_its_second_name_is_recorded_under_it():
    shared = nn.Linear(2, 2)

    class AE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = shared
            self.dec = shared

        def forward(self, x):
            return self.dec(self.enc(x))

    m = AE()
    x = torch.randn(1, 2)
    with hookscope.capture(m, "dec") as rec:
        m(x)
    assert list(rec) == ["dec"] and len(rec["dec"].calls) == 2
    assert torch.equal(rec["dec"].calls[1].output, shared(shared(x)).detach())
    assert "enc" in rec and rec["enc"] is rec["dec"]  # the other name reads the same record


# ---- 17. a module that returns None ------------------------------------------------------------
def test_grad_output_of_a_module_returning_none_is_none():
    class Side(nn.Module):
        def forward(self, x):
            return None

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.side, self.lin = Side(), nn.Linear(2, 2)

        def forward(self, x):
            self.side(x)
            return self.lin(x)

    m = M()
    with hookscope.capture(m, "side", keep="all") as rec:
        m(torch.randn(1, 2, requires_grad=True)).sum().backward()
    assert rec["side"].output is None and rec["side"].grad_output is None


# ---- 18. every positional and keyword input is editable ----------------------------------------
def test_edit_changes_any_positional_or_keyword_input():
    class Attn(nn.Module):
        def forward(self, q, k, v, *, mask=None):
            s = q @ k.transpose(-1, -2)
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            return s.softmax(-1) @ v

    m = nn.Module()
    m.attn = Attn()
    q, k, v = (torch.randn(1, 3, 4) for _ in range(3))
    mask = torch.tensor([[[False, True, True]] * 3])
    with hookscope.edit(m, "attn", inputs={2: torch.ones(1, 3, 4), "mask": mask}):
        y = m.attn(q, k, v, mask=None)
    assert torch.allclose(y, torch.ones(1, 3, 4))
    with hookscope.edit(m, "attn", inputs={1: lambda t: t * 0}):
        y = m.attn(q, k, v)
    assert torch.allclose(y, v.mean(1, keepdim=True).expand(1, 3, 4), atol=1e-6)
    with pytest.raises(HookscopeError, match="keyword input 'mask'"):
        with hookscope.edit(m, "attn", inputs={"mask": mask}):
            m.attn(q, k, v)
    with pytest.raises(HookscopeError, match="input 5 does not exist"):
        with hookscope.edit(m, "attn", inputs={5: mask}):
            m.attn(q, k, v)
    with pytest.raises(HookscopeError, match="both change the first input"):
        hookscope.edit(m, "attn", input=q, inputs={0: q})
    assert no_hooks(m)


# --- found by the second hostile review (issue 9: "then go looking for the next ones") ------------
class PreNorm(nn.Module):
    """``x = x + f(norm(x))`` written in place, as many transformer blocks do."""

    def __init__(self, d: int = BIG) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(self.norm(x).tanh())
        return x


def test_a_fixed_edit_value_is_never_the_models_memory():
    from hookscope.zoo import TinyResNet

    torch.manual_seed(0)
    m = TinyResNet().eval()
    a, b = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32)
    with hookscope.capture(m, "layer1.0.bn2") as rec:
        m(a)
    patch = rec["layer1.0.bn2"].output
    saved = patch.clone()
    with torch.no_grad():  # layer1.0's `out += identity` and in-place ReLU follow bn2
        with hookscope.edit(m, "layer1.0.bn2", output=patch):
            y1 = m(b)
        with hookscope.edit(m, "layer1.0.bn2", output=patch):
            y2 = m(b)
    assert torch.equal(patch, saved) and torch.equal(y1, y2)
    # the same patch put in by a plain hook that returns a fresh copy each call
    h = m.layer1[0].bn2.register_forward_hook(lambda mod, i, o: saved.clone())
    try:
        with torch.no_grad():
            assert torch.equal(m(b), y1)
    finally:
        h.remove()
    assert no_hooks(m)


def test_a_fixed_edit_value_still_receives_its_gradient():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    patch = torch.ones(2, 3, requires_grad=True)
    with hookscope.edit(m, "0", output=patch):
        m(torch.randn(2, 3)).sum().backward()
    assert patch.grad is not None and torch.equal(patch.grad, m[2].weight.detach().expand(2, 3))


@pytest.mark.parametrize("copy", ["auto", "never"])
def test_a_record_overwritten_through_a_plain_reference_is_never_laundered_by_a_later_copy(copy):
    m, x = PreNorm(), torch.randn(10, BIG)
    with hookscope.capture(m, "norm", keep="input", copy=copy) as rec:
        m(x.clone())  # the parent writes the norm's input through its own (plain) reference
    with pytest.raises(MutationError, match=r"input of 'norm' \(call 0\) was overwritten"):
        rec["norm"].input


def test_a_module_called_twice_with_a_write_between_keeps_the_first_input_or_raises():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = nn.Linear(BIG, BIG // 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.f(x)
            x.mul_(2)
            return a + self.f(x)

    m, x = Twice(), torch.randn(10, BIG)
    with torch.no_grad(), hookscope.capture(m, "f", keep="input") as rec:
        m(x.clone())
    with pytest.raises(MutationError):
        rec["f"].calls[0].input
    assert torch.equal(rec["f"].calls[1].input, 2 * x)


def test_inference_mode_inputs_are_true_under_auto_and_refused_under_never():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, BIG), PreNorm(), nn.Linear(BIG, 2))
    x = torch.randn(10, 10)
    with torch.no_grad():
        true = m[0](x)
    with torch.inference_mode(), hookscope.capture(m, "1.norm", keep="input") as rec:
        m(x)
    assert torch.equal(rec["1.norm"].input, true)
    with torch.inference_mode(), hookscope.capture(m, "1.norm", keep="input", copy="never") as rec:
        m(x)
    with pytest.raises(MutationError, match="inference tensor .* no version counter"):
        rec["1.norm"].input
    assert no_hooks(m)


def test_grads_of_a_view_of_a_leaf_are_kept_as_they_arrived():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    a = w.view(2, 2)
    with hookscope.grads(a=a) as g:
        (a * 2).sum().backward(retain_graph=True)  # w.grad adopts a view of this gradient...
        (a * 3).sum().backward()  # ...and accumulates into it
    assert [t.flatten().tolist() for t in g["a"].grads] == [[2.0] * 4, [3.0] * 4]
    assert w.grad.tolist() == [5.0] * 4


def test_a_gradient_rewritten_by_a_later_hook_raises_and_copy_always_keeps_it():
    for copy in ("never", "always"):
        h = torch.ones(3, requires_grad=True) * 1
        with hookscope.grads(h=h, copy=copy) as g:
            h.register_hook(lambda gr: gr.mul_(0))
            (h * 5).sum().backward()
        if copy == "always":
            assert g["h"].grad.tolist() == [5.0, 5.0, 5.0]
        else:
            with pytest.raises(MutationError, match=r"grads\(\.\.\., copy='always'\)"):
                g["h"].grad


def test_grads_refuses_an_fn_that_is_not_a_function():
    w = torch.ones(1, requires_grad=True)
    with pytest.raises(HookscopeError, match="fn=3 for 'w' is not a function"):
        hookscope.grads(w=w, fn=3)
    with pytest.raises(HookscopeError, match="copy='yes' is not a copy policy of grads"):
        hookscope.grads(w=w, copy="yes")
    with pytest.raises(HookscopeError, match=r"copy=True is not a copy policy of grads\(\) \(copy='always' keeps"):
        hookscope.grads(w=w, copy=True)


def _flatten_model(inplace: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.ReLU(inplace=inplace), nn.Linear(8, 1))


@pytest.mark.parametrize("big", [False, True])
def test_a_view_output_rewritten_in_place_never_reads_as_a_missing_gradient(monkeypatch, big):
    if big:  # the output handed on as a guarded alias, as tensors over 1 MiB are
        monkeypatch.setattr("hookscope.records.retention.COPY_BELOW", 0)
    x = torch.randn(4, 1, 4, 4)
    clean = _flatten_model(inplace=False)
    with hookscope.capture(clean, "1", keep="all") as rec:
        clean(x).sum().backward()
    # the true gradient, by hand: d sum(Linear(relu(v))) / dv = relu'(v) * w
    v = clean[1](clean[0](x)).detach()
    assert torch.allclose(rec["1"].grad_output, (v > 0).float() * clean[3].weight.detach())
    m = _flatten_model(inplace=True)
    with hookscope.capture(m, "1", keep="all") as rec:
        m(x).sum().backward()
    with pytest.raises(hookscope.RecordError, match=r"no true grad_output for '1'.*inplace=False"):
        rec["1"].grad_output
    assert no_hooks(m)


def test_an_edit_of_a_gradient_its_hooks_lost_raises_and_one_that_holds_applies():
    x = torch.randn(4, 1, 4, 4)
    m = _flatten_model(inplace=True)
    with pytest.raises(HookscopeError, match="grad_output edit of '1' was not applied"):
        with hookscope.edit(m, "1", grad_output=hookscope.scale(0.0)):
            m(x).sum().backward()
    clean = _flatten_model(inplace=False)
    with hookscope.edit(clean, "1", grad_output=hookscope.scale(0.0)):
        clean(x).sum().backward()
    assert torch.count_nonzero(clean[0].weight.grad) == 0 and no_hooks(m) and no_hooks(clean)
    inplace_first = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True))  # writes its own input
    with pytest.raises(HookscopeError, match="grad_input edit of '1' was not applied"):
        with hookscope.edit(inplace_first, "1", grad_input=hookscope.scale(0.0)):
            inplace_first(torch.randn(2, 3)).sum().backward()


@pytest.mark.parametrize("copy", ["auto", "always"])
def test_an_output_object_of_another_class_is_recorded_detached_and_true(monkeypatch, copy):
    from types import SimpleNamespace

    monkeypatch.setattr("hookscope.records.retention.COPY_BELOW", 0)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return SimpleNamespace(h=self.lin(x), label="head")

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = Head()

        def forward(self, x):
            o = self.head(x)
            o.h.relu_()  # a later in-place op on the member
            return o.h

    torch.manual_seed(0)
    m, x = M(), torch.randn(3, 4)
    true = m.head.lin(x).detach()
    with hookscope.capture(m, "head", copy=copy) as rec:
        y = m(x)
    got = rec["head"].output
    assert torch.equal(got.h, true) and got.label == "head" and not got.h.requires_grad
    assert torch.equal(y, true.relu()) and true.min() < 0


def test_recording_inside_a_torch_func_transform_is_one_line():
    from torch.func import vmap

    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
    with pytest.raises(hookscope.RecordError, match="inside a torch.func transform") as err:
        with hookscope.capture(m, "0"):
            vmap(m)(torch.randn(5, 4))
    assert "\n" not in str(err.value) and no_hooks(m)


# --- third hostile review: mutable containers, the witness's timing, inference-mode outputs ------
def test_a_module_that_writes_its_input_after_reading_it_never_gives_a_partial_grad_input():
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = nn.Linear(3, 3)

        def forward(self, x):
            x += self.f(torch.relu(x))  # pre-activation residual, in place
            return x

    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(3, 3), Residual(), nn.Linear(3, 1)), torch.randn(2, 3)
    with hookscope.capture(net, "1", keep="grad_input") as rec:
        net(x).sum().backward()
    with pytest.raises(hookscope.RecordError, match="no true input gradient for '1'"):
        rec["1"].grad_input


@pytest.mark.parametrize("keep", ["grad_output", ("output", "grad_output"), "all"])
def test_the_witness_sees_a_write_through_an_alias_or_a_view_of_the_view(keep):
    class Reshape(nn.Module):  # output over 1 MiB: handed on as a guarded alias
        def forward(self, x):
            return (x * 1).view(x.shape[0], -1)

    net, x = nn.Sequential(Reshape(), nn.ReLU(inplace=True)), torch.randn(4, 2, 40_000, requires_grad=True)
    with hookscope.capture(net, "0", keep=keep) as rec:
        net(x).sum().backward()
    with pytest.raises(hookscope.RecordError, match="no true grad_output"):
        rec["0"].grad_output

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.flat = nn.Flatten(2)

        def forward(self, x):
            h = self.flat(x * 1).transpose(1, 2)  # the Flatten output object itself is dropped
            return torch.relu_(h) * 2

    m = M()
    with pytest.raises(HookscopeError, match="grad_output edit of 'flat' was not applied"):
        with hookscope.edit(m, "flat", grad_output=hookscope.scale(0.0)):
            m(torch.randn(2, 3, 4, 4, requires_grad=True)).sum().backward()


def test_a_write_after_the_backward_pass_is_no_false_alarm():
    net, x = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0)), torch.randn(5, 4)
    with hookscope.capture(net, "1", keep="grad_output") as rec:
        out = net(x)
        out.sum().backward()
        with torch.no_grad():
            out.clamp_(0, 1)  # post-processing the prediction after the backward pass
    assert torch.equal(rec["1"].grad_output, torch.ones(5))


def test_the_gradient_of_a_parameter_view_survives_accumulation():
    class Pos(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pe = nn.Parameter(torch.randn(8, 4))

        def forward(self):
            return self.pe.t()

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = Pos()

        def forward(self, x):
            return (x @ self.pos()).sum()

    m, xs = M(), [torch.randn(3, 4), torch.randn(3, 4)]
    with hookscope.capture(m, "pos", keep="grad_output") as rec:
        for x in xs:
            m(x).backward()  # two micro-batches, no zero_grad: pe.grad accumulates
    for call, x in zip(rec["pos"].calls, xs):
        assert torch.allclose(call.grad_output, x.sum(0)[:, None].expand(4, 8))


def test_inference_mode_output_records_survive_a_module_updating_its_own_state():
    class EMA(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.state = None

        def forward(self, x):
            if self.state is None:
                self.state = x * 1
            else:
                self.state.mul_(0.5).add_(x)  # writes what it returned last time
            return self.state

    m = nn.Sequential(EMA(), nn.Identity())
    with torch.inference_mode(), hookscope.capture(m, "0") as rec:
        m(torch.ones(BIG))
        m(torch.ones(BIG))
    assert rec["0"].calls[0].output[0].item() == 1.0 and rec["0"].calls[1].output[0].item() == 1.5


@pytest.mark.parametrize("kind", ["object", "list", "dict"])
def test_the_model_gets_back_the_very_containers_it_passes_and_returns(kind):
    from types import SimpleNamespace

    class Attn(nn.Module):  # appends to a cache the caller owns (the generate() pattern)
        def forward(self, x, cache):
            keys = cache.keys if kind == "object" else cache if kind == "list" else cache.setdefault("k", [])
            keys.append(x * 1)
            return x + torch.cat(keys).mean()

    def generate(capture: bool):
        m = nn.Sequential(Attn())
        cache = SimpleNamespace(keys=[]) if kind == "object" else [] if kind == "list" else {}
        outs = []
        with hookscope.capture(m, "0", keep="io") if capture else contextlib.nullcontext() as rec:
            for step in range(3):
                outs.append(m[0](torch.full((BIG,), float(step ** 2)), cache))
        n = len(cache.keys if kind == "object" else cache if kind == "list" else cache["k"])
        return n, [o.mean().item() for o in outs], rec

    plain, hooked = generate(False), generate(True)
    assert plain[:2] == hooked[:2] and plain[0] == 3
    rec = hooked[2]
    assert [c.output.mean().item() for c in rec["0"].calls] == plain[1]


def test_slots_deques_and_shared_copies_are_recorded_true_or_left_alone():
    from collections import deque

    class Base:
        __slots__ = ("a", "__dict__")

    class Out(Base):
        def __init__(self, a, b):
            self.a, self.b = a, b

    class Handle:  # a copy that is itself: hookscope must never write into it
        def __init__(self, t):
            self.t = t

        def __copy__(self):
            return self

    class Heads(nn.Module):
        def forward(self, x):
            return Out(x * 1, x * 2), deque([x * 3])

    class Shared(nn.Module):
        def forward(self, x):
            return Handle(x * 4)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads, self.shared = Heads(), Shared()

        def forward(self, x):
            o, d = self.heads(x)
            h = self.shared(x)
            o.a.relu_()
            d[0].relu_()
            h.t.add_(100)
            return o.a + d[0] + h.t

    net, x = Net(), torch.tensor([-1.0, 2.0])
    y0 = net(x)
    for copy in ("auto", "always", "never"):
        with hookscope.capture(net, "heads", "shared", copy=copy) as rec:
            y1 = net(x)
        assert torch.equal(y0, y1)
        with pytest.raises(MutationError, match="copy .copy.copy. is the object itself"):
            rec["shared"].output  # never the model's live object
        if copy != "never":
            o, d = rec["heads"].output
            assert torch.equal(o.a, x) and torch.equal(o.b, 2 * x) and torch.equal(d[0], 3 * x)


def test_diff_compares_the_tensors_of_plain_object_outputs():
    from types import SimpleNamespace

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return SimpleNamespace(logits=x * self.w)

    a, b = nn.Sequential(nn.Linear(4, 4), Head()), nn.Sequential(nn.Linear(4, 4), Head())
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b[1].w[0] = 100.0
    d = hookscope.diff(a, b, torch.ones(2, 4))
    assert d.first is not None and d.first.name == "1" and d.first.path == ".logits"


def test_nested_fixed_edit_values_are_checked_and_cast():
    class Pair(nn.Module):
        def forward(self, x):
            return x * 2, x * 3

    m = nn.Sequential(Pair())
    with pytest.raises(HookscopeError, match=r"fixed output\[1\] has shape \(5,\)"):
        with hookscope.edit(m, "0", output=(torch.ones(2, 3), torch.ones(5))):
            m(torch.randn(2, 3))
    fa = torch.full((2, 3), -1.0, dtype=torch.float64, requires_grad=True)
    with hookscope.edit(m, "0", output=(fa, torch.zeros(2, 3))):
        a, b = m(torch.randn(2, 3))
    assert a.dtype == torch.float32 and torch.equal(a, torch.full((2, 3), -1.0))
    a.sum().backward()
    assert torch.equal(fa.grad, torch.ones(2, 3, dtype=torch.float64)) and no_hooks(m)


# --- fourth hostile review: lists under grad_input, a tensor in two places, long-lived blocks ------
@pytest.mark.parametrize("keep", ["grad_input", "all"])
def test_a_list_argument_is_the_callers_list_also_when_input_gradients_are_kept(keep):
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, cache):
            cache.append(x.sum())
            return self.lin(x) + cache[0]

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            c = [x[0, 0] * 1]
            y = self.inner(x, c)
            return y, len(c)

    m, x = Outer(), torch.randn(2, 4, requires_grad=True)
    with hookscope.capture(m, "inner", keep=keep) as rec:
        y, n = m(x)
        y.sum().backward()
    assert n == 2  # the module's append reached the caller's list
    with pytest.raises(hookscope.RecordError, match="inside a list, dict or object"):
        rec["inner"].grad_input


@pytest.mark.parametrize("copy", ["auto", "never"])
def test_a_tensor_returned_and_kept_in_the_modules_list_stays_one_tensor(monkeypatch, copy):
    monkeypatch.setattr("hookscope.records.retention.COPY_BELOW", 0)

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cache = []

        def forward(self, x):
            a = x * 2
            self.cache.append(a)
            return a, self.cache

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            a, cache = self.inner(x)
            return cache is self.inner.cache, cache[-1] is a

    m, x = Outer(), torch.tensor([-1.0, 2.0])
    with hookscope.capture(m, "inner", copy=copy) as rec:
        same_list, same_tensor = m(x)
    assert same_list and same_tensor and type(rec["inner"].output[0]) is torch.Tensor
    assert torch.equal(rec["inner"].output[0], 2 * x) and no_hooks(m)


def test_a_capture_open_over_many_steps_stays_flat_with_clear():
    m = nn.Sequential(nn.Linear(256, 1024), nn.ReLU())
    x = torch.randn(256, 256)
    with hookscope.capture(m, "0") as rec:
        for _ in range(5):
            rec.clear()
            m(x)
        assert len(rec.calls) == 1 and len(rec._slots) == 1  # noqa: SLF001 - what a long loop would keep


def test_the_gradient_witness_holds_nothing_once_a_forward_without_backward_is_gone():
    class View(nn.Module):
        def forward(self, x):
            return (x * 1).view(-1)

    m = nn.Sequential(nn.Linear(64, 64), View())
    with hookscope.capture(m, "1", keep="grad_output") as rec:
        for _ in range(5):
            rec.clear()
            m(torch.randn(8, 64))  # grad mode, no backward: the graph dies with the output
        assert not rec._orphans._live  # noqa: SLF001 - nothing held for calls whose graph is gone
