"""A user's mistake on the command line is one line on stderr and a non-zero exit, never a traceback.

main() is run in-process: an exception escaping it is what would print a traceback.
"""

import pytest
import torch
from torch import nn

from hookscope.cli import main

MODELS = '''
import torch
class NeedsArg(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.lin = torch.nn.Linear(5, hidden)
'''


def one_line(capsys, prefix: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "broken.py").write_text("def build(:\n")
    (tmp_path / "corrupt.pt").write_bytes(b"garbage")
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "weights.pt")
    return tmp_path


@pytest.mark.parametrize(("argv", "message"), [
    (["trace", "tiny", "--layers", "re:("], "selector 're:(' is not a valid regular expression"),
    (["watch", "tiny", "--layers", "re:("], "selector 're:(' is not a valid regular expression"),
    (["trace", "tiny", "--out", "/nonexistent/dir/x.csv"], "cannot write --out /nonexistent/dir/x.csv: no folder"),
    (["summary", "{d}/models.py:NeedsArg", "--input", "1x5"], "needs arguments (hidden)"),
    (["trace", "{d}/broken.py:build", "--input", "1x5"], "broken.py, line 1: SyntaxError"),
    (["summary", "{d}/corrupt.pt", "--input", "1x5"], "is not a model file of a known format"),
    (["summary", "{d}/corrupt.pt", "--input", "1x5", "--trust-pickle"], "is not a model file of a known format"),
    (["watch", "{d}/weights.pt", "--input", "1x5"], "it looks like a state_dict"),
    (["demo", "--batch", "0"], "--batch 0 must be at least 1"),
    (["watch", "tiny", "--last", "-1"], "last=-1 must be a whole number of module calls"),
])
def test_user_mistakes_are_one_line_and_exit_2(files, capsys, argv, message):
    argv = [a.format(d=files) for a in argv]
    assert main(argv) == 2
    line = one_line(capsys, f"hookscope {argv[0]}: error: ")
    assert message in line


def test_an_unwritable_out_file_is_one_line(tmp_path, capsys):
    folder = tmp_path / "out.csv"
    folder.mkdir()  # a folder where the file should go: open() fails with IsADirectoryError
    assert main(["trace", "tiny", "--layers", "fc", "--out", str(folder)]) == 2
    assert "cannot write --out" in one_line(capsys, "hookscope trace: error: ")


@pytest.mark.parametrize(("argv", "prefix", "message"), [
    (["trace", "tiny", "--seed", "x"], "hookscope trace: error: ", "argument --seed: invalid int value: 'x'"),
    (["watch"], "hookscope watch: error: ", "the following arguments are required: MODEL"),
    (["nosuchcommand"], "hookscope: error: ", "unknown command 'nosuchcommand'. Commands: demo, report"),
])
def test_argument_errors_are_one_line_with_a_hint_and_exit_2(capsys, argv, prefix, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    line = one_line(capsys, prefix)
    assert message in line and line.endswith(f"(see {prefix.split(': ')[0]} --help)")
