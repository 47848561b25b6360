"""Patching sweeps: what a full layer x position residual sweep costs batched against the same sweep
as a loop of ``hookscope.edit`` calls (one forward pass a cell), and attribution patching (one forward
and one backward pass; EAP-IG with 8 points) against the real sweep, with the estimates' correlation.

Run:  .venv/bin/python bench/bench_circuits.py            (GPT-2 config: 4 blocks, width 128, 4 heads,
                                                           vocabulary 1000; 32 tokens; 5 rounds)
      .venv/bin/python bench/bench_circuits.py --rounds 3 --blocks 2

Model: ``transformers.GPT2LMHeadModel`` of that config, random weights (seed 0, ``initializer_range``
0.1 so the sweep has structure), eval mode, CPU. Prompts: 32 random ids; the corrupted one differs at
positions 5 and 20. Metric: ``logit[answer] - logit[wrong]`` at the last position.

Timing: the variants run interleaved, round after round (the order alternates), median per variant;
each ratio is the median over rounds of the variant's time over the batched sweep's in the same round.
The loop and the batched sweep are also checked to give the same values (within 1e-5).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from datetime import datetime, timezone

import torch
import transformers

import hookscope
from _rounds import cpu_model, median_interval, timings  # bench/_rounds.py: this folder is on sys.path when run


def build(blocks: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=blocks, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
                                     initializer_range=0.1)
    return transformers.GPT2LMHeadModel(config).eval()


def loop(model: torch.nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    """The same sweep written by hand: the clean stream captured, then one edit and one pass per cell."""
    comps = hookscope.components(model)
    names = [comps[f"blocks.{i}.resid_pre"].module for i in range(comps.blocks)]
    with hookscope.capture(model, *names, keep="input") as rec, torch.no_grad():
        model(clean)
    out = torch.zeros(len(names), clean.shape[1], dtype=torch.float64)
    for i, name in enumerate(names):
        source = rec[name][0].input
        for p in range(clean.shape[1]):
            def change(old: torch.Tensor, p: int = p, source: torch.Tensor = source) -> torch.Tensor:
                new = old.clone()
                new[:, p] = source[:, p]
                return new
            with hookscope.edit(model, name, input=change), torch.no_grad():
                logits = model(corrupted).logits[0, -1]
            out[i, p] = float(logits[answer] - logits[wrong])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build(args.blocks)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 1000, (1, args.tokens), generator=g)
    corrupted = clean.clone()
    corrupted[0, 5], corrupted[0, 20] = (clean[0, 5] + 1) % 1000, (clean[0, 20] + 1) % 1000
    answer, wrong = 7, 11
    kw = dict(answer=answer, wrong=wrong)
    held: dict[str, object] = {}
    runs = {
        "batched (64 cells a pass)": lambda: held.__setitem__("batched", hookscope.activation_patching(
            model, clean, corrupted, batch_size=64, **kw)),
        "loop of edit calls": lambda: held.__setitem__("loop", loop(model, clean, corrupted, answer, wrong)),
        "attribution patching": lambda: held.__setitem__("eap", hookscope.attribution_patching(
            model, clean, corrupted, **kw)),
        "EAP-IG, 8 steps": lambda: held.__setitem__("ig", hookscope.attribution_patching(
            model, clean, corrupted, steps=8, **kw)),
    }
    times = timings(runs, args.rounds)
    batched, eap, ig = held["batched"], held["eap"], held["ig"]
    err = float((batched.values - held["loop"]).abs().max())  # type: ignore[attr-defined, operator]
    assert err <= 1e-5, err
    base = "batched (64 cells a pass)"
    cells = args.blocks * args.tokens
    load = os.getloadavg()
    print(f"### Patching sweeps ({datetime.now(timezone.utc):%Y-%m-%d}, {cpu_model()}, {os.cpu_count()} cores, "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; torch {torch.__version__}, one thread, "
          f"Python {platform.python_version()})\n")
    print(f"`nice -n 10 python bench/bench_circuits.py --rounds {args.rounds} --blocks {args.blocks}`: GPT-2 config, "
          f"{args.blocks} blocks, width 128, vocabulary 1000, {args.tokens} tokens: a resid_pre sweep of {cells} "
          f"cells. Median of {args.rounds} interleaved rounds; ratio to the batched sweep per round, median "
          "(95% interval).\n")
    print("| variant | median | ratio |\n|---|---|---|")
    for k, ts in times.items():
        r = [t / b for t, b in zip(ts, times[base])]
        lo, hi = median_interval(r)
        print(f"| {k} | {statistics.median(ts) * 1e3:.0f} ms | {statistics.median(r):.2f}x ({lo:.2f}-{hi:.2f}) |")
    print(f"\nThe batched sweep equals the loop within {err:.1e}. Correlation with the real sweep: attribution "
          f"patching {batched.correlation(eap):.3f}, EAP-IG (8 steps) {batched.correlation(ig):.3f}.")  # type: ignore


if __name__ == "__main__":
    main()
