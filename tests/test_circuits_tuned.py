"""The tuned lens (hookscope.tune_lens, TunedLens, load_lens, logit_lens(tuned=)): at the identity it is the
logit lens; trained, it equals the tuned-lens reference's training (its TunedLens module, its recipe)
on GPT-2, LLaMA and GPT-NeoX configurations (the families the reference knows); on a model whose last block adds a known vector, it finds that
vector; saved and loaded it reads the same; a lens for another model is refused."""

from __future__ import annotations

import json

import pytest
import torch

import hookscope
from hookscope.errors import HookscopeError

transformers = pytest.importorskip("transformers")


def _gpt2(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=50, initializer_range=0.2,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=60, initializer_range=0.2, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def _neox(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPTNeoXConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                        vocab_size=60, initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    return transformers.GPTNeoXForCausalLM(config).eval()


def _data(vocab: int, n: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, 10), generator=torch.Generator().manual_seed(seed))


def test_the_untrained_lens_is_the_logit_lens() -> None:
    lm, ids = _gpt2(), torch.tensor([3, 1, 4, 1, 5])
    lens = hookscope.tune_lens(lm, _data(50), steps=0)
    assert lens.weight.abs().max() == 0 and lens.bias.abs().max() == 0 and lens.history.shape == (0, 2)
    plain, tuned = hookscope.logit_lens(lm, ids), hookscope.logit_lens(lm, ids, tuned=lens)
    assert torch.equal(plain.logits, tuned.logits) and tuned.kind == "tuned lens" and plain.kind == "logit lens"
    assert [r.kl_before for r in lens.rows] == [r.kl_after for r in lens.rows]


def _reference(lm: torch.nn.Module, batches: list[torch.Tensor], steps: int) -> object:
    """tuned-lens 0.2's training loop (scripts/train_loop.py) as it runs with its defaults (KL loss, SGD with
    Nesterov momentum 0.9 at lr 1 x (1 - 0.9), weight decay 1e-3, the linear schedule of its
    create_scheduler, the gradients clipped at 1), in float32 (the reference autocasts the lens to bfloat16)."""
    lenses = pytest.importorskip("tuned_lens.nn.lenses")
    lens = lenses.TunedLens.from_model(lm)
    opt = torch.optim.SGD(lens.parameters(), lr=1.0 * (1 - 0.9), momentum=0.9, nesterov=True, weight_decay=1e-3)
    schedule = transformers.get_linear_schedule_with_warmup(opt, 0, steps)
    for step in range(steps):
        with torch.no_grad():
            out = lm(input_ids=batches[step % len(batches)], output_hidden_states=True)
        labels = out.logits.float().log_softmax(dim=-1)
        for i, h in enumerate(out.hidden_states[:-1]):
            logits = lens(h, idx=i)
            loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        schedule.step()
    return lens


@pytest.mark.parametrize("make", [_gpt2, _llama, _neox], ids=["gpt2", "llama", "neox"])
def test_training_equals_the_tuned_lens_reference(make) -> None:
    lm = make(1)
    vocab = lm.config.vocab_size
    batches = list(_data(vocab, 24, seed=5).split(8))
    ours = hookscope.tune_lens(lm, batches, steps=12)
    ref = _reference(lm, batches, 12)
    for i, translator in enumerate(ref.layer_translators):
        assert torch.allclose(ours.weight[i], translator.weight.detach(), atol=1e-5, rtol=1e-4), f"translator {i}"
        assert torch.allclose(ours.bias[i], translator.bias.detach(), atol=1e-5, rtol=1e-4), f"translator {i}"
    ids = _data(vocab, 1, seed=9)
    with torch.no_grad():  # the reference's lens applied to a fresh sequence's hidden states
        hidden = lm(input_ids=ids, output_hidden_states=True).hidden_states
        want = torch.cat([ref(h, idx=i) for i, h in enumerate(hidden[:-1])] + [lm(input_ids=ids).logits])
    got = hookscope.logit_lens(lm, ids[0], tuned=ours).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert all(r.kl_after < r.kl_before for r in ours.rows[:-1])


def test_a_planted_shift_is_found() -> None:
    """The last block adds a constant vector ``c`` to the stream (its attention writes nothing, its MLP only its
    bias), so the stream before it needs exactly ``+ c`` (up to the final LayerNorm's scale and centring) to give
    the final distribution: the tuned lens's bias for it points along ``c``, centred, and its KL falls near 0."""
    lm = _gpt2(layers=2)
    c = torch.randn(32, generator=torch.Generator().manual_seed(3)) * 3
    with torch.no_grad():
        last = lm.transformer.h[1]
        for w in (last.attn.c_proj.weight, last.attn.c_proj.bias, last.mlp.c_proj.weight):
            w.zero_()
        last.mlp.c_proj.bias.copy_(c)
    lens = hookscope.tune_lens(lm, _data(50, 64), steps=250)
    row = lens["blocks.0.resid_post"]
    assert row.kl_before > 0.5 and row.kl_after < 0.01 * row.kl_before
    b = lens.bias[1]
    assert float(torch.nn.functional.cosine_similarity(b - b.mean(), c - c.mean(), 0)) > 0.95
    ids = torch.tensor([4, 8, 15, 16, 23, 42])
    plain, tuned = hookscope.logit_lens(lm, ids), hookscope.logit_lens(lm, ids, tuned=lens)
    assert tuned.kl[1].mean() < 0.05 * plain.kl[1].mean()
    assert float(tuned.kl[-1].abs().max()) < 1e-6  # the last stream: the model's own logits


def test_saved_and_loaded_it_reads_the_same(tmp_path) -> None:
    lm, ids = _gpt2(), torch.tensor([7, 2, 9])
    lens = hookscope.tune_lens(lm, _data(50), steps=5)
    folder = lens.save(tmp_path / "lens")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "tuned_lens" and manifest["streams"] == lens.streams
    again = hookscope.load_lens(folder)
    assert again.rows == lens.rows and torch.equal(again.history, lens.history)
    assert torch.equal(hookscope.logit_lens(lm, ids, tuned=again).logits, hookscope.logit_lens(lm, ids, tuned=lens).logits)
    with pytest.raises(HookscopeError, match="not empty"):
        lens.save(folder)
    lens.save(folder, overwrite=True)


def test_the_result_speaks_the_protocol() -> None:
    lens = hookscope.tune_lens(_gpt2(), _data(50), steps=3)
    assert "KL tuned" in lens.table() and lens.table().startswith("tuned lens of GPT2LMHeadModel: 3 steps")
    assert json.loads(lens.to_json())["steps"] == 3
    assert "blocks.0.resid_post" in lens and "blocks.0.resid_mid" not in lens
    with pytest.raises(KeyError, match="blocks.0.resid_post"):
        lens["blocks.0.resid_pots"]
    assert lens.translate("blocks.1.resid_post", torch.ones(2, 32)).equal(torch.ones(2, 32))


def test_a_lens_for_another_model_is_refused(tmp_path) -> None:
    lens = hookscope.tune_lens(_gpt2(), _data(50), steps=1)
    with pytest.raises(HookscopeError, match="reads 3 streams of width 32; GPT2LMHeadModel has 4"):
        hookscope.logit_lens(_gpt2(layers=3), torch.tensor([1, 2]), tuned=lens)
    with pytest.raises(HookscopeError, match="final norm and unembedding differ"):
        hookscope.logit_lens(_gpt2(seed=4), torch.tensor([1, 2]), tuned=lens)
    with pytest.raises(HookscopeError, match="give a TunedLens"):
        hookscope.logit_lens(_gpt2(), torch.tensor([1, 2]), tuned="lens")


@pytest.mark.parametrize("data, message", [
    (torch.rand(4, 5), "not token ids"),
    ([torch.tensor([[1, 2]]), "ab"], "batch 1 is str"),
    ([], "gave no batch"),
    (torch.zeros(2, 0, dtype=torch.long), r"shape \[2, 0\]"),
    (3, "batch 0 is int"),
    ({"input_ids": torch.rand(2, 3)}, "batch 0 is a torch.float32 tensor"),
])
def test_bad_data_is_refused_in_one_line(data, message) -> None:
    with pytest.raises(HookscopeError, match=message) as e:
        hookscope.tune_lens(_gpt2(), data, steps=3)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("settings", [{"steps": -1}, {"batch_size": 0}, {"lr": 0.0}, {"momentum": 1.0},
                                      {"clip": 0.0}, {"weight_decay": -1.0}])
def test_bad_settings_are_refused(settings) -> None:
    with pytest.raises(HookscopeError, match="give"):
        hookscope.tune_lens(_gpt2(), _data(50), **settings)


def test_a_non_finite_divergence_stops_the_training_in_one_line() -> None:
    lm = _gpt2()

    def poison(module, args, out):  # block 0 writes NaN on batches of three rows: the data's, no check's
        nan = float("nan") if args[0].shape[0] == 3 else 1.0
        return out * nan if isinstance(out, torch.Tensor) else (out[0] * nan, *out[1:])

    handle = lm.transformer.h[0].register_forward_hook(poison)
    try:
        with pytest.raises(HookscopeError, match="KL divergence through blocks.0.resid_pre's translator is nan") as e:
            hookscope.tune_lens(lm, _data(50, 3), steps=2)
    finally:
        handle.remove()
    assert "\n" not in str(e.value)


def test_load_refuses_what_is_no_lens(tmp_path) -> None:
    with pytest.raises(HookscopeError, match="no manifest.json"):
        hookscope.load_lens(tmp_path)
    from hookscope.store import save_tensors
    save_tensors(tmp_path / "other", {"a": torch.ones(1)}, {"kind": "demo"})
    with pytest.raises(HookscopeError, match="kind 'demo', not a tuned lens"):
        hookscope.load_lens(tmp_path / "other")


def test_batches_from_a_loader_and_a_generator_are_taken_in_turn() -> None:
    lm, data = _gpt2(), _data(50, 16)
    whole = hookscope.tune_lens(lm, data, steps=4, batch_size=8)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    assert torch.equal(hookscope.tune_lens(lm, loader, steps=4).weight, whole.weight)
    dicts = ({"input_ids": b} for b in data.split(8))  # read once: its batches kept and cycled
    assert torch.equal(hookscope.tune_lens(lm, dicts, steps=4).weight, whole.weight)


def test_the_model_is_left_as_it_was() -> None:
    lm = _gpt2().train()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    hookscope.tune_lens(lm, _data(50), steps=3)
    assert lm.training and all(p.grad is None for p in lm.parameters())
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())


def test_the_lens_command_reads_through_a_saved_lens(tmp_path, capsys) -> None:
    from hookscope.cli import main

    lm = _gpt2()
    lm.save_pretrained(tmp_path / "lm")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval()
    lens = hookscope.tune_lens(model, _data(50), steps=5)
    lens.save(tmp_path / "lens")
    argv = ["lens", "hf:causal-lm", "--config", str(tmp_path / "lm"), "--input-ids", "1 7 3", "--json"]
    assert main([*argv, "--tuned", str(tmp_path / "lens")]) == 0
    got = json.loads(capsys.readouterr().out)
    want = hookscope.logit_lens(model, torch.tensor([1, 7, 3]), tuned=lens)
    assert got["kind"] == "tuned lens" and [r["kl"] for r in got["rows"]] == pytest.approx([r.kl for r in want.rows])
    assert main([*argv, "--tuned", str(tmp_path / "nowhere")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no saved lens" in err[0], err
