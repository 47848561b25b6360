"""Wanda masks through calibration hooks: equal to the published formula worked out here, layer by layer."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch import nn

import hookscope
from hookscope.core import hook_count

transformers.logging.set_verbosity_error()


def _llama() -> nn.Module:
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   bos_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(cfg).eval()


def _opt() -> nn.Module:
    torch.manual_seed(2)
    cfg = transformers.OPTConfig(vocab_size=40, hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                 max_position_embeddings=32, word_embed_proj_dim=16, bos_token_id=0, eos_token_id=1,
                                 pad_token_id=1)
    return transformers.OPTForCausalLM(cfg).eval()


def _gpt2() -> nn.Module:
    torch.manual_seed(4)
    cfg = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _linears(block: nn.Module) -> list[nn.Module]:
    """nn.Linear, and GPT-2's Conv1D (a linear layer whose weight is stored (in, out))."""
    return [m for m in block.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"]


def _matrix(m: nn.Module) -> torch.Tensor:
    return m.weight.t() if type(m).__name__ == "Conv1D" else m.weight


def _mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4))


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(2, 40, (4, 10), generator=torch.Generator().manual_seed(seed))


MODELS = {"llama": (_llama, lambda m: m.model.layers, _tokens),
          "opt": (_opt, lambda m: m.model.decoder.layers, _tokens),
          "gpt2": (_gpt2, lambda m: m.transformer.h, _tokens),
          "mlp": (_mlp, lambda m: [l for l in m if isinstance(l, nn.Linear)],
                  lambda seed=0: torch.randn(24, 16, generator=torch.Generator().manual_seed(seed)) * 3)}


def _inputs_of(model: nn.Module, layers: list[nn.Module], data: torch.Tensor) -> list[torch.Tensor]:
    """Every token's input to each layer when the whole model runs on the data, as ``[tokens, in]``."""
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    hooks = [l.register_forward_hook(lambda m, i, o, k=k: seen[k].append(i[0].reshape(-1, i[0].shape[-1])))
             for k, l in enumerate(layers)]
    try:
        with torch.no_grad():
            model(data)
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(s) for s in seen]


def _formula(w: torch.Tensor, x: torch.Tensor, sparsity: float | None, n_m: tuple[int, int] | None) -> torch.Tensor:
    """Wanda's published rule: S_ij = |W_ij| * ||X_j||_2, the lowest of each row (or of each N:M group) pruned."""
    score = w.abs() * x.norm(dim=0)
    pruned = torch.zeros_like(w, dtype=torch.bool)
    for r in range(w.shape[0]):
        if n_m is None:
            pruned[r, score[r].argsort()[: int(w.shape[1] * sparsity)]] = True
            continue
        n, m = n_m
        for g in range(0, w.shape[1], m):
            pruned[r, g + score[r, g:g + m].argsort()[:n]] = True
    return pruned


def _reference(model: nn.Module, blocks: list[nn.Module], data: torch.Tensor, sparsity: float | None,
               n_m: tuple[int, int] | None) -> list[torch.Tensor]:
    """Pruned entries of every Linear, block after block, each block measured in the whole model with the
    blocks before it pruned (the weights zeroed on this copy)."""
    out = []
    for block in blocks:
        linears = _linears(block)
        for lin, x in zip(linears, _inputs_of(model, linears, data)):
            pruned = _formula(_matrix(lin).detach(), x, sparsity, n_m)
            out.append(pruned)
        with torch.no_grad():
            for lin, pruned in zip(linears, out[-len(linears):]):
                _matrix(lin)[pruned] = 0
    return out


@pytest.mark.parametrize("setting", [{"sparsity": 0.5}, {"sparsity": 0.3}, {"n_m": (2, 4)}, {"n_m": (4, 8)}],
                         ids=str)
@pytest.mark.parametrize("name", list(MODELS))
def test_wanda_masks_are_the_published_formula_block_by_block(name, setting):
    build, blocks, data_of = MODELS[name]
    model, data = build(), data_of()
    ref = copy.deepcopy(model)
    expected = _reference(ref, list(blocks(ref)), data, setting.get("sparsity"), setting.get("n_m"))
    r = hookscope.prune_calibrated(model, data, method="wanda", **setting)
    linears = [m for b in blocks(model) for m in _linears(b)]
    assert len(linears) == len(expected) == len(r.rows)
    for lin, pruned in zip(linears, expected):
        mask = lin.weight_mask.t() if type(lin).__name__ == "Conv1D" else lin.weight_mask
        assert torch.equal(mask == 0, pruned)
    assert r.zeros == sum(int(p.sum()) for p in expected)
    assert hook_count(model) == sum(1 for _ in linears)  # the masks' own pre-hooks, nothing else
    hookscope.remove_masks(model)
    assert hook_count(model) == 0


