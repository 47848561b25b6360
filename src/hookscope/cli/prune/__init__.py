"""``hookscope prune MODEL``: mask weights, or remove whole channels, then show what was pruned and the
model before and after (parameters, mult-adds, CPU latency, file size); ``--out`` writes the weights."""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ...core.text import first_line
from ...errors import HookscopeError, did_you_mean
from .._common import add_device_argument, add_examples, add_layers_argument, check_device, model_from
from ..inputs import IMAGE_SUFFIXES, add_image_arguments, image_files, load_images, model_input, ModelInput
from .._load import add_model_arguments, class_names
from ._llm import add_llm_arguments, is_llm, run_llm
from ._shares import check_heads, check_mlp, check_width

METHODS = ("l1_unstructured", "random_unstructured", "ln_structured", "random_structured")
IMPORTANCE = ("l2", "l1", "activation", "apoz", "taylor")
_MEASURED = ("activation", "apoz", "taylor")
_TENSOR_FILES = (".pt", ".pth", ".npy", ".npz")
_IMPORTANCE_HELP = ("how channels are ranked (with --channels): l2 (default) or l1, the norm of their weights, "
                    "no data; activation (mean |activation|) and apoz (share of non-zeros after a ReLU), "
                    "measured on --data; taylor (|activation x gradient| of the cross entropy), measured on "
                    "--data WITH labels")
_DATA_HELP = ("calibration data for --importance activation, apoz or taylor: a folder of images (read with "
              "--preset, like --image), for taylor with one subfolder per class (named by the model's class "
              "names, else numbered in name order, as torchvision's ImageFolder); or a tensor file read "
              "without unpickling: .pt (torch.load(weights_only=True)) holding a tensor or "
              "{'inputs': N x ..., 'labels': N}, .npy (allow_pickle=False), or .npz with inputs and labels arrays. "
              "With --method wanda/sparsegpt or --layers-remove: calibration text (or a text file), tokenized by "
              "the --config folder's tokenizer and cut into --seqlen tokens, or a .pt/.npy tensor of token ids")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prune",
        help="prune weights (masks) or whole channels, and show the model before and after",
        description="Prunes MODEL: by default masks the lowest-magnitude weights of every Linear and Conv "
        "(--method, --layers, --scope), as torch.nn.utils.prune does, then makes the masks permanent; with "
        "--channels removes whole channels group by group along the dependency graph traced on the example "
        "input (--importance; with --compact the model gets physically smaller). Prints what was pruned, "
        "then parameters, mult-adds, CPU latency and file size before and after; --out writes the weights.",
    )
    add_model_arguments(p)
    add_image_arguments(p)
    add_layers_argument(p, "the layers to prune, also by type such as Conv2d (default: every Linear and Conv; with "
                           "--channels every removable channel group)")
    p.add_argument("--amount", metavar="FRACTION", type=float, default=None,
                   help="the share to prune: of each layer's weights (or channels), in [0, 1]; with "
                        "--channels in [0, 1), each group keeping a channel")
    p.add_argument("--count", metavar="N", type=int, default=None,
                   help="instead of --amount: prune N weights (or N channels with a structured --method) per layer")
    p.add_argument("--method", metavar="M", default=None,
                   help=f"weight masks: {', '.join(METHODS)} (default l1_unstructured; random ones drawn "
                        "from --seed); or wanda, sparsegpt, calibrated on --data (with --sparsity or --n-m)")
    p.add_argument("--param", metavar="NAME", default="weight", help="the parameter to mask (default weight)")
    p.add_argument("--norm", metavar="N", type=_norm, default=None,
                   help="the norm of ln_structured: a number, inf, fro or nuc (default 1)")
    p.add_argument("--dim", metavar="D", type=int, default=None,
                   help="the channel dim of a structured --method (default 0, output channels)")
    p.add_argument("--scope", choices=("layer", "group", "global"), default=None,
                   help="layer (default for masks): each layer alone; group (default with --channels): the "
                        "same share of every channel group; global: ranked across layers or groups")
    _add_channel_arguments(p)
    add_llm_arguments(p)
    p.add_argument("--repeats", metavar="N", type=int, default=10,
                   help="timed runs of each model for the CPU latency (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON for programs instead of the tables")
    add_examples(p, ("hookscope prune tiny --amount 0.5", "mask half the weights of every conv and linear layer"),
                 ("hookscope prune demo --channels --amount 0.5 --compact --repeats 3 \\\n"
                  "      --out small.pt",
                  "half the channels removed; --weights small.pt loads them back into demo"),
                 ("python -c \"import torch, hookscope.synthetic as s; d = s.shapes(16); \\\n"
                  "      torch.save({'inputs': d.images, 'labels': d.labels}, 'shapes.pt')\"",
                  "16 labelled pictures (or a folder of images, one subfolder per class)"),
                 ("hookscope prune demo --channels --importance taylor --data shapes.pt \\\n"
                  "      --amount 0.3 --repeats 3", "channels ranked on that labelled data; latency over 3 runs"),
                 ("hookscope prune tiny --layers 'layer1.*conv*' --method ln_structured \\\n"
                  "      --amount 0.25 --repeats 3 --json", "structured masks on some layers, for programs"))


