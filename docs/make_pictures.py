"""Draws every picture of the documentation, with hookscope itself, offline, in about a minute.

Run from the repository root:

    .venv/bin/python docs/make_pictures.py            # all of them
    .venv/bin/python docs/make_pictures.py gallery    # only some: gallery, trap, debugging, cam, features,
                                                      # lrp, transformers, extraction, results, capture,
                                                      # operations, attribution, pruning, command-line,
                                                      # inputs, monitor, circuits

Needs the viz extra (matplotlib), for the transformers and operations pictures the hf extra, and for
the inputs picture the timm extra. The models are the bundled demo model, hookscope.zoo's TinyResNet,
torchvision's resnet18 with random weights, a tiny GPT-2 and Llama built from configs and the induction
model the tests train (a few seconds): nothing is downloaded (torchvision's and timm's transforms are code, not files). The results page's picture is
a screenshot of a result's notebook HTML taken by headless Chromium; without Chromium that one is
skipped.

Writes docs/trap.png, docs/demo_features.png and docs/img/*.png (committed; each kept small).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import torch
from matplotlib.figure import Figure

import hookscope
from hookscope.analysis.attribution import METHODS as ATTRIBUTION_METHODS
from hookscope.analysis.cam import METHODS as CAM_METHODS
from hookscope.synthetic import shapes
from hookscope.viz.attribution import is_signed
from hookscope.viz.overlay import overlay
from hookscope.zoo import DEMO_CLASSES, TinyResNet, demo_model

DOCS = Path(__file__).resolve().parent
IMG = DOCS / "img"
DPI = 80

CAM_NAMES = {"cam": "CAM", "gradcam": "Grad-CAM", "gradcam++": "Grad-CAM++", "xgradcam": "XGrad-CAM",
             "hirescam": "HiResCAM", "layercam": "Layer-CAM", "scorecam": "Score-CAM", "eigencam": "Eigen-CAM",
             "gradcamelementwise": "Grad-CAM element-wise", "eigengradcam": "Eigen-Grad-CAM",
             "ablationcam": "Ablation-CAM", "kpcacam": "KPCA-CAM", "fem": "FEM", "randomcam": "Random-CAM",
             "shapleycam": "Shapley-CAM", "finercam": "Finer-CAM", "fullgrad": "FullGrad"}
ATTRIBUTION_NAMES = {"saliency": "saliency", "gradient": "gradient", "input_x_gradient": "input x gradient",
                     "integrated_gradients": "integrated gradients", "smoothgrad": "SmoothGrad",
                     "smoothgrad_sq": "SmoothGrad squared", "vargrad": "VarGrad",
                     "guided_backprop": "guided backpropagation", "deconvnet": "DeconvNet",
                     "lrp": "LRP (epsilon_plus_flat)", "guided_gradcam": "Guided Grad-CAM",
                     "occlusion": "occlusion", "feature_ablation": "feature ablation",
                     "feature_permutation": "feature permutation", "shapley_value_sampling": "Shapley value sampling",
                     "kernel_shap": "KernelSHAP", "lime": "LIME"}
# the perturbation methods over 8 x 8 cells: one feature a value would cost thousands of passes a picture
GALLERY_SETTINGS: dict[str, dict[str, object]] = {
    "occlusion": {"window": (8, 8), "stride": 4}, "feature_ablation": {"features": "grid:8"},
    "feature_permutation": {"features": "grid:8"}, "shapley_value_sampling": {"features": "grid:8", "samples": 4},
    "kernel_shap": {"features": "grid:8", "samples": 400}, "lime": {"features": "grid:8", "samples": 400}}


def figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI)


def save(fig: Figure | object, name: str, folder: Path = IMG, palette_over: int = 120_000) -> Path:
    """Writes a figure as docs/img/NAME.png at the documentation's resolution; past ``palette_over``
    bytes, as a palette image."""
    from PIL import Image

    path = folder / f"{name}.png"
    fig.savefig(path, dpi=DPI)  # type: ignore[attr-defined]
    if path.stat().st_size > palette_over:  # a palette: a third of the bytes, at the cost of smooth colour bars
        with Image.open(path) as drawn:
            small = drawn.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
        small.save(path, optimize=True)
    print(f"wrote {path.relative_to(DOCS.parent)} ({path.stat().st_size // 1024} KB)")
    return path


def one_of_each_class() -> tuple[torch.Tensor, list[int]]:
    """Six new pictures (seed 123, not the training seed), the first of each class, and their labels."""
    data = shapes(24, seed=123)
    index = [int((data.labels == k).nonzero()[0]) for k in range(len(DEMO_CLASSES))]
    return data.images[index], [int(data.labels[i]) for i in index]


def image(t: torch.Tensor):  # noqa: ANN201 - an array for imshow
    return t.detach().clamp(0, 1).permute(1, 2, 0).numpy()


def row(panels: list, titles: list[str], heading: str, cmap: str | None = None, signed: bool = False) -> Figure:
    fig = figure(1.3 * len(panels), 1.95)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel, title in zip(axes, panels, titles):
        if cmap is None:
            ax.imshow(panel, interpolation="nearest")
        else:
            top = float(abs(panel).max()) or 1.0
            ax.imshow(panel, cmap=cmap, vmin=-top if signed else 0.0, vmax=top, interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.set_axis_off()
    fig.suptitle(heading, fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.72, bottom=0.02, wspace=0.06)
    return fig


# --- the gallery: every CAM and every attribution method on the demo shapes -----------------------------
def gallery(only: tuple[str, ...] | None = None) -> None:
    """Every picture of the gallery, or with ``only`` those attribution methods' alone."""
    net = demo_model()
    x, labels = one_of_each_class()
    predicted = net(x).argmax(1).tolist()
    if only is None:
        save(row([image(p) for p in x], [f"a {DEMO_CLASSES[k]}\nsays: {DEMO_CLASSES[c]}" for k, c in zip(labels, predicted)],
                 "the inputs: new shapes, one of each class, and the demo model's prediction"), "gallery_inputs")
    for method in CAM_METHODS if only is None else ():
        res = hookscope.cam(net, x, method=method)
        titles = [f"explains {DEMO_CLASSES[int(c)]}\nscore {float(s):.1f}" for c, s in zip(res.targets, res.scores)]
        panels = [image(overlay(p, m)) for p, m in zip(x, res.maps)]
        where = "every convolution's and batch norm's bias" if method == "fullgrad" else ", ".join(res.layers)
        # one picture a method, seventeen of them: each a palette image, so the docs stay small
        save(row(panels, titles, f'{CAM_NAMES[method]}: method="{method}", layer {where}'),
             f"gallery_cam_{method.replace('+', 'p')}", palette_over=0)
    for method in ATTRIBUTION_METHODS if only is None else only:
        res = hookscope.attribute(net, x, method=method, **GALLERY_SETTINGS.get(method, {}))  # type: ignore[arg-type]
        signed = is_signed(method)
        maps = res.maps.detach().float()
        maps = maps.sum(1) if signed else maps.abs().sum(1)  # as hookscope.viz.attribution draws them
        titles = [f"explains {DEMO_CLASSES[int(c)]}\nscore {float(s):.1f}" for c, s in zip(res.target, res.scores)]
        save(row(list(maps.numpy()), titles, f'{ATTRIBUTION_NAMES[method]}: method="{method}"',
                 cmap="bwr" if signed else "inferno", signed=signed), f"gallery_attribute_{method}")


