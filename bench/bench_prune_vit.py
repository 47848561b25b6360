"""torchvision vit_b_16 with half its attention heads and half its MLP hidden units removed:
hookscope (prune_heads with mlp= + compact) side by side with Torch-Pruning on the same model and ratios.

Both tools start from the same random weights (weights=None). hookscope: one call,
``prune_heads(amount=0.5, mlp=0.5, importance="l2")`` (the heads' weight norms, as Torch-Pruning's
magnitude importance, and every MLP's hidden units by the norm of their weight rows and columns; the
residual stream is left, LayerNorm reads it whole), then ``compact``. Torch-Pruning 1.6.1 (``pip install torch-pruning==1.6.1``, a bench-only
peer): ``MetaPruner`` with ``MagnitudeImportance(p=2)``, the MLP's first Linear of every block at 0.5
(``pruning_ratio_dict``; everything else at 0), ``num_heads`` of every ``nn.MultiheadAttention``,
``prune_num_heads=True``, ``prune_head_dims=False``, ``head_pruning_ratio=0.5``, the classifier ignored,
as its ViT examples set it up; a failure is recorded with its error line.

Latency: batch 8 x 3 x 224 x 224, CPU, eval, ``torch.no_grad()``, the models interleaved round by
round (order alternating), medians; params; multiply-adds at batch 1 counted by hookscope for every
model (``compare_models``, the counter ``hookscope.summary`` uses). The load average is printed: the
machine's cores are shared with other jobs.

Run: .venv/bin/python bench/bench_prune_vit.py [--rounds N] [--tiny] > /tmp/prune_vit.md
"""

from __future__ import annotations

import copy
import os
import sys
import time
from typing import Any

import torch
import torchvision
from torch import nn

import hookscope

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import cpu_model, timings  # noqa: E402

SHARE = 0.5


def build(tiny: bool) -> nn.Module:
    torch.manual_seed(0)
    if tiny:  # the same code on a model small enough to try the script in seconds
        return torchvision.models.VisionTransformer(32, 8, 2, 4, 64, 128).eval()
    return torchvision.models.vit_b_16(weights=None).eval()


def with_hookscope(model: nn.Module, probe: torch.Tensor) -> nn.Module:
    masked = copy.deepcopy(model)
    hookscope.prune_heads(masked, probe, amount=SHARE, importance="l2", mlp=SHARE)
    return hookscope.compact(masked, probe)


def with_torch_pruning(model: nn.Module, probe: torch.Tensor) -> nn.Module:
    import torch_pruning as tp

    small = copy.deepcopy(model)
    blocks = [m for m in small.modules() if isinstance(m, torchvision.models.vision_transformer.EncoderBlock)]
    heads = {b.self_attention: b.self_attention.num_heads for b in blocks}
    pruner = tp.pruner.MetaPruner(
        small, probe, importance=tp.importance.MagnitudeImportance(p=2), pruning_ratio=0.0,
        pruning_ratio_dict={b.mlp[0]: SHARE for b in blocks}, ignored_layers=[small.heads],
        num_heads=heads, prune_num_heads=True, prune_head_dims=False, head_pruning_ratio=SHARE,
        unwrapped_parameters=[(small.class_token, 2), (small.encoder.pos_embedding, 2)])
    pruner.step()
    for b in blocks:  # as Torch-Pruning's examples do: the attention's bookkeeping after its step
        b.self_attention.num_heads = pruner.num_heads.get(b.self_attention, b.self_attention.num_heads)
    return small


def shape_of(model: nn.Module) -> str:
    block = next(m for m in model.modules() if isinstance(m, torchvision.models.vision_transformer.EncoderBlock))
    attn = block.self_attention
    return f"{attn.num_heads} heads, embed {attn.embed_dim}, MLP {block.mlp[0].out_features}"


def main(argv: list[str]) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 7
    tiny = "--tiny" in argv
    side = 32 if tiny else 224
    dense = build(tiny)
    probe, batch = torch.randn(1, 3, side, side), torch.randn(8, 3, side, side)
    models: dict[str, nn.Module] = {"dense": dense}
    notes: dict[str, str] = {}
    for name, fn in (("hookscope", with_hookscope), ("Torch-Pruning 1.6.1", with_torch_pruning)):
        t0 = time.perf_counter()
        try:
            models[name] = fn(dense, probe).eval()
            notes[name] = f"pruned in {time.perf_counter() - t0:.0f} s; {shape_of(models[name])}"
        except Exception as exc:  # the table records the peer's failure and goes on
            notes[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    notes["dense"] = shape_of(dense)
    counts: dict[str, Any] = {}
    for name, m in models.items():
        c = hookscope.compare_models(dense, m, probe, repeats=1, warmup=0)
        counts[name] = (c["parameters"].after, c["multiply-adds"].after, c["max abs output diff"].after)
    load0 = os.getloadavg()
    with torch.no_grad():
        runs = {k: (lambda m=m: m(batch)) for k, m in models.items()}
        times = timings(runs, rounds, warmup=1)
    load1 = os.getloadavg()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    per_round = {k: sorted(d / t for d, t in zip(times["dense"], v))[len(v) // 2] for k, v in times.items()}
    print(f"vit_b_16{' (tiny)' if tiny else ''}, heads {SHARE:.0%} + MLP {SHARE:.0%}, batch 8, CPU, "
          f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}; {rounds} interleaved rounds, medians; load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after (shared cores)\n")
    print("| model | params | MACs (batch 1) | latency b8 | speed-up (median of per-round ratios) | note |")
    print("|---|---:|---:|---:|---:|---|")
    for name in ("dense", "hookscope", "Torch-Pruning 1.6.1"):
        if name not in models:
            print(f"| {name} | - | - | - | - | {notes[name]} |")
            continue
        p, macs, _ = counts[name]
        print(f"| {name} | {p:,} ({p / counts['dense'][0]:.3f}x) | {macs / 1e9:.2f} G ({macs / counts['dense'][1]:.3f}x) | "
              f"{med[name] * 1e3:.0f} ms | {per_round[name]:.2f}x | {notes[name]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
