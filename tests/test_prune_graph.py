"""Channel groups traced in one forward pass (issue 15, point 3): hand-worked small models whose groups,
members and positions are worked out by hand; refusals with their reason; no hook left behind."""

from __future__ import annotations

import pytest
import torch
from helpers import no_hooks
from torch import nn

from hookscope.analysis.prune.graph import Group, ChannelGroups, channel_groups
from hookscope.errors import HookscopeError

X = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))


def _by_producer(gs: ChannelGroups, name: str) -> Group:
    return next(g for g in gs.groups if name in g.producers)


def _member(g: Group, module: str, name: str, dim: int) -> tuple[tuple[int, ...], ...]:
    return next(m.positions for m in g.members if (m.module, m.name, m.dim) == (module, name, dim))


def _keys(g: Group) -> set[tuple[str, str, int, str]]:
    return {(m.module, m.name, m.dim, m.role) for m in g.members}


class Residual(nn.Module):
    """stem -> [a -> bn1 -> relu -> b -> bn2] + stem -> relu -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.a, self.bn1 = nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.b, self.bn2 = nn.Conv2d(6, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        y = self.bn2(self.b(torch.relu(self.bn1(self.a(s)))))
        return self.head(torch.relu(s + y))


def test_residual_add_joins_both_branches_channel_by_channel() -> None:
    gs = channel_groups(Residual(), X)
    assert len(gs.groups) == 2 and [b.producers for b in gs.blocked] == [["head"]]
    stem = _by_producer(gs, "stem")
    assert stem.producers == ["stem", "b"] and stem.size == 4
    assert _keys(stem) == {("stem", "weight", 0, "producer"), ("stem", "bias", 0, "producer"),
                           ("b", "weight", 0, "producer"), ("bn2", "weight", 0, "follower"),
                           ("bn2", "bias", 0, "follower"), ("bn2", "running_mean", 0, "follower"),
                           ("bn2", "running_var", 0, "follower"), ("a", "weight", 1, "consumer"),
                           ("head", "weight", 1, "consumer")}
    # channel k of the stem is channel k of b (the add), read at column k by a and head
    for key in (("stem", "weight", 0), ("b", "weight", 0), ("a", "weight", 1), ("head", "weight", 1)):
        assert _member(stem, *key) == ((0,), (1,), (2,), (3,))
    inner = _by_producer(gs, "a")
    assert inner.size == 6 and _member(inner, "b", "weight", 1) == tuple((k,) for k in range(6))
    assert {m.module for m in inner.members} == {"a", "bn1", "b"}


def test_concatenation_is_one_group_with_each_branch_at_its_offset() -> None:
    class Cat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p, self.q, self.out = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 1), nn.Conv2d(5, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.cat([self.p(x), torch.relu(self.q(x))], 1))

    g = channel_groups(Cat(), X).groups[0]
    assert g.size == 5 and sorted(g.producers) == ["p", "q"]
    assert _member(g, "out", "weight", 1) == ((0,), (1,), (2,), (3,), (4,))
    assert _member(g, "p", "weight", 0) == ((0,), (1,), (), (), ())
    assert _member(g, "q", "weight", 0) == ((), (), (0,), (1,), (2,))


def test_flatten_before_linear_maps_each_channel_to_its_h_times_w_columns() -> None:
    net = nn.Sequential(nn.Conv2d(3, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 16, 3))
    g = channel_groups(net, X).groups[0]
    assert g.size == 2
    assert _member(g, "3", "weight", 1) == (tuple(range(16)), tuple(range(16, 32)))
    assert [s.module for s in g.sites] == ["0", "1", "2"]  # conv, relu and flatten outputs
    assert g.sites[2].dim == 1 and g.sites[2].positions[1] == tuple(range(16, 32))


class SE(nn.Module):
    """conv -> x * sigmoid(fc2(relu(fc1(pool(x))))) -> out, or x + sigmoid(...) when ``add``."""

    def __init__(self, add: bool = False) -> None:
        super().__init__()
        self.conv, self.fc1, self.fc2, self.out = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1), nn.Conv2d(2, 4, 1), \
            nn.Conv2d(4, 1, 1)
        self.add = add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(nn.functional.adaptive_avg_pool2d(x, 1)))))
        return self.out(x + s if self.add else x * s)


def test_squeeze_excitation_scale_is_coupled_and_zero_again_after_the_multiplication() -> None:
    gs = channel_groups(SE(), X)
    g = _by_producer(gs, "conv")
    assert sorted(g.producers) == ["conv", "fc2"] and g.size == 4 and g.blocked == 0
    assert _member(g, "fc2", "weight", 0) == _member(g, "fc1", "weight", 1) == ((0,), (1,), (2,), (3,))
    assert _by_producer(gs, "fc1").size == 2


def test_a_channel_that_is_not_zero_when_masked_is_refused_with_its_reason() -> None:
    gs = channel_groups(SE(add=True), X)  # sigmoid(0) = 0.5 reaches `out`: the column cannot go
    assert all("conv" not in g.producers for g in gs.groups)
    blocked = next(b for b in gs.blocked if "conv" in b.producers)
    assert "not zero when masked" in blocked.reason and "'out'" in blocked.reason


def test_depthwise_conv_follows_its_input_channels() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 2, 1))
    g = channel_groups(net, X).groups[0]
    assert g.producers == ["0"] and g.size == 4
    assert ("1", "weight", 0, "follower") in _keys(g) and ("1", "bias", 0, "follower") in _keys(g)
    assert _member(g, "1", "weight", 0) == _member(g, "2", "weight", 1) == ((0,), (1,), (2,), (3,))


def test_chunk_of_a_channel_dim_is_refused_naming_the_layer() -> None:
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c, self.l, self.r = nn.Conv2d(3, 4, 1), nn.Conv2d(2, 1, 1), nn.Conv2d(2, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = self.c(x).chunk(2, dim=1)
            return self.l(a) + self.r(b)

    gs = channel_groups(Split(), X)
    assert gs.groups == []
    reason = next(b.reason for b in gs.blocked if b.producers == ["c"])
    assert reason == "chunk splits, slices or reorders a channel dim in '(model)'"


def test_layer_norm_over_channels_is_refused_but_the_hidden_layer_before_it_is_not() -> None:
    class LN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.ln, self.head = nn.Linear(3, 8), nn.Linear(8, 5), nn.LayerNorm(5), \
                nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.ln(self.fc2(torch.relu(self.fc1(x)))))

    gs = channel_groups(LN(), torch.randn(1, 3))
    assert [g.producers for g in gs.groups] == [["fc1"]]
    assert next(b.reason for b in gs.blocked if b.producers == ["fc2"]) == "normalised over by layer_norm in 'ln'"


def test_a_layer_called_twice_couples_its_channels_across_calls() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c, self.out = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.c(torch.relu(self.c(x))))

    gs = channel_groups(Twice(), X)
    g = gs.groups[0]  # channel k of the first call is read at column k by the second call: one group
    assert g.size == 3 and _member(g, "c", "weight", 0) == _member(g, "c", "weight", 1) == ((0,), (1,), (2,))


def test_names_are_those_of_the_unwrapped_model_and_no_hook_is_left() -> None:
    net = Residual().train()
    gs = channel_groups(nn.DataParallel(net), X)
    assert sorted(p for g in gs.groups for p in g.producers) == ["a", "b", "stem"]
    assert no_hooks(net) and all(m.training for m in net.modules())


def test_a_model_that_fails_on_the_input_raises_one_line_and_leaves_no_hook() -> None:
    net = Residual()
    with pytest.raises(HookscopeError, match="failed on the example input"):
        channel_groups(net, torch.randn(1, 5, 4, 4))
    assert no_hooks(net)


def test_masked_model_is_traced_on_a_copy_with_masks_permanent() -> None:
    from hookscope.analysis.prune.masks import apply_mask

    net = Residual()
    apply_mask(net.stem, "weight", torch.ones(4, 3, 1, 1))
    gs = channel_groups(net, X)
    assert _by_producer(gs, "stem").size == 4
    assert "weight_orig" in dict(net.stem.named_parameters()) and len(net.stem._forward_pre_hooks) == 1


def test_table_lists_removable_and_blocked_groups() -> None:
    text = channel_groups(Residual(), X).table()
    assert "reaches the model's output" in text and text.endswith("2 removable groups (10 channels), 1 blocked")


def test_grouped_conv_couples_channel_j_of_every_group() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.Conv2d(4, 1, 1))
    gs = channel_groups(net, X)
    first, grouped = _by_producer(gs, "0"), _by_producer(gs, "1")
    assert first.size == grouped.size == 2  # 2 groups of 2: removing channel j of each keeps them even
    assert _member(first, "0", "weight", 0) == ((0, 2), (1, 3))
    assert _member(first, "1", "weight", 1) == ((0,), (1,))
    assert _member(grouped, "1", "weight", 0) == _member(grouped, "2", "weight", 1) == ((0, 2), (1, 3))


def test_grouped_transposed_conv_is_refused() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ConvTranspose2d(4, 4, 2, groups=2), nn.Conv2d(4, 1, 1))
    gs = channel_groups(net, X)
    assert gs.groups == []
    assert "read by a grouped conv_transpose2d (groups=2) in '1'" in {b.reason for b in gs.blocked}


def test_transformer_layer_keeps_its_mlp_hidden_units_and_refuses_the_rest() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True).eval()
    gs = channel_groups(layer, torch.randn(1, 5, 8))
    assert [(g.producers, g.size) for g in gs.groups] == [(["linear1"], 16)]
    g = gs.groups[0]
    assert _member(g, "linear2", "weight", 1) == tuple((k,) for k in range(16))
    reasons = " | ".join(b.reason for b in gs.blocked)
    assert "multi_head_attention_forward" in reasons or "normalised over by layer_norm" in reasons


def test_a_layer_scale_parameter_is_a_follower() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.gamma, self.head = nn.Linear(3, 4), nn.Parameter(torch.ones(4)), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.gamma * torch.relu(self.fc(x)))

    g = channel_groups(Scale(), torch.randn(2, 3)).groups[0]
    assert ("", "gamma", 0, "follower") in _keys(g) and _member(g, "", "gamma", 0) == ((0,), (1,), (2,), (3,))


class FromData(nn.Module):
    """conv a -> relu -> an op with an operand computed from the input (bool or int) -> conv c."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.a, self.c = kind, nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, low = torch.relu(self.a(x)), x[:, :1] < -3  # never true on the example input
        out = {"where": lambda: torch.where(~low, y, 1.0), "masked_fill": lambda: y.masked_fill(low, 0.5),
               "int_add": lambda: y + low.long(), "mul": lambda: y * (~low),
               "where_zero": lambda: torch.where(low, 0.0, y)}[self.kind]()
        return self.c(out)


