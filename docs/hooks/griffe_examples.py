"""Griffe extension for the API reference, for two habits of hookscope's docstrings: runnable examples
headed ``Example:`` (Google style), which Griffe would render as prose, are read as an ``Examples:``
section, so the ``>>>`` lines and their output are shown as code; and Sphinx roles
(``:class:`~hookscope.RecordError```) are shown as code (``RecordError``), not as raw markup."""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", flags=re.M)
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`(?P<short>~?)(?P<target>[^`]+)`")


def _role(m: re.Match[str]) -> str:
    target = m.group("target").rstrip("()")
    shown = target.rsplit(".", 1)[-1] if m.group("short") else target
    return f"`{shown}`"


class ExampleSections(griffe.Extension):
    """``Example:`` read as ``Examples:``, and Sphinx roles as code, in every docstring."""

    def on_instance(self, *, node: ast.AST | griffe.ObjectNode, obj: griffe.Object, agent: Any,
                    **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _EXAMPLE.sub(r"\g<indent>Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(_role, value)
