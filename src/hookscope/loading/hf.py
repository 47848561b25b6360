"""``hf:CLASS_OR_TASK`` models: transformers models built from a config, with the weights a
``save_pretrained`` folder holds (random weights without them).

Nothing here touches the network: transformers reads local files only (``local_files_only=True``) and
never runs a model repository's own code (``trust_remote_code`` stays off); a ``pytorch_model.bin`` is
read with ``torch.load(weights_only=True)`` first. Must not import: anything of hookscope but
``errors``, ``core.text`` and ``loading``'s ``voice``, ``extras``, ``files`` and ``hf_weights``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..core.text import first_line
from ..errors import HookscopeError, LoadError, did_you_mean
from .extras import import_failed, import_transformers, quiet_transformers
from .files import check_folder_bin
from .hf_weights import loading_notes
from .spec import HF_PREFIX
from .voice import terms

__all__ = ["HF_TASKS", "HfModel", "check_no_remote_code", "hf_class", "hf_config", "hf_model", "is_hf_model"]

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


def hf_class(name: str) -> Any:
    """The transformers class ``hf:NAME`` names: a class name, or a task alias of :data:`HF_TASKS`.

    Example:
        >>> hf_class("causal-lm").__name__, hf_class("GPT2LMHeadModel").__name__
        ('AutoModelForCausalLM', 'GPT2LMHeadModel')
        >>> hf_class("GPT2LMHeadModl")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: transformers has no model class 'GPT2LMHeadModl' (hf:CLASS_OR_TASK: ...). Did you mean 'GPT2LMHeadModel', ...?
    """
    transformers = import_transformers()
    attr = HF_TASKS.get(name, name)
    try:
        found = getattr(transformers, attr, None) if attr.isidentifier() else None
    except ImportError as e:  # transformers imports a class lazily: a backend it needs may be missing
        raise import_failed(e, f"transformers' {attr}") from None
    tasks = f"a class such as GPT2LMHeadModel or a task: {', '.join(HF_TASKS)}"
    if isinstance(found, type) and not (hasattr(found, "from_config") or hasattr(found, "_from_config")):
        raise LoadError(f"transformers' {name} is not a model class (hf:CLASS_OR_TASK: {tasks}); give the "
                        "model class, such as GPT2LMHeadModel, or a task")
    if not isinstance(found, type):
        names = [n for n in dir(transformers) if n.startswith("Auto") or n.endswith(("Model", "LMHeadModel"))
                 or "For" in n]
        raise LoadError(f"transformers has no model class {name!r} (hf:CLASS_OR_TASK: {tasks})."
                        f"{did_you_mean(name, [*HF_TASKS, *names])}")
    return found


# The files of a folder whose "auto_map" names Python code in the folder (a class transformers would import)
_CODE_MAPS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
              "feature_extractor_config.json")


def _auto_map(file: str) -> Any:
    """The ``auto_map`` a JSON file of a model folder holds, or None (no such file, not JSON, no such key)."""
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data.get("auto_map") if isinstance(data, dict) else None


def check_no_remote_code(path: str) -> None:
    """Refuse, in one line, a config file or folder whose JSON files name Python code of their own
    (``auto_map``): hookscope never runs a model folder's code, whatever transformers would do with it.

    Example:
        >>> check_no_remote_code("/no/such/folder")  # nothing there names code
    """
    files = [os.path.join(path, f) for f in _CODE_MAPS] if os.path.isdir(path) else [path]
    for file in files:
        found = _auto_map(file)
        if found:
            values = list(found.values()) if isinstance(found, dict) else [found]
            # a tokenizer's entry is a [slow, fast] pair of class paths
            flat = [w for v in values for w in (v if isinstance(v, (list, tuple)) else [v])]
            names = ", ".join(sorted({w.split(".", 1)[0] for w in flat if isinstance(w, str)}))
            raise LoadError(f"{file} has an \"auto_map\" naming the folder's own Python code "
                            f"({names or 'its modules'}), and hookscope never runs a model folder's code; "
                            "give a folder of a model class transformers has, such as save_pretrained writes for "
                            "GPT2LMHeadModel")


def _json_config(transformers: Any, path: str) -> Any:
    """A config from a JSON file, which must name its ``model_type`` as ``save_pretrained`` writes it."""
    how = "give the config.json that save_pretrained wrote, or the folder holding it"
    where = f"{terms().option('config')} {path}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = getattr(e, "strerror", None) or f"{type(e).__name__}: {first_line(e)}"
        raise LoadError(f"cannot read {where} as JSON ({why}); {how}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise LoadError(f"{where} is not a transformers config (no \"model_type\" key); {how}")
    check_no_remote_code(path)
    try:
        with quiet_transformers(transformers):
            return transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except ImportError as e:
        raise import_failed(e, f"{where} (model_type {data['model_type']!r})") from None
    except Exception as e:  # a field of the wrong type is huggingface_hub's own error, an Exception only
        said = " ".join(str(e).split())[:300] or type(e).__name__
        raise LoadError(f"{where}: transformers cannot build a config of model_type "
                        f"{data['model_type']!r} ({said}); fix that field, or {how}") from None


def hf_config(path: str | None) -> Any:
    """The transformers config a ``save_pretrained`` folder or a config JSON file holds.

    Example:
        >>> hf_config("/no/such/folder")
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: no such config: /no/such/folder; give a folder save_pretrained wrote, or its config.json
    """
    t = terms()
    if path is None:
        raise LoadError(f"{t.model} hf:... needs {t.given('config', 'PATH')}: a folder save_pretrained wrote "
                        "(config.json, weights) or a config.json; nothing is downloaded")
    if not os.path.exists(path):
        raise LoadError(f"no such {t.option('config')}: {path}; give a folder save_pretrained wrote, or its "
                        "config.json")
    transformers = import_transformers()
    if not os.path.isdir(path):
        return _json_config(transformers, path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise LoadError(f"{t.option('config')} {path} holds no config.json; give a folder that "
                        "model.save_pretrained() wrote, or a config JSON file")
    check_no_remote_code(path)
    return _json_config(transformers, os.path.join(path, "config.json"))


@dataclass
class HfModel:
    """A transformers model built for ``hf:``, and whether it holds weights read from the folder.

    Attributes:
        model: the model, in eval mode.
        trained: True when weights were read from the config folder.
        notes: what to tell the caller (a new head left random).

    Example:
        >>> HfModel(nn.Linear(2, 2), trained=False).notes
        []
    """

    model: nn.Module
    trained: bool
    notes: list[str] = field(default_factory=list)


def _check_fits(cls: Any, config: Any, spec: str, path: str) -> None:
    """A concrete class (not Auto) needs its own kind of config: GPT2LMHeadModel with a BERT one fails."""
    wanted = getattr(cls, "config_class", None)
    if wanted is not None and not cls.__name__.startswith("Auto") and not isinstance(config, wanted):
        raise LoadError(f"{spec} needs a {getattr(wanted, 'model_type', wanted.__name__)} config but "
                        f"{terms().option('config')} {path} is a {config.model_type} one; give a class for "
                        f"{config.model_type} models, or a task such as causal-lm")


def _weights_in(path: str) -> str | None:
    if not os.path.isdir(path):
        return None
    return next((os.path.join(path, f) for f in _WEIGHT_FILES if os.path.isfile(os.path.join(path, f))), None)


def hf_model(spec: str, path: str | None, *, trust_pickle: bool = False) -> HfModel:
    """Build ``hf:CLASS_OR_TASK`` from the config at ``path``: with the folder's weights when it has some
    (``from_pretrained``, local files only), random weights (``from_config``) otherwise.

    A ``pytorch_model.bin`` is read first the guarded way (``weights_only=True``), pickled objects in it
    refused, before transformers reads it; ``trust_pickle`` (the caller vouches for the folder) lets
    the full unpickler read it. Weights that fit the model poorly (renamed, most of them missing, a
    tensor of another shape) are one line; a head the weights do not hold (a new task head) is left
    random and said in :attr:`HfModel.notes`.

    Example:
        >>> hf_model("hf:causal-lm", None)
        Traceback (most recent call last):
        ...
        hookscope.errors.LoadError: spec hf:... needs config=PATH: a folder save_pretrained wrote (config.json, weights) or a config.json; nothing is downloaded
    """
    config = hf_config(path)
    assert path is not None
    cls = hf_class(spec[len(HF_PREFIX):])
    _check_fits(cls, config, spec, path)
    weights = _weights_in(path)
    if weights is not None and weights.endswith(".json"):
        _check_index(weights)
    if weights is not None and ".bin" in weights and not trust_pickle:
        for name in _bin_files(weights):
            check_folder_bin(name)
    transformers = import_transformers()
    try:
        with quiet_transformers(transformers):
            if weights is None or (trust_pickle and ".bin" in weights):
                model = cls.from_config(config, trust_remote_code=False) if hasattr(cls, "from_config") else cls(config)
                if weights is None:
                    return HfModel(model.eval(), False)
                info = _load_trusted(model, weights)
            else:
                model, info = cls.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                                  output_loading_info=True, ignore_mismatched_sizes=True)
    except HookscopeError:
        raise
    except ImportError as e:
        raise import_failed(e, f"{spec} from {terms().option('config')} {path}") from None
    except Exception as e:  # transformers, safetensors and torch fail in many ways on a bad folder
        raise _build_failed(e, spec, path, config, weights) from None
    return HfModel(model.eval(), True, loading_notes(model, info, spec, path))


def _build_failed(e: Exception, spec: str, path: str, config: Any, weights: str | None) -> LoadError:
    """One line for a model transformers could not build or fill: the weights file, else the class."""
    said = f"{type(e).__name__}: {first_line(e)}"
    if type(e).__name__ == "SafetensorError" or (weights is not None and weights.endswith(".safetensors")
                                                  and "deserializ" in str(e)):
        return LoadError(f"{weights or path} is not a safetensors file transformers can read ({said}); "
                         "write it again with model.save_pretrained(folder), or remove it for random weights")
    if weights is not None and "Unrecognized configuration class" not in str(e):
        return LoadError(f"transformers cannot read the weights {weights} into {spec} ({said}); write them "
                         "again with model.save_pretrained(folder), or remove them for random weights")
    kind = getattr(config, "model_type", "this")
    return LoadError(f"transformers cannot build {spec} from {terms().option('config')} {path} ({said}); give a "
                     f"class or task that fits a {kind} model, or fix the config field it names")


def _load_trusted(model: nn.Module, weights: str) -> dict[str, Any]:
    """Unpickle the folder's .bin files (``trust_pickle``: the caller vouches; transformers would read
    them with ``weights_only=True`` only) into ``model``; what did not fit, as transformers reports it."""
    import torch

    state: dict[str, Any] = {}
    for name in _bin_files(weights):
        held = torch.load(name, map_location="cpu", weights_only=False)
        if not isinstance(held, Mapping) or not all(isinstance(v, torch.Tensor) for v in held.values()):
            raise LoadError(f"{name} holds a {type(held).__name__}, not tensors by name; write the model again "
                            "with model.save_pretrained(folder)")
        state.update(held)
    ours = model.state_dict()
    prefix = str(getattr(model, "base_model_prefix", "") or "") + "."
    if prefix != "." and not any(k in ours for k in state) and all(k.startswith(prefix) for k in state):
        state = {k[len(prefix):]: v for k, v in state.items()}  # a head model's weights into its base model
    mismatched = {(k, tuple(v.shape), tuple(ours[k].shape)) for k, v in state.items()
                  if k in ours and tuple(v.shape) != tuple(ours[k].shape)}
    fits = {k: v for k, v in state.items() if k in ours and tuple(v.shape) == tuple(ours[k].shape)}
    result = model.load_state_dict(fits, strict=False)
    return {"missing_keys": set(result.missing_keys) - {m[0] for m in mismatched},
            "unexpected_keys": {k for k in state if k not in ours}, "mismatched_keys": mismatched, "error_msgs": []}


def _check_index(index: str) -> None:
    """A sharded checkpoint's index must be save_pretrained's: ``metadata`` and a ``weight_map`` dict."""
    fix = "write the model again with model.save_pretrained(folder)"
    try:
        with open(index, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LoadError(f"cannot read the weights index {index} ({type(e).__name__}: {first_line(e)}); "
                        f"{fix}") from None
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise LoadError(f"the weights index {index} has no \"weight_map\" of tensor names to files; {fix}")
    if not isinstance(data.get("metadata"), dict):
        raise LoadError(f"the weights index {index} has no \"metadata\" entry, which transformers needs; "
                        f"add \"metadata\": {{}} to it, or {fix}")


def _bin_files(weights: str) -> list[str]:
    """The .bin files a folder's weights are: the file itself, or every shard its index names."""
    if not weights.endswith(".json"):
        return [weights]
    try:
        with open(weights, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError) as e:
        raise LoadError(f"cannot read {weights} ({type(e).__name__}: {first_line(e)})") from e
    return [os.path.join(os.path.dirname(weights), s) for s in shards]


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers model (its outputs are ``ModelOutput`` objects).

    Example:
        >>> is_hf_model(nn.Linear(2, 2))
        False
    """
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
               for c in type(model).__mro__)
