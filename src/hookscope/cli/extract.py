"""``hookscope extract MODEL --data PATH --layers SPEC --out DIR``: the activations of chosen layers for a
whole dataset of files, streamed into a store on disk (see :func:`hookscope.analysis.extract.extract`)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import time
from typing import Any

import torch

from ..errors import HookscopeError
from ..selection import At
from ._common import add_device_argument, add_examples, add_layers_argument, check_device, model_from
from .inputs import PRESETS, file_data, FileData, kind_of, preset_for
from ._load import add_model_arguments

__all__ = ["DTYPES", "add_parser", "parse_spec", "run"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_FORMS = "NAME, NAME:mean, NAME:max, NAME:mean:DIMS (e.g. h.5:mean:1, DIMS such as 1 or 2,3) or NAME:at[:, -1]"
_POOL = re.compile(r"(mean|max)(:-?\d+(,-?\d+)*)?")
_SHOWN_SKIPS = 5  # skipped samples named in the summary (the manifest lists all)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "extract",
        help="store the activations of chosen layers for a whole dataset of files, in shards on disk",
        description="Runs MODEL over every sample of --data (image files and folders, .pt or .npy files) in "
        "batches and stores what each --layers SPEC keeps (the layer's whole output, or a mean, max or positions "
        "of it, reduced on the device) in DIR: one row per sample, in crash-safe shards with a manifest; read it "
        "with hookscope.open_store(DIR). A killed run continues with --resume. Under torchrun the ranks split "
        "the shards.",
    )
    add_model_arguments(p)
    p.add_argument("--data", nargs="+", metavar="PATH", required=True,
                   help="image files or folders (searched recursively, read with --preset, one image per sample), "
                        ".pt files (torch.load(weights_only=True): a tensor whose rows are samples, or a dict "
                        "of keyword tensors for hf models) or .npy files (np.load(allow_pickle=False), memory-"
                        "mapped); several paths of one kind are concatenated in order")
    add_layers_argument(p, f"what to store: {_FORMS.replace('NAME', 'LAYER')}", required=True)
    p.add_argument("--out", metavar="DIR", required=True,
                   help="the store's folder (new or empty; an existing store needs --resume or --overwrite)")
    p.add_argument("--keep", choices=("output", "input"), default="output",
                   help="store each layer's output (default) or its input")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help="store floating-point values in this dtype (default: as the layer gives them)")
    p.add_argument("--batch-size", metavar="N", type=int, default=32, help="samples per forward pass (default 32)")
    p.add_argument("--shard-size", metavar="SIZE", default="256MB",
                   help="bytes per shard file, such as 256MB or 1GiB (default 256MB); host memory holds two")
    p.add_argument("--workers", metavar="N", type=int, default=0,
                   help="loader processes reading samples (default 0: this process)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the store in DIR a killed run left (the same settings; refused otherwise)")
    again.add_argument("--overwrite", action="store_true", help="replace the store in DIR")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="skip image files that cannot be read (listed at the end and in the manifest) instead "
                        "of stopping at the first")
    p.add_argument("--limit", metavar="N", type=int, default=None, help="only the first N samples of --data")
    add_device_argument(p, "; under torchrun with CUDA, each rank's GPU")
    p.add_argument("--size", metavar="HxW", default=None,
                   help="resize every image to exactly this size (default: the preset's size)")
    p.add_argument("--preset", choices=PRESETS, default="auto",
                   help="how images become the input, as for --image in the other commands (default auto: the "
                        "model's own preset)")
    p.add_argument("--json", action="store_true", help="print the store's summary as JSON only")
    add_examples(p, ("python -c \"import torch, hookscope.synthetic as s; \\\n"
                     "      torch.save(s.shapes(64).images, 'shapes.pt')\"",
                     "64 pictures in one tensor file (or give image folders, .npy files)"),
                 ("hookscope extract demo --data shapes.pt --layers layer2:mean fc --out feats",
                  "the channel means of layer2 and the logits of every picture"),
                 ("hookscope extract torchvision:resnet18 --data shapes.pt --layers avgpool \\\n"
                  "      --dtype float16 --out r18",
                  "an ImageNet model's features in float16 (add --weights DEFAULT for\n"
                  "      its trained weights, downloaded once)"),
                 ("torchrun --nproc_per_node 2 -m hookscope extract demo --data shapes.pt \\\n"
                  "      --layers layer1:mean --out split",
                  "two processes, each writing every other shard of one store"))


def _index_part(node: ast.expr, spec: str) -> Any:
    """One position of ``at[...]``: an int, a slice of ints, ``...`` or None (no other Python is run)."""
    if isinstance(node, ast.Constant) and (node.value is None or node.value is Ellipsis
                                           or (isinstance(node.value, int) and not isinstance(node.value, bool))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    if isinstance(node, ast.Slice):
        bound = [None if n is None else _index_part(n, spec) for n in (node.lower, node.upper, node.step)]
        if all(b is None or isinstance(b, int) for b in bound):
            return slice(*bound)
    raise _bad_spec(spec)


def _positions(text: str, spec: str) -> At:
    """``at[:, -1]`` as ``hookscope.at[:, -1]``, parsed without eval."""
    try:
        tree = ast.parse(f"_{text}", mode="eval").body
    except SyntaxError:
        raise _bad_spec(spec) from None
    if not isinstance(tree, ast.Subscript):
        raise _bad_spec(spec)
    index = tree.slice
    parts = tuple(_index_part(e, spec) for e in index.elts) if isinstance(index, ast.Tuple) \
        else _index_part(index, spec)
    steps = [q.step for q in (parts if isinstance(parts, tuple) else (parts,)) if isinstance(q, slice)]
    if any(step is not None and step < 1 for step in steps):
        raise _bad_spec(spec)
    try:
        return At()[parts]
    except (HookscopeError, ValueError):
        raise _bad_spec(spec) from None


def _bad_spec(spec: str) -> HookscopeError:
    return HookscopeError(f"--layers {spec!r} is not a layer spec; write {_FORMS}")


def parse_spec(spec: str) -> tuple[str, str | At | None]:
    """One ``--layers`` SPEC as (layer name or glob, reduction for extract).

    Example:
        >>> parse_spec("layer2"), parse_spec("h.5:mean:1"), parse_spec("h.*:at[:, -1]")
        (('layer2', None), ('h.5', 'mean:1'), ('h.*', at[:, -1]))
        >>> parse_spec("layer2:median")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --layers 'layer2:median' is not a layer spec; write NAME, NAME:mean, NAME:max, NAME:mean:DIMS (e.g. h.5:mean:1, DIMS such as 1 or 2,3) or NAME:at[:, -1]
    """
    where = spec.find(":at[")
    if where > 0:
        return spec[:where], _positions(spec[where + 1:], spec)
    name, colon, how = spec.partition(":")
    if not name or (colon and not _POOL.fullmatch(how)):
        raise _bad_spec(spec)
    return name, how or None


def _check(args: argparse.Namespace) -> tuple[dict[str, Any], torch.dtype | None]:
    """Every option's mistake before the model is built; returns the layers and the stored dtype."""
    for flag, value in (("--input", args.input), ("--input-ids", args.input_ids), ("--text", args.text)):
        if value is not None:
            raise HookscopeError(f"{flag} is not used by extract: the samples come from --data; drop {flag}")
    for flag, n, least in (("--batch-size", args.batch_size, 1), ("--workers", args.workers, 0)):
        if n < least:
            raise HookscopeError(f"{flag} {n} must be at least {least}")
    layers: dict[str, Any] = {}
    for spec in args.layers:
        name, how = parse_spec(spec)
        if name in layers:
            raise HookscopeError(f"--layers names {name!r} twice; a layer is stored once: give it one SPEC")
        layers[name] = how
    return layers, None if args.dtype is None else DTYPES[args.dtype]


