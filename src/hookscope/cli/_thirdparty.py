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
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from torch import nn

from ..core.text import first_line, shape_text
from ..errors import HookscopeError, did_you_mean

__all__ = ["HF_PREFIX", "HF_TASKS", "TIMM_PREFIX", "HfModel", "hf_class", "hf_config", "hf_model", "hf_preprocessing",
           "hf_tokenizer", "import_transformers", "is_hf_model", "missing_package", "timm_input_size", "timm_model",
           "timm_pretrained_cfg", "tokenizer_files"]

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
    except ImportError as e:
        missing = missing_package(e)
        if missing is not None and missing != "timm":  # timm is there, but something it imports is not
            raise HookscopeError(f"MODEL timm:NAME: timm cannot be imported because the package {missing} is "
                                 f"missing or broken ({first_line(e)}); install it: pip install {missing}") from None
        raise HookscopeError('MODEL timm:NAME needs timm, from the timm extra: pip install "hookscope[timm]"') from None
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


def _import_failed(e: ImportError, what: str) -> HookscopeError:
    """One line for an ImportError transformers raises while building: the missing package and its install."""
    missing = missing_package(e)
    if missing is None:
        return HookscopeError(f"{what} fails on an import ({first_line(e)}); install what it names")
    return HookscopeError(f"{what} needs the package {missing}, which cannot be imported here "
                          f"({first_line(e)}); install it: pip install {missing}")


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
    try:
        found = getattr(transformers, attr, None) if attr.isidentifier() else None
    except ImportError as e:  # transformers imports a class lazily: a backend it needs may be missing
        raise _import_failed(e, f"transformers' {attr}") from None
    tasks = f"a class such as GPT2LMHeadModel or a task: {', '.join(HF_TASKS)}"
    if isinstance(found, type) and not (hasattr(found, "from_config") or hasattr(found, "_from_config")):
        raise HookscopeError(f"transformers' {name} is not a model class (hf:CLASS_OR_TASK: {tasks}); give the "
                             "model class, such as GPT2LMHeadModel, or a task")
    if not isinstance(found, type):
        names = [n for n in dir(transformers) if n.startswith("Auto") or n.endswith(("Model", "LMHeadModel"))
                 or "For" in n]
        raise HookscopeError(f"transformers has no model class {name!r} (hf:CLASS_OR_TASK: {tasks})."
                             f"{did_you_mean(name, [*HF_TASKS, *names])}")
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
    except ImportError as e:
        raise _import_failed(e, f"--config {path} (model_type {data['model_type']!r})") from None
    except Exception as e:  # a field of the wrong type is huggingface_hub's own error, an Exception only
        said = " ".join(str(e).split())[:300] or type(e).__name__
        raise HookscopeError(f"--config {path}: transformers cannot build a config of model_type "
                             f"{data['model_type']!r} ({said}); fix that field, or {how}") from None


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
        notes: what to say once the command succeeded (a new head left random).
    """

    model: nn.Module
    trained: bool
    notes: list[str] = field(default_factory=list)


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


def hf_model(spec: str, path: str | None, *, check_pickle: Callable[[str], object],
             trust_pickle: bool = False) -> HfModel:
    """Build ``hf:CLASS_OR_TASK`` from ``--config PATH``: with the folder's weights when it has some
    (``from_pretrained``, local files only), random weights (``from_config``) otherwise.

    ``check_pickle`` reads a ``pytorch_model.bin`` first the guarded way (``weights_only=True``) and
    raises on pickled objects, before transformers reads it; ``trust_pickle`` (the user vouches for
    the folder) skips that and lets transformers unpickle it. Weights that fit the model poorly
    (renamed, most of them missing, a tensor of another shape) are one line; a head the weights do
    not hold (a new task head) is left random and said in :attr:`HfModel.notes`.

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
    if weights is not None and weights.endswith(".json"):
        _check_index(weights)
    if weights is not None and ".bin" in weights and not trust_pickle:
        for name in _bin_files(weights):
            check_pickle(name)
    transformers = import_transformers()
    try:
        with _quiet(transformers):
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
        raise _import_failed(e, f"{spec} from --config {path}") from None
    except Exception as e:  # transformers, safetensors and torch fail in many ways on a bad folder
        raise _build_failed(e, spec, path, config, weights) from None
    return HfModel(model.eval(), True, _loading_notes(model, info, spec, path))


