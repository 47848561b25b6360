"""Griffe extension for the API reference: hookscope's docstrings head their runnable examples with
``Example:`` (Google style), which Griffe would render as prose; read it as an ``Examples:`` section,
so the ``>>>`` lines and their output are shown as code."""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", flags=re.M)


class ExampleSections(griffe.Extension):
    """``Example:`` read as ``Examples:`` in every docstring."""

    def on_instance(self, *, node: ast.AST | griffe.ObjectNode, obj: griffe.Object, agent: Any,
                    **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\g<indent>Examples:", obj.docstring.value)
