"""The data ``hookscope extract`` reads from files: image files and folders, ``.pt`` tensor files and
``.npy`` arrays, as map-style datasets that read one sample at a time (memory stays bounded).

Images are read with the model's preset (``--preset``, ``--size``) in ``__getitem__``; a picture that
cannot be read raises :class:`~hookscope.errors.HookscopeError` there, and the engine stops or skips it
(``--skip-unreadable``). ``.pt`` files are read with ``torch.load(weights_only=True)`` (memory-mapped where
the format allows) and ``.npy`` files with ``np.load(mmap_mode="r", allow_pickle=False)``: no user file is
ever unpickled. Several paths of one kind are concatenated in the order given.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ...core.text import first_line, shape_text
from ...errors import HookscopeError
from ._images import IMAGE_SUFFIXES, ImageTransform, read_image

__all__ = ["DATA_KINDS", "ArrayFiles", "FileData", "ImageFiles", "TensorFiles", "data_kind", "file_data", "kind_of",
           "image_paths"]

DATA_KINDS = ("images", "pt", "npy")
_PT_SUFFIXES = (".pt", ".pth")
_HOW = "give image files or folders, .pt files (a tensor or a dict of tensors) or .npy files"


def data_kind(path: str) -> str:
    """What one ``--data`` path is: ``images`` (an image file or a folder), ``pt`` or ``npy``.

    Example:
        >>> import tempfile
        >>> data_kind(tempfile.mkdtemp()), data_kind("x.npy"), data_kind("a/b.PNG")
        ('images', 'npy', 'images')
        >>> data_kind("notes.txt")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --data notes.txt is not an image, .pt or .npy file; give image files or folders, .pt files (a tensor or a dict of tensors) or .npy files
    """
    low = path.lower()
    if os.path.isdir(path) or low.endswith(IMAGE_SUFFIXES):
        return "images"
    if low.endswith(_PT_SUFFIXES):
        return "pt"
    if low.endswith(".npy"):
        return "npy"
    raise HookscopeError(f"--data {path} is not an image, .pt or .npy file; {_HOW}")


def image_paths(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Every image file of ``paths`` (folders searched recursively, in name order; hidden files skipped)
    and its id: the path relative to the folder given, or the file's path as given.

    Example:
        >>> import os, tempfile
        >>> top = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(top, "cat"))
        >>> for name in ("cat/b.png", "a.jpg", ".hidden.png", "notes.txt"):
        ...     _ = open(os.path.join(top, name), "w").write("x")
        >>> image_paths([top])[1]
        ['a.jpg', 'cat/b.png']
    """
    files: list[str] = []
    ids: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            ids.append(path)
            continue
        found = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(folder, n) for n in names if n.lower().endswith(IMAGE_SUFFIXES)
                      and not n.startswith(".")]
        if not found:
            raise HookscopeError(f"--data {path} holds no image file ({', '.join(IMAGE_SUFFIXES[:3])}, ...); {_HOW}")
        found.sort(key=lambda f: os.path.relpath(f, path).split(os.sep))
        files += found
        ids += [os.path.relpath(f, path).replace(os.sep, "/") for f in found]
    return files, ids


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Floating-point samples in the model's floating dtype; integers (token ids) as they are."""
    return t.to(dtype) if dtype is not None and t.is_floating_point() and t.dtype != dtype else t


class ImageFiles(Dataset[torch.Tensor]):
    """Image files read one per sample: 3 x H x W, resized and normalised by ``preset``.

    ``size`` is the H x W every picture must have when the preset keeps each image's own size (the
    first readable image's); a file that cannot be read, or of another size, raises HookscopeError.

    Example:
        >>> import os, tempfile
        >>> from PIL import Image
        >>> path = os.path.join(tempfile.mkdtemp(), "red.png")
        >>> Image.new("RGB", (8, 6), (255, 0, 0)).save(path)
        >>> ImageFiles([path], ImageTransform("demo", (4, 4)))[0][:, 0, 0].tolist()
        [1.0, 0.0, 0.0]
    """

    def __init__(self, paths: Sequence[str], preset: ImageTransform, dtype: torch.dtype | None = None) -> None:
        self.paths = list(paths)
        self.preset = preset
        self.dtype = dtype
        self.size: tuple[int, int] | None = preset.size
        for path in self.paths if self.size is None else ():  # each image's own size: they must agree
            try:
                shape = read_image(path).shape
            except HookscopeError:
                continue
            self.size = (int(shape[-2]), int(shape[-1]))
            break

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        path = self.paths[i]
        x = self.preset(read_image(path))
        if self.size is not None and tuple(x.shape[-2:]) != self.size:
            h, w = self.size
            raise HookscopeError(f"image {path} is {x.shape[-2]}x{x.shape[-1]}, the others {h}x{w}, and "
                                 "the model's input size is unknown; give --size HxW")
        return _cast(x, self.dtype)


