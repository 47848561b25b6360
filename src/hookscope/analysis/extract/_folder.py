"""The output folder of an extract: refuse what must not be touched, clear what ``overwrite`` replaces, and
tell whether a resumed run is the same run (the manifest's settings, compared field by field)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import HookscopeError
from ...store import LOCK_NAME, clear_store, count_complete, is_store, read_manifest, remove_damaged, remove_partial

__all__ = ["foreign", "prepare", "same_run", "SETTINGS"]

SETTINGS = ("arrays", "samples_per_shard", "batch_size", "model", "data_check")
"""What a resumed run must share with the store it continues."""


def prepare(out: Path, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Make ``out`` ready (rank 0 only): the manifest a resume continues, or None for a fresh start.

    A resume of an unfinished store removes every shard whose data does not match the checksum in its header
    (a disk, a copy or a killed machine damaged it) or that carries none, warning in one line for each, so that
    the run writes it again.

    Example:
        >>> import tempfile
        >>> prepare(Path(tempfile.mkdtemp()) / "new", resume=False, overwrite=False) is None
        True
    """
    if resume and overwrite:
        raise HookscopeError("resume and overwrite both given; resume continues the store, overwrite replaces it: "
                             "pick one")
    if out.exists() and not out.is_dir():
        raise HookscopeError(f"{out} is a file; give a folder for the store (out=/--out)")
    if out.is_dir() and any(f.name != LOCK_NAME for f in out.iterdir()):
        if not is_store(out):
            raise HookscopeError(f"{out} is not empty and holds no hookscope store; give a new or empty folder")
        started = (out / "manifest.json").exists()
        if not started and not count_complete(out):  # a run that failed before writing anything: start afresh
            remove_partial(out)
        elif overwrite:
            clear_store(out)
        elif not resume:
            raise HookscopeError(f"{out} already holds a hookscope store; pass resume=True (--resume) to continue it "
                                 "or overwrite=True (--overwrite) to replace it")
        elif not started:  # shards without a manifest: not a run this engine started
            raise HookscopeError(f"{out} holds shards but no manifest.json, so there is nothing to check a resume "
                                 "against; pass overwrite=True (--overwrite) to start again")
        else:
            remove_partial(out)
            old = read_manifest(out)
            if old.get("complete") is not True:  # resume is there to finish the job: a damaged shard is written again
                for line in remove_damaged(out):
                    warnings.warn(line, stacklevel=2)
            return old
    try:
        (out / "shards").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HookscopeError(f"cannot create {out / 'shards'}: {e.strerror or e}; give a folder you can write") from None
    return None


def foreign(out: Path) -> None:
    """Refuse, before anything is created in it, an ``out`` that is a file or a folder of someone else's.

    Example:
        >>> import tempfile
        >>> foreign(Path(tempfile.mkdtemp()))   # an empty folder is fine
    """
    if out.exists() and not out.is_dir():
        raise HookscopeError(f"{out} is a file; give a folder for the store (out=/--out)")
    if out.is_dir() and any(f.name != LOCK_NAME for f in out.iterdir()) and not is_store(out):
        raise HookscopeError(f"{out} is not empty and holds no hookscope store; give a new or empty folder")


def _first_difference(old: Any, new: Any, where: str) -> str | None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in list(old) + [k for k in new if k not in old]:
            found = _first_difference(old.get(k), new.get(k), f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if old == new else f"{where} was {old!r} and is now {new!r}"


def same_run(old: Mapping[str, Any], new: Mapping[str, Any], out: Path) -> None:
    """Refuse to resume ``out`` with other settings than it was started with, naming the first difference.

    Example:
        >>> same_run({"batch_size": 8}, {"batch_size": 4}, Path("s"))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: cannot resume s: batch_size was 8 and is now 4; run with the settings it was started with, or overwrite=True (--overwrite) to start again
    """
    for key in SETTINGS:
        found = _first_difference(old.get(key), new.get(key), key)
        if found:
            raise HookscopeError(f"cannot resume {out}: {found}; run with the settings it was started with, or "
                                 "overwrite=True (--overwrite) to start again")

