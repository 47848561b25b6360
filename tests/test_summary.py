import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hookscope import HookscopeError
from hookscope import capture as hookscope_capture
from hookscope.analysis.summary import own_macs, summary
from hookscope.cli import main
from hookscope.errors import ForwardError, RecordError
from hookscope.zoo import TinyResNet

from helpers import Net, no_hooks

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/summary_<name>.txt; HOOKSCOPE_REGEN_GOLDEN=1 rewrites it."""
    path = GOLDEN / f"summary_{name}.txt"
    if os.environ.get("HOOKSCOPE_REGEN_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run the tests once with HOOKSCOPE_REGEN_GOLDEN=1"
    assert text == path.read_text()


def macs_by_flop_counter(model: nn.Module, *inputs: torch.Tensor) -> int:
    """An independent count: PyTorch's own FlopCounterMode counts 2 flops per multiply-add."""
    # with grad enabled MultiheadAttention takes its Python path, which the counter can see
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops() // 2


# --- story 9: know the model's parts -------------------------------------------------------------
class Story9(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 10))
        self.bias = nn.Parameter(torch.randn(5))
        self.submodel_1 = nn.Linear(5, 4)
        self.submodel_2 = nn.Linear(4, 2)
        self.submodel_3 = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight, self.bias)
        return self.submodel_3(self.submodel_2(self.submodel_1(x)))


def test_story9_own_parameters_children_modes_and_shapes():
    model = Story9()
    s = summary(model, torch.randn(3, 10))
    root = s[""][0]
    assert root.parameters == {"weight": (5, 10), "bias": (5,)} and root.params == 55
    assert s.parameters == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert list(s.parameters) == [
        "weight", "bias", "submodel_1.weight", "submodel_1.bias", "submodel_2.weight", "submodel_2.bias",
        "submodel_3.0.weight", "submodel_3.0.bias", "submodel_3.1.weight", "submodel_3.1.bias",
    ]
    # 50 + 5 + (20 + 4) + (8 + 2) + (6 + 3) + (15 + 5)
    assert s.totals.params == root.params_total == 118
    assert root.children == ("submodel_1", "submodel_2", "submodel_3")
    assert list(s.modules) == ["", "submodel_1", "submodel_2", "submodel_3", "submodel_3.0", "submodel_3.1"]
    assert s["submodel_3"][0].children == ("submodel_3.0", "submodel_3.1")
    assert s.buffers == {} and s.totals.buffers == 0
    # what a forward hook on submodel_2 sees for a 3x10 input
    assert s["submodel_2"][0].input_shapes == [(3, 4)] and s["submodel_2"][0].output_shapes == [(3, 2)]
    # modes: train() by default, eval() switches every submodule, summary changes neither
    assert all(r.training for r in s.rows)
    model.eval()
    assert not any(r.training for r in summary(model, torch.randn(3, 10)).rows)
    assert not any(m.training for m in model.modules()) and no_hooks(model)


def test_story9_buffers_of_batchnorm():
    bn = nn.BatchNorm1d(5)
    s = summary(bn, torch.randn(3, 5))
    assert s[""][0].buffers == {"running_mean": (5,), "running_var": (5,), "num_batches_tracked": ()}
    assert s.totals.buffers == 3 and s.totals.buffer_numel == 11
    assert s.totals.buffer_bytes == 5 * 4 + 5 * 4 + 8  # num_batches_tracked is an int64
    # in training mode the pass would update the running statistics: they are restored
    assert torch.equal(bn.running_mean, torch.zeros(5)) and int(bn.num_batches_tracked) == 0
    assert bn.training and no_hooks(bn)


