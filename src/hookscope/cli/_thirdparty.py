"""MODEL specs for other libraries' models: ``hf:CLASS_OR_TASK --config PATH`` (transformers) and
``timm:NAME`` (timm), each package imported only when its spec is used.

Nothing here touches the network: transformers reads only local files (``local_files_only=True``)
and never runs a model repository's own code (``trust_remote_code`` stays off); timm builds with
``pretrained=False``.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from torch import nn

from ..core.text import first_line
from ..errors import HookscopeError, did_you_mean

__all__ = ["HF_PREFIX", "HF_TASKS", "TIMM_PREFIX", "HfModel", "hf_class", "hf_config", "hf_model", "hf_tokenizer",
           "import_transformers", "is_hf_model", "timm_input_size", "timm_model"]

HF_PREFIX = "hf:"
TIMM_PREFIX = "timm:"
# task aliases -> the transformers Auto class that builds a model with that head
HF_TASKS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "base": "AutoModel",
}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_HF_EXTRA = 'pip install "hookscope[hf]"'
# what tokenizer.save_pretrained writes (one of them at least); transformers would otherwise make an empty one
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model",
                    "tokenizer.model", "sentencepiece.bpe.model")


def import_transformers() -> Any:
    """The ``transformers`` package, or one line naming the extra that installs it.

    Example:
        >>> import_transformers().__name__
        'transformers'
    """
    try:
        import transformers
    except ImportError:
        raise HookscopeError(f"MODEL hf:... needs transformers, from the hf extra: {_HF_EXTRA}") from None
    return transformers


def _import_timm() -> Any:
    try:
        import timm
    except ImportError:
        raise HookscopeError('MODEL timm:NAME needs timm, from the timm extra: pip install "hookscope[timm]"') from None
    return timm


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' progress bars and notes (on stderr) stay off while hookscope loads; put back after."""
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


def hf_class(name: str) -> Any:
    """The transformers class ``hf:NAME`` names: a class name, or a task alias of :data:`HF_TASKS`.

    Example:
        >>> hf_class("causal-lm").__name__, hf_class("GPT2LMHeadModel").__name__
        ('AutoModelForCausalLM', 'GPT2LMHeadModel')
        >>> hf_class("GPT2LMHeadModl")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: transformers has no model class 'GPT2LMHeadModl' (hf:CLASS_OR_TASK: ...). Did you mean 'GPT2LMHeadModel', ...?
    """
    transformers = import_transformers()
    attr = HF_TASKS.get(name, name)
    found = getattr(transformers, attr, None) if attr.isidentifier() else None
    if not isinstance(found, type) or not (hasattr(found, "from_config") or hasattr(found, "_from_config")):
        names = [n for n in dir(transformers) if n.startswith("Auto") or n.endswith(("Model", "LMHeadModel"))
                 or "For" in n]
        raise HookscopeError(f"transformers has no model class {name!r} (hf:CLASS_OR_TASK: a class such as "
                             f"GPT2LMHeadModel or a task: {', '.join(HF_TASKS)}).{did_you_mean(name, [*HF_TASKS, *names])}")
    return found


