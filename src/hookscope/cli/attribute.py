"""``hookscope attribute``: which input values (pixels, or tokens) a model's prediction depends on, printed
as a table, drawn as a heatmap or a strip of tokens (``--plot``), or printed as JSON."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..analysis.attribution import (INPUTS_ONLY, LAYER_METHODS, METHODS, TOKEN_METHODS, Attributions, attribute,
                                    attribute_tokens, readers, settings_of)
from ..errors import HookscopeError, SettingError, did_you_mean
from ..loading.hf import is_hf_model
from ..targets import Token
from ._common import (add_device_argument, add_examples, add_layers_argument, add_plot_argument, check_device,
                      check_plot, save_plot)
from .inputs import add_image_arguments, hf_tokenizer, load_images, model_input, tokenizer_files
from ._load import DEMO_SPEC, add_model_arguments, load_model, model_session

_RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")
_FLAGS = {"--steps": "steps", "--rule": "rule", "--samples": "samples", "--noise": "noise",  # flag -> the setting
          "--window": "window", "--stride": "stride", "--features": "features"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attribute",
        help="which pixels or tokens a prediction depends on (integrated gradients, saliency, ...)",
        description="Runs MODEL on images (--image: files or folders; MODEL demo without it: one generated "
        "shape; else a seeded random --input) or on tokens (--text through the --config folder's tokenizer, "
        "--input-ids, or random ids for a language model), attributes the predicted class (or --target) to "
        "each input value with --method, and prints one line per image (class, score, sum, delta), or for "
        "tokens one line per token explained with its strongest tokens. For a language model the token "
        "explained is the next one (--generate N: each of N tokens written greedily, over all tokens before "
        "it), the scores taken at the token embedding (or --layers) and summed over its hidden dimension; for an "
        "encoder-decoder model (T5) the decoder writes from its start token and the encoder's tokens are scored.",
    )
    add_model_arguments(p)
    add_device_argument(p)
    add_image_arguments(p)
    p.add_argument("--method", metavar="M", default=None,
                   help=f"one of {', '.join(METHODS)} (default: saliency for images, integrated_gradients for "
                        f"tokens, which take {', '.join(TOKEN_METHODS)})")
    p.add_argument("--target", metavar="K", default=None,
                   help="the class index for images; for tokens the token to explain, an id or, with a "
                        "tokenizer, its text (default: the predicted class, the most likely next token)")
    add_layers_argument(p, "attribute at this layer's output instead of the inputs (tokens: instead of the token "
                        "embedding; guided_gradcam: the layer of its Grad-CAM)", one=True)
    p.add_argument("--steps", type=int, default=None, help="integrated gradients' points on the path (default 50)")
    p.add_argument("--rule", choices=_RULES, default=None,
                   help="integrated gradients' integration rule (default riemann_trapezoid)")
    p.add_argument("--samples", metavar="N", type=int, default=None,
                   help="smoothgrad, smoothgrad_sq, vargrad: the noisy copies of each input (default 50); "
                        "shapley_value_sampling: its random orders (25); kernel_shap, lime: the coalitions (25, 50)")
    _add_perturbation_arguments(p)
    p.add_argument("--noise", metavar="F", type=float, default=None,
                   help="smoothgrad, smoothgrad_sq, vargrad: the noise's standard deviation as a fraction of each "
                        "input's range (default 0.1); a flag the --method does not read is refused")
    p.add_argument("--generate", metavar="N", type=int, default=0,
                   help="tokens: write N tokens greedily and explain each one (default 0: the next token)")
    p.add_argument("--top", metavar="K", type=int, default=5, help="tokens: the strongest tokens shown per line")
    add_plot_argument(p, "images: each input beside its attribution heatmap (red positive, blue negative); "
                         "tokens: the tokens coloured by score, one row per token explained (a batch of N: "
                         "NAME_0.png ...)")
    p.add_argument("--json", action="store_true", help="print the result as JSON, nothing else")
    add_examples(p, ("hookscope attribute demo --method integrated_gradients \\\n"
                     "      --steps 16 --plot ig.png",
                     "a generated shape and its integrated gradients, drawn beside it"),
                 ("python -c \"import transformers as t; \\\n"
                  "      c = t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100); \\\n"
                  "      t.GPT2LMHeadModel(c).save_pretrained('gpt2-tiny')\"",
                  "a small GPT-2 saved as save_pretrained writes it (random weights)"),
                 ("hookscope attribute hf:causal-lm --config gpt2-tiny \\\n"
                  "      --input-ids '15 11 95 4' --generate 3 --plot tokens.png",
                  "three tokens written, each explained over the tokens before it"),
                 ("hookscope attribute demo --method occlusion --window 8,8 --stride 4",
                  "a generated shape occluded by an 8 x 8 window, 4 pixels at a time"),
                 ("hookscope attribute hf:causal-lm --config gpt2-tiny \\\n"
                  "      --input-ids '15 11 95 4' --target 7 --json",
                  "the scores for token 7 coming next, for programs"))


def _add_perturbation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", metavar="D,..", type=_sizes, default=None,
                   help="occlusion: the window over the last dims of an input, e.g. 8,8 (default: every channel "
                        "and an eighth of each side)")
    p.add_argument("--stride", metavar="D,..", type=_sizes, default=None,
                   help="occlusion: how far the window moves, e.g. 4 (default: half the window)")
    p.add_argument("--features", metavar="F", default=None,
                   help="the perturbation methods but occlusion: which values move together: values, pixels, "
                        "channels, grid:8 (8 x 8 cells) or superpixels:50 (default: each value)")


def _sizes(text: str) -> int | tuple[int, ...]:
    """``--window`` / ``--stride``: ``8`` or ``8,8``."""
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole numbers separated by commas, e.g. 8,8") from None
    return parts[0] if len(parts) == 1 else parts


@dataclass
class _Given:
    x: torch.Tensor
    pictures: torch.Tensor | None  # images in [0, 1] to draw beside the maps
    kwargs: dict[str, Any] = field(default_factory=dict)


def _check(args: argparse.Namespace) -> None:
    """Every option's mistake, before the model is built."""
    if args.method is not None:
        key = args.method.lower().replace("-", "_")
        if key not in METHODS:
            raise HookscopeError(f"--method {args.method!r} is not an attribution method.{did_you_mean(key, METHODS)}"
                                 f" Give one of {', '.join(METHODS)}")
        if args.layers is not None and key not in LAYER_METHODS:
            raise HookscopeError(f"--method {key} {INPUTS_ONLY[key]}; drop --layers, or with --layers give one of "
                                 f"{', '.join(LAYER_METHODS)} (guided_gradcam's layer is the one of its Grad-CAM; "
                                 f"tokens take {', '.join(TOKEN_METHODS[:-1])} or {TOKEN_METHODS[-1]})")
    if args.image and (args.text is not None or args.input_ids is not None or args.input is not None):
        given = "--text" if args.text is not None else "--input-ids" if args.input_ids is not None else "--input"
        raise HookscopeError(f"give either --image PATH or {given}, not both")
    for flag, v, least in (("--steps", args.steps, 1), ("--samples", args.samples, 1), ("--generate", args.generate, 0),
                           ("--top", args.top, 1)):
        if v is not None and v < least:
            raise HookscopeError(f"{flag} {v} must be {least} or more")
    if args.noise is not None and not 0 <= args.noise < math.inf:
        raise HookscopeError(f"--noise {args.noise:g} must be a finite number 0 or more (a fraction of each input's "
                             "range)")
    check_plot(args.plot)


