"""The optional packages loading uses (torchvision, transformers, timm), imported only when a spec
names them; a missing one is a one-line error naming the extra that installs it.

Must not import: anything of hookscope but ``errors``, ``core.text`` and ``loading.voice``.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

from ..core.text import first_line
from ..errors import LoadError
from .voice import terms

__all__ = ["import_failed", "import_timm", "import_torchvision_models", "import_transformers", "missing_package",
           "quiet_transformers"]

_HF_EXTRA = 'pip install "hookscope[hf]"'


def import_torchvision_models() -> Any:
    """``torchvision.models``, or one line naming the extra that installs torchvision.

    Example:
        >>> import_torchvision_models().__name__
        'torchvision.models'
    """
    try:
        import torchvision.models as tvm
    except ImportError:
        raise LoadError("torchvision models need the vision extra: pip install 'hookscope[vision]'") from None
    return tvm


def import_transformers() -> Any:
    """The ``transformers`` package, or one line naming the extra that installs it.

    Example:
        >>> import_transformers().__name__
        'transformers'
    """
    try:
        import transformers
    except ImportError:
        raise LoadError(f"{terms().model} hf:... needs transformers, from the hf extra: {_HF_EXTRA}") from None
    return transformers


def import_timm() -> Any:
    """The ``timm`` package, or one line naming what to install: timm, or a package timm needs.

    Example:
        >>> import_timm().__name__
        'timm'
    """
    model = terms().model
    try:
        import timm
    except ImportError as e:
        missing = missing_package(e)
        if missing is not None and missing != "timm":  # timm is there, but something it imports is not
            raise LoadError(f"{model} timm:NAME: timm cannot be imported because the package {missing} is "
                            f"missing or broken ({first_line(e)}); install it: pip install {missing}") from None
        raise LoadError(f'{model} timm:NAME needs timm, from the timm extra: pip install "hookscope[timm]"') from None
    return timm


def missing_package(e: BaseException) -> str | None:
    """The package an import failure says is missing: the module it could not import, or the library
    its message names ("requires the timm library"); None when it does not say.

    Example:
        >>> missing_package(ModuleNotFoundError("No module named 'timm.layers'", name="timm.layers"))
        'timm'
        >>> missing_package(ImportError("TimmBackbone requires the timm library but it was not found"))
        'timm'
    """
    seen: BaseException | None = e
    for _ in range(8):  # the cause chain of a lazy import; never a loop
        if seen is None:
            break
        name = getattr(seen, "name", None)
        if isinstance(seen, ImportError) and isinstance(name, str) and name:
            return name.split(".", 1)[0]
        found = re.search(r"requires the (\w[\w.-]*) library", str(seen))
        if found:
            return found.group(1)
        seen = seen.__cause__ or seen.__context__
    return None


def import_failed(e: ImportError, what: str) -> LoadError:
    """One line for an ImportError transformers raised while building ``what``: the missing package and
    how to install it.

    Example:
        >>> print(import_failed(ModuleNotFoundError("No module named 'sentencepiece'", name="sentencepiece"),
        ...                     "the tokenizer"))  # doctest: +NORMALIZE_WHITESPACE
        the tokenizer needs the package sentencepiece, which cannot be imported here (No module named
        'sentencepiece'); install it: pip install sentencepiece
    """
    missing = missing_package(e)
    if missing is None:
        return LoadError(f"{what} fails on an import ({first_line(e)}); install what it names")
    return LoadError(f"{what} needs the package {missing}, which cannot be imported here "
                     f"({first_line(e)}); install it: pip install {missing}")


@contextlib.contextmanager
def quiet_transformers(transformers: Any) -> Iterator[None]:
    """transformers' progress bars and notes (on stderr) stay off inside; put back after.

    Example:
        >>> with quiet_transformers(import_transformers()):
        ...     pass
    """
    log = transformers.utils.logging
    level, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.set_verbosity(level)
        if bars:
            log.enable_progress_bar()
