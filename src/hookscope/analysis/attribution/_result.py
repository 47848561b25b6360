"""What :func:`hookscope.attribute` returns: :class:`Attributions`, the maps and how they were made."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from ...core.result import Result, jsonable
from ...core.text import dtype_text, num, shape_text, table

__all__ = ["Attributions"]


@dataclass
class Attributions(Result):
    """What :func:`hookscope.attribute` returns: one attribution per input value (or layer value).

    Speaks hookscope's result protocol: ``table()`` (also ``str(res)``: one line per sample),
    ``to_dict()`` (tensors as they are), ``to_json()`` (the maps as their shape and dtype unless
    ``maps=True``).

    Attributes:
        maps: the attributions, the inputs' shape (at a layer: its output's), float32 for float16 /
            bfloat16 inputs.
        method: the method's name.
        target: ``B`` long tensor of the class explained for each sample, ``None`` for a target
            function or object (``hookscope.targets``).
        scores: ``B`` scores of the target on the inputs, ``f(x)``.
        delta: integrated gradients: ``f(x) - f(baseline) - maps[b].sum()`` per sample, how far the
            sum of the attributions is from the change of the score (small when the path integral
            is well approximated); ``None`` for the other methods.
        layer: the layer attributed at (its qualified name), ``None`` for the inputs.
        settings: the method's settings (``steps``, ``rule``, ``samples``, ``noise``, ``seed``), where it has some.
        forwards: how many times the model was called.
    """

    maps: torch.Tensor
    method: str
    target: torch.Tensor | None
    scores: torch.Tensor
    delta: torch.Tensor | None = None
    layer: str | None = None
    settings: dict[str, Any] | None = None
    forwards: int = 1

    def table(self) -> str:
        """The attributions as text: how they were made, then one line per sample.

        Example:
            >>> import torch, hookscope
            >>> net = torch.nn.Linear(3, 2); _ = torch.nn.init.ones_(net.weight); _ = torch.nn.init.zeros_(net.bias)
            >>> print(hookscope.attribute(net, torch.ones(2, 3), method="integrated_gradients", target=1, steps=2))
            integrated_gradients (steps=2, rule=riemann_trapezoid) on the inputs: 2 maps of 3, 2 forward passes
            sample  target  score  sum  delta
            ---------------------------------
                 0       1      3    3      0
                 1       1      3    3      0
        """
        where = "the inputs" if self.layer is None else f"layer {self.layer!r}"
        said = ", ".join(f"{k}={v}" for k, v in (self.settings or {}).items())
        b = self.maps.shape[0]
        head = (f"{self.method}{' (' + said + ')' if said else ''} on {where}: {b} map{'s' if b != 1 else ''} of "
                f"{shape_text(tuple(self.maps.shape[1:]))}, {self.forwards} forward pass{'es' if self.forwards != 1 else ''}")
        targets = self.target.tolist() if self.target is not None else [None] * b
        sums = self.maps.flatten(1).sum(1).tolist()
        deltas = self.delta.tolist() if self.delta is not None else [None] * b
        body = [[str(i), "-" if targets[i] is None else str(targets[i]), num(float(self.scores[i])), num(sums[i])]
                + ([] if self.delta is None else [num(deltas[i])]) for i in range(b)]
        cols = ["sample", "target", "score", "sum"] + ([] if self.delta is None else ["delta"])
        return "\n".join([head, *table(cols, body)])

    def _result_records(self) -> list[dict[str, Any]]:
        """One row per sample, as :meth:`table` shows it (``to_pandas()`` and a notebook's table)."""
        b = self.maps.shape[0]
        targets = self.target.tolist() if self.target is not None else [None] * b
        deltas = self.delta.tolist() if self.delta is not None else [None] * b
        sums, scores = self.maps.flatten(1).sum(1).tolist(), self.scores.float().tolist()
        return [{"sample": i, "target": targets[i], "score": scores[i], "sum": sums[i], "delta": deltas[i]}
                for i in range(b)]

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python data, the tensors kept as tensors.

        Example:
            >>> import torch, hookscope
            >>> d = hookscope.attribute(torch.nn.Linear(3, 2), torch.ones(1, 3), target=0).to_dict()
            >>> d["method"], d["maps"].shape
            ('saliency', torch.Size([1, 3]))
        """
        return {"method": self.method, "layer": self.layer, "settings": dict(self.settings or {}),
                "forwards": self.forwards, "target": self.target, "scores": self.scores, "delta": self.delta,
                "maps": self.maps}

    def to_json(self, indent: int | None = None, *, maps: bool = False) -> str:
        """:meth:`to_dict` as JSON text; the maps as ``{"shape": ..., "dtype": ...}`` unless ``maps=True``.

        Example:
            >>> import json, torch, hookscope
            >>> res = hookscope.attribute(torch.nn.Linear(3, 2), torch.ones(1, 3), target=0)
            >>> json.loads(res.to_json())["maps"]
            {'shape': [1, 3], 'dtype': 'float32'}
        """
        data = self.to_dict()
        if not maps:
            data["maps"] = {"shape": list(self.maps.shape), "dtype": dtype_text(self.maps.dtype)}
        return json.dumps(jsonable(data), indent=indent, allow_nan=False)
