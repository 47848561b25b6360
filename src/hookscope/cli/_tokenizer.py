"""The tokenizer ``--text`` goes through: the one saved in an ``hf:`` model's ``--config`` folder
(``tokenizer.save_pretrained``), read from local files only, never a repository's own code."""

from __future__ import annotations

import os
from typing import Any

from ..core.text import first_line
from ..errors import HookscopeError
from ..loading.extras import import_failed, import_transformers, quiet_transformers
from ..loading.hf import check_no_remote_code

__all__ = ["hf_tokenizer", "tokenizer_files"]

# what tokenizer.save_pretrained writes (one of them at least); transformers would otherwise make an empty one
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model",
                    "tokenizer.model", "sentencepiece.bpe.model")


def hf_tokenizer(path: str | None) -> Any:
    """The tokenizer saved in the ``--config`` folder (``tokenizer.save_pretrained``), local files only.

    Example:
        >>> hf_tokenizer(None)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --text needs a tokenizer: give --config a folder that holds one; save one there with tokenizer.save_pretrained(folder), or pass --input-ids
    """
    fix = "save one there with tokenizer.save_pretrained(folder), or pass --input-ids"
    if path is None or not os.path.isdir(path):
        raise HookscopeError(f"--text needs a tokenizer: give --config a folder that holds one; {fix}")
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        raise HookscopeError(f"--text needs a tokenizer but --config {path} holds none (no tokenizer.json or "
                             f"tokenizer_config.json); {fix}")
    check_no_remote_code(path)
    transformers = import_transformers()
    try:
        with quiet_transformers(transformers):
            return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except ImportError as e:
        raise import_failed(e, f"the tokenizer in --config {path}") from None
    except Exception as e:  # a corrupt tokenizer file fails in many ways (JSON, protobuf, Rust exceptions)
        raise HookscopeError(f"--text: transformers cannot read the tokenizer in --config {path} "
                             f"({', '.join(tokenizer_files(path))}: {type(e).__name__}: {first_line(e)}); "
                             f"write it again with tokenizer.save_pretrained(folder), or pass --input-ids") from None


def tokenizer_files(path: str) -> list[str]:
    """The tokenizer files ``tokenizer.save_pretrained`` may have written in the folder ``path``.

    Example:
        >>> tokenizer_files("/no/such/folder")
        []
    """
    return [f for f in _TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))]
