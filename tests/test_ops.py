"""Operations as selections (``module::op``): names, values, in-place writes, edits, gradients, clean-up."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookscope
from hookscope.core.ops import OpSite, in_place, op_name
from hookscope.errors import HookscopeError, RecordError, SelectionError


class Block(nn.Module):
    """Operations of every kind in one forward: functions, methods, operators, in place, a child."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)            # a child: its linear is fc::linear, not Block::linear
        y = h + x                 # add
        y += 1                    # add.1, in place
        z = F.relu(y) @ torch.ones(4, 4)   # relu, matmul
        z = z.mul_(2)             # mul, in place
        return torch.cat([z, y.sum(-1, keepdim=True)], -1)  # sum, cat


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def test_names_of_functions_methods_and_operators() -> None:
    assert op_name(torch.add) == op_name(torch.Tensor.add) == op_name(torch.Tensor.__add__) == "add"
    assert op_name(torch.Tensor.__iadd__) == op_name(torch.Tensor.add_) == op_name(torch.Tensor.__radd__) == "add"
    assert op_name(torch.Tensor.__matmul__) == "matmul" and op_name(torch.Tensor.__truediv__) == "div"
    assert op_name(F.scaled_dot_product_attention) == "scaled_dot_product_attention"
    assert in_place(torch.Tensor.__iadd__) and in_place(torch.Tensor.mul_) and not in_place(torch.Tensor.__add__)


def test_every_operation_of_a_block_in_order_with_true_values() -> None:
    torch.manual_seed(0)
    net = Block()
    x = torch.randn(3, 4)
    with hookscope.capture(net, "::*", "fc::*", keep="io") as rec:
        out = net(x)
    # in the order they ran; torch.ones is an operation too (a factory)
    assert list(rec) == ["fc::linear", "::add", "::add.1", "::relu", "::ones", "::matmul", "::mul", "::sum", "::cat"]
    h = net.fc(x).detach()
    y = h + x
    assert torch.equal(rec["fc::linear"].output, h)
    assert torch.equal(rec["::add"].output, y)
    assert torch.equal(rec["::add.1"].output, y + 1)  # in place: the value at that moment
    z = F.relu(y + 1) @ torch.ones(4, 4)
    assert torch.equal(rec["::matmul"].output, z)  # before mul_ rewrote it
    assert torch.equal(rec["::mul"].output, z * 2)
    assert torch.equal(rec["::cat"].output, out.detach())
    assert torch.equal(rec["::add"].args[1], x)


def test_residual_add_of_resnet_before_the_in_place_relu() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), hookscope.capture(net, "layer1.0::add", "layer1.0") as rec:
        net(x)
        blk = net.layer1[0]
        stem = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        by_hand = blk.bn2(blk.conv2(blk.relu(blk.bn1(blk.conv1(stem))))) + stem
    assert torch.equal(rec["layer1.0::add"].output, by_hand)
    assert (by_hand < 0).any()  # what relu_ then wrote over
    assert torch.equal(rec["layer1.0"].output, by_hand.relu())


