import subprocess
import sys

from hookscope.cli import main


def test_demo_shows_the_trap_and_leaves_no_hook(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "15 calls recorded" in out
    assert "7 of 15 layers read back wrong" in out
    assert "Hooks left on the model: 0." in out


def test_demo_with_a_glob_selects_those_layers(capsys):
    assert main(["demo", "layer1.*.conv1", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0.conv1" in out and "layer1.1.conv1" in out and "layer1.0.bn1" not in out


def test_bad_layer_is_one_line_nonzero_and_no_traceback():
    res = subprocess.run(
        [sys.executable, "-m", "hookscope", "demo", "layer9.conv1"], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "layer9.conv1" in lines[0] and "Did you mean" in lines[0]
