"""``hookscope demo``: the trained demo model on generated images: its predictions, the in-place trap that
hooks keeping references fall into, and an HTML report of it all."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..capture import capture
from ..core.hooks import hook_count
from ..core.text import shape_text, table
from ..errors import HookscopeError
from ..records import Recording
from ..synthetic import ShapeSet, shapes
from ..loading.origin import WeightsOrigin, record_origin
from ..zoo import DEMO_CLASSES, demo_model
from ._common import add_device_argument, add_layers_argument, check_device
from ._load import seed_arg

_MOST = 512  # images the demo draws at once: every conv and batch norm output and gradient is kept
EXAMPLE = """Examples:
  hookscope demo --no-report
      the predictions and the in-place trap, as tables (plain `hookscope demo`
      also writes the HTML report, to ./hookscope-demo)
  hookscope demo --batch 8 --seed 1 --no-report
      eight other images
  hookscope demo 'layer3.*' --no-report --json
      only the modules under layer3, as JSON for programs
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the trained demo model on generated images, show the in-place trap, write an HTML report",
        description="Runs the bundled DemoNet (trained on hookscope's generated shapes) on a batch of new "
        "images, records every convolution and batch norm (outputs and their gradients), compares with a "
        "naive hook that keeps references (which in-place ReLUs silently rewrite), and writes an HTML report "
        "(feature maps, CAMs with faithfulness scores, trace, gradient flow) whose path it prints.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs="*", metavar="LAYER", help="the same as --layers LAYER ...")
    add_layers_argument(p, "the modules recorded (default: every Conv2d and BatchNorm2d)")
    p.add_argument("--batch", type=int, default=4, help="how many generated images (default 4)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the generated images (default 0)")
    p.add_argument("--out", metavar="DIR", default="hookscope-demo",
                   help="the report's folder (default ./hookscope-demo; an earlier report there is replaced)")
    p.add_argument("--no-report", action="store_true", help="print the tables only")
    p.add_argument("--json", action="store_true", help="print the findings as JSON instead of tables")
    add_device_argument(p)


def _naive(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a hand-written hook that stores ``output`` by reference ends up holding."""
    kept: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    # own hook: the naive, reference-keeping hook whose in-place trap the demo shows; capture would not fall into it
    handles = [mods[n].register_forward_hook(lambda m, i, o, n=n: kept.__setitem__(n, o.detach())) for n in names]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return kept


def _layers(model: nn.Module, rec: Recording, naive: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per layer: its output, the gradient's norm, and whether the naive hook read it back."""
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    found = []
    for name in rec:
        out, grad = rec[name].output, rec[name].grad_output
        found.append({"layer": name, "type": kinds[name], "shape": list(out.shape), "min": out.min().item(),
                      "max": out.max().item(), "grad_norm": grad.norm().item() if grad is not None else None,
                      "naive_same": torch.equal(naive[name], out), "naive_min": naive[name].min().item()})
    return found


def _predictions(logits: torch.Tensor, data: ShapeSet) -> list[dict[str, Any]]:
    probs = logits.detach().softmax(-1)
    p, k = probs.max(-1)
    return [{"image": i, "class": DEMO_CLASSES[int(k[i])], "probability": float(p[i]),
             "truth": DEMO_CLASSES[int(data.labels[i])]} for i in range(len(k))]


def _print(found: dict[str, Any], x: torch.Tensor, calls: int, hooks: int) -> None:
    print(f"DemoNet (trained on generated shapes), {len(found['predictions'])} new images "
          f"{shape_text(tuple(x.shape))}:")
    for r in found["predictions"]:
        print(f"  image {r['image']}: {r['class']} ({r['probability']:.2f}), truth {r['truth']}")
    print(f"\n{calls} calls recorded, forward and backward\n")
    body = [[r["layer"], r["type"], shape_text(tuple(r["shape"])), f"{r['min']:.3f}", f"{r['max']:.3f}",
             "-" if r["grad_norm"] is None else f"{r['grad_norm']:.4f}",
             "same" if r["naive_same"] else f"WRONG (min {r['naive_min']:.3f}, rewritten in place)"]
            for r in found["layers"]]
    head = ["layer", "type", "output shape", "min", "max", "|grad|", "naive hook"]
    print("\n".join(table(head, body, left={0, 1, 2}, pad_last=False)))
    wrong = sum(not r["naive_same"] for r in found["layers"])
    print(f"\n{wrong} of {len(body)} layers read back wrong through a hook that keeps references;")
    print("hookscope returned what each layer really produced (tensors under 1 MiB are copied at once,")
    print("larger ones only just before something overwrites them).")
    print(f"Hooks left on the model: {hooks}.")


def _record(model: nn.Module, args: argparse.Namespace, x: torch.Tensor) -> tuple[Recording, torch.Tensor]:
    selectors: list[Any] = [*(args.layers or ()), *args.words] or [(nn.Conv2d, nn.BatchNorm2d)]
    with capture(model, *selectors, keep=("output", "grad_output")) as rec:
        logits = model(x)
        logits.logsumexp(dim=1).sum().backward()
    model.zero_grad(set_to_none=True)
    return rec, logits


_TITLE = "hookscope demo: DemoNet on generated shapes"


def _check_out(out: Path) -> None:
    """The demo replaces its own earlier report only: not another command's, not a folder of files."""
    from ..report import check_target

    check_target(out, overwrite=True, flag="--out ANOTHER_FOLDER")
    try:
        title = json.loads((out / "report.json").read_text(encoding="utf-8")).get("title")
    except (OSError, ValueError, AttributeError):
        return  # no folder, an empty one, or one check_target has vetted
    if title != _TITLE:
        raise HookscopeError(f"{out} holds a report the demo did not write ({title!r}); give another --out, or "
                             "remove it yourself")


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.batch <= _MOST:
        raise HookscopeError(f"--batch {args.batch} must be at least 1" if args.batch < 1 else
                             f"--batch {args.batch} is more than the demo draws ({_MOST}); give a smaller --batch")
    if not args.no_report:  # a folder that cannot be written fails now, not after the model ran
        _check_out(Path(args.out))
    device = check_device(args.device)
    model = demo_model()
    record_origin(model, WeightsOrigin(False, "the demo model's bundled weights"))  # what the report says
    data = shapes(args.batch, seed=args.seed)
    x, masks, backgrounds = data.images, data.masks, data.backgrounds
    if device is not None:  # the model and what it reads there; the pictures drawn stay on the CPU
        model, x, masks = model.to(device), x.to(device), masks.to(device)
        backgrounds = backgrounds if backgrounds is None else backgrounds.to(device)
    rec, logits = _record(model, args, x)
    found: dict[str, Any] = {"predictions": _predictions(logits, data),
                             "layers": _layers(model, rec, _naive(model, list(rec), x))}
    found["hooks_left"] = hook_count(model)
    if not args.no_report:
        from ..report import build_report

        # the trained model on the kind of images it was trained on: real weights and inputs, no banner
        path = build_report(model, x, args.out, pictures=data.images, masks=masks,
                            class_names=DEMO_CLASSES, baselines=backgrounds, title=_TITLE,
                            overwrite=True, generated_inputs=False)
        found["report"] = str((path / "index.html").resolve())
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    _print(found, data.images, len(rec.calls), found["hooks_left"])
    if "report" in found:
        print(f"\nReport: {found['report']}")
    return 0
