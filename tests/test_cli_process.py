"""The command line on hostile or mistaken input, through a real ``python -m hookscope`` process.

A model file from somewhere else never runs code unless --trust-pickle says so, and every user
mistake is exactly one line ``hookscope CMD: error: ...`` on stderr with exit status 2: no traceback.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

SRC = str(Path(__file__).resolve().parents[1] / "src")


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker``, as a real attack would run anything."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def hookscope(*argv: str, cwd: Path, env: dict[str, str] | None = None,
              code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m hookscope ARGV`` (or ``python -c CODE ARGV``) in ``cwd``."""
    full_env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    head = ["-c", code] if code is not None else ["-m", "hookscope"]
    return subprocess.run([sys.executable, *head, *argv], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=300)


def one_line_error(res: subprocess.CompletedProcess[str], command: str) -> str:
    """The one stderr line of a refused command (exit status 2, no traceback), without its prefix."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr)
    prefix = f"hookscope {command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


# --- item 10: no code from a model file runs without --trust-pickle --------------------------------
@pytest.fixture
def evil(tmp_path: Path) -> Path:
    marker = tmp_path / "PWNED"
    torch.save({"weight": torch.ones(2), "extra": Payload(marker)}, tmp_path / "evil.pt")
    torch.save(Payload(marker), tmp_path / "evil_legacy.pth", _use_new_zipfile_serialization=False)
    with open(tmp_path / "evil_raw.pth", "wb") as f:  # a plain pickle, as old .pth files can be
        pickle.dump(Payload(marker), f)
    return tmp_path


CASES = [("summary", "evil.pt"), ("summary", "evil_legacy.pth"), ("summary", "evil_raw.pth"),
         ("trace", "evil.pt"), ("watch", "evil.pt"), ("diff", "evil.pt"), ("cam", "evil.pt")]


@pytest.mark.parametrize(("command", "name"), CASES)
def test_a_malicious_pickle_never_runs_without_the_flag(evil: Path, command: str, name: str) -> None:
    extra = ["--out", "o.png"] if command == "cam" else []
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD would turn torch.load's default unsafe: hookscope never relies on it
    res = hookscope(command, name, "--input", "1x2", *extra, cwd=evil,
                    env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    line = one_line_error(res, command)
    assert not (evil / "PWNED").exists()
    assert "pickled model" in line and "--trust-pickle" in line
    assert "file.py:ATTR" in line and "run that Python code" in line  # the safer way, and its own risk
    if name != "evil_raw.pth":  # a torch.save file: the message names what it would have called
        assert line.startswith(f"{name} is a pickled model (it names exec), not plain weights; ")


def test_the_flag_is_what_unpickles_and_a_trusted_whole_model_loads(evil: Path) -> None:
    res = hookscope("summary", "evil.pt", "--input", "1x2", "--trust-pickle", cwd=evil)
    assert (evil / "PWNED").read_text() == "pwned"  # the payload ran: only the flag allowed it
    assert "gave a dict, not an nn.Module" in one_line_error(res, "summary")

    torch.manual_seed(0)
    torch.save(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), evil / "model.pt")
    refused = one_line_error(hookscope("summary", "model.pt", "--input", "1x2", cwd=evil), "summary")
    assert refused.startswith("model.pt is a pickled model (it names torch.nn.modules.")
    res = hookscope("summary", "model.pt", "--input", "1x2", "--trust-pickle", "--json", cwd=evil)
    assert res.returncode == 0, res.stderr
    assert '"params": 9' in res.stdout and '"type": "Linear"' in res.stdout


def test_weights_load_without_the_flag_and_a_state_dict_says_how_to_use_it(tmp_path: Path) -> None:
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "weights.pt")
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    for name in ("weights.pt", "old.pth"):
        line = one_line_error(hookscope("trace", name, "--input", "1x2", cwd=tmp_path), "trace")
        assert line.startswith(f"'{name}' gave a OrderedDict, not an nn.Module; it looks like a state_dict")
        assert "m.load_state_dict(torch.load('weights.pt', weights_only=True))" in line


@pytest.mark.parametrize("command", ["summary", "trace", "watch", "diff", "cam"])
def test_help_says_which_model_forms_run_code_and_names_the_flag(command: str, tmp_path: Path) -> None:
    res = hookscope(command, "--help", cwd=tmp_path)
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert "file.py:ATTR and package.module:ATTR import and run that Python code" in text
    assert "torch.load(weights_only=True), which runs no code" in text
    assert "--trust-pickle MODEL.pt is a whole model pickled with torch.save(model) by someone you trust" in text
    top = " ".join(hookscope("--help", cwd=tmp_path).stdout.split())
    assert "file.py:ATTR or package.module:ATTR imports and runs that Python code" in top


# --- item 14: every user mistake is one line -----------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
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
    return d


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


@pytest.mark.parametrize(("argv", "message"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_user_mistake_is_one_line_and_exit_2(files: Path, argv: list[str], message: str) -> None:
    line = one_line_error(hookscope(*argv, cwd=files), argv[0])
    assert message.format(d=files) in line


DENY = """
import _io, builtins, sys
from hookscope.cli import main
target = sys.argv.pop(1)
def deny(opener):
    def wrapped(file, *args, **kwargs):
        if str(file) == target:
            raise PermissionError(13, "Permission denied", str(file))
        return opener(file, *args, **kwargs)
    return wrapped
builtins.open, _io.open_code = deny(builtins.open), deny(_io.open_code)
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("spec", ["locked.py:build", "locked.pt"])
def test_an_unreadable_model_file_is_one_line(tmp_path: Path, spec: str) -> None:
    path = tmp_path / spec.split(":")[0]
    path.write_text("import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    path.chmod(0)
    try:
        if os.geteuid() == 0:  # root reads anything: make open() refuse this one file as it would
            res = hookscope(str(path), "summary", str(tmp_path / spec), "--input", "1x2", cwd=tmp_path, code=DENY)
        else:
            res = hookscope("summary", str(tmp_path / spec), "--input", "1x2", cwd=tmp_path)
    finally:
        path.chmod(0o644)
    assert one_line_error(res, "summary") == f"cannot read {path}: Permission denied"
