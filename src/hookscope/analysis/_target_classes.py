"""What to explain beyond a class: a segmented region, a detected box, the similarity of an embedding,
the next token of a language model.

Each target is a small callable object: given the model's output (read through ``output=`` first
when it is given) it returns one score per sample, each computed from that sample's own output, so
:func:`hookscope.cam` (``target=``) and the curves of :mod:`hookscope.metrics` take it as they take
any function. Every check is one line naming the problem and the fix, never a silently blank map.

Two optional methods tell hookscope more than a plain function can:

- ``anchor(output)``: the target to score perturbed copies of the inputs (the deletion and insertion
  curves, Score-CAM's masked inputs), ``output`` being the model's output on the inputs themselves.
  A region predicted on the inputs stays where it was; a box is checked to be detected there, and
  counts 0 on a perturbed input where it no longer is. The curves call it by themselves.
- ``take(rows)``: the target for a batch made of the samples ``rows`` (per-sample masks, boxes or
  references picked for them; one given for all samples serves every one).

:class:`Class` also has ``class_index``: :func:`hookscope.cam` and the curves treat it as that class
index, so ``target=Class(3)`` is ``target=3`` (the curves' ``score="prob"`` applies).

Example:
    >>> import torch
    >>> from hookscope.targets import Segmentation
    >>> logits = torch.zeros(1, 3, 2, 2); logits[0, 2] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> Segmentation(2, mask=torch.tensor([[True, False], [False, True]]))(logits).tolist()
    [5.0]

One file past 500 lines: every target a user imports is found in one place, ``hookscope.targets``,
and they share the per-sample checks (one value for all samples or one per sample, ``take``). It
stands beside the analyses that score it (``hookscope.targets`` hands its names on), so no analysis
reaches up for a target.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import HookscopeError
from ._targets import check_range, class_targets, logits_of, read_logits

__all__ = ["Class", "Detection", "Segmentation", "Similarity", "Token"]

Index = int | Sequence[int] | torch.Tensor


def _fit(data: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """Per-sample ``data`` (one row per sample) for an output of ``n`` rows: as it is, or one row for all."""
    if data.shape[0] == n:
        return data
    if data.shape[0] == 1:
        return data.expand(n, *data.shape[1:])
    raise HookscopeError(f"the target holds {data.shape[0]} {what} (one per sample) but the model's output has "
                         f"{n} rows; give one per sample of this batch, or one for all")


def _take(data: torch.Tensor, rows: torch.Tensor, what: str) -> torch.Tensor:
    """The rows ``rows`` of per-sample ``data``: each sample's own, or the one row for all, as :func:`_fit`."""
    if data.shape[0] == 1:
        return data.expand(len(rows), *data.shape[1:])
    rows = rows.to(data.device)
    if len(rows) and int(rows.max()) >= data.shape[0]:
        raise HookscopeError(f"the target holds {data.shape[0]} {what} (one per sample) but the batch has sample "
                             f"{int(rows.max())}; give one per sample of this batch, or one for all")
    return data[rows]


def _rank(x: Any) -> int:
    """How many dimensions ``x`` has: a tensor's or numpy array's ``ndim``, a nested list's depth, 0 for a number."""
    ndim = getattr(x, "ndim", None)
    if isinstance(ndim, int):
        return ndim
    if isinstance(x, (list, tuple)):
        return 1 + (_rank(x[0]) if len(x) else 0)
    return 0


def _shape(t: Any) -> str:
    return "x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


