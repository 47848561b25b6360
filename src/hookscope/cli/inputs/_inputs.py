"""The input every model command runs MODEL on: a tensor and the model's keyword inputs.

Image models get a seeded random ``--input`` shape. Token models get token ids, never floats:
``--input-ids "15496 11 995"`` (several sequences of one length separated by ``;``), ``--text`` through
the tokenizer in the ``--config`` folder, or seeded random ids in the vocabulary (``--input BxL``,
default 1x16). A transformers model also gets the keyword inputs it takes: ``attention_mask`` to
match the ids, ``decoder_input_ids`` for an encoder-decoder (T5); a transformers image model gets
``pixel_values`` of its config's size, and its outputs are read through ``.logits``.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...core.text import shape_text
from ...errors import HookscopeError
from ...loading import check_seed
from ...loading.hf import is_hf_model
from ...loading.preprocessing import timm_input_size
from ...loading.spec import TIMM_PREFIX
from .._common import check_device
from ._shapes import check_fits, example_input, parse_shape, random_input
from ._tokenizer import text_tokens

__all__ = ["ModelInput", "hf_logits", "model_input", "parse_ids"]

_TOKENS_DEFAULT = (1, 16)


@dataclass(frozen=True)
class ModelInput:
    """What a command runs the model on: ``model(x, **kwargs)``.

    Attributes:
        x: the positional input (an image batch, or token ids ``B x L`` of dtype long).
        kwargs: the model's keyword inputs (``attention_mask``, ``decoder_input_ids``), for ``kwargs=``.
        output: how the analyses read the scores from the model's output (``.logits`` of a
            transformers output), or None for a model that returns them.

    Example:
        >>> mi = ModelInput(torch.zeros(1, 3), {})
        >>> mi.is_image, mi.kwargs
        (False, {})
    """

    x: torch.Tensor
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: Callable[[Any], Any] | None = None

    def to(self, device: torch.device | str | None) -> ModelInput:
        """The same input with ``x`` and every tensor of ``kwargs`` on ``device`` (itself for None).

        Example:
            >>> ModelInput(torch.zeros(1), {"m": torch.ones(1), "n": 2}).to("cpu").kwargs["n"]
            2
        """
        if device is None:
            return self
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.kwargs.items()}
        return ModelInput(self.x.to(device), moved, self.output)

    @property
    def is_image(self) -> bool:
        """Whether ``x`` is a floating-point ``B x C x H x W`` batch (what CAM and feature maps draw)."""
        return self.x.dim() == 4 and self.x.is_floating_point()


def hf_logits(output: Any) -> Any:
    """The ``.logits`` of a transformers output, or the output itself when it has none.

    Example:
        >>> from types import SimpleNamespace
        >>> hf_logits(SimpleNamespace(logits=1)), hf_logits(2)
        (1, 2)
    """
    return getattr(output, "logits", output)


def parse_ids(text: str) -> torch.Tensor:
    """``--input-ids``: whole numbers separated by spaces or commas; ``;`` starts another sequence.

    Example:
        >>> parse_ids("15496 11 995").tolist()
        [[15496, 11, 995]]
        >>> parse_ids("1 2; 3 4").shape
        torch.Size([2, 2])
        >>> parse_ids("1 two 3")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --input-ids '1 two 3' are not token ids: 'two' is not a whole number; write them like '15496 11 995' (several sequences separated by ';')
    """
    how = "write them like '15496 11 995' (several sequences separated by ';')"
    rows: list[list[int]] = []
    for part in text.split(";"):
        words = [w for w in re.split(r"[\s,]+", part.strip()) if w]
        bad = next((w for w in words if not re.fullmatch(r"[+-]?\d+", w)), None)
        if bad is not None:
            raise HookscopeError(f"--input-ids {text!r} are not token ids: {bad!r} is not a whole number; {how}")
        if words:
            rows.append([int(w) for w in words])
    if not rows:
        raise HookscopeError(f"--input-ids {text!r} holds no token id; {how}")
    lengths = sorted({len(r) for r in rows})
    if len(lengths) > 1:
        raise HookscopeError(f"--input-ids {text!r} holds sequences of lengths {', '.join(map(str, lengths))}; "
                             "give sequences of one length (or one sequence)")
    if any(abs(i) >= 2**63 for r in rows for i in r):
        raise HookscopeError(f"--input-ids {text!r} holds a number too large to be a token id; {how}")
    return torch.tensor(rows, dtype=torch.long)


def _vocab_size(model: nn.Module) -> int | None:
    """How many token ids the model embeds: its input embedding's rows (``get_input_embeddings()``, or
    the model itself when it is an ``nn.Embedding``), else its config's ``vocab_size``; None when
    nothing says: which of a model's embeddings takes the ids is not guessed (a position table may
    come first)."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else model if isinstance(model, nn.Embedding) else None
    except (NotImplementedError, AttributeError):  # a transformers model without a token embedding
        embedding = None
    rows = getattr(embedding, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def _check_ids(ids: torch.Tensor, model: nn.Module, source: str) -> None:
    """Every id in ``[0, vocab size)``, or one line naming the first that is not."""
    vocab = _vocab_size(model)
    bad = ((ids < 0) | (ids >= vocab)).flatten().nonzero() if vocab is not None else torch.zeros(0)
    if vocab is not None and bad.numel():
        first = int(ids.flatten()[int(bad[0])])
        fix = ("the tokenizer is not this model's: give --config a folder holding the model's own tokenizer"
               if source == "--text" else f"give ids from 0 to {vocab - 1}")
        raise HookscopeError(f"{source}: token id {first} is out of the vocabulary of {type(model).__name__} "
                             f"(vocab size {vocab}); {fix}")
    positions = _max_positions(model)
    if positions is not None and ids.shape[-1] > positions:
        raise HookscopeError(f"{source}: {ids.shape[-1]} tokens are more than the {positions} positions "
                             f"{type(model).__name__} has; give at most {positions}")


def _max_positions(model: nn.Module) -> int | None:
    """How many tokens the config's position table holds room for: its size, less the offset
    RoBERTa-style models start positions at (``padding_idx + 1``)."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value - _position_offset(model)
    return None


def _position_offset(model: nn.Module) -> int:
    """``padding_idx + 1`` when the position embedding has a padding row (RoBERTa, XLM-R: positions are
    numbered after it), else 0."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "position_embeddings" and isinstance(module, nn.Embedding):
            return module.padding_idx + 1 if module.padding_idx is not None else 0
    return 0


def _text_ids(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``--text`` through the tokenizer in the ``--config`` folder: (ids, its attention mask)."""
    tokens = text_tokens(args.text, getattr(args, "config", None))
    return tokens.ids, tokens.attention_mask


def _token_ids(args: argparse.Namespace, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(ids, attention mask or None, where they came from): --text, --input-ids, or seeded random ids."""
    if getattr(args, "text", None) is not None:
        ids, mask = _text_ids(args)
        return ids, mask, "--text"
    if getattr(args, "input_ids", None) is not None:
        return parse_ids(args.input_ids), None, "--input-ids"
    dims = parse_shape(args.input) if args.input is not None else _TOKENS_DEFAULT
    if len(dims) != 2:
        raise HookscopeError(f"--input {args.input} is not BATCHxLENGTH: {type(model).__name__} takes token ids; "
                             "write it like 1x16 (or give --input-ids or --text)")
    vocab = _vocab_size(model)
    if vocab is None:
        raise HookscopeError(f"cannot tell how many token ids {type(model).__name__} has; give --input-ids")
    if vocab < 1:
        raise HookscopeError(f"{type(model).__name__} embeds {vocab} token ids (its config's vocab_size), so no "
                             "token id fits; give --config a config with a positive vocab_size")
    check_fits(dims, f"--input {shape_text(dims)}", dtype=torch.long)
    gen = torch.Generator().manual_seed(check_seed(args.seed))
    return torch.randint(0, vocab, dims, generator=gen), None, f"--input {shape_text(dims)}"


def _token_kwargs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor | None) -> dict[str, Any]:
    """The keyword inputs a transformers token model takes with ``ids``: a matching attention mask,
    and for an encoder-decoder the decoder's ids (the ids shifted right behind the start token)."""
    params = inspect.signature(model.forward).parameters
    kw: dict[str, Any] = {}
    if "attention_mask" in params:
        kw["attention_mask"] = mask if mask is not None else torch.ones_like(ids)
    decoder = _decoder_ids(model, ids.shape[0])
    if decoder is not None:
        kw["decoder_input_ids"] = torch.cat([decoder, ids[:, :-1]], dim=1)
    if "use_cache" in params:  # one forward pass to look into: no key/value cache in the outputs
        kw["use_cache"] = False
    return kw


def _decoder_ids(model: nn.Module, batch: int) -> torch.Tensor | None:
    """An encoder-decoder's (``config.is_encoder_decoder``) decoder start: ``batch x 1`` of its
    ``decoder_start_token_id`` (else its pad id, else 0); None for other models."""
    config = getattr(model, "config", None)
    if not getattr(config, "is_encoder_decoder", False):
        return None
    if "decoder_input_ids" not in inspect.signature(model.forward).parameters:
        return None
    start = getattr(config, "decoder_start_token_id", None)
    start = start if isinstance(start, int) else getattr(config, "pad_token_id", None) or 0
    return torch.full((batch, 1), int(start), dtype=torch.long)


def _image_size(model: nn.Module) -> tuple[int, ...] | None:
    """``C x H x W`` a transformers image model's config says, or None."""
    config = getattr(model, "config", None)
    size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", 3)
    if isinstance(size, int):
        return (channels, size, size)
    if isinstance(size, (tuple, list)) and len(size) == 2:
        return (channels, int(size[0]), int(size[1]))
    return None


def _features_size(model: nn.Module) -> tuple[int, ...] | None:
    """``mel bins x frames`` a speech encoder's config says (Whisper: two frames per source position)."""
    config = getattr(model, "config", None)
    bins, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    return (bins, 2 * positions) if isinstance(bins, int) and isinstance(positions, int) else None


# An example --input for a transformers model's main input, when its config does not give the shape
_EXAMPLE_SHAPES = {"pixel_values": "1x3x224x224", "input_values": "1x16000 (a second of 16 kHz audio)",
                   "input_features": "1x80x3000 (mel bins x frames)"}


def _no_tokens(args: argparse.Namespace, model: nn.Module, takes: str) -> None:
    given = "--text" if getattr(args, "text", None) is not None else "--input-ids"
    if getattr(args, "text", None) is not None or getattr(args, "input_ids", None) is not None:
        raise HookscopeError(f"{given} gives token ids but {type(model).__name__} takes {takes}; give --input "
                             "SHAPE instead")


def _hf_input(args: argparse.Namespace, model: nn.Module) -> ModelInput:
    main = str(getattr(model, "main_input_name", "input_ids"))
    if main == "input_ids":
        ids, mask, source = _token_ids(args, model)
        _check_ids(ids, model, source)
        return ModelInput(ids, _token_kwargs(model, ids, mask), hf_logits)
    _no_tokens(args, model, main)
    size = _image_size(model) if main == "pixel_values" else _features_size(model) if main == "input_features" else None
    dims = parse_shape(args.input) if args.input is not None else (1, *size) if size is not None else None
    if dims is None:
        raise HookscopeError(f"give the shape of {type(model).__name__}'s {main}, e.g. --input "
                             f"{_EXAMPLE_SHAPES.get(main, '1x3x224x224')}")
    gen = torch.Generator().manual_seed(check_seed(args.seed))
    decoder = _decoder_ids(model, dims[0])
    kwargs = {} if decoder is None else {"decoder_input_ids": decoder}
    return ModelInput(random_input(dims, f"--input {shape_text(dims)}", gen), kwargs, hf_logits)


def _check_options(args: argparse.Namespace, model: nn.Module) -> None:
    text, ids = getattr(args, "text", None), getattr(args, "input_ids", None)
    if text is not None and ids is not None:
        raise HookscopeError("give either --text or --input-ids, not both")
    if (text is not None or ids is not None) and args.input is not None:
        raise HookscopeError(f"give either --input SHAPE or {'--text' if text is not None else '--input-ids'}, "
                             "not both")
    if text is not None and not is_hf_model(model):
        raise HookscopeError("--text needs a transformers model with its tokenizer: MODEL hf:CLASS_OR_TASK "
                             "--config FOLDER; give --input-ids for other models")


def model_input(args: argparse.Namespace, model: nn.Module) -> ModelInput:
    """The input the command runs ``model`` (the one ``args.model`` names) on, on its ``--device``; see the
    module's text.

    Example:
        >>> args = argparse.Namespace(model="m.py:build", input=None, seed=0, input_ids="3 1 2", text=None)
        >>> model_input(args, nn.Embedding(10, 4)).x.tolist()
        [[3, 1, 2]]
        >>> model_input(args, nn.Embedding(3, 4))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --input-ids: token id 3 is out of the vocabulary of Embedding (vocab size 3); give ids from 0 to 2
    """
    _check_options(args, model)
    return _made(args, model).to(check_device(getattr(args, "device", None)))


def _made(args: argparse.Namespace, model: nn.Module) -> ModelInput:
    if is_hf_model(model):
        return _hf_input(args, model)
    if getattr(args, "input_ids", None) is not None:
        ids = parse_ids(args.input_ids)
        _check_ids(ids, model, "--input-ids")
        return ModelInput(ids)
    shape = args.input
    if shape is None and str(args.model).startswith(TIMM_PREFIX):
        size = timm_input_size(model)
        shape = "x".join(map(str, (1, *size))) if size is not None else None
    return ModelInput(example_input(args.model, shape, seed=args.seed))
