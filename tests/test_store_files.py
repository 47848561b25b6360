"""The store's files and lock, tried as a hostile user would: links never followed when clearing, only our own files ever deleted,
FIFOs and deep JSON refused in one line, the manifest's structure checked, one writer per folder."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from forked import Forks

from hookscope import store as hs
from hookscope.errors import HookscopeError

SPEC = [hs.ArraySpec("a", (2,), torch.float32)]
LINK = "is a symbolic link; hookscope never writes or clears a store through a link"


def _store(root: Path, shards: int = 2, per: int = 2) -> Path:
    """A complete samples store: rows of dataset samples 0..shards*per-1, value of row i = [i, -i]."""
    with hs.StoreWriter(root, SPEC, per) as wr:
        for k in range(shards):
            buf = wr.buffer()
            rows = torch.arange(k * per, (k + 1) * per)
            buf.arrays["a"][:] = torch.stack([rows, -rows], 1).float()
            buf.index[:] = rows
            wr.submit(k, buf, per)
        infos = wr.close()
    hs.write_json(root / "manifest.json", {
        "schema_version": 1, "kind": "samples", "complete": True, "samples_per_shard": per,
        "arrays": [{"name": "a", "shape": [2], "dtype": "float32"}],
        "samples": {"count": shards * per, "ids": None, "skipped": []},
        "shards": [i.to_dict() for i in infos]})
    return root


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _edit(root: Path, change) -> None:
    doc = json.loads((root / "manifest.json").read_text())
    change(doc)
    (root / "manifest.json").write_text(json.dumps(doc))


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""
    def boom(*_: object) -> None:
        raise TimeoutError("hung")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# 1. symlinks are never followed by is_store / clear_store / remove_partial

def test_symlinked_shards_of_another_store_is_refused_and_nothing_is_deleted(tmp_path: Path) -> None:
    other = _store(tmp_path / "other")
    before = _names(other / "shards")
    d = tmp_path / "d"
    d.mkdir()
    (d / "shards").symlink_to(other / "shards")
    for fn in (hs.is_store, hs.clear_store, hs.remove_partial):
        with pytest.raises(HookscopeError, match=f"^{d / 'shards'} {LINK}") as e:
            fn(d)
        assert "\n" not in str(e.value)
    assert _names(other / "shards") == before and (d / "shards").is_symlink()
    assert hs.open_store(other)["a"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_symlinked_manifest_is_refused_and_kept(tmp_path: Path) -> None:
    other = _store(tmp_path / "other")
    d = tmp_path / "d"
    d.mkdir()
    (d / "manifest.json").symlink_to(other / "manifest.json")
    for fn in (hs.is_store, hs.clear_store, hs.remove_partial):
        with pytest.raises(HookscopeError, match=f"^{d / 'manifest.json'} {LINK}"):
            fn(d)
    assert (other / "manifest.json").is_file() and (d / "manifest.json").is_symlink()


def test_symlinked_shard_file_is_foreign_and_its_target_survives(tmp_path: Path) -> None:
    d = _store(tmp_path / "d")
    victim = tmp_path / "precious.bin"
    victim.write_bytes(b"precious")
    os.unlink(hs.shard_path(d, 0))
    hs.shard_path(d, 0).symlink_to(victim)
    assert hs.is_store(d)  # its manifest is ours
    with pytest.raises(HookscopeError, match=r"holds .*/shards/000000\.safetensors, which is not part of a "):
        hs.clear_store(d)
    assert victim.read_bytes() == b"precious" and hs.shard_path(d, 1).is_file()


# 2. is_store: only a folder that is ours; only our tmp names are removed

def test_is_store_only_for_folders_that_are_ours(tmp_path: Path) -> None:
    def case(name: str, files: dict[str, str | None]) -> bool:
        d = tmp_path / name
        (d / "shards").mkdir(parents=True) if "shards/" in files else d.mkdir()
        for rel, text in files.items():
            if text is not None:
                (d / rel).write_text(text)
            elif rel != "shards/":
                (d / rel).mkdir()
        return hs.is_store(d)

    ours = json.dumps({"schema_version": 1, "kind": "samples"})
    assert [case("empty-shards-and-user-files", {"shards/": None, "notes.txt": "x", ".draft.tmp-42": "y"}),
            case("empty-shards-alone", {"shards/": None}),
            case("empty-shards-and-lock", {"shards/": None, hs.LOCK_NAME: "1"}),
            case("lock-only", {hs.LOCK_NAME: "1"}),
            case("web-manifest", {"manifest.json": '{"name": "my web app", "icons": []}'}),
            case("our-manifest", {"manifest.json": ours}),
            case("recording", {"manifest.json": json.dumps({"schema_version": 1, "kind": "recording"})}),
            case("other-kind", {"manifest.json": json.dumps({"schema_version": 1, "kind": "photos"})}),
            case("deep-manifest", {"manifest.json": "[" * 100000 + "]" * 100000}),
            case("manifest-folder", {"manifest.json": None}),
            case("a-shard", {"shards/": None, "shards/000003.safetensors": "x"}),
            case("a-tmp", {"shards/": None, "shards/.000003.safetensors.tmp-9": "x"}),
            case("shard-and-readme", {"shards/": None, "shards/000000.safetensors": "x", "shards/README": "x"}),
            case("folder-named-like-a-shard", {"shards/": None, "shards/000000.safetensors": None}),
            case("shards-a-file", {"shards": "x"}),
            ] == [False, True, True, False, False, True, True, False, False, False, True, True, False, False, False]


def test_remove_partial_and_clear_store_touch_only_our_tmp_names(tmp_path: Path) -> None:
    d = _store(tmp_path)
    (d / ".manifest.json.tmp-5").write_text("{")
    (d / "shards" / ".000002.safetensors.tmp-5").write_bytes(b"part")
    (d / ".config.tmp-7").write_text("a user's file")
    hs.remove_partial(d)
    assert _names(d) == [".config.tmp-7", "manifest.json", "shards"]
    assert _names(d / "shards") == ["000000.safetensors", "000001.safetensors"]
    with pytest.raises(HookscopeError, match=r"holds .*/\.config\.tmp-7, which is not part of a hookscope store"):
        hs.clear_store(d)
    assert _names(d) == [".config.tmp-7", "manifest.json", "shards"]
    os.unlink(d / ".config.tmp-7")
    (d / ".manifest.json.tmp-6").write_text("{")
    hs.clear_store(d)
    assert _names(d) == []


def test_clear_store_keeps_a_users_manifest_next_to_our_shards(tmp_path: Path) -> None:
    d = _store(tmp_path)
    (d / "manifest.json").write_text('{"name": "my web app"}')
    assert hs.is_store(d)  # by its shards
    with pytest.raises(HookscopeError, match=r"holds .*/manifest\.json, which is not part of a hookscope store"):
        hs.clear_store(d)
    assert (d / "manifest.json").read_text() == '{"name": "my web app"}' and len(_names(d / "shards")) == 2


# 3. only regular files are read (a FIFO must not hang)

@pytest.mark.parametrize("where", ["shard", "manifest"])
def test_fifo_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    d = _store(tmp_path)
    path = hs.shard_path(d, 1) if where == "shard" else d / "manifest.json"
    os.unlink(path)
    os.mkfifo(path)
    want = f"^{path} is not a regular file; a store holds only files there"
    with _deadline(10):
        with pytest.raises(HookscopeError, match=want):
            hs.open_store(d)
        if where == "shard":
            with pytest.raises(HookscopeError, match=want):
                hs.complete_shards(d)
        else:
            with pytest.raises(HookscopeError, match=want):
                hs.read_manifest(d)
            assert not hs.is_store(tmp_path / "nothing") and hs.is_store(d)  # by its shards


def test_fifo_in_a_saved_recording_is_refused(tmp_path: Path) -> None:
    hs.save_tensors(tmp_path, {"t": torch.arange(3)}, {"kind": "recording"})
    os.unlink(hs.shard_path(tmp_path, 0))
    os.mkfifo(hs.shard_path(tmp_path, 0))
    with _deadline(10), pytest.raises(HookscopeError, match="000000.safetensors is not a regular file"):
        hs.load_tensors(tmp_path)


def test_a_symlink_to_a_regular_shard_is_read(tmp_path: Path) -> None:
    d = _store(tmp_path / "d")
    moved = tmp_path / "elsewhere.safetensors"
    os.replace(hs.shard_path(d, 1), moved)
    hs.shard_path(d, 1).symlink_to(moved)
    assert hs.open_store(d)["a"][:, 1].tolist() == [0.0, -1.0, -2.0, -3.0]
    assert sorted(hs.complete_shards(d)) == [0, 1]


# 4. deeply nested JSON is one line

@pytest.mark.parametrize("text", ["[" * 100000 + "]" * 100000,
                                  '{"kind": "samples", "schema_version": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}",
                                  '{"kind": "samples", "schema_version": 1, "x": ' + "[" * 70 + "]" * 70 + "}"],
                         ids=["whole", "value", "seventy"])
def test_deeply_nested_manifest_is_one_line(tmp_path: Path, text: str) -> None:
    d = _store(tmp_path)
    (d / "manifest.json").write_text(text)
    for fn in (hs.read_manifest, hs.open_store):
        with pytest.raises(HookscopeError, match=r"manifest\.json is nested more than 64 levels deep: it is "
                                                 r"truncated or corrupted") as e:
            fn(d)
        assert "\n" not in str(e.value)
    assert not hs.is_store(tmp_path / "nothing")


def test_deeply_nested_shard_header_is_one_line(tmp_path: Path) -> None:
    d = _store(tmp_path)
    head = b'{"a":' + b"[" * 50000 + b"]" * 50000 + b"}"
    head += b" " * (-len(head) % 8)
    raw = len(head).to_bytes(8, "little") + head
    hs.shard_path(d, 0).write_bytes(raw)
    _edit(d, lambda m: m["shards"][0].update(bytes=len(raw)))
    want = r"000000\.safetensors is not a valid shard \(its header is nested too deeply\)"
    for fn in (hs.complete_shards, hs.open_store):
        with pytest.raises(HookscopeError, match=want):
            fn(d)


# 5. the manifest's structure

@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(shards=m["shards"][::-1]),
     r"lists shard 1 \(shards/000001\.safetensors\) as entry 0; entry 0 must be shard 0 in shards/000000"),
    (lambda m: m["shards"][0].update(shard=7),
     r"lists shard 7 \(shards/000000\.safetensors\) as entry 0; entry 0 must be shard 0"),
    (lambda m: m["samples"].update(skipped=5), r"has a 'samples\.skipped' that is not a list of objects"),
    (lambda m: m["samples"].update(skipped=[3]), r"has a 'samples\.skipped' that is not a list of objects"),
    (lambda m: m["samples"].update(ids=[0, 1, 2, 3]), r"lists a sample id that is not a string \(int 0\)"),
], ids=["reversed", "renumbered", "skipped-int", "skipped-of-ints", "int-ids"])
def test_manifest_structure_is_checked(tmp_path: Path, change, message: str) -> None:
    d = _store(tmp_path)
    _edit(d, change)
    with pytest.raises(HookscopeError, match=rf"^{d / 'manifest.json'} {message}.*; run the extract again"):
        hs.open_store(d)


def test_unknown_top_level_keys_are_fine(tmp_path: Path) -> None:
    d = _store(tmp_path)
    _edit(d, lambda m: m.update(future={"nested": [1, {"x": 2}]}, note="hi"))
    s = hs.open_store(d)
    assert s.indices.tolist() == [0, 1, 2, 3] and s.ids == ["0", "1", "2", "3"]


@pytest.mark.parametrize("index, row, seen, after", [([0, 0], 0, 0, 1), ([3, 2], 1, 2, 3), ([1, 3], 0, 1, 1)],
                         ids=["duplicate", "decreasing", "below-the-previous-shard"])
def test_index_must_increase_checked_when_read(tmp_path: Path, index: list[int], row: int, seen: int,
                                               after: int) -> None:
    d = _store(tmp_path / "d")
    path = hs.shard_path(d, 1)
    with hs.StoreWriter(tmp_path / "redo", SPEC, 2) as wr:  # the same shard 1, with its __index__ rewritten
        buf = wr.buffer()
        buf.arrays["a"][:] = 0.0
        buf.index[:] = torch.tensor(index)
        wr.submit(1, buf, 2)
        info = wr.close()[0]
    os.replace(hs.shard_path(tmp_path / "redo", 1), path)
    _edit(d, lambda m: m["shards"][1].update(bytes=info.bytes, crc32=info.crc32))
    s = hs.open_store(d)  # lazily: the arrays read fine
    assert s["a"][0].tolist() == [0.0, -0.0]
    want = (rf"^{path} holds dataset indices that are not strictly increasing \(row {row}: {seen} after {after}\): "
            r"the file is corrupted; run the extract again")
    with pytest.raises(HookscopeError, match=want):
        s.indices
    with pytest.raises(HookscopeError, match=want):
        s.ids


# 6. one writer per folder

_HOLDER = textwrap.dedent("""
    import os, sys, time
    from hookscope.store import locked
    with locked(sys.argv[1]):
        print("locked", flush=True)
        while not os.path.exists(sys.argv[2]):  # held until the test says so
            time.sleep(0.005)