class Class:
    """The logit of a class: ``logits[b, index_b]``, the classification target, as an object.

    Logits are the output itself, or its ``.logits`` (Hugging Face) / ``["logits"]``; ``B x classes``.

    Args:
        index: one class for every sample, or one per sample (a list or a tensor).

    Example:
        >>> import torch
        >>> Class([2, 0])(torch.tensor([[0.0, 1.0, 5.0], [7.0, 1.0, 2.0]])).tolist()
        [5.0, 7.0]
    """

    def __init__(self, index: Index) -> None:
        self.shared = _rank(index) == 0  # an int, a 0-d tensor, a numpy integer
        self.index = class_targets(index, 1 if self.shared else len(index))  # type: ignore[arg-type]

    @property
    def class_index(self) -> int | list[int]:
        """The class: one int for every sample, or the list of one int per sample.

        :func:`hookscope.cam` and the curves of :mod:`hookscope.metrics` treat a target that has it as
        that class index (``target=Class(3)`` is ``target=3``: ``score="prob"`` applies, ``targets`` is filled).

        Example:
            >>> Class(3).class_index, Class([2, 0]).class_index
            (3, [2, 0])
        """
        return int(self.index[0]) if self.shared else [int(i) for i in self.index.tolist()]

    def __call__(self, out: Any) -> torch.Tensor:
        t = out if isinstance(out, torch.Tensor) else logits_of(out)
        logits = read_logits(None, out, t.shape[0] if isinstance(t, torch.Tensor) and t.ndim else -1)
        index = _fit(self.index.to(logits.device), logits.shape[0], "class indices")
        check_range(index, logits.shape[1])
        return logits.gather(1, index.unsqueeze(1)).squeeze(1)

    def take(self, rows: torch.Tensor) -> Class:
        """The target for the samples ``rows``: their own classes."""
        return self if self.shared else Class(_take(self.index, rows, "class indices"))

    def __repr__(self) -> str:
        return f"Class({self.index[0].item() if self.shared else self.index.tolist()})"


def _dense_logits(out: Any) -> torch.Tensor:
    """``B x classes x H x W`` from a tensor, torchvision's ``{"out": ..., "aux": ...}`` or ``.logits``."""
    t = out if isinstance(out, torch.Tensor) else out.get("out") if isinstance(out, Mapping) else None
    t = t if isinstance(t, torch.Tensor) else logits_of(out)
    if t is None or t.ndim != 4:
        raise HookscopeError(f"Segmentation needs B x classes x H x W logits, got {_shape(out if t is None else t)}; "
                             "pass output= a function that returns them, e.g. output=lambda o: o['out']")
    return t


def _region(mask: Any) -> torch.Tensor:
    """A checked boolean ``H x W`` (shared) or ``B x H x W`` (per sample) mask."""
    m = torch.as_tensor(mask)
    if m.ndim not in (2, 3):
        raise HookscopeError(f"mask of shape {tuple(m.shape)} is not H x W (shared) or B x H x W (one per sample)")
    if m.dtype != torch.bool:
        if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
            raise HookscopeError(f"mask must be bool or 0/1, got values other than 0 and 1 ({m.dtype}); "
                                 "pass mask > 0.5 for a soft mask")
        m = m == 1
    empty = ~m.flatten(-2).any(-1).reshape(-1)
    if bool(empty.any()):
        which = "the mask" if m.ndim == 2 else f"the mask of sample {int(empty.nonzero()[0, 0])}"
        raise HookscopeError(f"{which} is empty (no pixel), so the region's score is 0 and its map blank; "
                             "pass a region with at least one pixel")
    return m


