"""Input attribution: what hookscope.attribute costs against one plain forward + backward, and against captum.

Run:  .venv/bin/python bench/bench_attribution.py            (resnet50, 224 x 224: over half an hour on 2 shared cores)
      .venv/bin/python bench/bench_attribution.py --quick    (112 x 112, 3 rounds)
      .venv/bin/python bench/bench_attribution.py --only gradients|captum|memory   (one part)
      .venv/bin/python bench/bench_attribution.py --lrp      (LRP against zennit only; see below)
Peers (test/bench only):  .venv/bin/pip install -c constraints.txt captum zennit

Model: torchvision resnet50, ``weights=None``, ``eval()``, seed 0, CPU; input ``randn``, target class 3
for every image (fixed, so that no method runs an extra pass to find the predicted class).

1. Saliency and guided backpropagation (batch 8) against the floor: one forward of the batch with autograd
   on, the target's scores summed, ``torch.autograd.grad`` at the inputs. Target: at most 1.05x the floor.
2. Integrated gradients (50 points, ``riemann_trapezoid``, baseline zeros) and SmoothGrad (50 noisy copies)
   of one image, both libraries running the copies ``--rows`` at a time (captum's ``internal_batch_size`` /
   ``nt_samples_batch_size``, hookscope's ``batch_size``). Target: no slower than captum.
3. Peak memory of integrated gradients with ``memory=`` budgets: the growth of the process's resident set
   (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``, each budget in a fresh child
   process), against the budget. RSS counts everything the allocator holds, so it bounds what autograd
   keeps from above.

Timing: the methods run interleaved, round after round (the order alternates), median per method; each
ratio is the median over rounds of the method's time over the reference's time in the same round (part 1 also
prints the distribution-free 95% interval of that median, from the order statistics of the per-round ratios).

``--lrp``: LRP with the ``epsilon_plus_flat`` composite, ``hookscope.attribute(model, x, method="lrp",
composite="epsilon_plus_flat")`` against zennit's ``EpsilonPlusFlat`` with the ResNet canonizer: timed
and compared once hookscope has the method; until then it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

import hookscope
from _rounds import cpu_model, median_interval, ratios, timings  # bench/_rounds.py: this folder is on sys.path when run as a script

TARGET = 3


def build(size: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval(), torch.randn(batch, 3, size, size)


def floor(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One forward with autograd on and the gradient of the summed target scores at the inputs."""
    leaf = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(model(leaf)[:, TARGET].sum(), leaf)
    return g


def quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    import warnings

    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # captum: "required_grads has been set automatically"
            return fn()

    return run


def gradients(size: int, batch: int, rounds: int) -> None:
    model, x = build(size, batch)
    runs = {
        "forward + backward (floor)": lambda: floor(model, x),
        "saliency": lambda: hookscope.attribute(model, x, method="saliency", target=TARGET),
        "guided_backprop": lambda: hookscope.attribute(model, x, method="guided_backprop", target=TARGET),
    }
    base = "forward + backward (floor)"
    times = timings(runs, rounds)
    print(f"\n### Saliency and guided backpropagation, resnet50, batch {batch}, {size} x {size} ({rounds} rounds)\n")
    print("| run | median seconds | x floor (median of per-round ratios) | 95% interval of that median |")
    print("|---|---|---|---|")
    for k in runs:
        per_round = [t / b for t, b in zip(times[k], times[base])]
        lo, hi = median_interval(per_round)
        print(f"| {k} | {statistics.median(times[k]):.3f} | {statistics.median(per_round):.3f}x | {lo:.3f}x to {hi:.3f}x |")


def against_captum(size: int, rows: int, steps: int, rounds: int) -> None:
    import captum.attr as ca

    model, x = build(size, 1)
    ig, nt = ca.IntegratedGradients(model), ca.NoiseTunnel(ca.Saliency(model))
    runs = {
        "integrated_gradients, hookscope": lambda: hookscope.attribute(
            model, x, method="integrated_gradients", target=TARGET, steps=steps, batch_size=rows),
        "integrated_gradients, captum": quiet(lambda: ig.attribute(
            x, baselines=0.0, target=TARGET, n_steps=steps, method="riemann_trapezoid", internal_batch_size=rows)),
        "smoothgrad, hookscope": lambda: hookscope.attribute(
            model, x, method="smoothgrad", target=TARGET, samples=steps, noise=0.1, batch_size=rows),
        "smoothgrad, captum": quiet(lambda: nt.attribute(
            x, nt_type="smoothgrad", nt_samples=steps, nt_samples_batch_size=rows,
            stdevs=0.1 * float(x.max() - x.min()), target=TARGET, abs=False)),
    }
    times = timings(runs, rounds)
    print(f"\n### {steps} points / noisy copies of one {size} x {size} image, {rows} rows per pass ({rounds} rounds)\n")
    print("| method | hookscope, median s | captum, median s | hookscope / captum (median of per-round ratios) |")
    print("|---|---|---|---|")
    for method in ("integrated_gradients", "smoothgrad"):
        ours, theirs = times[f"{method}, hookscope"], times[f"{method}, captum"]
        ratio = statistics.median(o / t for o, t in zip(ours, theirs))
        print(f"| {method} | {statistics.median(ours):.2f} | {statistics.median(theirs):.2f} | {ratio:.3f}x |")


