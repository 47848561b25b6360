"""``hookscope lens``: every layer's residual stream read through the model's final norm and
unembedding (the logit lens), printed as a table per position, drawn as a heatmap (``--plot``), or
printed as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from ..analysis.circuits import load_lens, logit_lens
from ..errors import HookscopeError
from ._common import add_examples, add_plot_argument, check_plot, save_plot
from ._load import add_model_arguments, load_model, model_session
from .inputs import hf_tokenizer, model_input, tokenizer_files

EXAMPLES = (("python -c \"import transformers as t; \\\n"
             "      c = t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100); \\\n"
             "      t.GPT2LMHeadModel(c).save_pretrained('gpt2-tiny')\"",
             "a small GPT-2 saved as save_pretrained writes it (random weights)"),
            ("hookscope lens hf:causal-lm --config gpt2-tiny --input-ids '15 11 95 4'",
             "the top token, the followed token's rank and probability, and the KL divergence to the final "
             "distribution, per layer, at the last position"),
            ("hookscope lens hf:causal-lm --config gpt2-tiny --input-ids '15 11 95 4' \\\n"
             "      --token 7 --position 2 --plot lens.png",
             "token 7 followed at every layer and position, drawn as a heatmap"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lens", help="the logit lens: what each layer's residual stream predicts",
        description="Runs a language model (a decoder of a family `hookscope.components` knows) on one "
        "sequence (--input-ids, or --text through the --config folder's tokenizer) and reads each layer's "
        "residual stream as if it were the last: through the model's own final norm, its scale computed for "
        "that stream, and its unembedding. Prints, per layer at --position, the most likely token, the "
        "followed token's rank and probability and the KL divergence to the model's final distribution.")
    add_model_arguments(p)
    p.add_argument("--token", metavar="T", default=None,
                   help="the token followed: an id, or with a tokenizer its text (default: the model's final "
                        "prediction at each position)")
    p.add_argument("--position", metavar="P", type=int, default=-1, help="the position the table shows "
                   "(default -1: the last)")
    p.add_argument("--tuned", metavar="DIR", default=None,
                   help="read the streams through a tuned lens saved in DIR (TunedLens.save, tuned for this "
                        "model by hookscope.tune_lens) instead of the plain logit lens")
    p.add_argument("--top", metavar="K", type=int, default=5, help="the most likely tokens each row keeps "
                   "(JSON; default 5)")
    add_plot_argument(p, "the followed token's probability, layer by position")
    p.add_argument("--json", action="store_true", help="print the result as JSON, nothing else")
    add_examples(p, *EXAMPLES)


def tokenizer_of(args: argparse.Namespace) -> Any:
    """The ``--config`` folder's tokenizer, when the folder holds one."""
    folder = getattr(args, "config", None)
    if folder is None or not tokenizer_files(folder):
        return None
    return hf_tokenizer(folder)


def token_of(text: str | None, tokenizer: Any, flag: str) -> int | None:
    """A token named on the command line: an id, or a text the tokenizer makes one token of."""
    if text is None:
        return None
    if text.strip().isdigit():
        return int(text)
    if tokenizer is None:
        raise HookscopeError(f"{flag} {text!r} is not a token id; give an id, or --config a folder with the model's "
                             "tokenizer to name a token by its text")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise HookscopeError(f"{flag} {text!r} is {len(ids)} tokens for the tokenizer ({ids}); give one token, or "
                             "its id")
    return int(ids[0])


def run(args: argparse.Namespace) -> int:
    with model_session(args):
        check_plot(args.plot)
        if args.top < 1:
            raise HookscopeError(f"--top {args.top} must be 1 or more")
        tuned = load_lens(args.tuned) if args.tuned is not None else None
        model = load_model(args.model, seed=args.seed, weights=args.weights)
        given = model_input(args, model)
        if given.x.dim() != 2 or given.x.shape[0] != 1:
            raise HookscopeError(f"the lens reads one sequence; the input holds {given.x.shape[0]}: give one with "
                                 "--input-ids or --text")
        lens = logit_lens(model, given.x, token=token_of(args.token, tokenizer_of(args), "--token"), top=args.top,
                          tuned=tuned, kwargs={k: v for k, v in given.kwargs.items() if k != "attention_mask"})
        length = given.x.shape[1]
        if not -length <= args.position < length:
            raise HookscopeError(f"--position {args.position} is outside the {length} positions of the input")
        print(lens.to_json(indent=2) if args.json else lens.table(args.position))
        if args.plot is not None:
            from ..viz.circuits import plot_logit_lens

            save_plot(args.plot, plot_logit_lens(lens), quiet=args.json)
    return 0