# --- counts by hand --------------------------------------------------------------------------------
class TiedTwice(nn.Module):
    """A tied weight (head.weight is embed.weight), a module called twice, one never called, an alias."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.shared = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.unused = nn.Linear(4, 4)
        self.alias = self.act

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = self.act(self.shared(h))
        h = self.act(self.shared(h))
        return self.head(h)


def test_tied_weight_counted_once_and_each_call_shown():
    model = TiedTwice().eval()
    s = summary(model, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    # embed 40 + shared 20 + unused 20; head's weight is embed's
    assert s.totals.params == 80 == sum(p.numel() for p in model.parameters())
    assert s.totals.param_bytes == 80 * 4
    assert s["head"][0].params == 40 and s["head"][0].shared == {"weight": "embed.weight"}
    assert [(r.name, r.call, r.calls) for r in s.rows] == [
        ("", 0, 1), ("embed", 0, 1), ("shared", 0, 2), ("act", 0, 2), ("shared", 1, 2), ("act", 1, 2),
        ("head", 0, 1), ("unused", 0, 0),
    ]
    assert not s["unused"][0].called and s.totals.not_called == 1 and s.totals.calls == 7
    assert s["act"][0].aliases == ("alias",)
    # shared: 2x3 rows of 4 outputs x 4 inputs, twice; head: 2x3x10 outputs x 4 inputs
    assert s["shared"][1].macs == 96 and s["head"][0].macs == 240
    assert s.totals.macs == s[""][0].macs == 2 * 96 + 240
    # new outputs of innermost calls: embed, shared twice, act twice (ReLU is out of place), head
    assert s.totals.activation_bytes == 4 * (24 + 24 + 24 + 24 + 24 + 60)
    assert s.totals.input_bytes == 6 * 8
    assert no_hooks(model)


def test_module_shared_across_parents_counts_once():
    """torchinfo issue 327's reproduction: one ReLU instance in three blocks (true total 120)."""

    class Block(nn.Module):
        def __init__(self, act: nn.Module) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
            self.act = act

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = self.act(layer(x))
            return x

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            act = nn.ReLU()
            self.blocks = nn.ModuleList([Block(act) for _ in range(3)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x

    model = Shared()
    s = summary(model, torch.randn(1, 4))
    assert s.totals.params == 120 and s["blocks"][0].params_total == 120
    assert s["blocks.1"][0].params_total == 40
    assert len([r for r in s.rows if r.name == "blocks.0.act"]) == 6
    assert s["blocks.0.act"][0].aliases == ("blocks.1.act", "blocks.2.act")
    assert s.totals.macs == 6 * 16 and no_hooks(model)


def test_tinyresnet_totals_against_pytorch():
    model = TinyResNet().eval()
    x = torch.randn(2, 3, 32, 32)
    s = summary(model, x)
    assert s.totals.params == sum(p.numel() for p in model.parameters())
    assert s.totals.buffer_numel == sum(b.numel() for b in model.buffers())
    assert s.totals.macs == macs_by_flop_counter(model, x)
    # stem.0: 2x16x32x32 outputs, 3x3x3 products each
    assert s["stem.0"][0].macs == 2 * 16 * 32 * 32 * 27 and s["stem.0"][0].output_shapes == [(2, 16, 32, 32)]
    assert s["layer1"][0].macs == s["layer1.0"][0].macs + s["layer1.1"][0].macs
    assert s["fc"][0].params == 32 * 10 + 10 and s["layer2"][0].training is False
    assert no_hooks(model)


def test_frozen_and_trainable():
    net = Net()
    net.l1.requires_grad_(False)
    s = summary(net, torch.randn(1, 2))
    assert (s.totals.trainable, s.totals.frozen) == (60, 15)
    assert s[""][0].trainable_total == 60 and s[""][0].frozen_total == 15 and s["l1"][0].trainable_total == 0
    assert s.table().splitlines()[4].split()[4] == "partial"  # the model row's Trainable column


@pytest.mark.parametrize(
    "layer, x",
    [
        (nn.Conv1d(4, 6, 3, groups=2), torch.randn(2, 4, 10)),
        (nn.Conv3d(2, 3, (1, 2, 3), stride=2), torch.randn(1, 2, 5, 6, 7)),
        (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), torch.randn(2, 4, 5, 5)),
        (nn.Linear(7, 3), torch.randn(2, 5, 7)),
        (nn.MultiheadAttention(8, 2), torch.randn(4, 2, 8)),
        (nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(2, 4, 8)),
    ],
)
def test_mult_adds_match_pytorchs_flop_counter(layer, x):
    args = (x, x, x) if isinstance(layer, nn.MultiheadAttention) else (x,)
    s = summary(layer.eval(), tuple(args))
    assert s.totals.macs == macs_by_flop_counter(layer, *args) > 0
    assert no_hooks(layer)


def test_mult_adds_by_hand_attention_and_recurrent():
    # MHA(E=8), L=4 queries, S=6 keys, N=2: 2 * (4*64 + 6*(8+8)*8 + 4*64 + 2*4*6*8) = 3328
    mha = nn.MultiheadAttention(8, 2)
    q, kv = torch.randn(4, 2, 8), torch.randn(6, 2, 8)
    assert summary(mha, (q, kv, kv)).totals.macs == 3328
    # LSTM(3 -> 5, 2 layers), 4 steps x batch 2: per step 4*5*(3+5) + 4*5*(5+5) = 360
    lstm = nn.LSTM(3, 5, num_layers=2)
    s = summary(lstm, torch.randn(4, 2, 3))
    assert s.totals.macs == 8 * 360 and s[""][0].output_shapes == [(4, 2, 5), (2, 2, 5), (2, 2, 5)]
    # bidirectional GRU: layer 1 reads 2*5 features; 3 gates
    gru = nn.GRU(3, 5, num_layers=2, bidirectional=True, batch_first=True)
    assert summary(gru, torch.randn(2, 4, 3)).totals.macs == 8 * 2 * (3 * 5 * (3 + 5) + 3 * 5 * (10 + 5))
    cell = nn.LSTMCell(3, 5)
    assert own_macs(cell, (torch.randn(2, 3),), {}, None) == 2 * 4 * 5 * (3 + 5)
    bil = nn.Bilinear(3, 4, 2)
    assert summary(bil, (torch.randn(5, 3), torch.randn(5, 4))).totals.macs == 5 * 2 * (3 + 1) * 4


# --- products a module's own forward computes -----------------------------------------------------
class Attn(nn.Module):
    """Attention written in its forward (timm style): qkv and proj are Linear, the products are not."""

    def __init__(self, dim: int = 8, heads: int = 2, how: str = "matmul") -> None:
        super().__init__()
        self.heads, self.how = heads, how
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.how == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v)
        elif self.how == "einsum":
            w = torch.einsum("bhid,bhjd->bhij", q, k).softmax(-1)
            o = torch.einsum("bhij,bhjd->bhid", w, v)
        elif self.how == "bmm":
            w = torch.bmm(q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2)).softmax(-1)
            o = torch.bmm(w, v.flatten(0, 1)).reshape(q.shape)
        else:
            o = (q @ k.transpose(-2, -1)).softmax(-1).matmul(v)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