class Segmentation:
    """The summed logit of one class over a region: ``sum_ij logits[b, category, i, j] * mask[b, i, j]``.

    Reads ``B x classes x H x W`` logits: the output itself, torchvision's ``{"out": ..., "aux": ...}``
    (``"out"``; ``fcn_resnet50``, ``deeplabv3_*``, ``lraspp``) or a Hugging Face ``.logits`` (SegFormer's
    are at a quarter of the input's size: the mask must be at the logits' ``H x W``).

    Args:
        category: the class whose logit is summed.
        mask: the region, bool or 0/1, ``H x W`` for every sample or ``B x H x W`` one per sample.
            ``None``: the pixels where ``category`` is the predicted class (argmax over classes) in the
            output scored, as pytorch-grad-cam's tutorial builds its mask; the curves of
            :mod:`hookscope.metrics` fix it on the inputs themselves (see :meth:`anchor`). An empty
            region is refused: its score is 0 and its map blank.

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 2, 1, 2); logits[:, 1, 0, 0] = torch.tensor([1.0, 4.0])
        >>> Segmentation(1)(logits).tolist()   # the predicted region: the first pixel
        [1.0, 4.0]
    """

    def __init__(self, category: int, mask: Any = None) -> None:
        if isinstance(category, bool) or not isinstance(category, int) or category < 0:
            raise HookscopeError(f"category={category!r} is not a class index; pass an int from 0")
        self.category = category
        self.mask = None if mask is None else _region(mask)

    def __call__(self, out: Any) -> torch.Tensor:
        logits = _dense_logits(out)
        b, classes, h, w = logits.shape
        check_range(torch.tensor([self.category]), classes)
        region = self.mask if self.mask is not None else self._predicted(logits)
        if tuple(region.shape[-2:]) != (h, w):
            raise HookscopeError(f"mask of H x W = {region.shape[-2]} x {region.shape[-1]} does not fit the logits' "
                                 f"{h} x {w}; resize it with F.interpolate(mask[:, None].float(), size=({h}, {w}), "
                                 "mode='nearest')")
        region = region.to(logits.device).expand(b, h, w) if region.ndim == 2 else _fit(
            region.to(logits.device), b, "masks")
        x = logits[:, self.category]
        return torch.where(region, x, torch.zeros((), dtype=x.dtype, device=x.device)).flatten(1).sum(1)

    def _predicted(self, logits: torch.Tensor) -> torch.Tensor:
        found = logits.detach().argmax(1) == self.category
        empty = ~found.flatten(1).any(1)
        if bool(empty.any()):
            i = int(empty.nonzero()[0, 0])
            raise HookscopeError(f"class {self.category} is predicted at no pixel of sample {i}, so its region is "
                                 "empty; pass mask= the region to explain")
        return found

    def anchor(self, out: Any) -> Segmentation:
        """The target with the region fixed: ``mask`` as given, or where ``out`` predicts the class.

        Example:
            >>> import torch
            >>> Segmentation(0).anchor(torch.tensor([[[[2.0, 0.0]], [[1.0, 3.0]]]]))
            Segmentation(0, mask=1x1x2)
        """
        return self if self.mask is not None else Segmentation(self.category, self._predicted(_dense_logits(out)))

    def take(self, rows: torch.Tensor) -> Segmentation:
        """The target for the samples ``rows``: their own masks."""
        if self.mask is None or self.mask.ndim == 2:
            return self
        return Segmentation(self.category, _take(self.mask, rows, "masks"))

    def __repr__(self) -> str:
        return f"Segmentation({self.category}, mask={'None' if self.mask is None else _shape(self.mask)})"


def _per_image(boxes: Any, labels: Any) -> bool:
    """Boxes given per image: a ``B x K x 4`` array, a list holding some ``K_i x 4``, or labels listed per image."""
    if _rank(boxes) == 3:
        return True
    listed = isinstance(boxes, (list, tuple)) and len(boxes) > 0
    nested = isinstance(labels, (list, tuple)) and any(_rank(lab) >= 1 for lab in labels)
    return listed and (any(_rank(b) == 2 for b in boxes) or (nested and all(_rank(b) == 1 for b in boxes)))