def _add_channel_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--channels", action="store_true",
                   help="prune whole channels along the dependency graph instead of single weights")
    p.add_argument("--importance", metavar="KIND", default=None, help=_IMPORTANCE_HELP)
    p.add_argument("--data", metavar="PATH", default=None, help=_DATA_HELP)
    p.add_argument("--batch", metavar="N", type=int, default=32, help="calibration batch size (default 32)")
    p.add_argument("--heads", metavar="FRACTION", type=float, default=None,
                   help="remove this share, in [0, 1), of every attention layer's heads (nn.MultiheadAttention, "
                        "BERT, GPT-2, LLaMA-style with grouped-query attention, timm), those of the lowest output "
                        "norm on the example input; alone or with --channels --amount")
    p.add_argument("--mlp", metavar="FRACTION", type=float, default=None,
                   help="with --heads: also remove this share, in [0, 1), of the hidden units of every MLP beside "
                        "the attention layers, those of the lowest mean |activation| on the example input, scored in "
                        "the same pass as the heads")
    p.add_argument("--width", metavar="FRACTION", type=float, default=None,
                   help="remove this share, in [0, 1), of the hidden width (the residual stream) of a transformer "
                        "(LLaMA, Qwen2, Mistral, GPT-2, BERT, ViT), the channels of the lowest mean |value| on the "
                        "example input; alone or with --heads / --channels")
    p.add_argument("--compact", action="store_true",
                   help="with --channels, --heads or --width: build the smaller model (channels or heads removed, outputs "
                        "checked equal to "
                        "the masked model's); --out then writes its weights, which load back into MODEL "
                        "with --weights FILE (hookscope resizes the layers)")
    p.add_argument("--allow-unseen", action="store_true",
                   help="with --compact: compact even when some layers do not run on the example input "
                        "(auxiliary heads that run only in training); they are left as they are")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="write the pruned weights (a state_dict, masks made permanent) here, atomically; an "
                        "existing file needs --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    add_device_argument(p, "; the model is pruned there (--data measured there too), and compared before and after "
                           "(CPU latency included) on the CPU")


# --- every option's mistake, before the model is built -------------------------------------------
def _norm(text: str) -> float | str:
    """--norm: a number (inf too) or torch.norm's names 'fro' and 'nuc'."""
    if text in ("fro", "nuc"):
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a norm; give a number, inf, fro or nuc") from None


def _pick(value: str, known: tuple[str, ...], option: str) -> str:
    if value not in known:
        raise HookscopeError(f"{option} {value!r} is not known.{did_you_mean(value, known)} Give one of "
                             f"{', '.join(known)}")
    return value


