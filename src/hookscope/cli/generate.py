"""``hookscope generate``: a language model's continuation with and without a steering edit, printed
one under the other (or as JSON)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..analysis.steering import OPS, Direction, direction, steer
from ..errors import HookscopeError
from ..generation import tokens
from ..loading.hf import is_hf_model
from ._common import add_device_argument, add_examples, add_layers_argument, check_device
from ._load import add_model_arguments, load_model, model_session
from .inputs import hf_tokenizer, model_input, tokenizer_files
from .inputs._inputs import parse_ids

_AT = {"generated": tokens.generated, "prompt": tokens.prompt, "all": None}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="a language model's continuation with and without a steering direction",
        description="Runs MODEL's generate() on --text or --input-ids, then again with a direction steered at "
        "--layers LAYER (a module name, or a component name such as blocks.1.resid_post), and prints both "
        "continuations. The direction is the difference of the means of the layer's output at the last token of "
        "the --positive and --negative prompts (text files, one prompt a line: text through the --config folder's "
        "tokenizer, or token ids such as '15 11 95'), or a --direction file (.safetensors, as "
        "hookscope.Direction.save writes it; never unpickled). --steer says what is done along it (add, scale, ablate, "
        "clamp). --at generated (the default) steers the positions "
        "that write the continuation: the prompt's last token, whose output gives the first generated token, and "
        "every generated token fed back.",
    )
    add_model_arguments(p)
    add_device_argument(p)
    add_layers_argument(p, "the layer whose output is steered (or a component name such as blocks.1.resid_post)",
                        one=True, required=True)
    p.add_argument("--direction", metavar="FILE", default=None, help="the direction: a .safetensors file")
    p.add_argument("--positive", metavar="FILE", default=None, help="prompts with the property, one a line")
    p.add_argument("--negative", metavar="FILE", default=None, help="prompts without it, one a line")
    p.add_argument("--steer", metavar="OP", choices=OPS, default="add",
                   help="add: plus scale x direction; scale: its component times scale; ablate: projected out; "
                        "clamp: its component held inside --bounds (default add)")
    p.add_argument("--scale", metavar="S", type=float, default=1.0, help="the factor of add and scale (default 1)")
    p.add_argument("--bounds", metavar="LO,HI", default=None, help="clamp: the bounds of the component, such as "
                   "'-1,1' (either may be empty)")
    p.add_argument("--at", choices=tuple(_AT), default="generated",
                   help="generated (default): the positions that write the continuation; prompt: the prompt's "
                        "tokens; all: every position")
    p.add_argument("--max-new-tokens", metavar="N", type=int, default=20, help="tokens to write (default 20)")
    p.add_argument("--sample", action="store_true", help="sample the tokens (seeded by --seed) instead of greedy")
    p.add_argument("--no-cache", action="store_true", help="generate without the KV cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON, nothing else")
    add_examples(p, ("python -c \"import transformers as t; \\\n"
                     "      c = t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100); \\\n"
                     "      t.GPT2LMHeadModel(c).save_pretrained('gpt2-tiny')\"",
                     "a small GPT-2 saved as save_pretrained writes it (random weights)"),
                 ("python -c \"open('pos.txt', 'w').write('5 6 7\\n5 8 9\\n'); \\\n"
                  "      open('neg.txt', 'w').write('40 41 42\\n40 43 44\\n')\"",
                  "two sets of prompts as token ids, one a line"),
                 ("hookscope generate hf:causal-lm --config gpt2-tiny \\\n"
                  "      --input-ids '40 41 3' --layers blocks.1.resid_post \\\n"
                  "      --positive pos.txt --negative neg.txt --scale 8",
                  "the continuation without and with the difference of means"),
                 ("hookscope generate hf:causal-lm --config gpt2-tiny \\\n"
                  "      --input-ids '40 41 3' --layers transformer.h.0 \\\n"
                  "      --positive pos.txt --negative neg.txt --steer ablate --json",
                  "the direction projected out, as JSON"))


def _bounds(text: str | None, op: str) -> tuple[float | None, float | None] | None:
    if op != "clamp":
        if text is not None:
            raise HookscopeError(f"--bounds goes with --steer clamp, not --steer {op}; drop it")
        return None
    if text is None:
        raise HookscopeError("--steer clamp needs --bounds LO,HI, such as '-1,1' (either may be empty)")
    parts = text.split(",")
    try:
        lo, hi = (float(p) if p.strip() else None for p in parts)
    except ValueError:
        raise HookscopeError(f"--bounds {text!r} is not LO,HI; write two numbers such as '-1,1'") from None
    return lo, hi


def _check(args: argparse.Namespace) -> None:
    given = [args.direction is not None, args.positive is not None or args.negative is not None]
    if given == [True, True]:
        raise HookscopeError("give the direction as --direction FILE or as --positive and --negative, not both")
    if not any(given):
        raise HookscopeError("steering needs a direction: --direction FILE.safetensors, or --positive and --negative "
                             "prompt files")
    if given[1] and (args.positive is None or args.negative is None):
        raise HookscopeError("a direction from prompts needs both --positive and --negative files")
    if args.direction is not None and not args.direction.endswith(".safetensors"):
        raise HookscopeError(f"--direction {args.direction}: a direction file is .safetensors (hookscope.Direction."
                             "save writes one); other formats are not read")
    if args.max_new_tokens < 1:
        raise HookscopeError(f"--max-new-tokens {args.max_new_tokens} must be 1 or more")
    if args.text is None and args.input_ids is None:
        raise HookscopeError("generate writes from a prompt: give --text or --input-ids")


def _prompts(path: str, tokenizer: Any, flag: str) -> list[torch.Tensor]:
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise HookscopeError(f"{flag} {path}: cannot be read as text ({e.__class__.__name__}); give a text file, "
                             "one prompt a line") from None
    if not lines:
        raise HookscopeError(f"{flag} {path} holds no prompt; write one prompt a line")
    if tokenizer is None:
        return [parse_ids(line)[0] for line in lines]
    return [torch.tensor(tokenizer(line)["input_ids"]) for line in lines]


def _tokenizer(args: argparse.Namespace, model: torch.nn.Module) -> Any:
    folder = args.config
    if not is_hf_model(model) or folder is None or not os.path.isdir(folder) or not tokenizer_files(folder):
        return None
    return hf_tokenizer(folder)


def _direction(args: argparse.Namespace, model: torch.nn.Module, tokenizer: Any, layer: str,
               dtype: torch.dtype) -> Direction:
    if args.direction is not None:
        return Direction.load(args.direction).to(dtype)
    pos = _prompts(args.positive, tokenizer, "--positive")
    neg = _prompts(args.negative, tokenizer, "--negative")
    device = next((p.device for p in model.parameters()), None)
    return direction(model, [p.to(device) for p in pos], [n.to(device) for n in neg], layers=layer)


def _generate(model: Any, x: torch.Tensor, kwargs: dict[str, Any], args: argparse.Namespace) -> list[int]:
    torch.manual_seed(args.seed)
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    mask = {k: v for k, v in kwargs.items() if k == "attention_mask"}  # the rest is generate()'s own to set
    out = model.generate(x, **mask, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                         use_cache=not args.no_cache, pad_token_id=pad if pad is not None else (eos or 0))
    return [int(t) for t in out[0, x.shape[1]:]]


def run(args: argparse.Namespace) -> int:
    with model_session(args):
        _check(args)
        bounds = _bounds(args.bounds, args.steer)
        device = check_device(args.device)
        model = load_model(args.model, seed=args.seed, weights=args.weights)
        model = (model if device is None else model.to(device)).eval()
        if not hasattr(model, "generate"):
            raise HookscopeError(f"{type(model).__name__} has no generate(); give a language model such as "
                                 "hf:causal-lm --config FOLDER")
        given = model_input(args, model)
        if given.x.shape[0] != 1:
            raise HookscopeError(f"generate writes from one prompt, and the input holds {given.x.shape[0]}; give one")
        tokenizer = _tokenizer(args, model)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        plain = _generate(model, given.x, given.kwargs, args)
        steering = steer(model, args.layers, direction=_direction(args, model, tokenizer, args.layers, dtype),
                         op=args.steer, scale=args.scale, at=_AT[args.at], bounds=bounds)
        with steering:
            steered = _generate(model, given.x, given.kwargs, args)
        return _print(args, given.x[0].tolist(), plain, steered, steering, tokenizer)


def _print(args: argparse.Namespace, prompt: list[int], plain: list[int], steered: list[int], steering: Any,
           tokenizer: Any) -> int:
    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))

    d = steering.direction
    if args.json:
        print(json.dumps({"prompt": prompt, "without": plain, "with": steered, "changed": plain != steered,
                          "steer": {"layers": steering.names, "op": args.steer, "scale": args.scale, "at": args.at,
                                    "direction": {"method": d.method, "norm": d.norm, "width": d.width}},
                          **({"text": {"prompt": text(prompt), "without": text(plain), "with": text(steered)}}
                             if tokenizer is not None else {})}, indent=2))
        return 0
    first = next((i for i, (a, b) in enumerate(zip(plain, steered)) if a != b), None)
    print(f"prompt:  {text(prompt)}")
    print(f"without: {text(plain)}")
    print(f"with:    {text(steered)}")
    print(f"steered {', '.join(steering.names)} ({args.steer}, scale {args.scale:g}, at {args.at}; direction by "
          f"{d.method}, length {d.norm:.4g}): "
          + ("the same tokens" if first is None else f"tokens differ from generated token {first} on"))
    return 0
