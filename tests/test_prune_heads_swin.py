"""Attention heads of torchvision's window attention (Swin, Swin V2) and of MaxViT's attention: masked
heads removed by ``compact`` with their query / key / value rows, output columns and per-head tables
(Swin and MaxViT: a column of the relative position bias table; Swin V2: a ``logit_scale`` entry and
an output row of the continuous position bias MLP), the compacted model's outputs equal to the masked
model's in float64 (shifted, padded windows too), the importance kinds measured where the layer
computes them, and refusals that leave the model as it was."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.prune import compact, fit_to, prune_heads
from hookscope.core import hook_count
from helpers import only_masks as _only_masks, param_count as _params, rel_first as _rel, state_copy as _state

sw = pytest.importorskip("torchvision.models.swin_transformer")

TOL = 1e-8  # relative, float64
KINDS = ("output", "l2", "taylor", "entropy")


def _square(out: torch.Tensor, batch: object) -> torch.Tensor:
    return out.square().sum()


def _tiny(v2: bool, seed: int = 0) -> nn.Module:
    """Two stages of two blocks, 4 heads of 4 channels, then 4 heads of 8; 4x4 windows. Random weights
    at a scale where every head matters (torchvision starts the tables near zero)."""
    torch.manual_seed(seed)
    kw = {"block": sw.SwinTransformerBlockV2, "downsample_layer": sw.PatchMergingV2} if v2 else {}
    m = sw.SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2, 2], num_heads=[4, 4], window_size=[4, 4],
                           num_classes=5, **kw)
    for p in m.parameters():
        nn.init.normal_(p, std=0.3)
    return m.double().eval()


def _per_head(m: nn.Module, v2: bool) -> int:
    """Parameters one head of attention layer ``m`` holds."""
    d, c = m.qkv.weight.shape[0] // 3 // m.num_heads, m.qkv.weight.shape[1]
    own = 1 + m.cpb_mlp[-1].weight.shape[1] if v2 else m.relative_position_bias_table.shape[0]
    return 3 * d * c + 3 * d + d * c + own  # q/k/v rows, their biases, proj columns, per-head tables


def _attentions(m: nn.Module) -> dict[str, nn.Module]:
    return {n: a for n, a in m.named_modules() if isinstance(a, sw.ShiftedWindowAttention)}


# --- compacted == masked ------------------------------------------------------------------------------
@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("importance", KINDS)
def test_tiny_swin_heads_removed_give_the_masked_outputs(v2: bool, importance: str) -> None:
    net = _tiny(v2)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)  # 8x8 tokens, four 4x4 windows: shifted in stage 1
    with torch.no_grad():
        full = net(x)
    before, per = _params(net), {n: _per_head(a, v2) for n, a in _attentions(net).items()}
    res = prune_heads(net, x, amount=0.5, importance=importance, loss=_square if importance == "taylor" else None)
    assert [(r.kind, r.heads, r.kept) for r in res.rows] == [("swin", 4, 2)] * 4 and res.removed == 8
    with torch.no_grad():
        masked = net(x)
    assert _rel(full, masked) > 1e-3  # the heads masked mattered
    small = compact(net, x)
    assert _rel(masked, small(x)) <= TOL
    assert before - _params(small) == 2 * sum(per.values())
    pruned = "HeadPrunedShiftedWindowAttention" + ("V2" if v2 else "")
    assert [(type(a).__name__, a.num_heads) for a in _attentions(small).values()] == [(pruned, 2)] * 4
    for a in _attentions(small).values():
        assert a.qkv.weight.shape[0] == 3 * a.proj.weight.shape[1] == 3 * 2 * a.qkv.weight.shape[1] // 4
        table = a.cpb_mlp[-1].weight.shape[0] if v2 else a.relative_position_bias_table.shape[1]
        assert table == 2 and (a.logit_scale.shape == (2, 1, 1) if v2 else True)
    assert _only_masks(net) and hook_count(small) == 0


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_padded_windows_other_inputs_pruning_again_and_fit_to(v2: bool) -> None:
    net = _tiny(v2, seed=1)
    x = torch.randn(1, 3, 20, 20, dtype=torch.float64)  # 10x10 tokens: padded to 12x12 windows
    names = list(_attentions(net))
    prune_heads(net, x, heads={names[0]: [0], names[1]: [1, 2], names[3]: [3]})
    small = compact(net, x)
    assert [a.num_heads for a in _attentions(small).values()] == [3, 2, 4, 3]
    other = torch.randn(3, 3, 24, 12, dtype=torch.float64)
    assert _rel(net(other), small(other)) <= TOL
    again = prune_heads(small, x, amount=0.5, importance="output")  # a compacted layer is followed again
    assert [r.heads for r in again.rows] == [3, 2, 4, 3] and [r.kept for r in again.rows] == [2, 1, 2, 2]
    smaller = compact(small, x)
    assert _rel(small(other), smaller(other)) <= TOL
    fresh = _tiny(v2, seed=2)
    fit_to(fresh, smaller.state_dict())  # the heads rebuilt from the shapes alone
    fresh.load_state_dict(smaller.state_dict())
    assert [a.num_heads for a in _attentions(fresh).values()] == [2, 1, 2, 2]
    assert _rel(smaller(other), fresh(other)) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", ["swin_t", "swin_v2_t"])
def test_torchvision_swin_tiny_shrinks_to_the_masked_outputs(name: str) -> None:
    import torchvision

    torch.manual_seed(3)
    net = getattr(torchvision.models, name)(weights=None).double().eval()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    before, per = _params(net), {n: _per_head(a, name.startswith("swin_v2")) for n, a in _attentions(net).items()}
    res = prune_heads(net, x, amount=0.5, importance="l2")
    heads = [3] * 2 + [6] * 2 + [12] * 6 + [24] * 2
    assert [r.heads for r in res.rows] == heads and [r.kept for r in res.rows] == [h - h // 2 for h in heads]
    with torch.no_grad():
        masked = net(x)
    small = compact(net, x)
    with torch.no_grad():
        assert _rel(masked, small(x)) <= TOL
    assert before - _params(small) == sum(per[r.layer] * len(r.removed) for r in res.rows)
    assert [a.num_heads for a in _attentions(small).values()] == [h - h // 2 for h in heads]


# --- importance by hand -------------------------------------------------------------------------------
def _one_window(v2: bool) -> tuple[nn.Module, torch.Tensor]:
    """One window attention over one 4x4 window (no shift), 2 heads of 4 channels."""
    torch.manual_seed(4)
    cls = sw.ShiftedWindowAttentionV2 if v2 else sw.ShiftedWindowAttention
    net = nn.Sequential(cls(8, [4, 4], [2, 2], 2)).double().eval()
    for p in net.parameters():
        nn.init.normal_(p, std=0.5)
    return net, torch.randn(2, 4, 4, 8, dtype=torch.float64)


def _by_hand(net: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """V1 by hand, per head: the probabilities softmax(q k^T / 2 + table[index]) and the output p v."""
    a = net[0]
    t = x.reshape(2, 16, 8)
    q, k, v = (t @ w.T + b for w, b in zip(a.qkv.weight.split(8), a.qkv.bias.split(8)))
    bias = a.relative_position_bias_table[a.relative_position_index].view(16, 16, 2)
    heads = []
    for h in range(2):
        s = slice(4 * h, 4 * h + 4)
        p = torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / 2 + bias[..., h], -1)
        heads.append((p, p @ v[..., s]))
    return heads


def test_output_and_entropy_importance_are_those_worked_out_by_hand() -> None:
    net, x = _one_window(False)
    with torch.no_grad():
        heads = _by_hand(net, x)
    norms = [float(o.norm(dim=-1).mean()) for _, o in heads]
    ents = [float(-(p * p.log()).sum(-1).mean()) for p, _ in heads]
    out = prune_heads(copy.deepcopy(net), x, amount=0.5)
    ent = prune_heads(copy.deepcopy(net), x, amount=0.5, importance="entropy")
    assert out.rows[0].scores == pytest.approx(norms, rel=1e-10)
    assert ent.rows[0].scores == pytest.approx(ents, rel=1e-10)
    assert out.rows[0].removed == (norms.index(min(norms)),) and ent.rows[0].removed == (ents.index(max(ents)),)
    with torch.no_grad():  # a head whose queries and keys see nothing attends uniformly: log 16 nats
        net[0].qkv.weight[0:4] = 0
        net[0].qkv.bias[0:4] = 0
        net[0].relative_position_bias_table[:, 0] = 0
    assert prune_heads(net, x, amount=0.5, importance="entropy").rows[0].scores[0] == pytest.approx(math.log(16))


def test_a_masked_head_adds_nothing_to_the_layers_output() -> None:
    net, x = _one_window(False)
    with torch.no_grad():
        (_, o0), _ = _by_hand(net, x)
        alone = o0 @ net[0].proj.weight[:, :4].T + net[0].proj.bias  # head 0 through its proj columns
    prune_heads(net, x, heads={"0": [1]})
    with torch.no_grad():
        assert _rel(alone, net(x).reshape(2, 16, 8)) <= TOL
        assert _rel(alone, compact(net, x)(x).reshape(2, 16, 8)) <= TOL


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_taylor_and_l2_read_every_tensor_of_a_head(v2: bool) -> None:
    net, x = _one_window(v2)
    with torch.no_grad():  # head 1 without values: no output, so no Taylor importance
        net[0].qkv.weight[16 + 4:24] = 0
        net[0].qkv.bias[16 + 4:24] = 0
    tay = prune_heads(copy.deepcopy(net), x, amount=0.5, importance="taylor", loss=_square)
    assert tay.rows[0].scores[1] == 0 and tay.rows[0].scores[0] > 0 and tay.rows[0].removed == (1,)
    a = net[0]
    tables = [a.logit_scale.detach().flatten(), a.cpb_mlp[-1].weight.detach()] if v2 \
        else [a.relative_position_bias_table.detach().T]
    w, b, o = a.qkv.weight.detach(), a.qkv.bias.detach(), a.proj.weight.detach()
    by_hand = [float(sum(w[j * 8 + 4 * h:j * 8 + 4 * h + 4].pow(2).sum()
                         + b[j * 8 + 4 * h:j * 8 + 4 * h + 4].pow(2).sum() for j in range(3))
                     + o[:, 4 * h:4 * h + 4].pow(2).sum() + sum(t[h].pow(2).sum() for t in tables)) ** 0.5
               for h in range(2)]
    assert prune_heads(net, x, amount=0.5, importance="l2").rows[0].scores == pytest.approx(by_hand, rel=1e-12)


# --- refusals -------------------------------------------------------------------------------------------
def test_a_request_that_leaves_a_layer_no_head_is_refused_untouched() -> None:
    net = _tiny(False)
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    before = _state(net)
    with pytest.raises(hookscope.HookscopeError, match="'features.1.0.attn' would keep no attention head") as e:
        prune_heads(net, x, heads={"features.1.0.attn": [0, 1, 2, 3]})
    assert "\n" not in str(e.value) and hook_count(net) == 0
    after = net.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], v) for k, v in after.items())


def test_a_window_attention_with_its_own_forward_is_named_and_left_alone() -> None:
    class Mine(sw.ShiftedWindowAttention):  # type: ignore[misc]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    net = nn.Sequential(Mine(8, [4, 4], [0, 0], 2)).double().eval()
    x = torch.randn(1, 4, 4, 8, dtype=torch.float64)
    with pytest.raises(hookscope.HookscopeError, match="'0' is a ShiftedWindowAttention with a forward of its own"):
        prune_heads(net, x, amount=0.5, layers="0")
    with pytest.raises(hookscope.HookscopeError, match="'0' is a ShiftedWindowAttention with a forward of its own"):
        prune_heads(net, x, amount=0.5)  # no other attention layer: the one that looked like it says why
    assert hook_count(net) == 0 and type(net[0]) is Mine


# --- MaxViT -------------------------------------------------------------------------------------------
def _maxvit(seed: int = 0) -> nn.Module:
    """One MaxViT block: a window attention and a grid attention, 4 heads of 4 channels each."""
    mv = pytest.importorskip("torchvision.models.maxvit")
    torch.manual_seed(seed)
    m = mv.MaxVit(input_size=(16, 16), stem_channels=8, partition_size=2, block_channels=[16], block_layers=[1],
                  head_dim=4, stochastic_depth_prob=0.0, num_classes=5)
    for p in m.parameters():
        nn.init.normal_(p, std=0.3)
    return m.double().eval()


def _maxvit_attentions(m: nn.Module) -> dict[str, nn.Module]:
    return {n: a for n, a in m.named_modules() if type(a).__name__.endswith("RelativePositionalMultiHeadAttention")}


@pytest.mark.parametrize("importance", ["entropy"])  # "output" and "taylor" read merge's input, as timm's
def test_maxvit_heads_removed_give_the_masked_outputs_and_fit_to_rebuilds_them(importance: str) -> None:
    net = _maxvit()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        full = net(x)
    before = _params(net)
    res = prune_heads(net, x, amount=0.5, importance=importance)
    assert [(r.kind, r.heads, r.kept) for r in res.rows] == [("maxvit", 4, 2)] * 2
    with torch.no_grad():
        masked = net(x)
    small = compact(net, x)
    assert _rel(full, masked) > 1e-3 and _rel(masked, small(x)) <= TOL
    assert before - _params(small) == 2 * 2 * (3 * 4 * 16 + 3 * 4 + 4 * 16 + 9)  # q/k/v rows, biases, merge, table
    assert [(type(a).__name__, a.n_heads, a.to_qkv.out_features, a.merge.in_features,
             a.relative_position_bias_table.shape[1]) for a in _maxvit_attentions(small).values()] == \
        [("HeadPrunedRelativePositionalMultiHeadAttention", 2, 24, 8, 2)] * 2
    fresh = _maxvit(seed=1)
    fit_to(fresh, small.state_dict())
    fresh.load_state_dict(small.state_dict())
    assert [a.n_heads for a in _maxvit_attentions(fresh).values()] == [2, 2] and _rel(masked, fresh(x)) <= TOL
    assert _only_masks(net) and hook_count(small) == 0


def test_maxvit_taylor_and_entropy_scores_read_its_heads() -> None:
    net = _maxvit()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    first = list(_maxvit_attentions(net))[0]
    with torch.no_grad():  # head 2 of the first attention: no values (no Taylor importance), uniform attention
        a = _maxvit_attentions(net)[first]
        for rows in (slice(8, 12), slice(32 + 8, 32 + 12)):
            a.to_qkv.weight[rows] = 0
            a.to_qkv.bias[rows] = 0
        a.relative_position_bias_table[:, 2] = 0
    tay = prune_heads(copy.deepcopy(net), x, amount=0.25, importance="taylor", loss=_square)
    assert tay.rows[0].scores[2] == 0 and min(tay.rows[0].scores[:2] + tay.rows[0].scores[3:]) > 0
    ent = prune_heads(net, x, amount=0.25, importance="entropy")
    assert ent.rows[0].scores[2] == pytest.approx(math.log(4)) and ent.rows[0].removed == (2,)  # 2x2 partitions
