"""``hookscope prune`` for language models: Wanda or SparseGPT masks calibrated on ``--data`` (text, a
text file, or a tensor file of token ids), whole blocks removed (``--layers-remove N``, the least
influential), a short distillation towards the dense model (``--recover``), the perplexity on the
calibration tokens before, after pruning and after recovery; ``--out FOLDER`` writes the model with
``save_pretrained``."""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
from typing import Any

import torch
from torch import nn

from ...errors import HookscopeError
from .._common import model_from
from ..inputs import hf_tokenizer

__all__ = ["add_llm_arguments", "is_llm", "run_llm", "CALIBRATED"]

CALIBRATED = ("wanda", "sparsegpt")


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sparsity", metavar="FRACTION", type=float, default=None,
                   help="with --method wanda or sparsegpt: the share of each weight row pruned, in [0, 1)")
    p.add_argument("--n-m", metavar="N:M", default=None,
                   help="with --method wanda or sparsegpt, instead of --sparsity: N of every M consecutive inputs "
                        "pruned, such as 2:4")
    p.add_argument("--layers-remove", metavar="N", type=int, default=None,
                   help="remove the N least influential blocks of a transformers decoder (1 - cos of each block's "
                        "input and output on --data)")
    p.add_argument("--recover", action="store_true",
                   help="after --method wanda/sparsegpt or --layers-remove: a short distillation towards the dense "
                        "model's outputs on --data, with the perplexity before and after")
    p.add_argument("--seqlen", metavar="T", type=int, default=128,
                   help="with text --data: the tokens cut into sequences of T (default 128)")


def is_llm(args: argparse.Namespace) -> bool:
    """Whether the command asks for the language-model path."""
    return args.method in CALIBRATED or args.layers_remove is not None or args.sparsity is not None \
        or args.n_m is not None or args.recover


