"""Feature maps: the channels one layer produced, as ``B x C x h x w``, with statistics per channel.

:func:`feature_maps` runs the model once under :func:`hookscope.capture` (the true output, also
when an in-place op rewrites it after the layer ran) and returns a :class:`FeatureMaps`. The in-place trap's
comparison, :func:`compare_references`, runs a hand-written hook that keeps ``output.detach()``
by reference alongside the capture, and says which channels the two disagree on.
:mod:`hookscope.viz.features` draws both.

One file past 500 lines: the two results and the one hooked pass they both come from, with the layout
rules that pass applies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import nn

from .._tree import tensors, tree_map
from ..capture import capture
from ..core.hooks import HookGroup
from ..core.inputs import model_kwargs, private
from ..core.result import Result, jsonable
from ..core.state import restored
from ..core.text import first_line, num, shape_text, table
from ..errors import HookscopeError, checked
from ..selection import Layers, Selector, check_hookable, unwrap
from ..selection import layers as select
from ._layout import LayoutProbe, grid_of_tokens, prefix_tokens
from ._targets import call_model

__all__ = ["BY", "ComparisonRow", "FeatureMaps", "FeatureRow", "ReferenceComparison", "compare_references",
           "feature_maps"]

BY = ("mean", "max", "sum")  # what top() ranks channels by
Reshape = Callable[[Any], torch.Tensor]
_TOKENS = "reshape=hookscope.tokens_to_grid(1) for B x tokens x C with a class token (CLI: --tokens 1)"
_LAST = "reshape=hookscope.channels_last for B x h x w x C (CLI: --layout last)"
_LAYOUTS = {"first": "BCHW", "last": "BHWC"}  # how a 4-D output was read, by where its channels are
Layout = str | tuple[int, int, int]  # "first" / "last" for 4-D outputs; (k, h, w) for k prefix tokens + h x w


def _layout_name(layout: Layout) -> str:
    return _LAYOUTS[layout] if isinstance(layout, str) else "tokens(k={}, {}x{})".format(*layout)


def _summary(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


@dataclass(frozen=True)
class FeatureRow:
    """One channel of a :class:`FeatureMaps` (a row of ``res.rows``), over every image or one.

    Attributes:
        channel: the channel's index in the layer's output (after ``reshape=``).
        mean, min, max: of the channel's values.
        std: standard deviation (population: divided by the number of values).
        zeros: the fraction of values exactly 0 (dead after a ReLU, or pruned).
        image: the image these figures are of; ``None``: every image of the batch together.
    """

    channel: int
    mean: float
    min: float
    max: float
    std: float
    zeros: float
    image: int | None = None


def _rows(flat: torch.Tensor, image: int | None) -> list[FeatureRow]:
    """One row per channel of ``flat`` (``C x values``), reduced in one pass per statistic."""
    stats = torch.stack([flat.mean(1), flat.amin(1), flat.amax(1), flat.std(1, correction=0),
                         (flat == 0).float().mean(1)], 1).tolist()
    return [FeatureRow(c, s[0], s[1], s[2], s[3], s[4], image) for c, s in enumerate(stats)]


def _check_k(k: int, by: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise HookscopeError(f"top(k={k!r}) must be a whole number of channels, at least 1")
    if by not in BY:
        raise HookscopeError(f"by={by!r} is not a ranking; use one of {', '.join(BY)}")


@dataclass
class FeatureMaps(Result):
    """What :func:`feature_maps` returns: one layer's channels and their statistics.

    Speaks hookscope's result protocol: ``rows`` (one :class:`FeatureRow` per channel, over every
    image), ``table()`` (also ``str(res)``), ``to_dict()`` (the maps as a tensor), ``to_json()``
    (the maps as their shape and dtype unless ``maps=True``).

    Attributes:
        maps: ``B x C x h x w`` float32 on the CPU, detached: what the layer produced (after
            ``reshape=``), not what a later in-place op left of it.
        layer: the layer's qualified name (of the unwrapped model).
        layout: ``"BCHW"`` (the output as it came), ``"BHWC"`` (channels last, permuted: told by the
            modules that make and read it), ``"tokens(k=1, 14x14)"`` (``B x (k + h*w) x C`` tokens, the
            ``k`` prefix tokens dropped) or ``"reshape="`` (your function made it so).
        output_shape: the shape of the layer's output before ``reshape=``.
    """

    maps: torch.Tensor
    layer: str
    layout: str = "BCHW"
    output_shape: tuple[int, ...] = ()

    @property
    def rows(self) -> list[FeatureRow]:
        """One row per channel, its figures over every image of the batch together."""
        return _rows(self.maps.transpose(0, 1).flatten(1), None)

    def image_rows(self, image: int) -> list[FeatureRow]:
        """One row per channel, its figures over image ``image`` only.

        Example:
            >>> res = FeatureMaps(torch.arange(8.).view(2, 1, 2, 2), "conv")
            >>> res.image_rows(1)[0].mean, res.rows[0].mean
            (5.5, 3.5)
        """
        return _rows(self.maps[self._image(image)].flatten(1), image)

    def _image(self, image: int) -> int:
        b = self.maps.shape[0]
        if isinstance(image, bool) or not isinstance(image, int) or not -b <= image < b:
            raise HookscopeError(f"image={image!r} is out of range: the batch holds {b} image(s), 0 to {b - 1}")
        return image % b

    def top(self, k: int, *, by: str = "mean", image: int | None = None) -> list[int]:
        """The ``k`` channels with the largest ``by`` (``"mean"``, ``"max"`` or ``"sum"`` of their values),
        largest first (ties: the lower index first), over every image or over ``image`` only.

        ``k`` larger than the number of channels gives every channel. NaN ranks last.

        Example:
            >>> res = FeatureMaps(torch.tensor([1., 5., 3.]).view(1, 3, 1, 1), "conv")
            >>> res.top(2), res.top(9, by="max")
            ([1, 2], [1, 2, 0])
        """
        _check_k(k, by)
        data = self.maps if image is None else self.maps[self._image(image)][None]
        flat = data.transpose(0, 1).flatten(1)
        score = flat.amax(1) if by == "max" else flat.sum(1) if by == "sum" else flat.mean(1)
        score = torch.nan_to_num(score, nan=-float("inf"))
        order: list[int] = torch.sort(score, descending=True, stable=True).indices[:k].tolist()
        return order

    def table(self) -> str:
        """Which layer, its shape, then one line per channel (also ``str(res)``).

        Example:
            >>> print(FeatureMaps(torch.tensor([[[[0., 2.]]]]), "conv"))
            conv: 1 image, 1 channel of 1x2 (B x C x h x w as it came)
            channel  mean  min  max  std  zeros
            -----------------------------------
                  0     1    0    2    1    50%
        """
        b, c, h, w = self.maps.shape
        how = {"BCHW": "B x C x h x w as it came", "BHWC": "B x h x w x C, permuted"}.get(
            self.layout, f"from {shape_text(self.output_shape)} through reshape=")
        head = (f"{self.layer}: {b} image{'s' if b != 1 else ''}, {c} channel{'s' if c != 1 else ''} "
                f"of {h}x{w} ({how})")
        body = [[str(r.channel), num(r.mean), num(r.min), num(r.max), num(r.std), f"{r.zeros:.0%}"]
                for r in self.rows]
        return "\n".join([head, *table(["channel", "mean", "min", "max", "std", "zeros"], body)])

    def to_dict(self) -> dict[str, Any]:
        """Plain Python data: the rows (and, for a batch, the rows of each image) as dicts, ``maps`` a tensor.

        Example:
            >>> d = FeatureMaps(torch.zeros(2, 3, 4, 4), "conv").to_dict()
            >>> d["shape"], len(d["rows"]), len(d["per_image"]), d["maps"].shape
            ([2, 3, 4, 4], 3, 2, torch.Size([2, 3, 4, 4]))
        """
        b = self.maps.shape[0]
        images = [[dataclasses.asdict(r) for r in self.image_rows(i)] for i in range(b)] if b > 1 else []
        return {"layer": self.layer, "layout": self.layout, "output_shape": list(self.output_shape),
                "shape": list(self.maps.shape), "rows": [dataclasses.asdict(r) for r in self.rows],
                "per_image": images, "maps": self.maps}

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON; the maps written as ``{"shape", "dtype"}`` unless ``maps=True``.

        Example:
            >>> json.loads(FeatureMaps(torch.zeros(1, 2, 3, 3), "conv").to_json())["maps"]
            {'shape': [1, 2, 3, 3], 'dtype': 'float32'}
        """
        data = self.to_dict()
        if not maps:
            data["maps"] = _summary(self.maps)
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)


