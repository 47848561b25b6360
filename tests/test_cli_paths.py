"""The paths commands write and read: what commands write never replaces what is not theirs, and what they read is read right."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import exited_pid
from torch import nn

import hookscope
from hookscope.cli import main
from hookscope.errors import HookscopeError
from hookscope.report import build_report, staged_folder
from hookscope.zoo import TinyResNet


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    from PIL import Image

    path = tmp_path / "in.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(path)
    return path


# --- outputs of cam and features ---------------------------------------------------------------------
@pytest.mark.parametrize("command", [["features", "demo", "--layer", "stem.0"], ["cam", "demo"]])
def test_an_input_image_is_never_overwritten_even_with_overwrite(command: list[str], picture: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = picture.read_bytes()
    link = picture.with_name("link.png")
    os.link(picture, link)  # the same file under another name
    for out in (picture, link, picture.parent / "." / picture.name):
        assert main([*command, "--image", str(picture), "--out", str(out), "--overwrite"]) == 2
        assert "is one of the --image files" in _one_line(capsys)
    assert picture.read_bytes() == before


@pytest.mark.parametrize("command", [["features", "demo", "--layer", "stem.0"], ["cam", "demo"]])
def test_nothing_is_written_into_an_image_folder_or_under_another_suffix(
        command: list[str], picture: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = picture.parent
    assert main([*command, "--image", str(folder), "--out", str(folder / "maps.png")]) == 2
    assert "is in the --image folder" in _one_line(capsys)
    assert main([*command, "--image", str(picture), "--out", str(folder.parent / "maps.jpg")]) == 2
    assert "is not a .png file name" in _one_line(capsys)
    assert sorted(p.name for p in folder.iterdir()) == ["in.png"]


# --- report folders ------------------------------------------------------------------------------------
def test_a_report_lookalike_holding_a_folder_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "a"
    (out / "img").mkdir(parents=True)
    (out / "report.json").write_text('{"hookscope_report": 1}')
    (out / "index.html").mkdir()
    (out / "index.html" / "thesis.tex").write_text("precious")
    with pytest.raises(HookscopeError, match="not a hookscope report"):
        with staged_folder(out, overwrite=True):
            pass
    assert (out / "index.html" / "thesis.tex").read_text() == "precious"


def test_the_cleanup_removes_only_its_own_stamped_folders(tmp_path: Path) -> None:
    pid = exited_pid()
    mine = tmp_path / ".d.partial-99999-notes"  # a user's folder that merely looks like one
    (mine / "notes.txt").parent.mkdir()
    (mine / "notes.txt").write_text("keep")
    unstamped = tmp_path / f".d.partial-{pid}-abcd1234"
    unstamped.mkdir()
    other = tmp_path / f".d.x.partial-{pid}-abcd1234"  # another target's (d.x), stamped
    other.mkdir()
    (other / ".hookscope-partial").touch()
    huge = tmp_path / ".d.partial-99999999999999999999999-abcd1234"
    huge.mkdir()
    build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "d", methods=[])
    assert (mine / "notes.txt").read_text() == "keep" and unstamped.exists() and other.exists() and huge.exists()


def test_an_out_with_dot_dot_is_the_folder_it_names(tmp_path: Path) -> None:
    build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "c2", methods=[])
    path = build_report(TinyResNet().eval(), torch.rand(1, 3, 32, 32), tmp_path / "c2" / "img" / "..",
                        methods=[], overwrite=True)
    assert (tmp_path / "c2" / "index.html").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["c2"]
    assert path.resolve() == (tmp_path / "c2").resolve()


def test_demo_replaces_only_its_own_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    assert main(["report", "demo", "--images", "1", "--methods", "none", "--out", str(out)]) == 0
    before = (out / "report.json").read_text()
    capsys.readouterr()
    assert main(["demo", "--batch", "1", "--out", str(out)]) == 2
    assert "holds a report the demo did not write" in _one_line(capsys)
    assert (out / "report.json").read_text() == before
    assert json.loads(before)["title"] == "hookscope report: demo"


# --- what is read ----------------------------------------------------------------------------------------
def test_a_photo_stored_sideways_is_turned_as_its_exif_says(tmp_path: Path) -> None:
    from PIL import Image

    from hookscope.viz import as_image

    img = Image.new("RGB", (8, 4))
    img.putpixel((0, 0), (255, 255, 255))
    exif = img.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to view"
    path = tmp_path / "phone.png"
    img.save(path, exif=exif)
    t = as_image(path)
    assert t.shape == (3, 8, 4)  # as a viewer shows it
    assert t[:, 0, 3].tolist() == [1.0, 1.0, 1.0]  # the top-left pixel, turned to the top-right


class ConvThenPermute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).permute(0, 2, 3, 1)  # channels last, and C == h == w


class Permuting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = ConvThenPermute()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).mean((1, 2))


def test_a_permuted_view_of_the_same_shape_is_not_taken_for_the_convolutions_layout() -> None:
    net, x = Permuting().eval(), torch.rand(1, 3, 32, 32)
    for run in (lambda: hookscope.feature_maps(net, x, layers="block"), lambda: hookscope.cam(net, x, layers="block")):
        with pytest.raises(HookscopeError, match="B x C x h x w or B x h x w x C"):
            run()
    res = hookscope.feature_maps(net, x, layers="block", reshape=hookscope.channels_last)
    assert torch.equal(res.maps, net.block(x).permute(0, 3, 1, 2))
