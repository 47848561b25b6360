"""Multiply-adds of matrix-product functions, each worked out by hand, and PyTorch's counter agreeing;
summary's totals on ViT, Swin, GPT-2 and LLaMA equal to FlopCounterMode's flops / 2."""

from functools import cache

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import hookscope
from hookscope.analysis._macs import ProductCounter, has_rule


def counted(fn, *args, **kwargs) -> list:
    seen: list = []
    with ProductCounter(lambda op, macs: seen.append((op, macs))):
        fn(*args, **kwargs)
    return seen


def flop_counter_macs(fn, *args, **kwargs) -> int:
    with FlopCounterMode(display=False) as c:
        fn(*args, **kwargs)
    return c.get_total_flops() // 2


a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 6)
CASES = [
    # (name, function, args, expected (op, macs)): 2x3x5 outputs, dot products of length 4 = 120
    ("@", lambda x, y: x @ y, (a, b), ("matmul", 120)),
    ("torch.matmul, broadcast", torch.matmul, (torch.randn(3, 4), b), ("matmul", 120)),
    ("Tensor.matmul", lambda x, y: x.matmul(y), (a, b), ("matmul", 120)),
    ("matrix @ vector", torch.matmul, (torch.randn(3, 4), torch.randn(4)), ("matmul", 12)),
    ("bmm", torch.bmm, (a, b), ("bmm", 120)),
    ("mm", torch.mm, (a[0], b[0]), ("mm", 60)),
    ("mv", torch.mv, (a[0], torch.randn(4)), ("mv", 12)),
    ("addmm", torch.addmm, (torch.randn(5), a[0], b[0]), ("addmm", 60)),
    ("baddbmm", torch.baddbmm, (torch.randn(1, 3, 5), a, b), ("baddbmm", 120)),
    ("addbmm", torch.addbmm, (torch.randn(3, 5), a, b), ("addbmm", 120)),
    ("dot", torch.dot, (torch.randn(6), torch.randn(6)), ("dot", 6)),
    # 2x3 rows x 7 outputs, 4 inputs each
    ("linear", F.linear, (torch.randn(2, 3, 4), torch.randn(7, 4), torch.randn(7)), ("linear", 168)),
    # the nn.Bilinear rule: 5 x 2 outputs, (3 + 1) x 4 each
    ("bilinear", F.bilinear, (torch.randn(5, 3), torch.randn(5, 4), torch.randn(2, 3, 4)), ("bilinear", 160)),
    # 1x6x3x3 outputs, (4 / 2) x 3 x 3 products each
    ("conv2d", lambda x, w: F.conv2d(x, w, groups=2), (torch.randn(1, 4, 5, 5), torch.randn(6, 2, 3, 3)),
     ("conv", 6 * 9 * 18)),
    # every one of 1x4x5x5 input elements meets (6 / 2) x 3 x 3 weights
    ("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, groups=2),
     (torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3)), ("conv_transpose", 100 * 27)),
    # batch 2 x heads 2: Q K^T 5 x 7 x 4 and weights @ V 5 x 7 x 6, that is 4 x 35 x 10
    ("sdpa", F.scaled_dot_product_attention, (q, k, v), ("scaled_dot_product_attention", 1400)),
    ("einsum", lambda x, y: torch.einsum("bij,bjk->bik", x, y), (a, b), ("einsum", 120)),
    ("einsum with spaces, list", lambda x, y: torch.einsum("B I J, B J K -> B I K", [x, y]), (a, b),
     ("einsum", 120)),
    ("einsum implicit output", lambda x, y: torch.einsum("bij,bjk", x, y), (a, b), ("einsum", 120)),
    ("einsum ellipsis", lambda x, y: torch.einsum("...ij,...jk->...ik", x, y), (a, b), ("einsum", 120)),
    # i is summed inside the first operand before any product: 5 outputs x 4 = 20
    ("einsum pre-summed index", lambda x, y: torch.einsum("ij,jk->k", x, y), (a[0], b[0]), ("einsum", 20)),
    # the ellipsis is contracted too when the output leaves it out: 3 x 5 outputs x (6 x 4)
    ("einsum contracted ellipsis", lambda x, y: torch.einsum("...ij,...jk->ik", x, y),
     (torch.randn(6, 3, 4), torch.randn(6, 4, 5)), ("einsum", 360)),
    # no product at all: torch transposes, or multiplies element by element (no sums, as x * y)
    ("einsum one operand", lambda x: torch.einsum("ij->ji", x), (a[0],), ("einsum", 0)),
    ("einsum elementwise", lambda x, y: torch.einsum("ij,ij->ij", x, y), (a[0], a[0]), ("einsum", 0)),
    ("einsum outer", lambda x, y: torch.einsum("i,j->ij", x, y), (torch.randn(3), torch.randn(5)), ("einsum", 0)),
    # j broadcast from size 1 in the second operand: torch sums the first over j, then multiplies
    ("einsum broadcast index", lambda x, y: torch.einsum("ij,jk->ik", x, y), (a[0], torch.randn(1, 5)),
     ("einsum", 0)),
]


