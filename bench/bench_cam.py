"""Class activation maps: hookscope against pytorch-grad-cam, captum and torchcam, and the floors.

Run:  .venv/bin/python bench/bench_cam.py               (agreement, then timing: about 8 minutes)
      .venv/bin/python bench/bench_cam.py --agreement   (only the agreement table, about 2 minutes)
      .venv/bin/python bench/bench_cam.py --timing      (only the timing tables)
      .venv/bin/python bench/bench_cam.py --scorecam    (only Score-CAM's timing, about 3 minutes)
      .venv/bin/python bench/bench_cam.py --quick       (fewer rounds)
      .venv/bin/python bench/bench_cam.py --family      (the methods added last, small size: about 3 minutes)
Peers (test/bench only):  .venv/bin/pip install -c constraints.txt grad-cam captum torchcam

Models: torchvision resnet18 / resnet50, ``weights=None``, ``eval()``, seed 0; input ``randn`` 3x224x224,
target layer ``layer4``, target = the predicted class. CPU.

Agreement: each peer's map against ours for the same method, both min-max normalised per image,
compared at layer4's 7x7 resolution (the peers upsample differently, or not at all), and for
pytorch-grad-cam also at 224x224 (its cv2 resize against our bilinear upsampling, both renormalised).

Timing: methods run interleaved, round after round (the order alternates), median per method, ratio
to the plain forward (``model(x)`` with autograd on, as a user calls it) of the same run. Floors:
``floor`` = forward + ``torch.autograd.grad`` from the summed target scores to the layer4 output
only; ``scorecam floor`` = one forward + one ``no_grad`` forward per distinct mask (masks computed
beforehand), in batches of 16 laid out channels-last, as hookscope runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import hookscope
from hookscope.analysis.cam import cam
from _rounds import medians  # bench/_rounds.py: this folder is on sys.path when run as a script

OURS = ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"]
PGC = {"gradcam": "GradCAM", "gradcam++": "GradCAMPlusPlus", "xgradcam": "XGradCAM",
       "hirescam": "HiResCAM", "layercam": "LayerCAM", "scorecam": "ScoreCAM", "eigencam": "EigenCAM"}
TORCHCAM = {"cam": "CAM", "gradcam": "GradCAM", "gradcam++": "GradCAMpp", "xgradcam": "XGradCAM",
            "layercam": "LayerCAM", "scorecam": "ScoreCAM"}


def build(name: str, batch: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)
    return model, x


def minmax(m: torch.Tensor) -> torch.Tensor:
    flat = m.flatten(1)
    lo, hi = flat.amin(1).view(-1, 1, 1), flat.amax(1).view(-1, 1, 1)
    return (m - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi))


def quiet(fn: Callable[[], Any]) -> Any:
    """Run a peer without its progress bars and warnings on the terminal."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return fn()


# --- the peers, each as its users call it --------------------------------------------------------
def pgc_map(method: str, model: nn.Module, x: torch.Tensor, targets: list[int] | None, *,
            raw: bool = False, batch_size: int | None = None) -> torch.Tensor:
    import pytorch_grad_cam
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    cls = getattr(pytorch_grad_cam, PGC[method])
    with cls(model=model, target_layers=[model.layer4]) as c:
        if raw:  # skip its cv2 resize: maps at layer4's resolution, still min-max normalised
            c.get_target_width_height = lambda _x: None
        if batch_size is not None:
            c.batch_size = batch_size
        tg = None if targets is None else [ClassifierOutputTarget(t) for t in targets]
        return torch.from_numpy(c(input_tensor=x, targets=tg))


def torchcam_map(method: str, model: nn.Module, x: torch.Tensor, targets: list[int] | None) -> torch.Tensor:
    import torchcam.methods as tcm

    kwargs = {"fc_layer": "fc"} if method == "cam" else {}
    extractor = getattr(tcm, TORCHCAM[method])(model, target_layer="layer4", **kwargs)  # torchcam's own keyword
    try:
        grad = method not in ("cam", "scorecam")
        with torch.set_grad_enabled(grad):
            out = model(x)
        idx = out.argmax(1).tolist() if targets is None else targets
        return extractor(class_idx=idx, scores=out)[0].detach()
    finally:
        extractor.remove_hooks()


