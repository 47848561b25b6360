"""prune_heads(importance="taylor" | "entropy"): values worked out by hand (autograd on the heads'
slices, entropies of eager attention), streaming equal to one batch, the model left as it was, and
the refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hookscope.analysis.prune import prune_heads
from hookscope.core import hook_count
from hookscope.errors import HookscopeError


def _scores(res: object) -> dict[str, torch.Tensor]:
    return {r.layer: torch.tensor(r.scores, dtype=torch.float64) for r in res.rows}  # type: ignore[attr-defined]


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return float((a - b).abs().max()) <= rel * float(b.abs().max())


def _hf(kind: str, eager: bool = False) -> nn.Module:
    tr = pytest.importorskip("transformers")
    torch.manual_seed(3)
    # weights large enough for attention far from uniform (entropies that tell heads apart)
    small = dict(vocab_size=50, max_position_embeddings=32, num_hidden_layers=2, initializer_range=0.5)
    if kind == "bert":
        m = tr.BertForSequenceClassification(tr.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=32,
                                                           num_labels=3, **small))
    elif kind == "gpt2":
        m = tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                             use_cache=False, initializer_range=0.5))
    else:
        m = tr.LlamaForCausalLM(tr.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=8,
                                               num_key_value_heads=2, use_cache=False, **small))
    if eager:
        m.set_attn_implementation("eager")
    return m.eval()


# --- taylor -----------------------------------------------------------------------------------------
def _mha_heads_by_hand(mha: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """The heads' outputs before out_proj, batch x tokens x heads * head_dim, from the weights alone."""
    b, t, e = x.shape
    h, d = mha.num_heads, mha.head_dim
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).split(e, dim=-1)
    q, k, v = (u.reshape(b, t, h, d).transpose(1, 2) for u in (q, k, v))
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return (p @ v).transpose(1, 2).reshape(b, t, e)


@pytest.mark.parametrize("batch_first", [True, False])
def test_taylor_on_multihead_attention_is_the_heads_slice_times_its_gradient(batch_first: bool) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 4, batch_first=batch_first).double()
    net = nn.Sequential()
    net.add_module("attn", mha)

    class First(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if batch_first:
                return net.attn(x, x, x)[0]
            y = x.transpose(0, 1)
            return net.attn(y, y, y)[0].transpose(0, 1)

    model = First()
    model.add_module("net", net)
    x, w = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(3, 5, 8, dtype=torch.float64)
    loss = lambda out, batch: (out * w).sum().square()  # noqa: E731  (couples the samples: one backward)
    z = _mha_heads_by_hand(mha, x).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(F.linear(z, mha.out_proj.weight, mha.out_proj.bias), None), z)
    want = (z * g).reshape(3, 5, 4, 2).sum((1, 3)).abs().mean(0).detach()
    res = prune_heads(model, x, amount=0.0, importance="taylor", loss=loss)
    assert res.rows[0].layer == "net.attn" and _close(_scores(res)["net.attn"], want, 1e-10)


def _by_hand(model: nn.Module, out: str, batch: dict) -> torch.Tensor:
    """The output projection's input swapped for a leaf (a hook of the test's own; one layer per pass,
    as a detached leaf cuts the path through this layer to the ones before), the model's own loss
    differentiated with respect to it: per sample |sum of slice * gradient| per head, averaged."""
    leaf = {}

    def pre(m: nn.Module, args: tuple) -> tuple:
        leaf["z"] = args[0].detach().requires_grad_(True)
        return (leaf["z"], *args[1:])

    handle = model.get_submodule(out).register_forward_pre_hook(pre)
    try:
        loss = model(**batch).loss
    finally:
        handle.remove()
    (g,) = torch.autograd.grad(loss, leaf["z"])
    z = leaf["z"].detach()
    d = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    return (z * g).reshape(z.shape[0], z.shape[1], -1, d).sum((1, 3)).abs().mean(0)


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_taylor_on_hugging_face_models_uses_their_own_loss(kind: str) -> None:
    model = _hf(kind).double()
    ids = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 2, 1, 2]) if kind == "bert" else ids
    batch = {"input_ids": ids, "labels": labels}
    if kind == "bert":
        outs = [f"bert.encoder.layer.{i}.attention.output.dense" for i in range(2)]
        names = [f"bert.encoder.layer.{i}.attention.self" for i in range(2)]
    else:
        outs = [f"model.layers.{i}.self_attn.o_proj" for i in range(2)]
        names = [f"model.layers.{i}.self_attn" for i in range(2)]
    got = _scores(prune_heads(model, kwargs=batch, amount=0.0, importance="taylor"))
    assert list(got) == names
    for name, out in zip(names, outs):
        want = _by_hand(model, out, batch)
        assert _close(got[name], want, 1e-9), (name, got[name], want)
    assert all(p.grad is None for p in model.parameters())


