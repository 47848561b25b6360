"""The README's Python blocks and the core modules' docstring examples run as written."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = [
    "hookscope",
    "hookscope.selection",
    "hookscope.core.hooks",
    "hookscope.records",
    "hookscope.capture",
    "hookscope.edit",
    "hookscope.grads",
    "hookscope.zoo",
    "hookscope._json",
    "hookscope.analysis.stats",
    "hookscope.analysis.watch",
    "hookscope.analysis.gradflow",
    "hookscope.analysis._reduce",
]


@pytest.mark.parametrize("name", CORE)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.mark.slow
def test_readme_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 3
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert scope["g"]["a"].grad.item() == 2.0 and scope["w"].grad.item() == 15.0
    assert scope["rec"].stopped