def _check_amount(args: argparse.Namespace) -> None:
    if args.width is not None:
        check_width(args)
    if args.mlp is not None:
        check_mlp(args)
    if args.heads is not None:
        check_heads(args)
    if not args.channels and (args.heads is not None or args.width is not None):
        return
    if (args.amount is None) == (args.count is None):
        raise HookscopeError("give how much to prune: --amount FRACTION (such as 0.5) or --count N, one of them")
    if args.amount is not None and not 0.0 <= args.amount <= 1.0:  # NaN fails too
        raise HookscopeError(f"--amount {args.amount:g} is outside [0, 1]; give a fraction such as 0.5 (or --count N)")
    if args.channels and args.amount is not None and args.amount >= 1.0:
        raise HookscopeError("--amount 1 would remove every channel; with --channels give a fraction below 1 "
                             "(each group keeps at least one channel)")
    if args.count is not None and args.count < 0:
        raise HookscopeError(f"--count {args.count} is negative; give a count of 0 or more")
    if args.channels and args.count is not None:
        raise HookscopeError("--count is for weight masks; with --channels give --amount FRACTION")


def _check_channels(args: argparse.Namespace) -> None:
    for flag, value in (("--method", args.method), ("--norm", args.norm), ("--dim", args.dim)):
        if value is not None:
            raise HookscopeError(f"{flag} is for weight masks, and --channels ranks channels by --importance; "
                                 f"drop {flag} or --channels")
    if args.scope == "layer":
        raise HookscopeError("--scope layer is for weight masks; with --channels give --scope group or global")
    kind = _pick(args.importance or "l2", IMPORTANCE, "--importance")
    if kind in _MEASURED and args.data is None:
        raise HookscopeError(f"--importance {kind} is measured on data; give --data PATH (images or a tensor "
                             "file), or use --importance l2")
    if kind not in _MEASURED and args.data is not None:
        raise HookscopeError(f"--data is read only by --importance activation, apoz or taylor, not {kind}; "
                             "give one of those or drop --data")
    if args.batch < 1:
        raise HookscopeError(f"--batch {args.batch} is not a batch size; give 1 or more")
    if args.allow_unseen and not args.compact:
        raise HookscopeError("--allow-unseen is for --compact; add --compact or drop --allow-unseen")


def _check_weights(args: argparse.Namespace) -> None:
    for flag, value in (("--importance", args.importance), ("--data", args.data)):
        if value is not None:
            raise HookscopeError(f"{flag} ranks channels; add --channels (or drop {flag} for weight masks)")
    if args.compact or args.allow_unseen:
        flag = "--compact" if args.compact else "--allow-unseen"
        raise HookscopeError(f"{flag} is for removing whole channels, which weight masks leave in place; add --channels")
    method = _pick(args.method or METHODS[0], METHODS, "--method")
    if args.scope == "group":
        raise HookscopeError("--scope group is for --channels; for weight masks give --scope layer or global")
    if args.norm is not None and method != "ln_structured":
        raise HookscopeError(f"--norm is the norm of ln_structured, not {method}; drop it or give "
                             "--method ln_structured")
    if args.dim is not None and not method.endswith("_structured"):
        raise HookscopeError(f"--dim is the channel dim of a structured --method, not {method}; drop it")


def _check_out(args: argparse.Namespace) -> None:
    if args.out is None:
        return
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise HookscopeError(f"cannot write --out {args.out}: no folder {folder}; create it first")
    if os.path.exists(args.out) and not args.overwrite:
        raise HookscopeError(f"--out {args.out} exists; pass --overwrite to replace it, or give another path")


def _structured(args: argparse.Namespace) -> bool:
    return bool(args.channels) or args.heads is not None or args.width is not None


def _check(args: argparse.Namespace) -> None:
    if args.image and args.input is not None:
        raise HookscopeError("give either --image PATH or --input SHAPE, not both")
    if args.repeats < 1:
        raise HookscopeError(f"--repeats {args.repeats} is not a count; give 1 or more")
    _check_amount(args)
    (_check_channels if _structured(args) else _check_weights)(args)
    _check_out(args)


