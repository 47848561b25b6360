"""Write a folder all at once: built under a hidden temporary name beside it, then renamed into place.

A crash (even SIGKILL) while the folder is built leaves the old folder, or none, never half a new one:
the rename is the one step that makes it visible; the hidden folder a killed run leaves is removed
by the next run (its name holds the writer's process id). Only an empty folder or a report this
module wrote (nothing but ``index.html``, ``img/*.png`` and a ``report.json`` that says it is one) is
ever replaced, and only when the caller says so; never the current folder or one that holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import HookscopeError

__all__ = ["MARKER", "check_target", "staged_folder"]

MARKER = "report.json"


def _is_report(folder: Path) -> bool:
    """Only what this module writes: ``index.html``, ``img/`` of PNGs, and a ``report.json`` that says so."""
    names = {p.name for p in folder.iterdir()}
    if not names <= {"index.html", "img", MARKER} or MARKER not in names:
        return False
    files = [folder / n for n in names if n != "img"]
    if any(p.is_symlink() or not p.is_file() for p in files):
        return False
    img = folder / "img"
    if img.exists() and (img.is_symlink() or not img.is_dir()
                         or any(p.suffix != ".png" or p.is_symlink() or not p.is_file() for p in img.iterdir())):
        return False
    try:
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "hookscope_report" in doc


def check_target(out: Path, *, overwrite: bool, flag: str) -> None:
    """Refuse, before any work, a target that exists (without ``overwrite``) or that is not ours.

    Example:
        >>> check_target(Path("/no/such/folder/r"), overwrite=False, flag="--overwrite")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: cannot write /no/such/folder/r: no folder /no/such/folder; create it first
    """
    out = Path(os.path.abspath(out))  # `a/img/..` is `a`, and messages show the path plainly
    if not out.parent.is_dir():
        raise HookscopeError(f"cannot write {out}: no folder {out.parent}; create it first")
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise HookscopeError(f"{out} is the current folder or holds it; give a new folder's path, such as "
                             f"{here / 'report'}")
    if out.is_symlink():
        raise HookscopeError(f"{out} is a symbolic link; give the path of a folder itself")
    if not out.exists():
        return
    if not out.is_dir():
        raise HookscopeError(f"{out} exists and is not a folder; choose another path")
    if not overwrite:
        raise HookscopeError(f"{out} exists; give {flag} to replace it, or choose another path")
    if any(out.iterdir()) and not _is_report(out):
        raise HookscopeError(f"{out} holds files that are not a hookscope report, so it is not replaced; "
                             "choose another path")


_STAMP = ".hookscope-partial"  # inside every hidden folder this module makes: what the cleanup looks for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # someone else's process, or not a process id: leave it
        return True
    return True


def _clean_stale(out: Path) -> None:
    """Remove hidden folders that a killed earlier run left beside ``out``: only names this module makes
    (``.NAME.partial-PID-XXXXXXXX``, ``.NAME.old-PID-hhhhhhhh``), holding its stamp, whose process is gone."""
    shape = re.compile(rf"\.{re.escape(out.name)}\.(?:partial-(\d{{1,9}})-[a-z0-9_]{{8}}|old-(\d{{1,9}})-[0-9a-f]{{8}})")
    for p in out.parent.iterdir():
        found = shape.fullmatch(p.name)
        if found is None or p.is_symlink() or not (p / _STAMP).is_file():
            continue
        if not _alive(int(found.group(1) or found.group(2))):
            shutil.rmtree(p, ignore_errors=True)


def _sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` so the rename publishes data that is on disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, out: Path) -> None:
    """Move ``tmp`` to ``out``; an old ``out`` is moved aside first and removed only afterwards."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
        (old / _STAMP).touch()  # ours to remove, should this process die before it does
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_folder(out: str | os.PathLike[str], *, overwrite: bool = False,
                  flag: str = "overwrite=True") -> Iterator[Path]:
    """Yield an empty temporary folder; on a clean exit it becomes ``out``, on an exception it is removed.

    Args:
        out: the folder to write.
        overwrite: replace ``out`` if it exists (only when empty or holding :data:`MARKER`).
        flag: how the caller spells ``overwrite`` in the error (``--overwrite`` in the CLI).

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> with staged_folder(root / "r") as tmp:
        ...     _ = (tmp / "report.json").write_text("{}")
        >>> sorted(p.name for p in root.iterdir())
        ['r']
        >>> import shutil; shutil.rmtree(root)
    """
    target = Path(os.path.abspath(out))  # `a/img/..` is `a`: the name must be the folder's own
    check_target(target, overwrite=overwrite, flag=flag)
    _clean_stale(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{os.getpid()}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private (0700); a report is meant to be read
    try:
        (tmp / _STAMP).touch()
        yield tmp
        (tmp / _STAMP).unlink()
        _sync_tree(tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
