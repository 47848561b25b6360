"""A two-layer attention-only GPT-2 trained on sequences with a repeated stretch of random tokens to
do induction: a previous-token head in block 0 (head 0) and an induction head in block 1 (head 0)
that reads it, planted in the starting weights (from scratch, induction takes thousands of steps,
too many for a test) among six small random heads, then trained briefly with every weight free. The MLPs'
weights are zero and frozen (their output is exactly 0), so the model is one the component names
know. It is trained once per test session on plain float64 tensors (the same arithmetic as GPT-2's blocks;
in float32 the rounding of one CPU's kernels against another's grows over the steps into a different
model) and its weights loaded into a ``GPT2LMHeadModel``, checked to give the same logits. Other
training seeds give models on which these tests pass too, except the noising sweep of one seed in six,
whose induction head also reads the corrupted position itself.
Which heads matter is what the tests establish by ablation, not what was planted."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

VOCAB, LENGTH, WIDTH, HEADS, STEPS = 12, 12, 64, 4, 20
PREVIOUS, INDUCTION = 2, 1  # the heads planted: block 0 head 2, block 1 head 1


@dataclass(frozen=True)
class Induction:
    """The trained model and what the tests read of it: a clean prompt (a stretch repeated: its last
    token's earlier copy is followed by ``answer``), the corrupted one (that earlier copy replaced, so
    there is nothing to follow), and ``wrong``, the corrupted prompt's own prediction."""

    model: nn.Module
    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: int
    wrong: int


def batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of random tokens, each with a stretch of 3 to 6 distinct tokens repeated right
    after itself at a random offset, and the mask of the positions whose next token the repetition
    decides."""
    ids = torch.randint(0, VOCAB, (n, LENGTH), generator=generator)
    mask = torch.zeros(n, LENGTH, dtype=torch.bool)
    periods = torch.randint(3, 7, (n,), generator=generator)
    for i in range(n):
        t = int(periods[i])
        o = int(torch.randint(0, LENGTH - 2 * t + 1, (1,), generator=generator))
        ids[i, o:o + t] = torch.randperm(VOCAB, generator=generator)[:t]
        ids[i, o + t:o + 2 * t] = ids[i, o:o + t]
        mask[i, o + t:o + 2 * t - 1] = True  # position p predicts p + 1, a copy of p + 1 - t
    return ids, mask


def repeated_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the tokens the repetition decides."""
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none")
    return loss.reshape(ids.shape[0], -1)[mask[:, :-1]].mean()


def _parameters() -> dict[str, torch.Tensor]:
    """The starting point: token and position embeddings one-hot in their own columns, block 0's head 2 a
    previous-token head (its query the position, its key the next position, its value the token written
    into columns of their own) and block 1's head 1 an induction head (its query the token, its key the
    previous token, its value the token, written onto the token's own column), the rest small random
    numbers."""
    g = torch.Generator().manual_seed(0)
    d_head, pos, prev = WIDTH // HEADS, VOCAB, VOCAB + LENGTH  # columns: tokens, positions, the previous token
    p = {"wte": torch.zeros(VOCAB, WIDTH), "wpe": torch.zeros(LENGTH, WIDTH)}
    p["wte"][:, :VOCAB] = torch.eye(VOCAB)
    p["wpe"][:, pos:pos + LENGTH] = torch.eye(LENGTH)
    for i in range(2):
        p[f"{i}.ln_w"], p[f"{i}.ln_b"] = torch.ones(WIDTH), torch.zeros(WIDTH)
        p[f"{i}.attn_w"], p[f"{i}.attn_b"] = torch.randn(WIDTH, 3 * WIDTH, generator=g) * 0.02, torch.zeros(3 * WIDTH)
        p[f"{i}.proj_w"], p[f"{i}.proj_b"] = torch.randn(WIDTH, WIDTH, generator=g) * 0.02, torch.zeros(WIDTH)
    q, k, v = _head(p, 0, PREVIOUS)
    q[pos:pos + LENGTH, :LENGTH] = 1.5 * torch.eye(LENGTH)  # position p asks for p - 1 ...
    k[pos:pos + LENGTH - 1, 1:LENGTH] = 1.5 * torch.eye(LENGTH - 1)  # ... which answers as p
    v[:VOCAB, :VOCAB] = torch.eye(VOCAB)
    p["0.proj_w"][PREVIOUS * d_head:PREVIOUS * d_head + VOCAB, prev:prev + VOCAB] = 0.2 * torch.eye(VOCAB)
    q, k, v = _head(p, 1, INDUCTION)
    q[:VOCAB, :VOCAB] = 2 * torch.eye(VOCAB)  # my token ...
    k[prev:prev + VOCAB, :VOCAB] = 2 * torch.eye(VOCAB)  # ... was the token before you: copy yours
    v[:VOCAB, :VOCAB] = torch.eye(VOCAB)
    p["1.proj_w"][INDUCTION * d_head:INDUCTION * d_head + VOCAB, :VOCAB] = 2 * torch.eye(VOCAB)
    p["lnf_w"], p["lnf_b"] = torch.ones(WIDTH), torch.zeros(WIDTH)
    return {k: v.double().requires_grad_(True) for k, v in p.items()}  # trained in float64: the same on any CPU


