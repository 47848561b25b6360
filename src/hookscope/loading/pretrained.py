"""Load a compacted transformers model back from the folder ``save_pretrained`` wrote, whatever its
config can say: the architecture built from the config, fitted to the saved tensors' shapes
(:func:`hookscope.anatomy.fit_to`), then loaded. BERT and GPT-2 derive their head size from
``hidden_size / num_attention_heads``, so their config cannot describe fewer heads or a narrower
stream, and ``from_pretrained`` refuses the saved weights' shapes; this loads them, as it loads every
model whose compacted config ``compact`` left as the original's (it warns when it does).

Must not import: analysis, ``cli``, ``viz``, ``report``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..anatomy import fit_to
from ..core.text import first_line
from ..errors import HookscopeError

__all__ = ["load_pretrained"]

_EXTRA = 'pip install "hookscope[hf]"'


def _libraries() -> tuple[Any, Any]:
    try:
        import safetensors.torch
        import transformers
    except ImportError:
        raise HookscopeError(f"load_pretrained needs transformers and safetensors, from the hf extra: {_EXTRA}") from None
    return transformers, safetensors.torch


def _shards(folder: Path) -> list[str]:
    """The safetensors files of the folder: ``model.safetensors``, or the shards its index names (each
    a file inside the folder)."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        if (folder / "model.safetensors").is_file():
            return ["model.safetensors"]
        raise HookscopeError(f"{folder} holds no model.safetensors; save the model with "
                             "save_pretrained(folder) (safetensors is its default format)")
    try:
        shards = sorted({str(name) for name in json.loads(index.read_text())["weight_map"].values()})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HookscopeError(f"{index} is not a weight_map of tensor names to shard files; save the model "
                             "again with save_pretrained(folder)") from None
    for shard in shards:
        if Path(shard).name != shard:
            raise HookscopeError(f"{index.name} names {shard}, outside the folder; shards are files of the "
                                 "folder save_pretrained wrote")
        if not (folder / shard).is_file():
            raise HookscopeError(f"{shard}, which {index.name} names, is missing from {folder}; copy the "
                                 "whole folder save_pretrained wrote")
    return shards