@dataclass(frozen=True)
class ComparisonRow:
    """One channel of a :class:`ReferenceComparison`.

    Attributes:
        channel: the channel's index.
        differs: what a hook keeping references read differs from what the layer produced.
        max_diff: the largest absolute difference between the two.
        changed: the fraction of the channel's values that differ.
    """

    channel: int
    differs: bool
    max_diff: float
    changed: float


@dataclass
class ReferenceComparison(Result):
    """What :func:`compare_references` returns: the in-place trap, channel by channel.

    Attributes:
        stored: ``B x C x h x w``: what a forward hook that keeps ``output.detach()`` by reference
            holds after the forward pass (float32, CPU).
        true: ``B x C x h x w``: what the layer produced, as :func:`hookscope.capture` kept it.
        differs: ``C`` booleans: the channels an op rewrote after the layer ran (in any image).
        layer: the layer's qualified name.
        layout: ``"BCHW"``, ``"BHWC"``, ``"tokens(k=1, 14x14)"`` or ``"reshape="``, as in :class:`FeatureMaps`.
    """

    stored: torch.Tensor
    true: torch.Tensor
    differs: torch.Tensor
    layer: str
    layout: str = "BCHW"

    @property
    def differs_by_image(self) -> torch.Tensor:
        """``B x C`` booleans: the channels an op rewrote, image by image (``differs`` is their ``any``).

        Example:
            >>> true = torch.tensor([[-1., 2.], [3., 4.]]).view(2, 2, 1, 1)
            >>> ReferenceComparison(true.relu(), true, torch.tensor([True, False]), "conv").differs_by_image
            tensor([[ True, False],
                    [False, False]])
        """
        return _unequal(self.stored, self.true).flatten(2).any(2)

    @property
    def changed(self) -> list[int]:
        """The indices of the channels that differ."""
        found: list[int] = self.differs.nonzero().flatten().tolist()
        return found

    @property
    def rows(self) -> list[ComparisonRow]:
        """One row per channel: whether it differs, by how much, and how much of it."""
        delta = _unequal(self.stored, self.true)
        gap = torch.nan_to_num((self.stored - self.true).abs(), nan=float("inf")).where(delta, 0)
        most = gap.transpose(0, 1).flatten(1).amax(1).tolist()
        share = delta.transpose(0, 1).flatten(1).float().mean(1).tolist()
        return [ComparisonRow(c, bool(d), most[c], share[c]) for c, d in enumerate(self.differs.tolist())]

    def table(self) -> str:
        """How many channels a hook keeping references reads wrong, then one line per channel.

        Example:
            >>> true = torch.tensor([-1., 2.]).view(1, 2, 1, 1)
            >>> print(ReferenceComparison(true.relu(), true, torch.tensor([True, False]), "conv"))
            conv: 1 of 2 channels rewritten after the layer ran; a hook keeping output.detach() reads them wrong
            channel  differs  max |diff|  changed
            -------------------------------------
                  0      yes           1     100%
                  1       no           0       0%
        """
        c, n = self.differs.numel(), len(self.changed)
        head = (f"{self.layer}: {n} of {c} channel{'s' if c != 1 else ''} rewritten after the layer ran; a hook "
                "keeping output.detach() reads them wrong" if n else
                f"{self.layer}: no channel rewritten after the layer ran; a hook keeping output.detach() reads "
                "what the layer produced")
        body = [[str(r.channel), "yes" if r.differs else "no", num(r.max_diff), f"{r.changed:.0%}"]
                for r in self.rows]
        return "\n".join([head, *table(["channel", "differs", "max |diff|", "changed"], body)])

    def to_dict(self) -> dict[str, Any]:
        """Plain Python data: rows as dicts, ``stored``, ``true`` and ``differs`` as tensors.

        Example:
            >>> t = torch.zeros(1, 2, 2, 2)
            >>> ReferenceComparison(t, t, torch.zeros(2, dtype=torch.bool), "conv").to_dict()["changed"]
            []
        """
        return {"layer": self.layer, "layout": self.layout, "shape": list(self.true.shape),
                "changed": self.changed, "rows": [dataclasses.asdict(r) for r in self.rows],
                "differs": self.differs, "stored": self.stored, "true": self.true}

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON; ``stored`` and ``true`` as ``{"shape", "dtype"}`` unless ``maps=True``.

        Example:
            >>> t = torch.zeros(1, 2, 2, 2)
            >>> json.loads(ReferenceComparison(t, t, torch.zeros(2, dtype=torch.bool), "c").to_json())["true"]
            {'shape': [1, 2, 2, 2], 'dtype': 'float32'}
        """
        data = self.to_dict()
        if not maps:
            data["stored"], data["true"] = _summary(self.stored), _summary(self.true)
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)


def _unequal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``a != b``, a NaN equal to a NaN (the same value read twice)."""
    return (a != b) & ~(a.isnan() & b.isnan())