def _device(args: argparse.Namespace) -> str | None:
    """--device (checked), or this rank's GPU under torchrun when CUDA is here."""
    device = check_device(args.device)
    if device is None:
        if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
            return f"cuda:{int(os.environ['LOCAL_RANK'])}"
        return None
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:  # torchrun: a GPU per rank
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return str(args.device)


def _data(args: argparse.Namespace, float_dtype: torch.dtype | None) -> FileData:
    kind = kind_of(args.data)
    if kind != "images" and (args.size is not None or args.preset != "auto"):
        raise HookscopeError(f"--size and --preset apply to images; drop them for .{kind} data")
    preset = preset_for(args.model, args.preset, args.weights, args.size, args.config) if kind == "images" else None
    return file_data(args.data, preset=preset, dtype=float_dtype, limit=args.limit)


def _plain_skip(message: str) -> str:
    """The engine's words for skipping (``on_error='skip'``) as the flag that asks for it."""
    return re.sub(r"pass on_error='skip' \(--skip-unreadable\)[^;]*$", "--skip-unreadable skips such files", message)


def _skips(skipped: list[dict[str, Any]]) -> str:
    shown = "; ".join(f"{s.get('id', s.get('index'))} ({s.get('error')})" for s in skipped[:_SHOWN_SKIPS])
    more = f"; and {len(skipped) - _SHOWN_SKIPS} more" if len(skipped) > _SHOWN_SKIPS else ""
    plural = "s" * (len(skipped) != 1)
    return f"skipped {len(skipped)} unreadable sample{plural}: {shown}{more} (the manifest lists all)"


