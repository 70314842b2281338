"""Frame size and orientation, checked at load time (issue 39, item 5).

Packing (intrinsics, crops) and SLAM take every frame as the app's landscape
480x360. A portrait capture (360x480 JPEGs, rgbResolution [360, 480], calib.txt in
those pixels) used to pass `packer check` and `packer pack` with fx/fy swapped and
fail in SLAM minutes later with advice that did not apply; now it is refused in
one line naming the file, the size found and what to do. Every case is a rendered
session (packer.synth) with the fault applied, exported as the app does (zip +
sidecar), and checked through the CLI."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from PIL import Image

from packer import session as session_mod
from packer.cli import main
from packer.imageops import jpeg_size
from packer.session import load_session
from packer.synth import synth_session
from packer.synth.export import zip_folder
from packer.synth.fault_portrait import portrait
from shardship.format import index as manifest

LAND, FAULT = "session_2026-03-01_100000", "session_2026-03-01_110000"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two landscape sessions (different seeds: not the same recording to packer.duplicates)."""
    d = tmp_path_factory.mktemp("orientation")
    synth_session(d, LAND, n_frames=36, seed=1)
    synth_session(d, FAULT, n_frames=36, seed=2)
    return d


@pytest.fixture
def raw(rendered: Path, tmp_path: Path) -> Path:
    r = tmp_path / "raw"
    shutil.copytree(rendered, r)
    return r


def app_export(folder: Path) -> Path:
    """`folder` as the app leaves it after its auto-zip: session_X.zip with the folder as its
    one top folder, the session_X.metadata.json sidecar, and no folder."""
    z = folder.parent / f"{folder.name}.zip"
    zip_folder(folder, z, folder.name, 1767261600.0)
    (folder.parent / f"{folder.name}.metadata.json").write_bytes((folder / "metadata.json").read_bytes())
    shutil.rmtree(folder)
    return z


def set_resolution(folder: Path, wh: list[int]) -> None:
    md = json.loads((folder / "metadata.json").read_text())
    md["rgbResolution"] = wh
    (folder / "metadata.json").write_text(json.dumps(md, indent=2))


def resize_frames(folder: Path, size: tuple[int, int]) -> None:
    for p in (folder / "rgb").glob("*.jpg"):
        with Image.open(p) as im:
            im.resize(size).save(p, quality=80)


def check(raw: Path) -> Result:
    return CliRunner().invoke(main, ["check", "--raw", str(raw)])


def fail_line(out: str, name: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"FAIL  session {name}:")]
    assert len(lines) == 1, out
    return lines[0]


def test_portrait_export_fails_check_in_one_line(raw: Path):
    portrait(raw / FAULT)
    assert jpeg_size(raw / FAULT / "rgb" / "000000.jpg") == (360, 480)
    for name in (LAND, FAULT):
        app_export(raw / name)
    r = check(raw)
    assert r.exit_code == 1, r.output
    line = fail_line(r.output, FAULT)
    assert line == (f"FAIL  session {FAULT}: rgb/000000.jpg: portrait frames of 360x480, but packing and SLAM "
                    "need the app's landscape 480x360: record it again with the phone held in landscape, or rotate "
                    "every frame and calib.txt to 480x360")
    assert f"ok    {LAND}:" in r.output and "1 of 2 sessions ok" in r.output


def test_portrait_export_is_skipped_by_pack_with_the_reason(raw: Path, tmp_path: Path):
    portrait(raw / FAULT)
    for name in (LAND, FAULT):
        app_export(raw / name)
    out = tmp_path / "packed"
    r = CliRunner().invoke(main, ["pack", "--raw", str(raw), "--out", str(out), "--no-slam", "--quiet",
                                     "--workers", "1"])
    assert r.exit_code == 1, r.output + r.stderr
    assert f"FAIL  session {FAULT}: rgb/000000.jpg: portrait frames of 360x480" in r.stderr
    assert "packed 1 session," in r.stdout
    index = manifest.load(out)
    assert list(index["sessions"]) == [LAND]
    assert index["failed"][FAULT].startswith("rgb/000000.jpg: portrait frames of 360x480")


