"""A two-layer attention-only LLaMA (rotary positions; the MLPs' weights zero and frozen, so they write
exactly 0) trained in the tests from random weights until it does induction: about 600 AdamW steps on
sequences of distinct random tokens in which one stretch of 3 to 11 of them is repeated right after itself,
the loss on the tokens the repetition decides. Rotary positions matter: with learned absolute positions a
model of this size finds circuits of other shapes first (heads at fixed offsets, or neither signature;
bench/bench_induction.py and bench/RESULTS.md), while rotating queries
and keys puts "the token before" one step away for every position, and a previous-token head forms in
block 0 within 200 steps, read by every head of block 1 as an induction head. Trained in float64 (the same
model on any CPU), then kept in float32. Which heads play which part is what the tests establish by
ablation, not what is assumed."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

VOCAB, LENGTH, WIDTH, HEADS, STEPS = 32, 24, 64, 4, 600
BOS = VOCAB - 1


@dataclass(frozen=True)
class Pair:
    """A clean prompt whose last token's earlier copy (at ``copy``) is followed by ``answer``, the corrupted
    prompt (that earlier copy replaced by a token found nowhere else in it), and ``wrong``, the corrupted
    prompt's own prediction."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: int
    wrong: int
    copy: int


@dataclass(frozen=True)
class Learned:
    """The trained model (eval mode, float32) and eight prompt pairs (one prompt's patching depends on the
    tokens in it; what holds over eight is what the model learned)."""

    model: nn.Module
    pairs: tuple[Pair, ...]


def batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences: a first token of their own, then distinct random tokens, one stretch of 3 to 11 of
    them repeated right after itself at a random offset; and the mask of the positions whose next token the
    repetition decides."""
    ids = torch.stack([torch.randperm(VOCAB - 1, generator=g)[:LENGTH - 1] for _ in range(n)])
    ids = torch.cat([torch.full((n, 1), BOS), ids], 1)
    mask = torch.zeros(n, LENGTH, dtype=torch.bool)
    for r in range(n):
        k = int(torch.randint(3, (LENGTH - 1) // 2 + 1, (1,), generator=g))
        o = 1 + int(torch.randint(0, LENGTH - 1 - 2 * k + 1, (1,), generator=g))
        ids[r, o + k:o + 2 * k] = ids[r, o:o + k]
        mask[r, o + k:o + 2 * k - 1] = True  # position p predicts p + 1, a copy of p + 1 - k
    return ids, mask


def repeated_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the tokens the repetition decides."""
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
    return loss.reshape(ids.shape[0], -1)[mask[:, :-1]].mean()


def _model() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=4, num_hidden_layers=2,
                                      num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                      max_position_embeddings=LENGTH, initializer_range=0.02, tie_word_embeddings=False,
                                      attn_implementation="eager", bos_token_id=BOS, eos_token_id=BOS,
                                      pad_token_id=BOS)
    model = transformers.LlamaForCausalLM(config).double()
    for layer in model.model.layers:  # attention only: the MLPs write exactly 0
        for w in layer.mlp.parameters():
            w.data.zero_()
            w.requires_grad_(False)
    return model


def _train(model: nn.Module, steps: int) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.99),
                            weight_decay=0.0)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    g = torch.Generator().manual_seed(1)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one order of every sum: the same model whatever the thread count
    try:
        _steps(model, opt, warm, g, steps)
    finally:
        torch.set_num_threads(threads)


def _steps(model: nn.Module, opt: torch.optim.Optimizer, warm: torch.optim.lr_scheduler.LRScheduler,
           g: torch.Generator, steps: int) -> None:
    for _ in range(steps):
        ids, mask = batch(64, g)
        loss = repeated_loss(model(ids).logits, ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        warm.step()


def pairs(model: nn.Module, n: int, g: torch.Generator) -> tuple[Pair, ...]:
    """``n`` prompts as the training sequences begin: a first token of their own, distinct random tokens, a
    stretch of 4 to 8 of them, then the stretch again, stopped 2 or more tokens in; the next token is the
    stretch's. Kept where the contrast is one: the clean prompt's logit difference above 2 and the
    corrupted one's below 0 (a corrupted prompt can still tell the answer from the tokens before the one
    replaced, which the model also reads: such a pair is drawn again)."""
    out: list[Pair] = []
    while len(out) < n:
        tokens = torch.randperm(VOCAB - 1, generator=g)[:LENGTH - 1]
        k = int(torch.randint(4, 9, (1,), generator=g))
        o = 1 + int(torch.randint(0, 6, (1,), generator=g))
        cut = int(torch.randint(2, k, (1,), generator=g))
        clean = torch.cat([torch.tensor([BOS]), tokens])[:o + k + cut].clone()
        clean[o + k:] = clean[o:o + cut]
        corrupted = clean.clone()
        corrupted[o + cut - 1] = int(tokens[-1])  # not among the prompt's tokens
        answer = int(clean[o + cut])
        with torch.no_grad():
            logits = model(torch.stack([clean, corrupted])).logits[:, -1]
        wrong = int(logits[1].argmax())
        wrong = wrong if wrong != answer else (answer + 1) % (VOCAB - 1)
        diff = logits[:, answer] - logits[:, wrong]
        if float(diff[0]) > 2 and float(diff[1]) < 0:
            out.append(Pair(clean, corrupted, answer, wrong, o + cut - 1))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def trained(steps: int = STEPS) -> Learned:
    """The trained model (eval mode, float32) and its prompt pairs."""
    model = _model()
    _train(model, steps)
    model = model.float().eval()
    return Learned(model, pairs(model, 8, torch.Generator().manual_seed(3)))
