"""The files a command writes: never one of its inputs, never one another, never a surprise.

Checked before the model runs, so a refusal costs nothing and nothing is lost, whatever ``--overwrite``
says. An input is every existing path the command reads, whatever the option or spec syntax names it
by: ``MODEL`` (``model.pt``, the file of ``file.py:ATTR``), ``B`` of ``diff``, ``--against`` of
``report``, ``--weights``, ``--config``, ``--data``, ``--image``, ``--classes``; and the files of an
input folder that a run reads: every file of a ``--config`` folder (config, weights, tokenizer: a file
written there would be read as one of them), the images of an ``--image`` or ``--data`` folder, the
Python files beside the ``file.py`` of ``file.py:ATTR`` (which its code may import).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import HookscopeError
from .inputs import IMAGE_SUFFIXES, image_files

__all__ = ["check_outputs", "input_paths", "check_not_inputs"]

_INPUTS = ("model", "model_b", "against", "weights", "config", "data", "image", "classes")  # what names what is read
_OUTPUTS = ("out", "plot")


def _spellings(value: str) -> list[str]:
    """The paths an input value may name: itself, and the file of ``file.py:ATTR`` (any text before a colon)."""
    found = [value]
    head = value.rpartition(":")[0]
    while head:
        found.append(head)
        head = head.rpartition(":")[0]
    return found


def input_paths(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(the option that names it, the path) of every existing file or folder the command reads.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "net.py"; _ = f.write_text("")
        >>> [(o, p.name) for o, p in input_paths(argparse.Namespace(model=f"{f}:Net", weights="DEFAULT"))]
        [('MODEL', 'net.py')]
    """
    found = []
    for name in _INPUTS:
        value = getattr(args, name, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and v:
                option = {"model": "MODEL", "model_b": "B"}.get(name, f"--{name}")
                found += [(option, Path(s)) for s in _spellings(v) if os.path.exists(s)]
    return found


def _what(option: str) -> str:
    """How an error names an input: ``one of the --image files``, ``the file of MODEL``."""
    if option in ("--image", "--data"):
        return f"one of the {option} files"
    return f"the file of {option}" if option in ("MODEL", "B") else f"the {option} file"


def _inside(path: Path, folder: Path) -> bool:
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real == top or top in real.parents


def _read_from(option: str, folder: Path, out: str) -> bool:
    """Whether ``out`` is a file a run reads from the input folder ``folder`` (named by ``option``): any file
    of a ``--config`` folder, an image of an ``--image`` folder (its own files) or a ``--data`` folder (all
    below it)."""
    if not folder.is_dir():
        return False
    real, top = Path(os.path.realpath(out)), Path(os.path.realpath(folder))
    if option == "--config":
        return top in real.parents
    image = real.name.lower().endswith(IMAGE_SUFFIXES) and not real.name.startswith(".")
    if option == "--image":
        return image and real.parent == top
    return option == "--data" and image and top in real.parents


def _beside_code(option: str, path: Path, out: str) -> bool:
    """Whether ``out`` is a Python file in the folder (or a package below it) of a spec's ``file.py``, which
    that code may import."""
    if option not in ("MODEL", "B") or path.suffix != ".py" or not out.endswith(".py"):
        return False
    return Path(os.path.realpath(path)).parent in Path(os.path.realpath(out)).parents


def _folder_input(out: str, inputs: Sequence[tuple[str, Path]]) -> str | None:
    """How an error names the input folder ``out`` would be read from, or None."""
    for option, path in inputs:
        if _beside_code(option, path, out):
            return f"in the folder of {option}'s Python file {path}, whose code may import it"
        if _read_from(option, path, out):
            whose = ("whose files the model is read from (a file written there would be read as one of them)"
                     if option == "--config" else "whose images are all read (the next run would read it back "
                     "as an input)")
            return f"in the {option} folder {path}, {whose}"
    return None


def check_not_inputs(args: argparse.Namespace, *, folder_out: bool = False) -> None:
    """Refuse, in one line, an ``--out`` or ``--plot`` that is one of the command's inputs (also through a
    link or another spelling), or, where ``--out`` is a folder the command fills (``folder_out``), one
    that is or holds an input.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "net.py"; _ = f.write_text("class Net: ...")
        >>> check_not_inputs(argparse.Namespace(model=f"{f}:Net", out=str(f)))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --out ... is the file of MODEL; give another path, an input is never overwritten
    """
    inputs = input_paths(args)
    for name in _OUTPUTS:
        out = getattr(args, name, None)
        if not isinstance(out, str) or not out:
            continue
        for option, path in inputs:
            if folder_out and name == "out" and _inside(path, Path(out)):
                raise HookscopeError(f"--out {out} holds {path}, {_what(option)}; give a folder that holds none "
                                     "of the command's inputs, an input is never overwritten")
            if _identity(out) is not None and _identity(out) == _identity(str(path)):
                raise HookscopeError(f"--{name} {out} is {_what(option)}; give another path, an input is never "
                                     "overwritten")
        where = None if folder_out and name == "out" else _folder_input(out, inputs)
        if where is not None:
            raise HookscopeError(f"--{name} {out} is {where}; write it outside that folder")


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


def _check_one(option: str, path: Path, inputs: dict[tuple[int, int], str], folders: list[Path],
               others: Sequence[tuple[str, Path]]) -> None:
    what = _subject(option, path)
    if path.suffix.lower() != ".png":
        raise HookscopeError(f"{what} is not a .png file name; the pictures are PNGs: give a name ending in .png")
    if path.is_symlink():
        raise HookscopeError(f"{what} is a symbolic link; give the path of the file itself")
    if path.is_dir():
        raise HookscopeError(f"{what} is a folder; give a file path such as {path / 'out.png'}")
    read = inputs.get(_identity(str(path)) or (-1, -1))
    if read is not None:
        raise HookscopeError(f"{what} is {read}; give another path, an input is never overwritten")
    where = _folder_input(str(path), others)
    if where is not None:
        raise HookscopeError(f"{what} is {where}; write it outside that folder")
    folder = _in_folder(Path(os.path.realpath(path)), folders)
    if folder is not None:
        raise HookscopeError(f"{what} is in the --image folder {folder}, whose images are all read (the next run "
                             "would read it back as an input); write it outside that folder")


def check_outputs(written: Sequence[tuple[str, Path]], images: Sequence[str] | None, *, overwrite: bool,
                  others: Sequence[tuple[str, Path]] = ()) -> None:
    """Refuse, in one line, a file to write that is an input (an image, or any of ``others``; also through a
    hard link or another spelling), a folder, a link, not a PNG, written twice, in an --image folder (the
    next run would read it as an image), or there already without --overwrite.

    Args:
        written: (the option that names it, such as ``--out o.png``; the path) for every file to write.
        images: the ``--image`` arguments (files and folders), or ``None``.
        overwrite: the command's ``--overwrite``.
        others: the command's other inputs, as :func:`input_paths` gives them.

    Example:
        >>> check_outputs([("--out a.png", Path("a.png")), ("--plot a.png", Path("a.png"))], None, overwrite=False)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --out a.png and --plot a.png both write a.png; give them different names
    """
    inputs = {i: _what(o) for o, p in others if (i := _identity(str(p))) is not None}
    inputs.update({i: "one of the --image files" for f in (image_files(images) if images else [])
                   if (i := _identity(f)) is not None})
    folders = [Path(os.path.realpath(f)) for f in images or [] if os.path.isdir(f)]
    seen: dict[str, str] = {}
    for option, path in written:
        real = os.path.realpath(path)
        if real in seen:
            raise HookscopeError(f"{seen[real]} and {option} both write {path}; give them different names")
        seen[real] = option
        _check_one(option, path, inputs, folders, others)
    there = [(option, path) for option, path in written if path.exists()]
    if there and not overwrite:
        option, path = there[0]
        more = f" (and {len(there) - 1} more of the {len(written)} files to write)" if len(there) > 1 else ""
        raise HookscopeError(f"{_subject(option, path)} exists{more}; pass --overwrite to replace it, or give "
                             "another path")
