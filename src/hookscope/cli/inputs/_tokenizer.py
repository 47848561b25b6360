"""The tokenizer ``--text`` goes through: the one saved in an ``hf:`` model's ``--config`` folder, read by
:func:`hookscope.load_tokenizer` (local files only, never a repository's own code), in the command's words."""

from __future__ import annotations

from typing import Any

from ...loading import Tokens, load_tokenizer, tokenize
from ...loading.tokens import tokenizer_files
from .._load import cli_words

__all__ = ["hf_tokenizer", "text_tokens", "tokenizer_files"]


def hf_tokenizer(path: str | None) -> Any:
    """The tokenizer saved in the ``--config`` folder (``tokenizer.save_pretrained``), local files only.

    Example:
        >>> hf_tokenizer(None)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: --text needs a tokenizer: give --config a folder that holds one; save one there with tokenizer.save_pretrained(folder), or pass --input-ids
    """
    with cli_words():
        return load_tokenizer(path)


def text_tokens(text: str, path: str | None) -> Tokens:
    """``--text`` through the tokenizer in the ``--config`` folder.

    Example:
        >>> text_tokens("hi", None)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: --text needs a tokenizer: give --config a folder that holds one; save one there with tokenizer.save_pretrained(folder), or pass --input-ids
    """
    with cli_words():
        return tokenize(text, path)