def _settings(args: argparse.Namespace, method: str, among: tuple[str, ...], default: str) -> dict[str, Any]:
    """The settings flags given, each one the method reads (else one line naming the methods that do)."""
    given = {setting: getattr(args, setting) for setting in _FLAGS.values() if getattr(args, setting) is not None}
    for flag, setting in _FLAGS.items():
        if setting in given and setting not in settings_of(method):
            reading = [m for m in readers(setting) if m in among]
            if not reading:
                raise SettingError(f"{flag} is not a setting of {method}, nor of any method {default.split()[-1]} "
                                   "take; drop it")
            who = f"{', '.join(reading)} read{'s' if len(reading) == 1 else ''} it"
            said = f"the method for {default} by default; {who}" if args.method is None else who
            raise SettingError(f"{flag} is not a setting of {method} ({said}); drop it or give --method {reading[0]}")
    return given


def _picture(x: torch.Tensor) -> torch.Tensor:
    """A random input shown as a picture: min-max scaled, grey when it has no 3 channels."""
    img = x if x.shape[0] == 3 else x.mean(dim=0, keepdim=True).expand(3, -1, -1)
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)


def _inputs(args: argparse.Namespace, model: torch.nn.Module, device: torch.device | None) -> _Given:
    """The model's inputs on ``device``; the pictures drawn beside the maps stay on the CPU."""
    if args.image:
        found = load_images(args)
        return _Given(_to(found.x, device), found.pictures)
    if args.model == DEMO_SPEC and args.input is None and args.input_ids is None and args.text is None:
        from ..synthetic import shapes

        data = shapes(1, seed=args.seed)
        return _Given(_to(data.images, device), data.images)
    given = model_input(args, model)
    x = given.x
    pictures = torch.stack([_picture(x[i]).cpu() for i in range(x.shape[0])]) if given.is_image else None
    moved = given.to(device)
    return _Given(moved.x, pictures, dict(moved.kwargs))


