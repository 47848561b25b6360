"""Physical removal of masked channels (issue 15, point 3): compacted outputs equal the masked model's
(max abs diff < 1e-5), parameter counts equal the ones worked out by hand, refusals leave the model
untouched, no hook is left behind, training flags are kept."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import no_hooks
from torch import nn

from hookscope.analysis.prune.channels import dropped_channels, mask_channels
from hookscope.analysis.prune.compact import compact
from hookscope.analysis.prune.graph import Group, ChannelGroups, channel_groups
from hookscope.core import hook_count
from hookscope.errors import HookscopeError


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _group(gs: ChannelGroups, producer: str) -> Group:
    return next(g for g in gs.groups if producer in g.producers)


def _seeded(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _prune(model: nn.Module, x: torch.Tensor, producer: str, k: int) -> tuple[nn.Module, int, ChannelGroups]:
    """Mask the first k channels of the group of ``producer``, compact, check outputs; return the
    compacted model and the parameters removed."""
    gs = channel_groups(model, x)
    mask_channels(model, gs, {_group(gs, producer).index: list(range(k))})
    small = compact(model, x)
    with torch.no_grad():
        gap = float((small(x) - model(x)).abs().max())
    assert gap < 1e-5, gap
    assert no_hooks(small)
    return small, _params(model) - _params(small), gs


def _torchvision(name: str) -> nn.Module:
    """torchvision's model ``name``, random weights (seed 0), float64, eval mode. ``resnet50:short`` and
    ``densenet121:short`` keep the full model's stem and first stage (ResNet-50's three bottlenecks of layer1;
    DenseNet-121's first dense block of six layers and its transition) with one block in each later stage."""
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models import densenet, resnet

    torch.manual_seed(0)  # float64: an untrained deep net's large outputs keep 1e-5 meaningful
    if name == "resnet50:short":
        model: nn.Module = resnet.ResNet(resnet.Bottleneck, [3, 1, 1, 1])
    elif name == "densenet121:short":
        model = densenet.DenseNet(32, (6, 1, 1, 1), 64)
    else:
        model = torchvision.models.get_model(name, weights=None)
    return model.double().eval()


@pytest.mark.parametrize("k", [1, 5])
def test_resnet18_inner_group_removes_rows_bn_entries_and_next_columns(k: int) -> None:
    small, removed, _ = _prune(_torchvision("resnet18"), _seeded(1, 3, 64, 64, dtype=torch.float64), "layer1.0.conv1", k)
    # conv1 rows (64 x 3 x 3 each), bn1 weight and bias, conv2 input columns (64 x 3 x 3 each)
    assert removed == k * 64 * 9 + 2 * k + k * 64 * 9
    assert small.layer1[0].conv1.out_channels == small.layer1[0].bn1.num_features == 64 - k
    assert small.layer1[0].conv2.in_channels == 64 - k


@pytest.mark.slow
def test_resnet18_residual_stream_group_reaches_every_branch() -> None:
    k = 3
    small, removed, gs = _prune(_torchvision("resnet18"), _seeded(1, 3, 64, 64, dtype=torch.float64), "conv1", k)
    assert sorted(_group(gs, "conv1").producers) == ["conv1", "layer1.0.conv2", "layer1.1.conv2"]
    per = (3 * 49 + 2  # stem conv rows + bn1
           + 64 * 9 + 64 * 9 + 2  # layer1.0: conv1 columns, conv2 rows, bn2
           + 64 * 9 + 64 * 9 + 2  # layer1.1: the same
           + 128 * 9 + 128)  # layer2.0: conv1 columns and downsample columns
    assert removed == k * per
    assert small.layer2[0].downsample[0].in_channels == 64 - k


@pytest.mark.slow
def test_resnet50_bottleneck_group() -> None:
    k = 4
    _, removed, _ = _prune(_torchvision("resnet50:short"), _seeded(1, 3, 64, 64, dtype=torch.float64), "layer1.0.conv1", k)
    assert removed == k * (64 * 1 + 2 + 64 * 9)  # 1x1 rows, bn1, 3x3 columns