# --- calibration data: images, or tensors read without unpickling --------------------------------
@dataclass
class _Data:
    """Calibration samples: ``inputs`` (N x ...) and their class ``labels`` (N) or None."""

    inputs: torch.Tensor
    labels: torch.Tensor | None

    def batches(self, size: int) -> list[Any]:
        cut = range(0, len(self.inputs), size)
        if self.labels is None:
            return [self.inputs[i:i + size] for i in cut]
        return [(self.inputs[i:i + size], self.labels[i:i + size]) for i in cut]


def _tensor_data(path: str, held: Any) -> _Data:
    """What a tensor file held: a tensor, or ``{"inputs": ..., "labels": ...}``."""
    how = "save a tensor N x ..., or {'inputs': N x ..., 'labels': N class indices}"
    if isinstance(held, (np.ndarray, torch.Tensor)):
        held = {"inputs": held}
    if not hasattr(held, "keys") or "inputs" not in held.keys():
        what = f"keys {', '.join(map(str, held.keys()))}" if hasattr(held, "keys") else f"a {type(held).__name__}"
        raise HookscopeError(f"--data {path} holds {what}, not calibration inputs; {how}")
    inputs, labels = (torch.as_tensor(held[k]) if k in held.keys() else None for k in ("inputs", "labels"))
    assert inputs is not None
    if inputs.dim() == 0 or len(inputs) == 0:
        raise HookscopeError(f"--data {path} holds no sample (inputs of shape {tuple(inputs.shape)}); {how}")
    if labels is not None and (labels.dtype.is_floating_point or labels.dim() != 1 or len(labels) != len(inputs)):
        raise HookscopeError(f"--data {path}: labels of shape {tuple(labels.shape)} ({labels.dtype}) are not one "
                             f"class index per input ({len(inputs)} inputs); {how}")
    return _Data(inputs, None if labels is None else labels.long())


def _read_tensors(path: str) -> _Data:
    try:
        if path.lower().endswith((".npy", ".npz")):
            with np.load(path, allow_pickle=False) as held:  # an .npz is a zip of arrays
                return _tensor_data(path, {k: held[k] for k in held.files})
        return _tensor_data(path, torch.load(path, map_location="cpu", weights_only=True))
    except HookscopeError:
        raise
    except ValueError as e:
        if "pickle" in str(e):
            raise HookscopeError(f"--data {path} holds Python objects (a pickle), which hookscope does not load; "
                                 "save plain arrays with np.save") from None
        raise HookscopeError(f"cannot read --data {path}: {first_line(e)}") from e
    except TypeError as e:  # np.load of a single array has no context manager: read it plainly
        if "context manager" not in str(e):
            raise
        return _tensor_data(path, np.load(path, allow_pickle=False))
    except Exception as e:  # a corrupt file, or pickled objects torch refuses without running them
        raise HookscopeError(f"cannot read --data {path} without unpickling ({type(e).__name__}: {first_line(e)}); "
                             "save tensors with torch.save({'inputs': x, 'labels': y}, path)") from e


def _class_folders(path: str) -> list[str]:
    return sorted(d for d in os.listdir(path) if not d.startswith(".") and os.path.isdir(os.path.join(path, d)))


def _image_data(path: str, args: argparse.Namespace) -> _Data:
    """A folder of images, or of class subfolders of images (labels by the model's class names if they
    name every subfolder, else by name order)."""
    folders = _class_folders(path) if os.path.isdir(path) else []
    images = [f for f in (os.listdir(path) if os.path.isdir(path) else []) if not f.startswith(".")
              and f.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(path, f))]
    if folders and images:
        raise HookscopeError(f"--data {path} holds both images and subfolders; give a folder of images, or of "
                             "one subfolder per class")
    read = argparse.Namespace(**{**vars(args), "image": None})
    if not folders:
        read.image = [path]
        return _Data(load_images(read).x, None)
    names = class_names(args) or []
    index = {f: names.index(f) if set(folders) <= set(names) else i for i, f in enumerate(folders)}
    paths = [(p, index[f]) for f in folders for p in image_files([os.path.join(path, f)])]
    read.image = [p for p, _ in paths]
    return _Data(load_images(read).x, torch.tensor([k for _, k in paths], dtype=torch.long))


