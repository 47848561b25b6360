"""Write a folder all at once: built under a hidden temporary name beside it, then renamed into place.

A crash (even SIGKILL) while the folder is built leaves the old folder, or none, never half a new one:
the rename is the one step that makes it visible. Only an empty folder or one this module wrote
(it holds the marker file) is ever replaced, and only when the caller says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import HookscopeError

__all__ = ["MARKER", "staged_folder"]

MARKER = "report.json"


def _check_target(out: Path, *, overwrite: bool, flag: str) -> None:
    """Refuse, before any work, a target that exists (without ``overwrite``) or that is not ours."""
    if not out.parent.is_dir():
        raise HookscopeError(f"cannot write {out}: no folder {out.parent}; create it first")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise HookscopeError(f"{out} exists and is not a folder; choose another path")
    if not overwrite:
        raise HookscopeError(f"{out} exists; give {flag} to replace it, or choose another path")
    if any(out.iterdir()) and not (out / MARKER).is_file():
        raise HookscopeError(f"{out} holds files that are not a hookscope report, so it is not replaced; "
                             "choose another path")


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
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
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
    target = Path(out).absolute()
    _check_target(target, overwrite=overwrite, flag=flag)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private (0700); a report is meant to be read
    try:
        yield tmp
        _sync_tree(tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
