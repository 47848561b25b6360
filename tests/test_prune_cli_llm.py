"""``hookscope prune`` on a language model, end to end: a tiny LLaMA saved to a folder with a word-level
tokenizer, pruned with Wanda and SparseGPT (a fraction, 2:4), blocks removed, recovered, saved and read back;
each mistake refused in one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

import hookscope
from hookscope.cli import main

transformers.logging.set_verbosity_error()

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "to", "a", "big", "red", "house"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path_factory.mktemp("tiny-llama")
    raw = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(path)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


TEXT = " ".join(WORDS[i % 12] for i in range(0, 7 * 96, 7))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(["prune", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def _ids(folder: str) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(TEXT, return_tensors="pt")["input_ids"][0]
    return ids[:len(ids) // 16 * 16].reshape(-1, 16)


@pytest.mark.parametrize(("method", "setting"), [("wanda", ["--sparsity", "0.5"]), ("sparsegpt", ["--n-m", "2:4"])])
def test_calibrated_masks_from_text_are_the_api_s_and_the_saved_model_reads_back(capsys, folder, tmp_path, method,
                                                                                   setting):
    out = tmp_path / "pruned"
    doc = _json(capsys, "hf:causal-lm", "--config", folder, "--method", method, *setting, "--data", TEXT,
                "--seqlen", "16", "--out", str(out))
    assert doc["pruned"][0]["sparsity"] == 0.5
    want = hookscope.load_model("hf:causal-lm", config=folder)
    n_m = (2, 4) if "--n-m" in setting else None
    hookscope.prune(want, method=method, data=_ids(folder), sparsity=None if n_m else 0.5, n_m=n_m)
    hookscope.remove_masks(want)
    again = transformers.LlamaForCausalLM.from_pretrained(out)
    for (k, a), b in zip(want.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    ids = _ids(folder)
    with torch.no_grad():
        ppl = math.exp(float(again(ids, labels=ids).loss))
    assert abs(doc["perplexity"]["pruned"] - ppl) <= 1e-3 * ppl  # the mean over the same next tokens


def test_layers_removed_and_recovered_from_a_token_file(capsys, folder, tmp_path):
    ids = _ids(folder)
    torch.save(ids, tmp_path / "ids.pt")
    out = tmp_path / "short"
    code, text, err = _run(capsys, "hf:causal-lm", "--config", folder, "--layers-remove", "1", "--recover",
                           "--data", str(tmp_path / "ids.pt"), "--out", str(out))
    assert code == 0, err
    assert "1 of 3 blocks removed, 2 kept" in text and "distillation steps" in text
    assert "perplexity on the --data tokens: dense" in text and "recovered" in text
    again = transformers.LlamaForCausalLM.from_pretrained(out)
    assert again.config.num_hidden_layers == 2 and len(again.model.layers) == 2
    with torch.no_grad():
        gen = again.generate(ids[:1, :4], max_new_tokens=4, min_new_tokens=4, do_sample=False,
                             attention_mask=torch.ones(1, 4, dtype=torch.long))
    assert gen.shape == (1, 8)


@pytest.mark.parametrize(("argv", "message"), [
    (["--method", "wanda", "--sparsity", "1.5"], "--sparsity 1.5 is outside [0, 1)"),
    (["--method", "wanda", "--n-m", "2:5"], "which 5 does not divide"),
    (["--method", "wanda", "--n-m", "two"], "--n-m two is not N:M"),
    (["--method", "wanda"], "needs --sparsity FRACTION"),
    (["--method", "sparsegpt", "--sparsity", "0.5", "--amount", "0.5"], "--amount is not for"),
    (["--layers-remove", "3"], "--layers-remove 3 would leave no block: the model has 3"),
    (["--recover"], "add --method wanda/sparsegpt or --layers-remove N"),
    (["--sparsity", "0.5"], "--sparsity and --n-m need --method wanda or sparsegpt"),
    (["--method", "wanda", "--n-m", "4:4"], "--n-m 4:4 is not N:M; give two counts 0 < N < M such as 2:4"),
    (["--method", "sparsegpt", "--n-m", "0:4"], "--n-m 0:4 is not N:M"),
    (["--method", "wanda", "--sparsity", "0.5", "--layers-remove", "7"],
     "--layers-remove 7 would leave no block: the model has 3; give at most 2"),
])
def test_mistakes_are_one_line(capsys, folder, argv, message):
    code, _, err = _run(capsys, "hf:causal-lm", "--config", folder, *argv, "--data", TEXT, "--seqlen", "16")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hookscope prune: error: ") and message in err[0], err[0]


def test_a_text_shorter_than_one_sequence_or_no_data_is_one_line(capsys, folder, tmp_path):
    code, _, err = _run(capsys, "hf:causal-lm", "--config", folder, "--method", "wanda", "--sparsity", "0.5",
                        "--data", "the cat")
    assert code == 2 and len(err) == 1 and "fewer than one sequence of --seqlen 128" in err[0], err
    code, _, err = _run(capsys, "hf:causal-lm", "--config", folder, "--method", "wanda", "--sparsity", "0.5")
    assert code == 2 and len(err) == 1 and "give --data" in err[0], err
    torch.save(torch.randn(2, 8), tmp_path / "floats.pt")
    code, _, err = _run(capsys, "hf:causal-lm", "--config", folder, "--method", "wanda", "--sparsity", "0.5",
                        "--data", str(tmp_path / "floats.pt"))
    assert code == 2 and len(err) == 1 and "holds no token ids" in err[0], err


@pytest.mark.parametrize("name", ["calib.txt", "data/calib.txt", "ids.pt"])
def test_a_data_file_that_does_not_exist_is_refused_not_read_as_text(capsys, folder, tmp_path, monkeypatch, name):
    """A mistyped file name is one word: calibrating on its own tokens would be silently wrong."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "hf:causal-lm", "--config", folder, "--method", "wanda", "--sparsity", "0.5",
                          "--data", name, "--seqlen", "2")
    assert code == 2 and len(err) == 1 and f"--data {name}: no such file" in err[0], err
    assert out == ""


def test_token_ids_outside_the_vocabulary_are_one_line(capsys, folder, tmp_path):
    path = tmp_path / "ids.pt"
    torch.save(torch.tensor([[1, 2, 3, 99], [1, 2, 3, 4]]), path)
    code, _, err = _run(capsys, "hf:causal-lm", "--config", folder, "--method", "wanda", "--sparsity", "0.5",
                        "--data", str(path))
    assert code == 2 and len(err) == 1, err
    assert "holds token id 99, outside the model's vocabulary of 16 (0 to 15)" in err[0], err[0]
