"""Real processes: an extract killed with SIGKILL at several moments and resumed gives the same store, byte
for byte, as an uninterrupted run, also when a shard it left was damaged afterwards or its loader workers live
on; two ranks under torchrun (gloo, DDP-wrapped model) give the same store as one process at the same number
of threads. The single-process jobs are forked from one process that has imported torch and hookscope
(``forked.Forks``): each is still a process of its own, SIGKILLed as any other, without starting torch anew."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from forked import Forks

import hookscope
from hookscope.errors import HookscopeError
from hookscope.store import write_json

JOB = str(Path(__file__).with_name("extract_job.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


def _run(forks: Forks, out: Path, *flags: str) -> str:
    """Run the job to its end in a process of its own; its stderr."""
    done = forks.run([JOB, str(out), *flags])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


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
def reference(tmp_path_factory: pytest.TempPathFactory, forks: Forks) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "store"
    _run(forks, out)
    return _files(out)


def _kill_after(forks: Forks, out: Path, seconds: float, *flags: str, first_shard: bool = False) -> None:
    """Start a slow run, SIGKILL it ``seconds`` after its manifest appears (``first_shard``: after its
    first shard is under its final name, however busy the machine) or when it ends."""
    pid = forks.start([JOB, str(out), "--delay", "0.02", *flags])
    try:
        deadline = time.monotonic() + 120
        while not (out / "manifest.json").exists() and forks.poll(pid) is None and time.monotonic() < deadline:
            time.sleep(0.005)
        while first_shard and not list((out / "shards").glob("0*.safetensors")) and forks.poll(pid) is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(seconds)
        if forks.poll(pid) is None:
            os.kill(pid, signal.SIGKILL)
    finally:
        forks.wait(pid)


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [0.0, 0.45, 0.95])  # before the first shard, half way, near the end
def test_killed_and_resumed_is_byte_identical(tmp_path: Path, forks: Forks, reference: dict[str, bytes],
                                              seconds: float) -> None:
    out = tmp_path / "store"
    _kill_after(forks, out, seconds)
    assert json.loads((out / "manifest.json").read_text())["complete"] is False  # killed before the end
    shards = sorted(p.name for p in (out / "shards").iterdir() if not p.name.startswith("."))
    for name in shards:  # whatever was under a final name when the process died is complete
        assert (out / "shards" / name).read_bytes() == reference[f"shards/{name}"]
    _run(forks, out, "--resume")
    assert _files(out) == reference


@pytest.mark.slow
def test_killed_twice_then_resumed(tmp_path: Path, forks: Forks, reference: dict[str, bytes]) -> None:
    out = tmp_path / "store"
    _kill_after(forks, out, 0.2)
    _kill_after(forks, out, 0.2, "--resume")
    _run(forks, out, "--resume")
    assert _files(out) == reference


@pytest.mark.slow
def test_killed_stream_resumes_identically(tmp_path: Path, forks: Forks) -> None:
    ref = tmp_path / "ref"
    _run(forks, ref, "--stream")
    out = tmp_path / "store"
    _kill_after(forks, out, 0.25, "--stream")
    _run(forks, out, "--stream", "--resume")
    assert _files(out) == _files(ref)


def _torchrun(*argv: str) -> subprocess.CompletedProcess[str]:
    """Two ranks (gloo) of ``argv`` under torchrun (torch.distributed.run, shipped with torch itself: always
    here, never skipped); each launch has one process group (a second group in the same launch can hang)."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *argv], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The DDP-wrapped job's store under two ranks, and what the ranks printed."""
    out = tmp_path_factory.mktemp("ranks") / "ddp"
    done = _torchrun(JOB, str(out), "--ddp")
    return out, done.stdout


@pytest.mark.slow
def test_two_ranks_under_torchrun_equal_one_process(torchrun: tuple[Path, str],
                                                    reference: dict[str, bytes]) -> None:
    out, printed = torchrun
    assert printed.count("done") == 2  # both ranks finished (their lines may interleave)
    assert _files(out) == reference
    store = hookscope.open_store(out)
    assert store.indices.tolist() == list(range(57))
    assert torch.isfinite(store["3"][:]).all()


def _flip(path: Path, back: int = 1) -> None:
    """Flip one bit of the byte ``back`` bytes before the end (inside the data of the last tensor)."""
    data = bytearray(path.read_bytes())
    data[-back] ^= 0x10
    path.write_bytes(bytes(data))


def _unfinished(out: Path) -> None:
    """The manifest as a killed run leaves it: its settings, not complete, no shard list."""
    m = json.loads((out / "manifest.json").read_text())
    for key in ("samples", "shards"):
        m.pop(key)
    write_json(out / "manifest.json", {**m, "complete": False})