def test_wanda_keeps_the_weights_and_the_head_and_embeddings_are_left_alone():
    model = _llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    hookscope.prune_calibrated(model, _tokens(), method="wanda", sparsity=0.5)
    after = dict(model.named_parameters())
    for n, p in before.items():
        key = n.replace(".weight", ".weight_orig") if n.replace(".weight", ".weight_orig") in after else n
        assert torch.equal(after[key], p), n
    assert [q for q, _ in hookscope.analysis.prune.masks.masked(model)] == [
        f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                             "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                             "mlp.down_proj")]


def test_the_second_block_is_calibrated_on_the_pruned_first_blocks_outputs():
    model = _llama()
    dense = copy.deepcopy(model)
    seen: list[torch.Tensor] = []
    h = model.model.layers[1].register_forward_pre_hook(lambda m, a, k: seen.append(a[0].clone()), with_kwargs=True)
    try:
        hookscope.prune_calibrated(model, _tokens(), method="wanda", sparsity=0.5)
    finally:
        h.remove()
    later: list[torch.Tensor] = []
    for net in (model, dense):
        g = net.model.layers[1].register_forward_pre_hook(lambda m, a, k: later.append(a[0].clone()), with_kwargs=True)
        with torch.no_grad():
            net(_tokens())
        g.remove()
    # the dense pass that checks the blocks feed each other, then one calibration pass over block 1 (the
    # last block: no pass to feed a next one)
    assert len(seen) == 2 and torch.equal(seen[0], later[1][:1])  # the check runs on the first sequence
    torch.testing.assert_close(seen[1], later[0], rtol=0, atol=1e-6)  # the pruned first block's outputs
    assert (seen[1] - later[1]).abs().max() > 1e-3  # not the dense ones
    hookscope.remove_masks(model)
    assert hook_count(model) == 0


def test_the_masks_are_read_by_sparsity_summary_and_made_permanent_by_remove_masks():
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU(), nn.Linear(8, 4, bias=False))
    r = hookscope.prune_calibrated(model, torch.randn(16, 8), method="wanda", n_m=(2, 4))
    assert (r.zeros, r.numel) == (48, 96)
    read = hookscope.sparsity(model)
    assert [(row.layer, row.zeros, row.masked) for row in read.rows] == [("0", 32, True), ("2", 16, True)]
    s = hookscope.summary(model, torch.randn(1, 8))
    assert [s[n][0].zeros for n in ("0", "2")] == [32, 16]
    masks = [model[0].weight_mask.clone(), model[2].weight_mask.clone()]
    assert hookscope.remove_masks(model) == ["0.weight", "2.weight"]
    assert torch.equal(model[0].weight == 0, masks[0] == 0) and torch.equal(model[2].weight == 0, masks[1] == 0)
    assert hook_count(model) == 0


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


BAD = [
    ({"sparsity": 1.0}, "outside [0, 1)"),
    ({"sparsity": -0.1}, "outside [0, 1)"),
    ({"sparsity": float("nan")}, "outside [0, 1)"),
    ({"sparsity": True}, "outside [0, 1)"),
    ({}, "not neither"),
    ({"sparsity": 0.5, "n_m": (2, 4)}, "not both"),
    ({"n_m": (2, 5)}, "5 does not divide"),
    ({"n_m": (4, 4)}, "0 < N < M"),
    ({"n_m": "2:4"}, "0 < N < M"),
    ({"sparsity": 0.5, "method": "wandaa"}, "Did you mean 'wanda'"),
    ({"sparsity": 0.5, "blocksize": 0}, "blocksize=0"),
]


@pytest.mark.parametrize(("kwargs", "text"), BAD, ids=[t for _, t in BAD])
def test_bad_settings_are_one_line_and_leave_the_model_untouched(kwargs, text):
    model = _llama()
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.prune_calibrated(model, _tokens(), **kwargs)
    assert text in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items()) and len(model.state_dict()) == len(before)
    assert hook_count(model) == 0


@pytest.mark.parametrize("data", ["some text", [], [torch.zeros(2, 3), "x"], torch.zeros(0, 4), 3, {1: 2}],
                         ids=["str", "empty", "list-with-str", "no-elements", "int", "dict-int-keys"])