""")


def _printed(forks: Forks, pid: int) -> str:
    """The first line a forked process prints, once it has printed it."""
    deadline = time.monotonic() + 120
    while not forks.printed(pid).endswith("\n"):
        assert forks.poll(pid) is None and time.monotonic() < deadline, forks.wait(pid).stderr
        time.sleep(0.005)
    return forks.printed(pid).splitlines()[0]


def _holder(forks: Forks, d: Path, release: Path) -> int:
    """A process of its own holding ``d``'s lock until ``release`` exists; its pid."""
    pid = forks.start(["-c", str(d), str(release)], code=_HOLDER)
    assert _printed(forks, pid) == "locked"
    return pid


def test_a_second_process_is_refused_while_the_first_writes(tmp_path: Path, forks: Forks) -> None:
    d = _store(tmp_path)
    release = tmp_path.with_name(tmp_path.name + ".release")
    pid = _holder(forks, d, release)
    try:
        busy = f"{d} is being written by another run (pid {pid}); wait for it or pick another folder"
        with pytest.raises(HookscopeError) as e:
            with hs.locked(d):
                pass
        assert str(e.value) == busy
        for fn in (hs.clear_store, hs.remove_partial):  # nothing is deleted under a live run
            with pytest.raises(HookscopeError) as e:
                fn(d)
            assert str(e.value) == busy
        assert _names(d) == [hs.LOCK_NAME, "manifest.json", "shards"] and len(_names(d / "shards")) == 2
    finally:
        release.touch()
    assert forks.wait(pid).returncode == 0 and _names(d) == ["manifest.json", "shards"]  # it removed its lock file
    with hs.locked(d) as folder:
        assert folder == d


