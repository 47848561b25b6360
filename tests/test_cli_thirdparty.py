"""Loading hf: and timm: models from the command line: weights that fit a model poorly, ids checked against the
right embedding, tracebacks turned into one line, pickles in a --config folder, tied weights, encoder-
decoders without input_ids, image presets of the model's own, RoBERTa's position offset."""

from __future__ import annotations

import argparse
import builtins
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from hookscope.cli import main
from hookscope.cli.inputs._images import load_images, preset_for
from hookscope.cli.inputs._inputs import model_input
from hookscope.cli._load import load_model
from hookscope.cli.inputs._shapes import check_fits
from hookscope.errors import HookscopeError
from hookscope.loading import hf as loading_hf
from hookscope.loading.extras import missing_package

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
T: Any = transformers
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PickledDict(dict):  # type: ignore[type-arg]
    """A dict subclass: torch.load(weights_only=True) refuses it, the full unpickler gives it back."""


class CreatesFile:
    """Unpickling it opens (so creates) a file: the proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def _save(obj: Any, folder: str) -> None:
    T.utils.logging.set_verbosity_error()
    T.utils.logging.disable_progress_bar()
    obj.save_pretrained(folder)


def _gpt2_config() -> Any:
    return T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)


def _bert_config() -> Any:
    return T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny GPT-2 and a BERT masked LM saved by save_pretrained, and GPT-2's weights as a state_dict."""
    root = tmp_path_factory.mktemp("hfr")
    torch.manual_seed(7)
    gpt2 = T.GPT2LMHeadModel(_gpt2_config()).eval()
    _save(gpt2, str(root / "gpt2"))
    _save(_gpt2_config(), str(root / "gpt2-config"))
    bert = T.BertForMaskedLM(_bert_config()).eval()
    _save(bert, str(root / "bert"))
    state = safetensors_torch.load_file(str(root / "gpt2" / "model.safetensors"))
    return {"root": root, "gpt2": gpt2, "bert": bert, "gpt2_dir": str(root / "gpt2"),
            "gpt2_config": str(root / "gpt2-config"), "bert_dir": str(root / "bert"), "state": state}


def _folder(saved: dict[str, Any], tmp_path: Any, name: str, tensors: dict[str, torch.Tensor] | None) -> str:
    """A copy of GPT-2's config with ``tensors`` as its model.safetensors."""
    folder = tmp_path / name
    _save(_gpt2_config(), str(folder))
    if tensors is not None:
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits  # type: ignore[no-any-return]


IDS = torch.tensor([[5, 17, 99, 0, 42]])
LAYERS = ["--layers", "re:.*(wte|emb).*"]  # a few modules of every model here: a short trace


# --- 1. weights that fit the model poorly: one line; a new head only: said once ------------------------
def test_renamed_weights_are_refused_with_keys_and_counts(saved: dict[str, Any], tmp_path: Any, capsys: Any) -> None:
    renamed = {k.replace("transformer.", "foo."): v for k, v in saved["state"].items()}
    folder = _folder(saved, tmp_path, "renamed", renamed)
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", folder])
    assert "fit GPT2LMHeadModel poorly: 29 of its 29 tensors are not in them (100% of its values" in err
    assert "26 of theirs are not the model's (foo.h.0.attn.c_attn.weight" in err, err


def test_a_body_tensor_missing_is_refused(saved: dict[str, Any], tmp_path: Any, capsys: Any) -> None:
    state = dict(saved["state"])
    del state["transformer.h.1.mlp.c_fc.weight"]
    folder = _folder(saved, tmp_path, "missing", state)
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", folder])
    assert "1 of its 29 tensors is not in them" in err and "transformer.h.1.mlp.c_fc.weight" in err


def test_a_new_task_head_runs_and_says_once_which_keys_are_random(saved: dict[str, Any], capsys: Any) -> None:
    assert main(["trace", "hf:sequence-classification", "--config", saved["gpt2_dir"], *LAYERS]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hookscope: warning: hf:sequence-classification: score.weight is not in the folder's weights: "
                   "random (a new head; its outputs mean nothing until trained)"]
    model = load_model("hf:sequence-classification", config=saved["gpt2_dir"])
    assert torch.equal(model.transformer.wte.weight, saved["gpt2"].transformer.wte.weight)


