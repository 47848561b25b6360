"""A direction in one layer's output: the difference of the means of two sets of prompts, their
first principal component, a logistic probe's weights, or a vector given (a probe trained
elsewhere, a file)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._tree import tensors
from ...capture import capture
from ...core.inputs import model_kwargs
from ...core.result import Result
from ...core.state import restored
from ...core.text import dtype_text
from ...errors import HookscopeError, checked, checked_init, did_you_mean
from ...selection import At, Selector, as_at
from ._layers import resolve

__all__ = ["Direction", "direction", "METHODS"]

METHODS = ("mean_difference", "pca", "probe")


@dataclass(frozen=True)
class DirectionRow:
    """What a direction is, as one row: where and how it was found, its width, length and dtype."""

    layer: str
    method: str
    width: int
    norm: float
    dtype: str
    positives: int
    negatives: int


@checked_init
class Direction(Result):
    """One direction of a layer's output: ``vector`` (its own length: the difference of means keeps
    the distance between the two sets' means), ``unit`` (length 1), the ``layer`` it was read at and
    the ``method`` that found it (``name`` is the layer's). Build one with :func:`direction`, from a tensor you have
    (``Direction(probe.weight[0], "transformer.h.3")``), or with :meth:`load`.

    Example:
        >>> d = Direction(torch.tensor([3.0, 4.0]), "h.0")
        >>> [round(x, 4) for x in d.unit.tolist()], d.norm
        ([0.6, 0.8], 5.0)
    """

    def __init__(self, vector: torch.Tensor, name: str = "", method: str = "given", *,
                 counts: tuple[int, int] = (0, 0)) -> None:
        if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or not vector.is_floating_point():
            shown = (f"a {dtype_text(vector.dtype)} tensor of shape {tuple(vector.shape)}"
                     if isinstance(vector, torch.Tensor) else type(vector).__name__)
            raise HookscopeError(f"a direction is a 1-D floating-point tensor of the layer's width, not {shown}; "
                                 "pass vector.flatten().float() of one row")
        norm = float(vector.detach().double().norm())
        if not norm > 0 or norm != norm or norm == float("inf"):
            raise HookscopeError(f"the direction's length is {norm}: a direction must be finite and not zero")
        self.vector, self.layer, self.method, self.counts, self.norm = vector.detach(), name, method, counts, norm

    @property
    def unit(self) -> torch.Tensor:
        """The direction of length 1 (in the vector's dtype)."""
        return (self.vector.double() / self.norm).to(self.vector.dtype)

    @property
    def width(self) -> int:
        return int(self.vector.shape[0])

    @property
    def rows(self) -> list[DirectionRow]:
        return [DirectionRow(self.layer, self.method, self.width, self.norm, dtype_text(self.vector.dtype),
                             *self.counts)]

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Direction:
        """The same direction in another dtype or on another device."""
        return Direction(self.vector.to(device=device, dtype=dtype), self.layer, self.method, counts=self.counts)

    def save(self, path: str | Path) -> None:
        """Write the vector to a safetensors file (its layer and method as metadata)."""
        st = _safetensors()
        st.save_file({"direction": self.vector.contiguous().cpu()}, str(path),
                     metadata={"layer": self.layer, "method": self.method})

    @staticmethod
    def load(path: str | Path) -> Direction:
        """A direction from a safetensors file: the tensor ``direction``, or the file's only tensor."""
        st = _safetensors()
        try:
            from safetensors import safe_open
            with safe_open(str(path), framework="pt") as f:
                meta, keys = f.metadata() or {}, list(f.keys())
            found = st.load_file(str(path))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError on a bad header
            raise HookscopeError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]}); save a "
                                 "direction with Direction.save or safetensors.torch.save_file") from None
        key = "direction" if "direction" in found else (keys[0] if len(keys) == 1 else None)
        if key is None:
            raise HookscopeError(f"{path} holds tensors {keys}; a direction file holds one tensor, or one named "
                                 "'direction'")
        return Direction(found[key].flatten() if found[key].dim() == 2 and found[key].shape[0] == 1 else found[key],
                         meta.get("layer", ""), meta.get("method", "given"))

    def table(self) -> str:
        return (f"direction at {self.layer or '(no layer)'} by {self.method}: width {self.width}, "
                f"length {self.norm:.4g}, {dtype_text(self.vector.dtype)}")

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "method": self.method, "width": self.width, "norm": self.norm,
                "dtype": dtype_text(self.vector.dtype), "counts": list(self.counts),
                "vector": self.vector.float().tolist()}


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise HookscopeError('directions are saved as safetensors files: pip install "hookscope[dump]"') from None
    return safetensors.torch


