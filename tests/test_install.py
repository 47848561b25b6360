"""The versions hookscope claims (docs/install.md): every floor in pyproject.toml is the pin of
constraints-oldest.txt, the oldest release scripts/test-oldest installs and tests, and a torch below the
floor already on the path is refused at import in one line naming the floor and the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", spec).lower()


def _floors() -> dict[str, set[str]]:
    """Each package's floors over the dependencies and every extra (``name>=x`` and ``name[extra]>=x``)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    floors: dict[str, set[str]] = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([0-9][0-9.]*)", spec.replace(" ", ""))
        if m:
            floors.setdefault(_name(m[1]), set()).add(m[2])
    return floors


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_name(name)] = version
    return pins


RUNTIME = ("torch", "numpy", "torchvision", "matplotlib", "pillow", "safetensors", "transformers", "timm", "pandas")


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:  # 2.13 and 2.13.0 are one release
        parts.pop()
    return tuple(parts)


def test_each_floor_is_the_oldest_version_tested() -> None:
    floors, pins = _floors(), _pins()
    for name in RUNTIME:
        assert name in pins and name in floors, f"{name}: pinned {pins.get(name)}, floors {floors.get(name)}"
        assert {_release(v) for v in floors[name]} == {_release(pins[name])}, \
            f"pyproject.toml's floors for {name}: {sorted(floors[name])}, tested {pins[name]}"


def test_a_torch_below_the_floor_is_refused_at_import_in_one_line() -> None:
    (floor,) = _floors()["torch"]
    major, minor = (int(p) for p in floor.split(".")[:2])
    below = [f"{major}.{minor - 1}.9", f"{major}.9.1", "1.13.1+cu117"]  # 2.9 sorts after 2.13 as text
    above = [f"{major}.{minor}.0", f"{major}.{minor}.0+cpu", f"{major}.{minor + 1}.0a0+git1234", f"{major + 1}.0.0"]
    # its own process: a second import of hookscope here would make new classes under the other tests
    script = textwrap.dedent(f"""
        import sys, torch
        for version in {below + above!r}:
            torch.__version__ = version
            try:
                import hookscope
            except ImportError as e:
                print(e)
            else:
                print("imported", hookscope.__version__)
            for name in [n for n in sys.modules if n.split(".")[0] == "hookscope"]:
                del sys.modules[name]
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])})
    assert out.returncode == 0, out.stderr
    mine = __import__("hookscope").__version__
    assert out.stdout.splitlines() == (
        [f"hookscope needs torch >= {floor}, found {v}: pip install -U 'torch>={floor}'" for v in below]
        + [f"imported {mine}"] * len(above))
