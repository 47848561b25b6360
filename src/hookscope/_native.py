"""The optional C kernel behind the CPU statistics: one memory pass for sum, sum of squares, min,
max and zeros, where torch needs four or five (``_native_stats.c``); and behind guided
backpropagation's ReLU rule, one pass where torch needs two. Large tensors are shared with torch's
own OpenMP worker threads (the C file says why not threads of its own).

It is built when hookscope is installed (``setup.py``: ``pip install .`` or ``pip install -e .``
with a C compiler present) into the extension files ``_native_lib/_native_stats`` and, on x86-64,
``_native_lib/_native_stats_avx2`` (taken where torch found AVX2 or AVX-512 on this CPU), loaded with
:mod:`ctypes`, and checked against known answers before it is used. Where it was not built (no
compiler at install time, Windows), when anything fails, or with ``HOOKSCOPE_NATIVE=0`` in the
environment, :func:`stats_kernel` returns ``None`` and the statistics are taken with torch
operations instead (the same rows within float32 rounding, 2.5 to 4 times the time), and so is the
guided rule (the same values). :func:`describe` says which one this process uses.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from importlib.machinery import EXTENSION_SUFFIXES

import torch

__all__ = ["Kernel", "describe", "stats_kernel"]

_EXTENSIONS = ("_native_stats_avx2", "_native_stats")  # the wider vectors first, where the CPU has them
_ABI = 2  # hs_abi() of the _native_stats.c this module calls
_lock = threading.Lock()
_loaded: list[Kernel | None] = []  # empty until the first attempt; then the kernel or None
_why: list[str] = []  # why there is no kernel, once the attempt failed


class Kernel:
    """The loaded kernel. Each method takes a 1-D contiguous float32 or float64 CPU tensor."""

    def __init__(self, lib: ctypes.CDLL, name: str = "") -> None:
        self.name = name  # the extension's module name: _native_stats or _native_stats_avx2
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
        self._squares = lib.hs_squares
        self._squares.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                  ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        self._squares.restype = ctypes.c_int
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

    def squares(self, v: torch.Tensor, *, minus: torch.Tensor | None = None, into: torch.Tensor | None = None) -> float | None:
        """The sum of squares of ``v`` (of ``v - minus``, each difference in ``v``'s precision, as
        torch's ``sub`` rounds it), summed as :meth:`stats` sums squares, in one pass, copying ``v``
        into ``into`` on the way. ``None`` unless every tensor given is a
        dense CPU float32 or float64 tensor of ``v``'s dtype, shape and strides.

        Example:
            >>> k = stats_kernel()
            >>> copy = torch.zeros(2)
            >>> k is None or (k.squares(torch.tensor([3.0, 4.0]), into=copy), copy.tolist()) == (25.0, [3.0, 4.0])
            True
            >>> k is None or k.squares(torch.tensor([3.0, 4.0]), minus=torch.tensor([2.0, 2.0])) == 5.0
            True
        """
        if not all(_dense_pair(v, t) for t in (minus, into) if t is not None) or not _dense_pair(v, v):
            return None
        out = (ctypes.c_double * 8)()
        if self._squares(v.data_ptr(), None if minus is None else minus.data_ptr(), None if into is None else into.data_ptr(),
                         v.element_size() == 8, v.numel(), self._threads(v.numel()), out):
            raise MemoryError("hookscope's statistics kernel could not allocate its partial sums")
        return out[1]

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
    """The kernel, loaded on the first call; ``None`` if it is switched off (``HOOKSCOPE_NATIVE=0``,
    or ``off``, ``false``, ``no``) or was not built when hookscope was installed.

    Example:
        >>> stats_kernel() is None or isinstance(stats_kernel(), Kernel)
        True
    """
    if _switched_off():
        return None
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def describe() -> str:
    """Which way this process takes the CPU statistics, in one line (``hookscope --version`` and
    ``Trace.notes`` print it).

    Example:
        >>> describe().startswith(("C kernel", "torch operations"))
        True
    """
    if _switched_off():
        return f"torch operations (HOOKSCOPE_NATIVE={os.environ['HOOKSCOPE_NATIVE'].strip()})"
    kernel = stats_kernel()
    if kernel is None:
        return f"torch operations ({_why[0] if _why else 'the C kernel is not available'})"
    threads = f"{torch.get_num_threads()} threads shared with torch" if kernel.parallel else "1 thread"
    return f"C kernel ({kernel.name}, {threads})"


def _switched_off() -> bool:
    """``HOOKSCOPE_NATIVE`` says off: ``0``, ``off``, ``false`` or ``no`` (any case)."""
    return os.environ.get("HOOKSCOPE_NATIVE", "").strip().lower() in ("0", "off", "false", "no")


def _load() -> Kernel | None:
    found = _libraries()
    if not found:
        _why.append("the C kernel was not built when hookscope was installed: reinstall it where a C "
                    "compiler is found (pip install . or pip install -e .)")
    for path, name in found:
        try:
            lib = ctypes.CDLL(path)
            if _abi(lib) != _ABI:
                _why.append(f"the C kernel {path} was built from another version of _native_stats.c: install "
                            "hookscope again to rebuild it")
                continue
            kernel = Kernel(lib, name)
        except (OSError, AttributeError, ValueError) as e:
            _why.append(f"the C kernel {path} could not be loaded: {e}")
            continue
        if _answers_right(kernel):
            return kernel
        _why.append(f"the C kernel {path} gave a wrong answer on a known case and is not used")
    return None


def _abi(lib: ctypes.CDLL) -> int | None:
    """The library's ``hs_abi()``; ``None`` for one built before there was one."""
    fn = getattr(lib, "hs_abi", None)
    if fn is None:
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return int(fn())


def _libraries() -> list[tuple[str, str]]:
    """The files of the extensions built for this CPU (in ``_native_lib/`` beside this module), best
    first, each with its name."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native_lib")
    found = []
    for name in _EXTENSIONS:
        if name.endswith("_avx2") and not (x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")):
            continue
        for suffix in EXTENSION_SUFFIXES:  # what setuptools named it: .cpython-311-x86_64-linux-gnu.so, ...
            path = os.path.join(folder, name + suffix)
            if os.path.isfile(path):
                found.append((path, name))
                break
    return found


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
        copy, shifted = torch.zeros_like(v), v.roll(1)
        if kernel.squares(v, into=copy) != squares or not torch.equal(copy, v):
            return False
        if kernel.squares(v, minus=shifted) != sum((a - b) ** 2 for a, b in zip(values, shifted.tolist())):
            return False
        g = kernel.guided(v, v.roll(1))
        if g is None or not torch.equal(g, torch.ops.aten.threshold_backward(v, v.roll(1), 0).clamp_(min=0)):
            return False
    return True