def test_calibration_data_of_the_wrong_kind_is_one_line(data):
    model = _mlp()
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError, match="is not calibration data") as e:
        hookscope.prune_calibrated(model, data, sparsity=0.5)
    assert "\n" not in str(e.value)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    assert hook_count(model) == 0


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_data_the_model_refuses_is_one_line_with_no_hook_left(method):
    model = _llama()
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError, match="calibration batch 0 fails in LlamaForCausalLM") as e:
        hookscope.prune_calibrated(model, torch.randn(2, 5), method=method, sparsity=0.5)  # floats, not token ids
    assert "\n" not in str(e.value)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    assert hook_count(model) == 0 and not model.training


def test_a_failure_in_a_later_block_leaves_the_model_as_it_was():
    model = _mlp()
    before = _weights(model)

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model[3] = Boom()  # after the first two linear layers are calibrated and pruned
    with pytest.raises(hookscope.HookscopeError, match=r"calibration fails in block '3' \(RuntimeError: boom\)"):
        hookscope.prune_calibrated(model, torch.randn(8, 16), method="sparsegpt", sparsity=0.5)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    assert hookscope.analysis.prune.masks.masked(model) == [] and hook_count(model) == 0


def test_inputs_an_mlp_refuses_and_a_lazy_layer_are_one_line():
    model = _mlp()
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError, match="calibration fails in block '0' \\(RuntimeError") as e:
        hookscope.prune_calibrated(model, torch.ones(2, 16, dtype=torch.long), sparsity=0.5)
    assert "\n" not in str(e.value) and hook_count(model) == 0
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    with pytest.raises(hookscope.HookscopeError, match="0.weight holds no values yet"):
        hookscope.prune_calibrated(nn.Sequential(nn.LazyLinear(4)), torch.randn(2, 4), sparsity=0.5)
    lin = nn.Linear(4, 4)
    hookscope.prune_calibrated(lin, torch.randn(2, 4), sparsity=0.5)
    with pytest.raises(hookscope.HookscopeError, match="^weight is masked already"):
        hookscope.prune_calibrated(lin, torch.randn(2, 4), sparsity=0.5)


def test_a_model_with_no_linear_layer_is_one_line():
    model = nn.Sequential(nn.Conv1d(2, 2, 1), nn.ReLU())
    with pytest.raises(hookscope.HookscopeError, match="no nn.Linear layer") as e:
        hookscope.prune_calibrated(model, torch.randn(2, 2, 4), sparsity=0.5)
    assert "\n" not in str(e.value) and hook_count(model) == 0


def test_a_masked_layer_or_tied_weights_are_refused_before_anything_changes():
    model = _mlp()
    hookscope.prune(model, "2", amount=0.5)
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError, match="2.weight is masked already"):
        hookscope.prune_calibrated(model, torch.randn(8, 16), sparsity=0.5)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    tied = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    tied[2].weight = tied[0].weight
    with pytest.raises(hookscope.HookscopeError, match="tied weights"):
        hookscope.prune_calibrated(tied, torch.randn(8, 4), sparsity=0.5)
    assert hook_count(tied) == 0


def test_a_data_loader_of_inputs_and_labels_gives_the_masks_of_its_inputs():
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(5))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(24)), batch_size=8)
    a, b = _mlp(), _mlp()
    hookscope.prune_calibrated(a, loader, sparsity=0.5)
    hookscope.prune_calibrated(b, list(x.split(8)), sparsity=0.5)
    assert all(torch.equal(m.weight_mask, n.weight_mask) for m, n in zip(a, b) if isinstance(m, nn.Linear))


def test_blocks_in_a_list_that_do_not_feed_each_other_are_refused():
    class Branches(nn.Module):  # a ModuleList of parallel branches: the second is not fed the first's output
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(b(x) for b in self.branches)

    model = Branches()
    before = _weights(model)
    with pytest.raises(hookscope.HookscopeError, match="'branches' are not run one after another") as e:
        hookscope.prune_calibrated(model, torch.randn(4, 8), sparsity=0.5)
    assert "\n" not in str(e.value) and hook_count(model) == 0
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())


def test_training_mode_is_kept_and_sparsity_zero_prunes_nothing():
    model = _mlp().train()
    r = hookscope.prune_calibrated(model, torch.randn(8, 16), method="wanda", sparsity=0.0)
    assert r.zeros == 0 and all(m.training for m in model.modules())


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_prune_with_a_calibrated_method_and_no_data_asks_for_data(method):
    model = _mlp()
    with pytest.raises(hookscope.HookscopeError, match=rf"method='{method}' is calibrated on data; pass data=") as e:
        hookscope.prune(model, amount=0.5, method=method)
    assert "\n" not in str(e.value) and hook_count(model) == 0 and hookscope.sparsity(model).zeros == 0
