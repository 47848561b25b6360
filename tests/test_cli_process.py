"""The command line on hostile or mistaken input, through a real ``python -m hookscope`` process.

A model file from somewhere else never runs code unless --trust-pickle says so, and every user
mistake is exactly one line ``hookscope CMD: error: ...`` on stderr with exit status 2: no traceback.
One real process runs every command line of this file in turn (``cli_batch.Batch``): ``torch`` starts once
rather than fifty times; the module's last test checks that it answers exactly as ``python -m hookscope``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_batch import ENV, Batch, Ran
from torch import nn



def one_line_error(res: Ran, command: str) -> str:
    """The one stderr line of a refused command (exit status 2, no traceback), without its prefix."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr)
    prefix = f"hookscope {command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker``, as a real attack would run anything."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def _evil(d: Path) -> Path:
    """A folder holding the three forms of a malicious model file; their payload writes ``d/PWNED``."""
    d.mkdir()
    marker = d / "PWNED"
    torch.save({"weight": torch.ones(2), "extra": Payload(marker)}, d / "evil.pt")
    torch.save(Payload(marker), d / "evil_legacy.pth", _use_new_zipfile_serialization=False)
    with open(d / "evil_raw.pth", "wb") as f:  # a plain pickle, as old .pth files can be
        pickle.dump(Payload(marker), f)
    return d


def _files(d: Path) -> Path:
    """A folder of broken, odd and ordinary model files for the user-mistake cases."""
    d.mkdir()
    (d / "raises.py").write_text("import torch\nraise RuntimeError('boom at import')\n")
    (d / "nameerr.py").write_text("import torch\n\ndef build():\n    return Nett()\n")
    (d / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (d / "badpkg_hs.py").write_text("x = 1 / 0\n")
    (d / "ok.py").write_text("import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(2, 2))\n")
    (d / "empty.py").write_text("")
    (d / "empty.pt").write_bytes(b"")
    (d / "notimg.png").write_text("not an image\n")
    (d / "outdir").mkdir()
    (d / "adir.pt").mkdir()
    (d / "adir.py").mkdir()
    torch.save(nn.Linear(2, 2).state_dict(), d / "weights.pt")
    torch.save(nn.Linear(2, 2).state_dict(), d / "old.pth", _use_new_zipfile_serialization=False)
    torch.manual_seed(0)
    torch.save(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), d / "model.pt")
    return d


PICKLES = [("summary", "evil.pt"), ("summary", "evil_legacy.pth"), ("summary", "evil_raw.pth"),
           ("trace", "evil.pt"), ("watch", "evil.pt"), ("diff", "evil.pt"), ("cam", "evil.pt")]