def test_mobilenet_v2_depthwise_follows_the_expansion() -> None:
    k = 7
    small, removed, _ = _prune(_torchvision("mobilenet_v2"), _seeded(1, 3, 64, 64, dtype=torch.float64), "features.2.conv.0.0", k)
    # expand rows (16), bn (2), depthwise rows (9), bn (2), project columns (24)
    assert removed == k * (16 + 2 + 9 + 2 + 24)
    dw = small.features[2].conv[1][0]
    assert dw.groups == dw.in_channels == dw.out_channels == 96 - k


@pytest.mark.slow
def test_vgg11_bn_first_conv() -> None:
    k = 10
    _, removed, _ = _prune(_torchvision("vgg11_bn"), _seeded(1, 3, 64, 64, dtype=torch.float64), "features.0", k)
    assert removed == k * (27 + 1 + 2 + 128 * 9)  # rows, bias, bn, next conv's columns (128 x 3 x 3)


@pytest.mark.slow
def test_densenet121_stem_reaches_every_layer_of_the_first_block() -> None:
    k = 2
    _, removed, _ = _prune(_torchvision("densenet121:short"), _seeded(1, 3, 64, 64, dtype=torch.float64), "features.conv0", k)
    # conv0 rows (3 x 7 x 7), norm0; six dense layers each read it (norm1 weight+bias, conv1 columns x 128);
    # transition1 reads it too (norm weight+bias, conv columns x 128)
    assert removed == k * (147 + 2 + 6 * (2 + 128) + 2 + 128)