def test_hand_written_rmsnorm_and_numbered_uses() -> None:
    norm = RMSNorm(8)
    x = torch.randn(2, 8)
    with hookscope.capture(norm, "::*") as rec:
        norm(x)
    assert list(rec) == ["::pow", "::mean", "::add", "::rsqrt", "::mul", "::mul.1"]
    assert torch.equal(rec["::rsqrt"].output, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_a_module_called_twice_gives_a_record_per_call() -> None:
    norm = RMSNorm(4)
    net = nn.Sequential(norm, nn.Tanh(), norm)
    x = torch.randn(2, 4)
    with hookscope.capture(net, "0::rsqrt") as rec:
        net(x)
    assert len(rec["0::rsqrt"].calls) == 2


def test_hooks_own_operations_are_not_the_modules() -> None:
    net = Block()
    net.fc.register_forward_hook(lambda m, a, out: torch.zeros(1) + 1)  # an add made by a hook
    with hookscope.capture(net, "::add*", "fc") as rec:
        net(torch.randn(2, 4))
    assert list(rec) == ["fc", "::add", "::add.1"]


def test_a_misspelt_operation_gets_the_closest_names() -> None:
    net = Block()
    with pytest.raises(SelectionError, match=r"'::ad' matched no operation.* Did you mean '::add'"):
        with hookscope.capture(net, "::ad"):
            net(torch.randn(2, 4))
    with hookscope.capture(net, "::add") as rec:
        net(torch.randn(2, 4))
    with pytest.raises(RecordError, match=r"'::ad' was not selected in this capture\. Did you mean '::add'"):
        rec["::ad"]
    with pytest.raises(SelectionError, match="matches no module"):
        hookscope.capture(net, "fcc::linear")
    with pytest.raises(SelectionError, match="names no operation"):
        hookscope.capture(net, "fc::")


def test_edit_an_operation_and_nothing_left_behind() -> None:
    net = Block()
    x = torch.randn(2, 4)
    with hookscope.edit(net, "::add", output=torch.zeros(2, 4)):
        out = net(x)
    z = F.relu(torch.ones(2, 4)) @ torch.ones(4, 4) * 2
    assert torch.equal(out, torch.cat([z, torch.full((2, 1), 4.0)], -1))
    assert "forward" not in vars(net) and not net._forward_hooks
    assert torch.equal(net(x), Block.forward(net, x))


def test_an_exception_inside_forward_leaves_nothing() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x + 1
            raise ValueError("boom")

    bad = Bad()
    with pytest.raises(Exception, match="boom"), hookscope.capture(bad, "::add"):
        bad(torch.ones(1))
    assert "forward" not in vars(bad)
    assert torch._C._len_torch_function_stack() == 0


def test_an_instance_forward_set_by_the_user_is_put_back() -> None:
    net = Block()
    mine = lambda x: x * 3  # noqa: E731
    net.forward = mine
    with hookscope.capture(net, "::mul") as rec:
        net(torch.ones(1, 4))
    assert net.forward is mine and torch.equal(rec["::mul"].output, torch.full((1, 4), 3.0))


def test_gradient_of_an_operation_and_refusal_under_no_grad() -> None:
    net = Block()
    x = torch.randn(2, 4, requires_grad=True)
    with hookscope.capture(net, "::add", keep=("output", "grad_output")) as rec:
        net(x).sum().backward()
    y = (net.fc(x) + x).detach().requires_grad_()
    z = torch.cat([(F.relu(y + 1) @ torch.ones(4, 4)) * 2, (y + 1).sum(-1, keepdim=True)], -1)
    z.sum().backward()
    assert torch.allclose(rec["::add"].grad_output, y.grad)
    with torch.no_grad(), hookscope.capture(net, "::add", keep="grad_output") as rec:
        net(x)
    with pytest.raises(HookscopeError, match=r"'::add' ran where autograd records nothing"):
        rec["::add"].grad_output


def test_compiled_models_are_refused_in_one_line() -> None:
    net = Block()
    compiled = torch.compile(net)
    with pytest.raises(SelectionError, match="torch.compile'd"):
        hookscope.capture(compiled, "::add")
    outer = nn.Sequential(Block())
    outer[0] = torch.compile(outer[0])
    with pytest.raises(SelectionError, match=r"inside the torch.compile'd '0'"):
        hookscope.capture(outer, "0::add")


def test_threads_record_their_own_operations() -> None:
    nets = [Block() for _ in range(4)]
    xs = [torch.randn(2, 4) for _ in nets]
    got: dict[int, torch.Tensor] = {}

    def run(i: int) -> None:
        with hookscope.capture(nets[i], "::add") as rec:
            for _ in range(20):
                nets[i](xs[i])
        got[i] = rec["::add"].calls[-1].output

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, net in enumerate(nets):
        assert torch.equal(got[i], net.fc(xs[i]).detach() + xs[i])


def test_gpt2_attention_logits_under_eager_attention() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 50, (1, 5))
    with torch.no_grad(), hookscope.capture(model, "transformer.h.0.attn::matmul", "transformer.h.0.attn.c_attn") as rec:
        model(ids)
    qkv = rec["transformer.h.0.attn.c_attn"].output
    q, k, _ = qkv.split(16, dim=-1)
    q = q.view(1, 5, 2, 8).transpose(1, 2)
    k = k.view(1, 5, 2, 8).transpose(1, 2)
    assert torch.allclose(rec["transformer.h.0.attn::matmul"].output, q @ k.transpose(-1, -2), atol=1e-6)