@pytest.mark.parametrize("how", ["matmul", "sdpa", "einsum", "bmm"])
def test_attention_products_in_a_modules_own_forward(how):
    model = nn.Sequential(Attn(how=how), nn.ReLU())
    x = torch.randn(2, 5, 8)
    s = summary(model, x)
    # qkv: 2x5 tokens x 24 outputs x 8 inputs = 1,920; proj: 2x5 x 8 x 8 = 640, each once
    assert s["0.qkv"][0].macs == 1920 and s["0.proj"][0].macs == 640
    # batch 2 x heads 2, 5 queries x 5 keys, head size 4: Q K^T 400, weights @ V 400, in the module itself
    assert s["0"][0].macs == 1920 + 640 + 800 == s.totals.macs == s[""][0].macs
    if how != "sdpa":  # PyTorch's counter has no CPU formula for the fused attention
        assert s.totals.macs == macs_by_flop_counter(model, x)
    assert not s.totals.macs_partial and no_hooks(model)


def test_tiny_vit_by_hand_attention_counted_once():
    import torchvision

    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                               hidden_dim=8, mlp_dim=16).eval()
    s = summary(vit, torch.randn(1, 3, 32, 32))
    # patches: 8 x 2 x 2 outputs x 3 x 16 x 16 = 24,576; 5 tokens (4 patches + class token)
    assert s["conv_proj"][0].macs == 24_576
    # MultiheadAttention(8): q, k, v, out projections 4 x 5 x 8 x 8 = 1,280, QK^T and AV 2 x 5 x 5 x 8 = 400,
    # whatever functions it runs inside
    assert s["encoder.layers.encoder_layer_0.self_attention"][0].macs == 1280 + 400
    # MLP 5 x 8 x 16 twice = 1,280; head: 8 x 1,000
    assert s["encoder.layers.encoder_layer_0.mlp"][0].macs == 1280 and s["heads"][0].macs == 8000
    assert s.totals.macs == 24_576 + 1680 + 1280 + 8000 == 35_536
    assert no_hooks(vit)