def _to(x: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    return x if device is None else x.to(device)


def _on_cpu(res: Attributions) -> Attributions:
    """The result with its tensors on the CPU, where it is printed and drawn."""
    def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.cpu()

    maps, scores = res.maps.cpu(), res.scores.cpu()
    return dataclasses.replace(res, maps=maps, scores=scores, target=cpu(res.target), delta=cpu(res.delta))


def _tokenizer(args: argparse.Namespace, model: torch.nn.Module) -> Any:
    """The ``--config`` folder's tokenizer for an hf model, when the folder holds one."""
    folder = getattr(args, "config", None)
    if not is_hf_model(model) or folder is None or not os.path.isdir(folder) or not tokenizer_files(folder):
        return None
    return hf_tokenizer(folder)


def _token_target(text: str | None, tokenizer: Any) -> Token | None:
    """``--target`` for tokens: an id, or a text the tokenizer makes one token of."""
    if text is None:
        return None
    if text.strip().lstrip("-").isdigit():
        return Token(int(text))
    if tokenizer is None:
        raise HookscopeError(f"--target {text!r} is not a token id; give an id, or --config a folder with the "
                             "model's tokenizer to name a token by its text")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise HookscopeError(f"--target {text!r} is {len(ids)} tokens for the tokenizer ({ids}); give one token, "
                             "or its id")
    return Token(int(ids[0]))


def _class_target(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise HookscopeError(f"--target {text!r} is not a class index; give a whole number such as 3") from None


def _plots(path: str | None, n: int) -> list[Path]:
    if path is None:
        return []
    p = Path(path)
    return [p] if n == 1 else [p.with_name(f"{p.stem}_{i}{p.suffix or '.png'}") for i in range(n)]


def _images(args: argparse.Namespace, model: torch.nn.Module, given: _Given) -> int:
    if args.generate:
        raise HookscopeError(f"--generate writes tokens, but {type(model).__name__} takes images; give a language "
                             "model with --text or --input-ids")
    method = (args.method or "saliency").lower().replace("-", "_")
    settings = _settings(args, method, METHODS, "images")
    res = _on_cpu(attribute(model, given.x, method=method, target=_class_target(args.target), layers=args.layers,
                            kwargs=given.kwargs, **settings))
    print(res.to_json(indent=2) if args.json else res.table())
    if args.plot is not None:
        from ..viz.attribution import plot_image_attribution

        pictures = given.pictures if args.layers is None else None
        save_plot(args.plot, plot_image_attribution(res, pictures), quiet=args.json)
    return 0


def _tokens(args: argparse.Namespace, model: torch.nn.Module, given: _Given) -> int:
    method = (args.method or "integrated_gradients").lower().replace("-", "_")
    if method not in TOKEN_METHODS:
        why = "adds noise to the inputs, which token ids cannot take" if "noise" in INPUTS_ONLY.get(method, "") \
            else "gives maps at float inputs, which token ids are not"
        raise HookscopeError(f"--method {args.method!r} {why}; tokens are scored at their embedding: give one of "
                             f"{', '.join(TOKEN_METHODS)}")
    settings = _settings(args, method, TOKEN_METHODS, "tokens")
    if args.generate and args.target is not None:
        raise HookscopeError("--generate explains the tokens the model writes; give --target or --generate, not both")
    tokenizer = _tokenizer(args, model)
    # the inputs' own decoder ids (the ids shifted right) would explain a copy of the input; the decoder
    # starts from its start token instead, as attribute_tokens does by default
    kwargs = {k: v for k, v in given.kwargs.items() if k != "decoder_input_ids"}
    res = attribute_tokens(model, given.x, target=_token_target(args.target, tokenizer), generate=args.generate,
                           method=method, layers=args.layers, tokenizer=tokenizer, kwargs=kwargs, **settings)
    print(res.to_json(indent=2) if args.json else res.table(top=args.top))
    if args.plot is not None:
        from ..viz.attribution import plot_token_attribution

        for i, path in enumerate(_plots(args.plot, given.x.shape[0])):
            save_plot(str(path), plot_token_attribution(res, sample=i), quiet=args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    with model_session(args):  # the CLI may hold one already; if not, warnings are said from here
        _check(args)
        device = check_device(args.device)  # a bad --device is said before the model loads
        model = load_model(args.model, seed=args.seed, weights=args.weights)  # a bad MODEL is said first
        model = model if device is None else model.to(device)
        given = _inputs(args, model, device)
        if given.x.is_floating_point():
            return _images(args, model, given)
        return _tokens(args, model, given)