def _head(p: dict[str, torch.Tensor], block: int, head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One head's query, key and value columns of ``c_attn`` (views, zeroed), its rows of ``c_proj`` zeroed."""
    d_head = WIDTH // HEADS
    cols = slice(head * d_head, (head + 1) * d_head)
    w = p[f"{block}.attn_w"]
    parts = tuple(w[:, i * WIDTH:(i + 1) * WIDTH][:, cols] for i in range(3))
    for part in parts:
        part.zero_()
    p[f"{block}.proj_w"][cols] = 0
    return parts  # type: ignore[return-value]


def _forward(p: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """GPT-2's arithmetic with the MLPs left out (they write 0): tied embedding, LayerNorms, causal heads."""
    n, t = ids.shape
    d_head = WIDTH // HEADS
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    x = p["wte"][ids] + p["wpe"][:t]
    for i in range(2):
        h = nn.functional.layer_norm(x, (WIDTH,), p[f"{i}.ln_w"], p[f"{i}.ln_b"])
        q, k, v = ((h @ p[f"{i}.attn_w"] + p[f"{i}.attn_b"]).split(WIDTH, -1))
        q, k, v = (a.reshape(n, t, HEADS, d_head).transpose(1, 2) for a in (q, k, v))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d_head)).masked_fill(~causal, float("-inf"))
        z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, WIDTH)
        x = x + z @ p[f"{i}.proj_w"] + p[f"{i}.proj_b"]
    return nn.functional.layer_norm(x, (WIDTH,), p["lnf_w"], p["lnf_b"]) @ p["wte"].t()


def _train(steps: int) -> dict[str, torch.Tensor]:
    p = _parameters()
    opt = torch.optim.Adam(p.values(), lr=2e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids, mask = batch(32, g)
        loss = repeated_loss(_forward(p, ids), ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in p.items()}


def _gpt2(p: dict[str, torch.Tensor]) -> nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=LENGTH,
                                     attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    t = model.transformer
    with torch.no_grad():
        t.wte.weight.copy_(p["wte"])
        t.wpe.weight.copy_(p["wpe"])
        for i, block in enumerate(t.h):
            block.ln_1.weight.copy_(p[f"{i}.ln_w"])
            block.ln_1.bias.copy_(p[f"{i}.ln_b"])
            block.attn.c_attn.weight.copy_(p[f"{i}.attn_w"])  # Conv1D keeps [in, out], as the plain tensors
            block.attn.c_attn.bias.copy_(p[f"{i}.attn_b"])
            block.attn.c_proj.weight.copy_(p[f"{i}.proj_w"])
            block.attn.c_proj.bias.copy_(p[f"{i}.proj_b"])
            for w in block.mlp.parameters():  # attention only: the MLPs write exactly 0
                w.zero_()
                w.requires_grad_(False)
        t.ln_f.weight.copy_(p["lnf_w"])
        t.ln_f.bias.copy_(p["lnf_b"])
    return model


@functools.lru_cache(maxsize=1)
def trained(steps: int = STEPS) -> Induction:
    """The trained model (eval mode) and its clean and corrupted prompts."""
    p = _train(steps)
    model = _gpt2(p)
    ids, _ = batch(4, torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, _forward(p, ids).float(), atol=1e-4), "the GPT-2 does not compute as trained"
    clean = torch.tensor([11, 1, 2, 3, 4, 5, 6, 7, 8, 4])  # the last 4's earlier copy is followed by 5
    corrupted = clean.clone()
    corrupted[4] = 9  # no earlier 4: nothing to follow
    with torch.no_grad():
        wrong = int(model(corrupted[None]).logits[0, -1].argmax())
    return Induction(model, clean, corrupted, 5, wrong if wrong != 5 else 0)