def test_a_dropped_pooler_and_head_is_a_note_and_tied_weights_are_not_missing(saved: dict[str, Any],
                                                                               capsys: Any) -> None:
    assert main(["trace", "hf:base", "--config", saved["bert_dir"], *LAYERS]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf:base: pooler.dense.bias, pooler.dense.weight are not in the folder's" in err[0]
    for spec, folder in (("hf:masked-lm", saved["bert_dir"]), ("hf:causal-lm", saved["gpt2_dir"])):
        assert main(["trace", spec, "--config", folder, *LAYERS]) == 0, spec
        assert capsys.readouterr().err == ""  # decoder / lm_head are tied to the embedding: not missing


# --- 2. --input-ids: the input embedding, never the first nn.Embedding ----------------------------------
NET = """import torch
class Net(torch.nn.Module):
    def __init__(self, getter):
        super().__init__()
        self.pos = torch.nn.Embedding(4, 8)    # declared first: a position table
        self.tok = torch.nn.Embedding(50, 8)
        if getter:
            self.get_input_embeddings = lambda: self.tok
    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[-1]))
def with_getter():
    torch.manual_seed(0)
    return Net(True)
def without():
    torch.manual_seed(0)
    return Net(False)
"""


def test_ids_are_checked_against_the_input_embedding_not_a_position_table(tmp_path: Any, capsys: Any) -> None:
    src = tmp_path / "net.py"
    src.write_text(NET)
    for attr in ("with_getter", "without"):
        assert main(["trace", f"{src}:{attr}", "--input-ids", "0 30 49", "--json"]) == 0, attr
        rows = json.loads(capsys.readouterr().out)["rows"]
        ids = next(r for r in rows if r["module"] == "tok" and r["which"] == "input")
        assert ids["max"] == 49 and ids["min"] == 0
    err = _error(capsys, ["summary", f"{src}:with_getter", "--input-ids", "0 50 1"])
    assert err.endswith("token id 50 is out of the vocabulary of Net (vocab size 50); give ids from 0 to 49")
    err = _error(capsys, ["summary", f"{src}:without", "--input-ids", "0 50 1"])  # not guessed: the forward says
    assert "failed in 'tok' (Embedding)" in err and "index out of range" in err


# --- 3. tracebacks become one line naming the file / field / package ------------------------------------
def test_broken_weights_files_and_config_fields_are_one_line(saved: dict[str, Any], tmp_path: Any,
                                                            capsys: Any) -> None:
    garbage = _folder(saved, tmp_path, "garbage", None)
    with open(os.path.join(garbage, "model.safetensors"), "wb") as f:
        f.write(b"garbage" * 10)
    empty = _folder(saved, tmp_path, "empty", None)
    open(os.path.join(empty, "model.safetensors"), "wb").close()
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({**_gpt2_config().to_dict(), "n_layer": "two"}))
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps({**_gpt2_config().to_dict(), "vocab_size": 0}))
    cases = [
        (garbage, f"{garbage}/model.safetensors is not a safetensors file transformers can read (SafetensorError"),
        (empty, f"{empty}/model.safetensors is not a safetensors file transformers can read"),
        (str(typed), "Field 'n_layer' expected int, got str (value: 'two')); fix that field"),
        (str(zero), "GPT2LMHeadModel embeds 0 token ids (its config's vocab_size), so no token id fits"),
    ]
    for config, said in cases:
        assert said in _error(capsys, ["trace", "hf:causal-lm", "--config", config]), config


def test_a_backend_transformers_lacks_is_named_with_its_install(monkeypatch: pytest.MonkeyPatch, capsys: Any,
                                                                saved: dict[str, Any]) -> None:
    class NeedsTimm:
        config_class = None

        @classmethod
        def from_config(cls, config: Any, **kw: Any) -> Any:
            raise ImportError("\nTimmBackbone requires the timm library but it was not found in your environment.")

    monkeypatch.setattr(loading_hf, "hf_class", lambda name: NeedsTimm)  # as DETR with use_timm_backbone
    err = _error(capsys, ["trace", "hf:NeedsTimmModel", "--config", saved["gpt2_config"]])
    assert err.endswith("needs the package timm, which cannot be imported here (TimmBackbone requires the timm "
                        "library but it was not found in your environment.); install it: pip install timm")
    assert missing_package(ModuleNotFoundError("x", name="safetensors.torch")) == "safetensors"