@pytest.mark.parametrize("name, fn, args, expected", CASES, ids=[c[0] for c in CASES])
def test_products_by_hand(name, fn, args, expected):
    assert counted(fn, *args) == [expected]
    if name not in NOT_IN_FLOP_COUNTER:
        assert flop_counter_macs(fn, *args) == expected[1]


# PyTorch's FlopCounterMode has no formula for these: it counts 0
NOT_IN_FLOP_COUNTER = {"matrix @ vector", "mv", "addbmm", "dot", "bilinear"}


def test_sdpa_with_grouped_query_heads():
    # 4 query heads share 2 key/value heads: every query head still does its two products
    q4 = torch.randn(1, 4, 5, 8)
    kv = torch.randn(1, 2, 3, 8)
    seen = counted(F.scaled_dot_product_attention, q4, kv, kv, enable_gqa=True)
    assert seen == [("scaled_dot_product_attention", 4 * 5 * 3 * (8 + 8))]


def test_uncounted_products_are_reported_as_such():
    x = torch.randn(3, 3)
    assert counted(torch.einsum, "ij,jk,kl->il", x, x, x) == [("einsum", None)]
    assert counted(torch.tensordot, a[0], b[0], dims=1) == [("tensordot", None)]


def test_only_the_outermost_function_is_seen():
    mha = nn.MultiheadAttention(8, 2)
    x = torch.randn(4, 1, 8)
    seen = counted(
        F.multi_head_attention_forward, x, x, x, 8, 2, mha.in_proj_weight, mha.in_proj_bias, None, None,
        False, 0.0, mha.out_proj.weight, mha.out_proj.bias, need_weights=False,
    )
    assert seen == [("multi_head_attention_forward", None)]  # not its F.linear, nor its attention


def test_mode_is_off_afterwards_also_after_an_error():
    with pytest.raises(RuntimeError), ProductCounter(lambda op, macs: None):
        torch.ones(2, 3) @ torch.ones(2, 3)
    assert torch._C._len_torch_function_stack() == 0


def test_rules_cover_the_common_layers():
    assert all(has_rule(m) for m in (nn.Linear(2, 2), nn.Conv2d(1, 1, 1), nn.LSTM(2, 2),
                                     nn.MultiheadAttention(4, 2), nn.GRUCell(2, 2), nn.Bilinear(2, 2, 2)))
    assert not any(has_rule(m) for m in (nn.ReLU(), nn.Sequential(), nn.LayerNorm(2)))


# --- whole models: summary's multiply-adds equal FlopCounterMode's flops / 2 ------------------------
IDS = torch.randint(0, 100, (2, 8))  # batch 2, 8 tokens
IMAGE = torch.randn(1, 3, 32, 32)


