"""Real processes: an extract killed with SIGKILL at several moments and resumed gives the same store, byte
for byte, as an uninterrupted run; two ranks under torchrun (gloo, DDP-wrapped model) give the same store as
one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hookscope

JOB = str(Path(__file__).with_name("extract_job.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


def _run(out: Path, *flags: str) -> None:
    done = subprocess.run([sys.executable, JOB, str(out), *flags], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a store by relative path; the manifest without its creation time."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":
                m = json.loads(data)
                m.pop("created")
                data = json.dumps(m, sort_keys=True).encode()
            found[str(path.relative_to(root))] = data
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "store"
    _run(out)
    return _files(out)


def _kill_after(out: Path, seconds: float, *flags: str) -> None:
    """Start a slow run, SIGKILL it ``seconds`` after its manifest appears (or when it ends)."""
    proc = subprocess.Popen([sys.executable, JOB, str(out), "--delay", "0.02", *flags], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(seconds)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [0.0, 0.2, 0.45, 0.7, 0.95])
def test_killed_and_resumed_is_byte_identical(tmp_path: Path, reference: dict[str, bytes], seconds: float) -> None:
    out = tmp_path / "store"
    _kill_after(out, seconds)
    assert json.loads((out / "manifest.json").read_text())["complete"] is False  # killed before the end
    shards = sorted(p.name for p in (out / "shards").iterdir() if not p.name.startswith("."))
    for name in shards:  # whatever was under a final name when the process died is complete
        assert (out / "shards" / name).read_bytes() == reference[f"shards/{name}"]
    _run(out, "--resume")
    assert _files(out) == reference


@pytest.mark.slow
def test_killed_twice_then_resumed(tmp_path: Path, reference: dict[str, bytes]) -> None:
    out = tmp_path / "store"
    _kill_after(out, 0.2)
    _kill_after(out, 0.2, "--resume")
    _run(out, "--resume")
    assert _files(out) == reference


@pytest.mark.slow
def test_killed_stream_resumes_identically(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    _run(ref, "--stream")
    out = tmp_path / "store"
    _kill_after(out, 0.25, "--stream")
    _run(out, "--stream", "--resume")
    assert _files(out) == _files(ref)


@pytest.mark.slow
def test_two_ranks_under_torchrun_equal_one_process(tmp_path: Path, reference: dict[str, bytes]) -> None:
    out = tmp_path / "store"
    # torchrun is torch.distributed.run, shipped with torch itself: always here, never skipped
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", JOB, str(out), "--ddp"],
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("done") == 2  # both ranks finished (their lines may interleave)
    assert _files(out) == reference
    store = hookscope.open_store(out)
    assert store.indices.tolist() == list(range(57))
    assert torch.isfinite(store["3"][:]).all()