@pytest.mark.slow
def test_detr_with_a_timm_backbone_and_timm_blocked_is_one_line(tmp_path: Any) -> None:
    config = T.DetrConfig(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=32,
                          encoder_layers=1, decoder_layers=1, num_queries=4)
    _save(config, str(tmp_path / "detr"))
    code = ("import sys; sys.modules['timm'] = None\nfrom hookscope.cli import main\n"
            f"sys.exit(main(['summary', 'hf:base', '--config', {str(tmp_path / 'detr')!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().endswith("install it: pip install timm"), res.stderr


# --- 4. a pickle in the --config folder: worded for the folder, --trust-pickle allows it ----------------
def test_a_pickled_bin_is_refused_without_unpickling_and_trust_pickle_loads_it(saved: dict[str, Any], tmp_path: Any,
                                                                              capsys: Any) -> None:
    proof = tmp_path / "unpickled"
    evil = _folder(saved, tmp_path, "evil", None)
    torch.save({**saved["state"], "x": CreatesFile(str(proof))}, os.path.join(evil, "pytorch_model.bin"))
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", evil])
    assert err.startswith(f"hookscope trace: error: --config {evil}: pytorch_model.bin holds pickled objects")
    assert "--weights" not in err and "--trust-pickle, for a folder you trust" in err
    assert not proof.exists()
    trusted = _folder(saved, tmp_path, "trusted", None)
    torch.save(PickledDict(saved["state"]), os.path.join(trusted, "pytorch_model.bin"))
    assert "holds pickled objects" in _error(capsys, ["trace", "hf:causal-lm", "--config", trusted])
    assert main(["trace", "hf:causal-lm", "--config", trusted, "--trust-pickle", *LAYERS]) == 0
    assert capsys.readouterr().err == ""
    model = load_model("hf:causal-lm", config=trusted, trust_pickle=True)
    assert torch.equal(_logits(model, IDS), _logits(saved["gpt2"], IDS))


# --- 5. weights failures name the actual problem ---------------------------------------------------------
def test_a_tensor_of_another_shape_and_an_index_without_metadata_are_named(saved: dict[str, Any], tmp_path: Any,
                                                                          capsys: Any) -> None:
    state = dict(saved["state"])
    state["transformer.h.0.attn.c_attn.weight"] = torch.zeros(32, 64)
    shaped = _folder(saved, tmp_path, "shape", state)
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", shaped])
    assert ("do not fit GPT2LMHeadModel: transformer.h.0.attn.c_attn.weight is 32x64 in the file but 32x96 in "
            "the model") in err and "fits a gpt2" not in err
    index = _folder(saved, tmp_path, "index", None)
    with open(os.path.join(index, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "model-00001.safetensors"}}, f)
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", index])
    assert "model.safetensors.index.json has no \"metadata\" entry" in err and 'add "metadata": {}' in err


# --- 6. --weights with save_pretrained's model.safetensors: the tied lm_head ----------------------------
def test_weights_from_save_pretrained_load_with_their_tied_head(saved: dict[str, Any], capsys: Any) -> None:
    weights = os.path.join(saved["gpt2_dir"], "model.safetensors")
    assert "lm_head.weight" not in saved["state"]  # written once, as transformer.wte.weight
    model = load_model("hf:causal-lm", config=saved["gpt2_config"], weights=weights)
    assert torch.equal(_logits(model, IDS), _logits(saved["gpt2"], IDS))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert main(["trace", "hf:causal-lm", "--config", saved["gpt2_config"], "--weights", weights,
                 *LAYERS]) == 0


# --- 7. encoder-decoders whose main input is not input_ids ----------------------------------------------
def test_whisper_gets_decoder_ids_and_its_own_feature_shape(tmp_path: Any, capsys: Any) -> None:
    config = T.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                             decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                             max_source_positions=16, max_target_positions=16, decoder_start_token_id=3,
                             pad_token_id=1)
    _save(config, str(tmp_path / "whisper"))
    args = argparse.Namespace(model="hf:base", input=None, seed=0, input_ids=None, text=None,
                              config=str(tmp_path / "whisper"))
    given = model_input(args, load_model("hf:base", config=args.config))
    assert tuple(given.x.shape) == (1, 8, 32) and given.kwargs["decoder_input_ids"].tolist() == [[3]]
    assert main(["trace", "hf:base", "--config", args.config, *LAYERS]) == 0
    capsys.readouterr()
    w2v = T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=2)
    _save(w2v, str(tmp_path / "w2v"))
    err = _error(capsys, ["trace", "hf:base", "--config", str(tmp_path / "w2v")])
    assert err.endswith("give the shape of Wav2Vec2Model's input_values, e.g. --input 1x16000 (a second of 16 kHz "
                        "audio)")