# --- the in-place trap ------------------------------------------------------------------------------------
def trap() -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    layer = "layer1.0.bn2"
    kept = {}
    h = model.get_submodule(layer).register_forward_hook(lambda m, i, o: kept.__setitem__("o", o.detach()))
    with torch.no_grad():
        model(x)
    h.remove()
    with torch.no_grad(), hookscope.capture(model, layer) as rec:
        model(x)
    naive, true = kept["o"].flatten(), rec[layer].output.flatten()

    fig = Figure(figsize=(9, 3.2))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, data, title, color in [
        (axes[0], naive, "hook keeping output by reference", "#c0392b"),
        (axes[1], true, "hookscope.capture (default)", "#2471a3"),
    ]:
        ax.hist(data.numpy(), bins=80, color=color)
        ax.set_title(title, fontsize=10)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_xlabel(f"values of {layer} (min {data.min():.2f})")
    axes[0].set_ylabel("count")
    fig.suptitle("resnet18: `out += identity; relu(inplace)` rewrites the stored output", fontsize=11)
    fig.tight_layout()
    fig.savefig(DOCS / "trap.png", dpi=110)
    print("wrote docs/trap.png")


# --- debugging: trace, gradient flow, diff --------------------------------------------------------------
def debugging() -> None:
    from hookscope.viz.plots import plot_diff, plot_gradient_flow, plot_trace

    torch.manual_seed(0)
    net = TinyResNet().eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with hookscope.trace(net, keep="all", param_grads=True) as tr:
        net(x).logsumexp(-1).sum().backward()
    save(plot_trace(tr), "debugging_trace")
    save(plot_gradient_flow(hookscope.gradient_flow(net, trace=tr), trace=tr), "debugging_flow")
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed.get_submodule("layer2.0.conv2").weight.mul_(1.1)  # one weight changed by 10%
    save(plot_diff(hookscope.diff(net, changed, x)), "debugging_diff")