def _npy(path: str) -> np.ndarray:
    try:
        held = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e) or "Python objects" in str(e):
            raise HookscopeError(f"--data {path} holds Python objects (a pickle), which hookscope does not load; "
                                 "save plain arrays with np.save") from None
        raise HookscopeError(f"cannot read --data {path}: {first_line(e)}; save an array with np.save") from None
    except OSError as e:
        raise HookscopeError(f"cannot read --data {path}: {e.strerror or first_line(e)}") from None
    if not isinstance(held, np.ndarray) or held.ndim == 0:
        raise HookscopeError(f"--data {path} holds a single number, not samples; save an array N x ... with np.save")
    return held


def _same_rows(path: str, shape: tuple[int, ...], dtype: Any, first: tuple[str, tuple[int, ...], Any]) -> None:
    """Files concatenated must hold rows of one shape and dtype."""
    name, shape0, dtype0 = first
    if shape[1:] != shape0[1:] or dtype != dtype0:
        raise HookscopeError(f"--data {path} holds {dtype} rows of shape {shape_text(shape[1:])} but {name} holds "
                             f"{dtype0} rows of {shape_text(shape0[1:])}; give files whose rows agree")


class _Rows(Dataset[Any]):
    """Rows of several files, concatenated: ``starts[k]`` is the first row of file ``k``."""

    def __init__(self, counts: Sequence[int], limit: int | None) -> None:
        self.starts = [0]
        for n in counts:
            self.starts.append(self.starts[-1] + n)
        self.length = self.starts[-1] if limit is None else min(limit, self.starts[-1])

    def __len__(self) -> int:
        return self.length

    def locate(self, i: int) -> tuple[int, int]:
        """(file, row in it) of sample ``i``."""
        if not 0 <= i < self.length:
            raise IndexError(f"sample {i} out of range for {self.length} samples")
        k = bisect.bisect_right(self.starts, i) - 1
        return k, i - self.starts[k]