def flop_counter_reference(model: nn.Module, *args) -> int:
    """FlopCounterMode's flops / 2 where it sees every product: with gradients on (nn.MultiheadAttention's
    no-grad fast path is one fused op it has no formula for) and attention as the math kernel's bmm
    (it has no formula for the CPU's fused attention kernel)."""
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as c:
        model(*args)
    return c.get_total_flops() // 2


def flop_counter_as_is(model: nn.Module, *args) -> int:
    """FlopCounterMode's flops / 2 under the conditions summary runs in: no gradients, default kernels."""
    with torch.no_grad(), FlopCounterMode(display=False) as c:
        model(*args)
    return c.get_total_flops() // 2


@cache
def vit() -> nn.Module:
    """torchvision's ViT, small: 16 patches of 8 x 8 and a class token, 2 layers, 4 heads of 16."""
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                hidden_dim=64, mlp_dim=128, num_classes=10).eval()


@cache
def swin() -> nn.Module:
    """torchvision's Swin, small: windows of 4 x 4, shifted in the first stage, 2 stages."""
    return torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                              window_size=[4, 4], num_classes=10).eval()


@cache
def language_model(name: str, attention: str) -> nn.Module:
    """GPT-2 or LLaMA (4 query heads sharing 2 key/value heads) from a tiny config, random weights."""
    transformers = pytest.importorskip("transformers")
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                         attn_implementation=attention)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                          max_position_embeddings=32, attn_implementation=attention)
        model = transformers.LlamaForCausalLM(config)
    assert model.config._attn_implementation == attention
    return model.eval()


# Q K^T and weights @ V of every query head: 2 layers x batch 2 x 4 heads x 8 x 8 x (16 + 16)
LM_ATTENTION = 2 * 2 * 4 * 8 * 8 * (16 + 16)
# nn.MultiheadAttention of ViT: q, k, v and out projections, 17 x 64 x 64 each, and 2 x 17 x 17 x 64, 2 layers
VIT_ATTENTION = 2 * (4 * 17 * 64 * 64 + 2 * 17 * 17 * 64)

MODELS = {  # name: (model, inputs, what FlopCounterMode counts 0 for under summary's conditions on the CPU)
    "vit, fused attention": (vit, (IMAGE,), VIT_ATTENTION),
    "swin": (swin, (IMAGE,), 0),
    "gpt2, eager": (lambda: language_model("gpt2", "eager"), (IDS,), 0),
    "gpt2, sdpa": (lambda: language_model("gpt2", "sdpa"), (IDS,), LM_ATTENTION),
    "llama, eager": (lambda: language_model("llama", "eager"), (IDS,), 0),
    "llama, sdpa": (lambda: language_model("llama", "sdpa"), (IDS,), LM_ATTENTION),
}
FUSED_CPU_KERNELS = (torch.ops.aten._native_multi_head_attention, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)


@cache
def summarised(name: str) -> hookscope.Summary:
    """summary() of one of MODELS, once for the tests below."""
    build, inputs, _ = MODELS[name]
    return hookscope.summary(build(), tuple(inputs))


@pytest.mark.parametrize("name", list(MODELS))
def test_models_count_what_flop_counter_mode_counts(name):
    build, inputs, _ = MODELS[name]
    model, s = build(), summarised(name)
    assert s.totals.macs == flop_counter_reference(model, *inputs) > 0 and not s.totals.macs_partial
    with sdpa_kernel(SDPBackend.MATH):  # whatever kernel runs the attention, the same products
        assert hookscope.summary(model, tuple(inputs)).totals.macs == s.totals.macs


@pytest.mark.parametrize("name", list(MODELS))
def test_flop_counter_mode_misses_exactly_the_fused_cpu_attention(name):
    """Under no_grad on the CPU, FlopCounterMode (torch 2.14) has no formula for the fused attention
    kernels (nn.MultiheadAttention's fast path, the CPU's scaled_dot_product_attention): it counts
    them 0, summary counts their products; everything else agrees."""
    build, inputs, missed = MODELS[name]
    if any(kernel in flop_registry for kernel in FUSED_CPU_KERNELS):
        missed = 0  # a later torch that counts them agrees in full
    assert summarised(name).totals.macs - flop_counter_as_is(build(), *inputs) == missed


