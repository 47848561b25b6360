"""The layering holds by test: no private names read across modules, analyses side by side (none
imports another), core at the bottom, and no function over 60 lines of code."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "hookscope"
FILES = sorted(p for p in SRC.rglob("*.py"))
MAX_LINES = 60


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module imported from, names imported, line) for every ``from ... import``."""
    tree = ast.parse(path.read_text())
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((target, [a.name for a in node.names], node.lineno))
    return found


def _is_analysis(module: str) -> bool:
    parts = module.split(".")
    return len(parts) == 3 and parts[1] == "analysis" and not parts[2].startswith("_")


def test_no_private_name_is_imported_from_another_module():
    bad = [f"{p.relative_to(SRC)}:{line} imports {n} from {target}"
           for p in FILES for target, names, line in _imports(p) for n in names
           if n.startswith("_") and not n.startswith("__") and target != _module(p)
           and target.startswith("hookscope")]
    assert not bad, "\n".join(bad)


def test_analyses_do_not_import_each_other():
    bad = [f"{p.relative_to(SRC)}:{line} imports {target}"
           for p in FILES if _is_analysis(_module(p))
           for target, names, line in _imports(p)
           if target != _module(p) and (_is_analysis(target) or any(
               _is_analysis(f"{target}.{n}") for n in names))]
    assert not bad, "\n".join(bad)


def test_core_and_selection_import_nothing_above_them():
    low = [p for p in FILES if _module(p).startswith(("hookscope.core", "hookscope.selection",
                                                      "hookscope.errors", "hookscope._tree"))]
    high = ("hookscope.capture", "hookscope.edit", "hookscope.grads", "hookscope.analysis",
            "hookscope.viz", "hookscope.cli", "hookscope.records")
    bad = [f"{p.relative_to(SRC)}:{line} imports {target}"
           for p in low for target, _, line in _imports(p) if target.startswith(high)]
    assert not bad, "\n".join(bad)


def _code_lines(source: str, node: ast.AST) -> int:
    """Lines of a function that hold code: no blank lines, comments or docstring."""
    lines = source.splitlines()[node.lineno - 1: node.end_lineno]  # type: ignore[attr-defined]
    body = getattr(node, "body", [])
    doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str) else None
    skip = set(range(doc.lineno, doc.end_lineno + 1)) if doc else set()
    count = 0
    for i, text in enumerate(lines, start=node.lineno):
        stripped = text.strip()
        if stripped and not stripped.startswith("#") and i not in skip:
            count += 1
    return count


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_function_is_over_60_lines_of_code(path):
    source = path.read_text()
    long = [f"{node.name} ({n} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := _code_lines(source, node)) > MAX_LINES]
    assert not long, f"{path.relative_to(SRC)}: {', '.join(long)}"