# --- class activation maps: one picture, each class explained --------------------------------------------
def cam() -> None:
    from hookscope.viz.plots import plot_cams

    net = demo_model()
    x, labels = one_of_each_class()
    picture = x[2:3]  # the triangle
    every_class = [hookscope.cam(net, picture, method="gradcam", target=k) for k in range(len(DEMO_CLASSES))]
    save(plot_cams(picture[0], every_class, class_names=DEMO_CLASSES), "cam_every_class")


# --- feature maps: the trap in one call, and a PCA reduction ----------------------------------------------
def features() -> None:
    from hookscope.viz.features import plot_feature_maps, plot_reference_comparison

    net = demo_model()
    triangle = one_of_each_class()[0][2:3]
    top = hookscope.feature_maps(net, triangle, layers="layer1")
    save(plot_feature_maps(top, picture=triangle, top_k=16), "demo_features", DOCS)
    data = shapes(2, seed=123)
    trap = hookscope.compare_references(net, data.images, layers="layer2.1")
    save(plot_reference_comparison(trap, picture=data.images, channels=list(range(8))), "features_trap")
    maps = hookscope.feature_maps(net, data.images, layers="layer1")
    save(plot_feature_maps(maps, picture=data.images, reduce="pca"), "features_pca")


# --- LRP: the four composites on the demo model -----------------------------------------------------------
def lrp() -> None:
    net = demo_model()
    x, labels = one_of_each_class()
    composites = ("epsilon_plus_flat", "epsilon_plus", "epsilon_gamma_box", "epsilon_alpha2_beta1")
    fig = figure(1.3 * (len(composites) + 1), 1.95 * 3)
    axes = fig.subplots(3, len(composites) + 1, squeeze=False)
    picked = [0, 2, 5]  # a circle, a triangle, a diamond
    results = [hookscope.attribute(net, x[picked], method="lrp", composite=c) for c in composites]
    for r, i in enumerate(picked):
        axes[r][0].imshow(image(x[i]), interpolation="nearest")
        axes[r][0].set_title(f"input: {DEMO_CLASSES[labels[i]]}", fontsize=8)
        for ax, c, res in zip(axes[r][1:], composites, results):
            m = res.maps[r].sum(0).numpy()
            top = float(abs(m).max()) or 1.0
            ax.imshow(m, cmap="bwr", vmin=-top, vmax=top, interpolation="nearest")
            ax.set_title(f"{c}\n{DEMO_CLASSES[int(res.target[r])]}, sum {float(res.maps[r].sum()):.1f}", fontsize=7)
    for ax in axes.flat:
        ax.set_axis_off()
    fig.suptitle("LRP relevance of the predicted class (red positive, blue negative)", fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.86, bottom=0.01, wspace=0.06, hspace=0.45)
    save(fig, "lrp_composites")


