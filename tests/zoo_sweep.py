"""The model-zoo sweep shared by tests/test_zoo_sweep.py (a subset, in CI) and bench/bench_zoo.py (all).

Each entry builds a model with random weights (nothing downloaded) and its smallest valid example
input; :func:`check` then runs what a user runs first on a new model (capture of every leaf, trace,
summary and, for image classifiers, CAM on the automatic layer) and asserts the promises: outputs
bit-identical with and without hookscope, every leaf that ran recorded, the summary's parameter
total equal to the model's unique parameters, a finite CAM of the input's size, no hook left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import hookscope
from hookscope.core import hook_count

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]


@dataclass
class Entry:
    """One model of the sweep: how to build it with its input, and whether CAM applies."""

    name: str
    build: Callable[[], Built]
    image: bool = False  # a classifier of B x 3 x H x W images: CAM runs on the automatic layer
    output: Callable[[Any], torch.Tensor] | None = None
    refused: str | None = None  # the automatic layer is refused, saying this; CAM then runs on cam_layers
    cam_layers: str | None = None


@dataclass
class Outcome:
    name: str
    passed: bool
    seconds: float
    checks: list[str] = field(default_factory=list)
    failure: str = ""


def _seeded_input(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _ids(batch: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _calibrated(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """Random weights as a trained model would have them: BN statistics of real batches, no zero head.

    torchvision initialises some heads to zero (ViT, MaxViT): every logit is then 0 and no CAM can
    say anything; BatchNorm's initial statistics make deep untrained CNNs blow up or vanish.
    """
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear) and not bool(m.weight.any()):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
        moms = {m: m.momentum for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
        if moms:
            for m in moms:
                m.momentum = None  # cumulative average over the calibration batches
            model.train()
            for _ in range(2):
                model(torch.randn(max(2, x.shape[0]), *x.shape[1:], generator=gen))
            for m, mom in moms.items():
                m.momentum = mom
    return model.eval()


def _torchvision(name: str, size: int) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        torch.manual_seed(0)
        kw: dict[str, Any] = {"weights": None}
        if name in ("googlenet", "inception_v3"):
            kw["aux_logits"], kw["init_weights"] = False, True
        model = torchvision.models.get_model(name, **kw)
        x = _seeded_input(1, 3, size, size)
        return _calibrated(model, x), (x,), {}

    return build


def _torchvision_dense(module: str, name: str, size: int) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        torch.manual_seed(0)
        kw: dict[str, Any] = {"weights": None, "weights_backbone": None}
        if module == "detection":
            kw["num_classes"] = 5
        else:
            kw["num_classes"] = 4
        model = getattr(getattr(torchvision.models, module), name)(**kw).eval()
        return model, (_seeded_input(1, 3, size, size),), {}

    return build


def _hf(config: str, cls: str, kind: str, **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        model = getattr(transformers, cls)(getattr(transformers, config)(**cfg)).eval()
        if kind == "image":
            size = cfg["image_size"]
            return model, (_seeded_input(1, 3, size, size),), {}
        ids = _ids(1, 8, cfg["vocab_size"])
        kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
        if kind == "seq2seq":
            kwargs["decoder_input_ids"] = _ids(1, 4, cfg["vocab_size"])
        return model, (ids,), kwargs

    return build


def _timm(name: str, size: int, **kw: Any) -> Callable[[], Built]:
    def build() -> Built:
        import timm

        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, **kw)
        x = _seeded_input(1, 3, size, size)
        return _calibrated(model, x), (x,), {}

    return build


_TRANSFORMER_SIZES = {"vit": 224, "swin": 224, "maxvit": 224}
_SMALL = 64  # the CNNs' smallest size checked here; inception_v3 needs 75 and more


def torchvision_classifiers() -> list[Entry]:
    import torchvision

    out = []
    for name in torchvision.models.list_models(module=torchvision.models):
        size = next((s for k, s in _TRANSFORMER_SIZES.items() if name.startswith(k)), _SMALL)
        size = 96 if name == "inception_v3" else size
        post_norm = name.startswith("swin_v2")  # x + norm(attn(x)): no norm before the last attention
        out.append(Entry(f"torchvision:{name}", _torchvision(name, size), image=True,
                         refused="post-norm" if post_norm else None,
                         cam_layers="features.7.0" if post_norm else None))
    return out


def dense_models() -> list[Entry]:
    seg = ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]
    det = ["fasterrcnn_mobilenet_v3_large_320_fpn", "retinanet_resnet50_fpn", "ssdlite320_mobilenet_v3_large"]
    return ([Entry(f"torchvision:{n}", _torchvision_dense("segmentation", n, 64)) for n in seg]
            + [Entry(f"torchvision:{n}", _torchvision_dense("detection", n, 128)) for n in det])


_TINY_TEXT = dict(vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def hf_models() -> list[Entry]:
    return [
        Entry("hf:BertModel", _hf("BertConfig", "BertModel", "text", hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, **_TINY_TEXT)),
        Entry("hf:GPT2LMHeadModel", _hf("GPT2Config", "GPT2LMHeadModel", "text", n_layer=2, n_embd=32,
                                        n_head=2, n_positions=64, **_TINY_TEXT)),
        Entry("hf:T5ForConditionalGeneration", _hf("T5Config", "T5ForConditionalGeneration", "seq2seq",
                                                   d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                                   **_TINY_TEXT)),
        Entry("hf:ViTForImageClassification",
              _hf("ViTConfig", "ViTForImageClassification", "image", image_size=32, patch_size=8, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=5),
              image=True, output=lambda o: o.logits),
    ]


def timm_models() -> list[Entry]:
    return [
        Entry("timm:resnet18", _timm("resnet18", 64), image=True),
        Entry("timm:efficientnet_b0", _timm("efficientnet_b0", 64), image=True),
        Entry("timm:convnext_atto", _timm("convnext_atto", 64), image=True),
        Entry("timm:vit_tiny_patch16_224", _timm("vit_tiny_patch16_224", 64, img_size=64), image=True),
        Entry("timm:deit_tiny_distilled_patch16_224",
              _timm("deit_tiny_distilled_patch16_224", 64, img_size=64), image=True),
        Entry("timm:swin_tiny_patch4_window7_224", _timm("swin_tiny_patch4_window7_224", 224), image=True),
    ]


def all_entries() -> list[Entry]:
    return torchvision_classifiers() + dense_models() + hf_models() + timm_models()


# --- the checks ----------------------------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Bit-identical nested outputs (tensors, tuples, lists, dicts, ModelOutputs)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b)  # caches and other objects: carried, not compared


def _leaves(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if n and not any(True for _ in m.children())]


def _unique_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _calls_by_hand(model: nn.Module, leaves: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int]:
    """How often each leaf runs, counted by plain forward hooks (the reference)."""
    counts: dict[str, int] = {}
    mods = dict(model.named_modules())
    handles = [mods[n].register_forward_hook(lambda m, a, o, n=n: counts.__setitem__(n, counts.get(n, 0) + 1))
               for n in leaves]
    try:
        model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return counts


def _check_capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], ref: Any) -> str:
    leaves = _leaves(model)
    counts = _calls_by_hand(model, leaves, args, kwargs)
    wanted = set(leaves)
    with hookscope.capture(model, lambda name, m: name in wanted) as rec:
        out = model(*args, **kwargs)
    assert _same(out, ref), "output changed under capture"
    got = {n: len(rec[n]) for n in rec}
    assert got == counts, f"capture recorded {len(got)} leaves / {sum(got.values())} calls, hooks saw " \
                          f"{len(counts)} / {sum(counts.values())}"
    return f"capture {len(got)} leaves"


def _check_trace(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], ref: Any) -> str:
    with hookscope.trace(model) as t:
        out = model(*args, **kwargs)
    assert _same(out, ref), "output changed under trace"
    rows = t.rows
    assert rows, "trace recorded nothing"
    return f"trace {len(rows)} rows"


def _check_summary(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    s = hookscope.summary(model, tuple(args), kwargs=kwargs or None)
    want = _unique_params(model)
    assert s.totals.params == want, f"summary counts {s.totals.params} parameters, the model has {want}"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # FlopCounterMode counts neither CPU attention kernels nor nn.MultiheadAttention's no-grad fast
    # path (0 flops): the reference runs with gradients on and attention as plain matrix products.
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(*args, **kwargs)
    macs = counter.get_total_flops() // 2
    if s.totals.macs_partial:
        assert s.totals.macs <= macs, f"summary's lower bound {s.totals.macs} MACs exceeds FlopCounterMode's {macs}"
    else:
        assert s.totals.macs == macs, f"summary counts {s.totals.macs} MACs, FlopCounterMode {macs}"
    return f"summary {s.totals.params} params, {s.totals.macs} MACs"


def _check_cam(entry: Entry, model: nn.Module, args: tuple[Any, ...]) -> str:
    x = args[0]
    if entry.refused is not None:
        try:
            hookscope.cam(model, x, output=entry.output)
        except hookscope.HookscopeError as e:
            assert entry.refused in str(e) and "\n" not in str(e), f"refused otherwise: {e}"
        else:
            raise AssertionError(f"the automatic layer was not refused ({entry.refused})")
    res = hookscope.cam(model, x, output=entry.output, layers=entry.cam_layers)
    assert res.maps.shape == (x.shape[0], *x.shape[-2:]), f"CAM maps of shape {tuple(res.maps.shape)}"
    assert bool(torch.isfinite(res.maps).all()), "CAM map not finite"
    return f"cam on {res.layers[0]}" + (f" after a refusal ({entry.refused})" if entry.refused else "")


def check(entry: Entry) -> Outcome:
    """Run the sweep's checks on one model; never raises (the failure is in the outcome)."""
    start = time.perf_counter()
    done: list[str] = []
    try:
        model, args, kwargs = entry.build()
        with torch.no_grad():
            ref = model(*args, **kwargs)
            again = model(*args, **kwargs)
        if not _same(ref, again):
            raise AssertionError("the model itself is not deterministic")
        with torch.no_grad():
            done.append(_check_capture(model, args, kwargs, ref))
            done.append(_check_trace(model, args, kwargs, ref))
        done.append(_check_summary(model, args, kwargs))
        if entry.image:
            done.append(_check_cam(entry, model, args))
        with torch.no_grad():
            assert _same(model(*args, **kwargs), ref), "output changed after the analyses"
        assert hook_count(model) == 0, "a hook was left on the model"
    except Exception as e:  # noqa: BLE001 - the sweep reports every failure, it does not stop
        first = (str(e).splitlines() or [""])[0][:300]
        return Outcome(entry.name, False, time.perf_counter() - start, done, f"{type(e).__name__}: {first}")
    return Outcome(entry.name, True, time.perf_counter() - start, done)


def table(outcomes: list[Outcome]) -> str:
    """The markdown table bench/RESULTS.md keeps: model, passed, seconds, what failed."""
    lines = ["| model | passed | seconds | failure |", "|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {'yes' if o.passed else 'NO'} | {o.seconds:.1f} | {o.failure} |")
    ok = sum(o.passed for o in outcomes)
    lines.append(f"\n{ok} of {len(outcomes)} passed in {math.fsum(o.seconds for o in outcomes):.0f} s")
    return "\n".join(lines)
