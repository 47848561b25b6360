"""The whole model-zoo sweep: every torchvision classifier, some detection and segmentation models,
BERT / GPT-2 / T5 / ViT from transformers and a few timm models, each checked by tests/zoo_sweep.py.

Run: .venv/bin/python bench/bench_zoo.py [NAME_SUBSTRING ...] > /tmp/zoo.md   (about 20 minutes on 2 cores)
Prints the markdown table kept in bench/RESULTS.md; exit status 1 if any model failed.
"""

from __future__ import annotations

import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import zoo_sweep  # noqa: E402


def main(argv: list[str]) -> int:
    entries = [e for e in zoo_sweep.all_entries() if not argv or any(a in e.name for a in argv)]
    outcomes = []
    for e in entries:
        o = zoo_sweep.check(e)
        print(f"{o.name}: {'ok' if o.passed else 'FAILED ' + o.failure} ({o.seconds:.1f} s)", file=sys.stderr)
        outcomes.append(o)
    print(f"Zoo sweep, {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}\n")
    print(zoo_sweep.table(outcomes))
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
