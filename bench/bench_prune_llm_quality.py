"""Quality of the language-model pruning on a small decoder trained here: held-out perplexity of magnitude,
Wanda and SparseGPT masks (50% and 2:4), of whole blocks removed, of heads and MLP units compacted, each
before and after recovery.

The language: a seeded order-2 source over 16 tokens (each pair of previous tokens is followed by one of
two tokens, p = 0.8 / 0.2; its own perplexity, the floor, is 1.649). The model: LLaMA-style, 3 layers,
width 32, 4 query heads sharing 2 key/value heads, MLP width 64, trained with Adam (lr 1e-2) on fresh text
each step. Calibration: 32 sequences of 16 tokens; held-out: 64 other sequences. Magnitude masks are put
on the same layers as the calibrated ones (the decoder blocks' linear layers), the lowest |W| of each row
(or of each group of 4). Recovery: ``hookscope.recover`` (``distill``: 30 Adam steps, lr 3e-3, towards the
dense model's output distribution; ``lstsq``: the closed-form refit of each projection whose inputs were
pruned).

Run: nice -n 10 .venv/bin/python bench/bench_prune_llm_quality.py [--steps 300] > /tmp/prune_llm_quality.md
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import platform
import time

import torch
import transformers
from torch import nn

import hookscope

V, T = 16, 16


def text(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(7)
    nxt = torch.stack([torch.randperm(V, generator=fixed)[:2] for _ in range(V * V)])
    out = torch.empty(n, T, dtype=torch.long)
    out[:, :2] = torch.randint(0, V, (n, 2), generator=g)
    for t in range(2, T):
        pick = (torch.rand(n, generator=g) < 0.2).long()
        out[:, t] = nxt[out[:, t - 2] * V + out[:, t - 1], pick]
    return out


def train(steps: int) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                   tie_word_embeddings=False, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        ids = text(16, step)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def ppl(model: nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return math.exp(float(model(ids, labels=ids).loss))


def magnitude(model: nn.Module, n_m: tuple[int, int] | None) -> nn.Module:
    for block in model.model.layers:
        for m in block.modules():
            if type(m) is nn.Linear:
                w = m.weight.detach()
                if n_m is not None:
                    groups = w.abs().reshape(w.shape[0], -1, n_m[1])
                    idx = groups.topk(n_m[0], -1, largest=False).indices
                    pruned = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, idx, True).reshape(w.shape)
                else:
                    idx = w.abs().sort(dim=-1, stable=True).indices[:, :w.shape[1] // 2]
                    pruned = torch.zeros_like(w, dtype=torch.bool).scatter_(1, idx, True)
                with torch.no_grad():
                    m.weight[pruned] = 0
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lm = train(args.steps)
    trained_s = time.perf_counter() - t0
    cal, held = text(32, 20_000), text(64, 10_000)
    floor = math.exp(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))
    rows = [("dense", "", ppl(lm, held), None)]
    for label, setting in (("50%", {"sparsity": 0.5}), ("2:4", {"n_m": (2, 4)})):
        rows.append((f"magnitude {label}", "", ppl(magnitude(copy.deepcopy(lm), setting.get("n_m")), held), None))
        for method in ("wanda", "sparsegpt"):
            net = copy.deepcopy(lm)
            hookscope.prune(net, method=method, data=cal, **setting)
            r = hookscope.recover(net, lm, cal, method="distill", held_out=held, steps=30, lr=3e-3)
            rows.append((f"{method} {label}", "distill", r.pruned, r.recovered))
    cut = copy.deepcopy(lm)
    chosen = hookscope.layer_importance(cut, cal).lowest(1)
    hookscope.remove_layers(cut, chosen)
    r = hookscope.recover(cut, lm, cal, method="distill", held_out=held, steps=30, lr=3e-3, layers="model.norm")
    rows.append((f"block {chosen[0]} of 3 removed (lowest influence)", "distill", r.pruned, r.recovered))
    heads = copy.deepcopy(lm)
    hookscope.prune_heads(heads, cal[:1], amount=0.5, mlp=0.5, data=cal)
    small = hookscope.compact(heads, cal[:1])
    for method in ("lstsq", "distill"):
        r = hookscope.recover(copy.deepcopy(small), lm, cal, method=method, held_out=held, steps=30, lr=3e-3)
        rows.append(("50% of heads and MLP units, compacted", method, r.pruned, r.recovered))
    load = os.getloadavg()
    print("## Language-model pruning: quality on a decoder trained here (`bench/bench_prune_llm_quality.py`)\n")
    print(f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {datetime.date.today()}, load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; trained {args.steps} steps in {trained_s:.0f} s.")
    print(f"Command: `nice -n 10 .venv/bin/python bench/bench_prune_llm_quality.py --steps {args.steps}`. "
          f"Held-out perplexity, 64 x 16 tokens; the source's own: {floor:.3f}.\n")
    print("| model | recovery | perplexity after pruning | after recovery |")
    print("|---|---|---|---|")
    for name, how, after, rec in rows:
        print(f"| {name} | {how or '-'} | {after:.3f} | {'-' if rec is None else f'{rec:.3f}'} |")


if __name__ == "__main__":
    main()