# --- transformers: token scores and a patching sweep on a tiny GPT-2 from a config ------------------------
def transformers_pictures() -> None:
    import transformers

    from hookscope.viz.attribution import plot_token_attribution

    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
    ids = torch.tensor([[15, 11, 95, 4]])
    story = hookscope.attribute_tokens(lm, ids, generate=3, method="input_x_gradient",
                                       tokenizer=lambda i: f"t{i}")
    save(plot_token_attribution(story), "transformers_tokens")

    blocks = ["transformer.h.0", "transformer.h.1"]
    clean_prompt, corrupted_prompt = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[7, 2, 3, 9, 5]])
    with torch.no_grad():
        with hookscope.capture(lm, *blocks) as clean_run:
            clean_logits = lm(clean_prompt).logits
        corrupted_logits = lm(corrupted_prompt).logits
        answer = int(clean_logits[0, -1].argmax())
        effect = torch.zeros(len(blocks), clean_prompt.shape[1])
        for i, name in enumerate(blocks):
            for pos in range(clean_prompt.shape[1]):
                clean_state = clean_run[name].output[:, pos]
                with hookscope.edit(lm, name, output=clean_state, at=hookscope.at[:, pos]):
                    logits = lm(corrupted_prompt).logits
                effect[i, pos] = logits[0, -1, answer] - corrupted_logits[0, -1, answer]
    fig = figure(7.5, 2.6)
    ax = fig.subplots()
    top = float(effect.abs().max()) or 1.0
    shown = ax.imshow(effect.numpy(), cmap="bwr", vmin=-top, vmax=top)
    fig.colorbar(shown, ax=ax, fraction=0.03, pad=0.02, label="logit change")
    ax.set_yticks(range(len(blocks)), blocks, fontsize=8)
    ax.set_xticks(range(clean_prompt.shape[1]),
                  [f"{int(c)}->{int(k)}" if c != k else str(int(c)) for c, k in zip(clean_prompt[0], corrupted_prompt[0])],
                  fontsize=8)
    ax.set_xlabel("position (clean token -> corrupted token)", fontsize=8)
    ax.set_title(f"patching one state from the clean run: change of the clean answer's logit (token {answer})",
                 fontsize=9)
    fig.subplots_adjust(left=0.17, right=0.9, top=0.86, bottom=0.22)
    save(fig, "transformers_patching")


# --- extraction: a store's pooled activations, two principal components ----------------------------------
def extraction() -> None:
    net = demo_model()
    data = shapes(240, seed=7)
    with tempfile.TemporaryDirectory() as folder:
        store = hookscope.extract(net, data.images, layers={"layer3": "mean"}, out=Path(folder) / "store")
        pooled = torch.as_tensor(store["layer3"][:]).float()  # N x C: layer3's spatial mean, what pool feeds fc
    centred = pooled - pooled.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    xy = (centred @ v[:2].T).numpy()
    fig = figure(5.2, 3.8)
    ax = fig.subplots()
    for k, name in enumerate(DEMO_CLASSES):
        chosen = (data.labels == k).numpy()
        ax.scatter(xy[chosen, 0], xy[chosen, 1], s=9, label=name)
    ax.legend(fontsize=8, markerscale=1.5, loc="best")
    ax.set_xlabel("first principal component", fontsize=8)
    ax.set_ylabel("second principal component", fontsize=8)
    ax.set_title(f"the demo model's pooled features of {len(data.labels)} new shapes, read from the store",
                 fontsize=9)
    fig.tight_layout()
    save(fig, "extraction_pca")


# --- results in notebooks: what a notebook shows for a CamMaps ------------------------------------------
def results() -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("skipped docs/img/results_notebook.png: no chromium to take the screenshot", file=sys.stderr)
        return
    from PIL import Image

    net = demo_model()
    x, _ = one_of_each_class()
    page = hookscope.cam(net, x[:2], method="gradcam++")._repr_html_()
    with tempfile.TemporaryDirectory() as folder:
        html, shot = Path(folder) / "result.html", Path(folder) / "shot.png"
        style = ("body{font-family:sans-serif;font-size:13px;margin:12px;background:#fff}"  # as Jupyter draws tables
                 "table{border-collapse:collapse}td,th{padding:4px 9px;text-align:right}"
                 "tbody tr:nth-child(odd){background:#f5f5f5}thead{border-bottom:1px solid #000}")
        html.write_text(f"<!doctype html><meta charset='utf-8'><style>{style}</style><body>{page}</body>")
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=760,900", html.as_uri()],
                       check=True, capture_output=True, timeout=120)
        picture = Image.open(shot).convert("RGB")
        box = Image.eval(picture.convert("L"), lambda v: 255 - v).getbbox()  # crop the white margin
        if box is not None:
            picture = picture.crop((0, 0, min(picture.width, box[2] + 12), min(picture.height, box[3] + 12)))
        path = IMG / "results_notebook.png"
        picture.quantize(colors=128).save(path, optimize=True)
        print(f"wrote {path.relative_to(DOCS.parent)} ({path.stat().st_size // 1024} KB)")


