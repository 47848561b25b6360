"""Real processes forked from one that has already imported ``torch`` and ``hookscope``, for tests that start,
kill and resume many short jobs (starting ``python`` and importing torch takes seconds each time here).

``Forks(env)`` starts the server process; ``forks.start(argv, code=...)`` forks a child of it that runs a script
(``argv[0]``, as ``python SCRIPT ARGS`` runs it) or a code string (``python -c CODE ARGS``), with ``sys.argv`` set
and its stdout and stderr written to files; the child is a process of its own, with its own pid, that
``os.kill(pid, SIGKILL)`` kills like any other. ``forks.poll(pid)`` and ``forks.wait(pid)`` give its exit status
(negative: killed by that signal), ``forks.run(...)`` starts one and waits for it. Only ``torch``, ``hookscope``
and the modules named by ``preload`` are imported before the fork, and nothing runs: no thread pool is started
that a child inherits. The tests share one server, conftest's session fixture ``forks``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import json, os, runpy, sys, traceback
import torch, hookscope

def child(req):
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.stdin = open(os.devnull)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        sys.argv = req["argv"]
        os.environ.update(req["env"])
        if req["code"] is None:
            sys.path[0] = os.path.dirname(os.path.abspath(req["argv"][0]))
            runpy.run_path(req["argv"][0], run_name="__main__")
        else:
            sys.path[0] = ""
            exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "start":
        pid = os.fork()
        if pid == 0:
            child(req)
        answer = pid
    else:
        pid, status = os.waitpid(req["pid"], os.WNOHANG if req["op"] == "poll" else 0)
        answer = os.waitstatus_to_exitcode(status) if pid else None
    print(json.dumps(answer), flush=True)
"""


@dataclass(frozen=True)
class Done:
    """A finished child: its exit status and what it wrote."""

    returncode: int
    stdout: str
    stderr: str


class Forks:
    """One server process; every child is forked from it."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()) -> None:
        imports = "".join(f"import {name}\n" for name in preload)
        self.server = subprocess.Popen([sys.executable, "-c", imports + SERVER], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, text=True)
        self.folder = Path(tempfile.mkdtemp(prefix="forks-"))
        self.outputs: dict[int, tuple[Path, Path]] = {}
        self.codes: dict[int, int] = {}

    def _ask(self, **req: object) -> object:
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.write(json.dumps(req) + "\n")
        self.server.stdin.flush()
        line = self.server.stdout.readline()
        assert line, f"the fork server ended with status {self.server.wait()}"
        return json.loads(line)

    def start(self, argv: list[str], code: str | None = None, env: dict[str, str] | None = None) -> int:
        """Fork a child running ``argv[0]`` (or ``code``, with ``argv`` as ``sys.argv``); its pid."""
        n = len(self.outputs)
        out, err = self.folder / f"{n}.out", self.folder / f"{n}.err"
        out.touch()
        err.touch()
        pid = self._ask(op="start", argv=argv, code=code, env=env or {}, stdout=str(out), stderr=str(err))
        assert isinstance(pid, int)
        self.outputs[pid] = out, err
        return pid

    def poll(self, pid: int) -> int | None:
        """The child's exit status once it has ended, else None."""
        if pid not in self.codes:
            code = self._ask(op="poll", pid=pid)
            if code is None:
                return None
            assert isinstance(code, int)
            self.codes[pid] = code
        return self.codes[pid]

    def wait(self, pid: int) -> Done:
        """Wait for the child to end: its exit status, stdout and stderr."""
        if pid not in self.codes:
            code = self._ask(op="wait", pid=pid)
            assert isinstance(code, int)
            self.codes[pid] = code
        out, err = self.outputs[pid]
        return Done(self.codes[pid], out.read_text(), err.read_text())

    def printed(self, pid: int) -> str:
        """What the child has written to its stdout so far."""
        return self.outputs[pid][0].read_text()

    def run(self, argv: list[str], code: str | None = None, env: dict[str, str] | None = None) -> Done:
        return self.wait(self.start(argv, code, env))

    def close(self) -> None:
        """Kill the children still running (a test that failed half way), then end the server."""
        for pid in self.outputs:
            if self.poll(pid) is None:
                os.kill(pid, signal.SIGKILL)
                self.wait(pid)
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)