def test_tiny_swin_by_hand_functional_linear_and_matmul():
    import torchvision

    swin = torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2], num_heads=[2],
                                              window_size=[2, 2], num_classes=10).eval()
    s = summary(swin, torch.randn(1, 3, 8, 8))
    # patches: 8 x 2 x 2 outputs x 3 x 4 x 4 = 1,536; then one 2x2 window of 4 tokens per block
    assert s["features.0.0"][0].macs == 1536
    # ShiftedWindowAttention calls F.linear on its qkv / proj weights (the Linear modules never run):
    # qkv 4 x 24 x 8 = 768, QK^T and AV 2 x (2 heads x 4 x 4 x 4) = 256, proj 4 x 8 x 8 = 256
    attn = s["features.1.0.attn"][0]
    assert attn.macs == 768 + 256 + 256 and not s["features.1.0.attn.qkv"][0].called
    # MLP 4 x 8 x 32 twice = 2,048 per block; head 8 x 10
    assert s.totals.macs == 1536 + 2 * (1280 + 2048) + 80 == 8272
    assert s.totals.macs == macs_by_flop_counter(swin, torch.randn(1, 3, 8, 8))
    assert no_hooks(swin)


def test_fused_encoder_layer_runs_its_modules_and_counts_them():
    # under the summary, TransformerEncoderLayer takes its Python path, so every submodule has a row
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    s = summary(layer, torch.randn(2, 5, 8))
    assert s["self_attn"][0].called and s["linear1"][0].called
    # per sequence: MultiheadAttention 4 x 5 x 64 + 2 x 5 x 5 x 8 = 1,680, linear1 + linear2 2 x 5 x 8 x 16
    assert s.totals.macs == 2 * (1680 + 1280) == 5920 and no_hooks(layer)


def test_uncounted_products_make_the_count_a_lower_bound():
    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.einsum("ij,jk,kl->il", x, self.w, self.w)  # the cost depends on the order

    model = nn.Sequential(nn.Linear(3, 3), Chain())
    s = summary(model, torch.randn(2, 3))
    chain, root = s["1"][0], s[""][0]
    assert chain.uncounted == ("einsum",) and chain.macs_partial and chain.macs == 0
    assert root.macs_partial and root.uncounted == () and root.macs == 18
    assert not s["0"][0].macs_partial and s.totals.macs_partial
    text = s.table()
    assert "  1 (Chain)" in text and "mult-adds not counted: einsum" in text
    assert ">= 18" in text and "Mult-adds: 18 at least; not counted: einsum in 1" in text
    cells = next(line for line in text.splitlines() if "(Chain)" in line).split()
    assert "?" in cells  # nothing counted at all: unknown, not 0
    assert json.loads(s.to_json())["totals"]["macs_partial"] is True


def test_product_counting_is_active_during_summary_only():
    depth = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            depth.append(torch._C._len_torch_function_stack())
            return x

    model = nn.Sequential(Probe(), nn.Linear(2, 2))
    summary(model, torch.randn(1, 2))
    with hookscope_capture(model):
        model(torch.randn(1, 2))
    with pytest.raises(HookscopeError):
        summary(model, torch.randn(1, 3))
    assert depth == [1, 0, 1] and torch._C._len_torch_function_stack() == 0
    assert no_hooks(model)


# --- what the pass leaves behind -------------------------------------------------------------------
def test_modes_kept_and_buffers_restored_in_training_mode():
    model = TinyResNet().train()
    model.layer2.eval()
    flags = {n: m.training for n, m in model.named_modules()}
    before = {n: b.clone() for n, b in model.named_buffers()}
    s = summary(model, torch.randn(2, 3, 32, 32))
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert {r.name: r.training for r in s.rows} == flags
    assert all(torch.equal(before[n], b) for n, b in model.named_buffers())
    assert no_hooks(model)