# --- capture: what each layer produced, and the gradient that reached it -------------------------------
def capture_pictures() -> None:
    net = demo_model()
    triangle = one_of_each_class()[0][2:3]
    layers = ["stem", "layer1", "layer2", "layer3"]
    with hookscope.capture(net, *layers, keep="all") as rec:
        logits = net(triangle)
        logits[0, int(logits.argmax())].backward()
    predicted = DEMO_CLASSES[int(logits.argmax())]
    fig = figure(1.45 * (len(layers) + 1), 3.6)
    axes = fig.subplots(2, len(layers) + 1, squeeze=False)
    axes[0][0].imshow(image(triangle[0]), interpolation="nearest")
    axes[0][0].set_title("input", fontsize=8)
    for col, name in enumerate(layers, 1):
        out, grad = rec[name].output[0], rec[name].grad_output[0]
        axes[0][col].imshow(out.abs().mean(0).numpy(), cmap="viridis", vmin=0, interpolation="nearest")
        axes[0][col].set_title(f"{name}.output\n{'x'.join(map(str, out.shape))}", fontsize=8)
        g = grad.abs().mean(0).numpy()
        axes[1][col].imshow(g, cmap="magma", vmin=0, interpolation="nearest")  # uniform after the pool: one colour
        axes[1][col].set_title(f"{name}.grad_output\nmax {float(grad.abs().max()):.2g}", fontsize=8)
    for ax in axes.flat:
        ax.set_axis_off()
    fig.suptitle(f'capture(net, "stem", "layer1", "layer2", "layer3", keep="all"), then a backward pass:\n'
                 f'the mean |channel| of each output (top), of the gradient of the "{predicted}" score (bottom)',
                 fontsize=8)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.78, bottom=0.02, wspace=0.08, hspace=0.4)
    save(fig, "capture_layers")


# --- operations: one operation's record, and the attention of a fused kernel ----------------------------
def operations_pictures() -> None:
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), hookscope.capture(net, "layer1.0::add", "layer1.0", keep="all") as rec:
        net(x)
    op = rec["layer1.0::add"]
    shown = [(t, title) for t, title in zip(op.args, ("args[0]: out (bn2's output)", "args[1]: identity"))]
    shown += [(op.output, "output: out + identity"), (rec["layer1.0"].output, "layer1.0's output (after relu_)")]
    fig = figure(11.0, 2.8)
    axes = fig.subplots(1, len(shown), sharey=True)
    for ax, (t, title) in zip(axes, shown):
        values = t.flatten().numpy()
        ax.hist(values, bins=60, color="#c0392b" if "relu" in title else "#2471a3")
        ax.axvline(0, color="k", lw=0.6)
        ax.set_title(f"{title}\nmin {values.min():.2f}", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle('capture(net, "layer1.0::add", keep="all"): the residual sum `out += identity` of resnet18\'s '
                 "first block,\nits inputs and its output, read before the in-place ReLU that follows rewrote it",
                 fontsize=9)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.72, bottom=0.1, wspace=0.12)
    save(fig, "operations_add")

    import transformers

    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, vocab_size=50,
                                      initializer_range=0.5)  # larger random weights: patterns that differ
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    llama = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(0))
    name = "layers.0.self_attn::scaled_dot_product_attention"
    p = hookscope.attention(llama, ids)[name][0]
    fig = figure(1.7 * p.shape[0], 2.5)
    axes = fig.subplots(1, p.shape[0])
    for head, ax in enumerate(axes):
        ax.imshow(p[head].numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"head {head}", fontsize=8)
        ax.set_xlabel("key token", fontsize=7)
        ax.set_ylabel("query token" if head == 0 else "", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"hookscope.attention(llama, ids): the probabilities of the fused kernel\n{name} "
                 "(causal; four query heads, two key heads)", fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.74, bottom=0.17, wspace=0.3)
    save(fig, "operations_attention")


