"""Tokens for a text: the tokenizer saved in an ``hf:`` model's folder (``tokenizer.save_pretrained``),
read by transformers' ``AutoTokenizer`` from local files only, never a repository's own code, and
the token ids and attention mask it gives. Must not import: ``cli``, ``viz``, ``report`` or any analysis.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core.text import first_line
from ..errors import LoadError, checked, checked_init
from .extras import import_failed, import_transformers, quiet_transformers
from .hf import check_no_remote_code
from .voice import terms

__all__ = ["Tokens", "load_tokenizer", "tokenize", "tokenizer_files"]

# what tokenizer.save_pretrained writes (one of them at least); transformers would otherwise make an empty one
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model",
                    "tokenizer.model", "sentencepiece.bpe.model")


@checked_init
@dataclass(frozen=True)
class Tokens:
    """A text's tokens: ``model(ids, attention_mask=attention_mask)``.

    Attributes:
        ids: B x L token ids (dtype long).
        attention_mask: B x L, 1 for a real token and 0 for padding (the tokenizer's), or None.

    Example:
        >>> Tokens(torch.tensor([[1, 2]])).ids.tolist()
        [[1, 2]]
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor | None = None


def _text() -> str:
    return "--text" if terms().cli else "tokenize"


def _fix() -> str:
    return ("save one there with tokenizer.save_pretrained(folder), or pass --input-ids" if terms().cli
            else "save one there with tokenizer.save_pretrained(folder)")


def tokenizer_files(path: str) -> list[str]:
    """The tokenizer files ``tokenizer.save_pretrained`` may have written in the folder ``path``.

    Example:
        >>> tokenizer_files("/no/such/folder")
        []
    """
    return [f for f in _TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))]


@checked
def load_tokenizer(folder: str | None) -> Any:
    """The tokenizer saved in ``folder`` (``tokenizer.save_pretrained``), through transformers'
    ``AutoTokenizer`` with local files only and ``trust_remote_code=False``.

    Example:
        >>> load_tokenizer(None)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: tokenize needs a tokenizer: give a folder that holds one; save one there with tokenizer.save_pretrained(folder)
    """
    where = f"{'--config' if terms().cli else 'the folder'} {folder}"
    if folder is None or not os.path.isdir(folder):
        given = "give --config a folder" if terms().cli else "give a folder"
        raise LoadError(f"{_text()} needs a tokenizer: {given} that holds one; {_fix()}")
    if not tokenizer_files(folder):
        raise LoadError(f"{_text()} needs a tokenizer but {where} holds none (no tokenizer.json or "
                        f"tokenizer_config.json); {_fix()}")
    check_no_remote_code(folder)
    transformers = import_transformers()
    try:
        with quiet_transformers(transformers):
            return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except ImportError as e:
        raise import_failed(e, f"the tokenizer in {where}") from None
    except Exception as e:  # a corrupt tokenizer file fails in many ways (JSON, protobuf, Rust exceptions)
        raise LoadError(f"{_text()}: transformers cannot read the tokenizer in {where} "
                        f"({', '.join(tokenizer_files(folder))}: {type(e).__name__}: {first_line(e)}); "
                        f"write it again with tokenizer.save_pretrained(folder)"
                        f"{', or pass --input-ids' if terms().cli else ''}") from None


@checked
def tokenize(text: str | Sequence[str], tokenizer: Any) -> Tokens:
    """``text`` (or several texts, padded to one length) as token ids, by ``tokenizer``: a folder that
    holds one (read by :func:`load_tokenizer`) or a tokenizer already made.

    Example:
        >>> import tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import PreTrainedTokenizerFast
        >>> raw = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
        >>> raw.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> folder = tempfile.mkdtemp()
        >>> PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(folder)  # doctest: +ELLIPSIS
        (...)
        >>> tokenize("hello world", folder).ids.tolist()
        [[1, 2]]
    """
    folder = str(os.fspath(tokenizer)) if isinstance(tokenizer, (str, os.PathLike)) else None
    made = load_tokenizer(folder) if folder is not None or tokenizer is None else tokenizer
    where = "" if folder is None else f" in {'--config' if terms().cli else 'the folder'} {folder} " \
                                      f"({', '.join(tokenizer_files(folder))})"
    several = not isinstance(text, str)
    pad = several and getattr(made, "pad_token", "") is not None  # padding asked of a tokenizer without a pad token fails
    try:
        encoded = made(list(text) if several else text, return_tensors="pt", padding=pad)
    except Exception as e:  # a tokenizer read from broken files may fail only when used
        if several and not pad:
            raise LoadError(f"{_text()}: the tokenizer{where} has no padding token, so texts of different lengths "
                            "cannot make one batch; set tokenizer.pad_token (such as tokenizer.eos_token), or give "
                            "one text at a time") from None
        raise LoadError(f"{_text()}: the tokenizer{where} fails on it ({type(e).__name__}: {first_line(e)}); "
                        f"write it again with tokenizer.save_pretrained(folder)"
                        f"{', or pass --input-ids' if terms().cli else ''}") from None
    ids = encoded["input_ids"]
    if ids.numel() == 0:
        empty = not "".join(text if isinstance(text, str) else list(text)).strip()
        fix = "give some text" if empty else "check that those files hold its vocabulary" + (
            ", or pass --input-ids" if terms().cli else "")
        shown = f"--text {text!r}" if terms().cli else f"text {text!r}"
        raise LoadError(f"{shown} gives no tokens with the tokenizer{where}; {fix}")
    mask = encoded.get("attention_mask")
    return Tokens(ids.long(), mask if isinstance(mask, torch.Tensor) else None)