def test_callers_random_stream_left_where_it_was():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    x = torch.randn(8, 4)
    state = torch.get_rng_state()
    model(x)
    assert not torch.equal(torch.get_rng_state(), state)  # dropout draws from it
    state = torch.get_rng_state()
    summary(model, x)
    assert torch.equal(torch.get_rng_state(), state)


def test_unknown_device_is_one_line_naming_it():
    with pytest.raises(HookscopeError, match=r"device='bogus' is not a device") as e:
        summary(Net(), torch.randn(1, 2), device="bogus")
    assert "\n" not in str(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(HookscopeError, match=r"cannot be moved to device='cuda:0'"):
            summary(Net(), torch.randn(1, 2), device="cuda:0")


def test_forward_runs_without_grad_and_model_kwargs_pass_through():
    seen = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            seen.append(torch.is_grad_enabled())
            return x * scale

    s = summary(Probe(), torch.ones(2, 3, requires_grad=True), kwargs={"scale": 2.0})
    assert seen == [False] and s[""][0].output_shapes == [(2, 3)]
    assert s.totals.activation_bytes == 24 and s.totals.params == 0


def test_no_parameters_no_children_and_non_tensor_outputs():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x: torch.Tensor) -> dict:
            return {"text": "hello", "none": None, "pair": (self.inner(x), [x.sum()])}

    s = summary(nn.ReLU(), torch.randn(2))
    assert [r.name for r in s.rows] == [""] and s.totals.params == 0 and s.totals.macs == 0
    s = summary(Odd(), torch.randn(3, 2))
    assert s[""][0].output_shapes == [(3, 2), ()] and s["inner"][0].output_shapes == [(3, 2)]
    assert s.totals.activation_bytes == 0  # Identity returns its input: nothing new
    assert "3x2, scalar" in s.table()
    s = summary(nn.Flatten(), torch.randn(2, 3, 4))
    assert s.totals.activation_bytes == 0  # a view of the input


def test_wrong_shape_names_the_module_and_what_reached_it():
    model = TinyResNet().eval()
    with pytest.raises(ForwardError) as e:
        summary(model, torch.randn(1, 1, 32, 32))
    msg = str(e.value)
    assert "'stem.0'" in msg and "1x1x32x32 float32" in msg and "before any other module had finished" in msg
    assert isinstance(e.value, HookscopeError) and isinstance(e.value.__cause__, RuntimeError)
    assert "\n" not in msg and no_hooks(model)


def test_wrong_dtype_names_the_module():
    model = TinyResNet().eval()
    with pytest.raises(ForwardError, match=r"'stem\.0' \(Conv2d\), which received input\[0\] 1x3x32x32 float64"):
        summary(model, torch.randn(1, 3, 32, 32, dtype=torch.float64))
    assert no_hooks(model)


def test_failure_deeper_lists_the_layers_executed_before():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(10, 2))
    with pytest.raises(ForwardError) as e:
        summary(model, torch.randn(1, 3, 8, 8))
    msg = str(e.value)
    assert "failed in '2' (Linear), which received input[0] 1x144 float32" in msg
    assert "after '1' had run" in msg and no_hooks(model)


def test_bad_arguments():
    with pytest.raises(HookscopeError, match="needs an example input"):
        summary(Net())
    with pytest.raises(HookscopeError, match="depth=-1"):
        summary(Net(), torch.randn(1, 2), depth=-1)
    s = summary(Net(), torch.randn(1, 2))
    with pytest.raises(HookscopeError, match="Did you mean 'l2', 'l1'"):
        s["l3"][0]