# --- attribution: one picture, several methods ------------------------------------------------------------
def attribution_pictures() -> None:
    net = demo_model()
    x, labels = one_of_each_class()
    triangle = x[2:3]
    methods = ("saliency", "integrated_gradients", "input_x_gradient", "guided_backprop", "lrp")
    panels, titles = [image(triangle[0])], [f"input: a {DEMO_CLASSES[labels[2]]}"]
    for method in methods:
        res = hookscope.attribute(net, triangle, method=method)
        maps = res.maps.detach().float()[0]
        panels.append((maps.sum(0) if is_signed(method) else maps.abs().sum(0)).numpy())
        titles.append(f"{ATTRIBUTION_NAMES[method]}\n{DEMO_CLASSES[int(res.target[0])]}")
    fig = figure(1.35 * len(panels), 2.0)
    axes = fig.subplots(1, len(panels))
    for ax, panel, title, method in zip(axes, panels, titles, (None, *methods)):
        if method is None:
            ax.imshow(panel, interpolation="nearest")
        else:
            signed = is_signed(method)
            top = float(abs(panel).max()) or 1.0
            ax.imshow(panel, cmap="bwr" if signed else "inferno", vmin=-top if signed else 0.0, vmax=top,
                      interpolation="nearest")
        ax.set_title(title, fontsize=7)
        ax.set_axis_off()
    fig.suptitle("hookscope.attribute(net, x, method=...): which pixels the predicted class depends on "
                 "(red positive, blue negative)", fontsize=8)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.72, bottom=0.02, wspace=0.06)
    save(fig, "attribution_methods")


# --- pruning: masks per layer; channels removed for real, before and after --------------------------------
def pruning_pictures() -> None:
    net = demo_model()
    masked = copy.deepcopy(net)
    hookscope.prune(masked, torch.nn.Conv2d, torch.nn.Linear, amount=0.5, scope="global")
    rows = [r for r in hookscope.sparsity(masked).rows if r.masked]
    probe = one_of_each_class()[0][:1]
    smaller = copy.deepcopy(net)
    hookscope.prune_channels(smaller, probe, amount=0.5)
    slim = hookscope.compact(smaller, probe)
    convs = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Conv2d)]
    before = [net.get_submodule(n).out_channels for n in convs]
    after = [slim.get_submodule(n).out_channels for n in convs]
    compared = hookscope.compare_models(net, slim, probe, repeats=5)
    fig = figure(11.0, 3.1)
    left, middle, right = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1.2, 1.0]})
    left.bar(range(len(rows)), [100 * r.zeros / r.numel for r in rows], color="#2471a3")
    left.set_xticks(range(len(rows)), [r.layer for r in rows], rotation=45, fontsize=7, ha="right")
    left.set_ylabel("weights masked (%)", fontsize=8)
    left.set_title('prune(net, Conv2d, Linear, amount=0.5, scope="global")\nsparsity(net): each layer\'s share',
                   fontsize=8)
    at = torch.arange(len(convs)).float()
    middle.bar(at - 0.2, before, 0.4, label="before", color="#95a5a6")
    middle.bar(at + 0.2, after, 0.4, label="after compact", color="#27ae60")
    middle.set_xticks(range(len(convs)), convs, rotation=45, fontsize=7, ha="right")
    middle.set_ylabel("output channels", fontsize=8)
    middle.legend(fontsize=7)
    middle.set_title("prune_channels(net, x, amount=0.5), then compact:\nchannels removed for real", fontsize=8)
    shown = [r for r in compared.rows if r.ratio is not None and r.name in
             ("parameters", "multiply-adds", "CPU latency", "file size")]
    right.barh(range(len(shown)), [r.ratio for r in shown], color="#27ae60")
    right.axvline(1.0, color="k", lw=0.6)
    right.set_yticks(range(len(shown)), [r.name for r in shown], fontsize=7)
    right.invert_yaxis()
    for i, r in enumerate(shown):
        right.text(r.ratio + 0.02, i, f"{r.ratio:.2f}x", va="center", fontsize=7)
    right.set_xlim(0, 1.25)
    right.set_xlabel("after / before", fontsize=8)
    right.set_title("compare_models(net, slim, x)", fontsize=8)
    for ax in (left, middle, right):
        ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.83, bottom=0.27, wspace=0.35)
    save(fig, "pruning_before_after")


# --- inputs: one image file, as three model libraries' transforms make it ----------------------------------
def inputs_pictures() -> None:
    from PIL import Image

    triangle = one_of_each_class()[0][2]
    made = [("demo", {}), ("torchvision:resnet18", {"weights": "DEFAULT"}), ("timm:resnet18", {})]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "wide.png"
        Image.fromarray((image(triangle) * 255).round().astype("uint8")).resize((200, 120)).save(path)
        with Image.open(path) as f:
            original = f.convert("RGB")
        batches = [hookscope.load_images(spec, str(path), **kw) for spec, kw in made]
    fig = figure(1.75 * (len(made) + 1), 2.3)
    axes = fig.subplots(1, len(made) + 1)
    axes[0].imshow(original, interpolation="nearest")
    axes[0].set_title(f"the file\n{original.width} x {original.height}", fontsize=8)
    for ax, (spec, _), batch in zip(axes[1:], made, batches):
        ax.imshow(image(batch.pictures[0]), interpolation="nearest")
        x = batch.x[0]
        ax.set_title(f'load_images("{spec}")\n{"x".join(map(str, x.shape))}, x in [{float(x.min()):.1f}, '
                     f"{float(x.max()):.1f}]", fontsize=7)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle("one picture file, as each model library's own transform makes it (batch.pictures; "
                 "batch.x normalised)", fontsize=8)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.72, bottom=0.02, wspace=0.12)
    save(fig, "inputs_transforms")