HELP = ["summary", "trace", "watch", "diff", "cam"]
MISTAKES = [
    (["summary", "raises.py:build", "--input", "1x2"],
     "importing raises.py raised RuntimeError: boom at import ({d}/raises.py, line 2, in <module>)"),
    (["trace", "nameerr.py:build", "--input", "1x2"],
     "building 'nameerr.py:build' raised NameError: name 'Nett' is not defined ({d}/nameerr.py, line 4, in build)"),
    (["watch", "exits.py:build", "--input", "1x2"], "importing exits.py called sys.exit(3)"),
    (["summary", "badpkg_hs:build", "--input", "1x2"],
     "importing 'badpkg_hs' raised ZeroDivisionError: division by zero"),
    (["cam", "tiny", "--image", "notimg.png", "--out", "o.png"], "cannot identify image file 'notimg.png'"),
    (["cam", "tiny", "--out", "outdir"], "cannot write --out outdir: it is a folder"),
    (["trace", "tiny", "--out", "outdir"], "cannot write --out outdir: it is a folder"),
    (["summary", "tiny", "--seed", "99999999999999999999"],
     "argument --seed: seed 99999999999999999999 is out of range for PyTorch's random generator"),
    (["demo", "--seed", "-99999999999999999999"], "is out of range for PyTorch's random generator"),
    (["diff", "tiny", "--b-seed", "99999999999999999999"], "seed 99999999999999999999 is out of range"),
    (["summary", "tiny", "--input", "100000x100000x100000"],
     "--input 100000x100000x100000 is 1,000,000,000,000,000 values (4 PB of float32), more than this machine's"),
    (["demo", "--batch", "99999999999"], "give a smaller --batch"),
    (["trace", "tiny", "--layers", "layer9"], "selector 'layer9' matches no module of TinyResNet"),
    (["watch", "tiny", "--layers", "layer9"], "selector 'layer9' matches no module of TinyResNet"),
    (["diff", "tiny", "--layers", "layer9"], "selector 'layer9' matches no module of TinyResNet"),
    (["cam", "tiny", "--layer", "layer9", "--out", "o.png"], "selector 'layer9' matches no module of TinyResNet"),
    (["trace", "tiny", "--grad-flow", "--layers", "layer9"], "selector 'layer9' matches no module"),
    (["demo", "layer9"], "layer9"),
    (["watch", "weights.pt", "--input", "1x2"], "it looks like a state_dict"),
    (["summary", "adir.pt"], "MODEL adir.pt is a folder"),
    (["summary", "."], "MODEL . is a folder"),
    (["trace", "adir.py:build", "--input", "1x2"], "adir.py is a folder, not a Python file"),
    (["summary", "missing.pt"], "no such file: missing.pt"),
    (["summary", "missing.py:build", "--input", "1x2"], "no such file: missing.py"),
    (["summary", "empty.pt"], "cannot load empty.pt: the file is empty"),
    (["summary", "empty.py:build", "--input", "1x2"], "empty.py has no attribute 'build'"),
    (["summary", "ok.py", "--input", "1x2"], "MODEL ok.py names a Python file but not what builds the model"),
    (["watch", "ok.py:build", "--input", "1x5"], "the forward pass failed in '0' (Linear)"),
    (["summary", "ok.py:build", "--input", "1x5"], "the forward pass failed in '0'"),
]
UNREADABLE = ["locked.py:build", "locked.pt"]
# TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD would turn torch.load's default unsafe: hookscope never relies on it
UNSAFE = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


class Runs:
    """Each case's command lines by key, answered from the module's one process."""

    def __init__(self, batch: Batch, keys: dict[object, int]) -> None:
        self.batch, self.keys = batch, keys

    def __getitem__(self, key: object) -> Ran:
        return self.batch[self.keys[key]]


