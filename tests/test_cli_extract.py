"""``hookscope extract``: image folders, .npy and .pt files stored row for row equal to a direct
hookscope.capture of the same inputs reduced the same way; every SPEC form; every bad input as one line
with a non-zero exit; unreadable images stopped or skipped; no user file ever unpickled."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cli_batch import Session
from PIL import Image

import hookscope
from hookscope.analysis.extract import reducer
from hookscope.cli import main
from hookscope.cli.inputs._data import ArrayFiles, ImageFiles, file_data
from hookscope.cli.inputs._images import ImageTransform, load_images
from hookscope.cli._load import load_model
from hookscope.cli.extract import parse_spec
from hookscope.errors import HookscopeError
from hookscope.store import open_store

from helpers import no_hooks

BAD_SPECS = ["layer1:median", "layer1:mean:a", ":mean", "layer1:mean:", "layer1:at[:, -1", "layer1:at[foo]",
             "layer1:at[__import__('os').getcwd()]", "layer1:at[1.5]", "layer1:at", "layer1:at[True]",
             "layer1:at[:, [0, 1]]", "layer1:max:1:2"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(["extract", *argv])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.strip().splitlines() if "warning:" not in line]


def fail(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a refused command (exit 2, nothing on stdout, no traceback)."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and len(err) == 1, (code, out, err)
    assert err[0].startswith("hookscope extract: error: ") and "Traceback" not in err[0]
    return err[0]


def _pictures(folder: Path, n: int, seed: int = 0, size: tuple[int, int] = (40, 52)) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        path = folder / ("sub" if i % 2 else "") / f"img{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _captured(model: torch.nn.Module, x: Any, layers: dict[str, Any], keep: str = "output") -> dict[str, torch.Tensor]:
    """Each layer's value for the batch ``x`` by hookscope.capture, reduced as extract reduces it."""
    with torch.no_grad(), hookscope.capture(model, *layers, keep=keep) as rec:
        model(**x) if isinstance(x, dict) else model(x)
    assert no_hooks(model)
    return {n: reducer(how)(rec[n].output if keep == "output" else rec[n].input) for n, how in layers.items()}


def test_an_image_folder_equals_a_capture_of_the_same_pictures(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    paths = _pictures(tmp_path / "imgs", 5)
    code, out, _ = run(capsys, "demo", "--data", str(tmp_path / "imgs"), "--layers", "layer1:mean", "fc",
                       "--out", str(tmp_path / "s"), "--batch-size", "8")
    assert code == 0 and "5 samples" in out and "samples/s" in out
    store = open_store(tmp_path / "s")
    # sorted by relative path, folders searched recursively; the ids are relative to the folder given
    ordered = sorted(paths, key=lambda p: p.relative_to(tmp_path / "imgs").parts)
    assert store.ids == [p.relative_to(tmp_path / "imgs").as_posix() for p in ordered]
    import argparse
    batch = load_images(argparse.Namespace(image=[str(p) for p in ordered], size=None, preset="auto", model="demo",
                                           weights=None))
    ref = _captured(load_model("demo"), batch.x, {"layer1": "mean", "fc": None})
    assert torch.equal(store["layer1"][:], ref["layer1"]) and torch.equal(store["fc"][:], ref["fc"])
    m = store.manifest
    assert m["data"]["kind"] == "images" and m["data"]["paths"] == [str(tmp_path / "imgs")]
    assert m["model"]["spec"] == "demo" and m["preprocessing"]["size"] == [64, 64]
    assert m["preprocessing"]["preset"] == "demo"


def _npys(tmp_path: Path) -> tuple[list[str], torch.Tensor]:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 3, 32, 32)), rng.standard_normal((3, 3, 32, 32))  # float64 files
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], torch.from_numpy(np.concatenate([a, b])).float()


