import pytest
import torch
from helpers import Net, no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError


def test_activation_patching_with_a_recorded_output():
    net = Net()
    clean, corrupt = torch.randn(1, 2), torch.randn(1, 2)
    with hookscope.capture(net, "l1") as rec:
        want = net(clean)
    with hookscope.edit(net, "l1", output=rec["l1"].output) as ed:
        got = net(corrupt)
    assert torch.equal(got, want) and ed.counts == {"l1": 1} and no_hooks(net)


def test_channel_ablation_and_input_change():
    conv = nn.Conv2d(3, 4, 1)
    m = nn.Sequential(conv, nn.Identity())
    x = torch.randn(1, 3, 2, 2)
    with hookscope.edit(m, "0", output=hookscope.ablate([1, 3])):
        y = m(x)
    ref = conv(x)
    assert (y[:, [1, 3]] == 0).all() and torch.equal(y[:, [0, 2]], ref[:, [0, 2]])
    with hookscope.edit(m, "0", input=lambda t: t * 0):
        y = m(x)
    assert torch.allclose(y, conv.bias.view(1, 4, 1, 1).expand_as(y))


def test_in_place_change_returning_none_is_kept():
    net = Net()
    x = torch.randn(2, 2)
    with hookscope.edit(net, "l1", output=lambda out: out.zero_()):
        y = net(x)
    assert torch.allclose(y, net.l2.bias.expand(2, 10))


def test_gradient_edits_scale_what_flows_back():
    net = Net()
    x = torch.randn(3, 2, requires_grad=True)
    net(x).sum().backward()
    ref_w1, ref_x = net.l1.weight.grad.clone(), x.grad.clone()
    net.zero_grad()
    x.grad = None
    with hookscope.edit(net, "l2", grad_output=hookscope.scale(2.0)):
        net(x).sum().backward()
    assert torch.allclose(net.l1.weight.grad, 2 * ref_w1) and torch.allclose(x.grad, 2 * ref_x)
    net.zero_grad()
    x.grad = None
    with hookscope.edit(net, "l1", grad_input=lambda g: torch.zeros_like(g)):
        net(x).sum().backward()
    # the gradient sent back to x through l1 is zeroed; l1's own weights still get theirs
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.allclose(net.l1.weight.grad, ref_w1)
    assert no_hooks(net)


def test_edit_then_capture_sees_the_edit():
    net = Net()
    x = torch.randn(1, 2)
    with hookscope.edit(net, "l1", output=hookscope.scale(0.0)), hookscope.capture(net, "l1") as rec:
        net(x)
    assert torch.equal(rec["l1"].output, torch.zeros(1, 5))


def test_bad_edits_are_explained_and_leave_nothing():
    net = Net()
    with pytest.raises(HookscopeError, match="needs at least one"):
        hookscope.edit(net, "l1")
    with pytest.raises(HookscopeError, match=r"shape \(3,\).*shape \(1, 5\)"):
        with hookscope.edit(net, "l1", output=torch.zeros(3)):
            net(torch.randn(1, 2))
    with pytest.raises(HookscopeError, match="cannot ablate dim 4"):
        with hookscope.edit(net, "l1", output=hookscope.ablate(0, dim=4)):
            net(torch.randn(1, 2))
    assert no_hooks(net)


def test_a_component_takes_output_changes_alone_and_at_limits_them_to_positions():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    lm = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for kind in ({"input": torch.zeros_like}, {"grad_input": torch.zeros_like}):
        with pytest.raises(HookscopeError, match=r"^'blocks.0.attn.z' is a component, one value that a change "
                                                 r"receives as its output; edit it with output="):
            hookscope.edit(lm, "blocks.0.attn.z", **kind)
    with torch.no_grad(), hookscope.edit(lm, "blocks.0.resid_post", output=torch.zeros_like, at=hookscope.at[:, -1]), \
            hookscope.capture(lm, "transformer.h.0") as rec:  # entered after the edit: it sees the edited output
        lm(ids)
    out = rec["transformer.h.0"].output
    seen = out if isinstance(out, torch.Tensor) else out[0]
    assert float(seen[0, -1].abs().max()) == 0.0 and float(seen[0, :-1].abs().min()) > 0
    assert no_hooks(lm)