# --- one vocabulary, one result protocol (issue 10) ------------------------------------------------
def test_model_keywords_go_in_kwargs_and_a_typo_is_never_forwarded():
    seen = []

    class Masked(nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, **extra: object) -> torch.Tensor:
            seen.append((mask is not None, sorted(extra)))
            return x if mask is None else x * mask

    model = Masked()
    s = summary(model, torch.ones(2, 3), kwargs={"mask": torch.zeros(2, 3)})
    assert seen == [(True, [])] and s[""][0].input_shapes == [(2, 3), (2, 3)]
    # a typo of summary's own keyword: refused before the model runs, with the keyword it meant
    with pytest.raises(HookscopeError) as e:
        summary(model, torch.ones(2, 3), dpeth=2)
    msg = str(e.value)
    assert "summary()" in msg and "'dpeth'" in msg and "Did you mean 'depth'?" in msg
    assert isinstance(e.value, TypeError)  # what Python raises for such a call, so except TypeError still works
    assert "\n" not in msg
    # the old way of passing a model keyword: refused with where it goes now, never forwarded
    with pytest.raises(HookscopeError, match=r"keyword input of the model, pass kwargs=\{'mask': \.\.\.\}"):
        summary(model, torch.ones(2, 3), mask=torch.zeros(2, 3))
    with pytest.raises(HookscopeError, match="needs an example input"):
        summary(model, kwargs={})
    with pytest.raises(HookscopeError, match=r"kwargs=\[1\] is not a mapping of argument names"):
        summary(model, torch.ones(2, 3), kwargs=[1])
    assert seen == [(True, [])] and no_hooks(model)


def test_lookups_raise_a_key_error_with_did_you_mean_and_in_agrees():
    model = TiedTwice().eval()
    s = summary(model, torch.tensor([[1, 2, 3]]), depth=0)
    assert [r.call for r in s["act"]] == [0, 1] and s["unused"] == [s["unused"][0]]
    assert "act" in s and "alias" not in s and "actt" not in s and 0 not in s
    assert [r.name for r in s] == [""] and len(s) == 1  # rows down to depth; lookups see every row
    for bad in ("actt", "alias"):
        with pytest.raises(KeyError) as e:
            s[bad]
        assert isinstance(e.value, RecordError) and "\n" not in str(e.value)
    with pytest.raises(RecordError, match="Did you mean 'act'"):
        s["actt"][0]
    assert len(s["act"]) == 2  # one row per call: s["act"][1] is the second


def test_protocol_table_str_dict_and_json():
    s = summary(TiedTwice().eval(), torch.tensor([[1, 2, 3]]))
    assert str(s) == s.table() and s.table().endswith("=\n")
    assert s.to_json() == json.dumps(json.loads(s.to_json()))  # one line by default, as every result
    assert json.loads(s.to_json(indent=2)) == json.loads(s.to_json()) == json.loads(json.dumps(s.to_dict()))


def test_failure_restores_the_model_and_removes_every_hook():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Dropout(0.5), nn.Linear(4, 2)).train()
    before = {n: b.clone() for n, b in model.named_buffers()}
    x = torch.randn(5, 3)
    state = torch.get_rng_state()
    with pytest.raises(ForwardError, match=r"'2' \(Linear\).* after '1' had run: RuntimeError"):
        summary(model, x)
    assert all(torch.equal(before[n], b) for n, b in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), state) and model.training and no_hooks(model)
    assert torch._C._len_torch_function_stack() == 0

def test_depth_keeps_totals_and_wrappers_keep_names():
    model = TinyResNet().eval()
    x = torch.randn(1, 3, 32, 32)
    full = summary(model, x)
    top = summary(nn.DataParallel(model), x, depth=1)
    assert [r.name for r in top.rows] == ["", "stem", "layer1", "down", "layer2", "pool", "fc"]
    assert top.totals == full.totals and top["layer1.0.conv1"][0].macs == full["layer1.0.conv1"][0].macs
    assert top[""][0].macs == full.totals.macs
    assert no_hooks(model)