def test_demo_model_every_group_masked_and_outputs_equal() -> None:
    from hookscope.zoo import demo_model

    net, x = demo_model(), _seeded(2, 3, 64, 64)
    gs = channel_groups(net, x[:1])
    assert [g.producers for g in gs.groups] == [["stem.0"], ["layer1.0"], ["layer1.3"], ["layer2.0"],
                                                ["layer2.3"], ["layer3.0"], ["layer3.3"]]
    mask_channels(net, gs, {g.index: list(range(0, g.size, 2)) for g in gs.groups})  # every other channel
    small = compact(net, x)
    assert torch.allclose(small(x), net(x), atol=1e-5, rtol=0)
    widths = [3, 16, 32, 32, 64, 64, 64, 64]
    kept = [3] + [w // 2 for w in widths[1:]]
    expect = sum(kept[i] * kept[i + 1] * 9 + 2 * kept[i + 1] for i in range(7)) + kept[-1] * 6 + 6
    assert _params(small) == expect


def test_dropped_channels_need_every_producer_and_follower_zero() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(1, 3, 4, 4)
    gs = channel_groups(net, x)
    with torch.no_grad():
        net[0].weight[1] = 0
        net[0].bias[1] = 0  # zero conv row and bias, but BN bias 1 is not zero: channel 1 is a constant
    assert dropped_channels(net, gs) == {}
    with torch.no_grad():
        net[1].weight[1] = 0
        net[1].bias[1] = 0
    assert dropped_channels(net, gs) == {0: [1]}


def test_every_channel_masked_keeps_one_so_the_layers_still_run() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(1, 3, 4, 4)
    mask_channels(net, channel_groups(net, x), {0: [0, 1, 2, 3]})
    small = compact(net, x)
    assert small[0].out_channels == 1 and torch.equal(small(x), net(x))


class HardCoded(nn.Module):
    """Flattens with a size fixed when the model was written: the tracer cannot see it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 1), nn.Linear(4 * 16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).view(1, 64))


def test_refusal_names_the_module_and_leaves_the_model_untouched() -> None:
    net, x = HardCoded().train(), _seeded(1, 3, 4, 4)
    mask_channels(net, channel_groups(net, x), {0: [0]})
    state, hooks = copy.deepcopy(net.state_dict()), hook_count(net)
    with pytest.raises(HookscopeError, match=r"compaction refused: .*'\(model\)' raised.*unchanged") as err:
        compact(net, x)
    assert "\n" not in str(err.value)
    after = net.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    assert hook_count(net) == hooks and all(m.training for m in net.modules())


def test_train_mode_kept_wrapped_model_and_requires_grad() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(1, 3, 4, 4)
    net[3].weight.requires_grad_(False)
    gs = channel_groups(nn.DataParallel(net), x)
    mask_channels(nn.DataParallel(net), gs, {0: [2]})
    net.train()
    small = compact(nn.DataParallel(net), x)
    assert isinstance(small, nn.Sequential) and small[1].training and net[1].training
    assert small[3].weight.requires_grad is False and small[0].weight.requires_grad is True
    assert not any(n.endswith("_orig") for n, _ in small.named_parameters())
    assert no_hooks(small) and net[1].num_batches_tracked == 0  # the verification ran in eval mode


@pytest.mark.parametrize("bad, match", [({5: [0]}, "no removable channel group 5"),
                                        ({0: [4]}, "channel 4 does not exist")])
def test_mask_channels_bad_input_is_one_line(bad: dict[int, list[int]], match: str) -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    gs = channel_groups(net, _seeded(1, 3, 2, 2))
    with pytest.raises(HookscopeError, match=match):
        mask_channels(net, gs, bad)
    assert no_hooks(net)


def test_grouped_conv_stripe_removed_from_every_group() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.ReLU(),
                        nn.Conv2d(4, 1, 1)).eval()
    x = _seeded(1, 3, 5, 5)
    gs = channel_groups(net, x)
    mask_channels(net, gs, {_group(gs, "1").index: [0]})
    small = compact(net, x)
    assert (small[1].in_channels, small[1].out_channels, small[1].groups, small[3].in_channels) == (4, 2, 2, 2)
    assert _params(net) - _params(small) == 2 * (2 * 9) + 2 + 2  # two rows of 2x3x3, their bias, two columns
    assert torch.allclose(small(x), net(x), atol=1e-6, rtol=0)


def test_torch_prune_masks_are_read_and_made_permanent_in_the_copy() -> None:
    from torch.nn.utils import prune

    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(1, 3, 4, 4)
    prune.ln_structured(net[0], "weight", amount=2, n=2, dim=0)
    rows = net[0].weight_mask.flatten(1).amax(1).eq(0).nonzero().flatten().tolist()
    prune.custom_from_mask(net[0], "bias", (torch.arange(4).unsqueeze(0) != torch.tensor(rows).unsqueeze(1)).all(0))
    small = compact(net, x)
    assert small[0].out_channels == 2 and small[2].in_channels == 2
    assert torch.allclose(small(x), net(x), atol=1e-6, rtol=0) and hasattr(net[0], "weight_orig")


def test_in_place_residual_add_and_shared_relu_of_tiny_resnet() -> None:
    from hookscope.zoo import TinyResNet

    net, x = TinyResNet().eval(), _seeded(2, 3, 32, 32)
    gs = channel_groups(net, x[:1])
    stem = _group(gs, "stem.0")
    assert sorted(stem.producers) == ["layer1.0.conv2", "layer1.1.conv2", "stem.0"]  # joined by `out += x`
    k = 5
    mask_channels(net, gs, {stem.index: list(range(3, 3 + k))})
    before = _params(net)
    small = compact(net, x)
    # stem rows + bn; per block: conv1 columns, conv2 rows, bn2; then `down` columns (32 x 3 x 3)
    assert before - _params(small) == k * (27 + 2 + 2 * (144 + 144 + 2) + 288)
    assert torch.allclose(small(x), net(x), atol=1e-5, rtol=0)


class AuxHead(nn.Module):
    """An auxiliary head that runs only in training, reading the channels of `a` (through functional
    dropout, as GoogLeNet's heads do)."""

    def __init__(self, kernel: int = 1) -> None:
        super().__init__()
        self.a, self.out, self.aux = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1), nn.Conv2d(4, 2, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.training:
            return self.out(h) + self.aux(F.dropout(h, 0.5, self.training)).mean()
        return self.out(h)


def _training_branches(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output with its containers in training mode, leaves in eval mode, dropout off."""
    from hookscope.analysis.prune.graph import traced_mode

    with traced_mode(model, wide=True), torch.no_grad():
        return model(x)


def test_a_layer_run_only_in_training_is_followed_and_checked_in_that_mode() -> None:
    torch.manual_seed(0)
    net, x = AuxHead().eval(), _seeded(1, 3, 4, 4)
    gs = channel_groups(net, x)
    assert gs.unseen == ["aux"] and "did not run on the example input, left as they are: aux" in gs.table()
    mask_channels(net, gs, {0: [1]})
    rng, flags = torch.random.get_rng_state(), [m.training for m in net.modules()]
    small = compact(net, x)
    assert small.a.out_channels == 3 and small.aux.in_channels == 3 and small.out.in_channels == 3
    assert torch.equal(rng, torch.random.get_rng_state()) and [m.training for m in net.modules()] == flags
    assert no_hooks(small) and hook_count(net) == 2  # the two masks (weight, bias of `a`), nothing else
    with torch.no_grad():
        torch.testing.assert_close(small(x), net(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(_training_branches(small, x), _training_branches(net, x), rtol=0, atol=1e-6)
    # the head really reads the pruned channels: left as it was, it fails in training mode
    left = compact(net, x, allow_unseen=True)
    assert left.aux.in_channels == 3  # what can be followed is followed, also when unseen layers are allowed


class NeverCalled(nn.Module):
    """A layer with parameters that no forward pass calls (left over), reading `a`'s width."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.out, self.spare = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1), nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.a(x)))


def test_a_layer_that_runs_in_no_mode_refuses_naming_both_spellings_of_the_flag_unless_allowed() -> None:
    net, x = NeverCalled().eval(), _seeded(1, 3, 4, 4)
    gs = channel_groups(net, x)
    mask_channels(net, gs, {0: [1]})
    with pytest.raises(HookscopeError, match=r"^compaction refused: 'spare' did not run on the example input in eval "
                       r"mode, and not in its training-mode branches either.*allow_unseen=True \(--allow-unseen "
                       r"on the command line\)") as e:
        compact(net, x)
    assert "\n" not in str(e.value) and hook_count(net) == 2
    small = compact(net, x, allow_unseen=True)
    assert small.a.out_channels == 3 and small.spare.in_channels == 4


def test_training_branches_that_fail_on_the_example_input_are_named_in_the_refusal() -> None:
    net, x = AuxHead(kernel=5).eval(), _seeded(1, 3, 4, 4)  # a 5x5 head on a 4x4 map
    mask_channels(net, channel_groups(net, x), {0: [1]})
    with pytest.raises(HookscopeError, match=r"'aux' did not run .* training-mode branches fail on it "
                       r"\(RuntimeError: .*allow_unseen=True \(--allow-unseen"):
        compact(net, x)
    assert compact(net, x, allow_unseen=True).aux.in_channels == 4


def test_training_branches_are_traced_without_changing_buffers_or_the_random_stream() -> None:
    class Stats(AuxHead):
        """A container that counts its training calls in a buffer and draws random numbers in training."""

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            if self.training:
                self.calls.add_(1)
                return self.out(h) + self.aux(h).mean() + 0 * torch.rand(())
            return self.out(h)

    net, x = Stats().eval(), _seeded(2, 3, 4, 4)
    mask_channels(net, channel_groups(net, x), {0: [2]})
    state = copy.deepcopy(net.state_dict())
    rng = torch.random.get_rng_state()
    small = compact(net, x)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())
    assert torch.equal(rng, torch.random.get_rng_state()) and small.aux.in_channels == 3
    assert float(net.calls) == float(small.calls) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name, size, head", [("googlenet", 64, "aux1.conv.conv"),
                                              ("inception_v3", 299, "AuxLogits.conv0.conv")])