def _data(args: argparse.Namespace, model: nn.Module) -> _Data | None:
    if args.data is None:
        return None
    if not os.path.exists(args.data):
        raise HookscopeError(f"no such --data file or folder: {args.data}")
    tensors = os.path.isfile(args.data) and args.data.lower().endswith(_TENSOR_FILES)
    data = _read_tensors(args.data) if tensors else _image_data(args.data, args)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if data.inputs.is_floating_point():
        data.inputs = data.inputs.to(dtype)
    device = check_device(args.device)
    if device is not None:  # where the model is: the calibration passes run there
        data.inputs = data.inputs.to(device)
        data.labels = None if data.labels is None else data.labels.to(device)
    if args.importance == "taylor" and data.labels is None:
        raise HookscopeError(f"--importance taylor needs labels and --data {args.data} has none; give a folder "
                             "with one subfolder per class, or a .pt file of {'inputs': ..., 'labels': ...}")
    _check_fits(model, data.inputs[:1], args.data)
    return data


def _check_fits(model: nn.Module, sample: torch.Tensor, path: str) -> None:
    """One sample through the model: a calibration set that does not fit fails here, in one line."""
    try:
        with torch.no_grad():
            model(sample)
    except Exception as e:
        raise HookscopeError(f"--data {path} does not fit {type(model).__name__}: a sample of shape "
                             f"{'x'.join(map(str, sample.shape))} ({str(sample.dtype).removeprefix('torch.')}) fails "
                             f"with {type(e).__name__}: {first_line(e)}; give inputs of the model's input shape") from e


# --- pruning, measuring, writing ----------------------------------------------------------------
def _example(args: argparse.Namespace, model: nn.Module, data: _Data | None) -> ModelInput:
    """The input traced and timed: --image, else --input, else one calibration sample, else the usual one."""
    if args.image:
        return ModelInput(load_images(args).x).to(check_device(args.device))
    if args.input is None and data is not None:
        return ModelInput(data.inputs[:1])
    return model_input(args, model)


def _copyable(model: nn.Module) -> nn.Module:
    """``model`` with each weight torch.nn.utils.prune computed (``orig * mask``, a non-leaf tensor that
    ``copy.deepcopy`` refuses) recomputed without grad: the value its pre-hook sets before every call."""
    with torch.no_grad():
        for m in model.modules():
            for local in [n[:-5] for n in m._parameters if n.endswith("_orig") and f"{n[:-5]}_mask" in m._buffers]:
                held = m.__dict__.get(local)
                if isinstance(held, torch.Tensor) and held.grad_fn is not None:
                    orig, mask = m._parameters[local + "_orig"], m._buffers[local + "_mask"]
                    assert orig is not None and mask is not None
                    setattr(m, local, orig * mask.to(orig.dtype))
    return model


def _cli_words(e: HookscopeError, args: argparse.Namespace) -> HookscopeError:
    """The API's ``amount=`` said as the option the user gave."""
    flag = "--count " if args.count is not None else "--amount "
    return HookscopeError(str(e).replace("amount=", flag))


def _prune_weights(args: argparse.Namespace, model: nn.Module) -> Any:
    from ...analysis.prune import prune, remove

    method = args.method or METHODS[0]
    extra: dict[str, Any] = {"n": args.norm if args.norm is not None else 1, "dim": args.dim or 0}
    try:
        result = prune(model, *(args.layers or ()), amount=args.count if args.count is not None else args.amount,
                       method=method, name=args.param, scope=args.scope or "layer",
                       generator=torch.Generator().manual_seed(args.seed), **extra)
    except HookscopeError as e:
        raise _cli_words(e, args) from e
    remove(model)  # permanent: the file is a plain state_dict of the architecture
    return result


