"""Multiply-adds of matrix-product functions, each worked out by hand, and PyTorch's counter agreeing."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

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
