"""``hookscope attribute``: images and tokens from the command line, its numbers compared with the Python
API on the same model and input, its pictures read back, and its mistakes said in one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import hookscope
from cli_batch import Session
from hookscope.cli import main
from hookscope.synthetic import shapes

transformers = pytest.importorskip("transformers")
T: Any = transformers
WORDS = ["[UNK]", "hello", "world", "the", "cat", "sat", "on", "mat"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small GPT-2 with a word-level tokenizer, saved as save_pretrained writes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    T.utils.logging.set_verbosity_error()
    T.utils.logging.disable_progress_bar()
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(5)
    config = T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=60, n_positions=32, bos_token_id=0,
                          eos_token_id=0)
    T.GPT2LMHeadModel(config).save_pretrained(str(folder))
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    T.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(str(folder))
    return folder


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["attribute", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


# --- images --------------------------------------------------------------------------------------------
def test_demo_without_an_image_attributes_a_generated_shape_as_the_api_does(capsys, tmp_path):
    code, out, err = run(capsys, "demo", "--method", "integrated_gradients", "--steps", "8", "--json",
                         "--plot", str(tmp_path / "ig.png"))
    assert code == 0, err
    data = json.loads(out)
    model = hookscope.load_model("demo")
    res = hookscope.attribute(model, shapes(1, seed=0).images, method="integrated_gradients", steps=8)
    assert data["method"] == "integrated_gradients" and data["maps"]["shape"] == [1, 3, 64, 64]
    assert data["target"] == res.target.tolist() and data["scores"] == pytest.approx(res.scores.tolist(), rel=1e-5)
    assert data["delta"] == pytest.approx(res.delta.tolist(), abs=1e-5)
    pixels = _png(tmp_path / "ig.png")  # the picture, and a signed map: red and blue both drawn
    red = (pixels[..., 0] > 200) & (pixels[..., 1] < 80) & (pixels[..., 2] < 80)
    blue = (pixels[..., 2] > 200) & (pixels[..., 0] < 80) & (pixels[..., 1] < 80)
    assert red.sum() > 20 and blue.sum() > 20 and "wrote plot to" in err


def test_an_image_file_with_a_target_prints_one_line_per_image(capsys, tmp_path):
    picture = shapes(1, seed=3).images[0]
    Image.fromarray((picture.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()).save(tmp_path / "s.png")
    code, out, err = run(capsys, "demo", "--image", str(tmp_path / "s.png"), "--target", "4")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("saliency on the inputs: 1 map of 3x64x64") and lines[-1].split()[:2] == ["0", "4"]


# --- tokens ----------------------------------------------------------------------------------------------
def _lm(folder: Path) -> Any:
    return hookscope.load_model("hf:causal-lm", config=str(folder))


def test_text_is_explained_token_by_token_as_the_api_does(capsys, gpt2):
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat sat on the",
                         "--steps", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    lm, ids = _lm(gpt2), torch.tensor([[3, 4, 5, 6, 3]])
    with torch.no_grad():
        predicted = int(lm(ids).logits[0, -1].argmax())
    res = hookscope.attribute_tokens(lm, ids, steps=8, kwargs={"attention_mask": torch.ones_like(ids)})
    assert data["tokens"] == [[3, 4, 5, 6, 3]] and data["texts"] == [["the", "cat", "sat", "on", "the"]]
    assert data["rows"][0]["target"] == predicted and data["rows"][0]["text"] == WORDS[predicted]
    assert data["rows"][0]["scores"] == pytest.approx(res.rows[0].scores.tolist(), abs=1e-6)
    assert data["layer"] == "transformer.wte"


def test_generate_explains_each_written_token_and_draws_a_strip(capsys, gpt2, tmp_path):
    argv = ("hf:causal-lm", "--config", str(gpt2), "--input-ids", "3 4 5", "--generate", "3", "--method",
            "input_x_gradient")
    code, out, err = run(capsys, *argv, "--plot", str(tmp_path / "t.png"))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("input_x_gradient at layer 'transformer.wte': 3 tokens explained")
    assert [line.split()[:2] for line in lines[3:6]] == [["0", "0"], ["0", "1"], ["0", "2"]]
    assert lines[6] == f"wrote plot to {tmp_path / 't.png'}"
    data = json.loads(run(capsys, *argv, "--json")[1])
    written = _lm(gpt2).generate(torch.tensor([[3, 4, 5]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert data["tokens"] == written.tolist() and [r["target"] for r in data["rows"]] == written[0, 3:].tolist()
    shown = [WORDS[t] if t < len(WORDS) else f"#{t}" for t in written[0, 3:].tolist()]
    assert [r["text"] for r in data["rows"]] == shown and repr(shown[0]) in lines[3]
    pixels = _png(tmp_path / "t.png")
    assert pixels.shape[0] > 100 and ((pixels[..., 0] > 200) & (pixels[..., 2] < 80)).sum() > 50  # red cells


def test_a_target_by_id_or_by_its_text_is_the_same(capsys, gpt2):
    by_id = json.loads(run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--target", "7",
                           "--method", "gradient", "--json")[1])
    by_text = json.loads(run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--target", "mat",
                             "--method", "gradient", "--json")[1])
    assert by_id["rows"] == by_text["rows"] and by_id["rows"][0]["target"] == 7 and by_id["rows"][0]["text"] == "mat"


# --- mistakes: one line, exit 2, no traceback, from a real process ---------------------------------------
@pytest.mark.parametrize(("argv", "said"), [
    (["tiny", "--method", "integrated_gradiens"], "--method 'integrated_gradiens' is not an attribution method. "
                                                  "Did you mean 'integrated_gradients'"),
    (["tiny", "--text", "the cat"], "--text needs a transformers model with its tokenizer"),
    (["tiny", "--image", "no-such.png"], "no such image file: no-such.png"),
    (["tiny", "--target", "10"], "target class 10 (sample 0) is out of range: the model has 10 classes"),
    (["tiny", "--target", "cat"], "--target 'cat' is not a class index"),
    (["tiny", "--generate", "2"], "--generate writes tokens, but TinyResNet takes images"),
    (["tiny", "--steps", "0"], "--steps 0 must be 1 or more"),
    (["tiny", "--image", "a.png", "--input", "1x3x8x8"], "give either --image PATH or --input, not both"),
])
def test_mistakes_are_one_line_and_exit_2(hookscope_process: Session, tmp_path, argv, said):
    done = hookscope_process.run("attribute", *argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert said in done.stderr, done.stderr


@pytest.mark.parametrize(("argv", "said"), [
    (["--target", "60"], "token id 60 (sample 0) is out of range: the model's vocabulary has 60 tokens"),
    (["--method", "smoothgrad"], "--method 'smoothgrad' adds noise to the inputs, which token ids cannot take"),
    (["--generate", "2", "--target", "3"], "give --target or --generate, not both"),
    (["--target", "cat sat"], "--target 'cat sat' is 2 tokens for the tokenizer"),
])
def test_token_mistakes_are_one_line_and_exit_2(hookscope_process: Session, gpt2, tmp_path, argv, said):
    done = hookscope_process.run("attribute", "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", *argv,
                                 cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


def test_a_plot_over_an_input_image_is_refused_and_the_image_kept(capsys, tmp_path):
    picture = tmp_path / "s.png"
    Image.fromarray(np.full((64, 64, 3), 128, dtype=np.uint8)).save(picture)
    before = picture.read_bytes()
    code, out, err = run(capsys, "demo", "--image", str(picture), "--plot", str(picture))
    assert code == 2 and out == "" and "is one of the --image files" in err and picture.read_bytes() == before


# --- refusals of a method: what they say is true, what they offer runs -----------------------------------
@pytest.mark.parametrize(("method", "said"), [
    ("lrp", "--method lrp hands relevance back layer by layer down to the inputs"),
    ("guided_backprop", "--method guided_backprop changes the backward pass of every ReLU"),
    ("vargrad", "--method vargrad adds noise to the inputs, not to a layer's output"),
])
def test_a_method_of_the_inputs_only_with_layers_says_why_and_offers_what_runs(capsys, method, said):
    code, out, err = run(capsys, "tiny", "--layers", "layer1", "--method", method)
    assert code == 2 and out == "" and err.count("\n") == 1 and said in err, err
    offered = err.split("give one of ")[1].split(" (")[0].strip().split(", ")
    gradients = {"saliency", "gradient", "input_x_gradient", "integrated_gradients", "guided_gradcam"}
    perturbation = {"occlusion", "feature_ablation", "feature_permutation", "shapley_value_sampling", "kernel_shap",
                    "lime"}
    assert set(offered) == gradients | perturbation
    for other in sorted(gradients) + ["occlusion"]:  # each runs at that layer (the others: their own tests)
        steps = ["--steps", "2"] if other == "integrated_gradients" else []
        code, out, err = run(capsys, "tiny", "--layers", "layer1", "--method", other, *steps, "--json")
        assert code == 0, err
        assert json.loads(out)["method"] == other


@pytest.mark.parametrize(("method", "said"), [
    ("smoothgrad", "--method 'smoothgrad' adds noise to the inputs, which token ids cannot take"),
    ("lrp", "--method 'lrp' gives maps at float inputs, which token ids are not"),
    ("guided_gradcam", "--method 'guided_gradcam' gives maps at float inputs, which token ids are not"),
])
def test_a_method_tokens_cannot_take_says_why_and_offers_what_runs(capsys, gpt2, method, said):
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--method", method,
                         "--layers", "transformer.wte")  # said before the model is built, tokens' methods named
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert (said in err) if method == "guided_gradcam" else \
        "tokens take integrated_gradients, input_x_gradient, saliency or gradient)" in err
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--method", method)
    assert code == 2 and out == "" and err.count("\n") == 1 and said in err, err
    offered = err.split("give one of ")[1].strip().split(", ")
    assert offered == ["integrated_gradients", "input_x_gradient", "saliency", "gradient"]
    for other in offered:
        steps = ["--steps", "2"] if other == "integrated_gradients" else []
        code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--method", other,
                             *steps, "--json")
        assert code == 0 and json.loads(out)["method"] == other, err


def test_an_encoder_decoder_model_from_the_command_line_equals_the_api(capsys, tmp_path):
    torch.manual_seed(2)
    config = T.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0,
                        eos_token_id=1, pad_token_id=0, initializer_factor=5.0)
    T.T5ForConditionalGeneration(config).save_pretrained(str(tmp_path / "t5"))
    code, out, err = run(capsys, "hf:seq2seq-lm", "--config", str(tmp_path / "t5"), "--input-ids", "3 4 5 6 7",
                         "--generate", "2", "--method", "gradient", "--json")
    assert code == 0, err
    data = json.loads(out)
    model = hookscope.load_model("hf:seq2seq-lm", config=str(tmp_path / "t5"))
    want = hookscope.attribute_tokens(model, torch.tensor([[3, 4, 5, 6, 7]]), generate=2, method="gradient")
    written = model.generate(torch.tensor([[3, 4, 5, 6, 7]]), max_new_tokens=2, do_sample=False)
    assert data["layer"] == "encoder.embed_tokens" and data["tokens"] == want.tokens
    assert want.tokens == [[3, 4, 5, 6, 7, *written[0, 1:].tolist()]] and len(data["rows"]) == 2
    for got, r in zip(data["rows"], want.rows):
        assert got["scores"] == pytest.approx(r.scores.tolist(), abs=1e-6) and got["target"] == r.target


# --- each method's own flags: a flag the method does not read is one line, exit 2 --------------------------
FLAGS = {"--steps": "4", "--rule": "gausslegendre", "--samples": "3", "--noise": "0.2"}  # the settings' flags
FLAG_NOT_READ = [(m, f) for m in hookscope.analysis.attribution.METHODS for f in FLAGS
                 if f[2:] not in hookscope.analysis.attribution.settings_of(m)]


@pytest.mark.parametrize(("method", "flag"), FLAG_NOT_READ, ids=[f"{m}{f}" for m, f in FLAG_NOT_READ])
def test_a_flag_the_method_does_not_read_is_one_line_naming_who_reads_it(capsys, method, flag):
    code, out, err = run(capsys, "tiny", "--method", method, flag, FLAGS[flag])
    reading = hookscope.analysis.attribution.readers(flag[2:])
    said = (f"{flag} is not a setting of {method} ({', '.join(reading)} read{'s' if len(reading) == 1 else ''} it); "
            f"drop it or give --method {reading[0]}")
    assert code == 2 and out == "" and err == f"hookscope attribute: error: {said}\n"


def test_the_default_methods_refuse_the_flags_they_do_not_read(capsys, gpt2):
    code, out, err = run(capsys, "demo", "--steps", "8")
    assert code == 2 and out == "" and err == ("hookscope attribute: error: --steps is not a setting of saliency (the "
                                               "method for images by default; integrated_gradients reads it); drop it "
                                               "or give --method integrated_gradients\n")
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--samples", "3")
    assert code == 2 and out == "" and err == ("hookscope attribute: error: --samples is not a setting of "
                                               "integrated_gradients, nor of any method tokens take; drop it\n")
    code, out, err = run(capsys, "hf:causal-lm", "--config", str(gpt2), "--text", "the cat", "--method", "saliency",
                         "--rule", "gausslegendre")
    assert code == 2 and err == ("hookscope attribute: error: --rule is not a setting of saliency (integrated_gradients "
                                 "reads it); drop it or give --method integrated_gradients\n")


def test_the_flags_a_method_reads_give_what_the_api_gives(capsys):
    code, out, err = run(capsys, "demo", "--method", "smoothgrad", "--samples", "3", "--noise", "0.2", "--json")
    assert code == 0, err
    data = json.loads(out)
    want = hookscope.attribute(hookscope.load_model("demo"), shapes(1, seed=0).images,
                               method=hookscope.SmoothGrad(samples=3, noise=0.2))
    assert data["settings"] == {"samples": 3, "noise": 0.2, "seed": 0} == want.settings
    assert data["scores"] == pytest.approx(want.scores.tolist(), rel=1e-6)
    code, out, err = run(capsys, "demo", "--method", "smoothgrad", "--samples", "3", "--noise", "0.2")
    assert code == 0 and out.strip() == want.table().strip(), err  # the sums of the maps too
    code, out, err = run(capsys, "demo", "--method", "integrated_gradients", "--steps", "4", "--rule", "gausslegendre",
                         "--json")
    assert code == 0 and json.loads(out)["settings"] == {"steps": 4, "rule": "gausslegendre"}, err


@pytest.mark.parametrize(("argv", "said"), [
    (["--samples", "0"], "--samples 0 must be 1 or more"),
    (["--noise", "-1"], "--noise -1 must be a finite number 0 or more (a fraction of each input's range)"),
    (["--noise", "nan"], "--noise nan must be a finite number 0 or more (a fraction of each input's range)"),
])
def test_a_bad_value_of_a_method_flag_is_one_line(capsys, argv, said):
    code, out, err = run(capsys, "tiny", "--method", "smoothgrad", *argv)
    assert code == 2 and out == "" and err == f"hookscope attribute: error: {said}\n"


# --- --device: the model and its inputs run there -----------------------------------------------------------
@pytest.mark.parametrize("argv", [["demo", "--method", "integrated_gradients", "--steps", "4"],
                                  ["tiny", "--method", "saliency", "--input", "2x3x16x16"]])
def test_device_cpu_gives_what_no_device_gives(capsys, argv):
    plain = run(capsys, *argv, "--json")
    on_cpu = run(capsys, *argv, "--json", "--device", "cpu")
    assert plain[0] == on_cpu[0] == 0 and json.loads(plain[1]) == json.loads(on_cpu[1])


def test_tokens_on_the_device_cpu_give_what_no_device_gives(capsys, gpt2):
    argv = ["hf:causal-lm", "--config", str(gpt2), "--text", "the cat sat", "--steps", "4", "--json"]
    plain, on_cpu = run(capsys, *argv), run(capsys, *argv, "--device", "cpu")
    assert plain[0] == on_cpu[0] == 0 and json.loads(plain[1]) == json.loads(on_cpu[1])


def test_the_model_and_its_inputs_are_moved_to_the_device(capsys, monkeypatch):
    seen: list[Any] = []
    moved = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        seen.append(args[0] if args else kwargs.get("device"))
        return moved(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    code, out, err = run(capsys, "tiny", "--device", "cpu", "--json")
    assert code == 0 and torch.device("cpu") in seen, err


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_cuda_names_the_fix(capsys, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, on any machine
    code, out, err = run(capsys, "tiny", "--device", device)
    assert code == 2 and out == ""
    assert err == f"hookscope attribute: error: --device {device}: CUDA is not available here; give --device cpu\n"


def test_a_device_that_cannot_run_is_one_line(capsys):
    code, out, err = run(capsys, "tiny", "--device", "meta")
    assert code == 2 and out == "" and err == ("hookscope attribute: error: --device meta holds no values, so nothing "
                                               "can be computed there; give cpu or cuda\n")


def test_the_perturbation_methods_from_the_command_line(capsys):
    code, out, err = run(capsys, "demo", "--method", "occlusion", "--window", "8,8", "--stride", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["settings"] == {"window": [8, 8], "stride": 4}
    code, out, err = run(capsys, "demo", "--method", "feature_ablation", "--features", "grid:16", "--json")
    assert code == 0 and json.loads(out)["method"] == "feature_ablation", err
    code, out, err = run(capsys, "demo", "--method", "saliency", "--window", "8")
    assert code == 2 and err.count("\n") == 1 and "--window is not a setting of saliency (occlusion reads it)" in err
    code, out, err = run(capsys, "demo", "--method", "occlusion", "--window", "99,99")
    assert code == 2 and err.count("\n") == 1 and "larger than one sample" in err