def _unreadable(root: Path, batch: Batch, keys: dict[object, int]) -> list[Path]:
    """Model files nobody may read (for root, open() refuses them in the process); their paths."""
    paths = []
    for spec in UNREADABLE:
        path = root / spec.split(":")[0]
        path.write_text("import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
        path.chmod(0)
        keys["unreadable", spec] = batch.add("summary", str(root / spec), "--input", "1x2", cwd=root,
                                            deny=path if os.geteuid() == 0 else None)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> object:
    root = tmp_path_factory.mktemp("cli")
    batch, keys = Batch(), {}
    for command, name in PICKLES:
        d = _evil(root / f"{command}-{name}")
        extra = ["--out", "o.png"] if command == "cam" else []
        keys[command, name] = batch.add(command, name, "--input", "1x2", *extra, cwd=d, env=UNSAFE)
    trusted = _evil(root / "trusted")
    keys["trusted"] = batch.add("summary", "evil.pt", "--input", "1x2", "--trust-pickle", cwd=trusted)
    files = _files(root / "files")
    for command in HELP:
        keys["help", command] = batch.add(command, "--help", cwd=root)
    keys["help"] = batch.add("--help", cwd=root)
    for argv, _ in MISTAKES:
        keys[tuple(argv)] = batch.add(*argv, cwd=files)
    for argv in (["summary", "model.pt", "--input", "1x2"], ["summary", "model.pt", "--input", "1x2",
                                                             "--trust-pickle", "--json"],
                 ["trace", "weights.pt", "--input", "1x2"], ["trace", "old.pth", "--input", "1x2"]):
        keys[tuple(argv)] = batch.add(*argv, cwd=files, env=UNSAFE)
    locked = _unreadable(root, batch, keys)
    yield Runs(batch, keys), root
    for path in locked:
        path.chmod(0o644)


# --- no code from a model file runs without --trust-pickle --------------------------------------
@pytest.mark.parametrize(("command", "name"), PICKLES)
def test_a_malicious_pickle_never_runs_without_the_flag(runs: tuple[Runs, Path], command: str, name: str) -> None:
    ran, root = runs
    line = one_line_error(ran[command, name], command)
    assert not (root / f"{command}-{name}" / "PWNED").exists()
    assert "pickled model" in line and "--trust-pickle" in line
    assert "file.py:ATTR" in line and "run that Python code" in line  # the safer way, and its own risk
    if name != "evil_raw.pth":  # a torch.save file: the message names what it would have called
        assert line.startswith(f"{name} is a pickled model (it names exec), not plain weights; ")


def test_the_flag_is_what_unpickles_and_a_trusted_whole_model_loads(runs: tuple[Runs, Path]) -> None:
    ran, root = runs
    assert "gave a dict, not an nn.Module" in one_line_error(ran["trusted"], "summary")
    assert (root / "trusted" / "PWNED").read_text() == "pwned"  # the payload ran: only the flag allowed it
    refused = one_line_error(ran["summary", "model.pt", "--input", "1x2"], "summary")
    assert refused.startswith("model.pt is a pickled model (it names torch.nn.modules.")
    res = ran["summary", "model.pt", "--input", "1x2", "--trust-pickle", "--json"]
    assert res.returncode == 0, res.stderr
    assert '"params": 9' in res.stdout and '"type": "Linear"' in res.stdout


def test_weights_load_without_the_flag_and_a_state_dict_says_how_to_use_it(runs: tuple[Runs, Path]) -> None:
    ran, _ = runs
    for name in ("weights.pt", "old.pth"):
        line = one_line_error(ran["trace", name, "--input", "1x2"], "trace")
        assert line.startswith(f"'{name}' gave a OrderedDict, not an nn.Module; it looks like a state_dict")
        assert "m.load_state_dict(torch.load('weights.pt', weights_only=True))" in line


@pytest.mark.parametrize("command", HELP)
def test_help_says_which_model_forms_run_code_and_names_the_flag(runs: tuple[Runs, Path], command: str) -> None:
    ran, _ = runs
    res = ran["help", command]
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert "file.py:ATTR and package.module:ATTR import and run that Python code" in text
    assert "torch.load(weights_only=True), which runs no code" in text
    assert "--trust-pickle MODEL.pt is a whole model pickled with torch.save(model) by someone you trust" in text
    top = " ".join(ran["help"].stdout.split())
    assert "file.py:ATTR or package.module:ATTR imports and runs that Python code" in top


# --- every user mistake is one line --------------------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_user_mistake_is_one_line_and_exit_2(runs: tuple[Runs, Path], argv: list[str], message: str) -> None:
    ran, root = runs
    line = one_line_error(ran[tuple(argv)], argv[0])
    assert message.format(d=root / "files") in line


@pytest.mark.parametrize("spec", UNREADABLE)
def test_an_unreadable_model_file_is_one_line(runs: tuple[Runs, Path], spec: str) -> None:
    ran, root = runs
    path = root / spec.split(":")[0]
    assert one_line_error(ran["unreadable", spec], "summary") == f"cannot read {path}: Permission denied"


def test_python_m_hookscope_answers_as_the_batched_process(runs: tuple[Runs, Path]) -> None:
    """The shared process is faithful: a real ``python -m hookscope`` gives the same status and lines."""
    ran, root = runs
    argv = MISTAKES[1][0]
    real = subprocess.run([sys.executable, "-m", "hookscope", *argv], cwd=root / "files", env=ENV,
                          capture_output=True, text=True, timeout=300)
    shared = ran[tuple(argv)]
    assert (real.returncode, real.stdout, real.stderr) == (shared.returncode, shared.stdout, shared.stderr)