EXAMPLE = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1)).clamp(min=-2)


@pytest.mark.parametrize("kind", ["where", "masked_fill", "int_add"])
def test_a_mask_from_the_data_is_tried_both_ways_so_the_example_does_not_decide(kind: str) -> None:
    gs = channel_groups(FromData(kind), EXAMPLE)  # on another input the masked channels become 1.0 / 0.5 / 1
    assert all("a" not in g.producers for g in gs.groups)
    blocked = next(b for b in gs.blocked if "a" in b.producers)
    assert blocked.size == 8 and blocked.reason == "read by conv2d in 'c' where it is not zero when masked"


@pytest.mark.parametrize("kind", ["mul", "where_zero"])
def test_a_mask_from_the_data_that_keeps_zeros_zero_leaves_the_group_removable(kind: str) -> None:
    g = _by_producer(channel_groups(FromData(kind), EXAMPLE), "a")
    assert g.size == 8 and g.blocked == 0 and _member(g, "c", "weight", 1) == tuple((k,) for k in range(8))


class PReLUNet(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.a, self.p, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(n), nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.p(self.a(x)))


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (2, 3, 8, 8), (1, 3, 4, 4), (2, 3, 5, 3)])
def test_channel_wise_prelu_weight_follows_dim_1_whatever_the_spatial_size(shape: tuple[int, ...]) -> None:
    gs = channel_groups(PReLUNet(8), torch.randn(*shape, generator=torch.Generator().manual_seed(0)))
    g = _by_producer(gs, "a")
    assert g.size == 8 and g.blocked == 0 and ("p", "weight", 0, "follower") in _keys(g)
    assert _member(g, "p", "weight", 0) == _member(g, "a", "weight", 0) == tuple((k,) for k in range(8))