def _json_config(transformers: Any, path: str) -> Any:
    """A config from a JSON file, which must name its ``model_type`` as ``save_pretrained`` writes it."""
    how = "give the config.json that save_pretrained wrote, or the folder holding it"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = getattr(e, "strerror", None) or f"{type(e).__name__}: {first_line(e)}"
        raise HookscopeError(f"cannot read --config {path} as JSON ({why}); {how}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise HookscopeError(f"--config {path} is not a transformers config (no \"model_type\" key); {how}")
    try:
        with _quiet(transformers):
            return transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise HookscopeError(f"--config {path}: transformers cannot build a config of model_type "
                             f"{data['model_type']!r} ({first_line(e)}); {how}") from None


def hf_config(path: str | None) -> Any:
    """The transformers config ``--config`` names: a ``save_pretrained`` folder or a JSON file.

    Example:
        >>> hf_config("/no/such/folder")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: no such --config: /no/such/folder; give a folder save_pretrained wrote, or its config.json
    """
    if path is None:
        raise HookscopeError("MODEL hf:... needs --config PATH: a folder save_pretrained wrote (config.json, "
                             "weights) or a config.json; nothing is downloaded")
    if not os.path.exists(path):
        raise HookscopeError(f"no such --config: {path}; give a folder save_pretrained wrote, or its config.json")
    transformers = import_transformers()
    if not os.path.isdir(path):
        return _json_config(transformers, path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise HookscopeError(f"--config {path} holds no config.json; give a folder that model.save_pretrained() "
                             "wrote, or a config JSON file")
    return _json_config(transformers, os.path.join(path, "config.json"))


@dataclass
class HfModel:
    """A transformers model built for ``hf:``, and whether it holds weights read from the folder.

    Attributes:
        model: the model, in eval mode.
        trained: True when weights were read from the --config folder.
    """

    model: nn.Module
    trained: bool


def _check_fits(cls: Any, config: Any, spec: str, path: str) -> None:
    """A concrete class (not Auto) needs its own kind of config: GPT2LMHeadModel with a BERT one fails."""
    wanted = getattr(cls, "config_class", None)
    if wanted is not None and not cls.__name__.startswith("Auto") and not isinstance(config, wanted):
        raise HookscopeError(f"{spec} needs a {getattr(wanted, 'model_type', wanted.__name__)} config but --config "
                             f"{path} is a {config.model_type} one; give a class for {config.model_type} models, "
                             "or a task such as causal-lm")


def _weights_in(path: str) -> str | None:
    if not os.path.isdir(path):
        return None
    return next((os.path.join(path, f) for f in _WEIGHT_FILES if os.path.isfile(os.path.join(path, f))), None)


def hf_model(spec: str, path: str | None, *, check_pickle: Callable[[str], object]) -> HfModel:
    """Build ``hf:CLASS_OR_TASK`` from ``--config PATH``: with the folder's weights when it has some
    (``from_pretrained``, local files only), random weights (``from_config``) otherwise.

    ``check_pickle`` reads a ``pytorch_model.bin`` first the guarded way (``weights_only=True``) and
    raises on pickled objects, before transformers reads it.

    Example:
        >>> hf_model("hf:causal-lm", None, check_pickle=print)
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: MODEL hf:... needs --config PATH: a folder save_pretrained wrote (config.json, weights) or a config.json; nothing is downloaded
    """
    config = hf_config(path)
    assert path is not None
    cls = hf_class(spec[len(HF_PREFIX):])
    _check_fits(cls, config, spec, path)
    weights = _weights_in(path)
    if weights is not None and ".bin" in weights:
        for name in _bin_files(weights):
            check_pickle(name)
    transformers = import_transformers()
    try:
        with _quiet(transformers):
            if weights is not None:
                model = cls.from_pretrained(path, local_files_only=True, trust_remote_code=False)
            elif hasattr(cls, "from_config"):
                model = cls.from_config(config, trust_remote_code=False)
            else:
                model = cls(config)
    except (ValueError, OSError, KeyError, TypeError, AttributeError, RuntimeError) as e:
        kind = getattr(config, "model_type", "this")
        raise HookscopeError(f"transformers cannot build {spec} from --config {path} ({type(e).__name__}: "
                             f"{first_line(e)}); give a class or task that fits a {kind} model") from e
    return HfModel(model.eval(), weights is not None)


def _bin_files(weights: str) -> list[str]:
    """The .bin files a folder's weights are: the file itself, or every shard its index names."""
    if not weights.endswith(".json"):
        return [weights]
    try:
        with open(weights, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError) as e:
        raise HookscopeError(f"cannot read {weights} ({type(e).__name__}: {first_line(e)})") from e
    return [os.path.join(os.path.dirname(weights), s) for s in shards]


def hf_tokenizer(path: str | None) -> Any:
    """The tokenizer saved in the ``--config`` folder (``tokenizer.save_pretrained``), local files only."""
    fix = "save one there with tokenizer.save_pretrained(folder), or pass --input-ids"
    if path is None or not os.path.isdir(path):
        raise HookscopeError(f"--text needs a tokenizer: give --config a folder that holds one; {fix}")
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        raise HookscopeError(f"--text needs a tokenizer but --config {path} holds none (no tokenizer.json or "
                             f"tokenizer_config.json); {fix}")
    transformers = import_transformers()
    try:
        with _quiet(transformers):
            return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError, AttributeError) as e:
        raise HookscopeError(f"--text needs a tokenizer but --config {path} holds none that transformers reads "
                             f"({type(e).__name__}: {first_line(e)}); {fix}") from e


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers model (its outputs are ``ModelOutput`` objects).

    Example:
        >>> is_hf_model(nn.Linear(2, 2))
        False
    """
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
               for c in type(model).__mro__)


def timm_model(spec: str) -> nn.Module:
    """``timm:NAME``: ``timm.create_model(NAME, pretrained=False)``, NAME checked against timm's list.

    Example:
        >>> timm_model("timm:resnet19")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: timm has no model 'resnet19'. Did you mean 'resnet18', ...?
    """
    timm = _import_timm()
    name = spec[len(TIMM_PREFIX):]
    known = timm.list_models()
    if name.split(".", 1)[0] not in known:
        raise HookscopeError(f"timm has no model {name!r}.{did_you_mean(name, known)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cast(nn.Module, timm.create_model(name, pretrained=False))
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise HookscopeError(f"timm cannot build {name!r} ({type(e).__name__}: {first_line(e)})") from e


def timm_input_size(model: nn.Module) -> tuple[int, ...] | None:
    """``C x H x W`` a timm model was made for (its ``pretrained_cfg``), or None when it does not say.

    Example:
        >>> timm_input_size(nn.Linear(2, 2)) is None
        True
    """
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    return tuple(int(d) for d in size) if isinstance(size, (tuple, list)) and len(size) == 3 else None