def captum_map(model: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from captum.attr import LayerGradCam

    return LayerGradCam(model, model.layer4).attribute(x, target=targets, relu_attributions=True)[:, 0].detach()


# --- agreement -----------------------------------------------------------------------------------
def with_layer4(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's output and layer4's, by a plain hook (what a user writes by hand)."""
    kept: list[torch.Tensor] = []
    handle = model.layer4.register_forward_hook(lambda m, i, o: kept.append(o))
    try:
        out = model(x)
    finally:
        handle.remove()
    return out, kept[0]


def layer4_and_grad(model: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """layer4's output and the gradient of the summed target logits there, in float64."""
    out, a = with_layer4(model, x)
    (g,) = torch.autograd.grad(out.gather(1, targets.view(-1, 1)).sum(), a)
    return a.detach().double(), g.double()


def gradcampp_reference(A: torch.Tensor, G: torch.Tensor, variant: str) -> torch.Tensor:
    """Grad-CAM++ written out independently: the paper's eq. 19, and each peer's reading of it."""
    g2, g3 = G * G, G * G * G
    if variant == "torchcam":  # its alpha[mask].div_(...) divides a copy, so alpha stays g^2
        alpha = g2
    else:
        eps = 1e-6 if variant == "pytorch-grad-cam" else 0.0
        denom = 2 * g2 + A.sum((2, 3), keepdim=True) * g3 + eps
        alpha = torch.where((G != 0) & (denom != 0), g2 / torch.where(denom != 0, denom, 1.0), 0.0)
    w = (alpha * G.clamp(min=0)).sum((2, 3))
    return torch.einsum("bk,bkhw->bhw", w, A).clamp(min=0)


def agreement() -> list[tuple[str, str, str, float]]:
    model, x = build("resnet18", 2)
    rows = []
    for method in ("cam", "gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "scorecam", "eigencam"):
        if method == "scorecam":  # 512 masked forwards per image and per implementation: one image
            x = x[:1]
        ours = cam(model, x, layers="layer4" if method != "cam" else None, method=method)
        name = ours.layers[0]
        assert name == "layer4", name
        mine = minmax(ours.raw[name])
        targets = ours.targets.tolist()
        if method in PGC:
            theirs = quiet(lambda: pgc_map(method, model, x, targets, raw=True))
            rows.append((method, "pytorch-grad-cam", "7x7", (minmax(theirs) - mine).abs().max().item()))
            if method != "scorecam":  # 1024 masked forwards each time: once is enough
                full = quiet(lambda: pgc_map(method, model, x, targets))
                rows.append((method, "pytorch-grad-cam", "224x224", (minmax(full) - ours.maps).abs().max().item()))
        if method in TORCHCAM:
            theirs = quiet(lambda: torchcam_map(method, model, x, targets))
            rows.append((method, "torchcam", "7x7", (minmax(theirs) - mine).abs().max().item()))
        if method == "gradcam":
            theirs = quiet(lambda: captum_map(model, x, ours.targets))
            rows.append((method, "captum LayerGradCam", "7x7", (minmax(theirs) - mine).abs().max().item()))
        if method == "gradcam++":  # the peers disagree: who follows the paper, and why not the others
            a = minmax(quiet(lambda: pgc_map(method, model, x, targets, raw=True)))
            b = minmax(quiet(lambda: torchcam_map(method, model, x, targets)))
            rows.append((method, "pytorch-grad-cam vs torchcam", "7x7", (a - b).abs().max().item()))
            A, G = layer4_and_grad(model, x, ours.targets)
            paper = minmax(gradcampp_reference(A, G, "paper")).float()
            rows.append((method, "ours vs eq. 19 written out (float64, no eps)", "7x7", (mine - paper).abs().max().item()))
            for peer, got in (("pytorch-grad-cam", a), ("torchcam", b)):
                ref = minmax(gradcampp_reference(A, G, peer)).float()
                rows.append((method, f"{peer} vs eq. 19 as {peer} codes it", "7x7", (got - ref).abs().max().item()))
    assert hookscope.core.hook_count(model) == 0
    return rows


# --- timing --------------------------------------------------------------------------------------
def runners(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    targets = model(x).argmax(1)

    def floor() -> Any:
        out, a = with_layer4(model, x)
        return torch.autograd.grad(out.gather(1, out.argmax(1, keepdim=True)).sum(), a)

    runs: dict[str, Callable[[], Any]] = {"plain": lambda: model(x), "floor": floor}
    for m in OURS:
        runs[f"hookscope {m}"] = lambda m=m: cam(model, x, layers="layer4", method=m)
    for m in OURS:
        runs[f"pytorch-grad-cam {m}"] = lambda m=m: quiet(lambda: pgc_map(m, model, x, None))
    runs["captum gradcam (target given)"] = lambda: captum_map(model, x, targets)
    runs["torchcam gradcam"] = lambda: torchcam_map("gradcam", model, x, None)
    return runs


def timing(name: str, batch: int, rounds: int) -> dict[str, float]:
    model, x = build(name, batch)
    found = medians(runners(model, x), rounds)
    assert hookscope.core.hook_count(model) == 0
    return found


def scorecam_timing(rounds: int) -> tuple[dict[str, float], dict[str, int]]:
    model, x = build("resnet18", 1)
    size = x.shape[-2:]
    with torch.no_grad():
        kept: list[torch.Tensor] = []
        handle = model.layer4.register_forward_hook(lambda m, i, o: kept.append(o))
        model(x)
        handle.remove()
        up = F.interpolate(kept[0], size=size, mode="bilinear", align_corners=True)[0]
        flat = up.flatten(1)
        lo, hi = flat.amin(1, keepdim=True), flat.amax(1, keepdim=True)
        masks = torch.unique((flat - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi)), dim=0)
        masks = masks.view(-1, 1, *size)
    counts = {"channels": kept[0].shape[1], "distinct masks": masks.shape[0]}

    def floor() -> Any:  # the same forwards, batched and laid out as hookscope does (16, channels-last)
        with torch.no_grad():
            model(x)
            for chunk in masks.split(16):
                model((x * chunk).contiguous(memory_format=torch.channels_last))

    runs = {"scorecam floor": floor,
            "hookscope scorecam": lambda: cam(model, x, layers="layer4", method="scorecam"),
            "pytorch-grad-cam scorecam (batch 16, its default)": lambda: quiet(lambda: pgc_map("scorecam", model, x, None))}
    counts["hookscope masked inputs"] = cam(model, x, layers="layer4", method="scorecam").masked
    return medians(runs, rounds, warmup=0), counts


# --- the rest of the family: resnet18, batch 1, 112x112, layer4, side by side --------------------------------
FAMILY = {"gradcamelementwise": "GradCAMElementWise", "eigengradcam": "EigenGradCAM", "kpcacam": "KPCA_CAM",
          "fem": "FEM", "shapleycam": "ShapleyCAM", "finercam": "FinerCAM", "ablationcam": "AblationCAM",
          "fullgrad": "FullGrad"}


def family_map(method: str, model: nn.Module, x: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """pytorch-grad-cam's map of one of the methods added last, as its users call it."""
    import pytorch_grad_cam
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    cls = getattr(pytorch_grad_cam, FAMILY[method])
    layers = [] if method == "fullgrad" else [model.layer4]
    with cls(model=model, target_layers=layers) as c:
        if method == "finercam":
            return torch.from_numpy(c(input_tensor=x))
        return torch.from_numpy(c(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets]))


def family(rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    model, x = build("resnet18", 1)
    x = F.interpolate(x, size=(112, 112), mode="bilinear", align_corners=False)
    targets = model(x).argmax(1).tolist()
    runs: dict[str, Callable[[], Any]] = {"plain": lambda: model(x)}
    agree: dict[str, float] = {}
    for m in FAMILY:
        where = {} if m == "fullgrad" else {"layers": "layer4"}
        runs[f"hookscope {m}"] = lambda m=m, where=where: cam(model, x, method=m, **where)
        runs[f"pytorch-grad-cam {m}"] = lambda m=m: quiet(lambda: family_map(m, model, x, targets))
        ours, theirs = cam(model, x, method=m, **where).maps, minmax(quiet(lambda: family_map(m, model, x, targets)))
        agree[m] = (ours - theirs).abs().max().item()  # at 112x112: its OpenCV resize against our bilinear one
    found = medians(runs, rounds)
    assert hookscope.core.hook_count(model) == 0
    return found, agree


def family_table(quick: bool) -> None:
    import pytorch_grad_cam  # noqa: F401 - the peer, named first so that a missing one says so

    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}, grad-cam {getattr(pytorch_grad_cam, '__version__', '1.5.7')}")
    rounds = 3 if quick else 5
    t, agree = family(rounds)
    print(f"\n## The rest of the family, resnet18 weights=None, batch 1, 112x112, layer4 ({rounds} rounds, "
          "interleaved); max abs diff of the 112x112 maps, both min-max normalised")
    print("| method | hookscope ms | pytorch-grad-cam ms | ratio | max abs diff |\n|---|---|---|---|---|")
    for m in FAMILY:
        ours, theirs = t[f"hookscope {m}"], t[f"pytorch-grad-cam {m}"]
        print(f"| {m} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ours / theirs:.2f}x | {agree[m]:.2e} |")
    print(f"| plain forward | {t['plain'] * 1e3:.1f} | | | |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agreement", action="store_true", help="only the agreement table")
    ap.add_argument("--timing", action="store_true", help="only the timing tables")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--scorecam", action="store_true", help="only the Score-CAM timing")
    ap.add_argument("--family", action="store_true", help="only the methods added last, side by side")
    a = ap.parse_args()
    if a.family:  # pytorch-grad-cam alone is needed here
        return family_table(a.quick)
    import captum
    import pytorch_grad_cam
    import torchcam

    versions = (f"grad-cam {getattr(pytorch_grad_cam, '__version__', '1.5.7')}, captum {captum.__version__}, "
                f"torchcam {torchcam.__version__}")
    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}, {versions}")
    if not a.timing and not a.scorecam:
        print("\n## Agreement: max abs difference of min-max normalised maps, resnet18 weights=None seed 0, "
              "batch 2 (Score-CAM: the first image), layer4")
        print("| method | peer | compared at | max abs diff |\n|---|---|---|---|")
        for method, peer, where, diff in agreement():
            print(f"| {method} | {peer} | {where} | {diff:.2e} |")
    if a.agreement:
        return
    cases = [("resnet18", 1, 15), ("resnet18", 8, 7), ("resnet50", 1, 9), ("resnet50", 8, 5)]
    for name, batch, rounds in [] if a.scorecam else cases:
        rounds = max(3, rounds // 2) if a.quick else rounds
        t = timing(name, batch, rounds)
        print(f"\n## Grad-CAM family, {name}, batch {batch}, layer4 ({rounds} rounds)")
        print("| method | median ms | ratio to plain forward |\n|---|---|---|")
        for k, v in t.items():
            print(f"| {k} | {v * 1e3:.1f} | {v / t['plain']:.3f}x |")
    st, counts = scorecam_timing(2 if a.quick else 3)
    print(f"\n## Score-CAM, resnet18, batch 1, layer4 ({2 if a.quick else 3} rounds); "
          + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    print("| method | median s | ratio to the Score-CAM floor |\n|---|---|---|")
    for k, v in st.items():
        print(f"| {k} | {v:.2f} | {v / st['scorecam floor']:.3f}x |")


if __name__ == "__main__":
    main()