def _prompts(value: Any, what: str) -> list[torch.Tensor]:
    """A set of prompts: a ``[N, T]`` tensor of token ids, or a list of 1-D ones (of any lengths)."""
    if isinstance(value, torch.Tensor):
        items = [value] if value.dim() >= 2 else [value[None]]
    elif isinstance(value, Sequence) and value and not isinstance(value, str):
        items = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in value]
        items = [v[None] if v.dim() == 1 else v for v in items]
    else:
        raise HookscopeError(f"{what}= takes token ids: a [prompts, tokens] tensor or a list of 1-D tensors, "
                             f"not {type(value).__name__}")
    return items


def _samples(model: nn.Module, name: str, prompts: list[torch.Tensor], at: At | None,
             kwargs: dict[str, Any]) -> torch.Tensor:
    """The layer's output at the chosen positions, one row per position of each prompt."""
    rows = []
    for ids in prompts:
        with torch.no_grad(), restored(model), capture(model, name, at=at, copy="always") as rec:
            model(ids, **kwargs)
        out = rec[name].calls[-1].output
        main = out if isinstance(out, torch.Tensor) else next(t for t in _tensors(out))
        rows.append(main.reshape(-1, main.shape[-1]))
    return torch.cat(rows)


def _tensors(obj: Any) -> list[torch.Tensor]:
    return list(tensors(obj))


def _pca(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    both = torch.cat([pos, neg]).double()
    centred = both - both.mean(0)
    v: torch.Tensor = torch.linalg.svd(centred, full_matrices=False).Vh[0]
    # the sign: the positive set lies on the positive side
    return v if float((pos.double().mean(0) - neg.double().mean(0)) @ v) >= 0 else -v


def _probe(pos: torch.Tensor, neg: torch.Tensor, steps: int = 200) -> torch.Tensor:
    """A logistic probe on standardised features, fitted by L-BFGS; its weights in the layer's units."""
    x = torch.cat([pos, neg]).double()
    y = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
    z = (x - mean) / std
    w = torch.zeros(x.shape[1], dtype=torch.double, requires_grad=True)
    b = torch.zeros((), dtype=torch.double, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + 1e-3 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return (w.detach() / std)  # the same score, read off the layer's own activations


@checked
def direction(model: nn.Module, positive: Any, negative: Any, *, layers: Selector, method: str = "mean_difference",
              at: At | Any = None, kwargs: Mapping[str, Any] | None = None) -> Direction:
    """A direction in the output of ``layers`` (one layer) that tells the ``positive`` prompts from the ``negative`` ones.

    Each set is token ids: a ``[prompts, tokens]`` tensor, or a list of 1-D tensors of any lengths
    (run one by one). The samples are the layer's output at ``at`` (default ``hookscope.at[:, -1]``,
    each prompt's last token; ``hookscope.tokens.prompt`` takes every token), one per position.

    - ``"mean_difference"``: mean of the positive samples minus mean of the negative ones;
    - ``"pca"``: the first principal component of both sets pooled and centred, its sign pointing
      from the negative mean to the positive one (length 1);
    - ``"probe"``: the weights of a logistic regression told positive from negative (standardised
      features, a small L2 penalty), in the layer's units.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Embedding(4, 3))
        >>> d = hookscope.direction(net, torch.tensor([[1]]), torch.tensor([[2]]), layers="0")
        >>> torch.allclose(d.vector, net[0].weight[1] - net[0].weight[2])
        True
    """
    if method not in METHODS:
        raise HookscopeError(f"direction(method={method!r}) is not a method.{did_you_mean(str(method), METHODS)} "
                             f"Use one of {', '.join(METHODS)}")
    picked = resolve(model, (layers,))
    if len(picked) != 1:
        raise HookscopeError(f"direction() reads one layer, but {layers!r} selects {len(picked)}: "
                             f"{[n for n, _ in picked][:4]}; name one")
    name = picked[0][0]
    where = as_at(at) if at is not None else as_at((slice(None), -1))
    kw = model_kwargs(kwargs)
    pos = _samples(model, name, _prompts(positive, "positive"), where, kw)
    neg = _samples(model, name, _prompts(negative, "negative"), where, kw)
    if method == "mean_difference":
        vector = pos.double().mean(0) - neg.double().mean(0)
    elif method == "pca":
        vector = _pca(pos, neg)
    else:
        vector = _probe(pos, neg)
    return Direction(vector.to(pos.dtype), name, method, counts=(len(pos), len(neg)))