def test_a_killed_holder_leaves_a_lock_no_one_holds(tmp_path: Path, forks: Forks) -> None:
    pid = _holder(forks, tmp_path, tmp_path.with_name(tmp_path.name + ".release"))
    os.kill(pid, signal.SIGKILL)
    assert forks.wait(pid).returncode == -signal.SIGKILL
    assert _names(tmp_path) == [hs.LOCK_NAME] and not hs.is_store(tmp_path)
    with hs.locked(tmp_path):  # the kernel released it
        pass
    (tmp_path / hs.LOCK_NAME).write_text("999999\n")  # stale again
    (tmp_path / "shards").mkdir()
    assert hs.is_store(tmp_path)  # an empty shards/ and our lock: a run killed before its first shard
    hs.clear_store(tmp_path)
    assert _names(tmp_path) == []


def test_a_second_thread_is_refused_and_clear_store_keeps_our_own_lock(tmp_path: Path) -> None:
    d = _store(tmp_path)
    errors: list[str] = []

    def second() -> None:
        try:
            with hs.locked(d):
                errors.append("got the lock")
        except HookscopeError as e:
            errors.append(str(e))

    with hs.locked(d):
        hs.clear_store(d)  # the overwrite path: clears the store, keeps the lock this run holds
        assert _names(d) == [hs.LOCK_NAME]
        t = threading.Thread(target=second)
        t.start()
        t.join()
    assert errors == [f"{d} is being written by another run (pid {os.getpid()}); wait for it or pick another folder"]
    assert _names(d) == []


