"""MODEL hf:CLASS_OR_TASK --config PATH: transformers models built from local files only, fed token ids
(--input-ids, --text, seeded random ids) with their keyword inputs, in every command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cli_batch import Session
from helpers import no_hooks
from hookscope.cli import main
from hookscope.cli.inputs._inputs import model_input
from hookscope.cli._load import load_model
from hookscope.loading import model as loading_model

transformers = pytest.importorskip("transformers")
T: Any = transformers
VOCAB = {"[UNK]": 0, "[PAD]": 1, "hello": 2, "world": 3, "the": 4, "cat": 5}


def _quiet_save(obj: Any, folder: str) -> None:
    T.utils.logging.set_verbosity_error()
    T.utils.logging.disable_progress_bar()
    obj.save_pretrained(folder)


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def _gpt2_config() -> Any:
    return T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
                        eos_token_id=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tiny models saved as save_pretrained writes them: GPT-2 with weights and a tokenizer, GPT-2's
    config alone, BERT's config as a JSON file, T5 and ViT with weights."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(123)
    gpt2 = T.GPT2LMHeadModel(_gpt2_config()).eval()
    _quiet_save(gpt2, str(root / "gpt2"))
    _quiet_save(_tokenizer(), str(root / "gpt2"))
    _quiet_save(_gpt2_config(), str(root / "gpt2-config"))
    bert = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    _quiet_save(bert, str(root / "bert"))
    t5 = T.T5ForConditionalGeneration(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                 num_heads=2, decoder_start_token_id=0)).eval()
    _quiet_save(t5, str(root / "t5"))
    vit = T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=2, intermediate_size=64, num_labels=5)).eval()
    _quiet_save(vit, str(root / "vit"))
    return {"root": root, "gpt2": gpt2, "t5": t5, "vit": vit, "gpt2_dir": str(root / "gpt2"),
            "gpt2_config": str(root / "gpt2-config"), "bert_json": str(root / "bert" / "config.json"),
            "t5_dir": str(root / "t5"), "vit_dir": str(root / "vit")}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """Every hf model the CLI builds, to check afterwards that no hook is left on it."""
    seen: list[torch.nn.Module] = []
    real = loading_model.hf_model

    def spy(*a: Any, **k: Any) -> Any:
        made = real(*a, **k)
        seen.append(made.model)
        return made

    monkeypatch.setattr(loading_model, "hf_model", spy)
    return seen


def _args(**given: Any) -> argparse.Namespace:
    base: dict[str, Any] = dict(model="hf:causal-lm", input=None, seed=0, input_ids=None, text=None, config=None)
    return argparse.Namespace(**{**base, **given})


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# --- building: weights from the folder, random from a config, the class or task named -----------------
def test_saved_weights_are_loaded_and_give_the_saved_models_output(folders: dict[str, Any]) -> None:
    ids = torch.tensor([[5, 17, 99, 0, 42]])
    for spec in ("hf:causal-lm", "hf:GPT2LMHeadModel", "hf:AutoModelForCausalLM"):
        model = load_model(spec, config=folders["gpt2_dir"])
        assert type(model).__name__ == "GPT2LMHeadModel" and not model.training
        with torch.no_grad():
            assert torch.equal(model(ids).logits, folders["gpt2"](ids).logits)


def test_summary_counts_the_models_parameters_and_says_nothing_of_weights(folders: dict[str, Any], capsys: Any,
                                                                         built: list[torch.nn.Module]) -> None:
    assert main(["summary", "hf:causal-lm", "--config", folders["gpt2_config"], "--depth", "1"]) == 0
    out, err = capsys.readouterr()
    expected = sum(p.numel() for p in folders["gpt2"].parameters())  # wte and lm_head tied: counted once
    assert f"Params: {expected:,} " in out and err == ""
    assert len(built) == 1 and no_hooks(built[0])


def test_trace_of_the_saved_model_reports_its_own_logits(folders: dict[str, Any], capsys: Any,
                                                         built: list[torch.nn.Module]) -> None:
    assert main(["trace", "hf:causal-lm", "--config", folders["gpt2_dir"], "--input-ids", "15 11 99; 0 1 2",
                 "--layers", "lm_head", "--json", "--no-inputs"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    with torch.no_grad():
        logits = folders["gpt2"](torch.tensor([[15, 11, 99], [0, 1, 2]])).logits
    assert [r["shape"] for r in rows] == [[2, 3, 100]]
    assert rows[0]["max"] == pytest.approx(logits.max().item(), rel=1e-6)
    assert rows[0]["mean"] == pytest.approx(logits.mean().item(), rel=1e-5, abs=1e-7)
    assert err == "" and no_hooks(built[0])  # weights read: no warning, and transformers' own notes kept quiet


def test_a_config_without_weights_gives_random_weights_said_once(folders: dict[str, Any], capsys: Any) -> None:
    assert main(["watch", "hf:masked-lm", "--config", folders["bert_json"], "--backward"]) == 0
    out, err = capsys.readouterr()
    assert "all finite" in out
    assert err.count("hf:masked-lm has random weights") == 1 and "save_pretrained" in err


# --- inputs: token ids, text through the folder's tokenizer, keyword inputs ------------------------
def test_random_token_ids_are_seeded_in_the_vocabulary_with_a_matching_mask(folders: dict[str, Any]) -> None:
    model = load_model("hf:causal-lm", config=folders["gpt2_config"])
    a, b = model_input(_args(), model), model_input(_args(), model)
    assert a.x.dtype == torch.long and a.x.shape == (1, 16) and torch.equal(a.x, b.x)
    assert 0 <= int(a.x.min()) and int(a.x.max()) < 100 and len(set(a.x.flatten().tolist())) > 8
    assert torch.equal(a.kwargs["attention_mask"], torch.ones(1, 16, dtype=torch.long))
    other = model_input(_args(seed=1, input="3x7"), model)
    assert other.x.shape == (3, 7) and not torch.equal(other.x[:1, :7], a.x[:, :7])


def test_text_gives_the_ids_and_mask_the_tokenizer_gives(folders: dict[str, Any], capsys: Any) -> None:
    model = load_model("hf:causal-lm", config=folders["gpt2_dir"])
    given = model_input(_args(text="hello the cat world", config=folders["gpt2_dir"]), model)
    expected = _tokenizer()("hello the cat world", return_tensors="pt")
    assert given.x.tolist() == expected["input_ids"].tolist() == [[2, 4, 5, 3]]
    assert torch.equal(given.kwargs["attention_mask"], expected["attention_mask"])
    assert main(["trace", "hf:causal-lm", "--config", folders["gpt2_dir"], "--text", "hello the cat world",
                 "--layers", "transformer.wte", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["which"] == "input" and row["shape"] == [1, 4] and row["mean"] == pytest.approx(3.5)


def test_an_encoder_decoder_gets_decoder_ids_shifted_behind_the_start_token(folders: dict[str, Any],
                                                                             capsys: Any) -> None:
    model = load_model("hf:seq2seq-lm", config=folders["t5_dir"])
    given = model_input(_args(model="hf:seq2seq-lm", input_ids="7 8 9 10"), model)
    assert given.kwargs["decoder_input_ids"].tolist() == [[0, 7, 8, 9]]
    with torch.no_grad():
        expected = folders["t5"](given.x, **given.kwargs).logits
    assert main(["trace", "hf:seq2seq-lm", "--config", folders["t5_dir"], "--input-ids", "7 8 9 10", "--layers",
                 "lm_head", "--json", "--no-inputs"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["shape"] == [1, 4, 100] and row["max"] == pytest.approx(expected.max().item(), rel=1e-6)


def test_diff_and_layers_pass_the_keyword_inputs(folders: dict[str, Any], capsys: Any,
                                                 built: list[torch.nn.Module]) -> None:
    assert main(["diff", "hf:seq2seq-lm", "--config", folders["t5_dir"], "--input", "2x5"]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(["layers", "hf:causal-lm", "transformer.h.1.mlp", "--config", folders["gpt2_dir"], "--input",
                 "2x9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"name": "transformer.h.1.mlp", "type": "GPT2MLP",
                                                    "output": "2x9x32"}]
    assert all(no_hooks(m) for m in built)


# --- image models: pixel_values of the config's size, scores read from .logits -------------------------
def test_cam_on_a_vit_reads_the_logits_and_scores_the_predicted_class(folders: dict[str, Any], capsys: Any,
                                                                      built: list[torch.nn.Module]) -> None:
    assert main(["cam", "hf:image-classification", "--config", folders["vit_dir"], "--json",
                 "--layer", "vit.embeddings.patch_embeddings.projection"]) == 0
    data = json.loads(capsys.readouterr().out)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = folders["vit"](x).logits
    assert data["input"] == [1, 3, 32, 32]
    row = data["rows"][0]
    assert row["target"] == int(logits.argmax()) and row["score"] == pytest.approx(logits.max().item(), rel=1e-5)
    assert no_hooks(built[0])
    from PIL import Image

    picture = folders["root"] / "picture.png"
    Image.fromarray((torch.rand(40, 48, 3, generator=torch.Generator().manual_seed(1)) * 255).byte().numpy()).save(picture)
    assert main(["cam", "hf:image-classification", "--config", folders["vit_dir"], "--image", str(picture), "--size",
                 "32x32", "--json", "--layer", "vit.embeddings.patch_embeddings.projection"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["file"] == str(picture) and 0 <= row["target"] < 5 and no_hooks(built[1])


def test_cam_names_the_classes_the_config_names_and_not_its_placeholders(folders: dict[str, Any], capsys: Any,
                                                                         tmp_path: Any) -> None:
    named = tmp_path / "named"
    vit = T.ViTForImageClassification(T.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        id2label={0: "cat", 1: "dog", 2: "fox"}, label2id={"cat": 0, "dog": 1, "fox": 2})).eval()
    _quiet_save(vit, str(named))
    assert main(["cam", "hf:image-classification", "--config", str(named), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        k = int(vit(x).logits.argmax())
    assert data["class_names"] == ["cat", "dog", "fox"] and data["rows"][0]["class_name"] == ["cat", "dog", "fox"][k]
    assert main(["cam", "hf:image-classification", "--config", folders["vit_dir"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["class_names"] is None  # LABEL_0 ... LABEL_4 name nothing


def test_a_size_the_vit_cannot_take_names_the_size_it_states(folders: dict[str, Any], capsys: Any,
                                                             tmp_path: Any) -> None:
    from PIL import Image

    picture = tmp_path / "wide.png"
    Image.new("RGB", (50, 40), (200, 10, 10)).save(picture)
    argv = ["cam", "hf:image-classification", "--config", folders["vit_dir"], "--image", str(picture), "--json"]
    assert main([*argv, "--size", "40x50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hookscope cam: error: the forward pass failed") and err.endswith(
        "the model states 32x32 inputs: give --size 32x32, or leave --size out")
    assert main(argv) == 0  # its own size, without --size


def test_features_and_report_on_a_vit(folders: dict[str, Any], capsys: Any, tmp_path: Any) -> None:
    out = tmp_path / "f.png"
    assert main(["features", "hf:image-classification", "--config", folders["vit_dir"], "--layer",
                 "vit.embeddings.patch_embeddings.projection", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert out.is_file() and data["input"] == [1, 3, 32, 32] and len(data["rows"]) == 32
    report = tmp_path / "report"
    assert main(["report", "hf:image-classification", "--config", folders["vit_dir"], "--out", str(report),
                 "--methods", "gradcam", "--layers", "vit.embeddings.patch_embeddings.projection"]) == 0
    saved = json.loads((report / "report.json").read_text())
    assert (report / "index.html").is_file() and json.dumps(saved).count("ViTForImageClassification") >= 1


def test_report_and_cam_refuse_a_token_model_in_one_line(folders: dict[str, Any], capsys: Any,
                                                         tmp_path: Any) -> None:
    err = _error(capsys, ["report", "hf:causal-lm", "--config", folders["gpt2_config"], "--out", str(tmp_path / "r")])
    assert "takes token ids" in err and not (tmp_path / "r").exists()
    err = _error(capsys, ["cam", "hf:causal-lm", "--config", folders["gpt2_config"], "--json"])
    assert "takes token ids" in err


# --- bad input: one line, exit 2, the culprit and the fix ------------------------------------------
def test_bad_specs_and_configs_are_one_line(folders: dict[str, Any], capsys: Any, tmp_path: Any) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    not_config = tmp_path / "notes.json"
    not_config.write_text('{"lr": 0.1}')
    (tmp_path / "notes.txt").write_text("lr = 0.1")
    cases = [
        (["hf:causal-lm", "--config", str(empty)], "holds no config.json"),
        (["hf:causal-lm", "--config", str(not_config)], 'not a transformers config (no "model_type" key)'),
        (["hf:causal-lm", "--config", str(tmp_path / "missing")], "no such --config"),
        (["hf:causal-lm", "--config", str(tmp_path / "notes.txt")], "cannot read --config"),
        (["hf:causal-lm"], "needs --config PATH"),
        (["hf:GPT2LMHeadModl", "--config", folders["gpt2_dir"]], "Did you mean 'GPT2LMHeadModel'"),
        (["hf:BertForMaskedLM", "--config", folders["gpt2_dir"]], "needs a bert config"),
        (["hf:image-classification", "--config", folders["gpt2_dir"]], "fits a gpt2 model"),
        (["tiny", "--config", folders["gpt2_dir"]], "--config is for hf:CLASS_OR_TASK models"),
    ]
    for argv, said in cases:
        assert said in _error(capsys, ["summary", *argv]), argv


def test_bad_token_inputs_are_one_line(folders: dict[str, Any], capsys: Any) -> None:
    gpt2 = ["hf:causal-lm", "--config", folders["gpt2_dir"]]
    bare = ["hf:causal-lm", "--config", folders["gpt2_config"]]
    cases = [
        ([*gpt2, "--input-ids", "1 150 3 200"], "token id 150 is out of the vocabulary of GPT2LMHeadModel (vocab size 100)"),
        ([*gpt2, "--input-ids", "1 -1"], "token id -1 is out of the vocabulary"),
        ([*gpt2, "--input-ids", "1 2.5 3"], "'2.5' is not a whole number"),
        ([*gpt2, "--input-ids", "1 2; 3"], "sequences of lengths 1, 2"),
        ([*gpt2, "--input-ids", " ; "], "holds no token id"),
        ([*gpt2, "--input", "1x65"], "65 tokens are more than the 64 positions"),
        ([*gpt2, "--input", "1x3x8x8"], "is not BATCHxLENGTH"),
        ([*gpt2, "--text", "hi", "--input-ids", "1"], "either --text or --input-ids"),
        ([*gpt2, "--input-ids", "1", "--input", "1x4"], "either --input SHAPE or --input-ids"),
        ([*bare, "--text", "hello"], "holds none (no tokenizer.json"),
        (["hf:masked-lm", "--config", folders["bert_json"], "--text", "hello"], "give --config a folder"),
        (["tiny", "--text", "hello"], "--text needs a transformers model"),
        (["hf:image-classification", "--config", folders["vit_dir"], "--input-ids", "1 2"], "takes pixel_values"),
    ]
    for argv, said in cases:
        assert said in _error(capsys, ["summary", *argv]), argv


def test_input_ids_work_for_any_model_and_an_id_out_of_range_names_the_embedding(tmp_path: Any, capsys: Any) -> None:
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef build():\n    torch.manual_seed(0)\n"
                   "    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))\n")
    assert main(["trace", f"{src}:build", "--input-ids", "0 9 3", "--layers", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["shape"] == [1, 3] and row["dtype"] == "int64" and row["mean"] == pytest.approx(4.0)
    # which embedding takes the ids is not guessed: the forward pass names the one that refused it
    err = _error(capsys, ["summary", f"{src}:build", "--input-ids", "0 10"])
    assert "failed in '0' (Embedding)" in err and "index out of range" in err


def test_text_out_of_the_models_vocabulary_names_the_tokenizer(tmp_path: Any, capsys: Any) -> None:
    folder = str(tmp_path / "small")
    torch.manual_seed(0)
    config = T.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=4, n_positions=16, bos_token_id=0,
                          eos_token_id=0)
    _quiet_save(config, folder)
    _quiet_save(_tokenizer(), folder)  # ids up to 5, the model embeds 4
    err = _error(capsys, ["summary", "hf:causal-lm", "--config", folder, "--text", "hello cat"])
    assert "token id 5 is out of the vocabulary" in err and "tokenizer is not this model's" in err


def test_pickled_objects_in_pytorch_model_bin_are_refused_before_transformers_reads_them(
        folders: dict[str, Any], tmp_path: Any, capsys: Any) -> None:
    folder = tmp_path / "bin"
    _quiet_save(_gpt2_config(), str(folder))
    torch.save(folders["gpt2"].state_dict(), folder / "pytorch_model.bin")
    model = load_model("hf:causal-lm", config=str(folder))
    ids = torch.tensor([[3, 1, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, folders["gpt2"](ids).logits)
    torch.save({"w": argparse.Namespace(a=1)}, folder / "pytorch_model.bin")
    err = _error(capsys, ["summary", "hf:causal-lm", "--config", str(folder)])
    assert "pytorch_model.bin holds pickled objects" in err


def test_missing_transformers_names_the_extra(folders: dict[str, Any], capsys: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    err = _error(capsys, ["summary", "hf:causal-lm", "--config", folders["gpt2_dir"]])
    assert err == ('hookscope summary: error: MODEL hf:... needs transformers, from the hf extra: '
                   'pip install "hookscope[hf]"')


def test_the_installed_command_fails_in_one_line_without_a_traceback(folders: dict[str, Any],
                                                                    hookscope_process: Session) -> None:
    res = hookscope_process.run("summary", "hf:causal-lm", "--config", str(folders["gpt2_dir"]), "--input-ids",
                                "1 100", cwd=Path.cwd(), env={"HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("hookscope summary: error: --input-ids: token id 100 is out of the vocabulary of "
                                  "GPT2LMHeadModel (vocab size 100); give ids from 0 to 99")