def _build_failed(e: Exception, spec: str, path: str, config: Any, weights: str | None) -> HookscopeError:
    """One line for a model transformers could not build or fill: the weights file, else the class."""
    said = f"{type(e).__name__}: {first_line(e)}"
    if type(e).__name__ == "SafetensorError" or (weights is not None and weights.endswith(".safetensors")
                                                  and "deserializ" in str(e)):
        return HookscopeError(f"{weights or path} is not a safetensors file transformers can read ({said}); "
                              "write it again with model.save_pretrained(folder), or remove it for random weights")
    if weights is not None and "Unrecognized configuration class" not in str(e):
        return HookscopeError(f"transformers cannot read the weights {weights} into {spec} ({said}); write them "
                              "again with model.save_pretrained(folder), or remove them for random weights")
    kind = getattr(config, "model_type", "this")
    return HookscopeError(f"transformers cannot build {spec} from --config {path} ({said}); give a class or task "
                          f"that fits a {kind} model, or fix the config field it names")


def _load_trusted(model: nn.Module, weights: str) -> dict[str, Any]:
    """Unpickle the folder's .bin files (``--trust-pickle``: the user vouches; transformers would read
    them with ``weights_only=True`` only) into ``model``; what did not fit, as transformers reports it."""
    import torch

    state: dict[str, Any] = {}
    for name in _bin_files(weights):
        held = torch.load(name, map_location="cpu", weights_only=False)
        if not isinstance(held, Mapping) or not all(isinstance(v, torch.Tensor) for v in held.values()):
            raise HookscopeError(f"{name} holds a {type(held).__name__}, not tensors by name; write the model again "
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
        raise HookscopeError(f"cannot read the weights index {index} ({type(e).__name__}: {first_line(e)}); "
                             f"{fix}") from None
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise HookscopeError(f"the weights index {index} has no \"weight_map\" of tensor names to files; {fix}")
    if not isinstance(data.get("metadata"), dict):
        raise HookscopeError(f"the weights index {index} has no \"metadata\" entry, which transformers needs; "
                             f"add \"metadata\": {{}} to it, or {fix}")


def _tied_names(model: nn.Module) -> dict[str, set[str]]:
    """For each parameter held under several names (tied weights), every name of it."""
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    return {n: group for group in names.values() if len(group) > 1 for n in group}


def _ignored(model: nn.Module, attr: str, keys: set[str]) -> set[str]:
    """The keys transformers itself expects to be missing / unexpected (the class's regex lists)."""
    patterns = [p for p in (getattr(model, attr, None) or ()) if isinstance(p, str)]
    return {k for k in keys if any(re.search(p, k) for p in patterns)}


def _top(key: str, body: str | None) -> str:
    """The module a key belongs to at the level heads live: ``score`` or ``bert.pooler``."""
    parts = key.split(".")
    return ".".join(parts[:2]) if body is not None and parts[0] == body and len(parts) > 2 else parts[0]


def _loading_notes(model: nn.Module, info: Mapping[str, Any], spec: str, path: str) -> list[str]:
    """What transformers' loading report means: a one-line error when the weights fit poorly, else the
    keys left random (whole new modules: a task head) as a note."""
    where = f"--config {path}"
    saved_as = getattr(getattr(model, "config", None), "architectures", None)
    said = f" (its config.json says {', '.join(map(str, saved_as))})" if saved_as else ""
    fix = f"give the class or task the folder was saved from{said}, or save the weights again with " \
          "model.save_pretrained(folder)"
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        key, saved, wanted = mismatched[0]
        more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
        raise HookscopeError(f"the weights in {where} do not fit {type(model).__name__}: {key} is "
                             f"{shape_text(tuple(saved))} in the file but {shape_text(tuple(wanted))} in the model"
                             f"{more}; {fix}")
    errors = [str(m) for m in info.get("error_msgs") or ()]
    if errors:
        raise HookscopeError(f"transformers cannot load the weights in {where}: {errors[0].splitlines()[0]}; {fix}")
    missing, unexpected = _missing_keys(model, info)
    if not missing:
        return []
    _check_match(model, missing, unexpected, f"the weights in {where} fit {type(model).__name__} poorly", fix)
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return [f"{spec}: {shown} {'is' if len(missing) == 1 else 'are'} not in the folder's weights: random "
            f"(a new head; its outputs mean nothing until trained)"]


def _missing_keys(model: nn.Module, info: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys that count: not tied to a loaded one, not expected by transformers."""
    raw = {str(k) for k in info.get("missing_keys") or ()}
    tied = _tied_names(model)
    loaded_tie = {k for k in raw if any(other not in raw for other in tied.get(k, ()) if other != k)}
    missing = raw - loaded_tie - _ignored(model, "_keys_to_ignore_on_load_missing", raw)
    unexpected = {str(k) for k in info.get("unexpected_keys") or ()}
    unexpected -= _ignored(model, "_keys_to_ignore_on_load_unexpected", unexpected)
    return sorted(missing), sorted(unexpected)


def _check_match(model: nn.Module, missing: list[str], unexpected: list[str], what: str, fix: str) -> None:
    """Raise when the missing keys are not whole new modules: most values missing, keys renamed, or
    part of a module that is otherwise loaded."""
    state = model.state_dict()
    tied = _tied_names(model)
    total = sum(t.numel() for t in state.values()) or 1
    lost = sum(state[k].numel() for k in missing if k in state)
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    body = prefix if prefix and isinstance(getattr(model, prefix, None), nn.Module) else None
    gone = set(missing)
    partial = [k for k in missing if any(s not in gone and s not in tied and _top(s, body) == _top(k, body)
                                         for s in state)]
    renamed = _renamed(missing, unexpected, body)
    if 2 * lost <= total and not partial and not renamed:
        return
    why = (f"{len(missing)} of its {len(state)} tensors {'is' if len(missing) == 1 else 'are'} not in them "
           f"({100 * lost / total:.0f}% of its values: "
           f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if unexpected:
        why += f" and {len(unexpected)} of theirs are not the model's ({', '.join(unexpected[:3])}"
        why += ", ...)" if len(unexpected) > 3 else ")"
    raise HookscopeError(f"{what}: {why}; {fix}")


def _renamed(missing: list[str], unexpected: list[str], body: str | None) -> bool:
    """Whether saved keys look like the model's under another name: a module of two tensors or more
    whose names past the module's are those of a saved module, or a saved key that is a model key
    with a prefix."""
    def groups(keys: list[str]) -> dict[str, frozenset[str]]:
        found: dict[str, set[str]] = {}
        for k in keys:
            top = _top(k, body)
            found.setdefault(top, set()).add(k[len(top) + 1:])
        return {top: frozenset(rest) for top, rest in found.items()}

    saved = set(groups(unexpected).values())
    if any(len(rest) > 1 and rest in saved for rest in groups(missing).values()):
        return True
    return any(u.endswith("." + k) or k.endswith("." + u) for u in unexpected for k in missing)


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
    except ImportError as e:
        raise _import_failed(e, f"the tokenizer in --config {path}") from None
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
    if not name.strip():
        raise HookscopeError("MODEL timm: names no model; write timm:NAME with one of timm.list_models(), "
                             "such as timm:resnet18")
    known = timm.list_models()
    arch = name.split(".", 1)[0]
    if arch not in known:
        same = [k for k in known if k.lower() == arch.lower()]  # timm's names are lower case
        hint = f" Did you mean {same[0]!r} (timm's names are lower case)?" if same else did_you_mean(name, known)
        raise HookscopeError(f"timm has no model {name!r}.{hint}")
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


def timm_pretrained_cfg(spec: str) -> dict[str, Any] | None:
    """The ``pretrained_cfg`` timm builds ``timm:NAME`` with (input size, mean, std, crop), without
    building the model; None when timm has none for it.

    Example:
        >>> timm_pretrained_cfg("timm:resnet18")["input_size"]
        (3, 224, 224)
    """
    timm = _import_timm()
    try:
        cfg = timm.get_pretrained_cfg(spec[len(TIMM_PREFIX):])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    to_dict = getattr(cfg, "to_dict", None)
    return cast(dict[str, Any], to_dict()) if callable(to_dict) else None


def hf_preprocessing(path: str | None) -> dict[str, Any] | None:
    """What ``preprocessor_config.json`` in the ``--config`` folder says (image size, mean, std), or
    None when the folder has none (or --config is a JSON file).

    Example:
        >>> hf_preprocessing(None) is None
        True
    """
    file = os.path.join(path, "preprocessor_config.json") if path is not None and os.path.isdir(path) else None
    if file is None or not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HookscopeError(f"cannot read {file} ({type(e).__name__}: {first_line(e)}); write it again with "
                             "image_processor.save_pretrained(folder), or remove it") from None
    if not isinstance(data, dict):
        raise HookscopeError(f"{file} is not a JSON object; write it again with image_processor.save_pretrained(folder)")
    return data