_FORKER = textwrap.dedent("""
    import os, sys, time
    from hookscope.store import locked
    with locked(sys.argv[1]):
        child = os.fork()
        if child == 0:  # holds nothing it did not open itself; lives on after its parent is killed
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        time.sleep(60)
""")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_holder_whose_forked_child_lives_on_leaves_the_folder_free(tmp_path: Path, forks: Forks) -> None:
    pid = forks.start(["-c", str(tmp_path)], code=_FORKER)
    child = int(_printed(forks, pid))
    try:
        with pytest.raises(HookscopeError, match=rf"being written by another run \(pid {pid}\)"):
            with hs.locked(tmp_path):
                pass
        os.kill(pid, signal.SIGKILL)
        assert forks.wait(pid).returncode == -signal.SIGKILL
        assert _pid_alive(child)  # the forked child outlives its parent
        with hs.locked(tmp_path) as d:  # at once: the child does not keep the dead run's lock
            assert d == tmp_path
    finally:
        os.kill(child, signal.SIGKILL)


def _lock_fds(path: Path) -> list[str]:
    st = os.stat(path)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            other = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            found.append(fd)
    return found


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/fd").exists(), reason="os.fork and /proc")
def test_a_forked_child_closes_the_lock_and_leaving_the_block_there_touches_nothing(tmp_path: Path,
                                                                                     forks: Forks) -> None:
    read, write = os.pipe()
    with hs.locked(tmp_path):
        lock = tmp_path / hs.LOCK_NAME
        assert len(_lock_fds(lock)) == 1
        pid = os.fork()
        if pid == 0:  # the child: no descriptor of the lock; it leaves the with block like the parent's code would
            try:
                os.write(write, str(len(_lock_fds(lock))).encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 16) == b"0"
        assert len(_lock_fds(lock)) == 1 and lock.exists()  # the parent still holds it
        p = forks.run(["-c", str(tmp_path), str(tmp_path)], code=_HOLDER)  # another process: refused
        assert f"being written by another run (pid {os.getpid()})" in p.stderr
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # leaves without running the block's end: nothing of the parent's changes
        os.waitpid(pid, 0)
        assert lock.exists() and len(_lock_fds(lock)) == 1
    os.close(read)
    os.close(write)
    assert not lock.exists()


