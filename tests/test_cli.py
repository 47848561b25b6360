import re
import json
from pathlib import Path

import pytest

from hookscope.cli import main


def test_demo_shows_the_trap_and_leaves_no_hook(capsys):
    assert main(["demo", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "14 calls recorded" in out
    assert "7 of 14 layers read back wrong" in out  # every batch norm, rewritten by the in-place ReLU after it
    assert "Hooks left on the model: 0." in out
    assert "image 0: " in out and "truth" in out


def test_demo_with_a_glob_selects_those_layers(capsys):
    assert main(["demo", "layer1.[03]", "--batch", "1", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0" in out and "layer1.3" in out and "layer1.1" not in out


def test_bad_layer_is_one_line_nonzero_and_no_traceback(hookscope_process):
    res = hookscope_process.run("demo", "layer9.conv1", cwd=Path.cwd())
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "layer9.conv1" in lines[0] and "Did you mean" in lines[0]


# --- hookscope layers: the names every selector and "did you mean" refers to -----------------------
def test_layers_lists_names_types_and_output_shapes(capsys):
    import json

    import hookscope
    from hookscope.zoo import TinyResNet

    assert main(["layers", "tiny", "layer1.*"]) == 0
    out = capsys.readouterr().out.splitlines()
    body = [line.split() for line in out[2:-1]]
    expected = [n for n in hookscope.names(TinyResNet()) if n.startswith("layer1.")]
    assert [b[0] for b in body] == expected and body[1][:3] == ["layer1.0.conv1", "Conv2d", "1x16x32x32"]
    assert out[-1].startswith(f"{len(expected)} layer(s)")
    assert main(["layers", "tiny", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == hookscope.names(TinyResNet())
    assert rows[-1] == {"name": "fc", "type": "Linear", "output": "1x10"}


def test_layers_without_running_needs_no_input(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text("import torch\nclass Odd(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.a = torch.nn.Linear(7, 2)\n    def forward(self, x):\n        return self.a(x)\n")
    assert main(["layers", f"{src}:Odd", "--no-run", "--json"]) == 0
    assert __import__("json").loads(capsys.readouterr().out) == [{"name": "a", "type": "Linear"}]
    assert main(["layers", f"{src}:Odd"]) == 2  # no known input: asks for one, one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give the example input's shape" in err[0]
    assert main(["layers", f"{src}:Odd", "--input", "1x3"]) == 2  # an input that does not fit
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "forward pass failed in 'a' (Linear)" in err[0]


def test_a_bad_pattern_names_the_closest_layers_and_the_command(hookscope_process):
    r = hookscope_process.run("layers", "tiny", "laye1", cwd=Path.cwd())
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Did you mean 'layer1'" in r.stderr and "hookscope layers MODEL" in r.stderr


def test_an_unknown_command_names_the_closest_one(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["repot", "demo"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown command 'repot'. Did you mean 'report'?" in err[0]


def _refused(capsys, argv):
    """The stderr of a refused command line (exit status 2); SystemExit from argparse counts too."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    return capsys.readouterr().err


def test_a_misspelt_option_is_answered_with_the_closest_one(capsys, tmp_path):
    err = _refused(capsys, ["cam", "demo", "--layr", "layer1", "--out", str(tmp_path / "c.png")])
    assert err == "hookscope cam: error: unrecognized argument '--layr'. Did you mean --layers? (see hookscope cam --help)\n"
    err = _refused(capsys, ["trace", "tiny", "--lyers", "layer1"])
    assert "unrecognized argument '--lyers'. Did you mean --layers?" in err
    err = _refused(capsys, ["summary", "tiny", "--zzzz"])  # nothing close: argparse's own words
    assert "unrecognized arguments: --zzzz" in err and "Did you mean" not in err
    assert not (tmp_path / "c.png").exists()


def test_layers_and_layer_are_one_option_on_every_command(capsys, tmp_path):
    outs = []
    for argv in (["--layers", "layer1", "layer2"], ["--layer", "layer1", "--layer", "layer2"]):
        assert main(["cam", "demo", *argv, "--json", "--out", str(tmp_path / f"{len(outs)}.png")]) == 0
        outs.append(json.loads(capsys.readouterr().out.replace(f"{len(outs)}.png", "N.png")))
    assert outs[0] == outs[1] and outs[0]["layers"] == ["layer1", "layer2"]
    for command in ("trace", "watch", "diff", "features", "prune", "extract", "report"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "--layers" in text and "--layer" in text.replace("--layers", ""), command


def test_a_pattern_after_the_options_is_the_pattern(capsys):
    assert main(["layers", "tiny", "layer1.*"]) == 0
    expected = capsys.readouterr().out
    assert main(["layers", "--no-run", "tiny", "--input", "1x3x32x32", "layer1.*"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0" in out and "layer2" not in out
    assert main(["layers", "tiny", "--input", "1x3x32x32", "layer1.*"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["layers", "--ops", "tiny", "--input", "1x3x32x32", "layer1.0"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0::" in out and "layer2" not in out


@pytest.mark.parametrize("typed, meant", [("cma", "cam"), ("trcae", "trace"), ("reprot", "report"),
                                          ("sumary", "summary")])
def test_a_command_with_letters_swapped_or_missing_gets_the_closest_one(capsys, typed, meant):
    with pytest.raises(SystemExit) as exit:
        main([typed, "tiny"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"Did you mean {meant!r}?" in err[0], err


# --- --layers: one option, declared once for every command that chooses layers ----------------------
def _layers_action(parser):
    return next((a for a in parser._actions if "--layers" in a.option_strings), None)


def test_every_command_that_chooses_layers_declares_one_layers_option():
    from hookscope.cli import parsers
    from hookscope.cli._common import LAYER_FORMS

    found = {name: _layers_action(p) for name, p in parsers().items() if name}
    for name, action in found.items():
        if name in ("layers", "summary", "runs", "lens", "patch"):  # layers: a PATTERN; summary: the whole tree; runs: a
            # log; lens, patch: component kinds in every block
            continue
        assert action is not None, name
        assert action.option_strings == ["--layers", "--layer"] and action.metavar == "LAYER", name
        assert LAYER_FORMS in action.help, name
        if name not in ("features", "attribute", "generate"):  # each takes one layer
            assert action.nargs == "+" and type(action).__name__ == "_ExtendAction", name


@pytest.mark.parametrize("command", ["trace", "watch", "diff", "prune", "report", "extract", "cam", "demo"])
def test_layers_repeated_add_up_as_several_after_one(command):
    from hookscope.cli import parsers

    p = parsers()[command]
    base = {"demo": [], "extract": ["tiny", "--data", "x.npy", "--out", "s"]}.get(command, ["tiny"])
    if command == "report":
        base = ["tiny", "--out", "r"]
    one = p.parse_args([*base, "--layers", "layer1", "layer2.*"]).layers
    repeated = p.parse_args([*base, "--layer", "layer1", "--layers", "layer2.*"]).layers
    assert one == repeated == ["layer1", "layer2.*"]


def test_trace_keeps_every_repeated_layer(capsys):
    assert main(["trace", "tiny", "--layer", "stem.0", "--layer", "fc", "--json", "--no-inputs"]) == 0
    names = {r["module"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert names == {"stem.0", "fc"}


def test_a_second_layer_for_features_is_refused_not_taken_instead(capsys, tmp_path):
    err = _refused(capsys, ["features", "tiny", "--layer", "layer1", "--layer", "layer2",
                            "--out", str(tmp_path / "f.png")])
    assert err.strip().splitlines()[-1].endswith(
        "--layer layer2: this command takes one layer and 'layer1' is given already; give --layers once "
        "(see hookscope features --help)")
    assert not (tmp_path / "f.png").exists()


def test_demo_takes_its_layers_as_words_or_with_layers(capsys):
    outs = []
    for argv in (["layer1.[03]"], ["--layers", "layer1.[03]"]):
        assert main(["demo", *argv, "--batch", "1", "--no-report", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and [r["layer"] for r in outs[0]["layers"]] == ["layer1.0", "layer1.3"]


# --- what the README, the home page and --help say the command line does ---------------------------
ROOT = Path(__file__).resolve().parents[1]


def _options(parser):
    return {s for a in parser._actions for s in a.option_strings}


def test_the_readme_says_which_commands_take_json_weights_and_layers():
    from hookscope.cli import COMMAND_NAMES, parsers

    text = " ".join((ROOT / "README.md").read_text().split())
    claims = re.findall(r"[Ee]very command(?: but ((?:`\w+`(?:,| and)? ?)+))? takes `(--[\w-]+)`", text)
    assert {option for _, option in claims} == {"--json", "--weights", "--layers"}, claims
    found = parsers()
    for but, option in claims:
        left_out = set(re.findall(r"`(\w+)`", but))
        assert left_out <= set(COMMAND_NAMES)
        taking = {name for name in COMMAND_NAMES if option in _options(found[name])}
        assert taking == set(COMMAND_NAMES) - left_out, (option, sorted(taking ^ (set(COMMAND_NAMES) - left_out)))


def test_every_command_is_in_the_help_and_on_the_command_line_page(capsys):
    from hookscope.cli import COMMAND_NAMES

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    page = (ROOT / "docs" / "guide" / "command-line.md").read_text()
    for name in COMMAND_NAMES:
        assert re.search(rf"^    {name}\b", shown, re.M), f"hookscope --help does not list {name}"
        assert re.search(rf"^  {re.escape(name)}\b|[ ,]{re.escape(name)}[ ,]", shown.split("positional")[0], re.M), \
            f"hookscope --help's description does not say what {name} does"
        assert f"`hookscope {name}" in page, f"docs/guide/command-line.md does not show hookscope {name}"


FEATURES = {  # a feature, and the words that name it (any one of them)
    "capture": ("capture",), "edit": ("edit",), "grads": ("grads",), "operations": ("::",),
    "attention": ("attention",), "gradient attribution": ("gradient methods", "integrated gradients"),
    "LRP": ("LRP",), "token attribution": ("attribute_tokens", "tokens"), "CAM": ("CAM",),
    "feature maps": ("feature",), "extract": ("extract",), "prune masks": ("mask",),
    "channels": ("channels",), "heads": ("heads",), "widths": ("width",), "compaction": ("compact",),
    "summary": ("summary",), "trace": ("trace",), "watch": ("watch",), "gradient flow": ("gradient flow", "gradflow"),
    "diff": ("diff",), "report": ("report",), "load_images": ("load_images",),
    "example_input": ("example_input",), "tokenize": ("tokenize",), "notebooks": ("notebook",),
    "pandas": ("pandas",), "monitor": ("monitor",), "step memory": ("step_memory", "step memory", "step-memory"),
}


@pytest.mark.parametrize("where", ["README.md", "docs/index.md", "ARCHITECTURE.md", "hookscope --help"])
def test_every_feature_is_listed(where, capsys):
    if where == "hookscope --help":
        with pytest.raises(SystemExit):
            main(["--help"])
        text = capsys.readouterr().out
    else:
        text = (ROOT / where).read_text()
    missing = [f for f, words in FEATURES.items() if not any(w.lower() in text.lower() for w in words)]
    assert missing == [], f"{where} does not name {missing}"