def test_an_op_site_is_not_callable() -> None:
    with pytest.raises(HookscopeError, match="not a module to call"):
        OpSite(nn.Linear(1, 1), "fc", "linear")(torch.ones(1))


def _tiny() -> tuple[nn.Module, torch.Tensor]:
    from hookscope.zoo import TinyResNet

    torch.manual_seed(0)
    return TinyResNet().eval(), torch.randn(2, 3, 32, 32)


def _residual(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), hookscope.capture(net, "layer1.0::add") as rec:
        net(x)
    return rec["layer1.0::add"].output


def test_every_analysis_takes_an_operation(tmp_path: object) -> None:
    net, x = _tiny()
    want = _residual(net, x)
    d = hookscope.diff(net, net, x, layers="layer1.0::add", b=hookscope.settings(train=True))
    assert [r.name for r in d.rows] == ["layer1.0::add"] and d.rows[0].max_abs > 0  # batch statistics differ
    store = hookscope.extract(net, x, layers="layer1.0::add", reduce="mean", out=f"{tmp_path}/s")
    assert torch.allclose(store["layer1.0::add"][:], want.mean((2, 3)), atol=1e-6)
    fm = hookscope.feature_maps(net, x, layers="layer1.0::add")
    assert torch.allclose(fm.maps, want)
    maps = hookscope.cam(net, x, layers="layer2.0::add")
    assert maps.layers == ["layer2.0::add"] and maps.maps.shape == (2, 32, 32)
    assert not [m for m in net.modules() if "forward" in vars(m)]


def test_analyses_keyed_by_name_refuse_an_operation_glob(tmp_path: object) -> None:
    net, x = _tiny()
    for run in (lambda: hookscope.diff(net, net, x, layers="layer1.0::*"),
                lambda: hookscope.extract(net, x, layers="layer1.0::a*", reduce="mean", out=f"{tmp_path}/s"),
                lambda: hookscope.cam(net, x, layers="layer2.*::add*")):
        with pytest.raises(SelectionError, match="needs each operation by its exact name, not a glob"):
            run()


def test_an_operation_selected_twice_is_recorded_once() -> None:
    net = Block()
    with hookscope.capture(net, "::*", "::add") as rec:
        net(torch.randn(2, 4))
    assert len(rec["::add"].calls) == 1 and len(rec["::add.1"].calls) == 1


def test_always_called_hooks_see_an_operation_that_raises() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ torch.ones(3, 3)  # 2 features against 3: the matmul raises

    bad, seen = Bad(), []
    site = OpSite(bad, "", "matmul")
    handle = site.register_forward_hook(lambda m, a, out: seen.append(out), always_call=True)
    try:
        with pytest.raises(RuntimeError):
            bad(torch.ones(1, 2))
    finally:
        handle.remove()
    assert seen == [None] and "forward" not in vars(bad)


def test_a_gradient_inside_a_custom_autograd_function_is_refused_naming_the_operation() -> None:
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x.mul(x)  # runs inside the Function: autograd records nothing here

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
            return g

    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Square.apply(x) + 1

    net, x = Net(), torch.randn(3, requires_grad=True)
    with hookscope.capture(net, "::mul", "::add", keep=("output", "grad_output")) as rec:
        net(x).sum().backward()
    assert torch.equal(rec["::mul"].output, x.detach() * x.detach())  # its value is there
    assert torch.equal(rec["::add"].grad_output, torch.ones(3))
    with pytest.raises(HookscopeError, match=r"'::mul' ran where autograd records nothing .*custom autograd Function"):
        rec["::mul"].grad_output