def _box_tensor(b: Any, where: str) -> torch.Tensor:
    """A checked float ``K x 4`` from a tensor, numpy array or list; one box ``(x0, y0, x1, y1)`` is ``1 x 4``."""
    try:
        if isinstance(b, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in b):  # K boxes as K tensors
            b = torch.stack([torch.as_tensor(e).detach().float() for e in b])
        t = b.detach().float() if isinstance(b, torch.Tensor) else torch.as_tensor(b, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"boxes{where} ({type(b).__name__}) are not numbers of shape K x 4; pass a K x 4 "
                             "tensor of corners (x0, y0, x1, y1), or a list of K_i x 4 per image") from None
    if t.ndim == 1 and t.shape[0] == 4:
        t = t[None]
    if t.ndim != 2 or t.shape[1] != 4 or t.shape[0] == 0:
        raise HookscopeError(f"boxes{where} of shape {tuple(t.shape)} are not K x 4 (x0, y0, x1, y1) with K >= 1 "
                             "(or one box of 4); per image, pass a list of K_i x 4 or a B x K x 4 tensor")
    bad = ~t.isfinite().all(1) | (t[:, 2] <= t[:, 0]) | (t[:, 3] <= t[:, 1])
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise HookscopeError(f"box {k}{where} {t[k].tolist()} is empty or not finite; boxes are corners "
                             "(x0, y0, x1, y1) with x1 > x0 and y1 > y0, in the input's pixels")
    return t


def _label_tensor(lab: Any, k: int, where: str) -> torch.Tensor:
    """``k`` class indices (long) from an int, a numpy integer, a list, a tensor or an array of them."""
    try:
        if isinstance(lab, (bool, str, bytes)) or lab is None:
            raise TypeError
        t = torch.as_tensor([operator.index(lab)]) if _rank(lab) == 0 else torch.as_tensor(lab).detach()
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"labels{where} {lab!r} are not class indices; pass one int per box") from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.ndim != 1:
        raise HookscopeError(f"labels{where} of shape {tuple(t.shape)} ({t.dtype}) are not one int per box; "
                             "pass K ints, or per image a list of K_i ints")
    if t.shape[0] != k:
        raise HookscopeError(f"{t.shape[0]} labels for {k} boxes{where}; give one label per box")
    if bool((t < 0).any()):
        raise HookscopeError(f"label {int(t.min())}{where} is negative; labels are class indices from 0")
    return t.long()