def test_googlenet_and_inception_v3_compact_by_default_following_their_auxiliary_heads(name, size, head) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.get_model(name, weights=None, init_weights=False).eval()
    x = _seeded(1, 3, size, size)
    gs = channel_groups(net, x)
    assert any(u.startswith(head.split(".")[0]) for u in gs.unseen)  # the heads run only in training
    block = ("inception4a", "Mixed_6e")  # whose output the head reads
    fed = next(g for g in gs.groups if any(m.module.startswith(block) for m in g.members if m.role == "producer"))
    drop = list(range(0, fed.size, 4))
    mask_channels(net, gs, {fed.index: drop})
    small = compact(net, x)
    made = [m for m in fed.members if m.role == "producer" and m.name == "weight" and m.module.startswith(block)]
    read = [k for k in drop if any(m.positions[k] for m in made)]  # of the block's channels, not later ones
    assert read and small.get_submodule(head).in_channels == net.get_submodule(head).in_channels - len(read)
    with torch.no_grad():
        torch.testing.assert_close(small(x), net(x), rtol=0, atol=1e-5)
    for a, b in zip(_training_branches(small, x), _training_branches(net, x)):  # every head's output too
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_layer_scale_parameter_is_masked_and_sliced_with_its_channels() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.gamma, self.head = nn.Linear(3, 4), nn.Parameter(torch.arange(1.0, 5.0)), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.gamma * torch.relu(self.fc(x)))

    net, x = Scale(), _seeded(2, 3)
    mask_channels(net, channel_groups(net, x), {0: [1, 2]})
    assert net.gamma.tolist() == [1.0, 0.0, 0.0, 4.0]
    small = compact(net, x)
    assert small.gamma.tolist() == [1.0, 4.0] and small.fc.out_features == small.head.in_features == 2
    assert torch.allclose(small(x), net(x), atol=1e-6, rtol=0)


