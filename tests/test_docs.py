"""The README's Python blocks, every module's docstring examples and every example in every command's
``--help`` run as written."""

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import hookscope
from doc_blocks import check_line, help_examples, help_text
from hookscope.cli import COMMAND_NAMES

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(hookscope.__path__, "hookscope.")
    if not m.name.endswith("__main__")
)


def _has_examples(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None and ">>>" in Path(spec.origin).read_text()


@pytest.mark.parametrize("name", ["hookscope", *MODULES])
def test_docstring_examples(name):
    if not _has_examples(name):
        return
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has examples, but doctest ran none of them"
    assert result.failed == 0


def test_every_module_is_found():
    assert "hookscope.core.guard" in MODULES and "hookscope.analysis.diff" in MODULES
    assert len(MODULES) >= 30


@pytest.mark.slow
def test_readme_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 3
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert scope["g"]["a"].grad.item() == 2.0 and scope["w"].grad.item() == 15.0
    assert scope["rec"].stopped


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    """An empty current folder, no network, an empty hub cache and no figure windows."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "80")
    return work


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_help_examples_run(command, empty_folder):
    """Each example of ``hookscope COMMAND --help`` runs as printed, in order, in one empty folder (an
    example may read what an earlier one wrote)."""
    examples = help_examples(help_text(command))
    assert examples, f"hookscope {command} --help has no examples"
    for line in examples:
        check_line(line)
