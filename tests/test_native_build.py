"""hookscope's C statistics kernel as installed: built by setup.py at install time (never failing the
install), found among the package's files, and told apart from the torch fallback (``describe``,
``hookscope --version``) wherever it is missing, does not load, or is switched off."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import hookscope
import hookscope._native as native
from hookscope.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _build(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    """``setup.py build_ext`` into ``tmp_path``, as ``pip install`` runs it; the libraries it made."""
    lib = tmp_path / "lib"
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(lib),
                           "--build-temp", str(tmp_path / "temp")], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    return done, sorted(lib.glob("hookscope/_native_lib/_native_stats*"))


def test_a_build_without_a_compiler_goes_on_without_the_kernel(tmp_path: Path) -> None:
    done, made = _build(tmp_path, {"CC": str(tmp_path / "no-such-compiler")})
    assert done.returncode == 0, done.stderr
    assert made == []
    assert "hookscope: the C statistics kernel was not built" in done.stderr


@pytest.mark.skipif(shutil.which("cc") is None and not os.environ.get("CI"), reason="no C compiler here")
def test_the_build_makes_kernels_that_answer_right(tmp_path: Path) -> None:
    done, made = _build(tmp_path, {})
    assert done.returncode == 0, done.stderr
    names = sorted(p.name.split(".")[0] for p in made)
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert names == (["_native_stats", "_native_stats_avx2"] if x86 else ["_native_stats"])
    for path in made:
        if path.name.startswith("_native_stats_avx2") and torch.backends.cpu.get_cpu_capability() not in (
                "AVX2", "AVX512"):
            continue  # built for CPUs that have it; this one would not run it
        assert native._answers_right(native.Kernel(ctypes.CDLL(str(path)), path.name))


def _fresh(code: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a new interpreter (the kernel is loaded once per process)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_the_built_kernel_the_statistics_fall_back() -> None:
    out = _fresh("""
        import torch, hookscope, hookscope._native as n
        n._EXTENSIONS = ("_native_stats_never_built",)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        with torch.no_grad():
            net[0].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, -1, 0, 0], [0, 0, 2, 0], [0, 0, 0, 3]]))
            net[0].bias.zero_()
        with hookscope.trace(net) as t:
            net(torch.ones(2, 4))
        print(n.stats_kernel() is None, len(t.rows), t.rows[-1].min, t.rows[-1].max, t.notes[0])
    """)
    assert out.startswith("True 4 0.0 3.0 CPU statistics: torch operations (the C kernel was not built when "
                          "hookscope was installed: reinstall it where a C compiler is found")


def _reload(monkeypatch: pytest.MonkeyPatch, found: list[tuple[str, str]]) -> None:
    monkeypatch.delenv("HOOKSCOPE_NATIVE", raising=False)
    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.setattr(native, "_why", [])
    monkeypatch.setattr(native, "_libraries", lambda: found)


def test_a_library_that_does_not_load_is_passed_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    junk = tmp_path / "_native_stats_avx2.so"
    junk.write_bytes(b"not a shared library")
    _reload(monkeypatch, [(str(junk), "_native_stats_avx2")])
    assert native.stats_kernel() is None
    assert native.describe().startswith(f"torch operations (the C kernel {junk} could not be loaded: ")


def test_the_next_library_is_taken_when_the_first_does_not_load(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    good = native._libraries()
    if not good:
        pytest.skip("the statistics kernel was not built with this install")
    junk = tmp_path / "_native_stats_avx2.so"
    junk.write_bytes(b"")
    _reload(monkeypatch, [(str(junk), "_native_stats_avx2"), good[-1]])
    kernel = native.stats_kernel()
    assert kernel is not None and kernel.name == good[-1][1]
    assert native.describe().startswith(f"C kernel ({good[-1][1]}, ")


def test_describe_says_which_way_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_NATIVE", "0")
    assert native.describe() == "torch operations (HOOKSCOPE_NATIVE=0)"
    monkeypatch.delenv("HOOKSCOPE_NATIVE")
    kernel = native.stats_kernel()
    if kernel is None:
        assert native.describe().startswith("torch operations (")
    else:
        threads = f"{torch.get_num_threads()} threads shared with torch" if kernel.parallel else "1 thread"
        assert native.describe() == f"C kernel ({kernel.name}, {threads})"


@pytest.mark.parametrize("switch", ["0", None])
def test_version_says_how_the_cpu_statistics_are_computed(switch: str | None, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    if switch is None:
        monkeypatch.delenv("HOOKSCOPE_NATIVE", raising=False)
    else:
        monkeypatch.setenv("HOOKSCOPE_NATIVE", switch)
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"hookscope {hookscope.__version__}\nCPU statistics: {native.describe()}\n"
    if switch == "0":
        assert native.describe() == "torch operations (HOOKSCOPE_NATIVE=0)"


def test_the_installed_kernel_is_the_widest_this_cpu_runs() -> None:
    kernel = native.stats_kernel()
    if kernel is None:
        pytest.skip("the statistics kernel was not built with this install")
    wide = platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2", "AVX512")
    built = {name for _, name in native._libraries()}
    assert kernel.name == ("_native_stats_avx2" if wide and "_native_stats_avx2" in built else "_native_stats")


@pytest.mark.parametrize("value", ["0", "off", "false", "no", "OFF", " 0 "])
def test_every_usual_way_of_saying_off_switches_the_kernel_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_NATIVE", value)
    assert native.stats_kernel() is None
    assert native.describe() == f"torch operations (HOOKSCOPE_NATIVE={value.strip()})"


@pytest.mark.parametrize("value", ["", "1", "on", "yes"])
def test_other_values_leave_the_kernel_on(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_NATIVE", value)
    monkeypatch.delenv("HOOKSCOPE_NATIVE")
    built = native.stats_kernel()
    monkeypatch.setenv("HOOKSCOPE_NATIVE", value)
    assert (native.stats_kernel() is None) == (built is None)


@pytest.mark.skipif(shutil.which("cc") is None and not os.environ.get("CI"), reason="no C compiler here")
def test_a_library_built_from_another_version_of_the_source_is_not_used(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    # an editable install whose C source moved on without a rebuild: its functions may take other
    # arguments, so it must not be called at all
    source = (ROOT / "src/hookscope/_native_stats.c").read_text()
    assert "#define HS_ABI " in source
    old = tmp_path / "old.c"
    old.write_text(source.replace("#define HS_ABI ", "#define HS_ABI 1000 + "))
    lib = tmp_path / "_native_stats.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", str(old), "-o", str(lib)], check=True, timeout=120)
    _reload(monkeypatch, [(str(lib), "_native_stats")])
    assert native.stats_kernel() is None
    assert native.describe() == (f"torch operations (the C kernel {lib} was built from another version of "
                                 "_native_stats.c: install hookscope again to rebuild it)")