# --- collecting ----------------------------------------------------------------------------------
def _one_layer(model: nn.Module, layer: Layers) -> tuple[str, nn.Module]:
    chosen = select(model, layer)  # a list of selectors too, as everywhere: what it selects must be one layer
    if len(chosen) != 1:
        shown = ", ".join(repr(n) for n, _ in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        raise HookscopeError(f"layers={layer!r} matches {len(chosen)} layers ({shown}); feature maps are of one "
                             "layer, so give its exact name (`hookscope layers MODEL` lists them)")
    check_hookable(chosen)
    return chosen[0]


def _only_call(name: str, outputs: list[Any]) -> Any:
    if len(outputs) != 1:
        what = "did not run" if not outputs else f"ran {len(outputs)} times"
        raise HookscopeError(f"layer {name!r} {what} in the forward pass; feature maps need its one output, so "
                             "pick a layer that runs once (a shared ReLU runs once per use: pick its block)")
    return outputs[0]


def _as_maps(name: str, out: Any, reshape: Reshape | None, batch: int, layout: Layout = "first") -> torch.Tensor:
    """The layer's output as ``B x C x h x w`` float32 on the CPU, or one line saying which reshape= helps.

    ``layout``: where a 4-D output keeps its channels (``"last"``: permuted to channels first), or
    ``(k, h, w)``: a 3-D output is ``k`` prefix tokens (dropped) then an ``h x w`` grid.
    """
    found = list(tensors(out))
    t = found[0] if len(found) == 1 or (found and reshape is None) else None  # several: the first, as cam() reads
    if reshape is not None:
        try:
            t = reshape(t if t is not None else out)
        except Exception as e:
            raise HookscopeError(f"reshape= failed on layer {name!r}'s output of shape "
                                 f"{shape_text(tuple(found[0].shape)) if found else '-'}: "
                                 f"{type(e).__name__}: {first_line(e)}") from None
    elif t is None:
        raise HookscopeError(f"layer {name!r} returns no tensor; pick the submodule that makes the one you want, "
                             "or pass reshape= a function of the whole output that returns it")
    elif t.ndim == 4 and layout == "last":
        t = t.permute(0, 3, 1, 2)
    elif t.ndim == 3 and isinstance(layout, tuple):
        t = grid_of_tokens(t, *layout)
    if not isinstance(t, torch.Tensor) or t.ndim != 4 or t.shape[0] != batch or t.shape[2] * t.shape[3] == 0:
        _no_layout(name, t, reshape is not None, batch)
    return t.detach().to("cpu", torch.float32).contiguous()


def _no_layout(name: str, t: Any, reshaped: bool, batch: int) -> NoReturn:
    shape = shape_text(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
    if reshaped:
        raise HookscopeError(f"reshape= turned layer {name!r}'s output into {shape}, not B x C x h x w with "
                             f"B={batch} and h x w > 0; make it return that")
    if isinstance(t, torch.Tensor) and t.ndim == 3:
        why = (f"3 dimensions: B x tokens x C (a transformer) or B x C x L; pass {_TOKENS}, or "
               "reshape=hookscope.tokens_to_grid(0) for tokens without one")
    elif isinstance(t, torch.Tensor) and t.ndim == 2:
        why = ("no spatial layout (B x C, as from a Linear or a pooled layer: no h x w to draw); pick an earlier "
               "layer with a B x C x h x w output (`hookscope layers MODEL` shows each layer's output), or pass "
               "reshape= a function that makes B x C x h x w of a flattened map")
    else:
        why = f"not B x C x h x w; pass reshape= a function that returns B x C x h x w ({_TOKENS}; {_LAST})"
    raise HookscopeError(f"layer {name!r} gives {shape}: {why}")


def _check_inputs(x: Any) -> int:
    if not isinstance(x, torch.Tensor) or x.ndim < 1 or x.shape[0] < 1:
        shape = shape_text(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
        raise HookscopeError(f"inputs of shape {shape} are not a batch; pass B x C x H x W images (B >= 1)")
    return int(x.shape[0])


def _naive_keeper(store: list[Any]) -> Callable[[nn.Module, Any, Any], None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        # what tutorials write: a reference, which an in-place op after the layer rewrites
        store.append(tree_map(lambda t: t.detach(), output))

    return hook


@dataclass
class _Ran:
    """What one forward pass left: the layer, its output, what a reference-keeping hook holds, its layout."""

    name: str
    out: Any
    kept: Any
    layout: Layout


def _hander(probe: LayoutProbe, name: str) -> Callable[[nn.Module, Any, Any], None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        t = next(tensors(output), None)
        if t is not None:
            probe.hand(name, t)  # what the model goes on with: its readers tell the layout

    return hook


def _layout_of(ran_out: Any, name: str, probe: LayoutProbe, x: torch.Tensor, reshape: Reshape | None,
               prefix: int | None) -> Layout:
    found = list(tensors(ran_out))[:1]  # a layer returning several tensors (HF Swin's stages): the first, as cam()
    if reshape is not None or not found or found[0].ndim not in (3, 4):
        return "first"
    shape = found[0].shape
    if found[0].ndim == 3:  # tokens: the input's size is one of the clues (none for an input of another rank)
        return probe.tokens(name, found[0], (int(x.shape[-2]), int(x.shape[-1])) if x.ndim == 4 else (0, 0), prefix)
    size = (int(x.shape[-2]), int(x.shape[-1])) if x.ndim == 4 else (int(shape[2]), int(shape[3]))
    return probe.layout(name, found[0], size)


def _run(model: nn.Module, x: torch.Tensor, layer: Layers, kwargs: Mapping[str, Any] | None, naive: bool,
         reshape: Reshape | None) -> _Ran:
    """One forward pass in eval mode, with the layer's output kept and its layout probed."""
    kw = model_kwargs(kwargs)
    name, module = _one_layer(model, layer)
    stored: list[Any] = []
    probe, group = LayoutProbe([name]), HookGroup()
    try:
        if naive:  # registered first, so it sees the layer's own output, as a hand-written hook does
            # own hook: the hand-written, reference-keeping hook whose trap compare_references shows
            group.add(module.register_forward_hook(_naive_keeper(stored)))
        with restored(model, train=False), torch.no_grad(), capture(model, module, copy="always") as rec:
            # own hook, after capture's: it sees the tensor the model goes on with (the layout probe reads it)
            group.add(module.register_forward_hook(_hander(probe, name)))
            probe.attach(unwrap(model)[0], [(name, module)], group)
            call_model(model, *private(((x,), kw)))  # the model may write into its inputs: ours
    finally:
        group.remove()
        probe.release()
    true = _only_call(name, [c.output for c in rec[name].calls if c.returned])
    kept = _only_call(name, stored) if naive else None
    return _Ran(name, true, kept, _layout_of(true, name, probe, x, reshape, prefix_tokens(unwrap(model)[0])))


@checked
def feature_maps(model: nn.Module, inputs: torch.Tensor, *, layers: Layers, reshape: Reshape | None = None,
                 kwargs: Mapping[str, Any] | None = None) -> FeatureMaps:
    """The channels one layer produces for a batch of images, as ``B x C x h x w``, with statistics.

    The model runs once, in eval mode under ``torch.no_grad()`` (every train/eval flag, buffer and
    the random generator put back afterwards), with :func:`hookscope.capture` on the layer, so the
    maps are what the layer produced even where an in-place op (``ReLU(inplace=True)``) rewrote
    its output afterwards. No hook is left on the model.

    A 4-D output's layout is told, as in :func:`hookscope.cam`, by the modules that make and read it
    (Conv2d, BatchNorm, pooling: channels first; Linear, LayerNorm, ``Permute``: channels last) or,
    failing them, by the grid with the input's aspect ratio: ``B x h x w x C`` (Swin stages) is
    permuted (``layout == "BHWC"``), and a layout nothing decides is refused in one line. A 3-D
    output ``B x N x C`` (ViT, DeiT, Swin tokens) is read, as in :func:`hookscope.cam`, as ``k``
    prefix tokens then an ``h x w`` grid where that is certain (``layout == "tokens(k=1, 14x14)"``),
    and refused in one line naming :func:`hookscope.tokens_to_grid` where it is not. Other
    layouts go through ``reshape=``: :func:`hookscope.channels_last` / ``channels_first`` to say
    it yourself, :func:`hookscope.tokens_to_grid` for ``B x tokens x C`` (ViT).
    A layer with no spatial layout (a ``Linear``'s ``B x C``) is refused in one line.

    Args:
        model: any ``nn.Module`` (wrappers such as DataParallel are seen through).
        inputs: the batch, ``B x C x H x W`` for an image model (whatever the model takes as its one
            positional input).
        layers: one layer: its name, a glob or type matching exactly one module, or the module.
        reshape: turns the layer's output into ``B x C x h x w``; it receives the tensor (or, for a
            layer returning several tensors, the whole output). Without it, a layer returning several
            tensors (an HF Swin stage's tuple) is read by its first, as :func:`hookscope.cam` does.
        kwargs: the model's keyword inputs, e.g. ``{"attention_mask": m}``.

    Returns:
        A :class:`FeatureMaps`.

    Raises:
        HookscopeError: a layer that matches no or several modules, runs more or less than once, or
            has no spatial layout; a failing ``reshape=``.
        ForwardError: the model's forward pass failed.

    Example:
        >>> import torch, hookscope.zoo
        >>> res = feature_maps(hookscope.zoo.TinyResNet().eval(), torch.randn(2, 3, 32, 32), layers="layer1")
        >>> res.maps.shape, res.layer, len(res.rows)
        (torch.Size([2, 16, 32, 32]), 'layer1', 16)
    """
    batch = _check_inputs(inputs)
    ran = _run(model, inputs, layers, kwargs, False, reshape)
    maps = _as_maps(ran.name, ran.out, reshape, batch, ran.layout)
    first = next(tensors(ran.out), None)
    shape = tuple(first.shape) if first is not None else tuple(maps.shape)
    return FeatureMaps(maps, ran.name, _layout_name(ran.layout) if reshape is None else "reshape=", shape)


@checked
def compare_references(model: nn.Module, inputs: torch.Tensor, *, layers: Layers, reshape: Reshape | None = None,
                       kwargs: Mapping[str, Any] | None = None) -> ReferenceComparison:
    """The in-place trap: what a hook that keeps ``output.detach()`` reads, against what the layer produced.

    One forward pass (as in :func:`feature_maps`) with two hooks on the layer: a hand-written one
    that stores ``output.detach()``, a reference to the output's memory, as tutorials do, and
    :func:`hookscope.capture`, which keeps the true values. An in-place op after the layer
    (AlexNet's ``ReLU(inplace=True)`` after its first convolution, ``out[:, :3].relu_()``) rewrites
    what the reference points to; ``differs`` says which channels it touched.

    Args:
        model, inputs, layers, reshape, kwargs: as in :func:`feature_maps`.

    Returns:
        A :class:`ReferenceComparison`.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True))
        >>> res = compare_references(net, torch.randn(1, 3, 8, 8), layers="0")
        >>> bool((res.true < 0).any()), bool((res.stored < 0).any()), res.changed
        (True, False, [0, 1, 2, 3])
    """
    batch = _check_inputs(inputs)
    ran = _run(model, inputs, layers, kwargs, True, reshape)
    name = ran.name
    true = _as_maps(name, ran.out, reshape, batch, ran.layout)
    stored = _as_maps(name, ran.kept, reshape, batch, ran.layout).clone()  # our own memory, not the model's
    differs = _unequal(stored, true).transpose(0, 1).flatten(1).any(1)
    return ReferenceComparison(stored, true, differs, name, _layout_name(ran.layout) if reshape is None else "reshape=")
