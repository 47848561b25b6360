"""hookscope's optional C statistics kernel, built at install time (``pip install .`` or ``-e .``).

Everything else is in pyproject.toml. ``_native_stats.c`` is built twice where the machine is
x86-64: a baseline build (SSE2 vectors) and one with AVX2 and FMA; at run time ``hookscope._native``
loads the AVX2 one only on a CPU torch itself finds AVX2 on. They go into ``hookscope/_native_lib/``,
a folder that is not a package: they are shared libraries loaded with ctypes, not Python modules,
and nothing that lists the package's modules should take them for some. Without a working C compiler, on
Windows (the kernel needs GCC or Clang vector extensions), or when a build fails, the install goes on
without the kernel and hookscope computes the same statistics with torch operations.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = "src/hookscope/_native_stats.c"
FLAGS = ["-O3", "-fno-fast-math"]


def extensions() -> list[Extension]:
    if sys.platform.startswith("win"):
        return []
    found = [Extension("hookscope._native_lib._native_stats", [SOURCE], optional=True,
                       define_macros=[("HS_VBYTES", "16")], extra_compile_args=FLAGS)]
    if platform.machine().lower() in ("x86_64", "amd64"):
        found.append(Extension("hookscope._native_lib._native_stats_avx2", [SOURCE], optional=True,
                               define_macros=[("HS_VBYTES", "32")],
                               extra_compile_args=[*FLAGS, "-mavx2", "-mfma"]))
    return found


class OptionalBuildExt(build_ext):
    """``build_ext`` that never fails the install: a kernel that cannot be built is left out."""

    def run(self) -> None:
        try:
            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:  # _native_lib is not a package: nothing else makes its folder
                os.makedirs(build_py.get_package_dir(ext.name.rpartition(".")[0]), exist_ok=True)
            super().run()
        except Exception as e:  # no compiler at all, a broken toolchain: the torch fallback takes over
            self._skipped(e)

    def build_extension(self, ext: Any) -> None:
        try:
            os.makedirs(os.path.dirname(self.get_ext_fullpath(ext.name)), exist_ok=True)
            super().build_extension(ext)
        except Exception as e:
            self._skipped(e)

    def _skipped(self, e: BaseException) -> None:
        print(f"hookscope: the C statistics kernel was not built ({type(e).__name__}: {e}); the statistics "
              "will be computed with torch operations (the same values, slower)", file=sys.stderr)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