class Attention(nn.Module):
    """A block whose ``attn.out_proj`` never runs as a module: MultiheadAttention reads its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.attn, self.head = nn.Linear(3, 8), nn.MultiheadAttention(4, 2, batch_first=True), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.head(torch.relu(self.fc(x)))
        return self.attn(h, h, h, need_weights=False)[0]


def test_a_layer_whose_weights_its_parent_reads_is_seen_and_compaction_goes_through() -> None:
    net, x = Attention().eval(), _seeded(1, 5, 3)
    gs = channel_groups(net, x)
    assert gs.unseen == []  # attn.out_proj did not run, but attention read its weight and bias
    fc = _group(gs, "fc")
    assert [g.producers for g in gs.groups] == [["fc"]]  # what attention reads is blocked
    mask_channels(net, gs, {fc.index: [0, 5, 6]})
    small = compact(net, x)
    assert small.fc.out_features == 5 and small.head.in_features == 5 and small.attn.out_proj.in_features == 4
    assert torch.allclose(small(x), net(x), atol=1e-6, rtol=0) and no_hooks(small)


def test_the_compacted_copy_shares_no_memory_with_the_model_and_holds_no_mask() -> None:
    from torch.nn.utils import prune

    net = nn.Sequential(nn.Conv2d(3, 6, 1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1, bias=False), nn.ReLU(),
                        nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(1, 3, 4, 4)
    gs = channel_groups(net, x)
    mask_channels(net, gs, {_group(gs, "0").index: [1, 4]})
    prune.ln_structured(net[3], "weight", amount=1, n=2, dim=0)  # torch's mask on another group
    state = {k: v.clone() for k, v in net.state_dict().items()}
    small = compact(net, x)
    assert (small[0].out_channels, small[3].out_channels, small[5].in_channels) == (4, 3, 3)
    ptrs = {t.untyped_storage().data_ptr() for t in (*net.parameters(), *net.buffers())}
    assert not ptrs & {t.untyped_storage().data_ptr() for t in (*small.parameters(), *small.buffers())}
    assert not [n for n, _ in small.named_buffers() if n.endswith("_mask")] and no_hooks(small)
    with torch.no_grad():
        for t in small.parameters():
            t.add_(1.0)  # training the copy must not move the model
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())


def test_a_copy_of_an_unmasked_model_is_still_a_copy() -> None:
    net, x = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval(), _seeded(2, 3)
    small = compact(net, x)
    assert small is not net and small[0] is not net[0] and small[0].weight is not net[0].weight
    assert torch.equal(small(x), net(x))


def test_compacted_prelu_keeps_the_slopes_of_the_kept_channels_on_any_input() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.p, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.p(self.a(x)))

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.p.weight.copy_(torch.arange(1.0, 9.0) / 10)
    x = _seeded(1, 3, 8, 8)  # spatial size 8 = the channel count: must not be read as a trailing dim
    small, removed, _ = _prune(net, x, "a", 3)
    assert small.p.weight.tolist() == pytest.approx([0.4, 0.5, 0.6, 0.7, 0.8])
    assert removed == 3 * 27 + 3 + 3 + 3 * 2 and small.a.out_channels == small.c.in_channels == 5
    other = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert float((small(other) - net(other)).abs().max()) < 1e-5


def test_a_mask_from_the_data_that_keeps_zeros_zero_compacts_exactly_on_an_input_that_uses_it() -> None:
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            low = x[:, :1] < -3
            return self.c(torch.where(low, 0.0, torch.relu(self.a(x))) * (~low))

    torch.manual_seed(0)
    net, x = Gate(), _seeded(2, 3, 4, 4).clamp(min=-2)
    small, removed, _ = _prune(net, x, "a", 4)
    assert removed == 4 * 27 + 4 + 4 * 2
    odd = _seeded(2, 3, 4, 4)
    odd[:, 0, 1, 1] = -5.0
    with torch.no_grad():
        assert float((small(odd) - net(odd)).abs().max()) < 1e-5


def test_a_buffer_added_to_channels_is_never_masked_and_a_multiplied_one_is_sliced() -> None:
    class Buf(nn.Module):
        def __init__(self, add: bool) -> None:
            super().__init__()
            self.add, self.a, self.c = add, nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1)
            self.register_buffer("s", torch.arange(1.0, 5.0).view(1, 4, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            return self.c(y + self.s if self.add else y * self.s)

    torch.manual_seed(0)
    x = _seeded(1, 3, 4, 4)
    assert all("a" not in g.producers for g in channel_groups(Buf(True), x).groups)
    net = Buf(False)
    small, removed, _ = _prune(net, x, "a", 2)
    assert small.s.flatten().tolist() == [3.0, 4.0] and removed == 2 * 3 + 2 + 2 * 2
    assert net.s.flatten().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_compacted_prelu_states_its_new_size_and_loads_back_through_fit_to():
    import hookscope
    from hookscope.analysis.prune import fit_to

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Conv2d(8, 2, 1)).eval()
    x = torch.randn(1, 3, 6, 6)
    hookscope.prune_channels(net, x, amount=0.5)
    small = hookscope.compact(net, x)
    assert small[1].num_parameters == 4 == small[1].weight.numel()
    fresh = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Conv2d(8, 2, 1)).eval()
    fit_to(fresh, small.state_dict())
    fresh.load_state_dict(small.state_dict())
    assert fresh[1].num_parameters == 4 and torch.equal(fresh(x), small(x))


# --- the caller's inputs: every run sees them as given --------------------------------------------------------
class Writes(nn.Module):
    """Divides its input in place before conv -> bn -> relu -> conv; records what each call received
    (a deep copy shares the record, so the compacted copy's runs are seen too)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.bn, self.b = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.Conv2d(6, 2, 1)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        x.div_(2)
        return self.b(torch.relu(self.bn(self.a(x))))

    def __deepcopy__(self, memo: dict) -> Writes:
        new = Writes.__new__(Writes)
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "seen"})
        new.seen = self.seen
        return new


def test_compact_of_a_model_writing_into_its_input_succeeds_and_leaves_the_input_alone() -> None:
    net, x = Writes().eval(), _seeded(1, 3, 5, 5)
    x0 = x.clone()
    mask_channels(net, channel_groups(net, x), {0: [0, 2, 5]})
    assert torch.equal(x, x0)
    small = compact(net, x)
    assert torch.equal(x, x0)
    assert net.seen and all(torch.equal(s, x0) for s in net.seen)  # the traced pass and both checked ones
    assert small.a.out_channels == small.bn.num_features == small.b.in_channels == 3
    with torch.no_grad():
        torch.testing.assert_close(small(x0.clone()), net(x0.clone()), rtol=0, atol=1e-6)


def test_compact_leaves_an_input_that_a_first_in_place_relu_would_rewrite() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = _seeded(2, 3, 3, 3)
    x0 = x.clone()
    assert float(x.min()) < 0
    mask_channels(net, channel_groups(net, x), {0: [1]})
    small = compact(net, x)
    assert torch.equal(x, x0) and small[1].out_channels == 3
