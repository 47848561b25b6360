"""mkdocs hook: the command reference page (reference/cli.md), written at build time from each command's
``--help``, so it always says what the installed ``hookscope`` says."""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from mkdocs.structure.files import File, Files

from hookscope.cli import COMMAND_NAMES, main

PAGE = "reference/cli.md"
WIDTH = "80"  # help text is wrapped as on a terminal of this width, whatever the one that builds the site


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
    return out.getvalue().rstrip()


def _page() -> str:
    parts = [
        "# Command reference",
        "",
        "Every command's `--help`, as `hookscope` prints it (this page is built from the installed "
        "command). Every example under *Examples* runs offline from an empty folder: the tests run them "
        "all. `--json` prints only JSON on standard output; a mistake is one line on standard error and "
        "exit status 2 (`--debug` prints the traceback too).",
        "",
        "## hookscope",
        "",
        "```text",
        _help(["--help"]),
        "```",
    ]
    for name in COMMAND_NAMES:
        parts += ["", f"## hookscope {name}", "", "```text", _help([name, "--help"]), "```"]
    return "\n".join(parts) + "\n"


def on_files(files: Files, config: Any) -> Files:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        content = _page()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    files.append(File.generated(config, PAGE, content=content))
    return files