def test_taylor_under_grouped_query_attention_prunes_whole_groups_by_summed_scores() -> None:
    model = _hf("llama")
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(2))
    res = prune_heads(model, kwargs={"input_ids": ids, "labels": ids}, amount=0.5, importance="taylor")
    for r in res.rows:  # 8 query heads in 2 key/value groups of 4: the group with the lower sum goes
        sums = [sum(r.scores[j * 4:(j + 1) * 4]) for j in range(2)]
        lost = min(range(2), key=lambda j: (sums[j], j))
        assert r.removed == tuple(range(lost * 4, lost * 4 + 4))


# --- entropy ----------------------------------------------------------------------------------------
def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p.double(), p.double()).sum(-1).mean((0, 2))


@pytest.mark.parametrize("eager", [False, True, "rows"])  # the kernel's inputs (sdpa; "rows": one query
# row at a time), the softmax's output (eager)
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])  # llama: 8 query heads on 2 key/value heads
def test_entropy_equals_that_of_eager_output_attentions(kind: str, eager: bool | str, monkeypatch) -> None:
    if eager == "rows":
        import hookscope.analysis.prune.heads._score_entropy as ent
        monkeypatch.setattr(ent, "_ROWS_BUDGET", 1)
    model = _hf(kind, eager is True)
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0  # padding: masked keys have probability 0
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        atts = ref(**batch, output_attentions=True).attentions
    got = _scores(prune_heads(model, kwargs=batch, amount=0.0, importance="entropy"))
    assert len(got) == 2 and all(float(s.max() - s.min()) > 0.05 for s in got.values())  # heads told apart
    for (name, s), a in zip(got.items(), atts):
        assert float((s - _entropy(a)).abs().max()) <= 1e-6, (name, s, _entropy(a))
    assert model.config._attn_implementation == ("eager" if eager is True else "sdpa")


def test_entropy_of_multihead_attention_and_the_most_diffuse_heads_go_first() -> None:
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(8, 4, 16, batch_first=True).eval()
    x = torch.randn(2, 6, 8) * 3
    with torch.no_grad():
        _, w = layer.self_attn(x, x, x, need_weights=True, average_attn_weights=False)
    want = _entropy(w)
    res = prune_heads(layer, x, amount=0.5, importance="entropy")
    assert float((_scores(res)["self_attn"] - want).abs().max()) <= 1e-6
    assert res.rows[0].removed == tuple(sorted(want.argsort(descending=True)[:2].tolist()))


def test_entropy_of_timm_attention_from_its_kernel_and_from_its_softmax_agree() -> None:
    vt = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(8)
    vit = vt.VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=4, num_classes=3,
                               mlp_ratio=2.0).eval()
    for p in vit.parameters():
        p.data.mul_(4)  # attention far from uniform
    x = torch.randn(2, 3, 16, 16)
    fused = _scores(prune_heads(vit, x, amount=0.0, importance="entropy"))
    for b in vit.blocks:
        b.attn.fused_attn = False  # the same attention written out: q @ k^T, softmax
    eager = _scores(prune_heads(vit, x, amount=0.0, importance="entropy"))
    assert list(fused) == ["blocks.0.attn", "blocks.1.attn"]
    for q in fused:
        assert float((fused[q] - eager[q]).abs().max()) <= 1e-6 and float(fused[q].max() - fused[q].min()) > 0.05