def _n_m(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or not 0 < int(parts[0]) < int(parts[1]):
        raise HookscopeError(f"--n-m {text} is not N:M; give two counts 0 < N < M such as 2:4 (2 of every 4 "
                             "consecutive inputs pruned)")
    return int(parts[0]), int(parts[1])


def _check(args: argparse.Namespace) -> None:
    for flag, value in (("--amount", args.amount), ("--count", args.count), ("--channels", args.channels or None),
                        ("--heads", args.heads), ("--width", args.width), ("--compact", args.compact or None)):
        if value is not None:
            raise HookscopeError(f"{flag} is not for --method wanda/sparsegpt or --layers-remove; drop {flag}")
    if args.method is not None and args.method not in CALIBRATED:
        if args.sparsity is not None or args.n_m is not None:
            raise HookscopeError("--sparsity and --n-m are for --method wanda or sparsegpt; with "
                                 f"{args.method} give --amount")
        raise HookscopeError(f"--method {args.method} masks weights by --amount; drop it for --layers-remove alone")
    if args.method in CALIBRATED and (args.sparsity is None) == (args.n_m is None):
        raise HookscopeError(f"--method {args.method} needs --sparsity FRACTION (such as 0.5) or --n-m N:M (such "
                             "as 2:4), one of them")
    if args.method is None and (args.sparsity is not None or args.n_m is not None):
        raise HookscopeError("--sparsity and --n-m need --method wanda or sparsegpt")
    if args.method is None and args.layers_remove is None:
        raise HookscopeError("--recover restores what pruning took; add --method wanda/sparsegpt or --layers-remove N")
    if args.data is None:
        raise HookscopeError("give --data: calibration text, a text file, or a tensor file of token ids (.pt, .npy)")
    if args.layers_remove is not None and args.layers_remove < 1:
        raise HookscopeError(f"--layers-remove {args.layers_remove} is not a count of blocks; give 1 or more")
    if args.seqlen < 2:
        raise HookscopeError(f"--seqlen {args.seqlen} is too short; give 2 or more tokens")
    if args.out is not None and os.path.exists(args.out) and not (os.path.isdir(args.out) and args.overwrite):
        raise HookscopeError(f"--out {args.out} exists; give a new folder (or an existing folder with --overwrite)")


def _ids(args: argparse.Namespace, model: nn.Module) -> torch.Tensor:
    """``--data`` as token ids ``[sequences, tokens]``, each in the model's vocabulary."""
    path = args.data
    if os.path.isfile(path) and path.endswith((".pt", ".pth")):
        t = torch.load(path, weights_only=True)
    elif os.path.isfile(path) and path.endswith(".npy"):
        import numpy as np
        t = torch.from_numpy(np.load(path, allow_pickle=False))
    else:
        if not os.path.isfile(path) and _looks_like_a_path(path):
            raise HookscopeError(f"--data {path}: no such file; give an existing text file or tensor file of token "
                                 "ids (.pt, .npy), or the calibration text itself")
        with open(path, encoding="utf-8") if os.path.isfile(path) else _Text(path) as f:
            text = f.read()
        ids = hf_tokenizer(args.config)(text, return_tensors="pt")["input_ids"][0]
        rows = len(ids) // args.seqlen
        if rows < 1:
            raise HookscopeError(f"--data holds {len(ids)} tokens, fewer than one sequence of --seqlen {args.seqlen}; "
                                 "give more text or a smaller --seqlen")
        t = ids[:rows * args.seqlen].reshape(rows, args.seqlen)
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.is_floating_point() or t.numel() == 0:
        raise HookscopeError(f"--data {path} holds no token ids [sequences, tokens] (integers); give such a tensor, "
                             "or text")
    vocab = getattr(_text_config(model), "vocab_size", None)
    if isinstance(vocab, int) and (int(t.min()) < 0 or int(t.max()) >= vocab):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        raise HookscopeError(f"--data {path} holds token id {bad}, outside the model's vocabulary of {vocab} "
                             f"(0 to {vocab - 1}); give ids of this model's tokenizer")
    return t.long()


def _text_config(model: nn.Module) -> Any:
    """The model's config (a multimodal one's text part), or None."""
    config: Any = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _looks_like_a_path(text: str) -> bool:
    """One word with a folder separator or a file suffix: a file name mistyped, not calibration text."""
    if not text or any(c.isspace() for c in text):
        return False
    return os.sep in text or "/" in text or os.path.splitext(text)[1].lower() in (
        ".txt", ".pt", ".pth", ".npy", ".json", ".jsonl", ".md", ".csv", ".text")


class _Text:
    """Text given on the command line, read as a file would be."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __enter__(self) -> _Text:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> str:
        return self.text


def _perplexity(model: nn.Module, ids: torch.Tensor) -> float:
    from ...analysis.prune import lm_loss
    return math.exp(lm_loss(model, [ids]))


def _prune(args: argparse.Namespace, model: nn.Module, ids: torch.Tensor) -> list[Any]:
    from ...analysis.prune import layer_importance, prune, remove_layers

    done: list[Any] = []
    count = getattr(_text_config(model), "num_hidden_layers", None)
    if args.layers_remove is not None and isinstance(count, int) and args.layers_remove >= count:
        raise HookscopeError(f"--layers-remove {args.layers_remove} would leave no block: the model has {count}; "
                             f"give at most {count - 1}")  # said before the pruning runs
    if args.method is not None:
        try:
            done.append(prune(model, method=args.method, data=ids, sparsity=args.sparsity, n_m=_n_m(args.n_m)))
        except HookscopeError as e:
            raise HookscopeError(str(e).replace("sparsity=", "--sparsity ").replace("n_m=", "--n-m ")) from e
    if args.layers_remove is not None:
        scores = layer_importance(model, ids)
        if args.layers_remove >= len(scores.rows):
            raise HookscopeError(f"--layers-remove {args.layers_remove} would leave no block: the model has "
                                 f"{len(scores.rows)}; give at most {len(scores.rows) - 1}")
        done += [scores, remove_layers(model, scores.lowest(args.layers_remove))]
    return done


def run_llm(args: argparse.Namespace) -> int:
    """Prune, remove blocks, recover, report (or write JSON), and save."""
    from ...analysis.prune import recover, remove

    _check(args)
    model = model_from(args)
    ids = _ids(args, model)
    dense = copy.deepcopy(model)
    done = _prune(args, model, ids)
    recovery = recover(model, dense, ids, method="distill") if args.recover else None
    if args.method is not None:
        remove(model)  # permanent after the distillation, which kept the masked weights at zero
    ppl = {"dense": _perplexity(dense, ids), "pruned": recovery.pruned if recovery else _perplexity(model, ids)}
    if recovery is not None:
        ppl["recovered"] = recovery.recovered
    if args.out is not None:
        save = getattr(model, "save_pretrained", None)
        if not callable(save):
            raise HookscopeError(f"{type(model).__name__} has no save_pretrained; --out writes transformers models")
        save(args.out)
    if args.json:
        print(json.dumps({"model": args.model, "pruned": [r.to_dict() for r in done],
                          "recovery": recovery.to_dict() if recovery else None, "perplexity": ppl, "out": args.out},
                         indent=2, default=str))
        return 0
    for r in done:
        print(r.table().rstrip("\n") + "\n")
    if recovery is not None:
        print(recovery.table())
    print("perplexity on the --data tokens: " + ", ".join(f"{k} {v:.4f}" for k, v in ppl.items()))
    if args.out is not None:
        print(f"wrote the pruned model to {args.out} (save_pretrained): load it with hf:causal-lm --config {args.out}")
    return 0
