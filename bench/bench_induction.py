"""Does a two-layer attention-only GPT-2 learn induction from a random start within a few thousand
steps on one CPU thread? The model of ``tests/_induction.py`` (the same arithmetic, the MLPs left out)
trained from random weights on one of three kinds of sequences of random tokens, then read three ways:

- the loss of the tokens the repetition decides (chance: ln(vocab));
- each head's previous-token score (block 0: its mean attention from each position to the one before)
  and prefix-matching score (block 1: its attention to the positions right after earlier copies of the
  current token, where it has one), the signatures of the two heads of the induction circuit;
- how much zeroing each head's output (and each whole block's) raises that loss, on fresh sequences.

Kinds of sequences: ``stretch`` (a stretch of ``period`` tokens repeated right after itself, at a
random offset: the tests' kind), ``periodic`` (from a random offset on, one stretch repeated to the
end), ``gapped`` (a stretch copied later, random tokens between). ``--bos`` starts every sequence with
a token of its own. ``--skip F`` replaces a fraction F of each training batch by sequences in which every
token is a fixed permutation of the one two places before (``skip``: a task a previous-token head solves
alone, to give that head a use of its own before induction pays); the readings stay on the repetitions.
``--on-repeats`` reads the prefix-matching score only at the positions the repetition decides (the
brief's definition) rather than at every position with an earlier copy of its token.

    nice -n 10 python bench/bench_induction.py --steps 2500
    nice -n 10 python bench/bench_induction.py --kind gapped --vocab 64 --length 16 --period 2 4 --seeds 0 1 2
    taskset -c 0 nice -n 10 python bench/bench_induction.py --kind gapped --length 32 --period 6 12 --width 32 \
        --init 0.2 --lr 3e-3 --skip 0.25 --on-repeats --steps 5000 --dtype float64 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import torch
from torch import nn


def sequences(kind: str, n: int, g: torch.Generator, vocab: int, length: int, period: tuple[int, int],
              bos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences and the mask of the positions whose next token the repetition decides."""
    if bos:
        ids, mask = sequences(kind, n, g, vocab - 1, length - 1, period, False)
        return (torch.cat([torch.full((n, 1), vocab - 1), ids], 1),
                torch.cat([torch.zeros(n, 1, dtype=torch.bool), mask], 1))
    ids = torch.randint(0, vocab, (n, length), generator=g)
    t = torch.randint(period[0], period[1] + 1, (n, 1), generator=g)
    room = length - 2 * t
    o = (torch.rand(n, 1, generator=g) * (room + 1)).floor().long()
    j = torch.arange(length)[None]
    if kind == "periodic":
        src, mask = torch.where(j >= o + t, o + (j - o) % t, j), (j >= o + t) & (j < length - 1)
    else:
        o2 = o + t if kind == "stretch" else o + t + (torch.rand(n, 1, generator=g) * (room - o + 1)).floor().long()
        src, mask = torch.where((j >= o2) & (j < o2 + t), j - o2 + o, j), (j >= o2) & (j < o2 + t - 1)
    return ids.gather(1, src), mask


