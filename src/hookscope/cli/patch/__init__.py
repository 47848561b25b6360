"""``hookscope patch``: an activation patching sweep between a clean and a corrupted prompt (and its
attribution-patching estimate beside it), printed as a grid, drawn as a heatmap (``--plot``), or
printed as JSON. A folder of its own, since the command line's folder holds as many modules as it may."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import torch

from ...analysis.circuits import HEAD_KINDS, METRICS, STREAM_KINDS, activation_patching, attribution_patching
from ...errors import HookscopeError
from .._common import add_examples, add_plot_argument, check_plot, save_plot
from .._load import load_model, model_session, seed_arg
from ..inputs import text_tokens
from ..lens import token_of, tokenizer_of

EXAMPLES = (("python -c \"import transformers as t; \\\n"
             "      c = t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100); \\\n"
             "      t.GPT2LMHeadModel(c).save_pretrained('gpt2-tiny')\"",
             "a small GPT-2 saved as save_pretrained writes it (random weights)"),
            ("hookscope patch hf:causal-lm --config gpt2-tiny --clean '15 11 95 4' \\\n"
             "      --corrupted '15 12 95 4' --answer 7 --wrong 9",
             "the residual stream patched at each layer and position, clean into corrupted"),
            ("hookscope patch hf:causal-lm --config gpt2-tiny --clean '15 11 95 4' \\\n"
             "      --corrupted '15 12 95 4' --answer 7 --wrong 9 --component attn.z \\\n"
             "      --attribution --steps 8 --plot heads.png",
             "each head patched, beside its EAP-IG estimate and their correlation, drawn as heatmaps"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "patch", help="activation patching sweeps between a clean and a corrupted prompt",
        description="Runs a language model (a decoder of a family `hookscope.components` knows) on a clean and "
        "a corrupted prompt of the same length and patches one activation at a time from one run into the "
        "other (--direction denoise: clean into corrupted; noise: corrupted into clean), many cells per "
        "forward pass (--batch-size), measuring --metric at the last position. Prints the metric of each "
        "cell: layer x position for a stream (--component resid_pre ...), layer x head for a head kind (attn.z ...), "
        "layer x kind for several kinds (--component attn_out,mlp_out). --attribution adds the first-order "
        "estimate of every cell from one backward pass (with --steps, integrated along the path: EAP-IG) "
        "and its correlation with the real sweep.")
    p.add_argument("model", metavar="MODEL", help="hf:CLASS_OR_TASK with --config, or any MODEL the other "
                   "commands take that is a decoder of a known family")
    p.add_argument("--config", metavar="PATH", default=None,
                   help="for hf:CLASS_OR_TASK: a folder save_pretrained wrote (and its tokenizer, for texts)")
    p.add_argument("--weights", metavar="FILE", default=None, help="load these weights into MODEL")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed for random weights (default 0)")
    p.add_argument("--clean", metavar="PROMPT", required=True,
                   help="the clean prompt: token ids such as '15 11 95', or a text for the --config tokenizer")
    p.add_argument("--corrupted", metavar="PROMPT", required=True,
                   help="the corrupted prompt, as many tokens as --clean")
    p.add_argument("--answer", metavar="T", default=None, help="the token the clean prompt should give: an id "
                   "or, with a tokenizer, its text")
    p.add_argument("--wrong", metavar="T", default=None, help="the token the corrupted prompt gives (logit_diff)")
    p.add_argument("--metric", choices=METRICS, default="logit_diff",
                   help="logit[answer] - logit[wrong] (default), logit[answer], or p(answer)")
    p.add_argument("--component", metavar="NAME", default="resid_pre",
                   help=f"the component swept: {', '.join(STREAM_KINDS + HEAD_KINDS)}, or several joined by commas "
                        "(default resid_pre)")
    p.add_argument("--per", choices=("position", "head", "layer"), default=None,
                   help="the columns: positions (streams' default), heads (head kinds' default), or whole layers")
    p.add_argument("--direction", choices=("denoise", "noise"), default="denoise")
    p.add_argument("--batch-size", metavar="N", type=int, default=64, help="cells per forward pass (default 64)")
    p.add_argument("--attribution", action="store_true", help="also estimate every cell by attribution patching")
    p.add_argument("--steps", metavar="N", type=int, default=0,
                   help="with --attribution: EAP-IG's points on the path (default 0: the plain gradient)")
    add_plot_argument(p, "the sweep as a layer x column heatmap (with --attribution, NAME_attribution.png too)")
    p.add_argument("--json", action="store_true", help="print the result as JSON, nothing else")
    add_examples(p, *EXAMPLES)


def prompt(text: str, tokenizer: Any, flag: str, config: str | None) -> torch.Tensor:
    """A prompt given as token ids or, with the ``--config`` folder's tokenizer, as text."""
    words = [w for w in re.split(r"[\s,]+", text.strip()) if w]
    if words and all(re.fullmatch(r"\d+", w) for w in words):
        return torch.tensor([[int(w) for w in words]])
    if tokenizer is None:
        raise HookscopeError(f"{flag} {text!r} is not token ids such as '15 11 95'; give ids, or --config a folder "
                             "with the model's tokenizer to give a text")
    return text_tokens(text, config).ids[:1]


def _sweeps(args: argparse.Namespace, model: torch.nn.Module, tokenizer: Any) -> tuple[Any, Any]:
    clean = prompt(args.clean, tokenizer, "--clean", args.config)
    corrupted = prompt(args.corrupted, tokenizer, "--corrupted", args.config)
    component: str | list[str] = args.component.split(",") if "," in args.component else args.component
    kw = dict(answer=token_of(args.answer, tokenizer, "--answer"), wrong=token_of(args.wrong, tokenizer, "--wrong"),
              metric=args.metric, component=component, per=args.per, direction=args.direction, batch_size=args.batch_size)
    real = activation_patching(model, clean, corrupted, **kw)
    est = attribution_patching(model, clean, corrupted, steps=args.steps, **kw) if args.attribution else None
    return real, est


def run(args: argparse.Namespace) -> int:
    with model_session(args):
        check_plot(args.plot)
        if args.steps and not args.attribution:
            raise HookscopeError("--steps is attribution patching's; add --attribution, or drop --steps")
        model = load_model(args.model, seed=args.seed, weights=args.weights, config=args.config)
        real, est = _sweeps(args, model, tokenizer_of(args))
        if args.json:
            out = {"patching": real.to_dict(), **({"attribution": est.to_dict(), "correlation": real.correlation(est)}
                                                 if est is not None else {})}
            from ...core.result import jsonable

            print(json.dumps(jsonable(out), indent=2))
        else:
            print(real.table())
            if est is not None:
                print(f"\n{est.table()}\ncorrelation with the real sweep: {real.correlation(est):.3f}")
        if args.plot is not None:
            from ...viz.circuits import plot_patching

            save_plot(args.plot, plot_patching(real), quiet=args.json)
            if est is not None:
                stem, dot, suffix = args.plot.rpartition(".")
                path = f"{stem}_attribution.{suffix}" if dot else f"{args.plot}_attribution"
                save_plot(path, plot_patching(est), quiet=args.json)
    return 0
