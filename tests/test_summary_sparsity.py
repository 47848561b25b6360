"""summary shows sparsity: zeros of each layer's own weights, masks applied, each tensor once in the total.

Expected counts are worked out by hand (torch.nn.utils.prune zeroes round(amount * n) elements for
l1_unstructured; ln_structured whole output channels) and checked against an independent count of
the weights the pruned layers compute with.
"""

import json

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from hookscope import summary
from hookscope.analysis._sparsity import effective, masked, model_zeros, module_zeros, zeros_in
from hookscope.core import hook_count
from hookscope.zoo import TinyResNet


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),  # 216 weights + 8 biases
        nn.ReLU(),
        nn.Conv2d(8, 4, 3),  # 288 weights + 4 biases; 6x6 -> 4x4
        nn.Flatten(),
        nn.Linear(64, 5),  # 320 weights + 5 biases
    ).eval()


X = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))


def _pruned() -> nn.Module:
    net = _net()
    prune.l1_unstructured(net[0], "weight", amount=0.3)  # round(0.3 * 216) = 65 zeros
    prune.l1_unstructured(net[4], "weight", amount=0.3)  # round(0.3 * 320) = 96 zeros
    prune.ln_structured(net[2], "weight", amount=0.5, n=2, dim=0)  # 2 of 4 channels x 72 = 144 zeros
    return net


def test_torch_pruned_model_counts_the_zeros_of_the_effective_weights():
    net = _pruned()
    hooks = hook_count(net)
    s = summary(net, X)
    assert [s[n][0].zeros for n in ("0", "2", "4")] == [65, 144, 96]
    # independently: the weight attribute torch's own pre-hook computed during the pass
    assert [int((net[i].weight == 0).sum()) for i in (0, 2, 4)] == [65, 144, 96]
    assert s.totals.params == 224 + 292 + 325 == sum(p.numel() for p in net.parameters())
    assert s.totals.zeros == 65 + 144 + 96 and s.totals.sparsity == pytest.approx(305 / 841)
    assert s.totals.masked == ("0.weight", "2.weight", "4.weight") and s.totals.sparse
    assert s["0"][0].masked == ("weight",) and s["0"][0].sparsity == pytest.approx(65 / 224)
    assert s.totals.buffer_numel == 216 + 288 + 320  # the masks are buffers, the parameter is weight_orig
    assert hook_count(net) == hooks  # torch's mask hooks stay, summary's are gone


def test_table_shows_zeros_column_and_footer_line_only_when_pruned():
    text = summary(_pruned(), X).table()
    lines = text.splitlines()
    assert lines[2].split()[:5] == ["Layer", "(type)", "Output", "shape", "Params"] and "Zeros" in lines[2]
    conv0 = next(line for line in lines if line.strip().startswith("0 (Conv2d)"))
    assert "29.0%" in conv0 and conv0.endswith("weight masked")  # 65 / 224
    assert "49.3%" in next(line for line in lines if line.strip().startswith("2 (Conv2d)"))  # 144 / 292
    assert ("Zeros: 305 of 841 params (36.3%); 3 masked tensors (0.weight, 2.weight, 4.weight), "
            "each counted once as <name>_orig, its mask a buffer") in lines
    plain = summary(_net(), X).table()
    assert "Mult-adds: 25,408 (25.41 K) (dense: a masked weight's zeros are multiplied too)" in lines
    assert "Zeros" not in plain and "masked" not in plain


def test_unpruned_models_keep_their_table_even_with_zero_biases():
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()  # BatchNorm's bias starts all zeros
    s = summary(bn, torch.randn(1, 3, 5, 5))
    assert s.totals.zeros == 4 and not s.totals.sparse  # counted, but 1-d tensors do not bring up the column
    assert "Zeros" not in s.table() and s.to_dict()["totals"]["zeros"] == 4
    assert "Zeros" not in summary(TinyResNet().eval(), torch.randn(1, 3, 32, 32)).table()


def test_hand_zeroed_weight_without_mask():
    net = _net()
    with torch.no_grad():
        net[4].weight[0, :10] = 0.0
        net[4].weight[3, 5] = -0.0  # a negative zero is a zero
    s = summary(net, X)
    assert s["4"][0].zeros == 11 and s.totals.zeros == 11 and s.totals.masked == () and s.totals.sparse
    assert "Zeros: 11 of 841 params (1.3%)" in s.table().splitlines()