def _prune_channels(args: argparse.Namespace, model: nn.Module, given: ModelInput,
                    data: _Data | None) -> tuple[Any, nn.Module]:
    from ...analysis.prune import compact, prune_channels, prune_heads, prune_width, remove

    kind = args.importance or "l2"
    results: list[Any] = []
    if args.channels:
        results.append(prune_channels(model, given.x, amount=args.amount, importance=kind, kwargs=given.kwargs,
                                      data=None if data is None else data.batches(args.batch),
                                      layers=args.layers, scope=args.scope or "group"))
    if args.heads is not None:
        try:
            results.append(prune_heads(model, given.x, amount=args.heads, kwargs=given.kwargs,
                                       layers=None if args.channels else args.layers, mlp=args.mlp))
        except HookscopeError as e:
            raise HookscopeError(str(e).replace("amount=", "--heads ").replace("mlp=:", "--mlp:")) from e
    if args.width is not None:
        try:
            results.append(prune_width(model, given.x, amount=args.width, kwargs=given.kwargs))
        except HookscopeError as e:
            raise HookscopeError(str(e).replace("amount=", "--width ")) from e
    result = results[0] if len(results) == 1 else _Both(results)
    if args.compact:
        return result, compact(model, given.x, kwargs=given.kwargs, allow_unseen=args.allow_unseen)
    remove(model)
    return result, model


class _Both:
    """What --channels, --heads and --width masked, shown one after the other."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def table(self) -> str:
        return "\n\n".join(r.table().rstrip("\n") for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        names = {"ChannelPruning": "channels", "HeadPruning": "heads", "WidthPruning": "width"}
        return {names.get(type(r).__name__, type(r).__name__): r.to_dict() for r in self.results}


def _save(model: nn.Module, path: str, *, compacted: bool) -> int:
    """Write the state_dict atomically (temp file, then rename): a failure leaves no half file. A
    compacted model's says so in its metadata, for --weights to resize the architecture to it."""
    from ...analysis.prune import marked_compacted

    state = model.state_dict()
    held = marked_compacted(state) if compacted else {k: v.detach().clone().contiguous() for k, v in state.items()}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(held, f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return os.path.getsize(path)


def _written(args: argparse.Namespace, after: nn.Module, before: int) -> str:
    params = sum(p.numel() for p in after.parameters())
    if args.compact and params == before:
        return (f"wrote the weights to {args.out} ({params:,} parameters): no channel was removed, so they are a "
                f"state_dict of {args.model} as built, for --weights {args.out}")
    if args.compact:
        return (f"wrote the compacted weights to {args.out} ({params:,} parameters): they do not fit {args.model} "
                f"as built, load them with --weights {args.out} (hookscope resizes its layers), e.g. "
                f"hookscope summary {args.model} --weights {args.out}")
    return f"wrote the pruned weights to {args.out} ({params:,} parameters, masks made permanent): a state_dict " \
           f"of {args.model}, for --weights {args.out}"


def run(args: argparse.Namespace) -> int:
    from ...analysis.prune import compare_models

    if is_llm(args):
        return run_llm(args)
    _check(args)
    model = model_from(args)
    data = _data(args, model) if args.channels else None
    given = _example(args, model, data)
    before = copy.deepcopy(_copyable(model))
    if _structured(args):
        result, after = _prune_channels(args, model, given, data)
    else:
        result, after = _prune_weights(args, model), model
    # compare_models measures CPU latency: both models and the example compared on the CPU, wherever pruned
    before, after, given = before.cpu(), after.cpu(), given.to("cpu")
    comparison = compare_models(before, after, given.x, kwargs=given.kwargs, repeats=args.repeats,
                                warmup=min(2, args.repeats))
    if args.out is not None:
        _save(after, args.out, compacted=args.compact)
    if args.json:
        print(_to_json(args, result, comparison))
        return 0
    print(result.table().rstrip("\n") + "\n\n" + comparison.table(), end="")
    if args.out is not None:
        print(_written(args, after, sum(p.numel() for p in before.parameters())))
    return 0


def _to_json(args: argparse.Namespace, result: Any, comparison: Any) -> str:
    import json

    mode = "channels" if args.channels else "heads" if args.heads is not None else \
        "width" if args.width is not None else "weights"
    doc = {"model": args.model, "mode": mode, "compact": bool(args.compact),
           "pruned": result.to_dict(), "comparison": comparison.to_dict(), "out": args.out}
    return json.dumps(doc, indent=2, default=str)