def test_prelu_with_one_parameter_is_pointwise_and_not_a_member() -> None:
    g = _by_producer(channel_groups(PReLUNet(1), torch.randn(1, 3, 8, 8)), "a")
    assert g.size == 8 and g.blocked == 0 and {m.module for m in g.members} == {"a", "c"}


class Extra(nn.Module):
    """conv a, then ``op`` with an extra tensor (parameter or buffer) of ``shape``, relu, conv c."""

    def __init__(self, shape: tuple[int, ...], buffer: bool, add: bool) -> None:
        super().__init__()
        self.add, self.a, self.c = add, nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 2, 1)
        t = torch.rand(shape, generator=torch.Generator().manual_seed(0)) + 0.5
        if buffer:
            self.register_buffer("s", t)
        else:
            self.s = nn.Parameter(t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.c(torch.relu(y + self.s if self.add else y * self.s))


def test_a_per_channel_buffer_added_to_channels_blocks_them_naming_it() -> None:
    gs = channel_groups(Extra((1, 8, 1, 1), buffer=True, add=True), X)
    assert all("a" not in g.producers for g in gs.groups)
    blocked = next(b for b in gs.blocked if "a" in b.producers)
    assert blocked.size == 8 and blocked.reason == "a buffer 's' is added to these channels in '(model)': it cannot be masked"


def test_a_per_channel_buffer_multiplied_is_a_follower_that_is_sliced_not_masked() -> None:
    g = _by_producer(channel_groups(Extra((1, 8, 1, 1), buffer=True, add=False), X), "a")
    assert g.size == 8 and g.blocked == 0 and ("", "s", 1, "follower") in _keys(g)
    assert _member(g, "", "s", 1) == tuple((k,) for k in range(8))


@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 4, 4)])
@pytest.mark.parametrize("buffer", [False, True])
def test_a_tensor_that_is_the_same_for_every_channel_is_no_follower(shape: tuple[int, ...], buffer: bool) -> None:
    # multiplied: masked channels stay zero, every channel is its own (8 channels, not 1 merged group)
    g = _by_producer(channel_groups(Extra(shape, buffer, add=False), X), "a")
    assert g.size == 8 and g.blocked == 0 and {m.module for m in g.members} == {"a", "c"}
    # added: a masked channel becomes relu(0 + s) > 0, and s cannot be sliced per channel: blocked
    gs = channel_groups(Extra(shape, buffer, add=True), X)
    blocked = next(b for b in gs.blocked if "a" in b.producers)
    assert blocked.size == 8 and blocked.reason == "read by conv2d in 'c' where it is not zero when masked"


# --- the caller's inputs --------------------------------------------------------------------------------------
class Writes(nn.Module):
    """Divides its input in place (and adds into a keyword input) before conv -> bn -> relu -> conv,
    recording what each call received."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        x.div_(2)
        if shift is not None:
            shift.add_(1)
            x = x + shift
        return self.b(torch.relu(self.bn(self.a(x))))


def test_channel_groups_never_writes_the_callers_tensors() -> None:
    net = Writes().eval()
    x, shift = X.clone(), torch.zeros(1)
    gs = channel_groups(net, x, kwargs={"shift": shift})
    assert torch.equal(x, X) and shift.tolist() == [0.0]
    assert len(net.seen) == 1 and torch.equal(net.seen[0], X)
    assert [(g.producers, g.size) for g in gs.groups] == [(["a"], 4)]
    assert no_hooks(net)