def _complete(folder: str) -> bool:
    """Whether ``folder`` holds a finished store already (a --resume then has nothing to do)."""
    from ..store import is_store, read_manifest

    try:
        return os.path.isdir(folder) and is_store(folder) and read_manifest(folder).get("complete") is True
    except HookscopeError:
        return False


def _report(store: Any, seconds: float | None, args: argparse.Namespace) -> None:
    count = int(store.manifest["samples"]["count"])
    rate = None if seconds is None else count / max(seconds, 1e-9)
    if args.json:
        doc = {**store.to_dict(), "manifest": str(store.root / "manifest.json"), "samples": count,
               "seconds": None if seconds is None else round(seconds, 3),
               "samples_per_second": None if rate is None else round(rate, 1), "skipped_count": len(store.skipped)}
        print(json.dumps(doc, indent=2, default=str))
        return
    print(store.table())
    if seconds is None:
        print(f"{store.root} was complete already: {count} samples, nothing left to extract")
    else:
        print(f"wrote {store.root}: {count} samples in {seconds:.1f} s ({rate:.1f} samples/s)")
    if store.skipped:
        print(_skips(store.skipped))


def run(args: argparse.Namespace) -> int:
    from ..analysis.extract import extract

    lead = int(os.environ.get("RANK", "0") or 0) == 0  # under torchrun only rank 0 speaks
    try:
        layers, dtype = _check(args)
        device = _device(args)
        model = model_from(argparse.Namespace(**{**vars(args), "device": device}))
        float_dtype = next((q.dtype for q in model.parameters() if q.is_floating_point()), None)
        found = _data(args, float_dtype)
        describe = {"model": {"spec": args.model, "weights": args.weights, "config": args.config}, **found.describe()}
        finished = args.resume and _complete(args.out)
        start = time.perf_counter()
        store = extract(model, found.dataset, layers=dict(layers), out=args.out,
                        keep=args.keep, dtype=dtype, batch_size=args.batch_size, shard_size=args.shard_size,
                        device=device, workers=args.workers, resume=args.resume, overwrite=args.overwrite,
                        on_error="skip" if args.skip_unreadable else "stop", ids=found.ids, describe=describe)
        seconds = None if finished else time.perf_counter() - start
    except HookscopeError as e:
        if not lead:  # every rank holds the same error; rank 0 says it
            return 2
        raise HookscopeError(_plain_skip(str(e))) from None
    if lead:
        _report(store, seconds, args)
    return 0
