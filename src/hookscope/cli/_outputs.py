"""The files a command writes: never an input image, never one another, never a surprise.

Checked before the model runs, so a refusal costs nothing and nothing is lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import HookscopeError
from ._images import IMAGE_SUFFIXES, image_files

__all__ = ["check_outputs"]


def _subject(option: str, path: Path) -> str:
    """``--out o.png`` when it is the file, ``--out o.png writes o_0.png, which`` when it names several."""
    return option if Path(option.split(" ", 1)[1]) == path else f"{option} writes {path}, which"


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of an existing file, so that a hard link or another spelling is the same file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _in_folder(path: Path, folders: list[Path]) -> Path | None:
    """The --image folder that would read ``path`` back as an image next time, if any."""
    if path.name.startswith(".") or not path.name.lower().endswith(IMAGE_SUFFIXES):
        return None
    return next((f for f in folders if path.parent == f), None)


def _check_one(option: str, path: Path, inputs: set[tuple[int, int]], folders: list[Path]) -> None:
    what = _subject(option, path)
    if path.suffix.lower() != ".png":
        raise HookscopeError(f"{what} is not a .png file name; the pictures are PNGs: give a name ending in .png")
    if path.is_symlink():
        raise HookscopeError(f"{what} is a symbolic link; give the path of the file itself")
    if path.is_dir():
        raise HookscopeError(f"{what} is a folder; give a file path such as {path / 'out.png'}")
    if _identity(str(path)) in inputs:
        raise HookscopeError(f"{what} is one of the --image files; give another path, an input is never overwritten")
    folder = _in_folder(Path(os.path.realpath(path)), folders)
    if folder is not None:
        raise HookscopeError(f"{what} is in the --image folder {folder}, whose images are all read (the next run "
                             "would read it back as an input); write it outside that folder")


def check_outputs(written: Sequence[tuple[str, Path]], images: Sequence[str] | None, *, overwrite: bool) -> None:
    """Refuse, in one line, a file to write that is an input image (also through a hard link or another
    spelling), a folder, a link, not a PNG, written twice, in an --image folder (the next run would read
    it as an image), or there already without --overwrite.

    Args:
        written: (the option that names it, such as ``--out o.png``; the path) for every file to write.
        images: the ``--image`` arguments (files and folders), or ``None``.
        overwrite: the command's ``--overwrite``.

    Example:
        >>> check_outputs([("--out a.png", Path("a.png")), ("--plot a.png", Path("a.png"))], None, overwrite=False)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --out a.png and --plot a.png both write a.png; give them different names
    """
    inputs = {i for i in (_identity(f) for f in image_files(images)) if i is not None} if images else set()
    folders = [Path(os.path.realpath(f)) for f in images or [] if os.path.isdir(f)]
    seen: dict[str, str] = {}
    for option, path in written:
        real = os.path.realpath(path)
        if real in seen:
            raise HookscopeError(f"{seen[real]} and {option} both write {path}; give them different names")
        seen[real] = option
        _check_one(option, path, inputs, folders)
    there = [(option, path) for option, path in written if path.exists()]
    if there and not overwrite:
        option, path = there[0]
        more = f" (and {len(there) - 1} more of the {len(written)} files to write)" if len(there) > 1 else ""
        raise HookscopeError(f"{_subject(option, path)} exists{more}; pass --overwrite to replace it, or give "
                             "another path")
