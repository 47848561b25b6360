"""Reading the files torch.save wrote without running their code: ``torch.load(weights_only=True)``,
which rebuilds tensors and plain containers only, and the full unpickler only when the caller
vouches for the file (``trust_pickle``). Every refusal and failure is one line.

A whole pickled model (``torch.save(model)``) cannot be read the guarded way: unpickling it runs
whatever code the file names, so it is read only with ``trust_pickle``.
Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading.voice``.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..core.text import first_line
from ..errors import LoadError, UntrustedPickleError
from .voice import terms

__all__ = ["CODE_RUNS", "check_folder_bin", "is_text", "is_weights_file", "read_model_file", "read_torch_file",
           "read_weights_file", "safer"]

CODE_RUNS = "file.py:ATTR and package.module:ATTR import and run that Python code"
# Suffixes that make weights a file even when it does not exist (then: "no such file", not "no such weights")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")

_Refusal = Callable[[str, Exception], LoadError]


def safer() -> str:
    """What to do instead of trusting a pickled model.

    Example:
        >>> safer().split(" and ")[0]
        'safer: save model.state_dict()'
    """
    return ("safer: save model.state_dict() and pass a file.py:ATTR factory that builds the model and "
            f"loads it with torch.load(..., weights_only=True) ({CODE_RUNS} too)")


def read_torch_file(path: str, *, weights_only: bool) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=weights_only)``, torch's own warnings about
    pickle protocols silenced (not the caller's business).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "t.pt")
        >>> torch.save({"w": torch.ones(2)}, path)
        >>> read_torch_file(path, weights_only=True)
        {'w': tensor([1., 1.])}
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=weights_only)


def is_text(path: str) -> bool:
    """Whether the file starts as text (a note, JSON, a wrong path's content): printable UTF-8.

    Example:
        >>> is_text(__file__)
        True
    """
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8")
    except (OSError, UnicodeDecodeError):  # a multi-byte character cut at 512 bytes is rare enough
        return False
    return all(c.isprintable() or c in "\t\n\r\f" for c in head)


def is_weights_file(text: str) -> bool:
    """Whether ``text`` names a file (existing or not) rather than torchvision's weights (``DEFAULT``).

    Example:
        >>> is_weights_file("DEFAULT"), is_weights_file("w.pt"), is_weights_file("runs/w")
        (False, True, True)
    """
    seps = [s for s in (os.sep, os.altsep) if s]
    return os.path.lexists(text) or any(s in text for s in seps) or text.lower().endswith(_WEIGHT_SUFFIXES)


KNOWN_FORMATS = "files torch.save wrote (a zip, or the older pickle format) and safetensors files"


def file_format(path: str) -> str | None:
    """What a file's first bytes say it is: ``"zip"`` (torch.save), ``"pickle"`` (torch.save's older
    format, or any pickle), ``"safetensors"``, or None for none of them (text, another format).

    Example:
        >>> file_format(__file__) is None
        True
    """
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:  # a pickle protocol 2 and later
        return "pickle"
    if len(head) > 9 and head[8:10] in (b'{"', b"{ ") and 2 <= int.from_bytes(head[:8], "little") <= 100_000_000:
        return "safetensors"
    return None


def _load_checked(path: str, label: str, *, trust: bool, pickled: _Refusal, foreign: _Refusal,
                  retry_foreign: bool, failed: _Refusal) -> Any:
    """``torch.load(weights_only=True)``, and the full unpickler only when the caller vouched (``trust``);
    each failure one line: an empty or unreadable file, ``pickled`` objects refused, a ``foreign`` file
    (corrupt, text: it fails in many ways) refused unless ``retry_foreign``, the full unpickler ``failed``."""
    if os.path.getsize(path) == 0:
        raise LoadError(f"cannot load {label}: the file is empty")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise LoadError(f"cannot read {label}: {e.strerror or e}") from e
    if file_format(path) not in ("zip", "pickle") and not retry_foreign:
        raise foreign(path, ValueError("not a file torch.save wrote"))
    try:
        return read_torch_file(path, weights_only=True)
    except OSError as e:
        raise LoadError(f"cannot read {label}: {e.strerror or e}") from e
    except pickle.UnpicklingError as e:
        if not trust:
            raise pickled(path, e) from None
    except Exception as e:  # a corrupt or foreign file fails in many ways (zip, EOF, KeyError on text...)
        if not retry_foreign:
            raise foreign(path, e) from e
    try:
        return read_torch_file(path, weights_only=False)
    except Exception as e:
        raise failed(path, e) from e


# --- a model file: MODEL.pt ---------------------------------------------------------------------
def _pickled_model(path: str, e: Exception) -> LoadError:
    """The one line for a file that ``weights_only=True`` refuses: most likely a pickled model."""
    text = str(e)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        what = f"{path} is a pickled model (it names {found.group(1)}), not plain weights"
    else:
        op = re.search(r"Unsupported operand \d+", text)
        what = (f"{path} is not plain weights that torch.load(weights_only=True) can read "
                f"({op.group(0) if op else type(e).__name__}): it is corrupt, or a pickled model")
    return UntrustedPickleError(
        f"{what}; unpickling runs whatever code the file holds, so hookscope loads a pickled model "
        f"only with {terms().trust}, for a file you trust; {safer()}"
    )


def _unreadable_model(path: str, e: BaseException) -> LoadError:
    t = terms()
    if file_format(path) == "safetensors":
        return LoadError(f"{path} is a safetensors file: weights without the model's code; pass the architecture "
                         f"as {t.model} and this file as {t.given('weights', path)}")
    if file_format(path) is None:
        why = "it holds text" if is_text(path) else "its first bytes are not those of a file torch.save wrote"
        said = f"{path} is not a model file of a known format ({why})"
    else:
        said = f"cannot load {path} with torch.load ({type(e).__name__}: {first_line(e)})"
    return LoadError(
        f"{said}; {'MODEL.pt' if t.cli else 'a model file'} must be "
        f"a whole model saved with torch.save(model) (loaded with {t.trust}), with its class importable "
        "here, or weights that a file.py:ATTR factory loads"
    )


def read_model_file(path: str, *, trust_pickle: bool) -> Any:
    """What a model file holds: tensors and plain containers through ``weights_only=True``; a whole
    pickled model only if ``trust_pickle``.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
        >>> torch.save(torch.nn.Linear(2, 2), path)
        >>> read_model_file(path, trust_pickle=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.UntrustedPickleError: .../model.pt is a pickled model (it names torch.nn.modules.linear.Linear), not plain weights; ...
        >>> type(read_model_file(path, trust_pickle=True)).__name__
        'Linear'
    """
    return _load_checked(path, path, trust=trust_pickle, pickled=_pickled_model, foreign=_unreadable_model,
                         retry_foreign=trust_pickle, failed=_unreadable_model)


# --- a weights file: a state_dict ------------------------------------------------------------------
def _pickled_weights(path: str, e: Exception) -> LoadError:
    """The one line for a weights file that ``weights_only=True`` refuses."""
    flag = terms().option("weights")
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    if found:
        what = f"{flag} {path} holds pickled objects (it names {found.group(1)}), not only tensors"
    else:
        op = re.search(r"Unsupported operand \d+", str(e))
        what = (f"cannot load {flag} {path} with torch.load(weights_only=True) "
                f"({op.group(0) if op else type(e).__name__}): it is corrupt, or holds pickled objects")
    return UntrustedPickleError(f"{what}; unpickling runs whatever code the file holds, so hookscope reads it only "
                                f"with {terms().trust}, for a file you trust; safer: torch.save(model.state_dict(), "
                                "path)")


def _not_weights(path: str, e: Exception) -> LoadError:
    if file_format(path) is None:
        why = "it holds text" if is_text(path) else "its first bytes are none of theirs"
        return LoadError(f"{terms().option('weights')} {path} is not a weights file of a known format ({why}); "
                         f"hookscope reads {KNOWN_FORMATS}: give a file torch.save(model.state_dict(), path) "
                         "or safetensors wrote")
    why = f"{type(e).__name__}: {first_line(e)}"
    return LoadError(f"{terms().option('weights')} {path} is not a weights file torch can read ({why}); give a file "
                     "torch.save(model.state_dict(), path) or safetensors wrote")


def _failed_weights(path: str, e: Exception) -> LoadError:
    return LoadError(f"cannot load {terms().option('weights')} {path} ({type(e).__name__}: {first_line(e)})")


def _safetensors(path: str) -> Any:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise LoadError(f"reading {path} needs safetensors, from the dump extra: "
                        "pip install 'hookscope[dump]'") from None
    try:
        return load_file(path, device="cpu")
    except Exception as e:
        raise LoadError(f"cannot load {terms().option('weights')} {path} with safetensors ({type(e).__name__}: "
                        f"{first_line(e)})") from e


def read_weights_file(path: str, *, trust_pickle: bool) -> Any:
    """What a weights file holds, read with ``torch.load(weights_only=True)`` (``.safetensors`` with
    safetensors); pickled objects in it are refused unless ``trust_pickle``.

    Example:
        >>> read_weights_file("/no/such/w.pt", trust_pickle=False)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: no such weights file: /no/such/w.pt
    """
    flag = terms().option("weights")
    if os.path.isdir(path):
        raise LoadError(f"{flag} {path} is a folder; give a weights file (torch.save(model.state_dict()))")
    if not os.path.isfile(path):
        hint = "" if is_weights_file(path) else " (weight names such as DEFAULT are for torchvision:NAME models)"
        raise LoadError(f"no such weights file: {path}{hint}")
    if os.path.getsize(path) > 0 and (path.lower().endswith(".safetensors") or file_format(path) == "safetensors"):
        return _safetensors(path)
    return _load_checked(path, f"{flag} {path}", trust=trust_pickle, pickled=_pickled_weights, foreign=_not_weights,
                         retry_foreign=False, failed=_failed_weights)


# --- a pytorch_model.bin in an hf: model's config folder ---------------------------------------------
def check_folder_bin(path: str) -> None:
    """Read a ``pytorch_model.bin`` of an ``hf:`` model's config folder with ``weights_only=True``
    only: pickled objects in it are refused (nothing is unpickled), in words about the folder.

    Example:
        >>> check_folder_bin("/no/such/folder/pytorch_model.bin")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: config /no/such/folder: its weights index names pytorch_model.bin, which is not there; ...
    """
    folder = os.path.dirname(path) or "."
    where = f"{terms().option('config')} {folder}"

    def pickled(path: str, e: Exception) -> LoadError:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"it names {found.group(1)}" if found else "or it is corrupt"
        return UntrustedPickleError(f"{where}: {os.path.basename(path)} holds pickled objects ({what}), not "
                                    "only tensors; unpickling runs whatever code the file holds, so hookscope reads "
                                    f"it only with {terms().trust}, for a folder you trust; safer: "
                                    "model.save_pretrained(folder) writes model.safetensors")

    def foreign(path: str, e: Exception) -> LoadError:
        why = "it holds text" if is_text(path) else f"{type(e).__name__}: {first_line(e)}"
        return LoadError(f"{where}: {os.path.basename(path)} is not a weights file torch can read "
                         f"({why}); write it again with model.save_pretrained(folder), or remove it for "
                         "random weights")

    if not os.path.isfile(path):
        raise LoadError(f"{where}: its weights index names {os.path.basename(path)}, which is not "
                        "there; write the model again with model.save_pretrained(folder)")
    _load_checked(path, f"{where}: {os.path.basename(path)}", trust=False, pickled=pickled,
                  foreign=foreign, retry_foreign=False, failed=foreign)
