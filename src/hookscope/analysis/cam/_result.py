"""What :func:`hookscope.cam` returns: :class:`CamMaps`, one :class:`CamRow` per image, as text or JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ...core.result import Result, jsonable, missing
from ...core.text import dtype_text, num, shape_text, table

__all__ = ["ByLayer", "CamMaps", "CamRow"]

V = TypeVar("V")


class ByLayer(dict[str, V]):
    """A dict keyed by layer name: a name it does not hold raises :class:`~hookscope.RecordError`
    naming the closest ones (``in`` agrees: it is a dict)."""

    def __missing__(self, name: str) -> V:
        raise missing(name, "layer", self)


@dataclass(frozen=True)
class CamRow:
    """One image of a :class:`CamMaps` (a row of ``res.rows``).

    Attributes:
        image: the image's index in the batch.
        target: the class explained (``None`` for a target function, or Eigen-CAM without logits).
        score: the target's score (``None`` where no score was read).
        peak: where the map's maximum lies at the input's resolution (the first in row-major order): ``(y, x)``
            for images, ``(l,)`` for signals, ``(d, y, x)`` for volumes.
        layers: the layers whose maps were fused.
    """

    image: int
    target: int | None
    score: float | None
    peak: tuple[int, ...]
    layers: tuple[str, ...]


def _unravel(i: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for d in reversed(dims):
        i, r = divmod(i, d) if d else (i, 0)
        out.append(r)
    return tuple(reversed(out))


def shape_and_dtype(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": dtype_text(t.dtype)}


@dataclass
class CamMaps(Result):
    """What :func:`hookscope.cam` returns: the maps, one row per image, and how they were made.

    Speaks hookscope's result protocol: ``rows`` (one :class:`CamRow` per image), ``table()``
    (also ``str(res)``), ``to_dict()`` (tensors as they are), ``to_json()`` (the maps summarised
    as their shape and dtype unless ``maps=True``); ``res.raw["name"]`` and ``res.layouts["name"]``
    raise :class:`~hookscope.RecordError` with the closest names for a layer they do not hold.

    Attributes:
        maps: ``B x H x W`` (signals ``B x L``, volumes ``B x D x H x W``), upsampled (linear, bilinear,
            trilinear) to the input's spatial size, min-max normalised per sample to [0, 1] (several layers:
            fused, then normalised again).
        raw: per layer name, the ``B x h x w`` map before upsampling and normalisation (after ReLU
            where the method has one); FullGrad: each biased layer's term and the input's, ``"<input>"``.
        targets: ``B`` long tensor of the class indices used (``None`` when target is a function,
            or for Eigen-CAM on a model whose output holds no logits).
        scores: ``B`` scores of the targets (the model's output read through ``output``), detached;
            ``None`` where ``targets`` is ``None`` for want of logits.
        layers: qualified names of the layers used (names of the unwrapped model).
        method: the method's name, as in :data:`hookscope.analysis.cam.METHODS`.
        forwards: how many times the model was called (Score-CAM: the first pass plus one call per
            batch of masked inputs).
        masked: how many masked inputs Score-CAM evaluated (channels with equal masks share one).
        layouts: per layer name, how its activation was read: ``"BCHW"`` (as it came),
            ``"BHWC"`` (channels last, as Swin stages: permuted to ``B x C x h x w`` first),
            ``"tokens(k=1, 14x14)"`` (``B x (k + h*w) x C`` tokens: the ``k`` prefix tokens dropped, the
            rest laid out row by row) or ``"reshape="`` (your function).
        chosen: with ``layers=None``, the layer chosen and why, e.g. ``"blocks.11.norm1 (the last block's
            first norm, before the last attention 'blocks.11.attn')"``; ``None`` when you chose.
        notes: what makes maps say less than they seem to, one line each, also given as warnings:
            a sample whose score's gradient at a layer is exactly zero (its map is all zero), or whose
            Score-CAM masked inputs all score the same (its channels all weigh the same).
    """

    maps: torch.Tensor
    raw: dict[str, torch.Tensor]
    targets: torch.Tensor | None
    scores: torch.Tensor | None
    layers: list[str]
    method: str
    forwards: int = 1
    masked: int = 0
    layouts: dict[str, str] = field(default_factory=dict)
    chosen: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw = ByLayer(self.raw)
        self.layouts = ByLayer(self.layouts)

    @property
    def rows(self) -> list[CamRow]:
        """One row per image: the class explained, its score, where the map peaks, the layers."""
        b, dims = self.maps.shape[0], tuple(self.maps.shape[1:])
        peaks = self.maps.flatten(1).argmax(1).tolist() if self.maps.numel() else [0] * b
        targets = self.targets.tolist() if self.targets is not None else [None] * b
        scores = self.scores.float().tolist() if self.scores is not None else [None] * b
        return [CamRow(i, targets[i], scores[i], _unravel(peaks[i], dims), tuple(self.layers)) for i in range(b)]

    def table(self) -> str:
        """The maps as text: how they were made, then one line per image (also ``str(res)``).

        Example:
            >>> import torch, hookscope, hookscope.zoo
            >>> res = hookscope.cam(hookscope.zoo.TinyResNet().eval(), torch.ones(2, 3, 32, 32), layers="layer2", target=3)
            >>> print(res)  # doctest: +ELLIPSIS
            gradcam on layer2: 2 maps of 32x32, 1 forward pass
            image  target...score  peak (y, x)
            -----...
                0       3...)
                1       3...)
        """
        size = shape_text(tuple(self.maps.shape[1:]))
        counted = f"{self.forwards} forward pass{'es' if self.forwards != 1 else ''}"
        if self.masked:
            counted += f" ({self.masked} masked inputs)"
        turned = [f"{n} {lay}" for n, lay in self.layouts.items() if lay not in ("BCL", "BCHW", "BCDHW")]
        head = (f"{self.method} on {', '.join(self.layers)}{' (' + ', '.join(turned) + ')' if turned else ''}: "
                f"{self.maps.shape[0]} map{'s' if self.maps.shape[0] != 1 else ''} of {size}, {counted}")
        body = [[str(r.image), "-" if r.target is None else str(r.target), num(r.score), f"{r.peak}"]
                for r in self.rows]
        said = ([f"layer chosen automatically: {self.chosen}"] if self.chosen else []) + [
            f"note: {n}" for n in self.notes]
        where = {1: "peak (l)", 2: "peak (y, x)", 3: "peak (d, y, x)"}.get(self.maps.ndim - 1, "peak")
        return "\n".join([head, *said, *table(["image", "target", "score", where], body, left={3})])

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python data, tensors kept as tensors (``maps``, ``raw``, ``targets``,
        ``scores``), and the rows as dicts.

        Example:
            >>> import torch, hookscope, hookscope.zoo
            >>> res = hookscope.cam(hookscope.zoo.TinyResNet().eval(), torch.ones(1, 3, 32, 32), layers="layer2")
            >>> d = res.to_dict()
            >>> d["maps"].shape, d["raw"]["layer2"].shape, d["rows"][0]["layers"]
            (torch.Size([1, 32, 32]), torch.Size([1, 16, 16]), ('layer2',))
        """
        return {
            "method": self.method,
            "layers": list(self.layers),
            "layouts": dict(self.layouts),
            "chosen": self.chosen,
            "notes": list(self.notes),
            "forwards": self.forwards,
            "masked": self.masked,
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "targets": self.targets,
            "scores": self.scores,
            "maps": self.maps,
            "raw": dict(self.raw),
        }

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON text. The maps (``B x H x W`` floats, 50k numbers for one
        224 x 224 image) are written as ``{"shape": ..., "dtype": ...}`` unless ``maps=True``, which
        writes them, and ``raw``, as nested lists.

        Example:
            >>> import json, torch, hookscope, hookscope.zoo
            >>> res = hookscope.cam(hookscope.zoo.TinyResNet().eval(), torch.ones(1, 3, 32, 32), layers="layer2")
            >>> data = json.loads(res.to_json())
            >>> data["maps"], data["raw"]["layer2"]["shape"], data["rows"][0]["peak"] == list(res.rows[0].peak)
            ({'shape': [1, 32, 32], 'dtype': 'float32'}, [1, 16, 16], True)
            >>> len(json.loads(res.to_json(maps=True))["maps"][0])
            32
        """
        data = self.to_dict()
        if not maps:
            data["maps"] = shape_and_dtype(self.maps)
            data["raw"] = {n: shape_and_dtype(t) for n, t in self.raw.items()}
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)
