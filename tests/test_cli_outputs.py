"""No command writes over one of its inputs, whatever the option or spec syntax names the input by
(``file.py:ATTR``, ``model.pt``, ``--weights``, ``--config``, ``--data``, ``--image``, ``--classes``,
diff's ``B``), through a hard link or a symlink too, and no folder a command fills holds an input.
Every refusal is one line, exit status 2, before the model runs, with every file as it was."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope import HookscopeError
from hookscope.cli import main
from hookscope.cli._outputs import check_not_inputs, input_paths

NET = ("import torch, pathlib\n"
       "class Net(torch.nn.Module):\n"
       "    def __init__(self):\n"
       "        super().__init__(); self.c = torch.nn.Conv2d(3, 4, 3); self.f = torch.nn.Linear(4, 3)\n"
       "    def forward(self, x):\n"
       "        pathlib.Path(__file__).with_name('ran').touch()\n"
       "        return self.f(torch.relu(self.c(x)).mean((2, 3)))\n")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def png(path: Path) -> Path:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "net.py").write_text(NET)
    torch.save({"c.weight": torch.ones(4, 3, 3, 3)}, tmp_path / "w.pt")
    return {"net": tmp_path / "net.py", "image": png(tmp_path / "photo.png"), "weights": tmp_path / "w.pt"}


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hookscope {argv[0]}: error: "), err
    return err[0].split(": error: ", 1)[1]


# --- every command, every way of naming an input ----------------------------------------------------------
def test_prune_never_replaces_a_model_source_or_an_image(tmp_path, files, capsys):
    before = snapshot(tmp_path)
    net, image = files["net"], files["image"]
    said = refused(capsys, ["prune", f"{net}:Net", "--input", "1x3x8x8", "--out", str(net), "--overwrite"])
    assert said == f"--out {net} is the file of MODEL; give another path, an input is never overwritten"
    said = refused(capsys, ["prune", "demo", "--image", str(image), "--out", str(image), "--overwrite"])
    assert said == f"--out {image} is one of the --image files; give another path, an input is never overwritten"
    assert snapshot(tmp_path) == before  # nothing written, and the model never ran


def test_trace_out_and_plot_never_replace_the_model_file(tmp_path, files, capsys):
    before = snapshot(tmp_path)
    net = files["net"]
    for option in ("--out", "--plot"):
        said = refused(capsys, ["trace", f"{net}:Net", "--input", "1x3x8x8", option, str(net)])
        assert said == f"{option} {net} is the file of MODEL; give another path, an input is never overwritten"
    said = refused(capsys, ["trace", "tiny", "--weights", str(files["weights"]), "--out", str(files["weights"])])
    assert said.startswith(f"--out {files['weights']} is the --weights file;")
    assert snapshot(tmp_path) == before


def test_another_spelling_a_hard_link_or_a_symlink_is_the_same_input(tmp_path, files, capsys):
    net = files["net"]
    os.link(net, tmp_path / "hard.py")
    os.symlink(net, tmp_path / "soft.py")
    before = snapshot(tmp_path)
    spelled = tmp_path / "sub" / ".." / "net.py"
    (tmp_path / "sub").mkdir()
    for model, out in [(f"{tmp_path}/hard.py:Net", net), (f"{net}:Net", tmp_path / "hard.py"),
                       (f"{net}:Net", tmp_path / "soft.py"), (f"{spelled}:Net", net)]:
        said = refused(capsys, ["prune", model, "--input", "1x3x8x8", "--out", str(out), "--overwrite"])
        assert said.endswith("is the file of MODEL; give another path, an input is never overwritten"), said
    assert snapshot(tmp_path) == before and not (tmp_path / "ran").exists()


def test_diff_plot_never_replaces_model_b(tmp_path, capsys):
    b = tmp_path / "b.pt"
    torch.save(torch.nn.Linear(2, 2), b)
    before = b.read_bytes()
    said = refused(capsys, ["diff", "tiny", str(b), "--plot", str(b)])
    assert said == f"--plot {b} is the file of B; give another path, an input is never overwritten"
    assert b.read_bytes() == before


def test_a_folder_the_command_fills_never_holds_an_input(tmp_path, files, capsys):
    out = tmp_path / "report"
    out.mkdir()
    image = png(out / "in.png")
    before = snapshot(tmp_path)
    said = refused(capsys, ["report", "demo", "--image", str(image), "--out", str(out), "--overwrite"])
    assert said == (f"--out {out} holds {image}, one of the --image files; give a folder that holds none of the "
                    "command's inputs, an input is never overwritten")
    data = tmp_path / "feats"
    data.mkdir()
    x = data / "x.npy"
    np.save(x, np.zeros((2, 3, 8, 8), dtype=np.float32))
    said = refused(capsys, ["extract", "tiny", "--data", str(x), "--layers", "fc", "--out", str(data), "--overwrite"])
    assert said.startswith(f"--out {data} holds {x}, one of the --data files;")
    said = refused(capsys, ["extract", f"{files['net']}:Net", "--data", str(x), "--layers", "f", "--out", str(tmp_path)])
    assert "holds" in said and "the file of MODEL" in said
    assert snapshot(tmp_path) == {**before, "feats/x.npy": x.read_bytes()}


def test_outputs_that_are_not_inputs_are_written(tmp_path, files, capsys):
    out = tmp_path / "pruned.pt"
    assert main(["prune", f"{files['net']}:Net", "--input", "1x3x8x8", "--amount", "0.5", "--repeats", "1",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert set(torch.load(out, weights_only=True)) == {"c.weight", "c.bias", "f.weight", "f.bias"}
    assert files["net"].read_text() == NET


# --- the check itself ------------------------------------------------------------------------------------
def test_input_paths_finds_every_input_option_and_the_file_of_a_spec(tmp_path, files):
    folder = tmp_path / "cfg"
    folder.mkdir()
    classes = tmp_path / "classes.txt"
    classes.write_text("a\nb\n")
    args = argparse.Namespace(model=f"{files['net']}:Net", model_b=str(files["weights"]), weights="DEFAULT",
                              config=str(folder), data=[str(files["image"]), "missing.npy"],
                              image=[str(tmp_path)], classes=str(classes))
    found = [(o, p.name) for o, p in input_paths(args)]
    assert found == [("MODEL", "net.py"), ("B", "w.pt"), ("--config", "cfg"), ("--data", "photo.png"),
                     ("--image", tmp_path.name), ("--classes", "classes.txt")]


@pytest.mark.parametrize("spec", ["torchvision:resnet18", "hf:causal-lm", "timm:resnet18", "demo", "tiny",
                                  "package.module:ATTR"])
def test_specs_that_name_no_file_are_no_input(tmp_path, spec, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_not_inputs(argparse.Namespace(model=spec, out="out.pt"))
    check_not_inputs(argparse.Namespace(model=spec, out=str(tmp_path)), folder_out=True)


def test_a_folder_out_that_is_an_input_folder_is_refused(tmp_path):
    with pytest.raises(HookscopeError, match="holds .*, one of the --image files"):
        check_not_inputs(argparse.Namespace(image=[str(tmp_path)], out=str(tmp_path / "." )), folder_out=True)
    # a file --out inside an input folder is a new file, not an input: allowed
    check_not_inputs(argparse.Namespace(image=[str(tmp_path)], out=str(tmp_path / "new.pt")))


# --- the files of an input folder ------------------------------------------------------------------------
@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=40, n_positions=16)
    folder = tmp_path / "gpt"
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


def test_no_file_of_a_config_folder_is_ever_written(hf_folder: Path, capsys):
    before = snapshot(hf_folder)
    folder = str(hf_folder)
    for argv in (["attribute", "hf:causal-lm", "--config", folder, "--input-ids", "1 2 3",
                  "--plot", f"{folder}/tokenizer.json"],
                 ["prune", "hf:causal-lm", "--config", folder, "--amount", "0.3", "--out", f"{folder}/config.json",
                  "--overwrite"],
                 ["prune", "hf:causal-lm", "--config", folder, "--amount", "0.3", "--out",
                  f"{folder}/model.safetensors", "--overwrite"],
                 ["prune", "hf:causal-lm", "--config", folder, "--amount", "0.3", "--out",
                  f"{folder}/pytorch_model.bin"],  # not there yet, but the next run would read it
                 ["trace", "hf:causal-lm", "--config", folder, "--out", f"{folder}/../gpt/trace.txt"]):
        said = refused(capsys, argv)
        assert f"is in the --config folder {folder}, whose files the model is read from" in said, said
    assert snapshot(hf_folder) == before


def test_an_image_written_into_an_image_or_data_folder_is_refused(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    png(images / "a.png")
    before = snapshot(tmp_path)
    said = refused(capsys, ["attribute", "demo", "--image", str(images), "--plot", str(images / "new.png")])
    assert "is in the --image folder" in said
    check_not_inputs(argparse.Namespace(data=[str(tmp_path)], out=str(tmp_path / "new.pt")))  # not an image
    with pytest.raises(HookscopeError, match="is in the --data folder"):
        check_not_inputs(argparse.Namespace(data=[str(tmp_path)], plot=str(images / "p.png")))
    assert snapshot(tmp_path) == before


def test_the_report_against_file_is_an_input(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    torch.save(TinyState(), out / "other.pt")
    said = refused(capsys, ["report", "tiny", "--against", str(out / "other.pt"), "--out", str(out), "--overwrite"])
    assert said.startswith(f"--out {out} holds {out / 'other.pt'}, the --against file;")
    assert (out / "other.pt").exists()


def TinyState() -> dict[str, torch.Tensor]:
    from hookscope.zoo import TinyResNet

    return TinyResNet().state_dict()


def test_no_python_file_beside_a_models_code_is_written(tmp_path, capsys):
    (tmp_path / "helpers.py").write_text("WIDTH = 4\n")
    (tmp_path / "net.py").write_text(NET.replace("import torch, pathlib", "import torch, pathlib\nimport helpers"))
    before = snapshot(tmp_path)
    said = refused(capsys, ["trace", f"{tmp_path}/net.py:Net", "--input", "1x3x8x8", "--out", str(tmp_path / "helpers.py")])
    assert said.startswith(f"--out {tmp_path / 'helpers.py'} is in the folder of MODEL's Python file")
    assert snapshot(tmp_path) == before and not (tmp_path / "ran").exists()
    check_not_inputs(argparse.Namespace(model=f"{tmp_path}/net.py:Net", out=str(tmp_path / "trace.txt")))
