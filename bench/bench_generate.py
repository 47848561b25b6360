"""generate() with a steering edit at one layer on every step, against the plain generate() (CPU).

Run:  .venv/bin/python bench/bench_generate.py                 (a minute or two on 2 CPU cores)
      .venv/bin/python bench/bench_generate.py --rounds 3      (a smoke run)

A GPT-2 built from a small config (random weights, eval()), one prompt of 8 tokens, 64 new tokens,
greedy, with the KV cache. Interleaved, round after round in one process (``bench/_rounds.py``):

- plain ``generate()``;
- ``hookscope.steer(model, "transformer.h.2", direction=d, at=hookscope.tokens.generated)``: the
  direction added at the positions that write the continuation, resolved at every step;
- ``hookscope.steer`` with ``at=None`` (every position of every forward, no position bookkeeping);
- nnsight's ``tracer.iter[:64]`` adding the same vector to the same layer's output at every step
  (``nnsight.LanguageModel`` over the same model object: no download), when nnsight is installed.

Each ratio is the median over rounds of the method's time over the plain time of the same round;
every steered run is checked to write other tokens than the plain one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from typing import Any, Callable

import torch

import hookscope
from _rounds import cpu_model, ratios

LAYER = 2


def _model() -> Any:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2000, n_positions=128, bos_token_id=0,
                                  eos_token_id=1999)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _nnsight(model: Any, ids: torch.Tensor, v: torch.Tensor, new: int) -> Callable[[], torch.Tensor] | str:
    """nnsight's generation steps, or why it cannot run here."""
    try:
        import warnings

        import nnsight
        import transformers
        from tokenizers import Tokenizer, models

        words = Tokenizer(models.WordLevel({str(i): i for i in range(model.config.vocab_size)}, unk_token="0"))
        tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="0", pad_token="0")
        with warnings.catch_warnings():  # its deprecation of LanguageModel: the model object is wrapped as it is
            warnings.simplefilter("ignore")
            wrapped = nnsight.LanguageModel(model, tokenizer=tok)
    except Exception as e:  # noqa: BLE001 - a peer that does not install or wrap is reported, not fatal
        return f"not run: {type(e).__name__}: {str(e).splitlines()[0][:80]}"

    def run() -> torch.Tensor:
        with wrapped.generate({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, pad_token_id=0) as tracer:
            for _ in tracer.iter[:new]:  # a bounded loop: the statements after it run
                out = wrapped.transformer.h[LAYER].output
                hidden = out[0] if isinstance(out, tuple) else out
                hidden[:] += v
            result = tracer.result.save()
        return result

    try:
        run()
    except Exception as e:  # noqa: BLE001
        return f"not run: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = _model()
    ids = torch.randint(2, 1999, (1, 8), generator=torch.Generator().manual_seed(1))
    d = hookscope.Direction(torch.randn(256, generator=torch.Generator().manual_seed(2)) * 4, "transformer.h.2")

    def plain() -> torch.Tensor:
        return model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)

    def steered(at: Any) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with hookscope.steer(model, "transformer.h.2", direction=d, at=at):
                return plain()
        return run

    runs: dict[str, Callable[[], Any]] = {"plain": plain, "steer at=tokens.generated": steered(hookscope.tokens.generated),
                                          "steer at=None": steered(None)}
    peer = _nnsight(model, ids, d.vector, args.new)
    if callable(peer):
        runs["nnsight tracer.iter[:new]"] = peer
    base = plain()
    for name, run in runs.items():
        if name != "plain":
            out = run()
            assert not torch.equal(out[:, :base.shape[1]], base), f"{name} wrote the plain tokens"
    assert hookscope.core.hook_count(model) == 0
    med, rat = ratios(runs, args.rounds, base="plain")
    load = os.getloadavg()
    print(f"## generate() with a steering edit at one layer on every step ({datetime.date.today()})\n")
    print(f"`{shlex.join(['python', *sys.argv])}`; {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"Python {platform.python_version()}, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; "
          f"GPT-2 n_layer=4 n_embd=256, prompt 8 tokens, {args.new} new tokens greedy with the KV cache, "
          f"{args.rounds} interleaved rounds.\n")
    print("| method | median ms | ratio to plain |")
    print("|---|---|---|")
    for name in runs:
        print(f"| {name} | {med[name] * 1e3:.1f} | {rat[name]:.3f}x |")
    if not callable(peer):
        print(f"\nnnsight: {peer}")


if __name__ == "__main__":
    main()
