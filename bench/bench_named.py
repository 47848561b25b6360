"""Component names as layers: a capture or edit of a component name against the same capture of the
module that holds it, and a plain forward, on a small GPT-2 config (the names resolved and checked
once, before the rounds: each round pays the selection, the site's hooks and the view).

Run:  .venv/bin/python bench/bench_named.py            (about a minute on 2 CPU cores)

Timing: the methods run interleaved, round after round, in one process (the order alternates); each
figure is the median over rounds, and each ratio the median over rounds of the method's time over the
plain forward's in the same round.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import torch
import transformers

import hookscope
from _rounds import ratios  # bench/_rounds.py: this folder is on sys.path when run as a script


def main() -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=6, n_embd=256, n_head=8, vocab_size=1000, n_positions=256,
                                     bos_token_id=0, eos_token_id=0)
    lm = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 1000, (4, 128))
    hookscope.components(lm)  # resolved and checked once: what every later use of a name goes by
    steer = torch.randn(256) * 0.01

    def run(make: object = None) -> None:
        with torch.no_grad():
            if make is None:
                lm(ids)
                return
            with make():  # type: ignore[operator]
                lm(ids)

    runs = {
        "plain forward": lambda: run(),
        "capture('transformer.h.3')": lambda: run(lambda: hookscope.capture(lm, "transformer.h.3")),
        "capture('blocks.3.resid_post')": lambda: run(lambda: hookscope.capture(lm, "blocks.3.resid_post")),
        "capture('transformer.h.3.attn.c_proj', keep='input')":
            lambda: run(lambda: hookscope.capture(lm, "transformer.h.3.attn.c_proj", keep="input")),
        "capture('blocks.3.attn.z')": lambda: run(lambda: hookscope.capture(lm, "blocks.3.attn.z")),
        "capture('blocks.3.attn.q') (fused c_attn)": lambda: run(lambda: hookscope.capture(lm, "blocks.3.attn.q")),
        "edit('transformer.h.3', output=add)": lambda: run(lambda: hookscope.edit(
            lm, "transformer.h.3", output=lambda o: (o[0] + steer, *o[1:]) if isinstance(o, tuple) else o + steer)),
        "edit('blocks.3.resid_post', output=add)": lambda: run(lambda: hookscope.edit(
            lm, "blocks.3.resid_post", output=lambda x: x + steer)),
    }
    medians, per_round = ratios(runs, rounds=40, base="plain forward", warmup=2)
    print(f"## Component names as layers (`bench/bench_named.py`)\n")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {os.getloadavg()[0]:.2f}; GPT-2 config 6 x 256, batch 4 x 128 tokens, 40 rounds. "
          f"Command: `nice -n 10 .venv/bin/python {' '.join(sys.argv)}`.\n")
    print("| run | ms, median | vs plain forward (median of per-round ratios) |\n|---|---|---|")
    for k in runs:
        print(f"| {k} | {medians[k] * 1e3:.2f} | {per_round[k]:.3f}x |")


if __name__ == "__main__":
    main()