def test_the_wrapped_forward_keeps_its_signature_and_script_modules_are_refused() -> None:
    import inspect

    net = Block()
    with hookscope.capture(net, "::add"):
        assert list(inspect.signature(net.forward).parameters) == ["x"]
    scripted = nn.Sequential(torch.jit.script(nn.Linear(2, 2)))
    with pytest.raises(SelectionError, match="TorchScript module"):
        hookscope.capture(scripted, "0::linear")


class _Child(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 10


class _CallsChildForward(nn.Module):
    """Calls its child's ``forward`` directly (no module call in between)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = _Child()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c.forward(x) + 1


def test_a_child_forward_called_directly_owns_its_operations() -> None:
    net = _CallsChildForward()
    x = torch.tensor([2.0])
    listed = hookscope.operations(net, x)
    assert [r.name for r in listed.rows] == ["c::add", "::add"]
    with hookscope.capture(net, "::add") as rec:
        net(x)
    assert torch.equal(rec["::add"].output, torch.tensor([13.0]))  # the root's own +, not the child's
    with hookscope.capture(net, "c::add") as rec:
        net(x)
    assert torch.equal(rec["c::add"].output, torch.tensor([12.0]))
    with hookscope.capture(net, "::add", "c::add") as rec:
        net(x)
    assert torch.equal(rec["::add"].output, torch.tensor([13.0]))
    assert torch.equal(rec["c::add"].output, torch.tensor([12.0]))
    with hookscope.edit(net, "::add", output=lambda t: t * 0):
        assert torch.equal(net(x), torch.tensor([0.0]))
    assert hookscope.core.hook_count(net) == 0 and "forward" not in vars(net.c)


def test_grad_mode_switches_are_no_operations() -> None:
    class NoGrad(nn.Module):
        @torch.no_grad()
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert not torch.is_grad_enabled()
            with torch.enable_grad(), torch.autocast("cpu", enabled=False):
                y = x * 2
            torch.set_grad_enabled(False)
            return y + 1

    net = NoGrad()
    listed = hookscope.operations(net, torch.ones(2))
    assert [r.name for r in listed.rows] == ["::mul", "::add"]
    with hookscope.capture(net, "::*") as rec:
        net(torch.ones(2))
    assert list(rec) == ["::mul", "::add"]
    assert torch.equal(rec["::add"].output, torch.full((2,), 3.0))
    assert hookscope.core.hook_count(net) == 0


def test_missing_fields_of_a_record_are_attribute_errors() -> None:
    net = nn.Sequential(nn.Linear(2, 2))
    with hookscope.capture(net, "0") as rec:
        net(torch.ones(1, 2))
    call = rec["0"].calls[0]
    assert not hasattr(call, "input") and not hasattr(rec["0"], "input")
    assert not hasattr(call, "grad_output") and not hasattr(rec["0"], "grad_input")
    assert hasattr(call, "output") and getattr(call, "kwargs", "absent") == "absent"
    with pytest.raises(RecordError, match="capture with keep=\\('input'"):
        call.input
    with hookscope.capture(net, "0") as twice:
        net(torch.ones(1, 2))
        net(torch.ones(1, 2))
    assert not hasattr(twice["0"], "output")  # ambiguous: two calls
    with pytest.raises(RecordError, match="called 2 times"):
        twice["0"].output


def test_an_operation_that_never_runs_is_an_error_at_the_end_of_the_block() -> None:
    net = Block()
    x = torch.randn(2, 4)
    with pytest.raises(SelectionError, match=r"'::gleu' matched no operation .*Did you mean '::relu'"):
        with hookscope.edit(net, "::gleu", output=lambda t: t * 0):
            net(x)
    with pytest.raises(SelectionError, match=r"'::ad' matched no operation .*Did you mean '::add'"):
        with hookscope.capture(net, "::ad"):
            net(x)
    with pytest.raises(SelectionError, match=r"'\*::lineer' matched no operation .*Did you mean 'fc::linear'"):
        with hookscope.capture(net, "*::lineer"):
            net(x)
    # a glob over modules: enough that one of them ran it
    with hookscope.capture(net, "*::linear") as rec:
        net(x)
    assert list(rec) == ["fc::linear"]
    # nothing ran in the block: nothing to check, as for modules
    with hookscope.edit(net, "::gleu", output=lambda t: t):
        pass
    # an error raised in the block is not hidden by this one
    with pytest.raises(ValueError, match="mine"):
        with hookscope.capture(net, "::ad"):
            net(x)
            raise ValueError("mine")
    assert hookscope.core.hook_count(net) == 0 and "forward" not in vars(net)


class _InPlaceStatements(nn.Module):
    """In-place operations written as statements, their results discarded (hand-written attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ x.transpose(-1, -2)
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores.masked_fill_(mask, float("-inf"))
        probs = scores.softmax(-1)
        h = probs @ x
        h.add_(1)
        h.relu_()
        return h


def _by_hand(net: _InPlaceStatements, x: torch.Tensor, fill: float = float("-inf"),
             shift: float = 1.0) -> torch.Tensor:
    scores = net.q(x) @ x.transpose(-1, -2)
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return torch.relu((scores.masked_fill(mask, fill).softmax(-1) @ x) + shift)


def test_edit_of_an_in_place_operation_whose_result_is_discarded_takes_effect() -> None:
    torch.manual_seed(0)
    net = _InPlaceStatements()
    x = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.ones(3, 3, dtype=torch.bool).triu(1)
    # the mask undone: scores where the model had -inf become 0
    with hookscope.edit(net, "::masked_fill", output=lambda t: t.masked_fill(mask, 0.0)) as e:
        out = net(x)
    want = _by_hand(net, x, fill=0.0)
    assert e.counts == {"::masked_fill": 1}
    assert torch.allclose(out, want)
    got, = torch.autograd.grad(out.sum(), x)
    expected, = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(got, expected)
    # a fixed value, and a change that squares the tensor (its backward reads the tensor changed in place)
    with hookscope.edit(net, "::add", output=lambda t: t * t):
        out = net(x)
    scores = net.q(x) @ x.transpose(-1, -2)
    h = scores.masked_fill(mask, float("-inf")).softmax(-1) @ x + 1
    want = torch.relu(h * h)
    assert torch.allclose(out, want)
    got, = torch.autograd.grad(out.sum(), x)
    expected, = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(got, expected)
    with hookscope.edit(net, "::relu", output=torch.full((2, 3, 4), 7.0)):
        out = net(x)
    assert torch.equal(out, torch.full((2, 3, 4), 7.0))
    assert hookscope.core.hook_count(net) == 0 and "forward" not in vars(net)


def test_edit_of_in_place_writes_of_every_kind() -> None:
    class Writes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = x * 1
            a.mul_(2)                               # mul
            a.clamp_(max=5.0)                       # clamp
            a += 1                                  # add (operator)
            a[0] = 5.0                              # setitem
            a.index_put_((torch.tensor([1]),), torch.tensor(9.0))  # index_put
            if torch.is_grad_enabled():  # out= takes no part in autograd
                return a - 1
            b = torch.empty_like(a)
            torch.sub(a, 1, out=b)                  # sub, out=
            return b

    net = Writes()
    x = torch.arange(4.0)

    def run(sel: str, change: object) -> torch.Tensor:
        with hookscope.edit(net, sel, output=change) as e, torch.no_grad():
            y = net(x)
        assert sum(e.counts.values()) == 1
        return y

    with torch.no_grad():
        plain = net(x)
    assert torch.equal(plain, torch.tensor([4.0, 8.0, 4.0, 5.0]))
    assert torch.equal(run("::mul", lambda t: t * 0), torch.tensor([4.0, 8.0, 0.0, 0.0]))
    assert torch.equal(run("::clamp", lambda t: t - 10), torch.tensor([4.0, 8.0, -6.0, -5.0]))
    assert torch.equal(run("::add", lambda t: t * 10), torch.tensor([4.0, 8.0, 49.0, 59.0]))
    assert torch.equal(run("::setitem", lambda t: t + 100), torch.tensor([104.0, 8.0, 104.0, 105.0]))
    assert torch.equal(run("::index_put", lambda t: -t), torch.tensor([-6.0, -10.0, -6.0, -7.0]))
    assert torch.equal(run("::sub", lambda t: t * 2), torch.tensor([8.0, 16.0, 8.0, 10.0]))
    x.requires_grad_()
    with hookscope.edit(net, "::add", output=lambda t: t * 10):
        y = net(x)
    got, = torch.autograd.grad(y.sum(), x)
    assert torch.equal(got, torch.tensor([0.0, 0.0, 20.0, 0.0]))  # only what survives the writes after it
    assert hookscope.core.hook_count(net) == 0


class _AddInPlace(nn.Module):
    """``c.add_(1.0)`` and an in-place ReLU as statements, a use of ``c`` before the write."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x * 2
        side = c * 3          # the value before the write feeds another op too
        c.add_(1.0)
        self.act(c)
        return c * c + side


def test_edit_inputs_and_gradients_of_an_in_place_operation() -> None:
    net = _AddInPlace()
    x = torch.tensor([-2.0, 0.25, 1.0], requires_grad=True)
    with hookscope.edit(net, "::add", input=lambda t: t * 10):
        out = net(x)
    c = torch.relu(x * 20 + 1)
    assert torch.allclose(out, c * c + x * 6)
    with hookscope.edit(net, "::add", grad_input=lambda g: g * 0, grad_output=lambda g: g * 2):
        got, = torch.autograd.grad(net(x).sum(), x)
    assert torch.allclose(got, torch.full((3,), 6.0))  # only the side branch: nothing flows back through add_
    with hookscope.edit(net, "::add", grad_output=lambda g: g * 2):
        got, = torch.autograd.grad(net(x).sum(), x)
    c = torch.relu(x * 2 + 1)
    assert torch.allclose(got, 2 * (2 * c * (c > 0)) * 2 + 6)
    assert hookscope.core.hook_count(net) == 0


def test_gradients_of_in_place_operations_whose_result_is_unused() -> None:
    net = _AddInPlace()
    x = torch.tensor([-2.0, 0.25, 1.0], requires_grad=True)
    for keep in ("grads", "all"):
        with hookscope.capture(net, "::add", "act", keep=keep) as rec:
            out = net(x)
            out.sum().backward()
        c = torch.relu(x.detach() * 2 + 1)
        upstream = 2 * c * (c > 0)  # d out / d (c after add_), through the ReLU
        assert torch.allclose(rec["::add"].grad_output, upstream), keep
        assert torch.allclose(rec["::add"].grad_input, upstream), keep  # add_ passes it on as it is
        assert torch.allclose(rec["act"].grad_output, 2 * c), keep
        x.grad = None
    # by hand, with torch.autograd.grad on the tensors themselves
    c0 = x * 2
    c1 = c0 + 1.0
    c1.retain_grad()
    y = torch.relu(c1)
    g_c1, g_c0 = torch.autograd.grad((y * y + c0 * 3).sum(), (c1, c0))
    with hookscope.capture(net, "::add", keep="grads") as rec:
        net(x).sum().backward()
    assert torch.allclose(rec["::add"].grad_output, g_c1)
    assert torch.allclose(rec["::add"].grad_input, g_c0 - 3)  # less the side branch's 3
    assert hookscope.core.hook_count(net) == 0


def test_gradients_of_the_residual_add_of_resnet34() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet34(weights=None).eval()
    x = torch.randn(1, 3, 32, 32)
    with hookscope.capture(net, "layer1.0::add", "layer1.0.bn2", keep="grads") as rec:
        net(x).sum().backward()
    blk = net.layer1[0]
    stem = net.maxpool(net.relu(net.bn1(net.conv1(x))))
    branch = blk.bn2(blk.conv2(blk.relu(blk.bn1(blk.conv1(stem)))))
    summed = branch + stem
    out = torch.relu(summed)
    for layer in (net.layer1[1:], net.layer2, net.layer3, net.layer4):
        out = layer(out)
    logits = net.fc(torch.flatten(net.avgpool(out), 1))
    g_sum, g_branch = torch.autograd.grad(logits.sum(), (summed, branch))
    # 30 convolutions' backward in float32, summed in an order the thread pool picks: equal to ~1e-6 of ~2
    assert torch.allclose(rec["layer1.0::add"].grad_output, g_sum, atol=1e-5)
    assert torch.allclose(rec["layer1.0::add"].grad_input, g_sum, atol=1e-5)
    assert torch.allclose(rec["layer1.0.bn2"].grad_output, g_branch, atol=1e-5)
    assert hookscope.core.hook_count(net) == 0


class _WritesAView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y[:, :2].add_(1)      # a view written in place, the view itself dropped
        y[1] = y[1] * 10      # setitem: returns None
        return y * torch.arange(1.0, 4.0)


def test_writes_into_views_and_setitem_are_recorded_and_edited() -> None:
    net = _WritesAView()
    x = torch.zeros(2, 3, requires_grad=True)
    with hookscope.capture(net, "::add", "::setitem", keep=("output", "grad_output")) as rec:
        net(x).sum().backward()
    assert torch.equal(rec["::add"].output, torch.ones(2, 2))
    assert torch.equal(rec["::setitem"].output, torch.tensor([[1.0, 1.0, 0.0], [10.0, 10.0, 0.0]]))
    weights = torch.arange(1.0, 4.0)
    # d out / d y[:, :2] after the add: row 0 as it is, row 1 through the * 10 that setitem wrote
    assert torch.equal(rec["::add"].grad_output, torch.tensor([[1.0, 2.0], [10.0, 20.0]]))
    assert torch.equal(rec["::setitem"].grad_output, weights.expand(2, 3))
    with pytest.raises(RecordError, match="writes into a view"):
        with hookscope.capture(net, "::add", keep="grad_input") as rec:
            net(x).sum().backward()
        rec["::add"].grad_input
    with hookscope.edit(net, "::add", output=lambda t: t * 5):
        out = net(x)
    assert torch.equal(out, torch.tensor([[5.0, 10.0, 0.0], [50.0, 100.0, 0.0]]))
    with hookscope.edit(net, "::setitem", output=lambda t: -t):
        out = net(x)
    assert torch.equal(out, torch.tensor([[-1.0, -2.0, 0.0], [-10.0, -20.0, 0.0]]))
    assert hookscope.core.hook_count(net) == 0


def test_a_capture_inside_an_edit_of_an_in_place_operation_reads_the_edited_value() -> None:
    net = _AddInPlace()
    x = torch.tensor([-2.0, 0.25, 1.0], requires_grad=True)
    with hookscope.edit(net, "::add", output=lambda t: t * 2), \
            hookscope.capture(net, "::add", "act", keep="all") as rec:
        net(x).sum().backward()
    c = torch.relu((x.detach() * 2 + 1) * 2)
    assert torch.equal(rec["::add"].output, (x.detach() * 2 + 1) * 2)
    assert torch.equal(rec["act"].output, c)
    assert torch.allclose(rec["act"].grad_output, 2 * c)
    with hookscope.capture(net, "::add", keep="all") as rec, \
            hookscope.edit(net, "::add", output=lambda t: t * 2):
        net(x).sum().backward()
    assert torch.equal(rec["::add"].output, x.detach() * 2 + 1)  # entered before: the value before the edit
    with pytest.raises(RecordError, match="enter the capture after the edit"):
        rec["::add"].grad_input
    assert hookscope.core.hook_count(net) == 0


def test_an_out_argument_is_recorded_as_the_tensor_the_model_reads_on() -> None:
    class Out(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            buf = torch.empty_like(x)
            torch.mul(x, 3, out=buf)
            buf.add_(1)        # the model writes on into the buffer
            return buf

    net = Out()
    with torch.no_grad(), hookscope.capture(net, "::mul", copy="auto") as rec:
        out = net(torch.ones(2))
    assert torch.equal(rec["::mul"].output, torch.full((2,), 3.0)) and torch.equal(out, torch.full((2,), 4.0))
    with torch.no_grad(), hookscope.edit(net, "::mul", output=lambda t: t * 0):
        assert torch.equal(net(torch.ones(2)), torch.ones(2))
    assert hookscope.core.hook_count(net) == 0


def test_names_resolved_from_a_glob_and_handed_on_one_by_one_raise_nothing() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(x)

    net = Two()
    names = [n for n, _ in hookscope.layers(net, "*::linear")]
    assert names == ["::linear", "a::linear", "a.fc::linear", "b::linear", "b.fc::linear"]
    with hookscope.capture(net, *names) as rec:
        net(torch.randn(2, 4))
    assert list(rec) == ["a.fc::linear", "b.fc::linear"]
    with hookscope.edit(net, *names, output=lambda t: t * 0) as e:
        net(torch.randn(2, 4))
    assert e.counts["a.fc::linear"] == 1 and e.counts["::linear"] == 0
    assert hookscope.core.hook_count(net) == 0


class _Writer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.mul_(2)
        h += x
        h[0] = h[0] * 3
        h.clamp_(max=1.5)
        return (h * h).sum(-1)


def test_an_identity_edit_of_every_operation_changes_no_value_and_no_gradient() -> None:
    torch.manual_seed(0)
    net = _Writer()
    x = torch.randn(4, 3, requires_grad=True)
    want = net(x)
    want_grad, = torch.autograd.grad(want.sum(), x)
    with hookscope.edit(net, "::*", output=lambda t: t) as e:
        got = net(x)
        got_grad, = torch.autograd.grad(got.sum(), x)
    assert torch.equal(got, want) and torch.allclose(got_grad, want_grad)
    assert e.counts["::*"] >= 6
    assert hookscope.core.hook_count(net) == 0


def test_threads_edit_in_place_operations_of_their_own_calls() -> None:
    torch.manual_seed(0)
    net = _Writer()
    x = torch.randn(4, 3)
    results: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        with torch.no_grad(), hookscope.edit(net, "::mul", output=lambda t: t * 0 + i):
            results[i] = net(x)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, out in results.items():
        h = torch.full((4, 3), float(i)) + x
        h[0] = h[0] * 3
        assert torch.allclose(out, (h.clamp(max=1.5) ** 2).sum(-1)), i
    assert torch.equal(net(x), _Writer.forward(net, x))
    assert hookscope.core.hook_count(net) == 0


def test_functions_called_with_inplace_true_are_edited_where_they_write() -> None:
    class Functional(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * 1
            g = x * 3
            F.leaky_relu(g, 0.5, True)          # inplace given by position
            F.relu(h, inplace=True)             # a statement: the result is h itself
            return h * 2 + g

    net = Functional()
    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    listed = hookscope.operations(net, x)
    assert [(r.name, r.in_place) for r in listed.rows] == [
        ("::mul", False), ("::mul.1", False), ("::leaky_relu", True), ("::relu", True), ("::mul.2", False),
        ("::add", False)]
    with hookscope.edit(net, "::relu", output=lambda t: t - 3) as e:
        out = net(x)
        got, = torch.autograd.grad(out.sum(), x)
    assert e.counts == {"::relu": 1}
    assert torch.equal(out, torch.tensor([-7.5, 4.0]))  # 2 * (relu(x) - 3) + leaky_relu(3 x)
    assert torch.equal(got, torch.tensor([1.5, 5.0]))
    with hookscope.capture(net, "::relu", keep="grads") as rec:
        net(x).sum().backward()
    assert torch.equal(rec["::relu"].grad_output, torch.tensor([2.0, 2.0]))
    assert torch.equal(rec["::relu"].grad_input, torch.tensor([0.0, 2.0]))
    assert hookscope.core.hook_count(net) == 0
