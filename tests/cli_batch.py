"""Many ``hookscope`` command lines run by one real process, for tests that would otherwise start ``torch``
once per command line (about 4 s each here).

``Batch.add(*argv, cwd=...)`` gathers command lines; the first ``batch[i]`` runs them all, in order, each as
``python -m hookscope ARGV`` runs it (``hookscope.cli.main``, ``SystemExit`` turned into the exit status, an
escaping exception printed as a traceback), in its own folder and environment, with its stdout and stderr caught.
``Session`` is the same process answering one command line at a time, for tests that each run a few: conftest's
session fixture ``hookscope_process`` is one for the whole run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


@dataclass(frozen=True)
class Ran:
    """What one command line did: its exit status and what it wrote."""

    returncode: int
    stdout: str
    stderr: str


DRIVER = r"""
import builtins, contextlib, io, _io, json, os, sys, traceback
from hookscope.cli import main

def deny(opener, target):
    def wrapped(file, *args, **kwargs):
        if str(file) == target:
            raise PermissionError(13, "Permission denied", str(file))
        return opener(file, *args, **kwargs)
    return wrapped

def run(case):
    os.chdir(case["cwd"])
    os.environ.update(case["env"])
    opened = builtins.open, _io.open_code
    if case["deny"]:  # root reads anything: open() refuses this one file as it would for another user
        builtins.open, _io.open_code = deny(builtins.open, case["deny"]), deny(_io.open_code, case["deny"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(case["argv"])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    builtins.open, _io.open_code = opened
    for key in case["env"]:
        del os.environ[key]
    return [code, out.getvalue(), err.getvalue()]

if sys.argv[1:] == ["--session"]:
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)
else:
    print(json.dumps([run(case) for case in json.load(sys.stdin)]))
"""


class Batch:
    """Command lines gathered while the module's fixtures are built, all run by one process on first use."""

    def __init__(self, preexec_fn: Callable[[], None] | None = None) -> None:
        self.cases: list[dict[str, object]] = []
        self.results: list[Ran] | None = None
        self.preexec_fn = preexec_fn

    def add(self, *argv: str, cwd: Path, env: dict[str, str] | None = None, deny: Path | None = None) -> int:
        self.cases.append({"argv": list(argv), "cwd": str(cwd), "env": env or {}, "deny": deny and str(deny)})
        return len(self.cases) - 1

    def __getitem__(self, i: int) -> Ran:
        if self.results is None:
            done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(self.cases), env=ENV,
                                  capture_output=True, text=True, timeout=600,
                                  preexec_fn=self.preexec_fn)
            assert done.returncode == 0, done.stderr[-3000:]
            self.results = [Ran(*r) for r in json.loads(done.stdout.splitlines()[-1])]
        return self.results[i]


class Session:
    """One process that runs each command line as it is given (``run``), as ``Batch`` runs them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, "--session"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=ENV, text=True)

    def run(self, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> Ran:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        case = {"argv": list(argv), "cwd": str(cwd), "env": env or {}, "deny": None}
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the hookscope process ended with status {self.proc.wait()}"
        return Ran(*json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