def skip_bigrams(n: int, g: torch.Generator, vocab: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences in which each token is a fixed permutation of the token two places before (the
    first two random), and the mask of every position whose next token that decides."""
    pi = torch.randperm(vocab, generator=torch.Generator().manual_seed(123))
    ids = torch.randint(0, vocab, (n, length), generator=g)
    for t in range(2, length):
        ids[:, t] = pi[ids[:, t - 2]]
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, 1:-1] = True
    return ids, mask


def training_batch(a: argparse.Namespace, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of ``a.kind``'s sequences, its first ``a.skip`` fraction replaced by skip bigrams."""
    ids, mask = sequences(a.kind, a.batch, g, a.vocab, a.length, tuple(a.period), a.bos)
    m = int(a.batch * a.skip)
    if m:
        ids[:m], mask[:m] = skip_bigrams(m, g, a.vocab, a.length)
    return ids, mask


def repeated_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    return loss.reshape(ids.shape[0], -1)[mask[:, :-1]].mean()


def parameters(vocab: int, length: int, width: int, g: torch.Generator, init: float) -> dict[str, torch.Tensor]:
    p = {"wte": torch.randn(vocab, width, generator=g) * init, "wpe": torch.randn(length, width, generator=g) * init}
    for i in range(2):
        p[f"{i}.ln_w"], p[f"{i}.ln_b"] = torch.ones(width), torch.zeros(width)
        p[f"{i}.attn_w"], p[f"{i}.attn_b"] = torch.randn(width, 3 * width, generator=g) * init, torch.zeros(3 * width)
        p[f"{i}.proj_w"], p[f"{i}.proj_b"] = torch.randn(width, width, generator=g) * init, torch.zeros(width)
    p["lnf_w"], p["lnf_b"] = torch.ones(width), torch.zeros(width)
    return {k: v.requires_grad_(True) for k, v in p.items()}


def forward(p: dict[str, torch.Tensor], ids: torch.Tensor, heads: int, zero: tuple[int, slice | int] | None = None,
            patterns: list[torch.Tensor] | None = None) -> torch.Tensor:
    """GPT-2's arithmetic without MLPs; ``zero``: (block, heads) whose output is zeroed."""
    n, t = ids.shape
    width = p["wte"].shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    x = p["wte"][ids] + p["wpe"][:t]
    for i in range(2):
        h = nn.functional.layer_norm(x, (width,), p[f"{i}.ln_w"], p[f"{i}.ln_b"])
        q, k, v = ((h @ p[f"{i}.attn_w"] + p[f"{i}.attn_b"]).reshape(n, t, 3, heads, -1).permute(2, 0, 3, 1, 4))
        a = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf")).softmax(-1)
        if patterns is not None:
            patterns.append(a)
        z = a @ v
        if zero is not None and zero[0] == i:
            z = z.clone()
            z[:, zero[1]] = 0
        x = x + z.transpose(1, 2).reshape(n, t, width) @ p[f"{i}.proj_w"] + p[f"{i}.proj_b"]
    return nn.functional.layer_norm(x, (width,), p["lnf_w"], p["lnf_b"]) @ p["wte"].t()


def train(a: argparse.Namespace, seed: int) -> tuple[dict[str, torch.Tensor], float]:
    """The trained weights and the milliseconds per step."""
    p = parameters(a.vocab, a.length, a.width, torch.Generator().manual_seed(seed), a.init)
    p = {k: v.detach().to(getattr(torch, a.dtype)).requires_grad_(True) for k, v in p.items()}
    opt = torch.optim.AdamW(p.values(), lr=a.lr, betas=(0.9, 0.99), weight_decay=a.weight_decay)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup))
    g = torch.Generator().manual_seed(seed + 1)
    start = time.perf_counter()
    for _ in range(a.steps):
        ids, mask = training_batch(a, g)
        loss = repeated_loss(forward(p, ids, a.heads), ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        warm.step()
    return {k: v.detach() for k, v in p.items()}, 1000 * (time.perf_counter() - start) / a.steps


Readings = tuple[float, list[float], list[float], list[list[float]], list[float]]


def read(p: dict[str, torch.Tensor], a: argparse.Namespace) -> Readings:
    """The repeated tokens' loss, each head's signature scores and the loss each ablation adds."""
    ids, mask = sequences(a.kind, 512, torch.Generator().manual_seed(7), a.vocab, a.length, tuple(a.period), a.bos)
    with torch.no_grad():
        pats: list[torch.Tensor] = []
        base = float(repeated_loss(forward(p, ids, a.heads, patterns=pats), ids, mask))
        t = ids.shape[1]
        after = torch.zeros(ids.shape[0], t, t, dtype=torch.bool)
        after[:, :, 1:] = ids[:, :, None] == ids[:, None, :-1]  # key j follows an earlier copy of query's token
        after &= torch.ones(t, t, dtype=torch.bool).tril(-1)
        has = mask if a.on_repeats else after.any(-1)
        prev = [float(pats[0][:, h].diagonal(-1, -2, -1).mean()) for h in range(a.heads)]
        match = [float((pats[1][:, h] * after).sum(-1)[has].mean()) for h in range(a.heads)]
        rise = [[float(repeated_loss(forward(p, ids, a.heads, (b, h)), ids, mask)) - base for h in range(a.heads)]
                for b in range(2)]
        blocks = [float(repeated_loss(forward(p, ids, a.heads, (b, slice(None))), ids, mask)) - base for b in range(2)]
    return base, prev, match, rise, blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["stretch", "periodic", "gapped"], default="periodic")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--period", type=int, nargs=2, default=[3, 5])
    ap.add_argument("--bos", action="store_true")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--init", type=float, default=0.2, help="std of the random starting weights")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--skip", type=float, default=0.0, help="fraction of each batch of skip bigrams")
    ap.add_argument("--on-repeats", action="store_true", help="prefix-matching read at the repeated positions only")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{platform.machine()}, torch {torch.__version__}, 1 thread, load {os.getloadavg()}, {vars(a)}")
    print(f"chance: ln({a.vocab}) = {math.log(a.vocab):.2f}\n")
    print("| seed | ms/step | repeated loss | block 0 prev-token scores | block 1 prefix-match scores "
          "| head ablations: loss + | block ablations: loss + |")
    print("|---|---|---|---|---|---|---|")
    for seed in a.seeds:
        p, ms = train(a, seed)
        loss, prev, match, rise, blocks = read(p, a)
        print(f"| {seed} | {ms:.1f} | {loss:.2f} | {_row(prev)} | {_row(match)} | {' / '.join(map(_row, rise))} "
              f"| {_row(blocks)} |")


def _row(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    main()