def _strip_checksum(path: Path) -> None:
    """Rewrite a shard as a hookscope without shard checksums wrote it: the same data, no CRC_KEY."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"].pop("hookscope_crc32")
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])


DAMAGES = {"000001": "flipped data byte", "000002": "flipped header byte", "000003": "no checksum",
           "000004": "truncated"}


def _damage(shard: Path, damage: str) -> None:
    if damage == "flipped data byte":
        _flip(shard, back=3)
    elif damage == "flipped header byte":
        data = bytearray(shard.read_bytes())
        data[data.index(b'"hookscope_crc32":"') + 20] ^= 0x01  # a digit of the checksum itself
        shard.write_bytes(bytes(data))
    elif damage == "no checksum":
        _strip_checksum(shard)
    else:
        shard.write_bytes(shard.read_bytes()[:-7])


@pytest.mark.slow
def test_a_damaged_shard_is_refused_when_read_and_written_again_on_resume(tmp_path: Path, forks: Forks,
                                                                          reference: dict[str, bytes]) -> None:
    """A finished store is never rewritten; read, a damaged shard is refused; resumed as unfinished, each
    damaged shard (one damage each: data, the checksum in the header, no checksum, cut short) is written again."""
    out = tmp_path / "store"
    _run(forks, out)
    _damage(out / "shards" / "000001.safetensors", DAMAGES["000001"])
    _run(forks, out, "--resume")  # a finished store: checked against the settings, nothing written, nothing removed
    with pytest.raises(HookscopeError, match=r"000001\.safetensors is corrupted"):
        hookscope.open_store(out)["3"][12]
    for number, damage in DAMAGES.items():
        if number != "000001":
            _damage(out / "shards" / f"{number}.safetensors", damage)
    for number, damage in DAMAGES.items():
        assert (out / "shards" / f"{number}.safetensors").read_bytes() != reference[f"shards/{number}.safetensors"]
    _unfinished(out)
    err = _run(forks, out, "--resume")
    for number, damage in DAMAGES.items():
        said = [line for line in err.splitlines() if f"{number}.safetensors was removed and is written again" in line]
        assert len(said) == 1, (damage, err)
    assert _files(out) == reference  # bit for bit the clean run's store, certified
    assert torch.isfinite(hookscope.open_store(out)["3"][:]).all()  # every shard read back, crc32s checked


@pytest.mark.slow
def test_killed_then_a_kept_shard_damaged_resumes_identically(tmp_path: Path, forks: Forks,
                                                              reference: dict[str, bytes]) -> None:
    out = tmp_path / "store"
    _kill_after(forks, out, 0.0, first_shard=True)
    kept = sorted((out / "shards").glob("0*.safetensors"))
    assert kept and json.loads((out / "manifest.json").read_text())["complete"] is False
    _flip(kept[0], back=100)
    _run(forks, out, "--resume")
    assert _files(out) == reference


_WORKERS = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import torch, hookscope
    import extract_job
    from extract_job import LAYERS, SHARD, SIZE, build

    class Samples(extract_job.Samples):  # loader workers stall once shard 1 is written, saying so in a file
        def __getitem__(self, i):
            if os.path.exists(f"{sys.argv[1]}/shards/000001.safetensors") and float(sys.argv[3]) \
                    and torch.utils.data.get_worker_info() is not None:
                open(f"{sys.argv[1]}.stalled", "w").close()
                time.sleep(float(sys.argv[3]))
            return super().__getitem__(i)

    torch.set_num_threads(1)
    hookscope.extract(build(), Samples(SIZE), layers=LAYERS, out=sys.argv[1], batch_size=5, shard_size=SHARD, workers=2,
                      resume="--resume" in sys.argv, progress=False)
""")


def _children(pid: int) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        if d.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(d))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the loader's workers in /proc")
def test_a_run_killed_with_loader_workers_is_resumed_at_once(tmp_path: Path, forks: Forks,
                                                             reference: dict[str, bytes]) -> None:
    out = tmp_path / "store"
    here = str(Path(JOB).parent)
    pid = forks.start(["-c", str(out), here, "300"], code=_WORKERS)
    workers: list[int] = []
    stalled = Path(f"{out}.stalled")
    try:
        deadline = time.monotonic() + 120
        while not stalled.exists() and forks.poll(pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if forks.poll(pid) is not None:  # say why, rather than fail at the kill of a job that is gone
            ended = forks.wait(pid)
            pytest.fail(f"the job ended (exit {ended.returncode}) before its loader stalled: {ended.stderr[-2000:]}")
        workers = _children(pid)
        os.kill(pid, signal.SIGKILL)
        assert forks.wait(pid).returncode == -signal.SIGKILL
        assert len(workers) == 2 and all(_pid_alive(w) for w in workers)  # orphaned, stalled in a sample
        done = forks.run(["-c", str(out), here, "0", "--resume"], code=_WORKERS)
        assert done.returncode == 0, done.stderr[-2000:]
        assert any(_pid_alive(w) for w in workers)  # they lived on all the while the resumed run wrote
        assert _files(out) == reference
    finally:
        for w in workers:
            if _pid_alive(w):
                os.kill(w, signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


_THREADS = textwrap.dedent("""
    import os, sys
    import torch, hookscope
    from torch import nn
    torch.set_num_threads(int(sys.argv[2]))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 256), nn.ReLU()).eval()  # a long dot product: threads split it
    data = torch.randn(30, 4096, generator=torch.Generator().manual_seed(1))
    if "RANK" in os.environ:
        torch.distributed.init_process_group("gloo")
    hookscope.extract(model, data, layers="0", out=sys.argv[1], batch_size=5, shard_size=10 * (256 * 4 + 8),
                      progress=False)
    if "RANK" in os.environ:
        torch.distributed.destroy_process_group()
""")


@pytest.mark.slow
def test_ranks_equal_one_process_at_the_same_number_of_threads(tmp_path: Path, forks: Forks) -> None:
    """Two threads per process (one thread per process is the torchrun case above)."""
    threads = 2
    job = tmp_path / "job.py"
    job.write_text(_THREADS)
    one, two = tmp_path / "one", tmp_path / "two"
    done = forks.run([str(job), str(one), str(threads)])
    assert done.returncode == 0, done.stderr[-2000:]
    _torchrun(str(job), str(two), str(threads))
    assert len(list((one / "shards").iterdir())) == 3
    assert _files(one) == _files(two)
