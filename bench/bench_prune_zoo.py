"""Compaction across the torchvision classification zoo (and the segmentation models with --dense):
for each model (random weights, the sizes of tests/zoo_sweep.py), trace the channel groups, mask ~30%
of the channels of every removable group by the L2 norm of the producers' rows, and in every
transformer (ViT, Swin, MaxViT) ~30% of the attention heads of every layer too (``prune_heads``,
importance "l2"), or the layer and the reason its heads are refused; compact, and check the
compacted model's outputs against the masked model's.

Run: .venv/bin/python bench/bench_prune_zoo.py [--dense] [NAME ...] > /tmp/prune_zoo.md
NAME: a model's exact name (resnet50) or a part of names (vit_l_); several may be given.
Prints a markdown table, a row as each model finishes (flushed, so a crash or a kill loses nothing),
then the count of models compacted (fewer parameters, outputs equal); progress goes to stderr.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import zoo_sweep  # noqa: E402

from hookscope.analysis.prune._compact import compact, mask_channels  # noqa: E402
from hookscope.analysis.prune._graph import ChannelGroups, channel_groups  # noqa: E402
from hookscope.analysis.prune._graph_verify import output_gap  # noqa: E402
from hookscope.analysis.prune._heads import prune_heads  # noqa: E402
from hookscope.errors import HookscopeError  # noqa: E402

FRACTION = 0.3
HUGE = ("vit_h_14", "regnet_y_128gf", "vit_l_", "regnet_y_32gf", "regnet_y_16gf")
TRANSFORMERS = ("vit_", "swin_", "maxvit_")


def _refused_at(model: torch.nn.Module, exc: HookscopeError) -> str:
    """The first attention layer the refusal is about and what it holds beyond its projections."""
    for name, m in model.named_modules():
        inner = list(m.modules())[1:]  # the innermost attention: a wrapper's attention sits deeper
        if "Attention" in type(m).__name__ and not any("Attention" in type(c).__name__ for c in inner):
            own = [n for n, p in m.named_parameters(recurse=False)]
            held = f"; it holds {', '.join(own)} besides its projections" if own else ""
            kids = ", ".join(type(c).__name__ + " " + n for n, c in m.named_children())
            return f"heads refused at {name} ({type(m).__name__}: {kids}{held}): {str(exc)[:120]}"
    return f"heads refused: {str(exc)[:160]}"


def heads(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """``(heads column, note)``: ~FRACTION of every attention layer's heads masked, or why not."""
    try:
        res = prune_heads(model, tuple(args), amount=FRACTION, importance="l2", kwargs=kwargs)
    except HookscopeError as exc:
        return "refused", _refused_at(model, exc)
    return f"{res.removed}/{res.heads}", ""


def l2_drop(model: torch.nn.Module, groups: ChannelGroups, fraction: float) -> dict[int, list[int]]:
    """The ``fraction`` of each group's channels with the smallest L2 norm of their producer rows."""
    mods = dict(model.named_modules())
    out: dict[int, list[int]] = {}
    for g in groups.groups:
        k = int(g.size * fraction)
        if k < 1:
            continue
        score = torch.zeros(g.size, dtype=torch.float64)
        for m in g.members:
            if m.role != "producer":
                continue
            t = getattr(mods[m.module], m.name).detach().double()
            rows = t.movedim(m.dim, 0).reshape(t.shape[m.dim], -1).pow(2).sum(1)
            score += torch.tensor([float(rows[list(p)].sum()) for p in m.positions])
        out[g.index] = score.argsort()[:k].tolist()
    return out


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def run(entry: zoo_sweep.Entry) -> dict[str, Any]:
    row: dict[str, Any] = {"model": entry.name.split(":")[-1]}
    t0 = time.perf_counter()
    try:
        model, args, kwargs = entry.build()
        row["before"] = _params(model)
        t1 = time.perf_counter()
        groups = channel_groups(model, tuple(args), kwargs=kwargs)
        row["trace_s"] = time.perf_counter() - t1
        row["groups"] = f"{len(groups.groups)}/{len(groups.groups) + len(groups.blocked)}"
        mask_channels(model, groups, l2_drop(model, groups, FRACTION))
        if any(row["model"].startswith(t) for t in TRANSFORMERS):
            row["heads"], row["heads_note"] = heads(model, args, kwargs)
        small = compact(model, tuple(args), kwargs=kwargs)
        row["after"] = _params(small)
        with torch.no_grad():
            row["gap"] = output_gap(model.eval()(*args, **kwargs), small.eval()(*args, **kwargs), 1.0)[0]
        row["ok"] = row["after"] < row["before"]
        row["note"] = "; ".join(n for n in ("" if row["ok"] else "nothing removed", row.get("heads_note", "")) if n)
    except Exception as exc:  # the table says why, the sweep goes on
        row["ok"] = False
        row["note"] = "; ".join(n for n in (row.get("heads_note", ""), f"{type(exc).__name__}: {str(exc)[:160]}") if n)
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
    row["seconds"] = time.perf_counter() - t0
    return row


HEADER = ["| model | params before | after | ratio | groups | heads removed | max abs diff | trace s | total s | note |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]


def line(r: dict[str, Any]) -> str:
    """One markdown row."""
    before, after = r.get("before"), r.get("after")
    ratio = f"{after / before:.2f}" if before and after else "-"
    gap = f"{r['gap']:.1e}" if "gap" in r else "-"
    return (f"| {r['model']} | {before or '-'} | {after or '-'} | {ratio} | {r.get('groups', '-')} | "
            f"{r.get('heads', '-')} | {gap} | {r.get('trace_s', 0):.1f} | {r['seconds']:.1f} | {r['note']} |")


def select(entries: list[zoo_sweep.Entry], names: list[str]) -> list[zoo_sweep.Entry]:
    """The entries named: a name equal to a model's name picks that model only, else every model
    whose name contains it; no names: all."""
    if not names:
        return entries
    short = {e.name.split(":")[-1] for e in entries}
    return [e for e in entries if any(e.name.split(":")[-1] == n if n in short else n in e.name for n in names)]


def main(argv: list[str]) -> int:
    dense = "--dense" in argv
    names = [a for a in argv if not a.startswith("--")]
    entries = zoo_sweep.torchvision_classifiers() + (zoo_sweep.dense_models()[:3] if dense else [])
    entries = select(entries, names)
    entries.sort(key=lambda e: any(h in e.name for h in HUGE))  # the huge ones last
    print(f"Prune zoo, {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}, {FRACTION:.0%} of each group masked by L2\n")
    print("\n".join(HEADER), flush=True)
    ok, with_heads, refused = 0, [], []
    for i, e in enumerate(entries):
        r = run(e)
        if r.get("heads") == "refused":
            refused.append(r["model"])
        elif "heads" in r:
            with_heads.append(r["model"])
        print(line(r), flush=True)  # a row as each model finishes: a crash loses nothing
        ok += r["ok"]
        print(f"[{i + 1}/{len(entries)}] {r['model']}: {'ok' if r['ok'] else 'FAILED'} ({r['seconds']:.1f} s)",
              file=sys.stderr, flush=True)
    print(f"\n{ok} of {len(entries)} models compacted (fewer parameters, outputs equal to the masked model's)")
    if with_heads or refused:
        print(f"Transformers: heads removed in {len(with_heads)} ({', '.join(with_heads) or '-'}), refused with the "
              f"layer and the reason in {len(refused)} ({', '.join(refused) or '-'})")
    return 0 if ok == len(entries) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