def _peak_child(size: int, steps: int, budget: int | None) -> None:
    """In a fresh process: the growth of peak RSS over one integrated-gradients call with this budget."""
    model, x = build(size, 1)
    hookscope.attribute(model, x, method="integrated_gradients", target=TARGET, steps=2)  # warm the allocator
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set

    def status(key: str) -> int:
        line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith(key))
        return int(line.split()[1]) * 1024

    before = status("VmRSS:")
    res = hookscope.attribute(model, x, method="integrated_gradients", target=TARGET, steps=steps, memory=budget)
    print(json.dumps({"budget": budget, "peak_growth": status("VmHWM:") - before, "forwards": res.forwards}))


def memory(size: int, steps: int, budgets: list[int | None]) -> None:
    print(f"\n### Peak memory of integrated gradients, {steps} points, one {size} x {size} image "
          "(growth of peak RSS, VmHWM, over the call; a fresh process each)\n")
    print("| memory= | peak RSS growth | within the budget | forward passes |\n|---|---|---|---|")
    for budget in budgets:
        cmd = [sys.executable, __file__, "--peak-child", str(budget or 0), "--size", str(size), "--steps", str(steps)]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        said = "-" if budget is None else f"{budget / 2**20:.0f} MiB"
        within = "-" if budget is None else ("yes" if out["peak_growth"] <= budget else "NO")
        print(f"| {said} | {out['peak_growth'] / 2**20:.0f} MiB | {within} | {out['forwards']} |", flush=True)


def lrp(size: int, batch: int, rounds: int) -> None:
    """LRP against zennit; hookscope's side runs once the method exists."""
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer

    model, x = build(size, batch)
    hot = torch.zeros(batch, 1000)
    hot[:, TARGET] = 1

    def zennit_lrp() -> torch.Tensor:
        with Gradient(model=model, composite=EpsilonPlusFlat(canonizers=[ResNetCanonizer()])) as attributor:
            _, relevance = attributor(x, hot)
        return relevance  # type: ignore[no-any-return]

    def ours() -> torch.Tensor:
        return hookscope.attribute(model, x, method="lrp", composite="epsilon_plus_flat",  # type: ignore[call-arg]
                                   target=TARGET).maps

    try:
        mine = ours()
    except (TypeError, hookscope.HookscopeError) as e:
        print(f"\n### LRP (epsilon_plus_flat): not in this hookscope yet ({str(e).splitlines()[0]})")
        return
    theirs = zennit_lrp()
    gap = float((mine - theirs).abs().max() / theirs.abs().max())
    times, rel = ratios({"zennit": zennit_lrp, "hookscope": ours}, rounds, base="zennit")
    print(f"\n### LRP epsilon_plus_flat, resnet50, batch {batch}, {size} x {size} ({rounds} rounds)\n")
    print(f"largest difference relative to zennit's largest relevance: {gap:.2e}\n")
    print("| run | median seconds | x zennit |\n|---|---|---|")
    for k in ("zennit", "hookscope"):
        print(f"| {k} | {times[k]:.3f} | {rel[k]:.3f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description="hookscope.attribute against the floor and captum")
    ap.add_argument("--quick", action="store_true", help="112 x 112, 3 rounds")
    ap.add_argument("--size", type=int, default=None, help="image side (default 224; 112 with --quick)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; 3 with --quick)")
    ap.add_argument("--steps", type=int, default=50, help="integrated gradients' points and SmoothGrad's copies")
    ap.add_argument("--rows", type=int, default=25, help="rows per forward pass for the copies (default 25)")
    ap.add_argument("--lrp", action="store_true", help="only LRP against zennit")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--only", choices=["gradients", "captum", "memory"], default=None, help="run one part only")
    ap.add_argument("--peak-child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = a.size or (112 if a.quick else 224)
    rounds = a.rounds or (3 if a.quick else 7)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.peak_child is not None:
        return _peak_child(size, a.steps, a.peak_child or None)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}, Python {platform.python_version()}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {' '.join(['.venv/bin/python', 'bench/bench_attribution.py', *sys.argv[1:]])}")
    if a.lrp:
        return lrp(size, 8, rounds)
    if a.only in (None, "gradients"):
        gradients(size, 8, rounds)
    if a.only in (None, "captum"):
        against_captum(size, a.rows, a.steps, max(3, rounds // 2))
    if a.only in (None, "memory"):
        memory(size, a.steps, [None, 2**30, 2**29, 2**28])


if __name__ == "__main__":
    main()
