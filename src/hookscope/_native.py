"""The optional C kernel behind the CPU statistics: one memory pass for sum, sum of squares, min,
max and zeros, where torch needs four or five (``_native_stats.c``); and behind guided
backpropagation's ReLU rule, one pass where torch needs two. Large tensors are shared with torch's
own OpenMP worker threads (the C file says why not threads of its own).

It is compiled once per machine with the system C compiler (``$CC``, else ``cc``, ``gcc`` or
``clang``; about 0.3 s) into a private cache folder (``$HOOKSCOPE_CACHE``, else
``$XDG_CACHE_HOME/hookscope`` or ``~/.cache/hookscope``), loaded with :mod:`ctypes`, and checked
against known answers before it is used. Without a compiler, on Windows, when anything fails, or
with ``HOOKSCOPE_NATIVE=0`` in the environment, :func:`stats_kernel` returns ``None`` and the
statistics are taken with torch operations instead (same rows, about 2.5x the time), and so is the
guided rule (the same values).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path

import torch

__all__ = ["Kernel", "stats_kernel"]

_SOURCE = "_native_stats.c"
_lock = threading.Lock()
_loaded: list[Kernel | None] = []  # empty until the first attempt; then the kernel or None


class Kernel:
    """The loaded kernel. Each method takes a 1-D contiguous float32 or float64 CPU tensor."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._stats, self._centred = lib.hs_stats, lib.hs_centred
        self._stats.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                ctypes.POINTER(ctypes.c_double)]
        self._centred.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double,
                                  ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        self._stats.restype = self._centred.restype = ctypes.c_int
        self._guided = lib.hs_guided
        self._guided.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_int]
        self._guided.restype = None
        self.parallel = _share_openmp(lib)

    def stats(self, v: torch.Tensor) -> tuple[float, float, float, float, int]:
        """``(sum, sum of squares, min, max, zeros)`` of ``v``, accumulated in float64.

        Example:
            >>> k = stats_kernel()
            >>> k is None or k.stats(torch.tensor([1.0, -2.0, 0.0, -0.0])) == (-1.0, 5.0, -2.0, 1.0, 2)
            True
        """
        out = self._run(v, relu=False)
        return out[0], out[1], out[2], out[3], int(out[4])

    def stats_relu(self, v: torch.Tensor) -> tuple[tuple[float, float, float, float, int], tuple[float, float, int]]:
        """:meth:`stats`, and ``(sum, sum of squares)`` of ``v.relu()`` with the count of negative
        values, from the same pass: for finite values, exactly what :meth:`stats` gives for the sum
        and sum of squares of ``v.relu()``, bit for bit.

        Example:
            >>> k = stats_kernel()
            >>> k is None or k.stats_relu(torch.tensor([1.0, -2.0, 0.0, 3.0]))[1] == (4.0, 10.0, 1)
            True
        """
        out = self._run(v, relu=True)
        return (out[0], out[1], out[2], out[3], int(out[4])), (out[5], out[6], int(out[7]))

    def _run(self, v: torch.Tensor, *, relu: bool) -> ctypes.Array[ctypes.c_double]:
        out = (ctypes.c_double * 8)()
        if self._stats(v.data_ptr(), v.element_size() == 8, v.numel(), self._threads(v.numel()), relu, out):
            raise MemoryError("hookscope's statistics kernel could not allocate its partial sums")
        return out

    def centred(self, v: torch.Tensor, mean: float) -> tuple[float, float]:
        """``(sum of (x - mean), sum of (x - mean)**2)`` of ``v``, in float64.

        Example:
            >>> k = stats_kernel()
            >>> k is None or k.centred(torch.tensor([1.0, 3.0]), 1.5) == (1.0, 2.5)
            True
        """
        out = (ctypes.c_double * 8)()
        if self._centred(v.data_ptr(), v.element_size() == 8, v.numel(), mean, self._threads(v.numel()), out):
            raise MemoryError("hookscope's statistics kernel could not allocate its partial sums")
        return out[0], out[1]

    def guided(self, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """Guided backpropagation through a ReLU in one memory pass: ``grad`` where the ReLU's output
        ``out`` is positive and ``grad`` is not negative, else 0 (what
        ``threshold_backward(grad, out, 0).clamp_(min=0)`` gives, in one pass where that takes two).
        ``None`` unless both are CPU float32 or float64 tensors of one dtype, shape and dense layout.

        Example:
            >>> k = stats_kernel()
            >>> k is None or k.guided(torch.tensor([1.0, 2.0, -3.0]), torch.tensor([0.0, 5.0, 1.0])).tolist()
            [0.0, 2.0, 0.0]
        """
        if not _dense_pair(grad, out):
            return None
        res = torch.empty_like(out)
        self._guided(grad.data_ptr(), out.data_ptr(), res.data_ptr(), out.element_size() == 8, out.numel(),
                     self._threads(out.numel()))
        return res

    def _threads(self, n: int) -> int:
        """torch's number of threads for more than one chunk (64 Ki elements) if the kernel shares
        torch's OpenMP workers; else 1. Two threads read what torch's two just wrote faster even at
        256 KB (resnet50 batch 8: 24-26 ms per forward instead of 28-29 with 1 Mi as the bound)."""
        return torch.get_num_threads() if self.parallel and n > 1 << 16 else 1


def _dense_pair(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two CPU tensors the guided kernel can read element by element in step: one floating dtype it
    knows, one shape, and one dense layout (contiguous, or channels-last, for both)."""
    if a.device.type != "cpu" or b.device.type != "cpu" or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype not in (torch.float32, torch.float64):
        return False
    if a.is_contiguous() and b.is_contiguous():
        return True
    return a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last) and b.is_contiguous(
        memory_format=torch.channels_last)


def _share_openmp(lib: ctypes.CDLL) -> bool:
    """Hand the kernel ``GOMP_parallel`` of the OpenMP runtime torch loaded (GNU's libgomp, or
    Intel's libiomp5, which provides the same entry), found among the libraries this process mapped:
    the one in torch's own folder, else the only one mapped. Opening the same path again returns the
    library already loaded, never a second runtime. False (the kernel stays on one thread) where there
    is no such runtime, several and none of them torch's, or no ``/proc/self/maps``."""
    runtime = _torch_openmp()
    if runtime is None:
        return False
    try:
        fn = ctypes.CDLL(runtime).GOMP_parallel
    except (OSError, AttributeError):
        return False
    lib.hs_use_openmp.argtypes = [ctypes.c_void_p]
    lib.hs_use_openmp(ctypes.cast(fn, ctypes.c_void_p))
    return True


def _torch_openmp() -> str | None:
    """The path of the OpenMP runtime torch uses, if this process mapped it (see :func:`_share_openmp`)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {fields[5] for fields in map(str.split, maps) if len(fields) >= 6}
    except OSError:
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith(("libgomp", "libiomp5")) and os.path.isfile(p))
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    own = [p for p in found if os.path.realpath(p).startswith(torch_dir)]
    if own:
        return own[0]
    return found[0] if len(found) == 1 else None


def stats_kernel() -> Kernel | None:
    """The kernel, built and loaded on the first call; ``None`` if it is switched off
    (``HOOKSCOPE_NATIVE=0``) or cannot be built here.

    Example:
        >>> stats_kernel() is None or isinstance(stats_kernel(), Kernel)
        True
    """
    if os.environ.get("HOOKSCOPE_NATIVE", "1") == "0":
        return None
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load() -> Kernel | None:
    try:
        lib = _build()
        kernel = Kernel(ctypes.CDLL(str(lib))) if lib is not None else None
    except (OSError, subprocess.SubprocessError, AttributeError, ValueError):
        return None
    return kernel if kernel is not None and _answers_right(kernel) else None


def _answers_right(kernel: Kernel) -> bool:
    """Check the kernel against answers known exactly (a miscompiled kernel is never used): the
    values are binary fractions whose every partial sum is exact in float32."""
    values = [3.0, -0.0, 0.5, -7.25, 0.0, 2.0, 1.0, -1.5, 4.0, 0.25, -3.0] * 41  # whole vectors and a tail
    total, squares = sum(values), sum(x * x for x in values)
    centred = (sum(x - 1.0 for x in values), sum((x - 1.0) ** 2 for x in values))
    relu = (sum(max(x, 0.0) for x in values), sum(max(x, 0.0) ** 2 for x in values), 123)
    for dtype in (torch.float32, torch.float64):
        v = torch.tensor(values, dtype=dtype)
        if kernel.stats(v) != (total, squares, -7.25, 4.0, 82) or kernel.centred(v, 1.0) != centred:
            return False
        if kernel.stats_relu(v) != ((total, squares, -7.25, 4.0, 82), relu):
            return False
        g = kernel.guided(v, v.roll(1))
        if g is None or not torch.equal(g, torch.ops.aten.threshold_backward(v, v.roll(1), 0).clamp_(min=0)):
            return False
    return True


def _flags() -> list[str]:
    """Compiler flags: AVX2 vectors where torch found AVX2 (or AVX-512) on this CPU."""
    flags = ["-O3", "-shared", "-fPIC", "-fno-fast-math"]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return [*flags, "-mavx2", "-mfma", "-DHS_VBYTES=32"]
    return [*flags, "-DHS_VBYTES=16"]


def _build() -> Path | None:
    """The compiled library, from the cache or compiled now; ``None`` without a compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or sys.platform.startswith("win"):
        return None
    source = resources.files("hookscope").joinpath(_SOURCE).read_bytes()
    flags = _flags()
    key = hashlib.sha256(b"\0".join([source, cc.encode(), " ".join(flags).encode(),
                                     platform.machine().encode(), sys.platform.encode()])).hexdigest()[:20]
    folder = _cache_folder()
    lib = folder / f"stats-{key}.so"
    if lib.is_file():
        return lib
    fd, tmp = tempfile.mkstemp(prefix="stats-", suffix=".c", dir=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(source)
    out = tmp[:-2] + ".so.part"
    try:
        subprocess.run([cc, *flags, tmp, "-o", out], check=True, capture_output=True, timeout=120)
        os.replace(out, lib)  # atomic: another process sees no library or the whole one
    finally:
        for leftover in (tmp, out):
            if os.path.exists(leftover):
                os.remove(leftover)
    return lib


def _cache_folder() -> Path:
    """A folder only this user can write to: the cache, or a fresh temporary one if the cache is
    not such a folder (then the kernel is compiled again in each process)."""
    base = os.environ.get("HOOKSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hookscope")
    folder = Path(base)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
        if st.st_uid == os.getuid() and not st.st_mode & 0o022:
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="hookscope-"))
