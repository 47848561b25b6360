"""One writer per store folder: an exclusive ``flock`` on ``DIR/.hookscope-lock`` while a run writes there.

The kernel drops the lock when its holder exits, even by SIGKILL, so a killed run never blocks the folder;
the file itself is removed when the block ends, or by the next :func:`~hookscope.store.clear_store`. A child
forked while the lock is held (a DataLoader worker) closes its copy of the lock file at once, so that it never
keeps the lock of a run that was killed before it.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import HookscopeError

__all__ = ["LOCK_NAME", "locked", "check_lock"]

LOCK_NAME = ".hookscope-lock"
"""The lock file's name inside a store folder (it belongs to the store: never foreign, never a store alone)."""

_HELD: set[tuple[int, int]] = set()  # (st_dev, st_ino) of the lock files this process holds
_OPEN: set[int] = set()  # every descriptor of a lock file this process has open (held, or being checked)
_HELD_LOCK = threading.Lock()
_NO_LOCKS = {errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL}  # file systems that cannot flock


def _forked_child() -> None:
    """In a child just forked: close every lock file the parent holds. The child shares the parent's open file
    description, so an flock lives on while any child keeps it open; closing here drops only the child's
    reference (the parent keeps its lock), and a killed parent's folder is free at once."""
    global _HELD_LOCK
    for fd in _OPEN:
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN.clear()
    _HELD.clear()
    _HELD_LOCK = threading.Lock()  # another thread of the parent may have held it while forking


def _close(fd: int) -> None:
    _OPEN.discard(fd)
    os.close(fd)


if hasattr(os, "register_at_fork"):  # every os.fork, multiprocessing's "fork" start method included
    os.register_at_fork(after_in_child=_forked_child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def _holders(path: Path) -> list[int]:
    """The pids of this machine's processes (those we may inspect) that have ``path`` open (Linux /proc)."""
    try:
        st = os.stat(path)
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                other = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                found.append(pid)
                break
    return found


def _busy(root: Path, fd: int) -> HookscopeError:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        pid = "unknown"
    if not pid.isdigit() or _alive(int(pid)):
        return HookscopeError(f"{root} is being written by another run (pid {pid}); wait for it or pick another "
                              "folder")
    others = [p for p in _holders(root / LOCK_NAME) if p != os.getpid()]
    who = (f"pid {', '.join(map(str, others))}, left over from" if others else "processes left over from")
    stop = f"kill {' '.join(map(str, others))}" if others else f"fuser -k {root / LOCK_NAME}"
    return HookscopeError(f"{root} is still locked by {who} a run that ended (pid {pid} exited; its DataLoader "
                          f"workers, say): stop them ({stop}) or wait for them to exit, then run again")


def _open(path: Path, create: bool = True) -> int:
    """The lock file opened for writing (created if missing); never through a symlink, never a FIFO."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0) | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HookscopeError(f"{path} is a symbolic link, not hookscope's lock file; remove it") from None
        raise HookscopeError(f"cannot create {path} ({e.strerror or e}); give a folder you can write") from None
    _OPEN.add(fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        _close(fd)
        raise HookscopeError(f"{path} is not a regular file, so it is not hookscope's lock file; remove it")
    return fd


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock without waiting: False when another open file holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock on this platform: runs go unguarded, as before the lock
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        if e.errno not in _NO_LOCKS:
            raise
    return True


def _same(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a holder removes the file when it ends)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _acquire(root: Path) -> int:
    path = root / LOCK_NAME
    for _ in range(100):
        fd = _open(path)
        if not _try_lock(fd):
            err = _busy(root, fd)
            _close(fd)
            raise err
        if _same(fd, path):  # else the holder removed it between our open and our lock: lock the new one
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        _close(fd)
    raise HookscopeError(f"could not lock {path}: other runs keep replacing it; wait for them or pick another folder")


@contextmanager
def locked(root: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the store folder ``root`` (created if missing) for writing while the block runs.

    A second ``locked(root)``, from another process or thread, refuses at once in one line naming the holder's
    pid. The lock is an exclusive ``flock`` on ``root/.hookscope-lock``, released by the kernel however the
    holder ends; the file is removed when the block ends.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with locked(d):
        ...     with locked(d):
        ...         pass
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: ... is being written by another run (pid ...); wait for it or pick another folder
        >>> with locked(d) as folder:
        ...     sorted(p.name for p in folder.iterdir())
        ['.hookscope-lock']
        >>> list(folder.iterdir())
        []
    """
    path = Path(root)
    if path.exists() and not path.is_dir():
        raise HookscopeError(f"{path} is a file; give a folder for the store")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HookscopeError(f"cannot create {path} ({e.strerror or e}); give a folder you can write") from None
    fd = _acquire(path)
    st = os.fstat(fd)
    key, owner = (st.st_dev, st.st_ino), os.getpid()
    with _HELD_LOCK:
        _HELD.add(key)
    try:
        yield path
    finally:
        if os.getpid() == owner:  # a forked child leaving the block holds nothing: _forked_child closed it
            with _HELD_LOCK:
                _HELD.discard(key)
            try:
                if _same(fd, path / LOCK_NAME):  # removed while we hold it, so no other run can lock a stale copy
                    os.unlink(path / LOCK_NAME)
            finally:
                _close(fd)


def check_lock(root: Path, *, remove: bool) -> None:
    """Refuse (one line) when another run holds ``root``'s lock; with ``remove``, delete a lock file that no
    run holds (this process's own lock stays: its block removes it).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / LOCK_NAME).write_text("123")
        3
        >>> check_lock(d, remove=True); list(d.iterdir())
        []
    """
    path = root / LOCK_NAME
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    with _HELD_LOCK:
        if (st.st_dev, st.st_ino) in _HELD:
            return
    try:
        fd = _open(path, create=False)
    except HookscopeError:
        if not os.path.lexists(path):  # its holder just removed it
            return
        raise
    try:
        if not _try_lock(fd):
            raise _busy(root, fd)
        if remove and _same(fd, path):
            os.unlink(path)
    finally:
        _close(fd)