def test_vit_without_its_fast_path_counts_the_same():
    model = vit().train()  # training mode: nn.MultiheadAttention runs F.multi_head_attention_forward
    try:
        s = hookscope.summary(model, IMAGE)
    finally:
        model.eval()
    assert s.totals.macs == flop_counter_reference(model, IMAGE) == summarised("vit, fused attention").totals.macs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_b_16", "swin_t"])
def test_full_size_torchvision_transformers_on_the_meta_device(name):
    """The real models at 224 x 224, shapes only: what torchvision publishes (giga multiply-adds)."""
    with torch.device("meta"):
        model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224, device="meta")
    s = hookscope.summary(model, x)
    assert s.totals.macs == flop_counter_reference(model, x) and not s.totals.macs_partial
    published = torchvision.models.get_model_weights(name).IMAGENET1K_V1.meta["_ops"]  # 17.564, 4.491
    assert round(s.totals.macs / 1e9, 3) == published


@pytest.mark.parametrize("name", ["gpt2, eager", "gpt2, sdpa", "llama, eager", "llama, sdpa"])
def test_attention_products_belong_to_the_attention_module(name):
    """q @ k^T and weights @ v run in the attention module's own forward (or a function it calls):
    its row counts them, on top of its projections' rows; LLaMA's query heads each count in full."""
    s = summarised(name)
    for layer in range(2):
        prefix = f"transformer.h.{layer}.attn" if name.startswith("gpt2") else f"model.layers.{layer}.self_attn"
        row = s[prefix][0]
        children = sum(s[c][0].macs for c in row.children if s[c][0].called)
        assert row.macs - children == LM_ATTENTION // 2


# --- torch functions another library replaced (torchlens wraps them until its unwrap_torch()) -------------
class MatmulNet(nn.Module):
    """``x @ w`` and ``torch.matmul(x, w)``: 2 x 5 outputs, 4 products each, twice: 80 multiply-adds."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w) + torch.matmul(x, self.w)


WRAP = """
import torch
real_matmul, real_dunder = torch.matmul, torch.Tensor.__matmul__
def matmul(*args, **kwargs):
    return real_matmul(*args, **kwargs)
def dunder(self, other):
    return real_dunder(self, other)
torch.matmul, torch.Tensor.__matmul__ = matmul, dunder
"""


def _wrapped_say(s) -> None:
    assert s.totals.macs == 80
    assert s.totals.macs_partial  # the count cannot vouch for functions that are not torch's
    text = str(s)
    assert "torch.matmul" in text and "Tensor.__matmul__" in text and "another library" in text


def test_torch_functions_replaced_after_import_are_counted_and_said(monkeypatch):
    namespace: dict = {}
    exec(compile(WRAP.replace("torch.matmul, torch.Tensor.__matmul__ = matmul, dunder", ""), "wrapper.py", "exec"),
         namespace)
    monkeypatch.setattr(torch, "matmul", namespace["matmul"])
    monkeypatch.setattr(torch.Tensor, "__matmul__", namespace["dunder"])
    s = hookscope.summary(MatmulNet(), torch.ones(2, 4))
    _wrapped_say(s)


def test_torch_functions_replaced_before_hookscope_is_imported_are_counted_and_said(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(WRAP + "import hookscope, sys\nsys.path.insert(0, sys.argv[1])\nfrom test_macs import MatmulNet, "
                      "_wrapped_say\n_wrapped_say(hookscope.summary(MatmulNet(), torch.ones(2, 4)))\nprint('ok')\n")
    done = subprocess.run([sys.executable, str(script), str(__import__("pathlib").Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_torch_own_functions_are_not_said_to_be_replaced():
    s = hookscope.summary(MatmulNet(), torch.ones(2, 4))
    assert s.totals.macs == 80 and not s.totals.macs_partial and "another library" not in str(s)