_CHILD_IN_BLOCK = textwrap.dedent("""
    import os, sys
    from hookscope.store import locked
    with locked(sys.argv[1]):
        pid = os.fork()
        if pid == 0:
            pass  # the child leaves the block normally: it must not remove or close the parent's lock
        else:
            os.waitpid(pid, 0)
            print("parent", os.path.exists(os.path.join(sys.argv[1], ".hookscope-lock")), flush=True)
    if pid == 0:
        os._exit(0)
    print("after", os.path.exists(os.path.join(sys.argv[1], ".hookscope-lock")), flush=True)
""")


def test_a_child_leaving_the_block_keeps_the_parents_lock(tmp_path: Path, forks: Forks) -> None:
    p = forks.run(["-c", str(tmp_path)], code=_CHILD_IN_BLOCK)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["parent True", "after False"]


_LEFTOVER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(os.path.join(sys.argv[1], ".hookscope-lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, (sys.argv[2] + "\\n").encode(), 0)
    print("locked", flush=True)
    while not os.path.exists(sys.argv[3]):  # held until the test says so
        time.sleep(0.005)
""")


def test_a_lock_kept_by_a_leftover_of_a_dead_run_says_so_and_names_it(tmp_path: Path, forks: Forks) -> None:
    gone = forks.start(["-c"], code="")  # a pid that has exited (what a killed run wrote in its lock file)
    assert forks.wait(gone).returncode == 0
    release = tmp_path.with_name(tmp_path.name + ".release")
    pid = forks.start(["-c", str(tmp_path), str(gone), str(release)], code=_LEFTOVER)
    assert _printed(forks, pid) == "locked"
    try:
        with pytest.raises(HookscopeError) as e:
            with hs.locked(tmp_path):
                pass
        assert str(e.value) == (f"{tmp_path} is still locked by pid {pid}, left over from a run that ended (pid "
                                f"{gone} exited; its DataLoader workers, say): stop them (kill {pid}) or wait for "
                                "them to exit, then run again")
        with pytest.raises(HookscopeError, match=rf"still locked by pid {pid}, left over"):
            hs.clear_store(tmp_path)
    finally:
        release.touch()
    assert forks.wait(pid).returncode == 0
    with hs.locked(tmp_path):
        pass


def test_lock_file_that_is_a_symlink_or_under_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    d = tmp_path / "d"
    d.mkdir()
    (d / hs.LOCK_NAME).symlink_to(target)
    with pytest.raises(HookscopeError, match=rf"^{d / hs.LOCK_NAME} is a symbolic link, not hookscope's lock file"):
        with hs.locked(d):
            pass
    with pytest.raises(HookscopeError, match=rf"^{target} is a file; give a folder for the store$"):
        with hs.locked(target):
            pass
    assert target.read_text() == "keep"


# 7. which dtypes a store can hold

def test_storable() -> None:
    yes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool]
    no = [torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.quint8]
    assert [hs.storable(t) for t in yes] == [True] * len(yes)
    assert [hs.storable(t) for t in no] == [False] * len(no)
    with pytest.raises(HookscopeError, match=r"^'x' has dtype complex64, which a store cannot hold; cast it"):
        hs.save_tensors(Path("unused"), {"x": torch.zeros(2, dtype=torch.complex64)}, {"kind": "recording"})
