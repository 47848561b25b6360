"""``hookscope summary MODEL``: the module tree with shapes, parameters, buffers, mult-adds and modes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..analysis.step_memory import step_memory
from ..analysis.summary import summary
from ..core.result import jsonable
from ..errors import HookscopeError
from .inputs import model_input
from ._load import add_model_arguments
from ._common import add_device_argument, add_examples, backward_loss, model_from


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "summary",
        help="run the model once and print its module tree with shapes, parameters and mult-adds",
        description="Runs one forward pass on a seeded random input and prints, per module call in "
        "execution order, the output shapes, own and total parameters (shared tensors counted "
        "once), buffers, multiply-adds and train/eval mode, then the totals.",
    )
    add_model_arguments(p)
    add_device_argument(p)
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="show modules down to this depth of the tree (0: the model only; default: all)")
    p.add_argument("--json", action="store_true", help="print JSON for programs instead of the table")
    p.add_argument("--step-memory", action="store_true",
                   help="then run one training step (training mode; the loss: logsumexp of the output, summed) "
                   "and print what each module holds: saved for backward, parameters, gradients, the peak")
    add_examples(p, ("hookscope summary torchvision:resnet18 --depth 2", "the tree two levels deep, with totals"),
                 ("hookscope summary hookscope.zoo:TinyResNet --input 1x3x64x64",
                  "a model of your own code: package.module:ATTR or file.py:ATTR (it runs)"),
                 ("hookscope summary tiny --json", "every call's numbers, for programs"),
                 ("hookscope summary tiny --step-memory --depth 1", "and the memory of one training step"),
                 ("python -c \"import transformers as t; \\\n"
                  "      t.GPT2Config(n_layer=2, n_embd=96).save_pretrained('gpt2-tiny')\"",
                  "a small GPT-2's config (a folder save_pretrained wrote works the same)"),
                 ("hookscope summary hf:causal-lm --config gpt2-tiny --input-ids '15496 11 995'",
                  "a transformers model (random weights without weights in the folder)"),
                 ("hookscope summary timm:resnet18 --input 1x3x64x64", "a timm model (random weights)"))


def run(args: argparse.Namespace) -> int:
    if args.depth is not None and args.depth < 0:
        raise HookscopeError(f"--depth {args.depth} is negative; pass 0 or more")
    model = model_from(args)
    given = model_input(args, model)
    result = summary(model, given.x, kwargs=given.kwargs, depth=args.depth)
    if args.step_memory:  # a key of the JSON, a second table of the text
        memory = step_memory(model.train(), given.x, kwargs=given.kwargs, loss=backward_loss, depth=args.depth)
        text = result.table() + "\n" + memory.table()
        both = json.dumps(jsonable({**result.to_dict(), "step_memory": memory.to_dict()}), indent=2)
        print(both if args.json else text, end="" if not args.json else "\n")
        return 0
    print(result.to_json(indent=2) if args.json else result.table(), end="" if not args.json else "\n")
    return 0