def test_tied_parameter_is_counted_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    torch.manual_seed(0)
    net = Tied()
    with torch.no_grad():
        net.embed.weight[2] = 0.0  # 4 zeros in the one tensor both layers use
        net.embed.weight[7, 1] = 0.0
    s = summary(net, torch.tensor([[1, 2, 3]]))
    assert s.totals.params == 40 and s.totals.zeros == 5
    assert s["embed"][0].zeros == 5 and s["head"][0].zeros == 5  # each row its own (shared) tensor
    assert s.to_dict()["totals"]["sparsity"] == pytest.approx(5 / 40)


def test_removed_mask_leaves_zeros_in_the_parameter():
    net = _pruned()
    for i in (0, 2, 4):
        prune.remove(net[i], "weight")
    s = summary(net, X)
    assert s.totals.masked == () and s.totals.zeros == 305 and s.totals.buffer_numel == 0


def test_mask_changed_without_forward_is_read_not_the_stale_attribute():
    net = _pruned()
    with torch.no_grad():
        net[4].weight_mask.fill_(1.0)  # the weight attribute still holds the old product
    assert int((net[4].weight == 0).sum()) == 96
    assert module_zeros(net[4]).zeros == 0 and model_zeros(net).zeros == 65 + 144


def test_hookscope_own_masks_are_read_alike():
    apply_mask = pytest.importorskip("hookscope.analysis.prune.masks").apply_mask
    net = _net()
    mask = torch.ones(5, 64)
    mask[:, :7] = 0  # 35 zeros
    apply_mask(net[4], "weight", mask)
    s = summary(net, X)
    assert s["4"][0].zeros == 35 and s.totals.masked == ("4.weight",)
    assert torch.equal(effective(net[4], "weight"), net[4].weight)


def test_state_dict_round_trip_keeps_the_count():
    net = _pruned()
    fresh = _net()
    for i in (0, 2, 4):  # the layout a state_dict of a pruned model needs
        prune.identity(fresh[i], "weight")
    fresh.load_state_dict(net.state_dict())
    assert model_zeros(fresh).zeros == 305


def test_json_has_per_row_and_total_sparsity():
    data = json.loads(summary(_pruned(), X).to_json())
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["2"]["zeros"] == 144 and rows["2"]["masked"] == ["weight"]
    assert rows["2"]["sparsity"] == pytest.approx(144 / 292) and rows["1"]["sparsity"] == 0.0
    assert data["totals"]["zeros"] == 305 and data["totals"]["masked"] == ["0.weight", "2.weight", "4.weight"]


def test_meta_device_zeros_are_unknown_not_zero():
    with torch.device("meta"):
        ghost = nn.Linear(4, 2)
    assert zeros_in(ghost.weight) is None
    s = summary(ghost, torch.zeros(1, 4))
    assert s.totals.zeros is None and s.totals.sparsity is None and s[""][0].zeros is None


def test_engine_ignores_look_alike_names():
    lin = nn.Linear(3, 3)
    lin.register_parameter("scale_orig", nn.Parameter(torch.zeros(3)))  # no scale_mask buffer: not a mask
    lin.register_buffer("bias_mask", torch.zeros(2))  # no bias_orig: not a mask
    assert masked(lin) == {} and module_zeros(lin).zeros == 3


def test_torchvision_resnet18_global_pruning_matches_an_independent_count():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    convs = [(m, "weight") for m in net.modules() if isinstance(m, nn.Conv2d)]
    conv_weights = sum(m.weight.numel() for m, _ in convs)
    prune.global_unstructured(convs, pruning_method=prune.L1Unstructured, amount=0.5)
    s = summary(net, torch.randn(1, 3, 64, 64))
    zero_biases = sum(m.bias.numel() for m in net.modules() if isinstance(m, nn.BatchNorm2d))  # init to 0
    assert s.totals.zeros == round(0.5 * conv_weights) + zero_biases
    # independently: the weights torch's hooks computed during the pass, and every other parameter
    effective_zeros = sum(int((m.weight == 0).sum()) for m, _ in convs)
    others = sum(int((p == 0).sum()) for n, p in net.named_parameters() if not n.endswith("weight_orig"))
    assert s.totals.zeros == effective_zeros + others
    assert s.totals.params == 11_689_512 and len(s.totals.masked) == 20
    assert s["layer1.0.conv1"][0].zeros == int((net.layer1[0].conv1.weight == 0).sum())
