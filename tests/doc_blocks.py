"""What the documentation tests share: the code blocks of a Markdown page, the examples of a command's
``--help``, and running a shell line of either in this process.

Fences: ```python and ```bash blocks run; ```text (output samples) and ```shell (set-up commands such
as ``pip install``) are shown only. A shell line runs in-process: ``hookscope ARGS`` as
``hookscope.cli.main(ARGS)``, ``python -c CODE`` as ``exec(CODE)``, and ``torchrun ... -m hookscope ARGS``
as one process of ``hookscope ARGS`` (the ranks' split is tested by tests/test_extract_process.py).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from hookscope.cli import main

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   flags=re.S | re.M)
RUN = ("python", "bash")
SHOWN = ("text", "shell")
STARTS = ("hookscope ", "python -c ", "torchrun ")
ANSWERS = {"diff": (0, 1), "watch": (0, 1), "runs": (0, 1)}  # exit 1 is an answer there: the runs differ, a value is not finite


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # where the block's first line of code is in the page


def blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order, with its language (``""`` when none is given)."""
    found = []
    for m in FENCE.finditer(text):
        indent = m.group("indent")
        body = "\n".join(line[len(indent):] for line in m.group("body").splitlines())
        found.append(Block(m.group("lang"), body + "\n", text.count("\n", 0, m.start("body")) + 1))
    return found


def shell_lines(code: str) -> list[str]:
    """The commands of a shell block: ``\\`` continuations joined, blank lines and comments dropped."""
    joined = re.sub(r"\\\n[ \t]*", " ", code)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def help_examples(help_text: str) -> list[str]:
    """The commands under ``Example:`` / ``Examples:`` of a ``--help`` text.

    A command starts two spaces in and may go on over lines that end with ``\\``; a line indented further
    says what the command above it shows. Any other line two spaces in is an example that the help
    wrapped (it could not be copied as it stands), and fails.
    """
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() in ("Example:", "Examples:"))
    commands: list[str] = []
    current: str | None = None
    for line in lines[start + 1:]:
        if not line.strip() or not line.startswith(" "):
            break
        if current is not None:
            current += " " + line.strip()
        elif not line.startswith("   "):
            assert line.strip().startswith(STARTS), f"an example line that is not a command: {line!r}"
            current = line.strip()
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        commands.append(current)
        current = None
    assert current is None, f"an example ends with a backslash: {current!r}"
    return commands


def help_text(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([command, "--help"])
    return out.getvalue()


def run_line(line: str) -> tuple[int, str]:
    """Run one shell line in the current folder; its exit status and what it printed (stdout, stderr)."""
    words = shlex.split(line, comments=True)
    target = None
    if ">" in words:
        at = words.index(">")
        words, target = words[:at], words[at + 1]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if words[:2] == ["python", "-c"]:
            exec(compile(words[2], "<python -c>", "exec"), {"__name__": "__main__"})  # noqa: S102 - our docs
            status = 0
        else:
            if words[0] == "torchrun":
                words = words[words.index("-m") + 1:]
            assert words[0] == "hookscope", f"not a command the tests can run: {line!r}"
            try:
                status = main(words[1:])
            except SystemExit as e:  # argparse's own exits: --help, a mistake in the command line
                status = e.code if isinstance(e.code, int) else 2
    if target is not None:
        Path(target).write_text(out.getvalue())
    return status, out.getvalue()[-3000:] + err.getvalue()[-3000:]


def check_line(line: str) -> None:
    """Run a shell line; fail unless it exits 0 (or 1 where 1 is an answer: diff, watch)."""
    status, printed = run_line(line)
    words = shlex.split(line)
    command = words[words.index("hookscope") + 1] if "hookscope" in words else ""
    assert status in ANSWERS.get(command, (0,)), f"{line}\nexit {status}\n{printed}"