def _boxes(boxes: Any, labels: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
    """Checked ``(boxes, labels, shared)``: one ``K x 4`` / ``K`` pair for all images, or one per image."""
    per_image = _per_image(boxes, labels)
    if per_image and _rank(labels) == 0:
        raise HookscopeError(f"boxes are given per image but labels={labels!r} is not; give a list of labels per image")
    bs, ls = (list(boxes), list(labels)) if per_image else ([boxes], [labels])
    if len(bs) != len(ls):
        raise HookscopeError(f"{len(bs)} images of boxes but {len(ls)} of labels; give labels per image as the boxes")
    out_b, out_l = [], []
    for i, (b, lab) in enumerate(zip(bs, ls)):
        where = f" of image {i}" if per_image else ""
        out_b.append(_box_tensor(b, where))
        out_l.append(_label_tensor(lab, out_b[-1].shape[0], where))
    return out_b, out_l, not per_image


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``K x N`` intersection over union of corner boxes ``a`` (``K x 4``) and ``b`` (``N x 4``)."""
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])).clamp(min=0)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def _detections(out: Any) -> list[Mapping[str, torch.Tensor]]:
    keys = ("boxes", "labels", "scores")
    if not (isinstance(out, (list, tuple)) and all(isinstance(d, Mapping) and all(k in d for k in keys) for d in out)):
        raise HookscopeError(f"Detection needs a detection model's output in eval mode (a list of dicts with "
                             f"boxes, labels, scores, one per image), got {_shape(out)}; call model.eval()")
    return list(out)


class Detection:
    """The summed score of the detections that match given boxes, per image (torchvision detection models).

    For each requested box ``k`` (label ``l_k``), the detections of the same label whose box overlaps it
    with ``IoU >= iou`` are matched; an image's score is the sum over ``k`` of their ``scores`` (a
    detection matching two requested boxes counts twice). Works on the list of
    ``{"boxes", "labels", "scores"}`` dicts that torchvision's Faster R-CNN, RetinaNet, FCOS and SSD
    return in eval mode, boxes in the input's pixels; in eval the scores depend on the backbone through
    the box features, so gradients flow to it. pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` instead
    adds the IoU to the score of the single best-overlapping detection, and silently scores 0 when none
    matches.

    A requested box that no detection matches is refused in one line (its score would be 0 and its map
    blank): lower ``iou=``, check the label, or lower the model's ``box_score_thresh``. On perturbed
    inputs (the deletion and insertion curves, Score-CAM) a box that the model no longer detects scores
    0, as it should, once :meth:`anchor` checked it on the inputs themselves (the curves do).

    Args:
        labels: the class of each box: ``K`` ints for every image, or a list of ``K_i`` ints per image
            (ints, numpy integers, lists, tensors or numpy arrays).
        boxes: ``K x 4`` corners ``(x0, y0, x1, y1)`` for every image, or per image a list of ``K_i x 4``
            (or a ``B x K x 4`` tensor); a box of 4 numbers alone is one box. Tensors, numpy arrays or lists.
        iou: the least intersection over union of a match, in ``(0, 1]``.

    Example:
        >>> import torch
        >>> det = [{"boxes": torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30]]),
        ...         "labels": torch.tensor([1, 1, 1]), "scores": torch.tensor([0.5, 0.25, 0.125])}]
        >>> Detection([1], [[0, 0, 10, 10]])(det).tolist()   # the first two overlap the box
        [0.75]
    """

    def __init__(self, labels: Any, boxes: Any, iou: float = 0.5, *, strict: bool = True) -> None:
        if isinstance(iou, bool) or not isinstance(iou, (int, float)) or not 0 < iou <= 1:
            raise HookscopeError(f"iou={iou!r} must be a number in (0, 1], for example iou=0.5")
        self.boxes, self.labels, self.shared = _boxes(boxes, labels)
        self.iou, self.strict = float(iou), strict

    def __call__(self, out: Any) -> torch.Tensor:
        dets = _detections(out)
        n, given = len(dets), len(self.boxes)
        if not self.shared and given not in (1, n):
            raise HookscopeError(f"Detection holds boxes for {given} images but the model's output has {n}; "
                                 "give boxes for each image of this batch")
        return torch.stack([self._image(i, d, self.boxes[0 if given == 1 else i], self.labels[0 if given == 1 else i])
                            for i, d in enumerate(dets)]) if dets else torch.zeros(0)

    def _image(self, i: int, det: Mapping[str, torch.Tensor], boxes: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
        scores = det["scores"]
        same = labels.to(det["labels"].device)[:, None] == det["labels"][None, :]
        overlap = _iou(boxes.to(det["boxes"].device), det["boxes"].detach().float())
        match = same & (overlap >= self.iou)
        missing = ~match.any(1)
        if self.strict and bool(missing.any()):
            k = int(missing.nonzero()[0, 0])
            best = overlap[k][same[k]]
            seen = f"best IoU {float(best.max()):.2f}" if best.numel() else "none of that label"
            raise HookscopeError(
                f"box {k} {boxes[k].tolist()} (label {int(labels[k])}) of image {i} matches no detection with "
                f"IoU >= {self.iou:g} ({seen}), so its score is 0 and its map blank; lower iou=, check the box "
                "and label, or lower the model's box_score_thresh")
        return torch.where(match, scores[None, :], torch.zeros((), dtype=scores.dtype, device=scores.device)).sum()

    def anchor(self, out: Any) -> Detection:
        """The target for perturbed copies of the inputs whose output is ``out``: every box is checked to
        match a detection in ``out`` (one line if not), then a box not detected any more scores 0.

        Example:
            >>> import torch
            >>> det = [{"boxes": torch.tensor([[0.0, 0, 4, 4]]), "labels": torch.tensor([2]),
            ...         "scores": torch.tensor([0.9])}]
            >>> Detection([2], [[0, 0, 4, 4]]).anchor(det)([{**det[0], "labels": torch.tensor([1])}]).tolist()
            [0.0]
        """
        self(out)
        return self._copy(self.boxes, self.labels, strict=False)

    def take(self, rows: torch.Tensor) -> Detection:
        """The target for the images ``rows``: their own boxes."""
        if self.shared or len(self.boxes) == 1:
            return self
        picked = rows.tolist()
        if picked and max(picked) >= len(self.boxes):
            raise HookscopeError(f"Detection holds boxes for {len(self.boxes)} images but the batch has image "
                                 f"{max(picked)}; give boxes for each image of this batch")
        return self._copy([self.boxes[r] for r in picked], [self.labels[r] for r in picked], strict=self.strict)

    def _copy(self, boxes: list[torch.Tensor], labels: list[torch.Tensor], strict: bool) -> Detection:
        new = Detection.__new__(Detection)
        new.boxes, new.labels, new.shared, new.iou, new.strict = boxes, labels, self.shared, self.iou, strict
        return new

    def __repr__(self) -> str:
        if self.shared:
            return f"Detection(labels={self.labels[0].tolist()}, boxes={_shape(self.boxes[0])}, iou={self.iou:g})"
        shapes = ", ".join(_shape(b) for b in self.boxes)
        return f"Detection(labels={[t.tolist() for t in self.labels]}, boxes=[{shapes}], iou={self.iou:g})"


class Similarity:
    """The cosine similarity of the model's embedding to a reference: ``cos(e_b, r_b)`` per sample.

    The embedding is the model's output (through ``output=``): ``B x D``, or pooled features such as
    ``B x D x 1 x 1`` with ``dim=1``; a transformer's ``output=lambda o: o.pooler_output`` or
    ``output=lambda o: o.last_hidden_state[:, 0]``. One score per sample: an embedding with a position
    dimension is refused (pool it first).

    Args:
        reference: ``D`` (one for every sample) or ``B x D`` (one per sample); not all zeros.
        dim: the embedding's feature dimension (not the batch's).

    Example:
        >>> import torch
        >>> Similarity(torch.tensor([1.0, 0.0]))(torch.tensor([[2.0, 0.0], [1.0, 1.0]]))
        tensor([1.0000, 0.7071])
    """

    def __init__(self, reference: Any, dim: int = -1) -> None:
        ref = torch.as_tensor(reference).detach()
        if ref.ndim not in (1, 2) or not ref.is_floating_point() or ref.shape[-1] == 0:
            raise HookscopeError(f"reference of shape {tuple(ref.shape)} ({ref.dtype}) is not a float vector D "
                                 "or B x D, one per sample")
        zero = ref.reshape(-1, ref.shape[-1]).abs().amax(1) == 0
        if bool(zero.any()):
            raise HookscopeError(f"reference {int(zero.nonzero()[0, 0])} is all zeros: its cosine similarity is 0 "
                                 "for every embedding, and its map blank")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise HookscopeError(f"dim={dim!r} must be an int, the embedding's feature dimension")
        self.reference, self.dim, self.shared = ref, dim, ref.ndim == 1

    def __call__(self, out: Any) -> torch.Tensor:
        if not isinstance(out, torch.Tensor) or out.ndim < 2:
            raise HookscopeError(f"Similarity needs a B x D embedding, got {_shape(out)}; pass output= that picks it, "
                                 "e.g. output=lambda o: o.pooler_output or lambda o: o.last_hidden_state[:, 0]")
        d = self.dim % out.ndim if -out.ndim <= self.dim < out.ndim else -1
        if d <= 0:
            raise HookscopeError(f"dim={self.dim} is not a feature dimension of the {_shape(out)} embedding "
                                 "(dimension 0 is the batch); use dim=-1 for B x D")
        others = [s for j, s in enumerate(out.shape) if j not in (0, d)]
        if any(s != 1 for s in others) or out.shape[d] != self.reference.shape[-1]:
            raise HookscopeError(f"the {_shape(out)} embedding does not give one similarity per sample with a "
                                 f"reference of {self.reference.shape[-1]} features on dim={self.dim}; pool it to "
                                 "B x D or pass output= that picks the embedding")
        b = out.shape[0]
        ref = self.reference.to(device=out.device, dtype=out.dtype)
        ref = ref[None] if self.shared else _fit(ref, b, "references")
        shape = [ref.shape[0]] + [1] * (out.ndim - 1)
        shape[d] = ref.shape[1]
        return torch.nn.functional.cosine_similarity(out, ref.reshape(shape), dim=d).reshape(b)

    def take(self, rows: torch.Tensor) -> Similarity:
        """The target for the samples ``rows``: their own references."""
        return self if self.shared else Similarity(_take(self.reference, rows, "references"), self.dim)

    def __repr__(self) -> str:
        return f"Similarity(reference={_shape(self.reference)}, dim={self.dim})"


def _token_logits(out: Any) -> torch.Tensor:
    """``B x T x V`` logits from a tensor, a Hugging Face output's ``.logits`` or a dict's ``"logits"``."""
    t = out if isinstance(out, torch.Tensor) else logits_of(out)
    if t is None or t.ndim != 3:
        raise HookscopeError(f"Token needs a language model's B x T x vocab logits, got {_shape(out if t is None else t)}; "
                             "use Token with a model whose output (or its .logits) has one row of logits per position")
    return t


class Token:
    """The logit of a token at one position of a language model: ``logits[b, position, id_b]``.

    Logits are the output itself, or its ``.logits`` (Hugging Face) / ``["logits"]``; ``B x T x V``.
    With ``position=-1`` (the default) it scores the token the model would write next.

    Args:
        token_id: one token id for every sample, or one per sample (a list or a tensor).
        position: the position whose logits are read, counted from 0 (or from the end when negative).

    Example:
        >>> import torch
        >>> logits = torch.arange(24.0).reshape(2, 3, 4)          # 2 sequences, 3 positions, 4 tokens
        >>> Token(1)(logits).tolist(), Token([0, 3], position=0)(logits).tolist()
        ([9.0, 21.0], [0.0, 15.0])
    """

    def __init__(self, token_id: Index, position: int = -1) -> None:
        self.shared = _rank(token_id) == 0
        try:
            ids = class_targets(token_id, 1 if self.shared else len(token_id))  # type: ignore[arg-type]
        except HookscopeError:
            raise HookscopeError(f"token_id={token_id!r} is not a token id; pass an int, or one int per "
                                 "sample") from None
        if bool((ids < 0).any()):
            raise HookscopeError(f"token id {int(ids.min())} is negative; token ids count from 0")
        if isinstance(position, bool) or not isinstance(position, int):
            raise HookscopeError(f"position={position!r} must be an int (-1: the last position)")
        self.token_id, self.position = ids, position

    @property
    def token_ids(self) -> int | list[int]:
        """The token: one int for every sample, or the list of one int per sample.

        Example:
            >>> Token(7).token_ids, Token([2, 0]).token_ids
            (7, [2, 0])
        """
        return int(self.token_id[0]) if self.shared else [int(i) for i in self.token_id.tolist()]

    def __call__(self, out: Any) -> torch.Tensor:
        logits = _token_logits(out)
        b, length, vocab = logits.shape
        if not -length <= self.position < length:
            raise HookscopeError(f"position={self.position} is out of range for {length} positions; pass one "
                                 f"from {-length} to {length - 1}")
        ids = _fit(self.token_id.to(logits.device), b, "token ids")
        bad = (ids >= vocab).nonzero()
        if len(bad):
            i = int(bad[0, 0])
            raise HookscopeError(f"token id {int(ids[i])} (sample {i}) is out of range: the model's vocabulary has "
                                 f"{vocab} tokens (0 to {vocab - 1})")
        return logits[:, self.position].gather(1, ids.unsqueeze(1)).squeeze(1)

    def take(self, rows: torch.Tensor) -> Token:
        """The target for the samples ``rows``: their own token ids."""
        return self if self.shared else Token(_take(self.token_id, rows, "token ids"), self.position)

    def __repr__(self) -> str:
        return f"Token({self.token_ids}, position={self.position})"
