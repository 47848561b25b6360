"""hookscope.example_input and hookscope.tokenize: an example input of the shape a model is known by,
and a text's tokens by the tokenizer saved in a folder (transformers' AutoTokenizer), as the command
line's --input and --text make them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope
from hookscope.cli.inputs._inputs import model_input
from hookscope.cli.inputs._shapes import example_input as cli_example_input


def test_an_example_input_is_seeded_and_of_the_models_shape() -> None:
    x = hookscope.example_input("demo")
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(x, torch.randn(1, 3, 64, 64, generator=gen))
    assert torch.equal(x, cli_example_input("demo", None))  # what --input makes
    assert hookscope.example_input("tiny", (2, 3, 8, 8), seed=3).shape == (2, 3, 8, 8)
    assert torch.equal(hookscope.example_input("tiny", "2x3x8x8", seed=3), cli_example_input("tiny", "2x3x8x8", 3))
    assert not torch.equal(hookscope.example_input("tiny", seed=1), hookscope.example_input("tiny", seed=2))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: hookscope.example_input("net.py:build"), "give the example input's shape for 'net.py:build', e.g. "
                                                      "shape=(1, 3, 224, 224)"),
    (lambda: hookscope.example_input("tiny", (1, 0)), "shape= (1, 0) is not a shape; write it like (1, 3, 224, 224)"),
    (lambda: hookscope.example_input("tiny", "1xfour"), "shape= '1xfour' is not a shape; write it like (1, 3, 224, 224)"),
    (lambda: hookscope.example_input("tiny", seed=2**70), None),
])
def test_example_input_mistakes_are_one_line(call: object, message: str | None) -> None:
    with pytest.raises(hookscope.LoadError) as e:
        call()  # type: ignore[operator]
    assert "\n" not in str(e.value)
    if message is not None:
        assert str(e.value) == message


def test_a_huge_example_input_is_refused_before_allocation() -> None:
    with pytest.raises(hookscope.LoadError, match=r"an input of 1048576x1048576x1048576 is .* of memory; give a "
                                                  r"smaller shape$"):
        hookscope.example_input("tiny", (2**20,) * 3)
    with pytest.raises(hookscope.HookscopeError, match=r"^--input 1048576x1048576x1048576 is "):
        cli_example_input("tiny", "1048576x1048576x1048576")


def _tokenizer(folder: Path) -> str:
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "the": 2, "cat": 3, "sat": 4}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]",
                                         pad_token="[PAD]").save_pretrained(folder)
    return str(folder)


def test_tokens_are_the_tokenizers_own(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = _tokenizer(tmp_path / "tok")
    own = transformers.AutoTokenizer.from_pretrained(folder)
    tokens = hookscope.tokenize("the cat sat", folder)
    assert torch.equal(tokens.ids, own("the cat sat", return_tensors="pt")["input_ids"])
    assert tokens.ids.tolist() == [[2, 3, 4]] and tokens.ids.dtype == torch.long
    assert tokens.attention_mask is not None and tokens.attention_mask.tolist() == [[1, 1, 1]]
    several = hookscope.tokenize(["the cat sat", "cat"], own)  # a tokenizer already made; padded to one length
    assert several.ids.tolist() == [[2, 3, 4], [3, 1, 1]]
    assert several.attention_mask is not None and several.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_text_on_the_command_line_is_the_same_tokens(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = _tokenizer(tmp_path / "tok")
    config = transformers.BertConfig(vocab_size=5, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=8)
    model = transformers.BertModel(config).eval()
    args = argparse.Namespace(model="hf:base", input=None, seed=0, input_ids=None, text="the cat sat", config=folder)
    given = model_input(args, model)
    tokens = hookscope.tokenize("the cat sat", folder)
    assert torch.equal(given.x, tokens.ids) and torch.equal(given.kwargs["attention_mask"], tokens.attention_mask)


def test_tokenizer_mistakes_are_one_line_in_pythons_words(tmp_path: Path) -> None:
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.tokenize("x", str(tmp_path))
    assert str(e.value) == (f"tokenize needs a tokenizer but the folder {tmp_path} holds none (no tokenizer.json or "
                            "tokenizer_config.json); save one there with tokenizer.save_pretrained(folder)")
    folder = _tokenizer(tmp_path / "tok")
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.tokenize("", folder)
    assert str(e.value).startswith(f"text '' gives no tokens with the tokenizer in the folder {folder} (")
    assert str(e.value).endswith("; give some text")
    (tmp_path / "tok" / "tokenizer.json").write_text("{broken")
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.load_tokenizer(folder)
    assert str(e.value).startswith(f"tokenize: transformers cannot read the tokenizer in the folder {folder} (")
    assert "\n" not in str(e.value)


def test_a_folder_naming_its_own_code_is_refused(tmp_path: Path) -> None:
    import json

    folder = _tokenizer(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.Tok", None]}
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.tokenize("the cat", folder)
    assert "\n" not in str(e.value) and "evil" in str(e.value)


def test_a_plain_module_gets_its_example_input_from_the_cli_path() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    args = argparse.Namespace(model="tiny", input="1x3x2x2", seed=0, input_ids=None, text=None)
    assert torch.equal(model_input(args, net).x, hookscope.example_input("tiny", (1, 3, 2, 2)))


def test_a_shape_of_numpy_or_tensor_numbers_is_a_shape() -> None:
    import numpy as np

    assert hookscope.example_input("tiny", np.array([1, 3, 4, 4])).shape == (1, 3, 4, 4)
    assert hookscope.example_input("tiny", torch.Size([2, 3, 4, 4])).shape == (2, 3, 4, 4)
    for bad in ((1.5, 3), (True, 3), ()):
        with pytest.raises(hookscope.LoadError, match="is not a shape; write it like"):
            hookscope.example_input("tiny", bad)


def test_texts_of_different_lengths_without_a_padding_token_are_one_line(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    own = transformers.AutoTokenizer.from_pretrained(_tokenizer(tmp_path / "tok"))
    own.pad_token = None
    assert hookscope.tokenize(["the cat", "cat sat"], own).ids.tolist() == [[2, 3], [3, 4]]  # one length: no padding
    with pytest.raises(hookscope.LoadError) as e:
        hookscope.tokenize(["the cat sat", "cat"], own)
    assert str(e.value) == ("tokenize: the tokenizer has no padding token, so texts of different lengths cannot make "
                            "one batch; set tokenizer.pad_token (such as tokenizer.eos_token), or give one text at a "
                            "time")
