"""packer.intake: session zips from the phone -> session folders, safely and atomically.

Every test builds real zips with zipfile in tmp_path, the way the app (or a Mac's
"Compress") lays them out, and checks what lands on disk."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer import intake
from packer.intake import Extracted, extract_all, extract_export, find_exports
from shardship.errors import SessionError

NAME = "session_2024-05-01_120000"


def jpeg(seed: int) -> bytes:
    img = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def session_files(frames: int = 3, metadata: bool = True) -> dict[str, bytes]:
    """Relative path -> bytes of a small StackCapture session."""
    files = {f"rgb/{i:06d}.jpg": jpeg(i) for i in range(frames)}
    files["imu.json"] = json.dumps([{"timestamp": 0.0, "accel": [0, 0, 9.8]}]).encode()
    files["poses.json"] = json.dumps([{"timestamp": 0.0, "rgbIndex": 0}]).encode()
    files["encoders.json"] = b"[]"
    files["calib.txt"] = b"400 400 240 180\n"
    files["video.mov"] = os.urandom(2048)
    if metadata:
        files["metadata.json"] = json.dumps({"captureSource": "ARKit", "fps": 60}).encode()
    return files


def write_zip(path: Path, files: dict[str, bytes], top: str | None = NAME, extra: list[tuple] = (),
              dirs: bool = True) -> Path:
    """Write `files` under `top/` (None: at the root); `extra` = (ZipInfo|name, bytes)
    members added verbatim, e.g. unsafe ones."""
    prefix = f"{top}/" if top else ""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        if dirs and top:
            zf.writestr(zipfile.ZipInfo(prefix), b"")
        for rel, data in files.items():
            zf.writestr(prefix + rel, data)
        for info, data in extra:
            zf.writestr(info, data)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    d = tmp_path / "raw"
    d.mkdir()
    return d


def assert_only(raw: Path, *names: str) -> None:
    assert sorted(os.listdir(raw)) == sorted(names)


def test_one_top_folder_extracts_identical_bytes_and_zip_untouched(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    before = (sha(z), z.stat().st_mtime_ns, z.stat().st_size)

    res = extract_export(z, raw)

    assert res == Extracted(z, raw / NAME, "extracted", False)
    assert tree(raw / NAME) == files
    assert (sha(z), z.stat().st_mtime_ns, z.stat().st_size) == before
    assert_only(raw, f"{NAME}.zip", NAME)
    assert stat.S_IMODE((raw / NAME / "metadata.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((raw / NAME / "rgb").stat().st_mode) == 0o755
    assert stat.S_IMODE((raw / NAME).stat().st_mode) == 0o755


def test_top_folder_with_other_name_goes_into_stem(raw: Path):
    files = session_files(frames=1)
    z = write_zip(raw / f"{NAME}.zip", files, top="renamed_by_user", dirs=False)
    res = extract_export(z, raw)
    assert res.session_dir == raw / NAME and res.status == "extracted"
    assert tree(raw / NAME) == files
    assert_only(raw, f"{NAME}.zip", NAME)


def test_no_top_folder_extracts_as_is(raw: Path):
    files = session_files(frames=2)
    z = write_zip(raw / f"{NAME}.zip", files, top=None)
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files


def test_modes_are_fixed_not_from_zip_or_umask(raw: Path):
    info = zipfile.ZipInfo(f"{NAME}/run.sh")
    info.external_attr = (stat.S_IFREG | 0o4777) << 16
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(info, b"#!/bin/sh\n")])
    old = os.umask(0o077)  # a strict umask must not make the session unreadable to others
    try:
        extract_export(z, raw)
    finally:
        os.umask(old)
    modes = {p.relative_to(raw).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in (raw / NAME).rglob("*")}
    assert modes["session_2024-05-01_120000/run.sh"] == 0o644
    assert modes["session_2024-05-01_120000/rgb"] == 0o755
    assert set(modes.values()) == {0o644, 0o755}
    assert stat.S_IMODE((raw / NAME).stat().st_mode) == 0o755


def test_sidecar_used_when_zip_lacks_metadata(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(metadata=False))
    sidecar = raw / f"{NAME}.metadata.json"
    sidecar.write_bytes(b'{"captureSource": "sidecar"}')
    res = extract_export(z, raw)
    assert res.sidecar_used is True
    assert (raw / NAME / "metadata.json").read_bytes() == b'{"captureSource": "sidecar"}'
    assert sidecar.read_bytes() == b'{"captureSource": "sidecar"}'  # copied, not moved


def test_sidecar_ignored_when_zip_has_metadata(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    (raw / f"{NAME}.metadata.json").write_bytes(b'{"captureSource": "sidecar"}')
    res = extract_export(z, raw)
    assert res.sidecar_used is False
    assert (raw / NAME / "metadata.json").read_bytes() == files["metadata.json"]


def test_no_metadata_and_no_sidecar_still_extracts(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1, metadata=False))
    res = extract_export(z, raw)
    assert res.status == "extracted" and res.sidecar_used is False
    assert not (raw / NAME / "metadata.json").exists()


def test_existing_folder_wins(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    (raw / f"{NAME}.metadata.json").write_text("{}")
    (raw / NAME).mkdir()
    (raw / NAME / "poses.json").write_text("my own SLAM")
    mtime = (raw / NAME / "poses.json").stat().st_mtime_ns

    res = extract_export(z, raw)

    assert res == Extracted(z, raw / NAME, "already", False)
    assert tree(raw / NAME) == {"poses.json": b"my own SLAM"}
    assert (raw / NAME / "poses.json").stat().st_mtime_ns == mtime


def test_target_that_is_a_file_is_refused(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1))
    (raw / NAME).write_text("not a folder")
    with pytest.raises(SessionError, match="not a folder"):
        extract_export(z, raw)
    assert (raw / NAME).read_text() == "not a folder"


def _symlink(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def _fifo(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFIFO | 0o644) << 16
    return info


@pytest.mark.parametrize("member, why", [
    ("../evil.txt", "'..'"),
    (f"{NAME}/rgb/../../../evil.txt", "'..'"),
    ("/tmp/evil.txt", "absolute"),
    ("C:/evil.txt", "drive letter"),
    (f"{NAME}\\..\\evil.txt", "backslash"),
    (_symlink(f"{NAME}/rgb/000009.jpg"), "symlink"),
    (_fifo(f"{NAME}/fifo"), "not a regular file"),
])
def test_unsafe_member_refuses_whole_zip(raw: Path, tmp_path: Path, member, why: str):
    payload = b"/etc/passwd" if isinstance(member, zipfile.ZipInfo) else b"pwned"
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(member, payload)])
    before = sha(z)
    with pytest.raises(SessionError, match=why) as ei:
        extract_export(z, raw)
    name = member.filename if isinstance(member, zipfile.ZipInfo) else member
    assert ei.value.path == f"{NAME}.zip" and ei.value.session == NAME
    assert repr(name) in ei.value.reason
    assert_only(raw, f"{NAME}.zip")
    assert sorted(os.listdir(tmp_path)) == ["raw"]  # nothing escaped either
    assert sha(z) == before


def test_two_top_folders_refused(raw: Path):
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("session_a/metadata.json", b"{}")
        zf.writestr("session_b/metadata.json", b"{}")
        zf.writestr("__MACOSX/session_a/._metadata.json", b"x")
    with pytest.raises(SessionError, match=r"more than one top-level folder \(session_a, session_b\)") as ei:
        extract_export(z, raw)
    assert ei.value.path == f"{NAME}.zip"
    assert_only(raw, f"{NAME}.zip")


def test_duplicate_member_refused(raw: Path):
    with pytest.warns(UserWarning):  # zipfile itself warns on the duplicate name
        z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(f"{NAME}/imu.json", b"2nd")])
    with pytest.raises(SessionError, match="appears twice"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_macosx_and_ds_store_skipped(raw: Path):
    files = session_files(frames=2)
    extra = [("__MACOSX/", b""), (f"__MACOSX/{NAME}/._metadata.json", b"\x00\x05\x16\x07"),
             (f"{NAME}/.DS_Store", b"Bud1"), (f"{NAME}/rgb/.DS_Store", b"Bud1")]
    z = write_zip(raw / f"{NAME}.zip", files, extra=extra)
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files


def test_truncated_zip_refused_nothing_left(raw: Path):
    good = write_zip(raw / "good.zip", session_files())
    z = raw / f"{NAME}.zip"
    z.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    good.unlink()
    with pytest.raises(SessionError, match="re-export it from the phone") as ei:
        extract_export(z, raw)
    assert ei.value.path == f"{NAME}.zip"
    assert_only(raw, f"{NAME}.zip")


def test_corrupt_member_data_refused_and_temp_removed(raw: Path):
    """Central directory intact, a member's bytes flipped: fails mid-extraction
    (after other files were written) on the CRC check; the temp must go."""
    z = raw / f"{NAME}.zip"
    marker = b"MARKER" * 200
    with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{NAME}/metadata.json", b"{}")
        zf.writestr(f"{NAME}/video.mov", marker)
    data = bytearray(z.read_bytes())
    i = data.index(marker) + 100
    data[i] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(SessionError, match=r"corrupt member '.*video\.mov'.*re-export it from the phone"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_disk_full_while_writing_cleans_up(raw: Path, monkeypatch):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    calls = []

    def full(src, dst, length=0):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(src, dst, length)

    original = intake.shutil.copyfileobj
    monkeypatch.setattr(intake.shutil, "copyfileobj", full)
    with pytest.raises(SessionError, match=r"disk full .* free \d+ MiB"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_not_enough_free_space_refused_before_writing(raw: Path, monkeypatch):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    monkeypatch.setattr(intake, "_free_bytes", lambda path: 100)
    with pytest.raises(SessionError, match=r"needs 1 MiB but .* has 0 MiB free: free 1 MiB"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_zip_bomb_refused(raw: Path, monkeypatch):
    monkeypatch.setattr(intake, "BOMB_MIN_BYTES", 1 << 20)
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{NAME}/metadata.json", b"{}")
        zf.writestr(f"{NAME}/video.mov", bytes(4 << 20))  # 4 MiB of zeros -> ~4 KiB
    with pytest.raises(SessionError, match="zip bomb"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_highly_compressible_but_small_is_not_a_bomb(raw: Path):
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{NAME}/video.mov", bytes(4 << 20))  # ratio > 200 but far below 1 GiB
    assert extract_export(z, raw).status == "extracted"
    assert (raw / NAME / "video.mov").stat().st_size == 4 << 20


def test_stale_temp_from_killed_run_is_redone(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    stale = raw / f".{NAME}.unzip-tmp"
    (stale / "rgb").mkdir(parents=True)
    (stale / "rgb" / "000000.jpg").write_bytes(b"half")
    (stale / "junk").write_bytes(b"from the killed run")
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files
    assert_only(raw, f"{NAME}.zip", NAME)


def test_find_exports_only_visible_zips_sorted(raw: Path):
    for n in ("session_b.zip", "session_a.zip", "._session_a.zip", "session_a.metadata.json", "notes.txt"):
        (raw / n).write_bytes(b"x")
    (raw / "session_c").mkdir()
    (raw / "dir.zip").mkdir()
    assert find_exports(raw) == [raw / "session_a.zip", raw / "session_b.zip"]
    assert find_exports(raw / "missing") == []


def test_extract_all_continues_past_bad_zip(raw: Path):
    files = session_files(frames=2)
    write_zip(raw / "session_a.zip", files)
    (raw / "session_b.zip").write_bytes(b"PK\x03\x04 this is not a zip")
    write_zip(raw / "session_c.zip", files, top=None)
    (raw / "session_d").mkdir()
    write_zip(raw / "session_d.zip", files)

    done, failed = extract_all(raw)

    assert [(e.zip_path.name, e.status) for e in done] == [
        ("session_a.zip", "extracted"), ("session_c.zip", "extracted"), ("session_d.zip", "already")]
    assert list(failed) == ["session_b.zip"]
    assert "re-export it from the phone" in failed["session_b.zip"]
    assert tree(raw / "session_a") == files and tree(raw / "session_c") == files
    assert not (raw / "session_b").exists()
    assert os.listdir(raw / "session_d") == []
    assert not [p for p in os.listdir(raw) if p.endswith(".unzip-tmp")]

    again, failed_again = extract_all(raw)  # idempotent: everything is "already" now
    assert [e.status for e in again] == ["already"] * 3 and list(failed_again) == ["session_b.zip"]