def test_meta_device_model_gives_the_same_summary():
    real = summary(TinyResNet().eval(), torch.randn(1, 3, 32, 32))
    with torch.device("meta"):
        ghost = TinyResNet().eval()
    s = summary(ghost, torch.randn(1, 3, 32, 32))  # the input follows the model to the meta device
    # a meta tensor holds no values: its zeros are unknown (None), every other total is the same
    assert s.totals.zeros is None and real.totals.zeros == 0  # the zoo sets every BatchNorm to random values
    assert dataclasses.replace(s.totals, zeros=real.totals.zeros) == real.totals and s.inputs == real.inputs
    assert s.totals.activation_bytes == 819_368  # ReLUs run in place: not new memory
    # stem.0, stem.1: 2 x 64 KiB; layer1: 8 x 64 KiB; down + layer2: 5 x 32 KiB; pool 128 B; fc 40 B
    assert 819_368 == 2 * 65536 + 8 * 65536 + 5 * 32768 + 128 + 40
    assert no_hooks(ghost)


def test_json_round_trip():
    s = summary(TiedTwice().eval(), torch.tensor([[1, 2, 3]]))
    data = json.loads(s.to_json())
    assert data["model"] == "TiedTwice" and data["inputs"] == [{"shape": [1, 3], "dtype": "int64"}]
    assert data["totals"]["params"] == 80 and data["totals"]["macs"] == 2 * 48 + 120
    head = next(r for r in data["rows"] if r["name"] == "head")
    assert head["shared"] == {"weight": "embed.weight"} and head["output_shapes"] == [[1, 3, 10]]
    assert [r["name"] for r in data["rows"]] == [r.name for r in s.rows]


# --- golden text -----------------------------------------------------------------------------------
def test_golden_tinyresnet():
    check_golden("tinyresnet", summary(TinyResNet().eval(), torch.randn(1, 3, 32, 32)).table())


def test_golden_tied_and_twice():
    check_golden("tied_twice", str(summary(TiedTwice().eval(), torch.tensor([[1, 2, 3], [4, 5, 6]]))))


