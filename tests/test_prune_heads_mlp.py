"""Attention heads and MLP hidden units scored in one calibration pass (``prune_heads(..., mlp=)``):
the scores worked out by hand at the down projection's input, the number of forward passes over the
calibration data unchanged by ``mlp=``, the masked units removed by ``compact`` with the compacted
model's outputs equal to the masked model's in float64, and bad requests refused before anything changes."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn

from hookscope.analysis.prune import compact, prune_heads
from hookscope.core import hook_count
from hookscope.errors import HookscopeError

from helpers import rel
from helpers import only_masks as _only_masks

TOL = 1e-8  # relative, float64


def _layer(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.TransformerEncoderLayer(8, 4, 16, dropout=0.0, batch_first=True).double().eval()


def _inputs_of(module: nn.Module, run: Any) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    h = module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    try:
        run()
    finally:
        h.remove()
    return seen


# --- scores ------------------------------------------------------------------------------------------
def test_output_scores_are_the_mean_abs_input_of_the_down_projection_over_every_batch() -> None:
    net = _layer(1)
    data = [torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)]
    a = _inputs_of(net.linear2, lambda: [net(b) for b in data])
    want = torch.cat([t.reshape(-1, 16) for t in a]).abs().mean(0)  # 3*5 + 2*4 positions
    res = prune_heads(net, data[0][:1], amount=0.25, mlp=0.25, data=data)
    row = res.mlp_rows[0]
    assert row.layer == "linear2" and row.units == 16
    assert torch.allclose(torch.tensor(row.scores, dtype=torch.float64), want, rtol=1e-12, atol=0)
    assert list(row.removed) == sorted(want.argsort()[:4].tolist()) and row.kept == 12
    assert net.linear1.weight[list(row.removed)].abs().sum() == 0 and net.linear1.bias[list(row.removed)].abs().sum() == 0
    assert _only_masks(net)


def test_taylor_scores_are_the_per_sample_abs_activation_times_gradient() -> None:
    net = _layer(2)
    x, w = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    loss = lambda out, batch: (out * w).sum()  # noqa: E731  (a norm's output has a constant square sum)
    ref = copy.deepcopy(net)
    kept: list[torch.Tensor] = []
    h = ref.linear2.register_forward_pre_hook(lambda m, a: kept.append(a[0]))
    with torch.enable_grad():
        (g,) = torch.autograd.grad(loss(ref(x), x), kept)
    h.remove()
    want = (kept[0] * g).sum(1).abs().mean(0)  # per sample |sum over positions of a * dL/da|, mean over samples
    res = prune_heads(net, x, amount=0.25, importance="taylor", loss=loss, mlp=0.5)
    assert torch.allclose(torch.tensor(res.mlp_rows[0].scores, dtype=torch.float64), want, rtol=1e-10, atol=0)
    assert res.mlp_rows[0].removed == tuple(sorted(want.argsort()[:8].tolist()))
    assert all(p.grad is None for p in net.parameters()) and _only_masks(net)


def test_l2_scores_are_the_norm_of_each_units_rows_and_columns_without_running_the_model() -> None:
    net = _layer(3)
    calls = []
    net.register_forward_pre_hook(lambda m, a: calls.append(1))
    want = (net.linear1.weight.pow(2).sum(1) + net.linear2.weight.pow(2).sum(0)).sqrt()
    res = prune_heads(net, torch.randn(1, 3, 8, dtype=torch.float64), amount=0.5, importance="l2", mlp=0.25)
    assert torch.allclose(torch.tensor(res.mlp_rows[0].scores, dtype=torch.float64), want.detach(), rtol=1e-12)
    assert len(calls) == 1  # the one traced pass that finds the MLP's channel group; no calibration pass


def test_entropy_ranks_the_mlp_units_by_their_output() -> None:
    a, b = _layer(4), _layer(4)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    ent = prune_heads(a, x, amount=0.25, importance="entropy", mlp=0.5)
    out = prune_heads(b, x, amount=0.25, importance="output", mlp=0.5)
    assert ent.mlp_rows == out.mlp_rows
    assert "by output importance" in ent.table().splitlines()[-1]


# --- one pass ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("importance", ["output", "taylor", "entropy"])
def test_mlp_scoring_adds_no_forward_pass_over_the_calibration_data(importance: str) -> None:
    data = [(torch.randn(3, 5, 8, dtype=torch.float64), torch.zeros(3, 5, 8, dtype=torch.float64))] * 4
    loss = (lambda out, batch: (out - batch[1]).square().sum()) if importance == "taylor" else None
    counts = []
    for mlp in (None, 0.5):
        net = _layer(5)
        sizes: list[int] = []
        net.register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[0]))
        res = prune_heads(net, torch.randn(1, 5, 8, dtype=torch.float64), amount=0.5, importance=importance,
                          data=data, loss=loss, mlp=mlp)
        counts.append(sizes.count(3))  # the calibration batches hold 3 samples; the example input 1
        assert sizes.count(1) == (0 if mlp is None else 1)  # the traced pass on the example input
        assert bool(res.mlp_rows) == (mlp is not None)
    assert counts == [4, 4]


# --- compact ---------------------------------------------------------------------------------------------
def _hf(kind: str) -> nn.Module:
    tr = pytest.importorskip("transformers")
    torch.manual_seed(9)
    if kind == "gpt2":
        return tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                                n_inner=24, use_cache=False)).double().eval()
    if kind == "bert":
        return tr.BertForSequenceClassification(tr.BertConfig(
            vocab_size=50, hidden_size=16, num_attention_heads=4, num_hidden_layers=2, intermediate_size=24,
            max_position_embeddings=32, num_labels=3)).double().eval()
    cfg = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_attention_heads=8, num_key_value_heads=2,
               num_hidden_layers=2, max_position_embeddings=32, use_cache=False)
    return tr.LlamaForCausalLM(tr.LlamaConfig(**cfg)).double().eval()


@pytest.mark.parametrize("kind, downs, units", [
    ("llama", "model.layers.{}.mlp.down_proj", 48), ("gpt2", "transformer.h.{}.mlp.c_proj", 24),
    ("bert", "bert.encoder.layer.{}.output.dense", 24)])
@pytest.mark.parametrize("importance", ["output", "taylor", "l2"])
def test_hugging_face_mlps_compact_to_the_masked_model(kind: str, downs: str, units: int, importance: str) -> None:
    net = _hf(kind)
    x = torch.randint(0, 50, (2, 7))
    labels = {"labels": torch.randint(0, 3 if kind == "bert" else 50, (2,) if kind == "bert" else (2, 7))}
    res = prune_heads(net, x, amount=0.5, mlp=0.25, importance=importance,
                      data=[{"input_ids": x, **labels}] if importance == "taylor" else None)
    assert [r.layer for r in res.mlp_rows] == [downs.format(0), downs.format(1)]  # BERT's pooler is no MLP
    assert all(r.units == units and len(r.removed) == units // 4 for r in res.mlp_rows)
    small = compact(net, x)
    assert rel(net(x).logits, small(x).logits) <= TOL
    down = small.get_submodule(downs.format(0))
    width = down.weight.shape[0] if kind == "gpt2" else down.in_features  # GPT-2's Conv1D: (in, out)
    assert width == units - units // 4


def test_torchvision_vit_heads_and_mlp_compact_to_the_masked_model() -> None:
    tv = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(4)
    vit = tv.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=16, mlp_dim=32,
                               num_classes=5).double().eval()
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the classifier at zero
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    res = prune_heads(vit, x, amount=0.5, mlp=0.5)
    assert [r.layer for r in res.mlp_rows] == [f"encoder.layers.encoder_layer_{i}.mlp.3" for i in (0, 1)]
    small = compact(vit, x)
    assert rel(vit(x), small(x)) <= TOL
    assert small.encoder.layers[0].mlp[0].out_features == 16 and small.encoder.layers[0].self_attention.num_heads == 2


def test_timm_vit_mlp() -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(6)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                            num_classes=3).double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    res = prune_heads(vit, x, amount=0.0, mlp=0.5)
    assert [r.layer for r in res.mlp_rows] == ["blocks.0.mlp.fc2", "blocks.1.mlp.fc2"] and res.removed == 0
    small = compact(vit, x)
    assert rel(vit(x), small(x)) <= TOL and small.blocks[1].mlp.fc1.out_features == 384


# --- again, layers=, the result ----------------------------------------------------------------------------
def test_pruning_again_takes_a_share_of_the_live_units_and_layers_limits_the_mlps() -> None:
    net = nn.TransformerEncoder(_layer(7), 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    first = prune_heads(net, x, amount=0.0, mlp=0.5, layers="layers.1.self_attn")
    assert [r.layer for r in first.mlp_rows] == ["layers.1.linear2"] and first.mlp_rows[0].kept == 8
    again = prune_heads(net, x, amount=0.0, mlp=0.5)
    assert [(r.layer, len(r.already), len(r.removed), r.kept) for r in again.mlp_rows] == [
        ("layers.0.linear2", 0, 8, 8), ("layers.1.linear2", 8, 4, 4)]
    assert again.mlp_rows[1].already == first.mlp_rows[0].removed
    d = again.to_dict()["mlp"]
    assert d["units"] == 32 and d["removed"] == 12 and d["rows"][1]["already"] == list(first.mlp_rows[0].removed)
    assert prune_heads(_layer(), x, amount=0.5).to_dict()["mlp"] is None
    assert "12 of 32 MLP hidden units masked now in 2 MLPs" in again.table()


@pytest.mark.parametrize("kw, match", [
    ({"mlp": 1.0}, r"mlp=1\.0 is not a fraction of MLP hidden units in \[0, 1\); pass e\.g\. mlp=0\.25"),
    ({"mlp": True}, "mlp=True is not a fraction"),
    ({"mlp": -0.1}, "is not a fraction"),
])
def test_bad_mlp_values_are_refused_in_one_line_model_untouched(kw: dict, match: str) -> None:
    net = _layer()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(HookscopeError, match=match) as e:
        prune_heads(net, torch.randn(1, 3, 8, dtype=torch.float64), amount=0.5, **kw)
    assert "\n" not in str(e.value) and hook_count(net) == 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_without_an_example_input_or_an_mlp_beside_the_attention_mlp_is_refused_untouched() -> None:
    net = _layer()
    with pytest.raises(HookscopeError, match=r"mlp= finds the MLPs on an example input; pass one"):
        prune_heads(net, amount=0.5, importance="l2", mlp=0.5)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.attn(x, x, x)[0]

    class Bare(nn.Module):  # blocks of attention alone, then a classifier: no MLP of a block
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(Block(), Block())
            self.head = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(x)).mean(1)

    model = Bare()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(HookscopeError, match=r"mlp=: no MLP of Bare beside the attention layers chosen"):
        prune_heads(model, torch.randn(1, 3, 8), amount=0.5, mlp=0.5)
    assert hook_count(model) == 0 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_failing_calibration_pass_leaves_no_hook_and_the_model_as_it_was() -> None:
    net = _layer()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(HookscopeError, match="taylor needs a loss"):
        prune_heads(net, torch.randn(2, 3, 8, dtype=torch.float64), amount=0.5, importance="taylor", mlp=0.5)
    assert hook_count(net) == 0 and all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())


def test_qwen2_mlp_is_found_and_compacts() -> None:
    tr = pytest.importorskip("transformers")
    torch.manual_seed(11)
    net = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, use_cache=False)).double().eval()
    x = torch.randint(0, 50, (2, 6))
    res = prune_heads(net, x, amount=0.5, mlp=0.5)
    assert [(r.layer, r.kept) for r in res.mlp_rows] == [("model.layers.0.mlp.down_proj", 20)]
    small = compact(net, x)
    assert rel(net(x).logits, small(x).logits) <= TOL and small.model.layers[0].mlp.gate_proj.out_features == 20


def test_not_finite_scores_are_refused_before_any_head_is_masked() -> None:
    net = _layer()
    with torch.no_grad():
        net.linear1.weight[3, 0] = math.inf
    with pytest.raises(HookscopeError, match="scores of the MLP units of 'linear2' are not finite"):
        prune_heads(net, torch.randn(1, 3, 8, dtype=torch.float64), amount=0.5, importance="l2", mlp=0.5)
    assert hook_count(net) == 0


# --- the command line ---------------------------------------------------------------------------------------
def test_cli_heads_and_mlp_compact_json(tmp_path, capsys) -> None:
    import json

    from hookscope.cli import main

    tr = pytest.importorskip("transformers")
    tr.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, intermediate_size=64,
                  max_position_embeddings=64, num_labels=2).save_pretrained(tmp_path / "bert-tiny")
    code = main(["prune", "hf:BertForSequenceClassification", "--config", str(tmp_path / "bert-tiny"), "--heads", "0.5",
                 "--mlp", "0.25", "--compact", "--repeats", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["mode"] == "heads"
    mlp = doc["pruned"]["mlp"]
    assert mlp["amount"] == 0.25 and [r["kept"] for r in mlp["rows"]] == [48, 48] and mlp["removed"] == 32
    params = next(r for r in doc["comparison"]["rows"] if r["name"] == "parameters")
    # each layer: 4 heads of 4 (q, k, v rows and biases, output columns) and 16 units (rows, biases, columns)
    assert params["before"] - params["after"] == 2 * (3 * 16 * 32 + 3 * 16 + 16 * 32) + 2 * (16 * 32 + 16 + 16 * 32)


@pytest.mark.parametrize(("argv", "match"), [
    (["--mlp", "0.5"], r"--mlp 0\.5 scores the MLP hidden units in the pass that scores the heads; add --heads"),
    (["--channels", "--amount", "0.5", "--mlp", "0.5"], "add --heads FRACTION"),
    (["--heads", "0.5", "--mlp", "1"], r"--mlp 1 is not a share of MLP hidden units in \[0, 1\)"),
])
def test_cli_mlp_bad_options_exit_non_zero_in_one_line(argv: list[str], match: str, capsys) -> None:
    import re

    from hookscope.cli import main

    code = main(["prune", "demo", *argv, "--repeats", "1"])
    err = capsys.readouterr().err
    assert code != 0 and re.search(match, err) and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("kind, field", [("llama", "intermediate_size"), ("gpt2", "n_inner"),
                                         ("bert", "intermediate_size")])
def test_the_config_says_the_kept_mlp_width_so_from_pretrained_loads_it(kind: str, field: str, tmp_path) -> None:
    net = _hf(kind)
    x = torch.randint(0, 50, (2, 7))
    prune_heads(net, x, amount=0.0, mlp=0.25)
    small = compact(net, x)
    assert getattr(small.config, field) == (36 if kind == "llama" else 18)
    assert getattr(net.config, field) == (48 if kind == "llama" else 24)  # the masked model's config as it was
    small.save_pretrained(tmp_path)
    back = type(small).from_pretrained(tmp_path).double().eval()
    assert rel(small(x).logits, back(x).logits) <= TOL


def test_mlps_left_with_different_widths_leave_the_config_with_a_warning() -> None:
    net = _hf("llama")
    x = torch.randint(0, 50, (2, 7))
    prune_heads(net, x, amount=0.0, mlp=0.25, layers="model.layers.0.*")
    with pytest.warns(UserWarning, match=r"config keeps intermediate_size=48: its MLPs now keep \[36, 48\] hidden units"):
        small = compact(net, x)
    assert small.config.intermediate_size == 48 and small.model.layers[0].mlp.down_proj.in_features == 36