def test_rgb_resolution_that_disagrees_with_the_frames_is_refused(raw: Path):
    set_resolution(raw / FAULT, [360, 480])  # landscape JPEGs, metadata says portrait
    app_export(raw / FAULT)
    r = check(raw)
    assert r.exit_code == 1
    assert fail_line(r.output, FAULT) == (
        f"FAIL  session {FAULT}: metadata.json: rgbResolution [360, 480] disagrees with the frames (rgb/000000.jpg "
        "is 480x360): set it to [480, 360] or re-export the session")
    assert f"ok    {LAND}:" in r.output


def test_portrait_frames_under_landscape_metadata_name_the_frame(raw: Path):
    """The frames are what packing reads: their size is reported, not metadata's."""
    portrait(raw / FAULT)
    set_resolution(raw / FAULT, [480, 360])
    app_export(raw / FAULT)
    line = fail_line(check(raw).output, FAULT)
    assert f"{FAULT}: rgb/000000.jpg: portrait frames of 360x480" in line


def test_other_frame_size_is_refused_with_what_to_do(raw: Path):
    resize_frames(raw / FAULT, (640, 480))
    set_resolution(raw / FAULT, [640, 480])
    app_export(raw / FAULT)
    line = fail_line(check(raw).output, FAULT)
    assert line == (f"FAIL  session {FAULT}: rgb/000000.jpg: frames of 640x480, but packing and SLAM need the app's "
                    "landscape 480x360: resize every frame to 480x360 and scale calib.txt with it")


def test_first_frame_missing_names_the_first_one_there(raw: Path):
    portrait(raw / FAULT)
    (raw / FAULT / "rgb" / "000000.jpg").unlink()  # a failed encode: the counter moved on
    app_export(raw / FAULT)
    assert f"{FAULT}: rgb/000001.jpg: portrait frames of 360x480" in fail_line(check(raw).output, FAULT)


def test_truncated_first_frame_still_reported_as_truncated(raw: Path):
    """The size comes from the header; a frame cut short after it is the image check's to report."""
    p = raw / FAULT / "rgb" / "000000.jpg"
    p.write_bytes(p.read_bytes()[:2000])
    line = fail_line(check(raw).output, FAULT)
    assert f"{FAULT}: rgb/000000.jpg: truncated JPEG (no end marker)" in line


def test_landscape_sessions_check_and_load_as_before(raw: Path, monkeypatch: pytest.MonkeyPatch):
    """Landscape frames that metadata agrees with: the same report, intrinsics and frames as
    without the check (it only ever refuses)."""
    app_export(raw / FAULT)
    assert f"unzip {FAULT}.zip -> {FAULT}/" in check(raw).output
    with_check = check(raw)
    s = load_session(raw / LAND, check_images=True)
    monkeypatch.setattr(session_mod, "frame_size_problem", lambda *a: None)
    without = check(raw)
    assert with_check.exit_code == without.exit_code == 0
    assert with_check.output == without.output and "2 of 2 sessions ok" in with_check.output
    s0 = load_session(raw / LAND, check_images=True)
    assert s.intrinsics == s0.intrinsics == (400.0, 400.0, 240.0, 180.0)
    assert s.frame_paths == s0.frame_paths and s.warnings == s0.warnings


@pytest.mark.parametrize("mode, progressive, exif", [("RGB", False, False), ("RGB", True, True), ("L", False, True),
                                                     ("CMYK", True, False)])
def test_jpeg_size_reads_the_header_without_decoding(tmp_path: Path, mode: str, progressive: bool, exif: bool):
    p = tmp_path / "f.jpg"
    extra = {"exif": b"Exif\x00\x00" + bytes(5000)} if exif else {}  # an APP1 segment before the frame header
    Image.new(mode, (37, 21)).save(p, format="JPEG", progressive=progressive, **extra)
    assert jpeg_size(p) == (37, 21)
    buf = io.BytesIO(p.read_bytes())
    assert Image.open(buf).size == (37, 21)
    p.write_bytes(p.read_bytes()[:40])  # cut before the frame header
    assert jpeg_size(p) is None
    p.write_bytes(b"not a jpeg at all")
    assert jpeg_size(p) is None
    assert jpeg_size(tmp_path / "missing.jpg") is None