class ArrayFiles(_Rows):
    """``.npy`` files whose rows are samples, memory-mapped (each process opens its own maps).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.arange(6, dtype=np.float64).reshape(3, 2))
        >>> data = ArrayFiles([path], dtype=torch.float32)
        >>> len(data), data[2]
        (3, tensor([4., 5.]))
    """

    def __init__(self, paths: Sequence[str], dtype: torch.dtype | None = None, limit: int | None = None) -> None:
        self.paths = list(paths)
        self.dtype = dtype
        shapes: list[tuple[tuple[int, ...], Any]] = []
        for path in self.paths:
            held = _npy(path)
            if shapes:
                _same_rows(path, held.shape, held.dtype, (self.paths[0], shapes[0][0], shapes[0][1]))
            shapes.append((held.shape, held.dtype))
        super().__init__([s[0][0] for s in shapes], limit)
        self._maps: list[np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:  # a worker opens its own maps, never a pickled copy of the data
        return {**self.__dict__, "_maps": None}

    def __getitem__(self, i: int) -> torch.Tensor:
        k, row = self.locate(i)
        if self._maps is None:
            self._maps = [_npy(p) for p in self.paths]
        return _cast(torch.from_numpy(np.array(self._maps[k][row])), self.dtype)


def _load_pt(path: str) -> Any:
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:  # the legacy (non-zip) format cannot be memory-mapped: read it whole
            if "mmap" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise HookscopeError(f"cannot read --data {path}: {e.strerror or first_line(e)}") from None
    except Exception as e:  # pickled objects torch refuses to rebuild without running them, or a corrupt file
        raise HookscopeError(f"--data {path} cannot be read without unpickling ({type(e).__name__}: {first_line(e)}); "
                             "save a tensor N x ... or a dict of tensors with torch.save") from None


def _pt_rows(path: str, held: Any) -> dict[str, torch.Tensor] | torch.Tensor:
    """What a .pt file holds: a tensor of rows, or a dict of keyword tensors with as many rows each."""
    how = "save a tensor N x ... or a dict {keyword: N x ... tensor} with torch.save"
    if isinstance(held, torch.Tensor):
        if held.dim() == 0:
            raise HookscopeError(f"--data {path} holds a single number, not samples; {how}")
        return held
    if not isinstance(held, dict) or not held or not all(isinstance(v, torch.Tensor) for v in held.values()):
        raise HookscopeError(f"--data {path} holds a {type(held).__name__}, not a tensor or a dict of tensors; {how}")
    lengths = {k: (len(v) if v.dim() else 0) for k, v in held.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        said = ", ".join(f"{k}: {n}" for k, n in lengths.items())
        raise HookscopeError(f"--data {path}: the tensors of the dict hold different numbers of rows ({said}); {how}")
    return {str(k): v for k, v in held.items()}


class TensorFiles(_Rows):
    """``.pt`` files: a tensor whose rows are samples, or a dict of keyword tensors (a sample is a dict).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.pt")
        >>> torch.save({"input_ids": torch.arange(6).reshape(3, 2)}, path)
        >>> TensorFiles([path])[1]
        {'input_ids': tensor([2, 3])}
    """

    def __init__(self, paths: Sequence[str], dtype: torch.dtype | None = None, limit: int | None = None) -> None:
        self.paths = list(paths)
        self.dtype = dtype
        self.held = [_pt_rows(p, _load_pt(p)) for p in self.paths]
        for path, rows in zip(self.paths[1:], self.held[1:]):
            _same_kind(path, rows, self.paths[0], self.held[0])
        super().__init__([len(next(iter(r.values()))) if isinstance(r, dict) else len(r) for r in self.held], limit)

    def __getitem__(self, i: int) -> torch.Tensor | dict[str, torch.Tensor]:
        k, row = self.locate(i)
        rows = self.held[k]
        if isinstance(rows, dict):
            return {key: _cast(t[row], self.dtype) for key, t in rows.items()}
        return _cast(rows[row], self.dtype)


def _said(rows: dict[str, torch.Tensor] | torch.Tensor) -> str:
    return f"keys {', '.join(rows)}" if isinstance(rows, dict) else "a tensor"


def _same_kind(path: str, rows: dict[str, torch.Tensor] | torch.Tensor, path0: str,
               rows0: dict[str, torch.Tensor] | torch.Tensor) -> None:
    if isinstance(rows, dict) != isinstance(rows0, dict) or (isinstance(rows, dict) and isinstance(rows0, dict)
                                                             and list(rows) != list(rows0)):
        raise HookscopeError(f"--data {path} holds {_said(rows)} but {path0} holds {_said(rows0)}; give files that "
                             "hold the same")
    pairs = [(rows[k], rows0[k]) for k in rows] if isinstance(rows, dict) and isinstance(rows0, dict) else [
        (rows, rows0)]
    for t, t0 in pairs:
        assert isinstance(t, torch.Tensor) and isinstance(t0, torch.Tensor)
        _same_rows(path, tuple(t.shape), t.dtype, (path0, tuple(t0.shape), t0.dtype))


@dataclass
class FileData:
    """What ``--data`` names: the dataset, each sample's id, and what the manifest says of it.

    Example:
        >>> FileData(TensorFiles.__new__(TensorFiles), [], "pt", ["x.pt"]).describe()["data"]
        {'paths': ['x.pt'], 'kind': 'pt'}
    """

    dataset: Dataset[Any]
    ids: list[str]
    kind: str
    paths: list[str]
    preset: ImageTransform | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``data`` and ``preprocessing`` entries (preprocessing: images only)."""
        p = self.preset
        pre = None if p is None else {"preset": p.name, "size": None if p.size is None else list(p.size),
                                      "resize": p.resize, "mean": None if p.mean is None else list(p.mean),
                                      "std": None if p.std is None else list(p.std), "mode": p.mode,
                                      "library": p.library}
        return {"data": {"paths": list(self.paths), "kind": self.kind, **self.extra}, "preprocessing": pre}


def kind_of(paths: Sequence[str]) -> str:
    """The one kind of data every ``--data`` path is (:func:`data_kind`), or a one-line error.

    Example:
        >>> kind_of(["no/such.npy"])
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --data no/such.npy: no such file or folder
    """
    if not paths:
        raise HookscopeError(f"--data needs at least one path; {_HOW}")
    for path in paths:
        if not os.path.exists(path):
            raise HookscopeError(f"--data {path}: no such file or folder")
    kinds = {p: data_kind(p) for p in paths}
    if len(set(kinds.values())) > 1:
        a, b = list(dict.fromkeys(kinds.values()))[:2]
        pa, pb = (next(p for p, k in kinds.items() if k == kind) for kind in (a, b))
        raise HookscopeError(f"--data mixes {a} ({pa}) and {b} ({pb}); give paths of one kind per run")
    return next(iter(kinds.values()))


def file_data(paths: Sequence[str], *, preset: ImageTransform | None = None, dtype: torch.dtype | None = None,
              limit: int | None = None) -> FileData:
    """The dataset ``--data paths`` names (images with ``preset``; floating-point samples in ``dtype``), the
    first ``limit`` samples only when given.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.zeros((5, 2), dtype=np.float32))
        >>> found = file_data([path], limit=3)
        >>> len(found.dataset), found.ids[-1] == path + "[2]"
        (3, True)
    """
    if limit is not None and limit < 1:
        raise HookscopeError(f"--limit {limit} must be at least 1 sample")
    kind = kind_of(paths)
    if kind == "images":
        files, ids = image_paths(paths)
        files, ids = files[:limit], ids[:limit]
        preset = preset if preset is not None else ImageTransform("none")
        return FileData(ImageFiles(files, preset, dtype), ids, kind, list(paths), preset)
    rows: _Rows = TensorFiles(paths, dtype, limit) if kind == "pt" else ArrayFiles(paths, dtype, limit)
    ids = [f"{path}[{i}]" for k, path in enumerate(paths) for i in range(rows.starts[k + 1] - rows.starts[k])]
    return FileData(rows, ids[:len(rows)], kind, list(paths))