# --- command line ----------------------------------------------------------------------------------
def test_cli_table_and_json(capsys):
    assert main(["summary", "tiny"]) == 0
    out = capsys.readouterr().out
    n = sum(p.numel() for p in TinyResNet().parameters())
    assert f"Params: {n:,}" in out and "layer1.0.conv1 (Conv2d)" in out
    assert main(["summary", "tiny", "--json", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["totals"]["params"] == n and max(r["depth"] for r in data["rows"]) == 1
    assert out.startswith('{\n  "model": ')  # indented for people reading it, as before


def test_cli_wrong_input_is_one_line_and_exit_2(hookscope_process):
    res = hookscope_process.run("summary", "tiny", "--input", "1x1x32x32", cwd=Path.cwd())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "'stem.0'" in lines[0] and "1x1x32x32" in lines[0]


# --- every torchvision classification model --------------------------------------------------------
def _torchvision_cases() -> list:
    try:
        import torchvision.models as tvm
    except ImportError:  # the vision extra is not installed: the other tests still run
        return []
    return sorted(tvm.list_models(module=tvm))


# Architectures that refuse a 64x64 input: ViTs check the image size, MaxViT's windows need 224,
# Inception v3's stem needs 75 and more (299 is its size).
_SIZE = {"inception_v3": 299, "maxvit_t": 224}


def _build(name: str, monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    """The model on the meta device: no memory, no weight init; its forward pass propagates shapes.

    The summary moves the CPU example input to the model's device by itself.
    """
    import torchvision.models as tvm
    import torchvision.models.regnet as regnet

    # RegNets compute their widths with tensors and .tolist() while being built, which the meta
    # device cannot do: that one step runs on the CPU (built on the CPU, regnet_y_128gf takes 30 s).
    widths = regnet.BlockParams.from_init_params

    def widths_on_cpu(*args: object, **kwargs: object) -> object:
        with torch.device("cpu"):
            return widths(*args, **kwargs)

    monkeypatch.setattr(regnet.BlockParams, "from_init_params", staticmethod(widths_on_cpu))
    with torch.device("meta"):
        return tvm.get_model(name, weights=None).eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", _torchvision_cases())
def test_param_totals_on_every_torchvision_classifier(name, monkeypatch):
    model = _build(name, monkeypatch)
    size = 224 if name.startswith("vit_") else _SIZE.get(name, 64)
    x = torch.randn(1, 3, size, size)
    s = summary(model, x)
    assert s.totals.params == sum(p.numel() for p in model.parameters())
    assert s.totals.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert s.totals.buffer_numel == sum(b.numel() for b in model.buffers())
    assert len(s.rows) == s.totals.calls + s.totals.not_called
    assert s.totals.activation_bytes > 0 and no_hooks(model)
    # every product once: convolutions and Linear by their rules, ViT's MultiheadAttention by its
    # rule, Swin's matmuls and functional F.linear and MaxViT's einsums from the functions they call
    assert s.totals.macs == macs_by_flop_counter(model, x.to("meta"))
    assert not s.totals.macs_partial


# --- threads and torch.compile ---------------------------------------------------------------------
class Hold(nn.Module):
    """Identity; in the thread named "A" it signals ``inside`` and waits for ``go``."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "A":
            self.inside.set()
            assert self.go.wait(30)
        return x + 0


def _thread(name, fn, result):
    def run():
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            result.append(e)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


@pytest.mark.parametrize("between", ["pre", "post"])
def test_a_summary_ending_while_another_thread_is_between_its_hooks_breaks_nothing(between):
    # PyTorch decides whether a hook takes kwargs when it calls it: one removed in between is called
    # without them (pre: no kwargs; post: the output in the kwargs' place), which used to raise
    net, x = nn.Sequential(nn.Linear(4, 4), Hold(), nn.Linear(4, 2)), torch.randn(3, 4)
    expected = net(x)
    at_gate, go = threading.Event(), threading.Event()

    def gate(*args):
        if threading.current_thread().name == "B":
            at_gate.set()
            assert go.wait(30)

    # registered before summary's own hooks, so it runs first and holds B there
    handle = (net[2].register_forward_pre_hook if between == "pre" else net[2].register_forward_hook)(gate)
    summarised, out = [], []
    a = _thread("A", lambda: summary(net, x), summarised)
    assert net[1].inside.wait(30)  # summary's hooks are on the model now
    b = _thread("B", lambda: net(x), out)
    assert at_gate.wait(30)
    net[1].go.set()
    a.join(30)  # summary is over and its hooks are removed while B is between net[2]'s hooks
    go.set()
    b.join(30)
    handle.remove()
    assert not a.is_alive() and not b.is_alive()
    assert isinstance(out[0], torch.Tensor), out[0]
    assert torch.equal(out[0], expected)
    assert summarised[0].totals.params == 4 * 4 + 4 + 4 * 2 + 2
    assert no_hooks(net)


@pytest.mark.slow
@pytest.mark.parametrize("ran_before", [False, True], ids=["not-run-yet", "already-ran"])
def test_summary_of_a_compiled_model_is_the_eager_summary(ran_before):
    class Attend(nn.Module):  # a matrix product outside any module with a rule
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.q(x)
            return torch.relu(q @ q.transpose(-1, -2))

    torch._dynamo.reset()
    net, x = nn.Sequential(Attend(), nn.Flatten(), nn.Linear(4, 2)), torch.randn(2, 2, 8)
    eager = summary(net, x)
    compiled = torch.compile(net, backend="aot_eager")
    if ran_before:  # compiled without hooks: they must still take effect
        compiled(x)
    got = summary(compiled, x)
    assert got.to_json() == eager.to_json()
    assert got.totals.macs == 2 * 2 * 8 * 8 + 2 * 2 * 2 * 8 + 2 * 4 * 2  # q, q @ q^T, the last Linear
    assert [r.name for r in got.rows] == ["", "0", "0.q", "1", "2"]
    assert no_hooks(compiled)
    assert torch.allclose(compiled(x), net(x), atol=1e-6)


def test_a_model_that_writes_into_its_inputs_leaves_the_callers_tensors_as_they_were():
    from helpers import Writer

    model = Writer().eval()
    x, scale = torch.randn(2, 3, 8, 8), torch.full((1,), 3.0)
    kept_x, kept_scale = x.clone(), scale.clone()
    first = summary(model, x, kwargs={"scale": scale})
    assert torch.equal(x, kept_x) and torch.equal(scale, kept_scale)
    second = summary(model, x, kwargs={"scale": scale})
    assert first.to_dict() == second.to_dict() and no_hooks(model)