# --- streaming, the model as it was -----------------------------------------------------------------
@pytest.mark.parametrize("importance", ["taylor", "entropy", "output"])
def test_three_batches_stream_as_one_big_batch_and_max_batches_stops(importance: str) -> None:
    model = _hf("bert").double()
    g = torch.Generator().manual_seed(6)
    ids, labels = torch.randint(0, 50, (9, 5), generator=g), torch.randint(0, 3, (9,), generator=g)
    summed = (lambda out, batch: F.cross_entropy(out.logits, batch[1], reduction="sum")) \
        if importance == "taylor" else None
    pieces = [({"input_ids": ids[i:i + 3]}, labels[i:i + 3]) for i in (0, 3, 6)]
    kw = {"amount": 0.0, "importance": importance, "loss": summed}
    one = _scores(prune_heads(model, ids[:1], data=[({"input_ids": ids}, labels)], **kw))
    three = _scores(prune_heads(model, ids[:1], data=pieces + [({"input_ids": ids[:1] * 0}, labels[:1])],
                                max_batches=3, **kw))
    two = _scores(prune_heads(model, ids[:1], data=iter(pieces), max_batches=2, **kw))
    first = _scores(prune_heads(model, ids[:1], data=[({"input_ids": ids[:6]}, labels[:6])], **kw))
    for q in one:
        assert _close(three[q], one[q], 1e-9) and _close(two[q], first[q], 1e-9)
        assert not _close(two[q], one[q], 1e-6)


@pytest.mark.parametrize("importance", ["taylor", "entropy"])
def test_the_model_is_left_as_it_was(importance: str) -> None:
    model = _hf("gpt2").train()
    model.transformer.h[0].requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():  # taylor turns gradients on for its own pass only
        res = prune_heads(model, kwargs={"input_ids": ids, "labels": ids}, amount=0.0, importance=importance)
    assert res.removed == 0 and all(len(r.scores) == 4 and all(s > 0 for s in r.scores) for r in res.rows)
    assert model.training and all(m.training for m in model.modules())
    assert hook_count(model) == 0 and not any("forward" in vars(m) for m in model.modules())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# --- refusals ---------------------------------------------------------------------------------------
class _Hidden(nn.Module):
    """LLaMA-style attention whose probabilities are neither a softmax nor a kernel call of its own."""

    def __init__(self, folded: bool = False) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(8, 8) for _ in range(4))
        self.head_dim, self.folded = 2, folded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).reshape(b, t, 4, 2).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = q @ k.transpose(-1, -2)
        if self.folded:  # heads folded into the batch: the softmax's output is 3-D
            p = s.reshape(b * 4, t, t).softmax(-1).reshape(b, 4, t, t)
        else:
            e = (s - s.amax(-1, keepdim=True)).exp()
            p = e / e.sum(-1, keepdim=True)
        return self.o_proj((p @ v).transpose(1, 2).reshape(b, t, 8))


@pytest.mark.parametrize("net, kw, match", [
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), {"importance": "taylor"}, "taylor needs a loss"),
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), {"importance": "entropy", "loss": lambda o, b: o.sum()},
     "loss= is read by importance='taylor' only, not importance='entropy'"),
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), {"importance": "taylor", "loss": "mse"},
     "loss=str is not callable"),
    (_Hidden(), {"importance": "entropy"}, "'' ran no scaled_dot_product_attention or softmax"),
    (_Hidden(True), {"importance": "entropy"}, r"'' gives attention probabilities of shape \(8, 4, 4\)"),
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), {"importance": "entropi"}, "Did you mean 'entropy'"),
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), {"importance": "taylor", "loss": lambda o, b: 1 / 0},
     r"loss= failed on calibration batch 0 \(ZeroDivisionError"),
    (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
     {"importance": "taylor", "loss": lambda o, b: o.detach().sum()},
     "the loss does not depend on the model's output"),
])
def test_bad_requests_are_refused_in_one_line_model_untouched(net: nn.Module, kw: dict, match: str) -> None:
    next(net.parameters()).requires_grad_(False)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    flags = [p.requires_grad for p in net.parameters()]
    with pytest.raises(HookscopeError, match=match) as e:
        prune_heads(net, torch.randn(2, 4, 8), amount=0.5, **kw)
    assert "\n" not in str(e.value) and hook_count(net) == 0 and not any("forward" in vars(m) for m in net.modules())
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items()) and net.training
    assert all(p.grad is None for p in net.parameters()) and [p.requires_grad for p in net.parameters()] == flags


def test_the_layer_refused_is_named_inside_a_model() -> None:
    net = nn.Sequential(nn.Linear(8, 8))
    net.add_module("mix", _Hidden())
    with pytest.raises(HookscopeError, match="'mix' ran no scaled_dot_product_attention"):
        prune_heads(net, torch.randn(2, 4, 8), amount=0.5, importance="entropy")
    res = prune_heads(net, torch.randn(2, 4, 8), amount=0.5, importance="taylor", loss=lambda o, b: o.square().sum())
    assert res.rows[0].layer == "mix" and len(res.rows[0].removed) == 2
