"""A small causal LM, trained here, pruned: perplexity before, after pruning and after a short recovery fine-tune.

The language: a seeded order-2 Markov source over 32 tokens (each pair of previous tokens allows 3
next tokens, with Dirichlet(1) probabilities), so the next token depends on the two before it and the
model needs its attention. Its entropy rate gives the floor no model can beat ("source" row).
The model: LLaMA-style (transformers' LlamaForCausalLM), 4 layers, width 128, 8 query heads sharing
4 key/value heads, MLP width 384. Trained with AdamW on freshly generated text; the trained weights
are cached (``$HOOKSCOPE_BENCH_CACHE`` or ``~/.cache/hookscope-bench``) and retrained when absent.

Then, for 25% and 50%: ``prune_heads(..., mlp=share)``, the heads and the MLP hidden units scored in
one pass over training text (importance "output": the heads' output norms, the units' mean
|activation|), ``compact``, and ``RECOVER_STEPS`` steps of the same
training loop on the compacted model. Perplexity on the same held-out text for every row
(``compare_models(..., data=held_out)``: exp of the mean next-token NLL), parameters, and CPU time per
token (one batch of 8 x 64 tokens, median of interleaved runs, one thread).

Run: .venv/bin/python bench/bench_prune_lm.py [--retrain] > /tmp/prune_lm.md
"""

from __future__ import annotations

import copy
import math
import os
import platform
import sys
import time

import torch
import transformers

import hookscope

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import cpu_model  # noqa: E402

V, T, BATCH = 32, 64, 16
TRAIN_STEPS, RECOVER_STEPS, LR, RECOVER_LR = 800, 100, 3e-3, 1e-3
SEED = 0
CACHE = os.environ.get("HOOKSCOPE_BENCH_CACHE", os.path.expanduser("~/.cache/hookscope-bench"))


def source(seed: int = SEED) -> torch.Tensor:
    """``[V * V, V]`` next-token probabilities per context ``(a, b) -> a * V + b``: 3 tokens each."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.zeros(V * V, V)
    for ctx in range(V * V):
        nxt = torch.randperm(V, generator=g)[:3]
        probs[ctx, nxt] = _dirichlet3(g)
    return probs


def _dirichlet3(g: torch.Generator) -> torch.Tensor:
    e = -torch.log(torch.rand(3, generator=g))  # exponentials, normalised: Dirichlet(1, 1, 1)
    return e / e.sum()


def text(probs: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` sequences of ``T`` tokens drawn from the source."""
    out = torch.empty(n, T, dtype=torch.long)
    out[:, :2] = torch.randint(0, V, (n, 2), generator=g)
    for t in range(2, T):
        out[:, t] = torch.multinomial(probs[out[:, t - 2] * V + out[:, t - 1]], 1, generator=g).squeeze(1)
    return out


def source_perplexity(probs: torch.Tensor, ids: torch.Tensor) -> float:
    """The source's own perplexity on ``ids`` (tokens 2.. given the two before): the floor."""
    p = probs[ids[:, :-2] * V + ids[:, 1:-1]].gather(-1, ids[:, 2:, None])
    return math.exp(float(-p.log().mean()))


def build() -> transformers.LlamaForCausalLM:
    torch.manual_seed(SEED)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                                   max_position_embeddings=T, tie_word_embeddings=False, use_cache=False)
    return transformers.LlamaForCausalLM(cfg)


def fit(model: torch.nn.Module, probs: torch.Tensor, steps: int, lr: float, seed: int) -> torch.nn.Module:
    """AdamW, linear warm-up then cosine decay, a fresh batch of text each step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    for step in range(steps):
        ids = text(probs, BATCH, g)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step}: loss {loss.item():.3f}", file=sys.stderr, flush=True)
    return model.eval()


def trained(probs: torch.Tensor, retrain: bool) -> torch.nn.Module:
    path = os.path.join(CACHE, f"prune_lm_v{V}_t{T}_s{TRAIN_STEPS}_seed{SEED}.pt")
    model = build()
    if os.path.exists(path) and not retrain:
        model.load_state_dict(torch.load(path))
        return model.eval()
    t0 = time.perf_counter()
    fit(model, probs, TRAIN_STEPS, LR, SEED + 1)
    print(f"trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    os.makedirs(CACHE, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model


def pruned(model: torch.nn.Module, share: float, calib: list[torch.Tensor]) -> torch.nn.Module:
    masked = copy.deepcopy(model)
    probe = calib[0]
    hookscope.prune_heads(masked, probe, amount=share, data=calib, mlp=share)
    return hookscope.compact(masked, probe)


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)  # the machine's 2 cores are shared: one thread wastes no time spinning
    probs = source()
    held_out = list(text(probs, 64, torch.Generator().manual_seed(123)).split(16))
    calib = list(text(probs, 32, torch.Generator().manual_seed(77)).split(16))
    timing = held_out[0][:8]
    dense = trained(probs, "--retrain" in argv)
    rows = []
    for share in (0.25, 0.5):
        small = pruned(dense, share, calib)
        cut = hookscope.compare_models(dense, small, timing, data=held_out, repeats=15, warmup=2)
        t0 = time.perf_counter()
        recovered = fit(copy.deepcopy(small), probs, RECOVER_STEPS, RECOVER_LR, SEED + 2)
        fit_s = time.perf_counter() - t0
        rec = hookscope.compare_models(dense, recovered, timing, data=held_out, repeats=15, warmup=2)
        rows.append((share, cut, rec, fit_s))
    tokens = timing.numel()
    floor = source_perplexity(probs, torch.cat(held_out))
    print(f"Pruned LLaMA-style LM, {time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores "
          f"({torch.get_num_threads()} thread(s), shared with other jobs), {platform.python_version()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}\n")
    print(f"Held-out text: {sum(h.numel() for h in held_out)} tokens; source perplexity (the floor, tokens "
          f"2..): {floor:.3f}; training {TRAIN_STEPS} steps x {BATCH} x {T} tokens; recovery "
          f"{RECOVER_STEPS} steps, lr {RECOVER_LR}; a pruned model's time ratio is against the dense model "
          "timed in the same interleaved runs\n")
    print("| model | params | perplexity | after recovery | time per token (batch 8 x 64) | recovery s |")
    print("|---|---:|---:|---:|---:|---:|")
    c0 = rows[0][1]
    print(f"| dense | {c0['parameters'].before:,} | {c0['perplexity'].before:.3f} | - | "
          f"{c0['CPU latency'].before / tokens * 1e3:.1f} us | - |")
    for share, cut, rec, fit_s in rows:
        print(f"| {share:.0%} heads + {share:.0%} MLP | {cut['parameters'].after:,} "
              f"({cut['parameters'].ratio:.2f}x) | {cut['perplexity'].after:.3f} | {rec['perplexity'].after:.3f} | "
              f"{cut['CPU latency'].after / tokens * 1e3:.1f} us ({cut['CPU latency'].ratio:.2f}x) | {fit_s:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
