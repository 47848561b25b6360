"""The documentation runs as written: every module's docstring examples, every code block of the README
and of every page under docs/, and every example in every command's ``--help``, each from an empty
folder, offline (no weights downloaded: torch's hub cache is an empty folder)."""

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import hookscope
from doc_blocks import RUN, SHOWN, blocks, check_line, help_examples, help_text, shell_lines
from hookscope.cli import COMMAND_NAMES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(hookscope.__path__, "hookscope.")
    if not m.name.endswith("__main__")
)


def _has_examples(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None and ">>>" in Path(spec.origin).read_text()


@pytest.mark.parametrize("name", ["hookscope", *MODULES])
def test_docstring_examples(name):
    if not _has_examples(name):
        return
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has examples, but doctest ran none of them"
    assert result.failed == 0


def test_every_module_is_found():
    assert "hookscope.core.guard" in MODULES and "hookscope.analysis.diff" in MODULES
    assert len(MODULES) >= 30


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    """An empty current folder, no network, an empty hub cache and no figure windows."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "80")
    return work


def run_page(path: Path) -> dict:
    """Run a Markdown page's blocks in order: its Python blocks in one fresh namespace, its shell lines
    in this process; every block of another language must be one that is only shown."""
    scope: dict = {"__name__": "__main__"}
    found = blocks(path.read_text())
    for block in found:
        assert block.lang in RUN + SHOWN, (
            f"{path.name}:{block.line}: a ```{block.lang} block; use python or bash (run by the tests), "
            "text (output) or shell (set-up commands, not run)")
        if block.lang == "python":
            code = "\n" * (block.line - 1) + block.code  # tracebacks give the line in the page
            exec(compile(code, str(path), "exec"), scope)  # noqa: S102 - our own documentation
        elif block.lang == "bash":
            for line in shell_lines(block.code):
                check_line(line)
    return scope


@pytest.mark.parametrize("page", PAGES)
def test_docs_page_blocks_run(page, empty_folder):
    run_page(DOCS / page)


def test_readme_blocks_run(empty_folder):
    scope = run_page(ROOT / "README.md")
    assert scope["rec"]["layer1.0.bn2"].output.min() < 0  # the true values, under the in-place trap
    assert scope["g"]["a"].original.item() == 6.0 and scope["w"].grad.item() == 9.0
    assert scope["cams"].maps.shape == (8, 64, 64) and scope["hits"].float().mean() > 0.5
    assert sum(p.numel() for p in scope["slim"].parameters()) == 36_462


def test_readme_set_up_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    try_it = ('python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e ".[all]" '
              "&& .venv/bin/hookscope demo")
    test = re.search(r"^(python3 -m venv .*pytest)(?: \|\| exit 1)?$", ci, flags=re.M)  # CI stops at its failure
    assert test is not None and try_it in readme and test.group(1) in readme
    assert readme.count("\n") <= 260, "the README is the front door: the rest goes under docs/"


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_help_examples_run(command, empty_folder):
    """Each example of ``hookscope COMMAND --help`` runs as printed, in order, in one empty folder (an
    example may read what an earlier one wrote)."""
    examples = help_examples(help_text(command))
    assert examples, f"hookscope {command} --help has no examples"
    for line in examples:
        check_line(line)


def test_api_reference_shows_every_public_name():
    """Each name of ``hookscope.__all__`` has its entry on a page of docs/reference/, by its public path
    (``hookscope.NAME``) or, where a module of that name is in the way, ``hookscope.NAME.NAME``."""
    shown = set(re.findall(r"^::: (hookscope[\w.]*)", "\n".join(
        p.read_text() for p in (DOCS / "reference").glob("*.md")), flags=re.M))
    missing = [n for n in hookscope.__all__ if not {f"hookscope.{n}", f"hookscope.{n}.{n}",
                                                    f"hookscope.capture.{n}", f"hookscope.edit.{n}",
                                                    f"hookscope.grads.{n}", f"hookscope.selection.{n}"} & shown]
    assert not missing, f"not on any API reference page: {missing}"


def test_every_page_is_in_the_nav():
    import yaml  # mkdocs' own dependency, in the docs extra

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # mkdocs' !!python tags, unused here
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    listed = set(re.findall(r"[\w/.-]+\.md", str(config["nav"])))
    assert set(PAGES) - listed == set(), "pages no one can reach from the navigation"
    assert listed - set(PAGES) == {"reference/cli.md"}  # written at build time by docs/hooks/cli_reference.py


def test_the_gallery_shows_every_cam_and_attribution_method():
    from hookscope.analysis.attribution import METHODS as ATTRIBUTION_METHODS
    from hookscope.analysis.cam import METHODS as CAM_METHODS

    page = (DOCS / "guide" / "gallery.md").read_text()
    for kind, methods in (("cam", CAM_METHODS), ("attribute", ATTRIBUTION_METHODS)):
        for m in methods:
            picture = f"../img/gallery_{kind}_{m.replace('+', 'p')}.png"
            assert f"]({picture})" in page, f"the gallery has no picture of {kind} method {m!r}"
            assert f'`method="{m}"`' in page.split(picture, 1)[1].split("###", 1)[0], f"no caption names {m!r}"


def test_every_picture_of_the_docs_is_there_small_and_shown():
    shown = set()
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.name} shows {target}, which is not there"
            assert path.stat().st_size < 200_000, f"{target} is over 200 KB"
            shown.add(path)
    drawn = {p.resolve() for p in (DOCS / "img").glob("*.png")}
    assert drawn and not drawn - shown, f"pictures no page shows: {sorted(p.name for p in drawn - shown)}"
    assert sum(p.stat().st_size for p in drawn) < 3_000_000