# --- 8. --image: the model's own size and mean/std ------------------------------------------------------
def test_timm_images_get_the_models_pretrained_cfg() -> None:
    pytest.importorskip("timm")
    t = preset_for("timm:resnet18")  # crop_pct 0.95: 224 / 0.95 -> 235
    assert (t.name, t.size, t.resize, t.mean, t.std, t.mode, t.library) == (
        "timm:resnet18", (224, 224), 235, IMAGENET_MEAN, IMAGENET_STD, "bicubic", "timm")
    assert preset_for("timm:vit_tiny_patch16_224").mean == (0.5, 0.5, 0.5)
    assert preset_for("timm:resnet18", "none").mean is None


def test_hf_images_get_the_config_size_and_the_preprocessor_mean(tmp_path: Any, capsys: Any) -> None:
    pytest.importorskip("torchvision")  # transformers' image processors run on torchvision (the oldest-versions pass has none)
    from PIL import Image

    vit = T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, num_labels=3)
    folder = tmp_path / "vit"
    _save(vit, str(folder))
    Image.new("RGB", (50, 40), (255, 0, 51)).save(tmp_path / "red.png")
    args = argparse.Namespace(image=[str(tmp_path / "red.png")], size=None, preset="auto", model="hf:base",
                              weights=None, config=str(folder))
    batch = load_images(args)
    assert tuple(batch.x.shape) == (1, 3, 32, 32) and batch.transform.mean is None
    assert "holds no preprocessor_config.json, so images are resized to 32x32" in capsys.readouterr().err
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.5, 0.5], "do_resize": True,
         "size": {"height": 32, "width": 32}, "resample": 2}))
    batch = load_images(args)
    assert batch.x[0, :, 5, 5].tolist() == pytest.approx([2.0, -1.0, (0.2 - 0.5) / 0.5])
    assert capsys.readouterr().err == ""
    assert main(["cam", "hf:image-classification", "--config", str(folder), "--image", str(tmp_path / "red.png"),
                 "--out", str(tmp_path / "cam.png")]) == 0
    assert "input 1x3x32x32" in capsys.readouterr().out


# --- 9. RoBERTa: positions start after padding_idx --------------------------------------------------------
def test_roberta_position_limit_leaves_out_the_padding_offset(tmp_path: Any, capsys: Any) -> None:
    config = T.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64, pad_token_id=1)
    _save(config, str(tmp_path / "roberta"))
    argv = ["trace", "hf:base", "--config", str(tmp_path / "roberta")]
    assert _error(capsys, [*argv, "--input", "1x63"]).endswith(
        "--input 1x63: 63 tokens are more than the 62 positions RobertaModel has; give at most 62")
    assert main([*argv, "--input", "1x62", *LAYERS]) == 0


# --- 10. minor messages ----------------------------------------------------------------------------------
def test_minor_messages(saved: dict[str, Any], capsys: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AutoTokenizer", "GPT2Config"):
        assert f"transformers' {name} is not a model class" in _error(
            capsys, ["summary", f"hf:{name}", "--config", saved["gpt2_dir"]])
    if importlib.util.find_spec("timm") is not None:
        assert "timm: names no model; write timm:NAME" in _error(capsys, ["summary", "timm:"])
        assert "Did you mean 'resnet18' (timm's names are lower case)?" in _error(capsys, ["summary", "timm:RESNET18"])
    with pytest.raises(HookscopeError, match=r"values \(8\.8 TB of int64\)"):
        check_fits((2**20, 2**20), "--input 1048576x1048576", dtype=torch.long)
    broken = tmp_path / "tok"
    _save(_gpt2_config(), str(broken))
    (broken / "tokenizer.json").write_text("{not json")
    err = _error(capsys, ["trace", "hf:causal-lm", "--config", str(broken), "--text", "hello"])
    assert "cannot read the tokenizer in --config" in err and "(tokenizer.json: " in err
    real = builtins.__import__

    def no_torchvision(name: str, *a: Any, **k: Any) -> Any:
        if name == "timm":
            raise ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    err = _error(capsys, ["summary", "timm:resnet18"])
    assert "timm cannot be imported because the package torchvision is missing" in err
    assert "pip install torchvision" in err
