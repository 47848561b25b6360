"""Cost of calibrated masks: calibration time and peak memory of Wanda and SparseGPT.

A small GPT-2 or LLaMA built from its config (random weights: the cost does not depend on them),
calibrated on ``--samples`` x ``--seqlen`` random token ids (128 x 128 by default), unstructured 50%
and 2:4, each method on a fresh copy. Time: wall clock of ``prune_calibrated`` (median of
``--repeats``). Peak memory: CUDA's peak allocated bytes above the model's own on a GPU; on the CPU the
process's peak resident set growth (``ru_maxrss``), a coarse upper bound.

Run: .venv/bin/python bench/bench_prune_llm_masks.py [--model gpt2|llama] [--layers 4] [--width 256]
     [--samples 128] [--seqlen 128] [--device cpu|cuda] > /tmp/prune_llm_masks.md
"""

from __future__ import annotations

import argparse
import copy
import platform
import resource
import statistics
import sys
import time

import torch
import transformers

import hookscope


def build(kind: str, layers: int, width: int, vocab: int, seqlen: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=max(1, width // 64),
                                      n_positions=max(seqlen, 8))
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width * 8 // 3 // 8 * 8,
                                   num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
                                   num_key_value_heads=max(1, width // 128), max_position_embeddings=max(seqlen, 8),
                                   bos_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(cfg).eval()


def measure(model: torch.nn.Module, data: list[torch.Tensor], device: torch.device, method: str,
            setting: dict[str, object], repeats: int) -> tuple[float, float]:
    """Median seconds and peak MiB of one prune_calibrated call on fresh copies of the model."""
    times, peaks = [], []
    for _ in range(repeats):
        net = copy.deepcopy(model).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        hookscope.prune_calibrated(net, data, method=method, device=device, **setting)  # type: ignore[arg-type]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peaks.append((torch.cuda.max_memory_allocated(device) - base) / 2**20)
        else:
            peaks.append((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024)
        times.append(time.perf_counter() - start)
        del net
    return statistics.median(times), max(peaks)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["gpt2", "llama"], default="llama")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per calibration batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    model = build(a.model, a.layers, a.width, a.vocab, a.seqlen)
    ids = torch.randint(2, a.vocab, (a.samples, a.seqlen), generator=torch.Generator().manual_seed(1))
    data = list(ids.split(a.batch))
    params = sum(p.numel() for p in model.parameters())
    print(f"# Calibrated masks: {a.model}, {a.layers} layers, width {a.width}, {params:,} parameters, "
          f"{a.samples} x {a.seqlen} tokens in batches of {a.batch}\n")
    print(f"{platform.platform()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {device}{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}\n")
    print("| method | pattern | seconds | peak MiB |\n|---|---|---:|---:|")
    for method in ("wanda", "sparsegpt"):
        for label, setting in (("50%", {"sparsity": 0.5}), ("2:4", {"n_m": (2, 4)})):
            seconds, peak = measure(model, data, device, method, setting, a.repeats)
            print(f"| {method} | {label} | {seconds:.3f} | {peak:.1f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