def test_npy_files_are_concatenated_in_order_with_their_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files, x = _npys(tmp_path)
    code, _, _ = run(capsys, "tiny", "--data", *files, "--layers", "layer2:max", "--out", str(tmp_path / "s"))
    assert code == 0
    store = open_store(tmp_path / "s")
    assert store.ids == [f"{files[0]}[{i}]" for i in range(4)] + [f"{files[1]}[{i}]" for i in range(3)]
    ref = _captured(load_model("tiny"), x, {"layer2": "max"})
    assert torch.equal(store["layer2"][:], ref["layer2"])
    assert store.manifest["data"]["kind"] == "npy" and store.manifest["preprocessing"] is None


def test_every_spec_form_equals_capture_reduced_the_same_way(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    files, x = _npys(tmp_path)
    specs = {"layer1": None, "layer1.0.conv1:mean": "mean", "layer2.0.conv1:max": "max", "layer2:mean:2": "mean:2",
             "layer1.1.conv2:max:2,3": "max:2,3", "fc:at[:, -1]": hookscope.at[:, -1],
             "layer2.0.conv2:at[..., 0, 1:3]": hookscope.at[..., 0, 1:3],
             "layer1.0.conv2:at[:, ::2, None]": hookscope.at[:, ::2, None]}
    code, _, _ = run(capsys, "tiny", "--data", *files, "--layers", *specs, "--out", str(tmp_path / "s"))
    assert code == 0
    store = open_store(tmp_path / "s")
    ref = _captured(load_model("tiny"), x, {parse_spec(s)[0]: how for s, how in specs.items()})
    assert sorted(store) == sorted(ref)
    for name in ref:
        assert torch.equal(store[name][:], ref[name]), name
    assert {a["name"]: a["reduction"] for a in store.manifest["arrays"]}["fc"] == "at[:, -1]"


def test_a_glob_spec_reduces_every_layer_it_selects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files, x = _npys(tmp_path)
    code, _, _ = run(capsys, "tiny", "--data", files[0], "--layers", "layer*.*.conv1:mean", "--out",
                     str(tmp_path / "s"),
                     "--keep", "input", "--dtype", "float16")
    assert code == 0
    store = open_store(tmp_path / "s")
    names = [n for n in hookscope.names(load_model("tiny")) if n.startswith("layer") and n.endswith(".conv1")]
    assert list(store) == names and len(names) == 3
    ref = _captured(load_model("tiny"), x[:4], dict.fromkeys(names, "mean"), keep="input")
    for n in names:
        assert store[n].dtype == torch.float16 and torch.equal(store[n][:], ref[n].half())


def test_parse_spec_reads_positions_without_eval() -> None:
    assert parse_spec("h.5:mean:1") == ("h.5", "mean:1")
    assert parse_spec("h.5:max:-1,2") == ("h.5", "max:-1,2")
    assert parse_spec("a.b") == ("a.b", None)
    name, at = parse_spec("x:at[0, -2:, ..., None]")
    assert name == "x" and repr(at) == repr(hookscope.at[0, -2:, ..., None])
    for bad in BAD_SPECS:
        with pytest.raises(HookscopeError, match="is not a layer spec; write NAME, NAME:mean") as e:
            parse_spec(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec", BAD_SPECS[:6])
def test_a_bad_spec_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str) -> None:
    files, _ = _npys(tmp_path)
    line = fail(capsys, "tiny", "--data", files[0], "--layers", spec, "--out", str(tmp_path / "s"))
    assert repr(spec) in line and "NAME:at[:, -1]" in line
    assert not (tmp_path / "s").exists()


def test_bad_inputs_are_one_line_and_leave_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files, _ = _npys(tmp_path)
    out = str(tmp_path / "s")
    (tmp_path / "notes.txt").write_text("x")
    _pictures(tmp_path / "imgs", 1)
    cases = {
        ("--data", files[0], "--layers", "layer9"): "layer9",
        ("--data", str(tmp_path / "missing.npy"), "--layers", "fc"): "no such file or folder",
        ("--data", str(tmp_path / "notes.txt"), "--layers", "fc"): "not an image, .pt or .npy file",
        ("--data", files[0], str(tmp_path / "imgs"), "--layers", "fc"): "mixes npy",
        ("--data", files[0], "--layers", "fc", "--size", "8x8"): "--size and --preset apply to images",
        ("--data", files[0], "--layers", "fc", "--input", "1x3x8x8"): "--input is not used by extract",
        ("--data", files[0], "--layers", "fc", "--batch-size", "0"): "--batch-size 0 must be at least 1",
        ("--data", files[0], "--layers", "fc", "--limit", "0"): "--limit 0",
        ("--data", files[0], "--layers", "fc", "--shard-size", "lots"): "is not a size",
        ("--data", str(tmp_path / "empty"), "--layers", "fc"): "no such file or folder",
        ("--data", files[0], "--layers", "fc", "--device", "gpu"): "--device 'gpu' is not a device",
        ("--data", files[0], "--layers", "fc", "--workers", "-1"): "--workers -1 must be at least 0",
    }
    for argv, said in cases.items():
        assert said in fail(capsys, "tiny", *argv, "--out", out), argv
        assert not os.path.exists(out) or not os.listdir(out), argv
    if not torch.cuda.is_available():
        assert "CUDA is not available" in fail(capsys, "tiny", "--data", files[0], "--layers", "fc", "--device", "cuda",
                                               "--out", out)
    (tmp_path / "empty").mkdir()
    assert "holds no image file" in fail(capsys, "tiny", "--data", str(tmp_path / "empty"), "--layers", "fc",
                                         "--out", out)


def test_an_unreadable_image_stops_the_run_or_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _pictures(tmp_path / "imgs", 4)
    bad = tmp_path / "imgs" / "img1b.png"
    bad.write_bytes(b"not a png at all")
    argv = ["demo", "--data", str(tmp_path / "imgs"), "--layers", "layer2:mean", "--batch-size", "16"]
    line = fail(capsys, *argv, "--out", str(tmp_path / "s"))
    assert str(bad) in line and "--skip-unreadable skips such files" in line
    code, out, _ = run(capsys, *argv, "--out", str(tmp_path / "s2"), "--skip-unreadable")
    assert code == 0 and "skipped 1 unreadable sample: img1b.png (cannot read image" in out
    store = open_store(tmp_path / "s2")
    assert [s["id"] for s in store.skipped] == ["img1b.png"] and store.manifest["samples"]["count"] == 4
    good = sorted(paths, key=lambda p: p.relative_to(tmp_path / "imgs").parts)
    assert store.ids == [p.relative_to(tmp_path / "imgs").as_posix() for p in good]
    import argparse
    batch = load_images(argparse.Namespace(image=[str(p) for p in good], size=None, preset="auto", model="demo",
                                           weights=None))
    ref = _captured(load_model("demo"), batch.x, {"layer2": "mean"})
    assert torch.equal(store["layer2"][:], ref["layer2"])
    # the first file unreadable (the one the engine probes shapes with), and one truncated PNG
    (tmp_path / "imgs" / "000.png").write_bytes(b"")
    (tmp_path / "imgs" / "sub" / "img3.png").write_bytes((tmp_path / "imgs" / "img0.png").read_bytes()[:60])
    assert str(tmp_path / "imgs" / "000.png") in fail(capsys, *argv, "--out", str(tmp_path / "s3"))
    code, out, _ = run(capsys, *argv, "--out", str(tmp_path / "s4"), "--skip-unreadable", "--json")
    assert code == 0 and json.loads(out)["skipped_count"] == 3
    store = open_store(tmp_path / "s4")
    assert [s["id"] for s in store.skipped] == ["000.png", "img1b.png", "sub/img3.png"]
    assert store.ids == ["img0.png", "img2.png", "sub/img1.png"]
    assert torch.equal(store["layer2"][:], ref["layer2"][[0, 1, 2]])


def test_an_existing_store_needs_resume_or_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files, _ = _npys(tmp_path)
    argv = ["tiny", "--data", files[0], "--layers", "fc", "--out", str(tmp_path / "s")]
    assert run(capsys, *argv)[0] == 0
    before = (tmp_path / "s" / "shards" / "000000.safetensors").read_bytes()
    line = fail(capsys, *argv)
    assert "already holds a hookscope store" in line and "--resume" in line and "--overwrite" in line
    code, out, _ = run(capsys, *argv, "--resume")
    assert code == 0 and "complete already" in out
    assert run(capsys, *argv, "--overwrite")[0] == 0
    assert (tmp_path / "s" / "shards" / "000000.safetensors").read_bytes() == before
    with pytest.raises(SystemExit) as stop:  # argparse refuses both flags together, in one line
        main(["extract", *argv, "--resume", "--overwrite"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("keep me")
    assert "not empty" in fail(capsys, *argv[:-1], str(tmp_path / "other"), "--overwrite")
    assert (tmp_path / "other" / "mine.txt").read_text() == "keep me"


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(Path(os.environ["BOOM_DIR"]) / "ran"),))


def test_a_pickled_object_is_refused_without_unpickling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOM_DIR", str(tmp_path))
    torch.save({"input": _Boom()}, tmp_path / "evil.pt")
    np.save(tmp_path / "evil.npy", np.array([_Boom(), 1], dtype=object), allow_pickle=True)
    assert not (tmp_path / "ran").exists()
    for name, said in (("evil.pt", "cannot be read without unpickling"), ("evil.npy", "holds Python objects")):
        line = fail(capsys, "tiny", "--data", str(tmp_path / name), "--layers", "fc", "--out", str(tmp_path / "s"))
        assert said in line and name in line
    assert not (tmp_path / "ran").exists()
    torch.save([torch.zeros(2, 3)], tmp_path / "list.pt")
    assert "not a tensor or a dict of tensors" in fail(capsys, "tiny", "--data", str(tmp_path / "list.pt"),
                                                        "--layers", "fc", "--out", str(tmp_path / "s"))


def test_pt_tensor_files_and_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    torch.save(x[:2], tmp_path / "a.pt", _use_new_zipfile_serialization=False)  # legacy: read without mmap
    torch.save(x[2:].clone(), tmp_path / "b.pt")
    code, out, _ = run(capsys, "tiny", "--data", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--layers",
                       "layer2:mean", "--out", str(tmp_path / "s"), "--limit", "5", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["samples"] == 5 and doc["skipped"] == [] and doc["arrays"][0]["name"] == "layer2"
    store = open_store(tmp_path / "s")
    assert store.ids[1:3] == [f"{tmp_path / 'a.pt'}[1]", f"{tmp_path / 'b.pt'}[0]"]
    ref = _captured(load_model("tiny"), x[:5], {"layer2": "mean"})
    assert torch.equal(store["layer2"][:], ref["layer2"])
    torch.save(torch.zeros(2, 3, 16, 16), tmp_path / "c.pt")
    assert "rows agree" in fail(capsys, "tiny", "--data", str(tmp_path / "a.pt"), str(tmp_path / "c.pt"),
                                "--layers", "fc", "--out", str(tmp_path / "s2"))


TOKEN_MODEL = '''
import torch
class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.block = torch.nn.Linear(8, 8)
    def forward(self, input_ids, attention_mask):
        return self.block(self.embed(input_ids) * attention_mask[..., None])
'''


def test_a_pt_dict_gives_keyword_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tok.py").write_text(TOKEN_MODEL)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, 50, (5, 7), generator=g), "attention_mask": torch.ones(5, 7)}
    batch["attention_mask"][1, 5:] = 0
    torch.save(batch, tmp_path / "tokens.pt")
    spec = f"{tmp_path / 'tok.py'}:Tokens"
    code, _, _ = run(capsys, spec, "--data", str(tmp_path / "tokens.pt"), "--layers", "block:at[:, -1]", "embed:mean:1",
                     "--out", str(tmp_path / "s"))
    assert code == 0
    store = open_store(tmp_path / "s")
    ref = _captured(load_model(spec), batch, {"block": hookscope.at[:, -1], "embed": "mean:1"})
    assert torch.equal(store["block"][:], ref["block"]) and torch.equal(store["embed"][:], ref["embed"])
    assert store["block"].shape == (5, 8) and store.manifest["data"]["kind"] == "pt"


def test_images_of_their_own_size_must_agree(tmp_path: Path) -> None:
    small = _pictures(tmp_path / "a", 1, size=(8, 8))[0]
    big = _pictures(tmp_path / "b", 1, size=(9, 8))[0]
    data = ImageFiles([str(small), str(big)], ImageTransform("none"))
    assert data[0].shape == (3, 8, 8)
    with pytest.raises(HookscopeError, match=r"is 9x8, the others 8x8, and the model's input size is unknown"):
        data[1]


def test_npy_maps_are_opened_per_process_not_pickled(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((1000, 100), dtype=np.float32))
    data = ArrayFiles([str(tmp_path / "big.npy")])
    _ = data[3]
    assert len(pickle.dumps(data)) < 2000  # the 400 kB array is not in it
    assert torch.equal(pickle.loads(pickle.dumps(data))[999], torch.zeros(100))
    with pytest.raises(IndexError):
        data[1000]
    assert len(file_data([str(tmp_path / "big.npy")], limit=10).dataset) == 10


def test_workers_read_the_same_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files, x = _npys(tmp_path)
    code, _, _ = run(capsys, "tiny", "--data", *files, "--layers", "fc", "--out", str(tmp_path / "s"),
                     "--workers", "1", "--batch-size", "8")
    assert code == 0
    ref = _captured(load_model("tiny"), x, {"fc": None})
    assert torch.equal(open_store(tmp_path / "s")["fc"][:], ref["fc"])


@pytest.mark.slow
def test_a_real_process_and_help(tmp_path: Path, hookscope_process: Session) -> None:
    files, x = _npys(tmp_path)
    argv = ["extract", "tiny", "--data", *files, "--layers", "layer1:mean", "--out", str(tmp_path / "s")]
    done = hookscope_process.run(*argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "7 samples" in done.stdout and "Traceback" not in done.stderr
    ref = _captured(load_model("tiny"), x, {"layer1": "mean"})
    assert torch.equal(open_store(tmp_path / "s")["layer1"][:], ref["layer1"])
    again = hookscope_process.run(*argv, cwd=tmp_path)
    assert again.returncode == 2 and again.stdout == "" and "Traceback" not in again.stderr
    assert len([l for l in again.stderr.splitlines() if "error:" in l]) == 1


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    out = capsys.readouterr().out
    assert "Examples:" in out and "torchrun --nproc_per_node 2 -m hookscope extract" in out


LOUD_MODEL = '''
import torch
class Loud(torch.nn.Module):
    """A linear layer that multiplies its input by 1000 (an image's 0..255 squared is as loud)."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(4) * 1000)
            self.lin.bias.zero_()
    def forward(self, x):
        return self.lin(x)
'''


@pytest.mark.parametrize("row", [0, 20])  # met by the probe, or after two shards were written
def test_float16_values_beyond_its_range_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 row: int) -> None:
    (tmp_path / "loud.py").write_text(LOUD_MODEL)
    x = torch.rand(24, 4, generator=torch.Generator().manual_seed(4)) * 10
    x[row, 1] = 80.0  # 80000 after the layer
    torch.save(x, tmp_path / "x.pt")
    spec, out = f"{tmp_path / 'loud.py'}:Loud", tmp_path / "s"
    args = [spec, "--data", str(tmp_path / "x.pt"), "--layers", "lin", "--batch-size", "4", "--shard-size",
            str(8 * (4 * 2 + 8))]
    line = fail(capsys, *args, "--dtype", "float16", "--out", str(out))
    assert "'lin' gives values up to 80000, beyond float16's range (largest finite 65504)" in line
    assert "--dtype bfloat16" in line and "resume" not in line
    assert not (out / "manifest.json").exists() and not list(out.rglob("*.safetensors"))
    code, _, _ = run(capsys, *args, "--dtype", "bfloat16", "--out", str(out))  # the folder is free
    assert code == 0
    with torch.no_grad():
        want = load_model(spec)(x).to(torch.bfloat16)
    assert torch.equal(open_store(out)["lin"][:], want) and open_store(out)["lin"][row, 1].item() == 79872.0
