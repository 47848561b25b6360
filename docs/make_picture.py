"""Draws docs/trap.png: what a reference-keeping hook and hookscope read from resnet18's layer1.0.bn2.

Run: .venv/bin/python docs/make_picture.py   (needs the viz extra: matplotlib)
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torchvision

import hookscope

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

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
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
fig.savefig("docs/trap.png", dpi=110)
print("wrote docs/trap.png")