# --- the command line: a picture hookscope cam --plot draws --------------------------------------------
def command_line_pictures() -> None:
    from hookscope.cli import main

    path = IMG / "command_line_cam.png"
    code = main(["cam", "demo", "--method", "gradcam,gradcam++,layercam", "--plot", str(path)])
    if code != 0:
        raise SystemExit(f"hookscope cam exited with {code}")
    from PIL import Image

    with Image.open(path) as drawn:
        small = drawn.convert("RGB")
    if small.width > 760:
        small = small.resize((760, round(small.height * 760 / small.width)), Image.Resampling.LANCZOS)
    small.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)
    print(f"wrote {path.relative_to(DOCS.parent)} ({path.stat().st_size // 1024} KB)")


def monitor_pictures() -> None:
    """The example run ``hookscope runs --example`` writes (its learning rate raised 1000-fold part way,
    so a NaN appears), drawn as the command draws it."""
    from hookscope.cli import main

    with tempfile.TemporaryDirectory() as folder:
        code = main(["runs", f"{folder}/run", "--example", "--plot", str(IMG / "run.png")])
    if code != 1:  # 1: the run holds a NaN, the point of the picture
        raise SystemExit(f"hookscope runs --example exited with {code}")


def circuits_pictures() -> None:
    """The induction model the tests train (``tests/_induction.py``: a previous-token head in block 0 and an
    induction head in block 1): the head sweep, the residual sweep by position, the attribution patching
    estimate, the logit lens and the tuned lens of its clean prompt."""
    from hookscope.viz.circuits import plot_logit_lens, plot_patching

    sys.path.insert(0, str(DOCS.parent / "tests"))
    import _induction

    ind = _induction.trained()
    kw = {"answer": ind.answer, "wrong": ind.wrong}
    labels = [str(int(t)) for t in ind.clean]
    heads = hookscope.activation_patching(ind.model, ind.clean, ind.corrupted, component="attn.z", **kw)
    save(plot_patching(heads), "circuits_heads")
    stream = hookscope.activation_patching(ind.model, ind.clean, ind.corrupted, **kw)
    save(plot_patching(stream, labels=labels), "circuits_positions")
    estimate = hookscope.attribution_patching(ind.model, ind.clean, ind.corrupted, component="attn.z", steps=8, **kw)
    save(plot_patching(estimate), "circuits_eap_ig")
    save(plot_logit_lens(hookscope.logit_lens(ind.model, ind.clean, token=ind.answer), labels=labels),
         "circuits_lens")
    data = [_induction.batch(32, torch.Generator().manual_seed(s))[0] for s in range(8)]
    tuned = hookscope.tune_lens(ind.model, data, steps=100)
    save(plot_logit_lens(hookscope.logit_lens(ind.model, ind.clean, token=ind.answer, tuned=tuned), labels=labels),
         "circuits_tuned_lens")


PICTURES: dict[str, Callable[[], None]] = {
    "gallery": gallery, "trap": trap, "debugging": debugging, "cam": cam, "features": features, "lrp": lrp,
    "transformers": transformers_pictures, "extraction": extraction, "results": results,
    "capture": capture_pictures, "operations": operations_pictures, "attribution": attribution_pictures,
    "pruning": pruning_pictures, "command-line": command_line_pictures, "inputs": inputs_pictures,
    "monitor": monitor_pictures, "circuits": circuits_pictures,
}

if __name__ == "__main__":
    asked = sys.argv[1:] or list(PICTURES)
    unknown = [a for a in asked if a not in PICTURES]
    if unknown:
        sys.exit(f"unknown picture group {unknown[0]!r}; choose from {', '.join(PICTURES)}")
    IMG.mkdir(exist_ok=True)
    for name in asked:
        PICTURES[name]()
