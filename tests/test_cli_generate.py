"""``hookscope generate``: the continuation without and with a steering edit, the same tokens as the
Python API writes, the direction from prompt files or a safetensors file (never unpickled), and its
mistakes said in one line with a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import hookscope
from hookscope.cli import main

transformers = pytest.importorskip("transformers")
T: Any = transformers
WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "dog", "ran"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    T.utils.logging.set_verbosity_error()
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(3)
    T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=8, n_positions=32, bos_token_id=0,
                                   eos_token_id=0)).save_pretrained(str(folder))
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    T.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(str(folder))
    (folder.parent / "cats.txt").write_text("the cat sat\nthe cat\n")
    (folder.parent / "dogs.txt").write_text("the dog ran\nthe dog\n")
    return folder


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _api(folder: Path, scale: float) -> tuple[list[int], list[int]]:
    model = T.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    tok = T.AutoTokenizer.from_pretrained(str(folder))
    ids = torch.tensor([tok("the dog")["input_ids"]])
    cats = [torch.tensor(tok(t)["input_ids"]) for t in ("the cat sat", "the cat")]
    dogs = [torch.tensor(tok(t)["input_ids"]) for t in ("the dog ran", "the dog")]
    d = hookscope.direction(model, cats, dogs, layers="transformer.h.1")

    def gen() -> list[int]:
        torch.manual_seed(0)
        return model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)[0, 2:].tolist()

    plain = gen()
    with hookscope.steer(model, direction=d, scale=scale, at=hookscope.tokens.generated):
        return plain, gen()


def test_json_gives_the_tokens_the_api_writes_without_and_with_the_steering(capsys, lm):
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(lm), "--text", "the dog", "--layers",
                         "blocks.1.resid_post", "--positive", str(lm.parent / "cats.txt"), "--negative",
                         str(lm.parent / "dogs.txt"), "--scale", "6", "--max-new-tokens", "4", "--json")
    assert code == 0, err
    got = json.loads(out)
    plain, steered = _api(lm, 6.0)
    assert got["without"] == plain and got["with"] == steered and got["changed"] == (plain != steered)
    assert got["steer"]["layers"] == ["transformer.h.1"] and got["text"]["prompt"] == "the dog"


def test_a_saved_direction_file_is_read_and_the_text_printed(capsys, lm, tmp_path):
    hookscope.Direction(torch.ones(16) * 5, "transformer.h.0").save(tmp_path / "d.safetensors")
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(lm), "--text", "the cat", "--layers",
                         "transformer.h.0", "--direction", str(tmp_path / "d.safetensors"), "--steer", "ablate",
                         "--max-new-tokens", "3", "--no-cache")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "prompt:  the cat" and lines[1].startswith("without: ") and lines[2].startswith("with:    ")
    assert "ablate" in lines[3]


@pytest.mark.parametrize("extra, match", [
    (["--direction", "d.pt"], "is .safetensors"),
    ([], "needs a direction"),
    (["--positive", "cats.txt"], "both --positive and --negative"),
    (["--direction", "d.safetensors", "--bounds", "0,1"], "--bounds goes with --steer clamp"),
    (["--direction", "d.safetensors", "--steer", "clamp"], "needs --bounds"),
    (["--direction", "d.safetensors", "--max-new-tokens", "0"], "1 or more"),
    (["--direction", "wide.safetensors"], "width 15"),
    (["--direction", "bad.safetensors"], "not a readable safetensors file"),
])
def test_mistakes_are_one_line_and_a_non_zero_exit(capsys, lm, tmp_path, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cats.txt").write_text("the cat\n")
    hookscope.Direction(torch.ones(16)).save(tmp_path / "d.safetensors")
    hookscope.Direction(torch.ones(15)).save(tmp_path / "wide.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    torch.save(torch.ones(16), tmp_path / "d.pt")
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(lm), "--text", "the cat", "--layers",
                         "transformer.h.0", *extra)
    assert code != 0 and match in err and len(err.strip().splitlines()) == 1, err