def _weights(folder: Path, safetensors_torch: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``model.safetensors`` (or of the shards its index names)."""
    state: dict[str, torch.Tensor] = {}
    for shard in _shards(folder):
        try:
            state.update(safetensors_torch.load_file(str(folder / shard)))
        except Exception as e:  # a truncated or foreign file
            raise HookscopeError(f"cannot read {shard} ({type(e).__name__}: {first_line(e, 120)}); save the "
                                 "model again with save_pretrained(folder)") from None
    return state


def _no_own_code(folder: Path) -> None:
    """Refuse a config that names code of its own (``auto_map``): transformers would ask on the terminal
    whether to import the folder's ``.py`` files, and hookscope never runs a model folder's code."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return  # transformers' own reading names what is wrong with it
    if isinstance(data, dict) and data.get("auto_map"):
        raise HookscopeError(f"{folder / 'config.json'} names code of its own (auto_map: "
                             f"{', '.join(sorted(map(str, data['auto_map'])))[:120]}), and hookscope never runs a "
                             "model folder's code; load folders of transformers' own classes")


def _model_class(transformers: Any, config: Any, cls: Any) -> Any:
    if cls is not None:
        return cls
    names = list(getattr(config, "architectures", None) or [])
    found = getattr(transformers, names[0], None) if names else None
    if found is None:
        raise HookscopeError(f"the config names no transformers model class ({names or 'architectures is empty'}); "
                             "pass the class: load_pretrained(folder, cls=transformers.BertModel)")
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise HookscopeError(f"the config's architectures names {names[0]}, which is not a transformers model class; "
                             "pass the class: load_pretrained(folder, cls=transformers.BertModel)")
    return found


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Parameters created in ``dtype`` (as ``from_pretrained`` builds a model in the saved dtype: the
    buffers a model computes in float32 itself, rotary frequencies, stay so)."""
    if dtype is None:
        yield
        return
    was = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(was)


def _saved_dtype(state: dict[str, torch.Tensor]) -> torch.dtype | None:
    kinds = {t.dtype for t in state.values() if t.is_floating_point()}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _build(cls: Any, config: Any, where: Path, dtype: torch.dtype | None = None) -> nn.Module:
    """The architecture built from the config (its parameters in ``dtype``), or a one-line refusal (a
    config edited by hand)."""
    try:
        with _default_dtype(dtype):
            model: nn.Module = cls(config)
    except Exception as e:  # the model's own constructor checks the config (heads dividing the width ...)
        raise HookscopeError(f"cannot build {getattr(cls, '__name__', cls)} from {where / 'config.json'} "
                             f"({type(e).__name__}: {first_line(e, 160)}); pass the folder save_pretrained "
                             "wrote, its config as written") from None
    return model


def _check_missing(model: nn.Module, missing: list[str], state: dict[str, torch.Tensor]) -> None:
    """Keys the file lacks are allowed only where the model ties them to a tensor the file has
    (``lm_head.weight`` to the token embedding): anything else would stay uninitialised."""
    loaded = {t.data_ptr() for name, t in model.state_dict().items() if name in state}
    own = model.state_dict()
    untied = [k for k in missing if own[k].data_ptr() not in loaded]
    if untied:
        raise HookscopeError(f"the saved weights lack {', '.join(untied[:3])}{' ...' if len(untied) > 3 else ''}; "
                             "the folder was not written by save_pretrained from this architecture")


def _own_names(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's tensors under the model's own names. transformers 5 saves some models (ViT ...)
    under their checkpoints' names and renames them when loading; the same renaming is read off the
    names ``save_pretrained`` writes for this model's own tensors (distinct markers, matched back by
    identity), so tensors merged or split on saving keep their names and are refused below."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4 saves under the modules' names
        return state
    markers = {k: torch.empty(0) for k in model.state_dict()}
    pretrained: Any = model  # a transformers PreTrainedModel, built from the config
    try:
        saved = revert_weight_conversion(pretrained, dict(markers))
    except Exception:  # a conversion that needs real tensors: the names stay as saved
        return state
    back = {id(t): k for k, t in markers.items()}
    names = {file_key: back[id(t)] for file_key, t in saved.items() if id(t) in back}
    return {names.get(k, k): t for k, t in state.items()}


def load_pretrained(folder: str | Path, cls: Any = None) -> nn.Module:
    """A transformers model compacted by :func:`hookscope.compact` and saved with
    ``save_pretrained(folder)``, built from the folder's config, fitted to the saved shapes (every
    layer's size, each attention layer's head counts, any count per layer) and loaded, in eval mode,
    its parameters in the dtype the file holds them in (as ``from_pretrained`` builds them).
    Works for every model (LLaMA and Qwen2 load with ``from_pretrained`` too); needed where the config
    cannot say the compacted sizes (BERT, GPT-2: their head size is ``hidden_size / heads``).
    Nothing is unpickled: the weights are read from safetensors, and a folder whose config names code
    of its own (``auto_map``) is refused, its code never imported.

    Args:
        folder: what ``save_pretrained`` wrote (``config.json`` and ``model.safetensors`` or shards).
        cls: the transformers class to build; default: the config's ``architectures[0]``.

    Example:
        >>> import tempfile, transformers, hookscope
        >>> cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
        ...                               intermediate_size=8, max_position_embeddings=8)
        >>> _ = torch.manual_seed(0); bert, ids = transformers.BertModel(cfg).eval(), torch.tensor([[1, 2, 3]])
        >>> _ = hookscope.prune_heads(bert, ids, heads={"encoder.layer.0.attention.self": [0, 1]})
        >>> small = hookscope.compact(bert, ids)
        >>> folder = tempfile.mkdtemp(); small.save_pretrained(folder)
        >>> back = load_pretrained(folder)
        >>> back.encoder.layer[0].attention.self.num_attention_heads, torch.allclose(
        ...     back(ids).last_hidden_state, small(ids).last_hidden_state, atol=1e-6)
        (2, True)
    """
    transformers, safetensors_torch = _libraries()
    where = Path(folder)
    if not (where / "config.json").is_file():
        raise HookscopeError(f"{where} holds no config.json; pass the folder save_pretrained(folder) wrote")
    _no_own_code(where)
    state = _weights(where, safetensors_torch)
    try:
        config = transformers.AutoConfig.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # not JSON, or no model_type transformers knows
        raise HookscopeError(f"cannot read {where / 'config.json'} ({type(e).__name__}: {first_line(e, 160)}); "
                             "pass the folder save_pretrained(folder) wrote") from None
    model = _build(_model_class(transformers, config, cls), config, where, _saved_dtype(state))
    state = _own_names(model, state)
    fit_to(model, state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise HookscopeError(f"the saved weights hold {', '.join(unexpected[:3])}, which "
                             f"{type(model).__name__} has not; pass the class that saved them with cls=")
    _check_missing(model, list(missing), state)
    return model.eval()
