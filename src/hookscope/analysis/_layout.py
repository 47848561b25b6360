"""What an activation's dimensions mean, told by the modules around it: channels first or last, or tokens.

Shared by the analyses that read a layer's output as a picture (CAM, feature maps). A
:class:`LayoutProbe` hooks, for one forward pass, the modules whose type fixes a layout (Conv2d,
BatchNorm, pooling put channels in dim 1; Linear, LayerNorm and torchvision's ``Permute`` in the
last dim); :meth:`LayoutProbe.layout` then answers from the last such module to run inside the layer
and from those that read its output, and, failing both, from which reading gives a grid of the
input's aspect ratio. :meth:`LayoutProbe.tokens` reads ``B x N x C`` as ``k`` prefix tokens then an
``h x w`` grid, from the model's prefix count (:func:`prefix_tokens`), the patch embedding's grid seen
in the pass and the input's size. It never guesses: a conflict or no evidence is a one-line error
naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.hooks import HookGroup
from ..errors import HookscopeError

__all__ = ["FIX", "MAX_PREFIX", "REORDER_FIX", "TOKENS_FIX", "LayoutProbe", "fits", "grid_of_tokens", "prefix_tokens"]

# Types whose 4-D tensors hold channels in dim 1 (they convolve, normalise or pool the last two dims).
_FIRST_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d, nn.SyncBatchNorm, nn.InstanceNorm2d, nn.GroupNorm,
    nn.LocalResponseNorm, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Upsample,
    nn.PixelShuffle, nn.PixelUnshuffle)
# Exact types normalising the last dimension (subclasses such as ConvNeXt's LayerNorm2d permute first).
_LAST_NORMS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)
# Modules whose output has their input's layout (applied element by element).
_SAME_LAYOUT: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid,
    nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Identity, nn.Dropout, nn.AlphaDropout)
_PERMUTES = {(0, 2, 3, 1): "last", (0, 3, 1, 2): "first"}  # torchvision.ops.Permute(dims): the layout it makes
FIX = ("pass reshape=hookscope.channels_last if it is B x h x w x C, or reshape=hookscope.channels_first if "
       "it is B x C x h x w (CLI: --layout last|first)")


TOKENS_FIX = ("pass reshape=hookscope.tokens_to_grid(skip=K), K the class/distillation/register tokens before the "
              "h x w patches, e.g. tokens_to_grid(1) for a class token, plus grid=(h, w) when h != w "
              "(CLI: --tokens K --grid HxW)")
REORDER_FIX = ("pass reshape= a function that puts its tokens back in raster order as B x C x h x w (timm Hiera: "
               "model.forward_intermediates gives the stage outputs rerolled; ViTMAE: its ids_restore)")
MAX_PREFIX = 16  # prefix tokens (class, distillation, registers) a token layout may start with
# Parameters that each add tokens before the patches, by the name of their attribute (timm, torchvision, HF).
_TOKEN_PARAMS = ("cls_token", "class_token", "dist_token", "distillation_token", "reg_token", "register_tokens")
# HF configs whose embeddings put a known number of tokens before the patches (Swin: none, at every stage).
# Class-name parts of modules that re-order tokens (timm's Hiera keeps them "unrolled": not row by row); a
# module with a ``random_masking`` method (HF ViTMAE's embeddings) shuffles them, whatever its mask ratio.
_REORDERS = ("Unroll", "Reroll")
_HF_PREFIX = {"vit": 1, "deit": 2, "swin": 0, "swinv2": 0, "donut-swin": 0, "maskformer-swin": 0, "dinov2": 1,
              "beit": 1, "data2vec-vision": 1}


def prefix_tokens(model: nn.Module) -> int | None:
    """How many tokens the model puts before its ``h x w`` patches, when it says so; ``None`` if it does not.

    timm's ``num_prefix_tokens``, a transformers config's ``model_type`` (ViT: 1, DeiT: 2, Swin: 0;
    plus ``num_register_tokens``), else the class / distillation / register token parameters
    (torchvision's ``class_token``, 1 x n x C each).

    Example:
        >>> from torchvision.models import VisionTransformer
        >>> prefix_tokens(VisionTransformer(32, 8, 1, 2, 16, 32)), prefix_tokens(nn.Linear(2, 2))
        (1, None)
    """
    for m in model.modules():
        n = getattr(m, "num_prefix_tokens", None)
        if isinstance(n, int) and not isinstance(n, bool):
            return n
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind in _HF_PREFIX:
        regs = getattr(config, "num_register_tokens", 0)
        return _HF_PREFIX[kind] + (regs if isinstance(regs, int) else 0)
    counts = [p.shape[1] for name, p in model.named_parameters()
              if name.rsplit(".", 1)[-1] in _TOKEN_PARAMS and p.ndim == 3]
    return sum(counts) if counts else None


def grid_of_tokens(t: torch.Tensor, skip: int, h: int, w: int) -> torch.Tensor:
    """``B x (skip + h*w) x C`` -> ``B x C x h x w``: the first ``skip`` tokens dropped, the rest row by row.

    Example:
        >>> grid_of_tokens(torch.arange(10.).view(1, 5, 2), 1, 2, 2)[0, 0]
        tensor([[2., 4.],
                [6., 8.]])
    """
    return t[:, skip:].transpose(1, 2).reshape(t.shape[0], t.shape[2], h, w)


def _strided(size: tuple[int, int]) -> list[tuple[int, int]]:
    """Every ``h x w`` grid that is the input's ``H x W`` through one integer stride."""
    H, W = size
    return [(H // s, W // s) for s in range(1, min(H, W) + 1) if H % s == 0 and W % s == 0]


def _decides(m: nn.Module) -> bool:
    return isinstance(m, (*_FIRST_TYPES, nn.Linear)) or type(m) in _LAST_NORMS or type(m).__name__ == "Permute"


def _layout_of(m: nn.Module, shape: torch.Size, reading: bool) -> str | None:
    """``"first"`` / ``"last"``: where ``m``'s type puts the channels of the 4-D tensor it makes (or reads)."""
    if isinstance(m, nn.Linear):
        return "last" if shape[-1] == (m.in_features if reading else m.out_features) else None
    if type(m) in _LAST_NORMS:
        return "last" if tuple(getattr(m, "normalized_shape", ())) == (shape[-1],) else None
    dims = getattr(m, "dims", None)
    if type(m).__name__ == "Permute" and isinstance(dims, (list, tuple)) and tuple(dims) in _PERMUTES:
        made = _PERMUTES[tuple(dims)]
        return made if not reading else "first" if made == "last" else "last"
    if isinstance(m, _FIRST_TYPES):
        attrs = ("in_channels" if reading else "out_channels", "num_features", "num_channels")
        n = next((v for v in (getattr(m, a, None) for a in attrs) if isinstance(v, int)), None)
        return "first" if n is None or n == shape[1] else None  # pooling: no channel count
    return None


def fits(h: int, w: int, size: tuple[int, int]) -> bool:
    """Is an ``h x w`` grid the input's ``H x W`` seen through one stride (within rounding)?

    Example:
        >>> fits(7, 7, (224, 224)), fits(7, 768, (224, 224))
        (True, False)
    """
    return abs(h * size[1] - w * size[0]) <= max(size)


class LayoutProbe:
    """Hooks that record, during one forward pass, what tells each kept layer's 4-D layout.

    Call :meth:`hand` from the layer's own forward hook with the tensor the model goes on with (so
    the modules that read it are recognised), :meth:`attach` after registering that hook, and
    :meth:`layout` once the pass is over.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> probe, group = LayoutProbe(["1"]), HookGroup()
        >>> probe.attach(net, [("1", net[1])], group)
        >>> _ = net(torch.zeros(1, 3, 8, 8)); group.remove()
        >>> probe.layout("1", torch.zeros(1, 4, 6, 6), (8, 8))
        'first'
    """

    def __init__(self, names: list[str]) -> None:
        self.handed: dict[str, torch.Tensor] = {}
        self.strides: dict[str, tuple[int, ...]] = {}  # of what each layer really produced (a copy may differ)
        self.running: set[str] = set()
        self.made: tuple[nn.Module, torch.Tensor] | None = None  # the last 4-D output of a module of known layout
        self.inner: dict[str, tuple[nn.Module, torch.Size, tuple[int, ...]]] = {}  # module, shape, strides
        self.readers: dict[str, list[nn.Module]] = {n: [] for n in names}
        self.inner3: dict[str, tuple[nn.Module, torch.Size, tuple[int, ...]]] = {}  # the same, of 3-D outputs
        self.grids: set[tuple[int, int, int]] = set()  # (channels, h, w) of every Conv2d output in the pass
        self.reorder: str | None = None  # a module that re-orders tokens (Hiera's Unroll): no raster reading holds
        self.learned: dict[int, int] = {}  # channels -> tokens in 1 x n x C parameters (n <= MAX_PREFIX, no "pos")

    def hand(self, name: str, tensor: torch.Tensor) -> None:
        """Layer ``name`` handed ``tensor`` on to the rest of the model."""
        self.handed[name] = tensor
        self.strides[name] = tensor.stride()

    def release(self) -> None:
        """Keep no tensor alive once the pass is over (the readers and makers are known then)."""
        self.made, self.handed = None, {}

    def _maker(self) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.ndim == 3:  # a token layer's evidence only
                for name in self.running:
                    self.inner3[name] = (module, output.shape, output.stride())
            if isinstance(output, torch.Tensor) and output.ndim == 4:
                if isinstance(module, nn.Conv2d):  # a patch embedding's grid, if tokens are made of it
                    self.grids.add((int(output.shape[1]), int(output.shape[2]), int(output.shape[3])))
                self.made = (module, output)
                for name in self.running:  # the last one to run inside a kept layer
                    self.inner[name] = (module, output.shape, output.stride())

        return hook

    def _starter(self, name: str, same_layout: bool) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self.running.add(name)
            t = args[0] if args else None
            if same_layout and self.made is not None and t is self.made[1]:  # a ReLU right after a Conv2d
                self.inner[name] = (self.made[0], self.made[1].shape, self.made[1].stride())

        return hook

    def _reader(self) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            t = args[0] if args else None
            for name, copy in self.handed.items():
                if t is copy:
                    self.readers[name].append(module)

        return hook

    def attach(self, model: nn.Module, keep: list[tuple[str, nn.Module]], group: HookGroup, *,
               wrap: Callable[[Any], Any] | None = None) -> None:
        """Hook ``model``'s modules of known layout and the kept layers; the handles go into ``group``.

        ``wrap`` is applied to every hook (``hookscope.core.compiled.eager`` for a compiled model)."""
        w = wrap if wrap is not None else (lambda f: f)
        for name, module in keep:
            # own hook: follows shapes, strides and who reads which tensor (by identity) as the pass runs; keeps none
            group.add(module.register_forward_pre_hook(w(self._starter(name, isinstance(module, _SAME_LAYOUT)))))
        for m in {id(m): m for m in model.modules() if _decides(m)}.values():
            # own hook: as above, on every module whose layout is known
            group.add(m.register_forward_pre_hook(w(self._reader())))
            group.add(m.register_forward_hook(w(self._maker())))
        for name, module in keep:  # after every other hook on the layer
            # own hook: registered after every other hook on the layer, to mark it finished
            group.add(module.register_forward_hook(w(lambda m, a, o, n=name: self.running.discard(n))))
        self.reorder = next((f"{n!r} ({type(m).__name__})" for n, m in model.named_modules() if any(
            r in type(m).__name__ for r in _REORDERS) or callable(getattr(m, "random_masking", None))), None)
        for pname, p in model.named_parameters():  # learned tokens: evidence for k when the model says nothing
            if p.ndim == 3 and p.shape[0] == 1 and p.shape[1] <= MAX_PREFIX and "pos" not in pname.lower():
                self.learned[int(p.shape[2])] = self.learned.get(int(p.shape[2]), 0) + int(p.shape[1])

    def _in_order(self, name: str, shape: torch.Size) -> None:
        """One line if the model re-orders its tokens, so that no row-by-row reading of the layer is certain."""
        if self.reorder is not None:
            raise HookscopeError(f"layer {name!r} gives {tuple(shape)}, but the model holds {self.reorder}, which "
                                 "re-orders or shuffles tokens (not row by row), so no grid reading is certain; "
                                 f"{REORDER_FIX}")

    def _said(self, name: str, shape: torch.Size, strides: tuple[int, ...]) -> dict[str, str]:
        """Where the modules that make and read the layer's output put its channels, and which module says so."""
        said: dict[str, str] = {}
        inner = (self.inner3 if len(shape) == 3 else self.inner).get(name)
        if inner is not None and inner[1:] == (shape, self.strides.get(name, strides)):
            made = _layout_of(inner[0], shape, reading=False)
            if made is not None:
                said[made] = f"the {type(inner[0]).__name__} that makes it"
        for m in self.readers.get(name, []):
            read = _layout_of(m, shape, reading=True)
            if read is not None:
                said.setdefault(read, f"the {type(m).__name__} that reads it")
        return said

    def tokens(self, name: str, t: torch.Tensor, size: tuple[int, int], prefix: int | None) -> tuple[int, int, int]:
        """``(k, h, w)``: layer ``name``'s ``B x N x C`` output ``t`` is ``k`` prefix tokens then an ``h x w``
        grid, row by row; one line naming ``tokens_to_grid`` if that is not certain.

        Readings are ``N = k + h*w`` with ``k <= MAX_PREFIX`` and the grid that of a Conv2d seen in the
        pass with ``C`` channels (a patch embedding flattened into the tokens) or, when no such Conv2d
        ran, the input's ``size`` through one integer stride. ``prefix`` (the model's own count) keeps
        the readings with that ``k``; without it, a Conv2d's grid decides, and else the one strided
        reading with ``k = 0`` or ``k`` the tokens of the model's ``1 x n x C`` parameters, if a
        ``Linear`` or ``LayerNorm`` over ``C`` makes or reads ``t`` (so ``B x C x L`` is not read as
        tokens). A Conv2d grid of ``C`` channels that no reading matches (MAE's random masking drops
        patches) is refused: the input's size is no evidence then. So is any layer of a model that
        re-orders or shuffles its tokens (Hiera's ``Unroll``, ViTMAE's ``random_masking``).
        """
        self._in_order(name, t.shape)
        N, C = int(t.shape[1]), int(t.shape[2])
        embedded = {(h, w) for c, h, w in self.grids if c == C}
        seen = {(N - h * w, h, w) for h, w in embedded if 0 <= N - h * w <= MAX_PREFIX}
        strided = {(N - h * w, h, w) for h, w in _strided(size) if 0 <= N - h * w <= MAX_PREFIX}
        if embedded and not seen:
            grids = " or ".join(sorted(f"{h}x{w}" for h, w in embedded))
            raise HookscopeError(f"layer {name!r} gives {N} tokens of {C} channels, but a Conv2d made a {grids} grid "
                                 f"of {C} channels that no count of prefix tokens (0 to {MAX_PREFIX}) completes to "
                                 f"{N} (patches dropped or unfolded, as MAE and MobileViT do?); {TOKENS_FIX}")
        if prefix is not None:
            pool = {r for r in (seen or strided) if r[0] == prefix}  # a grid seen wins over a rounding of the input
        elif seen:
            pool = seen
        else:
            ks = {0, self.learned.get(C, 0)}
            pool = {r for r in strided if r[0] in ks} if "last" in self._said(name, t.shape, t.stride()) else set()
        if len(pool) == 1:
            return next(iter(pool))
        shown = " or ".join(f"{k} + {h}x{w}" for k, h, w in sorted(pool | seen | strided)[:4]) or "none"
        why = ("several readings fit" if len(pool) > 1 else
               f"the model puts {prefix} tokens first and no grid fits" if prefix is not None else
               "nothing tells how many prefix tokens come before the patches")
        raise HookscopeError(f"layer {name!r} gives {N} tokens of {C} channels (shape {tuple(t.shape)}; readings "
                             f"as prefix + grid: {shown}) and {why}; {TOKENS_FIX}")

    def layout(self, name: str, t: torch.Tensor, size: tuple[int, int]) -> str:
        """``"first"`` or ``"last"``: where layer ``name``'s 4-D output ``t`` keeps its channels; one line if
        not known.

        Told by the last module of known layout to run inside the layer (if its output has the shape
        and strides of ``t``: a permuted view of it, even of the same shape, is not its layout) and by
        the modules of known layout that read the output; failing both, by which reading gives a grid
        of the input's aspect ratio (``size``). The reading the modules tell must give such a grid too.
        """
        shape = t.shape
        said = self._said(name, shape, t.stride())
        if len(said) == 2:
            raise HookscopeError(f"layer {name!r}'s output of shape {tuple(shape)} is channels first to "
                                 f"{said['first']} but channels last to {said['last']}; {FIX}")
        if said:
            lay = next(iter(said))
            h, w = shape[2:] if lay == "first" else shape[1:3]
            if not fits(h, w, size):  # a Linear along the width of a B x C x h x w map is no channel dim
                raise HookscopeError(f"layer {name!r}'s output of shape {tuple(shape)} is channels {lay} to "
                                     f"{said[lay]}, but its {h} x {w} grid is no grid of the input's {size[0]} x "
                                     f"{size[1]}; {FIX}")
            return lay
        grids = [lay for lay, (h, w) in (("first", shape[2:]), ("last", shape[1:3])) if fits(h, w, size)]
        if len(grids) == 1:
            return grids[0]
        raise HookscopeError(f"layer {name!r} gives a 4-D activation of shape {tuple(shape)}, and neither the "
                             f"modules around it nor the input's {size[0]} x {size[1]} tell whether that is "
                             f"B x C x h x w or B x h x w x C; {FIX}")
